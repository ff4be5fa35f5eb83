"""A classifier's calibration: the temperature fit, the confidence threshold, ECE, and
`calibration.json` as the pipeline reads it (`pipelines/calibration.py`, `intent/calibration.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from queryserve.errors import ConfigError
from queryserve.intent.calibration import (
    calibration_is_current,
    confidence_threshold,
    expected_calibration_error,
    fit_temperature,
    model_digest,
    negative_log_likelihood,
)
from queryserve.pipelines.calibration import FILE, Calibration, load_calibration
from queryserve.types import Array


def softmax(logits: Array) -> Array:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    result: Array = shifted / shifted.sum(axis=1, keepdims=True)
    return result


def synthetic(sharpness: float, seed: int = 0) -> tuple[Array, Array]:
    """Labels drawn from softmax(z), and a model that reports softmax(sharpness * z): over-
    confident by a temperature of `sharpness` (under-confident below 1)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, size=(3000, 8))
    truth = softmax(logits)
    labels = np.array([rng.choice(8, p=row) for row in truth])
    return softmax(sharpness * logits).astype(np.float32), labels


@pytest.mark.parametrize("sharpness", [3.0, 0.5])
def test_the_temperature_fit_lowers_nll_and_keeps_the_argmax(sharpness: float) -> None:
    probabilities, labels = synthetic(sharpness)
    temperature = fit_temperature(probabilities, labels)
    assert temperature == pytest.approx(sharpness, rel=0.1)  # it finds the distortion
    assert negative_log_likelihood(probabilities, labels, temperature) < \
        negative_log_likelihood(probabilities, labels) - 0.05
    calibrated = Calibration(temperature, 0.5).apply(probabilities)
    assert (calibrated.argmax(axis=1) == probabilities.argmax(axis=1)).all()
    assert calibrated.dtype == np.float32
    assert np.allclose(calibrated.sum(axis=1), 1.0, atol=1e-5)
    assert expected_calibration_error(calibrated, labels) < \
        expected_calibration_error(probabilities, labels)


def test_the_served_scaling_is_softmax_of_the_logits_over_t() -> None:
    """p ** (1 / T), renormalised, is softmax(z / T); a probability of 0 stays 0."""
    logits = np.array([[2.0, 1.0, -1.0], [0.0, 3.0, 0.5]])
    scaled = Calibration(2.0, 0.5).apply(softmax(logits).astype(np.float32))
    assert np.allclose(scaled, softmax(logits / 2.0), atol=1e-6)
    zero = Calibration(1.7, 0.5).apply(np.array([[0.0, 0.25, 0.75]], dtype=np.float32))
    assert zero[0, 0] == 0.0 and zero[0].sum() == pytest.approx(1.0)
    same = np.array([[0.2, 0.8]], dtype=np.float32)
    assert Calibration(1.0, 0.5).apply(same) is same


def test_the_threshold_is_the_lowest_confidence_whose_answers_reach_the_precision() -> None:
    # Ten answers, surest first; the 7th and 9th are wrong.
    confidence = np.linspace(0.95, 0.5, 10)
    right = np.array([1, 1, 1, 1, 1, 1, 0, 1, 0, 1], dtype=bool)
    probabilities = np.stack([confidence, 1 - confidence], axis=1)
    labels = np.where(right, 0, 1)
    # The surest 8 are 7/8 = 87.5% right, the surest 10 are 80%: 85% keeps 8.
    assert confidence_threshold(probabilities, labels, 0.85) == pytest.approx(confidence[7])
    assert confidence_threshold(probabilities, labels, 0.8) == pytest.approx(confidence[9])
    assert confidence_threshold(probabilities, labels, 1.0) == pytest.approx(confidence[5])
    never = np.array([1] * 10)  # every answer wrong: nothing is confident
    assert confidence_threshold(probabilities, never, 0.9) == 1.0


def test_ece_is_zero_when_confidence_is_accuracy() -> None:
    probabilities = np.array([[0.75, 0.25]] * 4 + [[1.0, 0.0]] * 2)
    labels = np.array([0, 0, 0, 1, 0, 0])  # 3 of 4 right at 0.75, 2 of 2 at 1.0
    assert expected_calibration_error(probabilities, labels) == pytest.approx(0.0)
    assert expected_calibration_error(probabilities, np.array([1, 1, 1, 1, 0, 0])) == \
        pytest.approx(4 / 6 * 0.75)


def test_calibration_json_round_trips_and_is_checked(tmp_path: Path) -> None:
    assert load_calibration(tmp_path) is None  # no file: the graph's probabilities as they are
    Calibration(1.25, 0.43).save(tmp_path, {"split": "validation"})
    assert load_calibration(tmp_path) == Calibration(1.25, 0.43)
    assert json.loads((tmp_path / FILE).read_text())["fit"] == {"split": "validation"}
    for document, words in [({"temperature": 0, "threshold": 0.4}, "'temperature' is 0"),
                            ({"temperature": 1.2, "threshold": 1.5}, "'threshold' is 1.5"),
                            ({"temperature": True, "threshold": 0.4}, "'temperature' is True"),
                            ({"temperature": 1.2}, "'threshold' is None"),
                            ({"temperature": 1.2, "threshold": 0.4, "T": 1}, "expected an "
                                                                             "object")]:
        (tmp_path / FILE).write_text(json.dumps(document))
        with pytest.raises(ConfigError, match=words):
            load_calibration(tmp_path)
    (tmp_path / FILE).write_text("{")
    with pytest.raises(ConfigError, match="cannot read it as JSON"):
        load_calibration(tmp_path)


def test_a_calibration_is_current_only_for_the_graph_it_was_fitted_to(tmp_path: Path) -> None:
    """What lets `queryserve prepare` calibrate a folder prepared before calibrations existed,
    and fit again when the graph is rebuilt."""
    (tmp_path / "model.onnx").write_bytes(b"graph one")
    assert not calibration_is_current(tmp_path)  # none yet
    Calibration(1.25, 0.43).save(tmp_path, {"model_sha256": model_digest(tmp_path)})
    assert calibration_is_current(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"graph two")
    assert not calibration_is_current(tmp_path)
