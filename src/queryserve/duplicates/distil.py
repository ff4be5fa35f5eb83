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
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from queryserve.duplicates.products import LabelledPair
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


def teacher_probabilities(teachers: Sequence[Path], pairs: Sequence[tuple[str, str]],
                          scorer: Any) -> list[float]:
    """The teachers' mean P(duplicate) of each pair; `scorer(folder)` loads one teacher as an
    object whose `probabilities(pairs)` scores LabelledPairs (cross_train's model)."""
    labelled = [LabelledPair(left, right, 0) for left, right in pairs]
    total = np.zeros(len(pairs), dtype=np.float64)
    for folder in teachers:
        total += np.asarray(scorer(folder).probabilities(labelled), dtype=np.float64)
    return [float(p) for p in total / max(len(teachers), 1)]
