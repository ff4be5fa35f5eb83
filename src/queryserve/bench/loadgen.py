"""Open-loop HTTP/1.1 load generator (wrk2 style) for loopback servers.

Why open loop: a closed-loop client (send, wait, send again) slows down when
the server slows down, so a stall delays the *next* requests instead of being
charged to them and the tail disappears ("coordinated omission"). Here every
request has a scheduled send time fixed in advance (constant rate or Poisson
arrivals) and its latency is measured from that scheduled time, so time spent
waiting for a free connection or behind a stalled server is counted.

Why raw asyncio Protocols on uvloop: the generator shares the machine's cores
with the server under test, so it must cost only a few microseconds of CPU per
request. Requests are pre-encoded bytes written with one ``transport.write``,
responses are parsed by httptools (C), and latencies are appended to an
``array`` during the run and folded into an HDR histogram afterwards.

The module also carries a tiny "answer at once" server (``serve_instant``) used
to measure the generator's own ceiling and by the tests (it can delay, stall,
reject or drop requests on demand).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import urlsplit

import httptools
import numpy as np
import uvloop
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

T = TypeVar("T")

_NS = 1_000_000_000
# uvloop timers have millisecond resolution and fire up to ~1-2 ms early or
# late (measured on this VM). We ask to be woken _WAKE_LEAD_NS before the next
# due time and then send every request due within _SLACK_NS. A request sent
# early has its clock started at the actual send, a late one at its scheduled
# time, so neither case under-reports latency. The price: requests leave in
# small bursts (those due within ~1 ms of each other go together, like wrk2's
# 1 ms timer), and each wake-up is shared by several requests, which matters
# because a sleep/wake cycle costs tens of microseconds of CPU on this VM.
_WAKE_LEAD_NS = 1_000_000
_SLACK_NS = 2_000_000
# HDR range in microseconds: 1 us .. 60 s, 3 significant digits.
_HDR_LOWEST_US = 1
_HDR_HIGHEST_US = 60_000_000
_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


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


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str


def _parse_url(url: str) -> _Target:
    """Split ``http://127.0.0.1:PORT/path``; only loopback targets are allowed."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"need an http:// URL, got {url!r}")
    # Load tests here must never leave the machine.
    if parts.hostname not in _LOOPBACK:
        raise ValueError(f"load generator only targets loopback, got {parts.hostname!r}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(parts.hostname, parts.port or 80, path)


def build_requests(
    target: _Target,
    bodies: Sequence[bytes],
    headers: dict[str, str] | None,
    content_type: str = "application/json",
    body_headers: Sequence[dict[str, str]] | None = None,
) -> list[bytes]:
    """Pre-encode complete HTTP/1.1 POST requests so sending is one write.

    ``headers`` go on every request; ``body_headers[i]`` only on body ``i`` (the KServe
    binary extension's header length differs per body).
    """
    if not bodies:
        raise ValueError("need at least one request body")
    if body_headers is not None and len(body_headers) != len(bodies):
        raise ValueError("body_headers needs one entry per body")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    host = f"{target.host}:{target.port}"
    out = []
    for i, body in enumerate(bodies):
        own = "".join(f"{k}: {v}\r\n" for k, v in body_headers[i].items()) if body_headers else ""
        head = (
            f"POST {target.path} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}{own}\r\n"
        )
        out.append(head.encode("latin-1") + body)
    return out


class _Driver(Protocol):
    """What a connection reports to: the open-loop `_Run` or the closed-loop `_ClosedRun`."""

    def on_connected(self, conn: _Conn) -> None: ...
    def on_response(self, conn: _Conn, status: int, end_ns: int) -> None: ...
    def on_lost(self, conn: _Conn) -> None: ...


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying at most one request at a time."""

    def __init__(self, run: _Driver) -> None:
        self.run = run
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.start_ns = 0
        self.measured = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; cast only.
        self.transport = cast(asyncio.Transport, transport)
        self.run.on_connected(self)

    def send(self, start_ns: int, measured: bool, request: bytes) -> None:
        assert self.transport is not None
        self.busy = True
        self.start_ns = start_ns
        self.measured = measured
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            # A garbled response makes the stream unusable: drop it; the
            # in-flight request is counted as an error by connection_lost.
            self.close()

    # httptools callback: one full response has arrived.
    def on_message_complete(self) -> None:
        end_ns = time.perf_counter_ns()
        self.busy = False
        self.run.on_response(self, self.parser.get_status_code(), end_ns)
        if not self.parser.should_keep_alive():
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.run.on_lost(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


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

    def record(self, conn: _Conn, status: int, end_ns: int) -> None:
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


class _Run(_Recorder):
    """State of one open-loop run: schedule, connection pool and counters."""

    def __init__(
        self,
        target: _Target,
        requests: list[bytes],
        rate: float,
        poisson: bool,
        seed: int | None,
        max_connections: int,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.clock = clock  # nanoseconds; a fake one in the schedule's unit tests
        self.target = target
        self.requests = requests
        self.next_request = 0
        self.interval_ns = _NS / rate
        self.rate = rate
        self.poisson = poisson
        self.rng = random.Random(seed)
        self.max_connections = max_connections
        super().__init__()
        # Pool: idle connections (LIFO keeps the hot ones busy), all live ones,
        # and connects in progress. Requests that found no idle connection wait
        # in `pending` as (clock start, measured, scheduled time).
        self.idle: list[_Conn] = []
        self.conns: set[_Conn] = set()
        self.connecting = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending: deque[tuple[int, bool, int]] = deque()
        self.max_pool = 0
        # Schedule, fixed at start().
        self.t0_ns = 0
        self.k = 0
        self.next_ns = 0
        self.scheduling = False
        self.closed = False
        self.drained: asyncio.Future[None] = self.loop.create_future()

    # -- connections -------------------------------------------------------

    async def open(self) -> None:
        """Open one connection (``connecting`` was already counted for it)."""
        try:
            await self.loop.create_connection(
                lambda: _Conn(self), self.target.host, self.target.port
            )
        except OSError:
            self._fail_one_pending()
        finally:
            self.connecting -= 1

    def _fail_one_pending(self) -> None:
        # The connect was made on behalf of a waiting request: that request
        # fails, so a dead server shows up as one error per scheduled request.
        if self.pending:
            _, measured, _ = self.pending.popleft()
            if measured:
                self.record_error()
        self._check_drained()

    def on_connected(self, conn: _Conn) -> None:
        if self.closed:
            conn.close()  # a late connect finishing after the run ended
            return
        self.conns.add(conn)
        self.max_pool = max(self.max_pool, len(self.conns))
        self._give_work(conn, self.clock())

    def on_lost(self, conn: _Conn) -> None:
        if self.closed:
            return  # our own shutdown; unfinished requests were counted
        self.conns.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.busy:
            conn.busy = False
            if conn.measured:
                self.record_error()
        self._maybe_grow()
        self._check_drained()

    def _maybe_grow(self) -> None:
        # Open one more connection only for waiters no connect will serve yet.
        if len(self.pending) > self.connecting and (
            len(self.conns) + self.connecting < self.max_connections
        ):
            # Count it now, not when the task starts: several requests may
            # arrive in this same tick and must not each start a connect.
            self.connecting += 1
            task = self.loop.create_task(self.open())
            # The loop holds tasks weakly: keep a reference until done.
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _give_work(self, conn: _Conn, now_ns: int) -> None:
        if self.pending:
            start_ns, measured, sched_ns = self.pending.popleft()
            self._send(conn, start_ns, measured, sched_ns, now_ns)
        else:
            self.idle.append(conn)

    def _send(self, conn: _Conn, start_ns: int, measured: bool, sched_ns: int, now_ns: int) -> None:
        request = self.requests[self.next_request]
        self.next_request = (self.next_request + 1) % len(self.requests)
        self.total_sent += 1
        if measured:
            self.sent += 1
            self.send_lag_ns.append(now_ns - sched_ns if now_ns > sched_ns else 0)
        conn.send(start_ns, measured, request)

    # -- responses ---------------------------------------------------------

    def on_response(self, conn: _Conn, status: int, end_ns: int) -> None:
        self.record(conn, status, end_ns)
        if conn.parser.should_keep_alive():
            self._give_work(conn, end_ns)
        self._check_drained()

    # -- schedule ----------------------------------------------------------

    def start(self, warmup_s: float, duration_s: float) -> None:
        self.t0_ns = self.clock()
        self.warm_end_ns = self.t0_ns + int(warmup_s * _NS)
        self.end_ns = self.warm_end_ns + int(duration_s * _NS)
        self.next_ns = self.t0_ns
        self.scheduling = True
        self._tick()

    def _advance(self) -> None:
        if self.poisson:
            self.next_ns += int(self.rng.expovariate(self.rate) * _NS)
        else:
            # Index-based so rounding never accumulates into rate drift.
            self.k += 1
            self.next_ns = self.t0_ns + int(self.k * self.interval_ns)

    def _tick(self) -> None:
        if self.closed:
            return  # the run was abandoned (e.g. cancelled): stop scheduling
        now_ns = self.clock()
        horizon = now_ns + _SLACK_NS
        while self.next_ns <= horizon:
            if self.next_ns >= self.end_ns:
                self._stop_scheduling()
                return
            self._dispatch(self.next_ns, now_ns)
            self._advance()
        if self.next_ns >= self.end_ns:
            self._stop_scheduling()
            return
        wait_ns = self.next_ns - self.clock() - _WAKE_LEAD_NS
        self.loop.call_later(max(wait_ns, 0) / _NS, self._tick)

    def _dispatch(self, sched_ns: int, now_ns: int) -> None:
        # Early (within slack): the clock starts at the real send. Late: it
        # started at the scheduled time, whatever kept us from sending.
        start_ns = sched_ns if sched_ns <= now_ns else now_ns
        measured = sched_ns >= self.warm_end_ns
        if measured:
            self.scheduled += 1
        if self.idle:
            self._send(self.idle.pop(), start_ns, measured, sched_ns, now_ns)
        else:
            self.pending.append((start_ns, measured, sched_ns))
            self._maybe_grow()

    def _stop_scheduling(self) -> None:
        self.scheduling = False
        self._check_drained()

    def _check_drained(self) -> None:
        if self.scheduling or self.drained.done() or self.pending:
            return
        if any(c.busy for c in self.conns):
            return
        self.drained.set_result(None)

    # -- wrap-up -----------------------------------------------------------

    def unfinished(self) -> int:
        """Measured requests still waiting or in flight when we gave up."""
        waiting = sum(1 for _, measured, _ in self.pending if measured)
        return waiting + sum(1 for c in self.conns if c.busy and c.measured)

    def close_all(self) -> None:
        self.scheduling = False
        self.closed = True
        for conn in list(self.conns):
            conn.close()


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
    # (see _SLACK_NS): it belongs to the first second, not before it.
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


async def run_open_loop(
    url: str,
    bodies: list[bytes],
    rate: float,
    duration_s: float,
    *,
    poisson: bool = False,
    warmup_s: float = 1.0,
    max_connections: int = 64,
    connections: int = 4,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
    body_headers: Sequence[dict[str, str]] | None = None,
    drain_s: float = 2.0,
    seed: int | None = None,
) -> LoadResult:
    """Send POSTs to ``url`` at ``rate``/s for ``warmup_s + duration_s`` seconds.

    ``connections`` are opened up front (the initial connect must succeed);
    the pool grows on demand up to ``max_connections``. After the schedule
    ends, in-flight requests get ``drain_s`` to finish; the rest count as
    ``timeouts``. Bodies are cycled through in order.
    """
    if rate <= 0 or duration_s <= 0 or warmup_s < 0:
        raise ValueError("rate and duration must be > 0, warmup >= 0")
    target = _parse_url(url)
    run = _Run(
        target,
        build_requests(target, bodies, headers, content_type, body_headers),
        rate,
        poisson,
        seed,
        max_connections,
    )
    for _ in range(min(connections, max_connections)):
        # Fail fast if nothing listens, rather than erroring every request.
        await run.loop.create_connection(lambda: _Conn(run), target.host, target.port)
    cpu, timeouts, wall = await _drive(run, warmup_s, duration_s, drain_s)
    return _result(run, url, rate, duration_s, poisson, cpu, timeouts, wall)


class _Running(Protocol):
    drained: asyncio.Future[None]

    def start(self, warmup_s: float, duration_s: float) -> None: ...
    def unfinished(self) -> int: ...
    def close_all(self) -> None: ...


async def _drive(
    run: _Running, warmup_s: float, duration_s: float, drain_s: float
) -> tuple[float, int, float]:
    """Run to the end of the schedule plus the drain; returns (CPU s, timeouts, wall s)."""
    # A GC pause in the generator would be charged to the server: collect now,
    # freeze survivors and keep the collector off for the (bounded) run.
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    try:
        run.start(warmup_s, duration_s)
        await asyncio.wait_for(asyncio.shield(run.drained), warmup_s + duration_s + drain_s)
    except TimeoutError:
        pass
    finally:
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        if gc_was_enabled:
            gc.enable()
        gc.unfreeze()
        timeouts = run.unfinished()
        run.close_all()
    return cpu, timeouts, wall


def _result(
    run: _Run | _ClosedRun,
    url: str,
    rate: float,
    duration_s: float,
    poisson: bool,
    cpu: float,
    timeouts: int,
    wall: float,
) -> LoadResult:
    hist = _histogram_us(run.latency_ns)
    closed = isinstance(run, _ClosedRun)
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
        mode="closed" if closed else "open",
        users=run.users if isinstance(run, _ClosedRun) else None,
        wall_s=wall,
        timeline=run.timeline(),
    )


class _ClosedRun(_Recorder):
    """Closed loop: each user is one connection that sends its next request as soon as the
    previous one is answered (perf_analyzer's concurrency mode, Locust's users).

    Latency here is from the real send: a closed loop cannot see coordinated omission, which
    is why the open loop is the default and this mode exists to compare with tools that work
    this way and to model a fixed pool of callers. Users start at ``users`` and grow by
    ``spawn_rate`` per second, as in SageMaker Inference Recommender's traffic phases.
    """

    def __init__(self, target: _Target, requests: list[bytes], users: int,
                 spawn_rate: float) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.target = target
        self.requests = requests
        self.next_request = 0
        self.initial_users = users
        self.spawn_rate = spawn_rate
        self.users = 0
        self.conns: set[_Conn] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.max_pool = 0
        self.sending = False
        self.closed = False
        self.drained: asyncio.Future[None] = self.loop.create_future()

    def start(self, warmup_s: float, duration_s: float) -> None:
        t0 = time.perf_counter_ns()
        self.warm_end_ns = t0 + int(warmup_s * _NS)
        self.end_ns = self.warm_end_ns + int(duration_s * _NS)
        self.sending = True
        for _ in range(self.initial_users):
            self._add_user()
        if self.spawn_rate > 0:
            self.loop.call_later(1 / self.spawn_rate, self._spawn)
        self.loop.call_later((self.end_ns - t0) / _NS, self._stop_sending)

    def _spawn(self) -> None:
        if not self.sending:
            return
        self._add_user()
        self.loop.call_later(1 / self.spawn_rate, self._spawn)

    def _add_user(self) -> None:
        self.users += 1
        self._connect()

    def _connect(self, delay_s: float = 0.0) -> None:
        task = self.loop.create_task(self._open(delay_s))
        self.tasks.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self.tasks.discard)

    async def _open(self, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        if not self.sending:
            return
        try:
            await self.loop.create_connection(
                lambda: _Conn(self), self.target.host, self.target.port)
        except OSError:
            # The user stays: count the failure and try again shortly, so a server
            # that refuses connections shows up as errors, not as a silent stall.
            if time.perf_counter_ns() >= self.warm_end_ns:
                self.record_error()
            self._connect(0.05)

    def on_connected(self, conn: _Conn) -> None:
        if not self.sending:
            conn.close()
            return
        self.conns.add(conn)
        self.max_pool = max(self.max_pool, len(self.conns))
        self._send(conn)

    def _send(self, conn: _Conn) -> None:
        now = time.perf_counter_ns()
        measured = now >= self.warm_end_ns
        request = self.requests[self.next_request]
        self.next_request = (self.next_request + 1) % len(self.requests)
        self.total_sent += 1
        if measured:
            self.scheduled += 1
            self.sent += 1
        conn.send(now, measured, request)

    def on_response(self, conn: _Conn, status: int, end_ns: int) -> None:
        self.record(conn, status, end_ns)
        if self.sending and conn.parser.should_keep_alive():
            self._send(conn)
        self._check_drained()

    def on_lost(self, conn: _Conn) -> None:
        if self.closed:
            return
        self.conns.discard(conn)
        if conn.busy:
            conn.busy = False
            if conn.measured:
                self.record_error()
        if self.sending:
            self._connect()  # the user goes on with a new connection
        self._check_drained()

    def _stop_sending(self) -> None:
        self.sending = False
        self._check_drained()

    def _check_drained(self) -> None:
        if self.sending or self.drained.done() or any(c.busy for c in self.conns):
            return
        self.drained.set_result(None)

    def unfinished(self) -> int:
        return sum(1 for c in self.conns if c.busy and c.measured)

    def close_all(self) -> None:
        self.sending = False
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        for conn in list(self.conns):
            conn.close()


async def run_closed_loop(
    url: str,
    bodies: list[bytes],
    users: int,
    duration_s: float,
    *,
    spawn_rate: float = 0.0,
    warmup_s: float = 1.0,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
    body_headers: Sequence[dict[str, str]] | None = None,
    drain_s: float = 2.0,
) -> LoadResult:
    """``users`` connections each send back to back for ``warmup_s + duration_s`` seconds,
    ``spawn_rate`` more users joining per second. ``target_rate`` in the result is 0."""
    if users < 1 or duration_s <= 0 or warmup_s < 0 or spawn_rate < 0:
        raise ValueError("users must be >= 1, duration > 0, warmup and spawn rate >= 0")
    target = _parse_url(url)
    requests = build_requests(target, bodies, headers, content_type, body_headers)
    # Fail fast if nothing listens, rather than erroring every request.
    transport, _ = await asyncio.get_running_loop().create_connection(
        asyncio.Protocol, target.host, target.port)
    transport.close()
    run = _ClosedRun(target, requests, users, spawn_rate)
    cpu, timeouts, wall = await _drive(run, warmup_s, duration_s, drain_s)
    return _result(run, url, 0.0, duration_s, False, cpu, timeouts, wall)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh uvloop event loop."""
    result: T = uvloop.run(coro)
    return result


# -- the "answer at once" server ---------------------------------------------

_OK_BODY = b'{"ok":true}'
_OK_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_OK_BODY), _OK_BODY)
)
_REJECT_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
)


