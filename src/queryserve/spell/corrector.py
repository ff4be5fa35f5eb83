"""Spelling correctors run in this process for evaluation, behind one interface with the
dictionary baseline: `correct(queries) -> [Correction]` (`queryserve.api.Correction`, what the
served correctors answer too)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from queryserve.api import Correction, normalized


class Corrector(Protocol):
    @property
    def name(self) -> str: ...

    def correct(self, queries: Sequence[str]) -> list[Correction]: ...


@dataclass(frozen=True)
class Confident:
    """A corrector that changes a query only when its score reaches `min_score`: a search
    bar's auto-correct (below it, the correction is a "did you mean" suggestion at most)."""
    corrector: Corrector
    min_score: float

    @property
    def name(self) -> str:
        return f"{self.corrector.name}, score >= {self.min_score:g}"

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        return [c if c.score >= self.min_score or not c.changed
                else Correction(c.query, normalized(c.query), False, c.score)
                for c in self.corrector.correct(queries)]


class ServedCorrector:
    """A served `text2text` model folder (`queryserve optimize --task seq2seq` output) run in
    this process as the server runs it (`local.open_model`)."""

    name = "seq2seq"

    def __init__(self, folder: Path) -> None:
        from queryserve.api import Corrections
        from queryserve.local import open_model

        self.model = open_model(folder, Corrections)

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        return [c for answer in self.model.infer_parts(queries) for c in answer.corrections]

    def generate(self, queries: Sequence[str]) -> list[tuple[str, float]]:
        """The model's own text and score for each query, as KServe `spell` returns them."""
        return [(text, c.score) for answer in self.model.infer_parts(queries)
                for text, c in zip(answer.generated, answer.corrections, strict=True)]


def open_corrector(folder: Path) -> Corrector:
    """The corrector a served model folder holds, run in this process as the server runs it."""
    from queryserve.config import load_model_config
    from queryserve.errors import ConfigError

    if not (folder / "model.yaml").is_file():
        raise ConfigError(f"{folder} is not a served model folder (no model.yaml); make one "
                          "with `queryserve train spell-channel` or `queryserve optimize "
                          "TRAINED_FOLDER --task seq2seq`")
    backend = load_model_config(folder / "model.yaml").backend
    if backend == "noisy_channel":
        from queryserve.backends.noisy_channel.channel import NoisyChannel
        from queryserve.backends.noisy_channel.rerank import RERANKER_FILE, HybridCorrector

        if (folder / RERANKER_FILE).is_file():
            return HybridCorrector.load(folder, threads=os.cpu_count() or 1)
        return NoisyChannel.load(folder)
    if backend == "ctranslate2":
        return ServedCorrector(folder)
    raise ConfigError(f"{folder / 'model.yaml'}: backend {backend!r} is not a spelling "
                      "corrector (expected noisy_channel or ctranslate2)")
