"""A deterministic stand-in for a text encoder, for cheap end-to-end tests of everything else.

Its embedding is a normalised bag of token ids, so equal texts give equal vectors and different
texts (almost always) different ones. Parameters: `delay_ms` per batch, and `fail_on_token_id`,
which makes any batch holding that token raise, to test that a failing batch fails only itself.
"""

from __future__ import annotations

import time

import numpy as np

from queryserve.config import ModelConfig
from queryserve.types import Array


class FakeBackend:
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")

    def __init__(self, config: ModelConfig) -> None:
        self.dim = config.outputs[0].dims[-1]
        self.output_name = config.outputs[0].name
        self.output_names: tuple[str, ...] = (self.output_name,)
        self.delay_s = config.parameter("delay_ms", 0) / 1000
        self.fail_on_token_id = config.parameter("fail_on_token_id", -1)

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        if self.delay_s:
            time.sleep(self.delay_s)  # stands for compute time on the instance's thread
        if self.fail_on_token_id >= 0 and bool(np.any(ids == self.fail_on_token_id)):
            raise RuntimeError(f"fake failure: token {self.fail_on_token_id} in the batch")
        vectors = np.zeros((ids.shape[0], self.dim), dtype=np.float32)
        for row in range(ids.shape[0]):
            np.add.at(vectors[row], ids[row][mask[row] == 1] % self.dim, 1.0)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return {self.output_name: vectors}