@dataclass
class InstantServerOptions:
    """Misbehaviours for tests; all off = answer every request at once."""

    delay_ms: float = 0.0  # non-blocking delay on every response
    stall_at: int = -1  # request index (0-based) at which the process blocks
    stall_ms: float = 0.0  # how long that stall lasts (time.sleep: all conns)
    reject_every: int = 0  # every Nth request answers 503
    close_every: int = 0  # every Nth request: drop the connection unanswered
    count: int = 0  # requests seen so far (shared by all connections)


class _InstantProtocol(asyncio.Protocol):
    def __init__(self, opts: InstantServerOptions) -> None:
        self.opts = opts
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; cast only.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._close()

    def on_message_complete(self) -> None:
        opts = self.opts
        n = opts.count
        opts.count += 1
        if n == opts.stall_at:
            # Blocking on purpose: the whole server freezes, like a GC pause.
            time.sleep(opts.stall_ms / 1000)
        if opts.close_every and n % opts.close_every == opts.close_every - 1:
            self._close()
            return
        rejected = opts.reject_every and n % opts.reject_every == opts.reject_every - 1
        response = _REJECT_RESPONSE if rejected else _OK_RESPONSE
        if opts.delay_ms > 0:
            asyncio.get_running_loop().call_later(opts.delay_ms / 1000, self._write, response)
        else:
            self._write(response)

    def _write(self, response: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def serve_instant(
    host: str = "127.0.0.1",
    port: int = 0,
    opts: InstantServerOptions | None = None,
    lifetime_s: float = 0.0,
) -> None:
    """Serve fixed responses; prints ``listening HOST:PORT`` once bound.

    ``lifetime_s`` > 0 makes the server exit by itself (a safety net for
    tests and scripts that might not stop it).
    """
    options = opts or InstantServerOptions()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _InstantProtocol(options), host, port)
    bound = server.sockets[0].getsockname()
    print(f"listening {bound[0]}:{bound[1]}", flush=True)
    async with server:
        if lifetime_s > 0:
            await asyncio.sleep(lifetime_s)
        else:
            await server.serve_forever()


# -- command line ---------------------------------------------------------------
# Load itself is `queryserve bench`; this module's own command only serves at once.


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m queryserve.bench.loadgen")
    sub = ap.add_subparsers(dest="cmd", required=True)
    srv = sub.add_parser("serve-instant", help="server that answers 200 at once")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=0)
    srv.add_argument("--delay-ms", type=float, default=0.0)
    srv.add_argument("--stall-at", type=int, default=-1)
    srv.add_argument("--stall-ms", type=float, default=0.0)
    srv.add_argument("--reject-every", type=int, default=0)
    srv.add_argument("--close-every", type=int, default=0)
    srv.add_argument("--lifetime-s", type=float, default=0.0)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    opts = InstantServerOptions(
        delay_ms=args.delay_ms,
        stall_at=args.stall_at,
        stall_ms=args.stall_ms,
        reject_every=args.reject_every,
        close_every=args.close_every,
    )
    run_sync(serve_instant(args.host, args.port, opts, args.lifetime_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
