"""A corrector's accuracy at a false-correction rate: the upper envelope of its threshold
curve, interpolated, and nothing under the lowest rate it reaches."""

from __future__ import annotations

import pytest

from queryserve.spell.curves import Curve, Point


def curve(*points: tuple[float, float]) -> Curve:
    """(false corrections, hard-set accuracy) at thresholds 0, 0.1, ...: every threshold
    higher than the one before, so fewer queries change."""
    return Curve("c", tuple(Point(i / 10, fc, hard, 0.0, 0.0)
                            for i, (fc, hard) in enumerate(points)))


def test_accuracy_between_two_thresholds_is_interpolated() -> None:
    c = curve((0.04, 0.70), (0.02, 0.60), (0.01, 0.50))
    assert c.at(0.01, "hard") == pytest.approx(0.50)
    assert c.at(0.015, "hard") == pytest.approx(0.55)
    assert c.at(0.03, "hard") == pytest.approx(0.65)


def test_under_the_lowest_rate_there_is_no_answer_and_past_the_highest_no_gain() -> None:
    c = curve((0.04, 0.70), (0.02, 0.60))
    assert c.at(0.01, "hard") is None
    assert c.at(0.10, "hard") == pytest.approx(0.70)  # no threshold changes more than none


def test_a_worse_threshold_does_not_lower_the_envelope() -> None:
    """A threshold with more false corrections and less accuracy than another is never the
    one to choose: the envelope keeps the better one's accuracy."""
    c = curve((0.03, 0.50), (0.02, 0.60), (0.01, 0.40))
    assert c.at(0.03, "hard") == pytest.approx(0.60)
    assert c.at(0.025, "hard") == pytest.approx(0.60)
    # Two thresholds at one rate: the better accuracy counts.
    assert curve((0.02, 0.55), (0.02, 0.60)).at(0.02, "hard") == pytest.approx(0.60)
