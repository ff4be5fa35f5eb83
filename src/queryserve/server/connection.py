"""One HTTP/1.1 client connection (`HttpConnection`): read its requests, answer them in order, and
hold it to its server's `HttpLimits`.

Keep-alive, pipelining (answered in order), `Expect: 100-continue` and a body-size limit are
handled; anything else a client does wrong gets a 4xx and the connection is closed.

The connection is the asyncio protocol, and the one owner of its transport; three parts do the
work, each in its own module: `request_parser` (httptools' callbacks build each request and hold
it to the size limits as its bytes arrive), `deadlines` (the header, read and idle timeouts, on
one timer), and `response_queue` (answers in order, held back while the client does not read).
Here: what comes in is fed to the parser a slice at a time, reading pauses while the answers back
up, and each refusal is answered and counted.

The parser is fed at most `FEED_BYTES` at a time, so that a chunk of many tiny pipelined requests
(a read is up to 256 KiB) stops being parsed once the pipeline is full: a few hundred parsed
requests at most, not thousands. A short request is one read, fed whole.

Every refusal is counted by its reason (`RejectionReason`) in the server's `rejections`, which
`/metrics` exports: an increment on the error path, nothing on the hot path.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from queryserve.server.deadlines import Deadlines, Expiry, Phase
from queryserve.server.http_types import (
    Handler,
    HttpLimits,
    Refusal,
    RejectionReason,
    Request,
    Screen,
)
from queryserve.server.request_parser import RequestParser
from queryserve.server.response_queue import ResponseQueue

FEED_BYTES = 2 * 1024  # the most fed to the parser at a time
TURN_BYTES = 16 * 1024
TURN_S = 0.25e-3
"""The most parsed for one connection in one turn of the event loop, in bytes and in time; the
rest waits for the next turn, reading paused. libuv reads up to 32 times 256 KiB in one turn,
and a body in 2-byte chunks costs the parser three callbacks a chunk: one 8 MB such body held
every other client for 0.8 s (RELIABILITY.md section 4: the normal client's p99 785 ms). Bytes
alone did not bound it: 16 KiB of 2-byte chunks took 1 ms of the loop on a fast day and 2 ms
on a slow one, and a request that needs a few turns of the loop waited a slice in each (p50
25 ms, p99 145 ms). A turn now stops at the first 2 KiB slice past 0.25 ms; and a body in tiny
chunks waits `YIELD_S` for its next: a loop never idle holds the GIL but for the interpreter's
5 ms switch interval, and the threads that run the other clients' batches waited that long
each time they needed it (in-process, with `embed` served: p50 30 ms beside such a body, 5.8
after, against 4.8 with none; the body took 10.1 s rather than 2.3: it pays, not the others).
An 8 MB plain body still takes 512 turns, each a few microseconds of the loop's own."""
YIELD_S = 1e-3
"""How long a connection whose turn ran out of time waits: the loop idles meanwhile (the
timers of libuv count whole milliseconds: 0.25 ms was none)."""


class ConnectionOwner(Protocol):
    """What a connection needs of the server that accepted it (`HttpServer`)."""

    handler: Handler
    refusal: Refusal  # how an answer the transport gives itself is worded
    screen: Screen | None  # what the application refuses from a request's head alone
    limits: HttpLimits
    loop: asyncio.AbstractEventLoop
    date: bytes  # the `date` header line, renewed each second
    rejections: dict[str, int]  # refusals by `RejectionReason`, every reason present

    def admit(self, connection: HttpConnection) -> bool:
        """Count a new connection in, or refuse it (over `max_connections`, or draining)."""
        ...

    def heard(self, connection: HttpConnection) -> None:
        """The connection sent its first bytes."""
        ...

    def forget(self, connection: HttpConnection) -> None:
        """The connection is gone."""
        ...

    def hand_back(self, opened_at: float) -> bool:
        """Close a connection after its answer: the worker holds more than its share, or the
        connection is too old."""
        ...


class HttpConnection(asyncio.Protocol):
    """One client connection: parse requests, answer them in order."""

    def __init__(self, server: ConnectionOwner) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None  # None once we closed it, or it was lost
        self.raw_transport: asyncio.Transport | None = None  # until lost: shutdown may abort it
        self.rejected = False  # read nothing more: refused, upgrading, or draining
        self.read_paused = False  # the transport's reading is paused (pipeline full, or below)
        # Read but not fed to the parser yet: while the pipeline was full, or past this turn's
        # `TURN_BYTES` (a view: what follows is not copied at each turn).
        self.unparsed: bytes | memoryview = b""
        self.heard_from = False  # the client has sent a byte
        self.deadlines = Deadlines(self, server.limits, server.loop)
        self.parser = RequestParser(self, server.limits, self.deadlines)
        self.responses = ResponseQueue(self, server)

    @property
    def unanswered(self) -> int:
        """Requests read (or being read, to be answered) and not yet answered."""
        return self.responses.unanswered + self.reading_a_request()

    def reading_a_request(self) -> bool:
        return self.parser.in_message and not self.rejected

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        if not server.admit(self):
            # Over the cap (or shutting down): a 503 the client may retry, and nothing kept.
            self.rejected = True
            refused: asyncio.Transport = transport  # type: ignore[assignment]  # see below
            refused.write(b"HTTP/1.1 503 Service Unavailable\r\n%sretry-after: 1\r\n"
                          b"content-length: 0\r\nconnection: close\r\n\r\n" % server.date)
            refused.close()
            return
        # uvloop's transport is no subclass of asyncio.Transport, but has its methods.
        self.transport = self.raw_transport = transport  # type: ignore[assignment]
        self.deadlines.start()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = self.raw_transport = None
        self.deadlines.stop()
        self.responses.cancel()
        self.unparsed = b""
        self.server.forget(self)

    def pause_writing(self) -> None:
        # The write buffer is above its high-water mark: the client reads slower than we answer.
        # Start nothing new and read nothing more until it drains, so that a client pipelining
        # without reading costs a bounded number of requests and bytes.
        self.responses.write_paused = True
        self.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is None:
            self.responses.write_paused = False
            return
        self.deadlines.heard()  # the client took data: it is alive
        self.responses.resume_writing()

    def eof_received(self) -> bool:
        # A client's FIN reads the same whether it closed or only half-closed (as `nc -N` does),
        # and most that close have given up on their answer: treat it as gone, so that its
        # running request is cancelled (connection_lost) before the model runs it.
        return False

    def data_received(self, data: bytes) -> None:
        if self.rejected:
            return  # the connection is closing after an error: read nothing more
        if not self.heard_from:
            self.heard_from = True
            self.server.heard(self)
        self.deadlines.last_read = self.loop.time()  # a clock read per read, never a timer
        if len(data) <= FEED_BYTES and not self.unparsed:
            self.parser.feed(data)
        else:
            self._feed_slices(bytes(self.unparsed) + data if self.unparsed else data)

    # -- reading ------------------------------------------------------------------------------

    def _feed_slices(self, data: bytes | memoryview) -> None:
        """Feed `data` a slice at a time, `TURN_BYTES` in this turn of the loop; the rest is
        kept, reading paused, for the next turn, or for when the pipeline drains if it is
        full."""
        view = memoryview(data)
        began = time.perf_counter()
        for start in range(0, len(view), FEED_BYTES):
            if self.rejected or self.transport is None:
                return
            slow = bool(start) and time.perf_counter() - began > TURN_S
            if self.responses.backed_up or start >= TURN_BYTES or slow:
                self.unparsed = view[start:]  # at most one read
                self.pause_reading()
                if self.responses.backed_up:
                    return  # fed again when the pipeline drains
                if slow and self.parser.tiny_chunks():  # after the loop has idled a moment
                    self.loop.call_later(YIELD_S, self.pipeline_has_room)
                else:
                    self.loop.call_soon(self.pipeline_has_room)
                return
            self.parser.feed(view[start:start + FEED_BYTES])

    def pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None:
            self.transport.pause_reading()
            self.read_paused = True

    def pipeline_has_room(self) -> None:
        if self.unparsed:
            rest, self.unparsed = self.unparsed, b""
            self._feed_slices(rest)
            if self.unparsed:
                return  # the pipeline filled again
        if self.read_paused and self.transport is not None and not self.rejected:
            self.transport.resume_reading()
            self.read_paused = False

    # -- what the parser reads ----------------------------------------------------------------

    def received(self, request: Request, keep_alive: bool) -> None:
        if self.responses.closing or not keep_alive:
            # Draining, or the client said `Connection: close` (HTTP/1.0: did not ask to keep
            # it): this was the last request to read (RFC 9112 9.6). What it pipelined after
            # was answered, with a 400 "Data after `Connection: close`".
            self.rejected = True
            self.unparsed = b""
        elif self.parser.http10:  # kept alive because it asked: the answer says so
            self.responses.announce_keep_alive = True
        request.screened = self.server.screen is not None  # it passed: it was refused else
        self.responses.add(request, keep_alive)

    def continue_expected(self) -> None:
        self.responses.send_continue()

    def screened(self) -> bool:
        screen = self.server.screen
        if screen is None:
            return False
        parser = self.parser
        answer = screen(parser.method(), parser.target[0], parser.headers)
        if answer is None:
            return False
        # Refused as the transport refuses (answered after what is pipelined before it, then
        # closed), and counted by the access control, not as a malformed request.
        self.rejected = True
        self.unparsed = b""
        self.responses.refuse(answer)
        return True

    def upgrade_requested(self) -> None:
        if self.responses.busy:
            # The request asking to upgrade is read: answer it as plain HTTP (a server may
            # ignore Upgrade), read nothing after it, then close.
            self.rejected = self.responses.closing = True
            self.unparsed = b""
        else:
            self.refuse(400, "protocol upgrades are not supported", "upgrade")

    def refuse(self, status: int, message: str, reason: RejectionReason) -> None:
        """Answer a request we will not read to the end, then close the connection; count the
        refusal under `reason`."""
        if self.transport is None or self.responses.fatal is not None:
            return  # already refused, or gone
        self.server.rejections[reason] += 1
        self.rejected = True
        self.unparsed = b""
        parser = self.parser
        self.responses.refuse(self.server.refusal(parser.path(), parser.headers, status,
                                                  message))

    # -- deadlines ----------------------------------------------------------------------------

    def phase(self) -> Phase:
        if self.transport is None or self.responses.waiting_on_client:
            return "waiting_on_client"
        if self.responses.current is not None:
            return "answering"
        return "reading" if self.parser.in_message else "idle"

    def expire(self, expiry: Expiry) -> None:
        limits = self.server.limits
        if expiry == "not_reading":
            if self.transport is not None:  # else closed already, and counted if refused
                self.server.rejections["not_reading"] += 1
            self.abort()
        elif expiry == "header_timeout":
            self.refuse(408, f"the request head did not arrive within "
                             f"{limits.header_timeout_s:g} s", "header_timeout")
        elif expiry == "read_timeout":
            self.refuse(408, f"the client sent nothing for {limits.read_timeout_s:g} s "
                             f"in the middle of a request", "read_timeout")
        else:
            self.close()  # silent since connecting, or idle between requests: nothing to answer

    # -- closing ------------------------------------------------------------------------------

    def drain(self) -> None:
        """Shutdown: answer the requests read so far (and one being read), then close."""
        if self.transport is None:
            return
        self.responses.closing = True
        in_message = self.parser.in_message
        if not self.responses.busy and not in_message:
            self.close()  # idle
        elif not in_message:
            self.rejected = True  # read nothing more
            self.unparsed = b""
        # else `received` stops reading after the request being read

    def abort(self) -> None:
        """Close at once, dropping whatever is unsent (connection_lost cancels the rest)."""
        if self.raw_transport is not None:
            self.raw_transport.abort()
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
