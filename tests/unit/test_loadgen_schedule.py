"""The open-loop schedule and the latency histogram maths, with a fake clock and no sockets."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from typing import Any

import pytest

from queryserve.bench.loadgen.open_loop import _Run
from queryserve.bench.loadgen.recorder import _histogram_us, _percentiles_ms, _timeline
from queryserve.bench.loadgen.requests import parse_target

MS = 1_000_000  # nanoseconds


class FakeLoop:
    """Records timers instead of running them; the test fires them at chosen times."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.timers.append((delay_s, callback))


def make_run(rate: float, *, poisson: bool = False) -> tuple[_Run, FakeLoop, list[int]]:
    now = [0]

    async def build() -> _Run:
        # No connection may be opened (max_connections=0): every request waits in `pending`
        # with its clock start, measured flag and scheduled time, which is what we check.
        return _Run(parse_target("http://127.0.0.1:1/x"), [b"x"], rate, poisson, 3, 0,
                    clock=lambda: now[0])

    run = asyncio.run(build())
    loop = FakeLoop()
    run.loop = loop  # type: ignore[assignment]
    return run, loop, now


def fire(loop: FakeLoop, now: list[int], at_ns: int) -> None:
    _, callback = loop.timers.pop()
    now[0] = at_ns
    callback()


def test_requests_are_due_at_fixed_intervals_and_timed_from_the_schedule() -> None:
    run, loop, now = make_run(1000)  # one request per ms
    run.start(warmup_s=0.002, duration_s=0.010)
    # At t=0 the generator sends everything due within its 2 ms slack: 0, 1 and 2 ms.
    assert [sched for _, _, sched in run.pending] == [0, 1 * MS, 2 * MS]
    # It asks to wake 1 ms before the next due time (3 ms).
    assert loop.timers[-1][0] == pytest.approx(0.002)
    fire(loop, now, 5 * MS)  # woken 3 ms late, as a stalled VM would
    sched = [s for _, _, s in run.pending]
    assert sched[3:] == [3 * MS, 4 * MS, 5 * MS, 6 * MS, 7 * MS]
    starts = {s: start for start, _, s in run.pending}
    # Late ones keep their scheduled time as the clock start (the stall is charged to them);
    # early ones (within the slack) start their clock at the real send.
    assert starts[3 * MS] == 3 * MS and starts[4 * MS] == 4 * MS
    assert starts[6 * MS] == 5 * MS and starts[7 * MS] == 5 * MS
    # Only requests scheduled after the warm-up are measured.
    assert {s: m for _, m, s in run.pending}[1 * MS] is False
    assert {s: m for _, m, s in run.pending}[2 * MS] is True


def test_the_window_holds_exactly_rate_times_duration() -> None:
    run, loop, now = make_run(1000)
    run.start(warmup_s=0.002, duration_s=0.010)
    while loop.timers:
        delay, _ = loop.timers[-1]
        fire(loop, now, now[0] + int(delay * 1e9) + MS // 2)  # a little late each time
    assert run.scheduled == 10  # requests at 2 .. 11 ms
    assert len(run.pending) == 12 and not run.scheduling


def test_poisson_intervals_average_to_the_rate() -> None:
    run, loop, now = make_run(2000, poisson=True)
    run.start(warmup_s=0.0, duration_s=5.0)
    while loop.timers:
        delay, _ = loop.timers[-1]
        fire(loop, now, now[0] + int(delay * 1e9))
    # 10,000 expected; the Poisson count's sd is 100, so +-500 is 5 sd.
    assert 9_500 <= run.scheduled <= 10_500
    gaps = [b - a for (_, _, a), (_, _, b) in zip(run.pending, list(run.pending)[1:],
                                                  strict=False)]
    assert max(gaps) > 3 * min(gaps)  # not a constant schedule


def test_histogram_percentiles_of_a_known_distribution() -> None:
    # 1 .. 10,000 microseconds, once each: p50 = 5 ms, p99 = 9.9 ms, max 10 ms.
    samples = array("q", (us * 1000 for us in range(1, 10_001)))
    pct = _percentiles_ms(_histogram_us(samples))
    assert pct["p50"] == pytest.approx(5.0, rel=1e-3)
    assert pct["p90"] == pytest.approx(9.0, rel=1e-3)
    assert pct["p99"] == pytest.approx(9.9, rel=1e-3)
    assert pct["p99.9"] == pytest.approx(9.99, rel=1e-3)
    assert pct["max"] == pytest.approx(10.0, rel=1e-3)


def test_histogram_keeps_a_rare_stall_in_the_tail() -> None:
    # 9,990 fast answers and 10 stalled for 2 s: p99 is fast, p99.9 sees the stall.
    samples = array("q", [2 * MS] * 9_990 + [2_000 * MS] * 10)
    pct = _percentiles_ms(_histogram_us(samples))
    assert pct["p99"] == pytest.approx(2.0, rel=1e-3)
    assert pct["p99.9"] == pytest.approx(2.0, rel=1e-3)
    assert pct["max"] == pytest.approx(2000.0, rel=1e-3)
    assert _percentiles_ms(_histogram_us(array("q"))) == {}


def test_timeline_bins_answers_and_failures_by_second() -> None:
    latency = array("q", [1 * MS, 3 * MS, 5 * MS])
    ok_end = array("q", [100 * MS, 1_500 * MS, 1_600 * MS])
    fail_end = array("q", [-5 * MS, 2_100 * MS])  # an early send lands in second 0
    buckets: list[dict[str, Any]] = _timeline(latency, ok_end, fail_end, 0, 2_000 * MS)
    assert [(b["t_s"], b["ok"], b["errors"]) for b in buckets] == [
        (0.0, 1, 1), (1.0, 2, 0), (2.0, 0, 1)]
    assert buckets[1]["p50_ms"] == pytest.approx(4.0) and buckets[2]["p50_ms"] is None
