"""The learning-rate schedule the MiniLM trainers share: over steps, or over a time budget."""

from __future__ import annotations

from itertools import pairwise

import pytest

torch = pytest.importorskip("torch")

from queryserve.training import warmup_then_linear  # noqa: E402


def factors(total: int, warmup_share: float, steps: int,
            spent: list[float] | None = None) -> list[float]:
    """The schedule's factor of the peak rate at steps 0..steps-1; `spent[i]` is the share of
    the time budget used when step i runs."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    now = [0.0]
    schedule = warmup_then_linear(optimizer, total, warmup_share,
                                  (lambda: now[0]) if spent is not None else None)
    out = []
    for step in range(steps):
        if spent is not None:
            now[0] = spent[step]
        out.append(schedule.lr_lambdas[0](step))
    return out


def test_steps_alone_warm_up_then_decay_to_zero() -> None:
    lr = factors(total=100, warmup_share=0.1, steps=100)
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert max(lr) == pytest.approx(1.0) and lr[55] == pytest.approx(0.5)
    assert lr[99] == pytest.approx(1 / 90)
    assert all(a >= b - 1e-12 for a, b in pairwise(lr[9:]))


def test_a_time_budget_ends_the_decay_however_few_steps_fit() -> None:
    """A run of 1,000 planned steps whose budget runs out after 100: the rate still reaches
    zero, where steps alone would leave it near its peak."""
    spent = [(i + 1) / 100 for i in range(100)]
    lr = factors(total=1000, warmup_share=0.01, steps=100, spent=spent)
    assert lr[-1] == 0.0 and lr[49] == pytest.approx((1 - 0.5) / 0.99)
    assert factors(total=1000, warmup_share=0.01, steps=100)[-1] > 0.9
    # The warm-up follows the budget too: a tenth of it, not a tenth of the planned steps.
    assert factors(1000, 0.1, 10, spent)[9] == pytest.approx(1.0)
    # And time never slows the decay: where steps are further on, they rule.
    assert factors(20, 0.1, 20, [0.0] * 20) == pytest.approx(factors(20, 0.1, 20))
