"""Runtimes behind one small seam: named numpy arrays in, named numpy arrays out (object
arrays of token lists for CTranslate2).

One file per runtime. A backend instance is used by one thread at a time (its model
instance), so it needs no locking of its own; the runtime releases the GIL while it computes.
"""

from __future__ import annotations

from typing import Protocol

from queryserve.config import ModelConfig
from queryserve.errors import ConfigError
from queryserve.types import Array


class Backend(Protocol):
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    """What `run` answers with: a pipeline checks at load that the names it reads are here."""

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]: ...


def create_backend(config: ModelConfig, threads: int) -> Backend:
    """One instance of the model's runtime with `threads` intra-op threads."""
    if config.backend == "onnxruntime":
        from queryserve.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(config, threads)
    if config.backend == "ctranslate2":
        from queryserve.backends.ctranslate2 import CTranslate2Backend

        return CTranslate2Backend(config, threads)
    if config.backend == "noisy_channel":
        from queryserve.backends.noisy_channel import NoisyChannelBackend

        return NoisyChannelBackend(config, threads)
    if config.backend == "fake":
        from queryserve.backends.fake import FakeBackend

        return FakeBackend(config)
    raise ConfigError(f"{config.path / 'model.yaml'}: unknown backend {config.backend!r}")
