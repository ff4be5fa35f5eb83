"""The accuracy gate: how an optimized model's outputs are compared with the original's, and
the bounds each precision must meet.

- embed: cosine of the embeddings (fp32: mean >= 0.9999; reduced precision: mean >= 0.99 and
  min >= 0.97) and, for normalising models, unit rows;
- classify and pair: agreement of the top-1 label (fp32: >= 99.9% and probabilities within
  1e-3; reduced precision: >= 99%), or of the decision where the model is served at a
  threshold of its own (the duplicates cross-encoder: P(duplicate) >= 0.2 is "duplicate");
  and, where the plan names hard inputs, exactly the original's decision on each of them, at
  every batch size (`HardItem`): an agreement of 99% over 512 inputs may still flip the one
  pair a user or a test asks about (int8-smoothquant-fused on an AMD EPYC passed at 99.22%
  and called "apple ipod nano 8gb" / "apple ipod touch 8gb" one product, P 0.284 >= 0.2);
- seq2seq: exact match of the generated text (every precision: >= 99% of inputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from queryserve.errors import ExportError
from queryserve.optimize.recipes import Precision

Floats = npt.NDArray[np.float32]

# The gates. fp32 must match the original to rounding; a reduced precision may drift a little
# on average but never badly on any single input.
FP32_MIN_MEAN = 0.9999
REDUCED_MIN_MEAN = 0.99
REDUCED_MIN_MIN = 0.97
NORM_TOLERANCE = 1e-3  # pooling and normalisation are in the graph: rows must be unit already
FP32_MIN_AGREEMENT = 0.999
FP32_MAX_PROBABILITY_ERROR = 1e-3
REDUCED_MIN_AGREEMENT = 0.99
SEQ2SEQ_MIN_EXACT = 0.99  # identical generated text on >= 99% of the inputs, at any precision


class Decision(NamedTuple):
    """How a served pair model decides, where not by its top-1 label: output `column` at or
    above `threshold`. The gate must hold for the decision users get, and a threshold far from
    0.5 sits where int8's small shifts of probability flip more decisions."""

    column: int
    threshold: float


@dataclass(frozen=True)
class HardItem:
    """One hard input as the original and a variant decide it. `original` and `variant` (one
    per batch size of the parity) are the probability the decision reads: the decision's
    column, or without a decision the original's top-1 label. `flipped`: the variant decides
    it otherwise at some batch size, which fails the gate whatever the agreement elsewhere."""

    name: str
    original: float
    variant: tuple[float, ...]
    flipped: bool

    def flip(self, batch_sizes: Sequence[int], threshold: float | None) -> str:
        """The flip in words, naming the input."""
        at = "" if threshold is None else f" at {threshold:g}"
        return (f"the hard input {self.name} is decided otherwise than by the original{at}: "
                f"P {self.original:.3f} in the original, "
                f"{'/'.join(f'{p:.3f}' for p in self.variant)} in this variant at batch sizes "
                f"{'/'.join(map(str, batch_sizes))}")


@dataclass(frozen=True)
class Parity:
    """Agreement of a variant with the original, worst case over the batch sizes.

    embed: `mean`/`min` are cosines and `max_error` is the largest |norm - 1| (0 when the model
    does not normalise). classify and pair: `mean` and `min` are both the top-1 agreement (or
    the agreement of the decision at `threshold`) and `max_error` is the largest difference of
    a probability; `hard` is how each of the plan's hard inputs was decided. seq2seq: `mean`
    and `min` are both the share of inputs whose generated text is identical, and `max_error`
    is the share that differs.
    """

    precision: Precision
    metric: str  # "cosine", "top1" or "exact"
    mean: float
    min: float
    max_error: float
    batch_sizes: tuple[int, ...]
    passed: bool
    threshold: float | None = None  # top1: the decision's threshold, if not the top-1 label
    hard: tuple[HardItem, ...] = ()  # top1: the hard inputs, each decided as the original?

    @property
    def max_norm_error(self) -> float:
        return self.max_error

    @property
    def flipped(self) -> tuple[HardItem, ...]:
        """The hard inputs this variant decides otherwise than the original."""
        return tuple(h for h in self.hard if h.flipped)

    def _held(self) -> str:
        """', hard inputs N/M as the original' (or '' where the plan named none)."""
        if not self.hard:
            return ""
        held = len(self.hard) - len(self.flipped)
        return f", hard inputs {held}/{len(self.hard)} as the original"

    def describe(self) -> str:
        sizes = f"over batch sizes {list(self.batch_sizes)}"
        if self.metric == "exact":
            return f"identical generated text on {self.mean:.2%} of inputs {sizes}"
        if self.metric == "top1":
            return (f"{self.agreement_label} {self.mean:.2%}, max |probability difference| "
                    f"{self.max_error:.1e}{self._held()} {sizes}")
        return (f"mean cosine {self.mean:.6f}, min {self.min:.6f}, max |norm-1| "
                f"{self.max_error:.1e} {sizes}")

    def brief(self) -> str:
        if self.metric == "exact":
            return f"exact match {self.mean:.2%}"
        if self.metric == "top1":
            return (f"{self.agreement_label} {self.mean:.2%}, max |dp| {self.max_error:.1e}"
                    f"{self._held()}")
        return f"cos mean {self.mean:.5f} min {self.min:.5f}"

    @property
    def agreement_label(self) -> str:
        """What a top1 parity counts: the top-1 label, or the decision at `threshold`."""
        return ("top-1 agreement" if self.threshold is None
                else f"agreement of the decision at {self.threshold:g}")

    def shortfall(self) -> str:
        """What the variant missed its gate by, or '' if it passed."""
        if self.passed:
            return ""
        misses = []
        for label, value, bound, higher in _bounds(self):
            if (value < bound) if higher else (value > bound):
                misses.append(f"{label} {value:.6f} {'<' if higher else '>'} {bound} "
                              f"(by {abs(value - bound):.6f})")
        misses += [h.flip(self.batch_sizes, self.threshold) for h in self.flipped]
        return "; ".join(misses)


