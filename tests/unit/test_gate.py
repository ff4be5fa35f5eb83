"""The accuracy gate's comparison of a classifier's outputs: by the top-1 label, or by the
decision a pair model is served with at a threshold of its own; and the hard inputs that every
variant must decide exactly as the original does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from queryserve.duplicates.hard_pairs import HARD_PAIRS
from queryserve.errors import ExportError
from queryserve.optimize.gate import (
    Decision,
    HardItem,
    Parity,
    bounds_met,
    compare,
    hard_items,
)


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


NANO_TOUCH = "'apple ipod nano 8gb' / 'apple ipod touch 8gb'"
NANO_SILVER = "'apple ipod nano 8gb silver' / 'apple 8gb ipod nano - silver'"
AT_02 = Decision(1, 0.2)


def gated(hard: tuple[HardItem, ...], agreement: float = 0.9922) -> Parity:
    """A reduced-precision parity of `agreement` (above its 99% bound) with these hard inputs."""
    draft = Parity("int8", "top1", agreement, agreement, 0.18, (1, 32, 64), True, 0.2, hard)
    return replace(draft, passed=bounds_met(draft))


def test_a_variant_that_flips_a_hard_pair_fails_whatever_its_agreement() -> None:
    """The AMD EPYC's int8-smoothquant-fused: 99.22% of the decisions at 0.2 kept, but the nano
    and the touch called one product (0.284 >= 0.2); the original keeps them apart."""
    reference = probabilities([0.12, 0.93])
    variant = [probabilities([0.284, 0.91])] * 3  # batch sizes 1, 32, 64
    hard = hard_items([NANO_TOUCH, NANO_SILVER], variant, reference, AT_02)
    assert [h.flipped for h in hard] == [True, False]
    assert hard[0].original == pytest.approx(0.12) and hard[0].variant == pytest.approx(
        (0.284, 0.284, 0.284))
    parity = gated(hard)
    assert not parity.passed and parity.flipped == (hard[0],)
    shortfall = parity.shortfall()
    assert shortfall.startswith(f"the hard input {NANO_TOUCH} is decided otherwise than by the "
                                "original at 0.2: P 0.120 in the original, 0.284/0.284/0.284")
    assert NANO_SILVER not in shortfall and "agreement" not in shortfall  # that bound was met
    assert "hard inputs 1/2 as the original" in parity.brief()


def test_hard_pairs_decided_as_the_original_pass_though_their_probabilities_move() -> None:
    reference = probabilities([0.12, 0.93])
    variant = [probabilities([0.19, 0.21])] * 3  # far off, but each on the original's side
    hard = hard_items([NANO_TOUCH, NANO_SILVER], variant, reference, AT_02)
    parity = gated(hard)
    assert parity.passed and parity.flipped == () and parity.shortfall() == ""
    assert "hard inputs 2/2 as the original" in parity.describe()
    # Held hard pairs do not lift a variant over the agreement it misses.
    low = gated(hard, agreement=0.98)
    assert not low.passed and low.shortfall().startswith("agreement of the decision at 0.2")


def test_a_flip_at_one_batch_size_is_a_flip() -> None:
    """int8's dynamic scales depend on the batch: alone the pair may keep its decision and
    flip beside the others (or the other way round)."""
    reference = probabilities([0.12, 0.93])
    alone, together = probabilities([0.15, 0.93]), probabilities([0.2, 0.93])  # 0.2 is >= 0.2
    hard = hard_items([NANO_TOUCH, NANO_SILVER], [alone, together, together], reference, AT_02)
    assert [h.flipped for h in hard] == [True, False]
    assert "0.150/0.200/0.200 in this variant at batch sizes 1/32/64" in gated(hard).shortfall()


def test_without_a_decision_the_top1_label_is_held() -> None:
    reference = np.asarray([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=np.float32)
    variant = np.asarray([[0.4, 0.5, 0.1], [0.1, 0.2, 0.7]], dtype=np.float32)
    hard = hard_items(["wake me up at nine", "play jazz"], [variant], reference)
    assert [h.flipped for h in hard] == [True, False]
    # Each is read in the original's top-1 label: 0.7 -> 0.4, 0.6 -> 0.7.
    assert [h.original for h in hard] == pytest.approx([0.7, 0.6])
    assert [h.variant[0] for h in hard] == pytest.approx([0.4, 0.7])
    flip = hard[0].flip((1,), None)
    assert flip.startswith("the hard input wake me up at nine is decided otherwise than by the "
                           "original: P 0.700")


def test_hard_inputs_that_do_not_line_up_are_an_error() -> None:
    reference = probabilities([0.12, 0.93])
    with pytest.raises(ExportError, match="2 hard inputs"):
        hard_items([NANO_TOUCH, NANO_SILVER], [probabilities([0.12])], reference, AT_02)
    with pytest.raises(ExportError, match="1 hard inputs"):
        hard_items([NANO_TOUCH], [reference], reference, AT_02)


def test_the_duplicates_hard_pairs_are_one_list_of_distinct_named_pairs() -> None:
    """What prepare gates on and the end-to-end test asks the served model about."""
    names = [p.name for p in HARD_PAIRS]
    assert names[:2] == [NANO_TOUCH, NANO_SILVER] and len(set(names)) == len(names)
    assert [p.duplicate for p in HARD_PAIRS[:2]] == [False, True]
