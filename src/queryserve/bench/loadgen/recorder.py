"""What a run records (the counters both loops share), the HDR histograms and per-second
timeline folded from it afterwards, and the LoadResult that reports it.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

from queryserve.bench.loadgen.connection import Connection

_NS = 1_000_000_000
# HDR range in microseconds: 1 us .. 60 s, 3 significant digits.
_HDR_LOWEST_US = 1
_HDR_HIGHEST_US = 60_000_000
_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


@dataclass(frozen=True)
class LoadResult:
    """Outcome of one open-loop run; counts cover the measured window only.

    ``percentiles`` (milliseconds) are over 2xx responses to requests
    *scheduled* in the measured window, timed from their scheduled send time.
    ``throughput`` is 2xx responses *completed* inside the window per second,
    so a server that falls behind shows throughput below ``target_rate``.
    """

    url: str
    target_rate: float
    duration_s: float
    poisson: bool
    scheduled: int
    sent: int
    ok: int
    by_status: dict[int, int]
    errors: int
    timeouts: int
    throughput: float
    percentiles: dict[str, float]
    send_lag_ms: dict[str, float]
    client_cpu_s: float
    client_cpu_us_per_request: float
    max_pool: int
    histogram: Any = field(repr=False, compare=False)
    mode: str = "open"  # "open": target_rate is kept; "closed": `users` send back to back
    users: int | None = None  # closed loop: users at the end of the run
    wall_s: float = 0.0  # warmup + measured window + drain, for the client's CPU share
    timeline: list[dict[str, Any]] = field(default_factory=list, repr=False, compare=False)

    @property
    def client_cpu_share(self) -> float:
        """The generator's CPU time over the run's wall time: near 1.0, it was the bottleneck."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def failures(self) -> int:
        """Requests that did not get a 2xx: other statuses, errors, timeouts."""
        return self.scheduled - self.ok

    def count_at_or_above(self, ms: float) -> int:
        """How many recorded latencies were >= ``ms`` (HDR precision)."""
        threshold_us = ms * 1000.0
        return sum(
            int(item.count_added_in_this_iter_step)
            for item in self.histogram.get_recorded_iterator()
            if item.value_iterated_to >= threshold_us
        )


class _Recorder:
    """Counters of one run's measured window, shared by the open and closed loops.

    Samples go into flat ``array``s during the run (an append costs nanoseconds);
    histograms and the per-second timeline are built afterwards.
    """

    def __init__(self) -> None:
        self.warm_end_ns = 0
        self.end_ns = 0
        self.scheduled = 0
        self.sent = 0
        self.total_sent = 0
        self.by_status: dict[int, int] = {}
        self.errors = 0
        self.ok_in_window = 0
        self.latency_ns = array("q")
        self.ok_end_ns = array("q")  # completion time of each latency_ns sample
        self.fail_end_ns = array("q")  # when each non-2xx answer or error happened
        self.send_lag_ns = array("q")
        self.max_pool = 0  # the most connections open at once

    def record(self, conn: Connection, status: int, end_ns: int) -> None:
        ok = 200 <= status < 300
        if ok and self.warm_end_ns <= end_ns <= self.end_ns:
            self.ok_in_window += 1
        if conn.measured:
            self.by_status[status] = self.by_status.get(status, 0) + 1
            if ok:
                self.latency_ns.append(end_ns - conn.start_ns)
                self.ok_end_ns.append(end_ns)
            else:
                self.fail_end_ns.append(end_ns)

    def record_error(self) -> None:
        self.errors += 1
        self.fail_end_ns.append(time.perf_counter_ns())

    def timeline(self) -> list[dict[str, Any]]:
        """One entry per second of the measured window: answers, failures, p50 and p99."""
        return _timeline(self.latency_ns, self.ok_end_ns, self.fail_end_ns, self.warm_end_ns,
                         self.end_ns)


def _histogram_us(samples_ns: array[int]) -> Any:
    """Fold nanosecond samples into an HDR histogram of microseconds."""
    hist = HdrHistogram(_HDR_LOWEST_US, _HDR_HIGHEST_US, 3)
    if samples_ns:
        us = np.frombuffer(samples_ns, dtype=np.int64) // 1000
        us = np.clip(us, _HDR_LOWEST_US, _HDR_HIGHEST_US)
        values, counts = np.unique(us, return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            hist.record_value(value, count)
    return hist


def _percentiles_ms(hist: Any) -> dict[str, float]:
    if hist.get_total_count() == 0:
        return {}
    out = {f"p{p:g}": hist.get_value_at_percentile(p) / 1000.0 for p in _PERCENTILES}
    out["max"] = hist.get_max_value() / 1000.0
    return out


def _timeline(latency_ns: array[int], ok_end_ns: array[int], fail_end_ns: array[int],
              start_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """Per-second buckets of the measured window, by completion time.

    Answers that complete during the drain after the window land in the last bucket(s),
    so a server that falls behind shows its backlog at the end rather than losing it.
    """
    if end_ns <= start_ns:
        return []
    lat = np.frombuffer(latency_ns, dtype=np.int64) / 1e6
    # A request scheduled just inside the window may be sent (and answered) a little early
    # (see open_loop._SLACK_NS): it belongs to the first second, not before it.
    ok_t = np.maximum((np.frombuffer(ok_end_ns, dtype=np.int64) - start_ns) // _NS, 0)
    fail_t = np.maximum((np.frombuffer(fail_end_ns, dtype=np.int64) - start_ns) // _NS, 0)
    seconds = max(int(np.ceil((end_ns - start_ns) / _NS)),
                  int(ok_t.max()) + 1 if ok_t.size else 0,
                  int(fail_t.max()) + 1 if fail_t.size else 0)
    out = []
    for sec in range(seconds):
        in_sec = lat[ok_t == sec]
        out.append({
            "t_s": float(sec),
            "ok": int(in_sec.size),
            "errors": int(np.count_nonzero(fail_t == sec)),
            "p50_ms": round(float(np.percentile(in_sec, 50)), 3) if in_sec.size else None,
            "p99_ms": round(float(np.percentile(in_sec, 99)), 3) if in_sec.size else None,
        })
    return out


def _result(
    run: _Recorder,
    url: str,
    rate: float,
    duration_s: float,
    poisson: bool,
    cpu: float,
    timeouts: int,
    wall: float,
    users: int | None = None,
) -> LoadResult:
    """The run's LoadResult; `users` is given by the closed loop (its users at the end)."""
    hist = _histogram_us(run.latency_ns)
    return LoadResult(
        url=url,
        target_rate=rate,
        duration_s=duration_s,
        poisson=poisson,
        scheduled=run.scheduled,
        sent=run.sent,
        ok=sum(v for k, v in run.by_status.items() if 200 <= k < 300),
        by_status=dict(run.by_status),
        errors=run.errors,
        timeouts=timeouts,
        throughput=run.ok_in_window / duration_s,
        percentiles=_percentiles_ms(hist),
        send_lag_ms=_percentiles_ms(_histogram_us(run.send_lag_ns)),
        client_cpu_s=cpu,
        client_cpu_us_per_request=cpu / max(run.total_sent, 1) * 1e6,
        max_pool=run.max_pool,
        histogram=hist,
        mode="open" if users is None else "closed",
        users=users,
        wall_s=wall,
        timeline=run.timeline(),
    )
