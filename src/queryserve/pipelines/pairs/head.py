"""The duplicates head: a small MLP over two product embeddings and their string features,
in numpy (it is microseconds a pair; no runtime needed for it).

Its input is what Sentence-BERT's classification objective uses, `u * v` and `|u - v|`, plus
the cosine and `features.FEATURES`; out comes the probability that the two texts are one
product. Training writes `head.npz`; serving and the batch job read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from queryserve.errors import ConfigError
from queryserve.types import Array

FILE = "head.npz"


def head_inputs(u: Array, v: Array, features: Array) -> Array:
    """[n, 2 * width + 1 + features]: the layout the head is trained and served on."""
    cosine = np.sum(u * v, axis=1, keepdims=True)
    joined: Array = np.concatenate([u * v, np.abs(u - v), cosine, features], axis=1)
    return joined.astype(np.float32)


@dataclass(frozen=True)
class PairHead:
    w1: Array
    b1: Array
    w2: Array
    b2: Array
    threshold: float  # chosen on the valid splits: the decision "same product" at >= this

    @classmethod
    def load(cls, folder: Path) -> PairHead:
        path = folder / FILE
        if not path.is_file():
            raise ConfigError(f"{path} is missing: a duplicates model folder holds the "
                                  "encoder and the head that `queryserve train duplicates` "
                                  "writes")
        with np.load(path) as saved:
            return cls(saved["w1"], saved["b1"], saved["w2"], saved["b2"],
                       # saved as float32: 0.4 came back 0.4000000059604645 in answers
                       round(float(saved["threshold"]), 6))

    def save(self, folder: Path) -> None:
        np.savez(folder / FILE, w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2,
                 threshold=np.float32(self.threshold))

    def probability(self, u: Array, v: Array, features: Array) -> Array:
        hidden = np.maximum(head_inputs(u, v, features) @ self.w1 + self.b1, 0.0)
        logits = (hidden @ self.w2 + self.b2).reshape(-1)
        # Symmetric in u and v by construction (u * v, |u - v|, and the features).
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
