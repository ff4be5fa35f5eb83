"""A classifier's calibration, `calibration.json` beside its model: the temperature that its
probabilities are softened by, and the confidence under which its likeliest label is not to be
trusted.

A fine-tuned classifier is over-confident: its top probability runs above how often the top
label is right. Temperature scaling (Guo et al., 2017) divides the logits by one scalar T fitted
on held-out data, which fixes most of that and never changes which label is likeliest. The graph
returns probabilities, not logits, but softmax(z / T) = softmax(log p / T), so raising p to 1 / T
and renormalising is the same scaling (and a probability of exactly 0 stays 0, with no log).

`queryserve prepare` fits it for `intent` (`intent/calibration.py`); a model without the file
reports its probabilities as the graph gives them, and every label as confident.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from queryserve.errors import ConfigError
from queryserve.types import Array

FILE = "calibration.json"
MAX_TEMPERATURE = 100.0  # a fit past this has flattened every answer: something went wrong


@dataclass(frozen=True, slots=True)
class Calibration:
    temperature: float
    """T: the logits are divided by it (above 1 softens, below 1 sharpens)."""
    threshold: float
    """A label is `confident` at this calibrated probability or above."""

    def apply(self, probabilities: Array) -> Array:
        """[n, classes] probabilities as the temperature scales them, rows summing to 1."""
        if self.temperature == 1.0:
            return probabilities
        scaled = np.power(probabilities.astype(np.float64), 1.0 / self.temperature)
        result: Array = (scaled / scaled.sum(axis=1, keepdims=True)).astype(np.float32)
        return result

    def save(self, folder: Path, fit: Mapping[str, object]) -> None:
        """Write `calibration.json`; `fit` records how it was fitted, for people to read."""
        document = {"temperature": self.temperature, "threshold": self.threshold,
                    "fit": dict(fit)}
        (folder / FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def load_calibration(folder: Path) -> Calibration | None:
    """The calibration in `folder`, checked; None where there is none."""
    path = folder / FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(raw, dict) or set(raw) - {"temperature", "threshold", "fit"}:
        raise ConfigError(f"{path}: expected an object with 'temperature', 'threshold' and "
                          "optionally 'fit'; `queryserve prepare` writes it")
    return Calibration(_number(path, raw, "temperature", 1e-3, MAX_TEMPERATURE),
                       _number(path, raw, "threshold", 0.0, 1.0))


def _number(path: Path, raw: dict[str, object], field: str, low: float, high: float) -> float:
    value = raw.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not low <= value <= high:
        raise ConfigError(f"{path}: field '{field}' is {value!r}; expected a number from "
                          f"{low:g} to {high:g}")
    return float(value)