def _bounds(parity: Parity) -> list[tuple[str, float, float, bool]]:
    fp32 = parity.precision == "fp32"
    if parity.metric == "exact":
        return [("exact match", parity.mean, SEQ2SEQ_MIN_EXACT, True)]
    if parity.metric == "top1":
        bounds = [(parity.agreement_label, parity.mean,
                   FP32_MIN_AGREEMENT if fp32 else REDUCED_MIN_AGREEMENT, True)]
        if fp32:
            bounds.append(("max |probability difference|", parity.max_error,
                           FP32_MAX_PROBABILITY_ERROR, False))
        return bounds
    if fp32:
        bounds = [("mean cosine", parity.mean, FP32_MIN_MEAN, True)]
    else:
        bounds = [("mean cosine", parity.mean, REDUCED_MIN_MEAN, True),
                  ("min cosine", parity.min, REDUCED_MIN_MIN, True)]
    return [*bounds, ("max |norm-1|", parity.max_error, NORM_TOLERANCE, False)]


def bounds_met(parity: Parity) -> bool:
    """Whether the figures meet every bound of their metric and precision, and every hard
    input is decided as the original decides it."""
    return not parity.flipped and all(((v >= b) if higher else (v <= b))
                                      for _, v, b, higher in _bounds(parity))


def decided(outputs: Floats, decision: Decision | None = None) -> npt.NDArray[np.int64]:
    """What each row decides: its top-1 label, or 1 where the decision's column is at or above
    its threshold and 0 where below."""
    if decision is None:
        return np.asarray(outputs.argmax(axis=1), dtype=np.int64)
    column, threshold = decision
    return np.asarray(outputs[:, column] >= threshold, dtype=np.int64)


def hard_items(names: Sequence[str], outputs: Sequence[Floats], reference: Floats,
               decision: Decision | None = None) -> tuple[HardItem, ...]:
    """Each named input as `reference` (the original) and a variant decide it; `outputs` holds
    the variant's rows once per batch size, in `names`' order."""
    if len(names) != len(reference) or any(o.shape != reference.shape for o in outputs):
        raise ExportError(f"{len(names)} hard inputs, but the original returned "
                          f"{reference.shape} and the variant {[o.shape for o in outputs]}")
    columns = (reference.argmax(axis=1) if decision is None
               else np.full(len(reference), decision.column))
    expected = decided(reference, decision)
    flipped = np.zeros(len(reference), dtype=bool)
    for batch in outputs:
        flipped |= decided(batch, decision) != expected
    return tuple(HardItem(name, float(reference[i, columns[i]]),
                          tuple(float(batch[i, columns[i]]) for batch in outputs),
                          bool(flipped[i]))
                 for i, name in enumerate(names))


def compare(metric: str, outputs: Floats, reference: Floats, normalized: bool,
            decision: Decision | None = None) -> tuple[float, float, float]:
    """(mean, min, max_error) of one batch size's outputs against the reference."""
    if outputs.shape != reference.shape:
        raise ExportError(f"the encoder returned {outputs.shape}, expected {reference.shape}")
    if metric == "top1":
        agreement = float(np.mean(decided(outputs, decision) == decided(reference, decision)))
        error = float(np.nan_to_num(np.abs(outputs - reference), nan=np.inf).max())
        return agreement, agreement, error
    norms = np.linalg.norm(outputs, axis=1)
    cosines = np.sum(outputs * reference, axis=1) / (
        np.maximum(norms, 1e-12) * np.linalg.norm(reference, axis=1))
    cosines = np.nan_to_num(cosines, nan=-1.0)  # a non-finite row counts as opposite
    norm_error = (float(np.nan_to_num(np.abs(norms - 1.0), nan=np.inf).max()) if normalized
                  else 0.0)
    return float(cosines.mean()), float(cosines.min()), norm_error
