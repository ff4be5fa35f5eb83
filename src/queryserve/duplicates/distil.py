"""Distilling cross-encoders into one: unlabelled pairs from the train splits' own products,
labelled by the mean of several trained cross-encoders (`--teacher`).

Several cross-encoders trained from different seeds disagree on the hard pairs, and their mean
decides better than any one of them; serving the mean would cost one Transformer run per model
and pair. So a student of the same size learns the mean: on the train pairs with their labels,
and on pairs nobody labelled, the near neighbours among the same train products (a product
and the listings of the other table that share its rarest words), with the teachers' mean
probability as the target. The neighbours are the pairs a blocking stage would hand the model,
and the labelled splits hold few of them. Valid and test products are not used: the epoch and
threshold are chosen, and the model judged, on pairs it has never seen in any form.

What the teachers taught can be kept as a file (`Targets`, `--targets`): the neighbours with
their targets, each teacher's figures and the teachers' mean judged as one model. Several
students side by side then run the teachers once, and a later run, on another machine, learns
from teachers it does not have (a GPU session's teachers are 220 MB each; their targets, a
few MB).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from queryserve.duplicates.products import DuplicatesError, LabelledPair
from queryserve.types import Array

_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True, slots=True)
class Example:
    """A pair and the probability that it is one product: 0 or 1 where labelled, the teachers'
    mean where not."""

    left: str
    right: str
    target: float


def _tfidf(texts: Sequence[str], vocabulary: dict[str, int], idf: Array) -> Array:
    rows = np.zeros((len(texts), len(vocabulary)), dtype=np.float32)
    for i, text in enumerate(texts):
        for word, count in Counter(_WORD.findall(text.lower())).items():
            if word in vocabulary:
                rows[i, vocabulary[word]] = count * idf[vocabulary[word]]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    normalized: Array = rows / np.maximum(norms, 1e-9)
    return normalized


def neighbour_pairs(pairs: Sequence[LabelledPair], k: int) -> list[tuple[str, str]]:
    """For each product on either side of `pairs`, its k likeliest partners on the other side
    by TF-IDF cosine of their words (sharing one at least), less the pairs already labelled.
    Deterministic."""
    if k <= 0 or not pairs:
        return []
    lefts = sorted({p.left for p in pairs})
    rights = sorted({p.right for p in pairs})
    documents = [set(_WORD.findall(t.lower())) for t in (*lefts, *rights)]
    # A word in one product alone cannot make two products alike.
    frequency = Counter(w for words in documents for w in words)
    frequency = Counter({w: n for w, n in frequency.items() if n > 1})
    vocabulary = {w: i for i, w in enumerate(sorted(frequency))}
    idf = np.array([math.log(len(documents) / frequency[w]) + 1.0 for w in sorted(frequency)],
                   dtype=np.float32)
    similarity = _tfidf(lefts, vocabulary, idf) @ _tfidf(rights, vocabulary, idf).T
    found: set[tuple[int, int]] = set()
    for i in range(len(lefts)):
        found.update((i, int(j)) for j in np.argsort(-similarity[i], kind="stable")[:k]
                     if similarity[i, j] > 0)
    for j in range(len(rights)):
        found.update((int(i), j) for i in np.argsort(-similarity[:, j], kind="stable")[:k]
                     if similarity[i, j] > 0)
    labelled = {(p.left, p.right) for p in pairs}
    return [(lefts[i], rights[j]) for i, j in sorted(found)
            if (lefts[i], rights[j]) not in labelled]


def teachers_mean(teachers: Sequence[Path], groups: Mapping[str, Sequence[LabelledPair]],
                  scorer: Any) -> dict[str, list[float]]:
    """The teachers' mean P(duplicate) of each pair of each group, each teacher loaded once;
    `scorer(folder)` loads one teacher as an object whose `probabilities(pairs)` scores
    LabelledPairs (cross_train's model)."""
    totals = {name: np.zeros(len(pairs), dtype=np.float64) for name, pairs in groups.items()}
    for folder in teachers:
        model = scorer(folder)
        for name, pairs in groups.items():
            totals[name] += np.asarray(model.probabilities(pairs), dtype=np.float64)
    return {name: [float(p) for p in total / max(len(teachers), 1)]
            for name, total in totals.items()}


def teacher_records(teachers: Sequence[str]) -> dict[str, Any]:
    """What each teacher's TRAINING.json says of it, so that a student's record shows the gap
    its distillation leaves: the encoder it started from, its best epoch, valid and test F1."""
    records = {}
    for teacher in teachers:
        path = Path(teacher) / "TRAINING.json"
        if not path.is_file():
            raise DuplicatesError(f"--teacher {teacher}: not a trained cross-encoder (no "
                                  "TRAINING.json)")
        saved = json.loads(path.read_text())
        records[Path(teacher).name] = {key: saved.get(key) for key in (
            "encoder", "recipe", "best_epoch", "threshold", "valid_f1", "test_f1",
            "test_f1_at_dataset_thresholds", "pairs_per_second", "minutes")}
    return records


@dataclass(frozen=True, slots=True)
class Targets:
    """What the teachers taught: the train products' unlabelled neighbours with the teachers'
    mean probability, how many neighbours a product was given, each teacher's own figures, and
    the teachers' mean judged as one model on the valid and test splits (the student's
    reference: it learns that mean, not any one teacher)."""

    examples: tuple[Example, ...]
    neighbours: int
    teachers: dict[str, Any]
    mean: dict[str, Any]


def save_targets(path: Path, targets: Targets) -> None:
    """Whole or not at all (written aside, then renamed): students started beside the one
    that labels wait for the file to appear."""
    record = {"neighbours": targets.neighbours, "teachers": targets.teachers,
              "teachers_mean": targets.mean,
              "pairs": [[e.left, e.right, e.target] for e in targets.examples]}
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(path.name + ".partial")
    aside.write_text(json.dumps(record) + "\n")
    os.replace(aside, path)


def load_targets(path: Path) -> Targets:
    try:
        record = json.loads(path.read_text())
        return Targets(examples=tuple(Example(str(left), str(right), float(target))
                                      for left, right, target in record["pairs"]),
                       neighbours=int(record["neighbours"]), teachers=record["teachers"],
                       mean=record["teachers_mean"])
    except FileNotFoundError:
        raise DuplicatesError(f"--targets {path}: no such file (the teachers write it: "
                              "--teacher T ... --targets FILE)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DuplicatesError(f"--targets {path}: not a targets file ({exc})") from None
