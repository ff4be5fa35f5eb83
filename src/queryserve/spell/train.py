"""`queryserve train spell`: a small character-level seq2seq corrector trained from scratch.

Why characters: a typo is a small, local change to a word's characters but turns its subword
pieces into odd, rare ones; and a corrector mostly copies, which a model learns fastest when
what it reads and what it writes are the same units. The vocabulary is the characters of the
clean text, with the word boundary as its own token, so any catalog query can be written back.

Why BART's layout by default (`--architecture t5` trains the T5 layout): copying needs each
output character to find its place in the input. T5 has only relative positions, inside each
stack, so its decoder must find that place by content; BART has learned absolute positions on
both sides. Same width, depth, data and recipe on this machine: T5 reached a smoothed loss of
0.88 after 6 minutes and 0.32 after 21, and then still repeated and dropped words ("to to to
the post oice"); BART reached 0.58 after 4 minutes. CTranslate2 serves both.

Training follows what works on CPUs: bf16 autocast, length-bucketed batches (so a batch is not
padded to its longest query), AdamW with warm-up then linear decay over a time budget, a fixed
seed, a checkpoint every few minutes, `--resume` to go on after an interruption. On a CUDA GPU
(`--device`) the same recipe takes large batches from DataLoader workers (a 3 M-parameter model
steps faster than one Python process writes its examples) and fused AdamW. PyTorch is imported
here only: serving runs the CTranslate2 conversion that `queryserve optimize --task seq2seq`
makes of the folder this writes.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from queryserve.backends.noisy_channel.noise import NoiseModel
from queryserve.errors import QueryServeError
from queryserve.spell.data import (
    DATA,
    clean_texts,
    development_catalog,
    development_misspellings,
    load_catalog,
    load_misspellings,
    rare_words,
)
from queryserve.training import resolve_device

SPECIALS = {"t5": ["<pad>", "</s>", "<unk>"],
            "bart": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]}  # each family's usual ids
CHECKPOINT = "checkpoint.pt"
MAX_SOURCE_TOKENS = 80
MAX_TARGET_TOKENS = 80


@dataclass(frozen=True)
class Shape:
    architecture: str = "bart"  # or "t5"
    min_char_count: int = 3  # rarer characters become <unk>
    d_model: int = 256
    d_ff: int = 1024
    heads: int = 4
    encoder_layers: int = 4
    decoder_layers: int = 2


@dataclass(frozen=True)
class Recipe:
    minutes: float = 55.0
    max_steps: int | None = None  # a step budget too (tests: a few steps)
    batch_size: int = 256
    learning_rate: float = 2e-3
    warmup_steps: int = 300
    bf16: bool = True
    seed: int = 0
    checkpoint_minutes: float = 5.0
    clean_share: float = 0.3  # examples that must come back unchanged
    word_share: float = 0.15  # single dictionary words, misspelled
    copy_share: float = 0.0
    """Queries with one word swapped for a word of web text the catalog and the dictionary do
    not hold (`rare_words`: names, brands, rare words), to come back unchanged: a seq2seq
    that copies what it does not know, for the hybrid to score with (issue 43, item 3). 0 in
    the committed models, whose streams stay as they were. A pilot (the committed models
    trained 12 minutes more with 30% of these, against 12 minutes without) moved the hybrid's
    accuracy at 1% false corrections by less than the fit's seed does (BENCHMARKS.md)."""
    device: str = "auto"
    workers: int | None = None  # processes writing examples: none on a CPU, 8 beside a GPU
    development: bool = False
    """Train on the development split's training side (`spell.data.development_catalog`,
    `development_misspellings`): a model that never saw the development queries and words, on
    which the hybrid corrector's re-ranker learns how far to trust it."""


class TrainingError(QueryServeError):
    pass


def build_tokenizer(texts: Sequence[str], min_count: int, architecture: str) -> Any:
    """Characters in, characters out: each character of the clean text (seen `min_count`
    times or more) is a token, and so is the word boundary."""
    from collections import Counter

    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    counts = Counter(c for text in texts for c in normalizer.normalize_str(text)
                     if not c.isspace())
    chars = ["\u2581", *sorted(c for c, n in counts.items() if n >= min_count)]
    tokenizer = Tokenizer(models.WordLevel(
        {t: i for i, t in enumerate([*SPECIALS[architecture], *chars])}, unk_token="<unk>"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(), pre_tokenizers.Split(Regex("."), behavior="isolated")])
    tokenizer.decoder = decoders.Metaspace()
    ids = {t: i for i, t in enumerate(SPECIALS[architecture])}
    tokenizer.post_processor = (
        processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", ids["</s>"])])
        if architecture == "t5" else processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])]))
    return tokenizer


