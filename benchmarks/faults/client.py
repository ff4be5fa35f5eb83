"""An open-loop HTTP/1.1 client that keeps a record of every request, and `Background`, a child
process that runs such clients while a scenario injects its faults.

Why not `queryserve.bench.loadgen`: its LoadResult folds requests into histograms and counts;
a fault scenario needs each request's own record (when it was written, its status, whether a
503 carried Retry-After) to tell the requests sent before a signal from those sent after, and
to judge latency phase by phase. The wire work is the loadgen's: requests encoded before the
run, one write each, httptools parsing, one request per connection at a time, the pool growing
on demand, latency from the scheduled send time (open loop: a stalled server is charged for
the wait). Times are `time.monotonic()`, the same clock in every process of the machine.

Beside it, what the scenarios' other clients share: `request_bytes`, one POST as it goes on the
wire (for the open loop and the raw-socket abusers alike), and `post`, one blocking request
timed (a reload, the largest valid request); readiness is the runner's `ready_status`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import traceback
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import uvloop

from faults.records import CONNECT_FAILED, CONNECTION_LOST, UNANSWERED, Records


def request_bytes(path: str, body: bytes, host: str = "127.0.0.1") -> bytes:
    """One HTTP/1.1 POST of a JSON `body` to `path`, head and body, as written on the wire."""
    return (f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def post(url: str, body: bytes, timeout_s: float) -> tuple[int, float, int]:
    """One blocking POST of a JSON `body` on a new connection: its status, how long it took
    (s) and the answer's bytes. An error status is an answer, not an exception."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"content-type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            status, size = resp.status, len(resp.read())
    except urllib.error.HTTPError as exc:
        status, size = exc.code, len(exc.read())
    return status, time.monotonic() - started, size


@dataclass(frozen=True)
class Stream:
    """Requests to one path at a constant rate, cycling through `bodies`."""

    path: str
    bodies: list[bytes]
    rate: float
    connections: int = 4  # opened before the first request
    max_connections: int = 512


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
        self.requests = [request_bytes(stream.path, body, f"127.0.0.1:{self.port}")
                         for body in stream.bodies]
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
