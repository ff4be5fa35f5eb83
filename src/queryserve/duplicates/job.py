"""One batch job's work folder, and the scoring of one of its parts: the piece that the local
engine (`batch.py`) and the Ray engine (`ray_engine.py`) share.

`score_part` is a pure function of the work folder's files, so any process, a Ray worker too,
can score any part; it writes its part to a temporary file and renames it, so a part is whole
or absent, and a rerun (or a retry) never duplicates rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from queryserve.api import Inputs, PairScores
from queryserve.duplicates.tables import write_pairs
from queryserve.local import LocalModel, open_model
from queryserve.pipelines.pairs.features import features_array, text_signals
from queryserve.pipelines.pairs.head import PairHead
from queryserve.types import Array

# Each product meets many others across the parts a process scores: read its text once. (The
# batch job's process ends with the job; the server reads per request instead.)
_read_signals = lru_cache(maxsize=1 << 16)(text_signals)


@dataclass(frozen=True)
class Job:
    """Where a job's files are, and how to score one of its parts (a pure function of files,
    so any process, a Ray worker too, can score any part)."""

    work: Path
    model: Path  # the model that scores the candidates
    blocking: Path  # the bi-encoder that embeds every product (`model` itself, unless cross)
    cross: bool  # whether `model` is a cross-encoder
    tables: int
    part_size: int
    threshold: float
    min_probability: float

    def embeddings(self, table: int) -> Path:
        return self.work / f"embeddings-{table}.npy"

    @property
    def candidates(self) -> Path:
        return self.work / "candidates.npy"

    def part(self, number: int) -> Path:
        return self.work / f"part-{number:05d}.parquet"

    def texts(self, table: int) -> list[str]:
        return json.loads((self.work / f"texts-{table}.json").read_text())  # type: ignore[no-any-return]

    def ids(self, table: int) -> list[str]:
        return json.loads((self.work / f"ids-{table}.json").read_text())  # type: ignore[no-any-return]


_opened: dict[tuple[Path, int], LocalModel[PairScores]] = {}


def _cross_encoder(folder: Path, threads: int) -> LocalModel[PairScores]:
    """The served cross-encoder, in this process: once per process (a Ray worker scores many
    parts)."""
    if (folder, threads) not in _opened:
        _opened[folder, threads] = open_model(folder, PairScores, threads=threads)
    return _opened[folder, threads]


def close_models() -> None:
    """Close what `_cross_encoder` opened. Left open at exit (Ctrl-C while scoring), its
    instance threads still held ONNX Runtime sessions and the process aborted ("terminate
    called without an active exception", SIGABRT)."""
    while _opened:
        _opened.popitem()[1].close()


def blocking_probabilities(job: Job, rows: Array) -> Array:
    """The bi-encoder head's probability of candidate pairs [m, 2], from the stored embeddings:
    thousands of pairs a second, so the blocking stage can afford every neighbour pair."""
    head = PairHead.load(job.blocking)
    last = job.tables - 1
    u = np.load(job.embeddings(0), mmap_mode="r")[rows[:, 0]]
    v = np.load(job.embeddings(last), mmap_mode="r")[rows[:, 1]]
    left_texts, right_texts = job.texts(0), job.texts(last)
    features = features_array([(left_texts[i], right_texts[j]) for i, j in rows], _read_signals)
    return head.probability(u, v, features)


def score_part(job: Job, number: int, threads: int = 1) -> int:
    """Score part `number` and write it (whole or not at all); returns the pairs scored."""
    candidates = np.load(job.candidates, mmap_mode="r")
    rows = np.asarray(candidates[number * job.part_size:(number + 1) * job.part_size])
    last = job.tables - 1
    if job.cross:
        left_texts, right_texts = job.texts(0), job.texts(last)
        answer = _cross_encoder(job.model, threads).infer(Inputs(
            [left_texts[i] for i in rows[:, 0]], [right_texts[j] for j in rows[:, 1]]))
        probability = answer.probabilities
    else:
        probability = blocking_probabilities(job, rows)
    keep = probability >= job.min_probability
    left_ids, right_ids = job.ids(0), job.ids(last)
    write_pairs(job.part(number), {
        "left_id": [left_ids[i] for i in rows[keep, 0]],
        "right_id": [right_ids[j] for j in rows[keep, 1]],
        "probability": probability[keep].tolist(),
        "duplicate": (probability[keep] >= job.threshold).tolist()})
    return len(rows)
