"""Calibrating the served intent classifier on MASSIVE's validation split (`queryserve prepare`).

What is calibrated is the model as served (`model_repository/intent`, the int8 graph prepare
chose), not the PyTorch original: int8's probabilities differ from the original's by up to
0.22 (its prepare.json), so a temperature fitted on the original would be fitted to another
model. The validation split is MASSIVE's held-out development set; the test split is never
read here, so the figures measured on it (benchmarks/intent_calibration.py) stay honest.

Two numbers are fitted, both on validation:

- the temperature T, by minimising the negative log-likelihood of the right labels (one scalar,
  Guo et al., 2017): NLL is convex in 1 / T, so a golden-section search finds its minimum;
- the threshold, the lowest calibrated confidence at which the intents shown as confident are
  right at least `TARGET_PRECISION` (90%) of the time: of the top intents at or above it, at
  least 90% are right. What is under it is mostly wrong (a quarter right on validation), so
  the search page can dim it instead of asserting it.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from queryserve.api import Classifications
from queryserve.intent.train import DATA, IntentError, load_massive
from queryserve.local import open_model
from queryserve.pipelines.calibration import FILE, Calibration
from queryserve.types import Array

TARGET_PRECISION = 0.9
ECE_BINS = 15  # equal-width confidence bins, as Guo et al. measure ECE
LOG_BETA_RANGE = (math.log(0.05), math.log(20.0))  # 1 / T searched over [0.05, 20]
GOLDEN_STEPS = 60  # shrinks that range by 0.618 ** 60: far below any figure we report
TINY = 1e-30  # the log of a probability the graph rounded to 0 stays finite


def scaled(probabilities: Array, temperature: float) -> Array:
    """Probabilities at `temperature`, scaled as the served model scales them."""
    return Calibration(temperature, threshold=1.0).apply(probabilities)


def negative_log_likelihood(probabilities: Array, labels: Array,
                            temperature: float = 1.0) -> float:
    """Mean -log p(right label) at `temperature`, computed from the logs (no underflow)."""
    logits = np.log(np.maximum(probabilities.astype(np.float64), TINY)) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(logits).sum(axis=1))
    return float(np.mean(log_norm - logits[np.arange(len(labels)), labels]))


def fit_temperature(probabilities: Array, labels: Array) -> float:
    """The T that minimises the NLL of `labels`. Softmax logs are linear in 1 / T and
    log-sum-exp is convex, so NLL is convex in 1 / T: one minimum, which a golden-section
    search over log(1 / T) brackets."""
    low, high = LOG_BETA_RANGE
    golden = (math.sqrt(5) - 1) / 2

    def cost(log_beta: float) -> float:
        return negative_log_likelihood(probabilities, labels, math.exp(-log_beta))

    for _ in range(GOLDEN_STEPS):
        left, right = high - golden * (high - low), low + golden * (high - low)
        if cost(left) < cost(right):
            high = right
        else:
            low = left
    return math.exp(-(low + high) / 2)


def confidence_threshold(probabilities: Array, labels: Array,
                         precision: float = TARGET_PRECISION) -> float:
    """The lowest top probability t such that the top labels scored t or more are right at
    least `precision` of the time; 1.0 where even the surest are right less often than that."""
    confidence = probabilities.max(axis=1)
    order = np.argsort(-confidence, kind="stable")
    right = probabilities.argmax(axis=1)[order] == labels[order]
    running = np.cumsum(right) / np.arange(1, len(right) + 1)  # precision of the surest n
    reaching = np.nonzero(running >= precision)[0]
    return float(confidence[order][reaching[-1]]) if len(reaching) else 1.0


def expected_calibration_error(probabilities: Array, labels: Array,
                               bins: int = ECE_BINS) -> float:
    """Sum over confidence bins of |accuracy - mean confidence|, weighted by the bin's share."""
    confidence = probabilities.max(axis=1)
    right = probabilities.argmax(axis=1) == labels
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    error = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            error += inside.mean() * abs(right[inside].mean() - confidence[inside].mean())
    return float(error)


