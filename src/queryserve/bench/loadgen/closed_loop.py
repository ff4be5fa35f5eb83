"""Closed-loop HTTP/1.1 load: users that each send their next request when the last is
answered; `_ClosedRun` says why the open loop stays the default.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from queryserve.bench.loadgen.connection import _Conn
from queryserve.bench.loadgen.recorder import _NS, LoadResult, _Recorder, _result
from queryserve.bench.loadgen.requests import _Target, build_requests, parse_target
from queryserve.bench.loadgen.runner import _drive


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
    target = parse_target(url)
    requests = build_requests(target, bodies, headers, content_type, body_headers)
    # Fail fast if nothing listens, rather than erroring every request.
    transport, _ = await asyncio.get_running_loop().create_connection(
        asyncio.Protocol, target.host, target.port)
    transport.close()
    run = _ClosedRun(target, requests, users, spawn_rate)
    cpu, timeouts, wall = await _drive(run, warmup_s, duration_s, drain_s)
    return _result(run, url, 0.0, duration_s, False, cpu, timeouts, wall, run.users)
