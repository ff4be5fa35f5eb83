"""The max-rate search, sweeps and stop conditions, against a fake server model (no clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from queryserve.bench.loadgen import LoadResult
from queryserve.bench.search import (
    StopConditions,
    Trial,
    passes,
    search_max_rate,
    stop_reason,
    sweep,
)


def result(rate: float, p99_ms: float, *, throughput: float | None = None, failures: int = 0,
           mode: str = "open", users: int | None = None) -> LoadResult:
    served = rate if throughput is None else throughput
    scheduled = max(int(rate), 1) if mode == "open" else 100
    return LoadResult(
        url="http://127.0.0.1:1/x", target_rate=rate if mode == "open" else 0.0,
        duration_s=1.0, poisson=False, scheduled=scheduled, sent=scheduled,
        ok=scheduled - failures, by_status={200: scheduled - failures}, errors=failures,
        timeouts=0, throughput=served, percentiles={"p50": p99_ms / 2, "p99": p99_ms},
        send_lag_ms={}, client_cpu_s=0.0, client_cpu_us_per_request=0.0, max_pool=1,
        histogram=None, mode=mode, users=users)


def server_with_capacity(capacity: float, *, flaky: set[int] | None = None
                         ) -> tuple[Callable[[float], Awaitable[LoadResult]], list[float]]:
    """Fast (2 ms) below ``capacity`` req/s, far over the bar above; runs whose index is in
    ``flaky`` stall (p99 500 ms) whatever the rate, like a VM hiccup."""
    asked: list[float] = []

    async def measure(rate: float) -> LoadResult:
        asked.append(rate)
        if len(asked) - 1 in (flaky or set()):
            return result(rate, 500.0)
        return result(rate, 2.0 if rate <= capacity else 80.0,
                      throughput=min(rate, capacity))
    return measure, asked


T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_search_brackets_the_capacity_within_the_precision() -> None:
    measure, asked = server_with_capacity(730)
    rate, res, trials = run(search_max_rate(measure, 10, start_rate=100, max_rate=20_000,
                                            max_probes=20, precision=0.05))
    assert 730 * 0.95 <= rate <= 730
    assert res is not None and res.target_rate == rate
    # ramp 100, 200, 400, 800 (fails), then bisection inside (400, 800)
    assert asked[:8] == [100, 100, 200, 200, 400, 400, 800, 800]
    assert all(t.passed == (t.level <= 730) for t in trials)


def test_one_stalled_run_does_not_decide_a_probe() -> None:
    # the second run (index 1) stalls: the probe at 100 takes a third vote and still passes
    measure, asked = server_with_capacity(730, flaky={1})
    rate, _, trials = run(search_max_rate(measure, 10, start_rate=100, max_probes=20))
    assert asked[:3] == [100, 100, 100]
    assert [t.passed for t in trials[:3]] == [True, False, True]
    assert rate > 600


def test_a_stall_over_a_whole_probe_does_not_cap_the_ramp() -> None:
    # both runs at 200 req/s (indexes 2 and 3) stall: the ramp looks one level past it
    measure, asked = server_with_capacity(730, flaky={2, 3})
    rate, _, trials = run(search_max_rate(measure, 10, start_rate=100, max_probes=20))
    assert asked[:10] == [100, 100, 200, 200, 400, 400, 800, 800, 1600, 1600]
    assert [t.passed for t in trials[2:4]] == [False, False]
    assert 730 * 0.95 <= rate <= 730  # bisected inside (400, 800), the first of two failures


def test_a_real_ceiling_fails_twice_and_is_bisected_below_the_first_failure() -> None:
    measure, asked = server_with_capacity(150)
    rate, _, _ = run(search_max_rate(measure, 10, start_rate=100, max_probes=20))
    assert asked[:6] == [100, 100, 200, 200, 400, 400]
    assert 150 * 0.95 <= rate <= 150 and max(asked[6:]) < 200


def test_a_server_slower_than_the_start_rate_is_found_by_halving() -> None:
    measure, asked = server_with_capacity(30)
    rate, res, _ = run(search_max_rate(measure, 10, start_rate=100, max_probes=20))
    # halve until a probe passes, ramp again (the failed levels fail twice), then bisect
    assert asked[:10] == [100, 100, 50, 50, 25, 25, 50, 50, 100, 100]
    assert 30 * 0.95 <= rate <= 30 and res is not None and passes(res, 10)


def test_a_stall_at_the_start_rate_does_not_send_the_search_down() -> None:
    # both runs at the start rate stall: after halving once, the ramp climbs past it again
    measure, asked = server_with_capacity(730, flaky={0, 1})
    rate, _, _ = run(search_max_rate(measure, 10, start_rate=100, max_probes=20))
    assert asked[:6] == [100, 100, 50, 50, 100, 100]
    assert 730 * 0.95 <= rate <= 730


def test_nothing_passes_returns_zero_and_the_first_failing_result() -> None:
    measure, asked = server_with_capacity(2)
    rate, res, trials = run(search_max_rate(measure, 10, start_rate=100, min_rate=10))
    assert rate == 0 and res is not None and res.target_rate == 100
    assert sorted(set(asked), reverse=True) == [100, 50, 25, 12.5]  # down to min_rate
    assert len(trials) == 8  # two failing votes settle each probe


def test_the_cap_ends_the_ramp() -> None:
    measure, asked = server_with_capacity(1e9)
    rate, _, _ = run(search_max_rate(measure, 10, start_rate=100, max_rate=300))
    assert rate == 300 and max(asked) == 300


def test_passes_needs_the_rate_kept_and_no_failures() -> None:
    assert passes(result(100, 5), 10)
    assert not passes(result(100, 11), 10)
    assert not passes(result(100, 5, throughput=90), 10)  # fell behind the offered rate
    assert not passes(result(100, 5, failures=1), 10)
    assert passes(result(100, 5), 10, percentile="p50")
    assert not passes(result(100, 30), 10, percentile="p50")


def test_search_rejects_nonsense() -> None:
    measure, _ = server_with_capacity(100)
    with pytest.raises(ValueError):
        run(search_max_rate(measure, 10, start_rate=500, max_rate=100))
    with pytest.raises(ValueError):
        run(search_max_rate(measure, 10, start_rate=5, min_rate=10))


def test_stop_on_latency_names_the_step() -> None:
    reason = stop_reason([result(100, 5), result(200, 12)], StopConditions(latency_ms=10))
    assert reason == "p99 12.00 ms > 10 ms at 200 req/s"
    assert stop_reason([result(100, 5)], StopConditions(latency_ms=10)) is None


def test_stop_on_invocations_per_minute_counts_items() -> None:
    cap = StopConditions(max_invocations_per_minute=60_000)
    assert stop_reason([result(500, 5)], cap) is None  # 30,000/min
    assert stop_reason([result(500, 5)], cap, items_per_request=2) is not None  # 60,000/min


def test_stop_when_throughput_flattens() -> None:
    flat = StopConditions(flat_ratio=0.05)
    growing = [result(100, 5), result(200, 5)]
    assert stop_reason(growing, flat) is None
    saturated = [result(400, 5, throughput=400), result(800, 5, throughput=410)]
    assert "flattened" in (stop_reason(saturated, flat) or "")


def test_closed_loop_steps_are_named_by_users() -> None:
    reason = stop_reason([result(0, 50, mode="closed", users=8)], StopConditions(latency_ms=10))
    assert reason is not None and reason.endswith("at 8 users")


def test_sweep_runs_levels_in_order_until_a_stop() -> None:
    measure, asked = server_with_capacity(300)
    seen: list[Trial] = []
    trials, reason = run(sweep([100, 200, 400, 800], measure,
                               StopConditions(latency_ms=10), on_trial=seen.append))
    assert asked == [100, 200, 400] and seen == trials
    assert [t.passed for t in trials] == [True, True, False]
    assert reason is not None and "400 req/s" in reason


def test_sweep_without_stop_conditions_runs_every_level() -> None:
    measure, asked = server_with_capacity(300)
    trials, reason = run(sweep([100, 400], measure, StopConditions()))
    assert asked == [100, 400] and reason is None
    assert all(t.passed is None for t in trials)
