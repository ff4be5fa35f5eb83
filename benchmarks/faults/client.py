"""An open-loop HTTP/1.1 client that keeps a record of every request, and `Background`, a child
process that runs such clients while a scenario injects its faults.

Why not `queryserve.bench.loadgen`: its LoadResult folds requests into histograms and counts;
a fault scenario needs each request's own record (when it was written, its status, whether a
503 carried Retry-After) to tell the requests sent before a signal from those sent after, and
to judge latency phase by phase. The wire work is the loadgen's: requests encoded before the
run, one write each, httptools parsing, one request per connection at a time, the pool growing
on demand, latency from the scheduled send time (open loop: a stalled server is charged for
the wait). Times are `time.monotonic()`, the same clock in every process of the machine.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import time
import traceback
from array import array
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import numpy as np
import uvloop

CONNECT_FAILED, CONNECTION_LOST, UNANSWERED = 1, 2, 3
ERRORS = {CONNECT_FAILED: "connect failed", CONNECTION_LOST: "connection lost",
          UNANSWERED: "unanswered"}


@dataclass(frozen=True)
class Stream:
    """Requests to one path at a constant rate, cycling through `bodies`."""

    path: str
    bodies: list[bytes]
    rate: float
    connections: int = 4  # opened before the first request
    max_connections: int = 512


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


class _Conn(asyncio.Protocol):
    def __init__(self, run: OpenLoop) -> None:
        self.run = run
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.index = -1  # the request in flight
        self.retry_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.run.connected(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def on_message_begin(self) -> None:
        self.retry_after = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after" and value.strip():
            self.retry_after = True

    def on_message_complete(self) -> None:
        self.run.answered(self, self.parser.get_status_code(), self.retry_after,
                          self.parser.should_keep_alive())

    def connection_lost(self, exc: Exception | None) -> None:
        self.run.lost(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class OpenLoop:
    """One stream's run: `connect()` opens the first connections, `run()` sends on schedule
    until its duration or `stop()`, then waits up to `drain_s` for the answers."""

    def __init__(self, url: str, stream: Stream) -> None:
        parts = urlsplit(url)
        if parts.hostname != "127.0.0.1":
            raise ValueError(f"fault scenarios target 127.0.0.1 only, not {parts.hostname}")
        self.host, self.port, self.stream = parts.hostname, parts.port or 80, stream
        self.requests = [
            (f"POST {stream.path} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
             f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
             ).encode() + body for body in stream.bodies]
        self.records = Records()
        self.idle: list[_Conn] = []
        self.conns: set[_Conn] = set()
        self.connecting = 0
        self.waiting: deque[int] = deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.stream.connections):
            await loop.create_connection(lambda: _Conn(self), self.host, self.port)

    async def run(self, duration_s: float, stop: Callable[[], bool] | None = None,
                  drain_s: float = 5.0) -> Records:
        start, interval, k = time.monotonic(), 1 / self.stream.rate, 0
        while True:
            now = time.monotonic()
            if now - start >= duration_s or (stop is not None and stop()):
                break
            due = start + k * interval
            while due <= now + 0.0005:
                self._dispatch(self.records.add(due))
                k += 1
                due = start + k * interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        deadline = time.monotonic() + drain_s
        while (self.waiting or any(c.index >= 0 for c in self.conns)) and \
                time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.closed = True
        for i in self.waiting:
            self.records.fail(i, UNANSWERED)
        for conn in list(self.conns):
            if conn.index >= 0:
                self.records.fail(conn.index, UNANSWERED)
            conn.close()
        return self.records

    def _dispatch(self, i: int) -> None:
        if self.idle:
            self._send(self.idle.pop(), i)
        else:
            self.waiting.append(i)
            self._grow()

    def _grow(self) -> None:
        if len(self.waiting) > self.connecting and \
                len(self.conns) + self.connecting < self.stream.max_connections:
            self.connecting += 1
            task = asyncio.get_running_loop().create_task(self._open())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _open(self) -> None:
        try:
            await asyncio.get_running_loop().create_connection(
                lambda: _Conn(self), self.host, self.port)
        except OSError:
            if self.waiting and not self.closed:
                self.records.fail(self.waiting.popleft(), CONNECT_FAILED)
        finally:
            self.connecting -= 1

    def connected(self, conn: _Conn) -> None:
        if self.closed:
            conn.close()
            return
        self.records.connects.append(time.monotonic())
        self.conns.add(conn)
        self._next(conn)

    def _next(self, conn: _Conn) -> None:
        if self.waiting:
            self._send(conn, self.waiting.popleft())
        else:
            self.idle.append(conn)

    def _send(self, conn: _Conn, i: int) -> None:
        assert conn.transport is not None
        conn.index = i
        self.records.written[i] = time.monotonic()
        conn.transport.write(self.requests[i % len(self.requests)])

    def answered(self, conn: _Conn, status: int, retry_after: bool, keep_alive: bool) -> None:
        i, conn.index = conn.index, -1
        if i < 0:
            return  # nothing asked (a refusal written at accept): the next request gets it
        self.records.finish(i, status, retry_after)
        transport = conn.transport
        if keep_alive and not self.closed and transport is not None \
                and not transport.is_closing():
            self._next(conn)
        else:
            conn.close()

    def lost(self, conn: _Conn) -> None:
        self.conns.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        if self.closed:
            return
        if conn.index >= 0:
            self.records.fail(conn.index, CONNECTION_LOST)
            conn.index = -1
        self._grow()


# -- the load in a process of its own ---------------------------------------------------------


def _child(url: str, streams: list[Stream], max_s: float, drain_s: float,
           stop: Any, pipe: Connection) -> None:
    async def main() -> list[Records]:
        runs = [OpenLoop(url, s) for s in streams]
        for run in runs:
            await run.connect()
        pipe.send("ready")
        return list(await asyncio.gather(*(r.run(max_s, stop.is_set, drain_s) for r in runs)))

    try:
        pipe.send(uvloop.run(main()))
    except BaseException:
        pipe.send(traceback.format_exc())


class Background:
    """`streams` sent by a child process (so that a scenario's own work never delays them)
    from `__enter__` until `stop()` or `max_s`; `stop()` returns each stream's records. The
    child is killed on leaving the block, whatever happened."""

    def __init__(self, url: str, *streams: Stream, max_s: float = 900.0,
                 drain_s: float = 5.0) -> None:
        self.url, self.streams, self.max_s, self.drain_s = url, list(streams), max_s, drain_s
        self.started = 0.0

    def __enter__(self) -> Background:
        context = multiprocessing.get_context("spawn")
        self.stop_event = context.Event()
        self.pipe, child_end = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_child, daemon=True,
            args=(self.url, self.streams, self.max_s, self.drain_s, self.stop_event, child_end))
        self.process.start()
        child_end.close()
        message = self.pipe.recv() if self.pipe.poll(60) else "the load client did not start"
        if message != "ready":
            self.__exit__()
            raise RuntimeError(f"load client: {message}")
        self.started = time.monotonic()
        return self

    def stop(self) -> list[Records]:
        """End the streams now; their records."""
        self.stop_event.set()
        return self.result()

    def result(self) -> list[Records]:
        """The streams' records once they have run (at most `max_s` after the start)."""
        left_s = max(0.0, self.started + self.max_s - time.monotonic())
        if not self.pipe.poll(left_s + self.drain_s + 30):
            raise RuntimeError("the load client did not report within its time")
        result = self.pipe.recv()
        if isinstance(result, str):
            raise RuntimeError(f"load client failed:\n{result}")
        self.process.join(timeout=10)
        return cast(list[Records], result)

    def __exit__(self, *exc: object) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
