"""What a fault scenario's client recorded of each request (`Records`, one entry per scheduled
request, filled by `faults.client`), and its summary over a window of time (`summarize`)."""

from __future__ import annotations

import math
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CONNECT_FAILED, CONNECTION_LOST, UNANSWERED = 1, 2, 3
ERRORS = {CONNECT_FAILED: "connect failed", CONNECTION_LOST: "connection lost",
          UNANSWERED: "unanswered"}



@dataclass
class Records:
    """One entry per scheduled request: when it was due, written and answered (monotonic s;
    NaN for never), its status (0: none), whether it carried Retry-After, and its error."""

    scheduled: array[float] = field(default_factory=lambda: array("d"))
    written: array[float] = field(default_factory=lambda: array("d"))
    done: array[float] = field(default_factory=lambda: array("d"))
    status: array[int] = field(default_factory=lambda: array("i"))
    retry_after: array[int] = field(default_factory=lambda: array("b"))
    error: array[int] = field(default_factory=lambda: array("b"))
    connects: array[float] = field(default_factory=lambda: array("d"))  # each connection made

    def add(self, due: float) -> int:
        self.scheduled.append(due)
        self.written.append(math.nan)
        self.done.append(math.nan)
        self.status.append(0)
        self.retry_after.append(0)
        self.error.append(0)
        return len(self.scheduled) - 1

    def finish(self, i: int, status: int, retry_after: bool) -> None:
        self.done[i], self.status[i], self.retry_after[i] = time.monotonic(), status, retry_after

    def fail(self, i: int, error: int) -> None:
        self.done[i], self.error[i] = time.monotonic(), error


def summarize(records: Records, start: float = -math.inf, end: float = math.inf,
              by: str = "scheduled", others: bool = False) -> dict[str, Any]:
    """The requests whose `by` time (scheduled, written or done) falls in [start, end), or
    with `by="in flight"` those scheduled before `end` and not done before `start`; with
    `others`, every request but those. How many, their outcomes, 503s without Retry-After,
    and the latency of the 200s (ms, from the scheduled send time)."""
    if by == "in flight":
        done = np.frombuffer(records.done, dtype=np.float64)
        chosen = (np.frombuffer(records.scheduled, dtype=np.float64) < end) & ~(done < start)
    else:
        when = np.frombuffer(getattr(records, by), dtype=np.float64)
        chosen = (when >= start) & (when < end)  # NaN (never written) is in no window
    if others:
        chosen = ~chosen
    status = np.frombuffer(records.status, dtype=np.int32)[chosen]
    error = np.frombuffer(records.error, dtype=np.int8)[chosen]
    retry = np.frombuffer(records.retry_after, dtype=np.int8)[chosen]
    scheduled = np.frombuffer(records.scheduled, dtype=np.float64)[chosen]
    latency = (np.frombuffer(records.done, dtype=np.float64)[chosen] - scheduled) * 1000
    lag = (np.frombuffer(records.written, dtype=np.float64)[chosen] - scheduled) * 1000
    lag = lag[~np.isnan(lag)]
    outcomes: Counter[str] = Counter(str(s) for s in status[status > 0].tolist())
    outcomes.update(ERRORS[e] for e in error[error > 0].tolist())
    ok = latency[status == 200]
    return {
        "requests": int(chosen.sum()),
        "outcomes": dict(sorted(outcomes.items())),
        "non_200": int(chosen.sum() - (status == 200).sum()),
        "503_without_retry_after": int(((status == 503) & (retry == 0)).sum()),
        "p50_ms": round(float(np.percentile(ok, 50)), 2) if ok.size else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok.size else None,
        "max_ms": round(float(ok.max()), 2) if ok.size else None,
        # Written this late after their scheduled time (waiting for a free connection, or a
        # client that cannot keep up): the p99.
        "send_lag_p99_ms": round(float(np.percentile(lag, 99)), 2) if lag.size else None,
        "connections_opened": sum(start <= t < end for t in records.connects),
    }