def save_tokenizer(tokenizer: Any, out: Path) -> None:
    """The folder's tokenizer, as `transformers` and the CTranslate2 converter load it."""
    from transformers import PreTrainedTokenizerFast

    specials = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    if tokenizer.token_to_id("<s>") is not None:
        specials |= {"bos_token": "<s>", "mask_token": "<mask>"}
    PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, **specials).save_pretrained(str(out))


class Examples:
    """(typed, meant) pairs drawn with `rng`."""

    def __init__(self, queries: Sequence[str], lexicon: Sequence[str], noise: NoiseModel,
                 recipe: Recipe, rng: random.Random, rare: Sequence[str] = ()) -> None:
        self.queries, self.lexicon, self.noise, self.recipe, self.rng, self.rare = \
            queries, lexicon, noise, recipe, rng, rare

    def one(self) -> tuple[str, str]:
        draw = self.rng.random()
        if draw < self.recipe.word_share:
            word = self.rng.choice(self.lexicon)
            return (word if self.rng.random() < 0.2 else
                    self.noise.corrupt_word(word, self.rng)), word
        query = self.rng.choice(self.queries)
        if draw < self.recipe.word_share + self.recipe.clean_share:
            return query, query
        if draw < self.recipe.word_share + self.recipe.clean_share + self.recipe.copy_share:
            swapped = query.split()
            swapped[self.rng.randrange(len(swapped))] = self.rng.choice(self.rare)
            copied = " ".join(swapped)
            return copied, copied
        words = 2 if len(query.split()) >= 5 and self.rng.random() < 0.25 else 1
        return self.noise.corrupt_query(query, self.rng, words=words), query


class Pools:
    """The endless example stream, cut into pools: pool `i` is `bucket` batches of similar
    length (drawn, sorted by length, cut, shuffled), each as model inputs.

    A pool is a pure function of (seed, i), so DataLoader workers can write them in any
    order and a resumed run goes on at the pool where it stopped."""

    def __init__(self, queries: Sequence[str], lexicon: Sequence[str], noise: NoiseModel,
                 recipe: Recipe, tokenizer: Any, bucket: int = 8,
                 rare: Sequence[str] = ()) -> None:
        self.queries, self.lexicon, self.noise, self.recipe, self.tokenizer, self.bucket, \
            self.rare = queries, lexicon, noise, recipe, tokenizer, bucket, rare

    def __len__(self) -> int:
        return 2 ** 40  # endless, in practice

    def __getitem__(self, index: int) -> list[dict[str, Any]]:
        rng = random.Random(f"{self.recipe.seed}:{index}")
        examples = Examples(self.queries, self.lexicon, self.noise, self.recipe, rng,
                            self.rare)
        size = self.recipe.batch_size
        pool = sorted((examples.one() for _ in range(size * self.bucket)),
                      key=lambda p: len(p[0]))
        chunks = [pool[i:i + size] for i in range(0, len(pool), size)]
        rng.shuffle(chunks)
        return [tensors(chunk, self.tokenizer) for chunk in chunks]


def pool_stream(pools: Pools, start: int, workers: int, pin: bool) -> Iterator[
        list[dict[str, Any]]]:
    """Pools `start`, `start + 1`, ... in order, written by `workers` processes (or here)."""
    if workers == 0:
        return (pools[i] for i in itertools.count(start))
    from torch.utils.data import DataLoader

    return iter(DataLoader(pools, batch_size=None, sampler=range(start, len(pools)),  # type: ignore[arg-type]
                           num_workers=workers, pin_memory=pin, prefetch_factor=4,
                           persistent_workers=False))


def new_model(shape: Shape, tokenizer: Any) -> Any:
    """A randomly initialised model of `shape` over `tokenizer`'s vocabulary."""
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
    )

    vocab, pad, eos = (tokenizer.get_vocab_size(), tokenizer.token_to_id("<pad>"),
                       tokenizer.token_to_id("</s>"))
    if shape.architecture == "t5":
        return T5ForConditionalGeneration(T5Config(
            vocab_size=vocab, d_model=shape.d_model, d_ff=shape.d_ff,
            d_kv=shape.d_model // shape.heads, num_heads=shape.heads,
            num_layers=shape.encoder_layers, num_decoder_layers=shape.decoder_layers,
            dropout_rate=0.0, pad_token_id=pad, eos_token_id=eos,
            decoder_start_token_id=pad))  # type: ignore[call-arg]
    return BartForConditionalGeneration(BartConfig(
        vocab_size=vocab, d_model=shape.d_model, encoder_layers=shape.encoder_layers,
        decoder_layers=shape.decoder_layers, encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.d_ff,
        decoder_ffn_dim=shape.d_ff, max_position_embeddings=MAX_TARGET_TOKENS + 48,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=pad,
        bos_token_id=tokenizer.token_to_id("<s>"), eos_token_id=eos,
        decoder_start_token_id=eos, forced_eos_token_id=eos))


