"""One HTTP/1.1 client connection (`HttpConnection`): parse its requests with httptools, answer
them in order, and hold it to its server's `HttpLimits`.

Keep-alive, pipelining (answered in order), `Expect: 100-continue` and a body-size limit are
handled; anything else a client does wrong gets a 4xx and the connection is closed.

Why the limits (`HttpLimits`) are enforced as bytes arrive, not when a line completes: what the
server holds for a client must stay bounded in time, memory and CPU whatever it sends.
httptools buffers a header value until its line ends, and one 128 MB header line without a
newline cost 14 s of CPU; so the bytes fed to the parser while a head (or a chunked body's
trailers) is incomplete are counted, and refused with 431 once past the limit, at most one
`FEED_BYTES` slice later (now refused within the first MB sent, in under 10 ms of CPU). A head must
also complete within `header_timeout_s` of its first byte (slowloris), a body that stops arriving
gets a 408 after the read timeout, and a connection idle between requests is closed after the
idle timeout. One timer per connection, re-arming itself, checks every time limit: the hot path
pays a clock read per read, never a timer per request.

A client that sends requests faster than it reads the answers is held back, not buffered: while
the transport's write buffer is above its high-water mark the connection reads nothing and starts
no request, and at most `MAX_PIPELINED` requests (plus one `FEED_BYTES` slice of them) are parsed
ahead of the one being answered; the rest stays in the kernel's buffers.

Every refusal is counted by its reason (`RejectionReason`) in the server's `rejections`, which
`/metrics` exports: an increment on the error path, nothing on the hot path.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from http import HTTPStatus
from typing import Literal, NoReturn, Protocol, get_args
from urllib.parse import unquote

import httptools

from queryserve.server.http_types import Handler, HttpLimits, Request, Response, json_error

log = logging.getLogger(__name__)

MAX_PIPELINED = 32  # requests parsed ahead of the one being answered before reading pauses
# The parser is fed at most this much at a time, so that a chunk of many tiny pipelined requests
# (a read is up to 256 KiB) stops being parsed once the pipeline is full: a few hundred parsed
# requests at most, not thousands. A short request is one read, fed whole.
FEED_BYTES = 8 * 1024

RejectionReason = Literal[
    "bad_request",  # 400: a request line, header, Content-Length or target that does not parse
    "upgrade",  # 400: a protocol upgrade (WebSocket, h2c) not answerable as plain HTTP
    "url_too_long",  # 414: a request target over `max_url_bytes`
    "headers_too_large",  # 431: a head (or a chunked body's trailers) over `max_header_bytes`
    "body_too_large",  # 413: a body over `max_body_bytes`, declared or streamed
    "header_timeout",  # 408: a head not complete within `header_timeout_s` (slowloris)
    "read_timeout",  # 408: a body that stopped arriving for `read_timeout_s`
    "not_reading",  # dropped: the client took none of its answers for `read_timeout_s`
    "internal_error",  # 500: a bug of ours while parsing (logged)
    "max_connections",  # 503 on connect: at `max_connections`, with no silent one to evict
    "draining",  # 503 on connect: the server is shutting down
    "evicted",  # closed: connected and silent at the cap, to make room for a newcomer
]
"""Why the transport refused a request or a connection before any handler saw it."""
REJECTION_REASONS: tuple[RejectionReason, ...] = get_args(RejectionReason)

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
# `head_bytes` when no request head is incomplete, and when one began in the slice being fed.
_NO_HEAD = -2
_HEAD_BEGAN = -1


class _Stop(Exception):
    """Raised from a parser callback once the request is refused: the parser reads no further."""


class ConnectionOwner(Protocol):
    """What a connection needs of the server that accepted it (`HttpServer`)."""

    handler: Handler
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


class HttpConnection(asyncio.Protocol):
    """One client connection: parse requests, answer them in order."""

    def __init__(self, server: ConnectionOwner) -> None:
        self.server = server
        self.handler = server.handler
        self.limits = server.limits
        self.max_body_bytes = server.limits.max_body_bytes
        self.max_url_bytes = server.limits.max_url_bytes
        self.max_header_bytes = server.limits.max_header_bytes
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None  # None once we closed it, or it was lost
        self.raw_transport: asyncio.Transport | None = None  # until lost: shutdown may abort it
        self.pending: deque[tuple[Request, bool]] = deque()
        self.rejected = False  # read nothing more: refused, upgrading, or draining
        self.current: asyncio.Task[Response] | None = None
        self.read_paused = False  # the transport's reading is paused (pipeline full, or below)
        self.write_paused = False  # the client is not taking its answers: start nothing new
        self.unparsed = b""  # read but not fed to the parser while the pipeline was full
        self.fatal: Response | None = None  # an error to send once the current answer is out
        self.closing = False  # close once the requests read so far are answered
        self.in_message = False  # a request is partly read
        self.head_started: float | None = None  # when the incomplete (or awaited) head began
        self.head_bytes = _NO_HEAD  # bytes fed while the current request head is incomplete
        self.last_read = 0.0  # the last sign of life from the client: a read, or a drained write
        self.heard_from = False  # the client has sent a byte
        self.timer: asyncio.TimerHandle | None = None
        self.loop = server.loop
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0

    @property
    def unanswered(self) -> int:
        """Requests read (or being read, to be answered) and not yet answered."""
        return (len(self.pending) + (self.current is not None)
                + (self.in_message and not self.rejected))

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
        self.last_read = self.head_started = self.loop.time()  # the first head is due from now
        # One timer per connection that re-arms itself, rather than one per read: the hot path
        # pays a clock read per chunk, not a timer.
        self.timer = self.loop.call_later(self._check_every_s(), self._check_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        # The client has gone: cancelling its request cancels the futures it waits on, and
        # the batcher drops cancelled items before they reach the model.
        self.transport = self.raw_transport = None
        if self.timer is not None:
            self.timer.cancel()
        if self.current is not None:
            self.current.cancel()
        self.pending.clear()
        self.unparsed = b""
        self.server.forget(self)

    def pause_writing(self) -> None:
        # The write buffer is above its high-water mark: the client reads slower than we answer.
        # Start nothing new and read nothing more until it drains, so that a client pipelining
        # without reading costs a bounded number of requests and bytes.
        self.write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is None:
            return
        self.last_read = self.loop.time()  # the client took data: it is alive
        if self.current is None and self.pending:
            self._start_next()
        if not self.write_paused and len(self.pending) <= MAX_PIPELINED // 2:
            self._resume_reading()

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
        self.last_read = self.loop.time()
        if len(data) <= FEED_BYTES and not self.unparsed:
            self._feed(data)
        else:
            self._feed_slices(self.unparsed + data if self.unparsed else data)

    # -- parsing ------------------------------------------------------------------------------

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self.current is not None or self.pending:
                # The request asking to upgrade is read: answer it as plain HTTP (a server
                # may ignore Upgrade), read nothing after it, then close.
                self.rejected = self.closing = True
                self.unparsed = b""
            else:
                self._fail(400, "protocol upgrades are not supported", "upgrade")
            return
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):  # a bug of ours, not the client's
                log.error("unhandled error parsing a request", exc_info=exc.__context__)
                self._fail(500, "internal server error", "internal_error")
            return
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}", "bad_request")
            return
        if self.head_bytes != _NO_HEAD:
            # A head (or a chunked body's trailers) is still incomplete and the parser holds its
            # bytes, as a header value is buffered until its line ends: count them now.
            if self.head_bytes == _HEAD_BEGAN:
                self.head_bytes = 0  # it began in this slice: its share is under one slice
            else:
                self.head_bytes += len(data)
                if self.head_bytes > self.max_header_bytes:
                    self._fail(431, f"request headers (or trailers) are over the limit of "
                                    f"{self.max_header_bytes} bytes", "headers_too_large")

    def _feed_slices(self, data: bytes) -> None:
        """Feed `data` a slice at a time, keeping the rest once the pipeline is full."""
        view = memoryview(data)
        for start in range(0, len(data), FEED_BYTES):
            if self.rejected or self.transport is None:
                return
            if self.write_paused or len(self.pending) > MAX_PIPELINED:
                self.unparsed = data[start:]  # at most one read, fed when the pipeline drains
                self._pause_reading()
                return
            self._feed(view[start:start + FEED_BYTES])

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None:
            self.transport.pause_reading()
            self.read_paused = True

    def _resume_reading(self) -> None:
        if self.unparsed:
            rest, self.unparsed = self.unparsed, b""
            self._feed_slices(rest)
            if self.unparsed:
                return  # the pipeline filled again
        if self.read_paused and self.transport is not None and not self.rejected:
            self.transport.resume_reading()
            self.read_paused = False

    def _refuse(self, status: int, message: str, reason: RejectionReason) -> NoReturn:
        """From a parser callback: answer with an error, close, and stop the parser."""
        self._fail(status, message, reason)
        raise _Stop

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.head_bytes = _HEAD_BEGAN
        if self.head_started is None:  # else the connection's first head, due since connecting
            self.head_started = self.last_read
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_url_bytes:
            self._refuse(414, f"request target is over the limit of {self.max_url_bytes} bytes",
                         "url_too_long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > self.max_header_bytes:
            self._refuse(431, f"request headers are over the limit of "
                              f"{self.max_header_bytes} bytes", "headers_too_large")
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head_bytes = _NO_HEAD
        self.head_started = None
        if self.rejected:
            return
        length = self.headers.get("content-length")
        if length is not None:
            # llhttp checks it too; ASCII digits only here, as `int` refuses '²' that isdigit takes
            if not (length.isascii() and length.isdigit()):
                self._refuse(400, f"Content-Length {length!r} is not a number of bytes",
                             "bad_request")
            if int(length) > self.max_body_bytes:
                self._refuse(413, f"request body of {length} bytes is over the limit of "
                                  f"{self.max_body_bytes} bytes", "body_too_large")
        if (self.headers.get("expect", "").lower() == "100-continue" and self.transport
                and self.current is None and not self.pending):
            # Only when nothing is answered before it: an interim answer must come in order.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_chunk_header(self) -> None:
        # The last chunk's header is followed by trailers, which httptools buffers as it does
        # headers: count what follows as a head until body bytes come.
        self.head_bytes = _HEAD_BEGAN

    def on_body(self, body: bytes) -> None:
        self.head_bytes = _NO_HEAD
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            self._refuse(413, f"request body is over the limit of {self.max_body_bytes} bytes",
                         "body_too_large")
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        self.head_bytes = _NO_HEAD  # after trailers
        if self.rejected:
            return
        try:
            parsed = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            self._refuse(400, f"request target {self.url[:200]!r} is not a path",
                         "bad_request")
        # An absolute-form target with no path ("http://host") means "/" (RFC 9112 3.2.2).
        path = parsed.path.decode("utf-8", "replace") if parsed.path else "/"
        request = Request(
            method=self.parser.get_method().decode("ascii"),
            path=unquote(path) if "%" in path else path,
            query=(parsed.query or b"").decode("utf-8", "replace"),
            headers=self.headers,
            body=b"".join(self.body),
        )
        self.pending.append((request, self.parser.should_keep_alive()))
        if self.closing:
            self.rejected = True  # draining: this was the last request to read
        if len(self.pending) > MAX_PIPELINED:
            self._pause_reading()
        if self.current is None and not self.write_paused:
            self._start_next()

    # -- answering ----------------------------------------------------------------------------

    def _start_next(self) -> None:
        request, keep_alive = self.pending.popleft()
        head = request.method == "HEAD"  # answered as GET, without the body (RFC 9110 9.3.2)
        if head:
            request.method = "GET"
        task = self.loop.create_task(self.handler(request))
        self.current = task
        task.add_done_callback(lambda done: self._finished(done, keep_alive, head))

    def _finished(self, task: asyncio.Task[Response], keep_alive: bool, head: bool) -> None:
        self.current = None
        if self.transport is None or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("unhandled error answering a request", exc_info=exc)
            response = json_error(500, "internal server error")
        else:
            response = task.result()
        if (self.closing and not self.pending and self.fatal is None
                and not (self.in_message and not self.rejected)):
            keep_alive = False  # the last answer before closing says so
        self._write(response, keep_alive, head)
        if self.fatal is not None and not self.pending:
            self._write(self.fatal, keep_alive=False)
            self._close()
            return
        if not keep_alive:
            self._close()
            return
        if self.write_paused:
            return  # resume_writing goes on once the client has taken its answers
        if self.pending:
            self._start_next()
        if self.read_paused and len(self.pending) <= MAX_PIPELINED // 2:
            self._resume_reading()

    def _check_every_s(self) -> float:
        # Never later than the header or read timeout: a request may begin at any moment.
        return min(self.limits.header_timeout_s, self.limits.read_timeout_s)

    def _check_timeout(self) -> None:
        if self.raw_transport is None:
            return
        limits = self.limits
        now = self.loop.time()
        quiet = now - self.last_read
        next_s = self._check_every_s()
        if self.transport is None or (self.current is None and (self.write_paused
                                                                or self.pending)):
            # Answers wait on the client to read them (before or after we closed). One that has
            # taken none for the read timeout is gone or hostile, and a 408 would only queue
            # behind what it does not read.
            if quiet >= limits.read_timeout_s:
                if self.transport is not None:  # else closed already, and counted if refused
                    self.server.rejections["not_reading"] += 1
                self.abort()
                return
            next_s = min(next_s, limits.read_timeout_s - quiet)
        elif self.current is None:  # else a slow model is not a slow client: wait for it
            if self.head_started is not None:
                late = now - self.head_started
                if late >= limits.header_timeout_s:
                    if self.in_message:
                        self._fail(408, f"the request head did not arrive within "
                                        f"{limits.header_timeout_s:g} s", "header_timeout")
                    else:
                        self._close()  # a new connection that sent nothing: no request to answer
                    return
                next_s = min(next_s, limits.header_timeout_s - late)
            limit = limits.read_timeout_s if self.in_message else limits.idle_timeout_s
            if quiet >= limit:
                if self.in_message:
                    self._fail(408, f"the client sent nothing for {limits.read_timeout_s:g} s "
                                    f"in the middle of a request", "read_timeout")
                else:
                    self._close()
                return
            next_s = min(next_s, limit - quiet)
        self.timer = self.loop.call_later(max(next_s, 0.005), self._check_timeout)

    def _write(self, response: Response, keep_alive: bool, head: bool = False) -> None:
        """One response; for a HEAD request its headers alone, Content-Length included."""
        assert self.transport is not None
        lines = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s" % (
            response.status, _REASONS.get(response.status, b"Unknown"),
            response.content_type.encode(), len(response.body), self.server.date)]
        for name, value in response.headers:
            lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        if not keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.transport.writelines([b"".join(lines), b"" if head else response.body])

    def _fail(self, status: int, message: str, reason: RejectionReason) -> None:
        """Answer a request we will not read to the end, then close the connection; count the
        refusal under `reason`."""
        if self.transport is None or self.fatal is not None:
            return  # already refused, or gone
        self.server.rejections[reason] += 1
        self.rejected = True
        self.unparsed = b""
        if self.current is not None or self.pending:
            self.fatal = json_error(status, message)
        else:
            self._write(json_error(status, message), keep_alive=False)
            self._close()

    def drain(self) -> None:
        """Shutdown: answer the requests read so far (and one being read), then close."""
        if self.transport is None:
            return
        self.closing = True
        if self.current is None and not self.pending and not self.in_message:
            self._close()  # idle
        elif not self.in_message:
            self.rejected = True  # read nothing more
            self.unparsed = b""
        # else on_message_complete stops reading after the request being read

    def abort(self) -> None:
        """Close at once, dropping whatever is unsent (connection_lost cancels the rest)."""
        if self.raw_transport is not None:
            self.raw_transport.abort()
        self.transport = None

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
