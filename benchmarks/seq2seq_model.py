"""The T5 that BENCHMARKS.md section 7 optimizes: the spelling corrector's shape, trained briefly.

    python benchmarks/seq2seq_model.py OUT_DIR [--minutes 30]

Issue 4 measures CTranslate2 against Hugging Face `generate` on "the T5 spell-correction case"
(a query of about 9 tokens in, about 11 out), and its gate needs generations that mean
something: a random T5 emits padding or noise, and int8 changes most of it. So this script
trains a small T5 from scratch to copy queries back while undoing character typos (deletions,
insertions, substitutions, swaps), on the repository's own text: MASSIVE training utterances
and catalog titles. A quarter of the examples are clean and must come back unchanged.

It is a stand-in for issue 5's `queryserve train spell` (real misspellings, a character-level
vocabulary, evaluation against SymSpell), which will replace it; it is not a spelling model to
ship. Shape: d_model 256, 4 + 4 layers, 4 heads, a 4,000-piece Unigram vocabulary trained here
on the same text (about 7 M parameters). PyTorch on 2 threads with bf16 autocast.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
VOCAB = 4000
MAX_TOKENS = 32


def corpus() -> list[str]:
    texts = [json.loads(line)["text"] for line in
             (ROOT / "data" / "massive-en" / "train.jsonl").read_text().splitlines()]
    titles = (ROOT / "data" / "catalog-titles" / "titles.txt").read_text().splitlines()
    texts += [t.lower() for t in titles if 0 < len(t.split()) <= 10]
    return [t for t in texts if t.strip()]


def typo(word: str, rng: random.Random) -> str:
    if len(word) < 3:
        return word
    i = rng.randrange(len(word))
    kind = rng.random()
    if kind < 0.3:
        return word[:i] + word[i + 1:]
    if kind < 0.55:
        return word[:i] + rng.choice(LETTERS) + word[i:]
    if kind < 0.8:
        return word[:i] + rng.choice(LETTERS) + word[i + 1:]
    return word[:i] + word[i + 1] + word[i] + word[i + 2:] if i < len(word) - 1 else word


def noisy(text: str, rng: random.Random) -> str:
    if rng.random() < 0.25:
        return text
    words = text.split()
    for j in rng.sample(range(len(words)), max(1, round(len(words) * 0.2))):
        words[j] = typo(words[j], rng)
    return " ".join(words)


def tokenizer_for(texts: list[str], out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import UnigramTrainer
    from transformers import T5TokenizerFast  # type: ignore[attr-defined]

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts, UnigramTrainer(
        vocab_size=VOCAB, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    fast = T5TokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", pad_token="<pad>",
                           unk_token="<unk>", extra_ids=0)
    fast.save_pretrained(str(out))
    return fast


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--resume", action="store_true",
                        help="go on from the model already in OUT_DIR (fresh optimizer state)")
    args = parser.parse_args()
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.set_num_threads(2)
    torch.manual_seed(0)
    rng = random.Random(0)
    texts = corpus()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.resume:
        from transformers import T5TokenizerFast  # type: ignore[attr-defined]

        tokenizer = T5TokenizerFast.from_pretrained(str(args.out))
    else:
        tokenizer = tokenizer_for(texts, args.out)
    config = T5Config(vocab_size=VOCAB, d_model=256, d_ff=1024, d_kv=64, num_layers=4,
                      num_decoder_layers=4, num_heads=4, pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0)  # type: ignore[call-arg]
    done_before = {"steps": 0, "examples": 0, "minutes": 0.0}
    if args.resume:
        model = T5ForConditionalGeneration.from_pretrained(str(args.out)).train()
        done_before = json.loads((args.out / "TRAINING.json").read_text())
        rng.seed(done_before["steps"])  # new samples, not the first run's again
    else:
        model = T5ForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warmup = 200
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    started, step, seen = time.monotonic(), 0, 0
    while time.monotonic() - started < args.minutes * 60:
        batch = rng.sample(texts, args.batch_size)
        source = tokenizer([noisy(t, rng) for t in batch], return_tensors="pt", padding=True,
                           truncation=True, max_length=MAX_TOKENS)
        labels = tokenizer(batch, return_tensors="pt", padding=True, truncation=True,
                           max_length=MAX_TOKENS).input_ids
        labels[labels == 0] = -100
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**source, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step, seen = step + 1, seen + len(batch)
        if step % 50 == 0:
            elapsed = time.monotonic() - started
            print(f"step {step}  loss {loss.item():.3f}  {seen / elapsed:.0f} examples/s  "
                  f"{elapsed / 60:.1f} min", flush=True)
    model.eval().save_pretrained(str(args.out))
    minutes = (time.monotonic() - started) / 60
    (args.out / "TRAINING.json").write_text(json.dumps({
        "command": " ".join(sys.argv), "steps": step + done_before["steps"],
        "examples": seen + done_before["examples"],
        "minutes": round(minutes + done_before["minutes"], 1), "final_loss": loss.item(),
        "batch_size": args.batch_size, "seed": 0}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