def tensors(pairs: Sequence[tuple[str, str]], tokenizer: Any) -> dict[str, Any]:
    import torch

    pad, eos = tokenizer.token_to_id("<pad>"), tokenizer.token_to_id("</s>")

    def ids(tokenizer: Any, texts: list[str], limit: int) -> Any:
        rows = [[*e.ids[:limit - 1], eos] if len(e.ids) > limit else e.ids
                for e in tokenizer.encode_batch(texts)]
        out = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, :len(row)] = torch.tensor(row)
        return out

    source = ids(tokenizer, [s for s, _ in pairs], MAX_SOURCE_TOKENS)
    labels = ids(tokenizer, [t for _, t in pairs], MAX_TARGET_TOKENS)
    labels[labels == pad] = -100
    return {"input_ids": source, "attention_mask": (source != pad).long(), "labels": labels}


def step_once(model: Any, batch: dict[str, Any], optimizer: Any, bf16: bool,
              device: Any = None) -> float:
    import torch

    device = device or torch.device("cpu")
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.item())


def learning_rate(recipe: Recipe, step: int, elapsed: float) -> float:
    """Warm-up in steps, then linear decay to a tenth over the time budget."""
    warm = min(1.0, (step + 1) / recipe.warmup_steps)
    left = max(0.0, 1.0 - elapsed / (recipe.minutes * 60))
    return recipe.learning_rate * warm * (0.1 + 0.9 * left)


@contextmanager
def _checkpoint_on_interrupt(save: Callable[[], None], state: dict[str, Any]) -> Iterator[None]:
    """Ctrl-C saves a checkpoint before it ends the run: within the first checkpoint's
    minutes nothing could be resumed (`--resume`: "no checkpoint.pt to resume from"). The
    pool being trained on is trained on again from its start."""
    try:
        yield
    except KeyboardInterrupt:
        save()
        print(f"interrupted at step {state['step']}: checkpoint saved; `--resume` goes on",
              file=sys.stderr, flush=True)
        raise


