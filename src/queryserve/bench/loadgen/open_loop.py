"""Open-loop HTTP/1.1 load (wrk2 style): the default driver.

Why open loop: a closed-loop client (send, wait, send again) slows down when
the server slows down, so a stall delays the *next* requests instead of being
charged to them and the tail disappears ("coordinated omission"). Here every
request has a scheduled send time fixed in advance (constant rate or Poisson
arrivals) and its latency is measured from that scheduled time, so time spent
waiting for a free connection or behind a stalled server is counted.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Sequence

from queryserve.bench.loadgen.connection import Connection, _Conn
from queryserve.bench.loadgen.recorder import _NS, LoadResult, _Recorder, _result
from queryserve.bench.loadgen.requests import _Target, build_requests, parse_target
from queryserve.bench.loadgen.runner import _drive

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
        self.idle: list[Connection] = []
        self.conns: set[Connection] = set()
        self.connecting = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending: deque[tuple[int, bool, int]] = deque()
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
            await self.connect()
        except OSError:
            self._fail_one_pending()
        finally:
            self.connecting -= 1

    async def connect(self) -> None:
        """Open a connection, which reports to `on_connected` (the gRPC driver opens a stream
        slot instead)."""
        await self.loop.create_connection(
            lambda: _Conn(self), self.target.host, self.target.port
        )

    def _fail_one_pending(self) -> None:
        # The connect was made on behalf of a waiting request: that request
        # fails, so a dead server shows up as one error per scheduled request.
        if self.pending:
            _, measured, _ = self.pending.popleft()
            if measured:
                self.record_error()
        self._check_drained()

    def on_connected(self, conn: Connection) -> None:
        if self.closed:
            conn.close()  # a late connect finishing after the run ended
            return
        self.conns.add(conn)
        self.max_pool = max(self.max_pool, len(self.conns))
        self._give_work(conn, self.clock())

    def on_lost(self, conn: Connection) -> None:
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

    def _give_work(self, conn: Connection, now_ns: int) -> None:
        if self.pending:
            start_ns, measured, sched_ns = self.pending.popleft()
            self._send(conn, start_ns, measured, sched_ns, now_ns)
        else:
            self.idle.append(conn)

    def _send(self, conn: Connection, start_ns: int, measured: bool, sched_ns: int,
              now_ns: int) -> None:
        request = self.requests[self.next_request]
        self.next_request = (self.next_request + 1) % len(self.requests)
        self.total_sent += 1
        if measured:
            self.sent += 1
            self.send_lag_ns.append(now_ns - sched_ns if now_ns > sched_ns else 0)
        conn.send(start_ns, measured, request)

    # -- responses ---------------------------------------------------------

    def on_response(self, conn: Connection, status: int, end_ns: int) -> None:
        self.record(conn, status, end_ns)
        if conn.keeps_alive():
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
    target = parse_target(url)
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
