"""One keep-alive client connection, and what it reports to (the open or the closed loop).

Why raw asyncio Protocols on uvloop: the generator shares the machine's cores
with the server under test, so it must cost only a few microseconds of CPU per
request. Requests are pre-encoded bytes written with one ``transport.write``,
responses are parsed by httptools (C), and latencies are appended to an
``array`` during the run and folded into an HDR histogram afterwards.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, cast

import httptools


class Connection(Protocol):
    """What carries one request at a time for a run: a keep-alive HTTP/1.1 connection
    (`_Conn`), or a stream slot on a gRPC channel (`grpc_open_loop._Stream`)."""

    busy: bool
    start_ns: int
    measured: bool

    def send(self, start_ns: int, measured: bool, request: bytes) -> None: ...
    def keeps_alive(self) -> bool: ...
    def close(self) -> None: ...


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

    def keeps_alive(self) -> bool:
        """Whether the last answer left the connection open for the next request."""
        return bool(self.parser.should_keep_alive())

    def connection_lost(self, exc: Exception | None) -> None:
        self.run.on_lost(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
