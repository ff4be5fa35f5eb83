"""A small HTTP/1.1 server on asyncio + httptools (the parser uvicorn uses).

Why not an ASGI server: the hot path is one short request per query, so every microsecond of
per-request Python counts on a 2-core machine; and a connection that drops must cancel its
request's futures so the batcher drops them before the model runs (`connection_lost` does that
here at no per-request cost). Keep-alive, pipelining (answered in order), `Expect: 100-continue`
and a body-size limit are handled; anything else a client does wrong gets a 4xx and the
connection is closed. A request that stops arriving half-way gets a 408 once the client has
been silent for the read timeout (checked that often); a connection idle between requests is
closed after the idle timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import orjson

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024
MAX_PIPELINED = 32  # requests parsed ahead of the one being answered before reading pauses
READ_TIMEOUT_S = 30.0  # a request begun may pause this long before it is refused (408)
IDLE_TIMEOUT_S = 300.0  # a keep-alive connection with nothing to do is closed after this


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def json_error(status: int, message: str) -> Response:
    return Response(status, orjson.dumps({"error": message}))


class HttpConnection(asyncio.Protocol):
    """One client connection: parse requests, answer them in order."""

    def __init__(self, handler: Handler, max_body_bytes: int,
                 read_timeout_s: float = READ_TIMEOUT_S,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[tuple[Request, bool]] = deque()
        self.rejected = False
        self.current: asyncio.Task[Response] | None = None
        self.paused = False
        self.fatal: Response | None = None  # an error to send once the current answer is out
        self.closing = False  # close once the requests read so far are answered
        self.in_message = False  # a request is partly read
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()  # the factory runs on the server's loop
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.last_read = self.loop.time()
        # One timer per connection that re-arms itself, rather than one per read: the hot path
        # pays a clock read per chunk, not a timer.
        self.timer = self.loop.call_later(self.read_timeout_s, self._check_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        # The client has gone: cancelling its request cancels the futures it waits on, and
        # the batcher drops cancelled items before they reach the model.
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
        if self.current is not None:
            self.current.cancel()
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.rejected:
            return  # the connection is closing after an error: read nothing more
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self.current is not None or self.pending:
                # The request asking to upgrade is read: answer it as plain HTTP (a server
                # may ignore Upgrade), read nothing after it, then close.
                self.rejected = self.closing = True
            else:
                self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADER_BYTES:
            self._fail(431, "request headers are too large")
            return
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length", "0")
        if length.isdigit() and int(length) > self.max_body_bytes:
            self._fail(413, f"request body of {length} bytes is over the limit of "
                            f"{self.max_body_bytes} bytes")
            return
        if self.headers.get("expect", "").lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            self._fail(413, f"request body is over the limit of {self.max_body_bytes} bytes")
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        if self.rejected:
            return
        parsed = httptools.parse_url(self.url)
        path = parsed.path.decode("utf-8", "replace")
        request = Request(
            method=self.parser.get_method().decode("ascii"),
            path=unquote(path) if "%" in path else path,
            query=(parsed.query or b"").decode("utf-8", "replace"),
            headers=self.headers,
            body=b"".join(self.body),
        )
        self.pending.append((request, self.parser.should_keep_alive()))
        if len(self.pending) > MAX_PIPELINED and self.transport and not self.paused:
            self.transport.pause_reading()
            self.paused = True
        if self.current is None:
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
        self._write(response, keep_alive, head)
        if self.fatal is not None and not self.pending:
            self._write(self.fatal, keep_alive=False)
            keep_alive = False
        elif self.closing and not self.pending:
            keep_alive = False
        if not keep_alive:
            self._close()
            return
        if self.paused and len(self.pending) <= MAX_PIPELINED // 2 and self.transport:
            self.transport.resume_reading()
            self.paused = False
        if self.pending:
            self._start_next()

    def _check_timeout(self) -> None:
        if self.transport is None:
            return
        limit = self.read_timeout_s if self.in_message else self.idle_timeout_s
        quiet = self.loop.time() - self.last_read
        if quiet < limit or self.current is not None:  # a slow model is not a slow client
            # Never later than the read timeout: a request may begin on an idle connection.
            self.timer = self.loop.call_later(min(max(limit - quiet, 0.1), self.read_timeout_s),
                                              self._check_timeout)
        elif self.in_message:
            self._fail(408, f"the client sent nothing for {self.read_timeout_s:g} s in the "
                            f"middle of a request")
        else:
            self._close()

    def _write(self, response: Response, keep_alive: bool, head: bool = False) -> None:
        """One response; for a HEAD request its headers alone, Content-Length included."""
        assert self.transport is not None
        lines = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
            response.status, _REASONS.get(response.status, b"Unknown"),
            response.content_type.encode(), len(response.body))]
        for name, value in response.headers:
            lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        if not keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.transport.writelines([b"".join(lines), b"" if head else response.body])

    def _fail(self, status: int, message: str) -> None:
        """Answer a request we will not read to the end, then close the connection."""
        self.rejected = True
        if self.current is not None:
            self.fatal = json_error(status, message)
        elif self.transport is not None:
            self._write(json_error(status, message), keep_alive=False)
            self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


async def start_http_server(handler: Handler, host: str, port: int, max_body_bytes: int,
                            read_timeout_s: float = READ_TIMEOUT_S,
                            idle_timeout_s: float = IDLE_TIMEOUT_S) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: HttpConnection(handler, max_body_bytes, read_timeout_s, idle_timeout_s),
        host, port,
        reuse_address=True, backlog=2048)
