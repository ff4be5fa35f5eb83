"""CTranslate2: seq2seq generation (T5, BART) from a converted model folder.

Input is a batch of source token strings (the model's own vocabulary, end token included), as
an object array of lists; output is the best hypothesis's tokens per item, in order, and its
mean token log-probability. Decoding is
greedy unless `beam_size` > 1. The batch arrives already cut by the scheduler, so CTranslate2's
own batching is off (`max_batch_size=0`), and one translator thread per instance
(`inter_threads=1`): the server's instances are its parallelism.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from queryserve.config import ModelConfig
from queryserve.errors import ConfigError
from queryserve.types import Array

SOURCE_TOKENS = "source_tokens"
OUTPUT_TOKENS = "output_tokens"
OUTPUT_SCORES = "output_scores"

log = logging.getLogger(__name__)


def token_rows(rows: list[list[str]]) -> Array:
    """An object array holding one list per row (numpy would make a 2-D array of equal rows)."""
    array = np.empty(len(rows), dtype=object)
    array[:] = rows
    return array


class CTranslate2Backend:
    input_names: tuple[str, ...] = (SOURCE_TOKENS,)
    output_names: tuple[str, ...] = (OUTPUT_TOKENS, OUTPUT_SCORES)

    def __init__(self, config: ModelConfig, threads: int) -> None:
        import ctranslate2  # here, so servers without seq2seq models never load it

        path = config.path / config.parameter("model_dir", "ctranslate2")
        if not (path / "model.bin").is_file():
            raise ConfigError(f"{config.path / 'model.yaml'}: {path} is not a CTranslate2 model "
                              "folder (no model.bin); make one with `queryserve optimize "
                              "--task seq2seq`")
        # More intra-op threads are not always faster (on a 2-core VM a second thread made a
        # small int8 model ~9x slower): `intra_threads`, which `queryserve optimize` sets from
        # its timing, caps the threads this instance takes.
        intra = min(threads, config.parameter("intra_threads", threads))

        def translator(device: str) -> Any:
            return ctranslate2.Translator(
                str(path), device=device, compute_type=config.parameter("compute_type", "default"),
                inter_threads=1, intra_threads=intra)

        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        self.translator = translator(device)
        if device == "cuda":
            # A wheel built for another CUDA major version sees the GPU and loads, then fails on
            # its first batch (ctranslate2 4.x on an H100 with CUDA 13 libraries only: "Library
            # libcublas.so.12 is not found"; BENCHMARKS.md, GPU). Decode one token now, and
            # serve on the CPU rather than fail every request.
            try:
                self.translator.translate_batch([["a"]], max_decoding_length=1)
            except RuntimeError as exc:
                log.warning("%s: CTranslate2 cannot run on the GPU (%s); using the CPU",
                            config.name, exc)
                device = "cpu"
                self.translator = translator(device)
        self.device = device
        self.beam_size = config.parameter("beam_size", 1)
        self.max_length = config.parameter("max_output_length", 64)
        self.max_input_length = config.parameter("max_sequence_length", 256)

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        hypotheses, scores = generate_scored(
            self.translator, list(inputs[SOURCE_TOKENS]), self.beam_size, self.max_length,
            self.max_input_length)
        return {OUTPUT_TOKENS: token_rows(hypotheses),
                OUTPUT_SCORES: np.asarray(scores, dtype=np.float32)}


def generate_scored(translator: Any, sources: list[list[str]], beam_size: int, max_length: int,
                    max_input_length: int = 256) -> tuple[list[list[str]], list[float]]:
    """The best hypothesis's tokens for each source, decoded as the server decodes (the
    optimizer's gate and timing call this too), and its mean token log-probability."""
    results = translator.translate_batch(
        sources, max_batch_size=0, beam_size=beam_size, num_hypotheses=1,
        max_decoding_length=max_length, max_input_length=max_input_length,
        # Hugging Face `generate` may end at once; CTranslate2's default (1) forbids it, and
        # then writes something else where `generate` writes nothing.
        min_decoding_length=0, return_scores=True)
    return [r.hypotheses[0] for r in results], [r.scores[0] for r in results]


def generate(translator: Any, sources: list[list[str]], beam_size: int, max_length: int,
             max_input_length: int = 256) -> list[list[str]]:
    return generate_scored(translator, sources, beam_size, max_length, max_input_length)[0]
