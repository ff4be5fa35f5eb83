"""What a spelling corrector answers, and the trained model behind the same interface as the
dictionary baseline: `correct(queries) -> [Correction]`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Correction:
    query: str
    corrected: str
    changed: bool
    """Whether `corrected` differs from the query as typed, ignoring case and extra spaces."""
    score: float
    """The corrector's confidence in `corrected`, 0 to 1 (the model: the geometric mean of
    its token probabilities; the dictionary baseline: always 1)."""

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def normalized(query: str) -> str:
    """How queries are compared: the model lower-cases, and spacing is not a spelling."""
    return " ".join(query.lower().split())


def correction(query: str, corrected: str, score: float) -> Correction:
    """An empty generation corrects nothing: the query stands, as typed but normalized."""
    corrected = corrected or normalized(query)
    return Correction(query, corrected, corrected != normalized(query), score)


class Corrector(Protocol):
    name: str

    def correct(self, queries: Sequence[str]) -> list[Correction]: ...


class Seq2SeqCorrector:
    """A CTranslate2 folder as `queryserve optimize --task seq2seq` writes it, run as the
    server runs it (same tokenizer, decoding and scores), in this process."""

    name = "seq2seq"

    def __init__(self, folder: Path, batch_size: int = 32) -> None:
        import yaml
        from ctranslate2 import Translator

        from queryserve.pipelines.base import open_tokenizer

        parameters = yaml.safe_load((folder / "model.yaml").read_text())["parameters"]
        self.tokenizer = open_tokenizer(folder / parameters["tokenizer_file"],
                                        parameters["max_sequence_length"])
        self.translator = Translator(str(folder / parameters["model_dir"]), device="cpu",
                                     intra_threads=parameters.get("intra_threads", 0))
        self.beam_size = parameters["beam_size"]
        self.max_length = parameters["max_output_length"]
        self.batch_size = batch_size

    def generate(self, queries: Sequence[str]) -> list[tuple[str, float]]:
        """The model's own text and score for each query, as KServe `spell` returns them."""
        from queryserve.backends.ctranslate2 import generate_scored
        from queryserve.pipelines.text2text import decode_tokens, source_tokens

        out: list[tuple[str, float]] = []
        for start in range(0, len(queries), self.batch_size):
            batch = list(queries[start:start + self.batch_size])
            tokens, scores = generate_scored(
                self.translator, source_tokens(self.tokenizer, batch), self.beam_size,
                self.max_length)
            out += zip(decode_tokens(self.tokenizer, tokens), map(math.exp, scores),
                       strict=True)
        return out

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        return [correction(q, text, score)
                for q, (text, score) in zip(queries, self.generate(queries), strict=True)]