def model_digest(folder: Path) -> str:
    """What a calibration was fitted to: the served graph's bytes."""
    return hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()[:16]


def calibration_is_current(folder: Path) -> bool:
    """Whether `folder` holds a calibration fitted to the graph it serves now (a folder
    prepared before calibrations existed holds none; a rebuilt graph needs a new one)."""
    try:
        fit = json.loads((folder / FILE).read_text(encoding="utf-8"))["fit"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(fit.get("model_sha256") == model_digest(folder))


def served_probabilities(folder: Path, texts: list[str]) -> Array:
    """[n, classes]: the probabilities the model in `folder` serves for `texts`, through its
    own pipeline (and so with its calibration, if it has one)."""
    with open_model(folder, Classifications) as model:
        parts = [answer.probabilities for answer in model.infer_parts(texts)]
    probabilities: Array = np.concatenate(parts)
    return probabilities


def label_ids(folder: Path, names: list[str], gold: list[int]) -> Array:
    """MASSIVE's label ids as the served model's columns (its `parameters.labels`)."""
    from queryserve.config import MODEL_FILE, load_model_config

    config = load_model_config(folder / MODEL_FILE)
    served = config.labels(config.outputs[0].dims[-1])
    missing = sorted(set(names) - set(served))
    if missing:
        raise IntentError(f"{folder}: the served labels lack MASSIVE's {', '.join(missing[:3])}")
    return np.array([served.index(names[g]) for g in gold])


def calibrate_intent(folder: Path, data: Path = DATA) -> dict[str, Any]:
    """Fit the served model in `folder` on `data`'s validation split; writes
    `calibration.json` and returns what it records."""
    massive = load_massive(data)
    texts = massive.validation.texts
    labels = label_ids(folder, massive.names, massive.validation.labels)
    # The old calibration goes first, so that the fit starts from the graph's own probabilities
    # (a server that has the model loaded keeps the one it read at load).
    (folder / FILE).unlink(missing_ok=True)
    raw = served_probabilities(folder, texts)
    temperature = fit_temperature(raw, labels)
    calibrated = scaled(raw, temperature)
    threshold = confidence_threshold(calibrated, labels)
    confident = calibrated.max(axis=1) >= threshold
    right = calibrated.argmax(axis=1) == labels
    fit = {"split": "validation", "data": str(data), "examples": len(texts),
           "rule": f"the lowest confidence at which the top intents at or above it are right "
                   f">= {TARGET_PRECISION:.0%} of the time",
           "target_precision": TARGET_PRECISION,
           "accuracy": round(float(right.mean()), 4),
           "confident_share": round(float(confident.mean()), 4),
           "accuracy_confident": round(float(right[confident].mean()), 4),
           "nll_before": round(negative_log_likelihood(raw, labels), 4),
           "nll_after": round(negative_log_likelihood(raw, labels, temperature), 4),
           "ece_before": round(expected_calibration_error(raw, labels), 4),
           "ece_after": round(expected_calibration_error(calibrated, labels), 4),
           "model_sha256": model_digest(folder)}
    Calibration(temperature, threshold).save(folder, fit)
    return {"temperature": temperature, "threshold": threshold, **fit}


def ensure_calibrated(folder: Path, data: Path = DATA) -> None:
    """Calibrate the served model in `folder` unless its calibration fits the graph it serves
    (`queryserve prepare`: for a graph just built, and for one prepared before calibrations
    existed, which prepare keeps); seconds."""
    if calibration_is_current(folder):
        print("intent: already calibrated (calibration.json)")
        return
    fit = calibrate_intent(folder, data)
    print(f"intent: calibrated on MASSIVE's validation split: temperature "
          f"{fit['temperature']:.3f}, an intent is confident at >= {fit['threshold']:.3f} "
          f"({fit['confident_share']:.1%} of validation, {fit['accuracy_confident']:.1%} right)")
