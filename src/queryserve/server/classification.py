"""Triton's classification extension: an output asked for with `parameters: {"classification":
k}` answers, instead of the model's scores, each row's k highest-scoring classes as BYTES
strings `"<score>:<index>:<label>"`, highest first, in a [batch, k] tensor.

As Triton does: the score is printed as C++'s `std::to_string` prints a float (six decimals),
ties keep the lower index first, and k larger than the number of classes gives every class.
queryserve answers it for `text_classification` models, whose labels come from the model's
`parameters.labels`; over HTTP and gRPC alike (the shared codec in `kserve.py` applies it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from queryserve.api import Classifications, as_json
from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput
from queryserve.model import ANSWERS, pipelines_answering
from queryserve.types import Array

PARAMETER = "classification"


def classification_count(value: object, output: str, config: ModelConfig) -> int:
    """The k of an output's `classification` parameter, checked against the model: one that
    answers `Classifications`, whose outputs are class scores, so that top classes mean
    something."""
    if ANSWERS[config.pipeline] is not Classifications:
        raise InvalidInput(f"output '{output}': model '{config.name}' is a {config.pipeline} "
                           f"model; the classification extension serves "
                           f"{' and '.join(pipelines_answering(Classifications))} models only")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"output '{output}': parameter 'classification' is {as_json(value)}; "
                           "expected how many top classes to answer, an integer >= 1")
    return value


def top_classes(scores: Array, count: int, labels: Sequence[str]) -> Array:
    """Each row's `count` best classes as `"score:index:label"` strings: [rows, count]
    (fewer where there are fewer classes)."""
    rows = scores.reshape(scores.shape[0], -1)
    best = np.argsort(-rows, axis=1, kind="stable")[:, :count]
    out = np.empty(best.shape, dtype=object)
    for i, row in enumerate(best):
        for j, index in enumerate(row.tolist()):
            out[i, j] = f"{float(rows[i, index]):f}:{index}:{labels[index]}"
    return out
