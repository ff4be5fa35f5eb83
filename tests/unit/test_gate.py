"""The accuracy gate's comparison of a classifier's outputs: by the top-1 label, or by the
decision a pair model is served with at a threshold of its own."""

from __future__ import annotations

import numpy as np

from queryserve.optimize.gate import Decision, Parity, bounds_met, compare


def probabilities(duplicate: list[float]) -> np.ndarray:
    p = np.asarray(duplicate, dtype=np.float32)
    return np.stack([1 - p, p], axis=1)


def test_the_decision_at_a_low_threshold_is_what_is_compared() -> None:
    reference = probabilities([0.22, 0.18, 0.9, 0.05])
    # Small shifts that keep every top-1 label but flip two decisions at 0.2.
    shifted = probabilities([0.18, 0.21, 0.9, 0.05])
    top1, _, error = compare("top1", shifted, reference, normalized=False)
    at_threshold, _, _ = compare("top1", shifted, reference, normalized=False,
                                 decision=Decision(1, 0.2))
    assert top1 == 1.0 and at_threshold == 0.5
    assert abs(error - 0.04) < 1e-6
    # ... and the other way: a flip at 0.5 that the served decision at 0.2 does not see.
    flipped = probabilities([0.22, 0.18, 0.45, 0.05])
    assert compare("top1", flipped, reference, normalized=False)[0] == 0.75
    assert compare("top1", flipped, reference, normalized=False,
                   decision=Decision(1, 0.2))[0] == 1.0


def test_the_report_names_the_decision_it_gated() -> None:
    passed = Parity("int8", "top1", 0.995, 0.995, 0.1, (1, 32), True, threshold=0.2)
    missed = Parity("int8", "top1", 0.98, 0.98, 0.1, (1, 32), False, threshold=0.2)
    assert bounds_met(passed) and not bounds_met(missed)
    assert "agreement of the decision at 0.2 99.50%" in passed.describe()
    assert missed.shortfall().startswith("agreement of the decision at 0.2 0.980000 < 0.99")
    assert "top-1 agreement" in Parity("int8", "top1", 1.0, 1.0, 0.0, (1,), True).describe()