def train_spell(out: Path, recipe: Recipe = Recipe(), shape: Shape = Shape(),
                data: Path = DATA, resume: bool = False, progress: bool = True,
                threads: int | None = None) -> dict[str, Any]:
    """Train (or go on training) the corrector into `out`; returns the training record."""
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from tokenizers import Tokenizer
    if threads:
        torch.set_num_threads(threads)
    checkpoint = out / CHECKPOINT
    if resume and not checkpoint.is_file():
        raise TrainingError(f"{out}: no {CHECKPOINT} to resume from; train without --resume")
    if not resume and checkpoint.is_file():
        raise TrainingError(f"{out} already holds a training run; pass --resume to go on "
                            "with it, or choose another folder")
    if recipe.word_share + recipe.clean_share + recipe.copy_share > 1:
        raise TrainingError(f"a copy share of {recipe.copy_share:g} leaves no misspelled "
                            "queries to learn from: at most "
                            f"{1 - recipe.word_share - recipe.clean_share:g}")
    device = resolve_device(recipe.device)
    out.mkdir(parents=True, exist_ok=True)
    catalog, misspellings = (development_catalog(data), development_misspellings(data)) \
        if recipe.development else (load_catalog(data), load_misspellings(data))
    noise = NoiseModel.learn(misspellings.train)
    torch.manual_seed(recipe.seed)
    state: dict[str, Any] = {"step": 0, "pools": 0, "examples": 0, "seconds": 0.0,
                             "loss": math.nan}
    if resume:
        saved = torch.load(checkpoint, weights_only=False, map_location="cpu")
        # The saved recipe goes on, with the budget and the hardware given now.
        recipe = Recipe(**{**saved["recipe"], "minutes": recipe.minutes,
                           "max_steps": recipe.max_steps, "device": recipe.device,
                           "workers": recipe.workers})
        shape, state = Shape(**saved["shape"]), {"pools": 0, **saved["state"]}
        tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
        model = new_model(shape, tokenizer)
        model.load_state_dict(saved["model"])
        torch.set_rng_state(saved["torch_rng"])
    else:
        tokenizer = build_tokenizer(clean_texts(catalog, misspellings), shape.min_char_count,
                                    shape.architecture)
        save_tokenizer(tokenizer, out)
        model = new_model(shape, tokenizer)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate,
                                  weight_decay=0.01, fused=device.type == "cuda")
    if resume:
        optimizer.load_state_dict(saved["optimizer"])
    model.train()
    workers = recipe.workers if recipe.workers is not None else \
        (8 if device.type == "cuda" else 0)
    rare = rare_words(catalog.train, misspellings.lexicon,
                      (typed for typed, _ in misspellings.train)) if recipe.copy_share else []
    pools = Pools(catalog.train, misspellings.lexicon, noise, recipe, tokenizer, rare=rare)
    budget = recipe.minutes * 60
    started = time.monotonic() - state["seconds"]
    last_save = last_line = time.monotonic()

    def save_checkpoint() -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "recipe": asdict(recipe), "shape": asdict(shape), "state": state,
                    "torch_rng": torch.get_rng_state()}, checkpoint.with_suffix(".tmp"))
        checkpoint.with_suffix(".tmp").replace(checkpoint)  # never a half-written checkpoint

    def done() -> bool:
        # >=: a run resumed past --max-steps (it went on for its whole time budget)
        return bool(time.monotonic() - started >= budget
                    or (recipe.max_steps is not None and state["step"] >= recipe.max_steps))

    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, disable=not progress) as display, \
            _checkpoint_on_interrupt(save_checkpoint, state):
        task = display.add_task("train spell", total=budget, completed=state["seconds"],
                                status="")
        for pool in pool_stream(pools, state["pools"], workers, device.type == "cuda"):
            for batch in pool:
                if done():
                    break
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(recipe, state["step"],
                                                time.monotonic() - started)
                loss = step_once(model, batch, optimizer, recipe.bf16, device)
                state["step"] += 1
                state["examples"] += len(batch["input_ids"])
                state["seconds"] = time.monotonic() - started
                # The loss shown is smoothed: one batch's loss is noisy.
                state["loss"] = (loss if math.isnan(state["loss"])
                                 else 0.98 * state["loss"] + 0.02 * loss)
                display.update(task, completed=min(budget, state["seconds"]), status=(
                    f"step {state['step']}  loss {state['loss']:.3f}  "
                    f"{state['examples'] / max(state['seconds'], 1e-9):.0f} examples/s"))
                if progress and not display.console.is_terminal and \
                        time.monotonic() - last_line >= 60:  # a log file gets a line a minute
                    print(f"{state['seconds'] / 60:.1f} min  "
                          + display.tasks[0].fields["status"], flush=True)
                    last_line = time.monotonic()
            else:  # the whole pool was trained on
                # A resumed run starts at the next whole pool; an interrupted one repeats at
                # most a pool's batches.
                state["pools"] += 1
                if time.monotonic() - last_save >= recipe.checkpoint_minutes * 60:
                    save_checkpoint()
                    last_save = last_line = time.monotonic()
            if done():
                break
    model.to("cpu")
    save_checkpoint()
    model.eval().save_pretrained(str(out))
    record = {"command": "queryserve " + " ".join(sys.argv[1:]) if sys.argv else "",
              "recipe": asdict(recipe), "shape": asdict(shape), "device": str(device),
              "workers": workers, "parameters": sum(p.numel() for p in model.parameters()),
              "steps": state["step"], "examples": state["examples"],
              "minutes": round(state["seconds"] / 60, 1), "loss": round(state["loss"], 4),
              "examples_per_second": round(state["examples"] / max(state["seconds"], 1e-9), 1)}
    (out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def measure_speed(steps: int = 12, data: Path = DATA, shape: Shape = Shape(),
                  large_batch: int = 256, threads: int | None = None,
                  device_name: str = "cpu") -> list[dict[str, Any]]:
    """Examples/s of fp32 at batch 32 against bf16 autocast and a large batch, side by side
    on the same model and stream (each after two untimed steps), on `device_name`."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(device_name)
    catalog, misspellings = load_catalog(data), load_misspellings(data)
    tokenizer = build_tokenizer(clean_texts(catalog, misspellings), shape.min_char_count,
                                shape.architecture)
    noise = NoiseModel.learn(misspellings.train)
    rows = []
    for bf16, batch_size in [(False, 32), (True, 32), (False, large_batch), (True, large_batch)]:
        torch.manual_seed(0)
        model = new_model(shape, tokenizer).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3,
                                      fused=device.type == "cuda")
        pools = Pools(catalog.train, misspellings.lexicon, noise,
                      Recipe(batch_size=batch_size), tokenizer)
        batches = _first_batches(pools, steps + 2)
        for batch in batches[:2]:
            step_once(model, batch, optimizer, bf16, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for batch in batches[2:]:
            step_once(model, batch, optimizer, bf16, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        rows.append({"device": str(device), "precision": "bf16 autocast" if bf16 else "fp32",
                     "batch_size": batch_size,
                     "examples_per_second": round(steps * batch_size / seconds, 1)})
    return rows


def _first_batches(pools: Pools, count: int) -> list[dict[str, Any]]:
    return list(itertools.islice(itertools.chain.from_iterable(map(pools.__getitem__,
                                                                   itertools.count())), count))
