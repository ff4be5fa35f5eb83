"""Reading one connection's requests (`RequestParser`): httptools' callbacks build each `Request`,
and hold it to the size limits of `HttpLimits` as its bytes arrive.

Why the limits are enforced as bytes arrive, not when a line completes: what the server holds for
a client must stay bounded in time, memory and CPU whatever it sends. httptools buffers a header
value until its line ends, and one 128 MB header line without a newline cost 14 s of CPU; so the
bytes fed to the parser while a head (or a chunked body's trailers) is incomplete are counted,
and refused with 431 once past the limit, at most one feed (`FEED_BYTES`, the connection's
slice) later (now refused within the first MB sent, in under 10 ms of CPU).

A chunked body's framing (chunk sizes, extensions: llhttp reads them without a callback) may
take 16 bytes a chunk and twice the content, as Go's reader allows, and no more than twice the
header limit beyond: a 300 MiB chunk extension was read to its end, past every limit. A body in
many pieces is gathered in one buffer: kept as a list of `bytes`, an 8 MB body in 2-byte chunks
held 236 MB.

A chunked body's trailers count against the header limit as the head's fields do, and are then
dropped, never merged into `Request.headers`: a proxy in front checks (or sets) the head's
fields, not the trailers', so a trailer must not stand in for a Host, an API key or a
Content-Type it let through (RFC 9110 6.5.1: merged only where a field's definition allows).
"""

from __future__ import annotations

import logging
import re
from typing import NoReturn, Protocol
from urllib.parse import unquote

import httptools

from queryserve.server.deadlines import Deadlines
from queryserve.server.http_types import HttpLimits, RejectionReason, Request

log = logging.getLogger(__name__)

# `head_bytes` when no request head is incomplete, and when one began in the slice being fed.
_NO_HEAD = -2
_HEAD_BEGAN = -1


ONCE = frozenset(("host", "authorization", "content-length", "transfer-encoding", "origin"))
"""Fields a request may carry once (RFC 9112 3.2 for Host): with two, a proxy that read the
first and this server, which kept the last, disagreed on the host, the key, where the body
ends (`Transfer-Encoding: identity` then `chunked` was read as chunked, one line of both a
501) or which page sent it."""


def _decoded(path: str) -> str:
    """A percent-encoded path decoded, but for its encoded slashes: decoded, `/v2%2Frepository/
    models/x/unload` reached the repository routes past a proxy that matched the raw path
    (Envoy keeps `%2F` as it is by default). No route has a `%2F` in it: such a path is a 404."""
    if "%2f" not in path.lower():
        return unquote(path)
    return "%2F".join(unquote(part) for part in re.split("%2[fF]", path))


class _Stop(Exception):
    """Raised from a parser callback once the request is refused: the parser reads no further."""


class RequestSink(Protocol):
    """Where the parser's requests and refusals go (`HttpConnection`)."""

    rejected: bool  # read nothing more: a request parsed now is not answered

    def received(self, request: Request, keep_alive: bool) -> None:
        """A request is read whole."""
        ...

    def continue_expected(self) -> None:
        """The request head asks for `100 Continue` before it sends its body."""
        ...

    def screened(self) -> bool:
        """The request's head is whole: whether the application refused it from the head
        alone (then it is answered, and nothing more is read)."""
        ...

    def upgrade_requested(self) -> None:
        """The request asks for another protocol; the parser reads nothing after it."""
        ...

    def refuse(self, status: int, message: str, reason: RejectionReason) -> None:
        """Answer with an error and close; count the refusal under `reason`."""
        ...


class RequestParser:
    """httptools' callbacks for one connection: each request, checked as it streams in."""

    def __init__(self, sink: RequestSink, limits: HttpLimits, deadlines: Deadlines) -> None:
        self.sink = sink
        self.deadlines = deadlines
        self.max_body_bytes = limits.max_body_bytes
        self.max_url_bytes = limits.max_url_bytes
        self.max_header_bytes = limits.max_header_bytes
        self.parser = httptools.HttpRequestParser(self)
        self.in_message = False  # a request is partly read
        self.head_bytes = _NO_HEAD  # bytes fed while the current request head is incomplete
        # A request that asked to upgrade (`curl --http2` on http://: Upgrade: h2c) with a
        # body: llhttp ends the message at its head and leaves the body unparsed, as the new
        # protocol's. Upgrade is ignored here (RFC 9110 7.8): its body is read raw, then the
        # request is answered as HTTP/1.1 and the connection closed.
        self.upgrading: tuple[Request, int] | None = None  # the request, body bytes to come
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.fields = self.headers  # where header lines go; a chunked body's trailers, apart
        self.header_bytes = 0  # the head's header lines, then its trailers'
        self.body: bytes | bytearray = b""  # most bodies arrive in one piece: kept as is
        self.body_bytes = 0
        self.chunked_fed = -1  # bytes fed since a chunked body's head began; -1: none
        self.chunks = 0
        self.http10 = False  # the request is HTTP/1.0 (its keep-alive must be said)
        self.target = ("/", "")  # the request's path (decoded) and query, from its head

    def tiny_chunks(self) -> bool:
        """The body being read came in hundreds of chunks of a few bytes each (the transport
        gives such a body turns of the loop last: `connection.YIELD_S`)."""
        return self.chunks > 256 and self.body_bytes < 64 * self.chunks

    def feed(self, data: bytes | memoryview) -> None:
        """Parse `data`; a request read whole goes to the sink, a bad one is refused."""
        if self.upgrading is not None:
            self._upgrade_body(data)
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self.upgrading is not None:
                self._upgrade_body(data[exc.args[0]:])
            else:
                self.sink.upgrade_requested()
            return
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):  # a bug of ours, not the client's
                log.error("unhandled error parsing a request", exc_info=exc.__context__)
                self.sink.refuse(500, "internal server error", "internal_error")
            return
        except httptools.HttpParserError as exc:
            if not self.sink.rejected:  # else the bytes come after the last request: unread
                self.sink.refuse(400, f"malformed HTTP request: {exc}", "bad_request")
            return
        if self.chunked_fed >= 0:
            self.chunked_fed += len(data)
            framing = self.chunked_fed - self.body_bytes
            if framing > 2 * self.max_header_bytes + 16 * self.chunks + 2 * self.body_bytes:
                self.sink.refuse(413, "the chunked body's framing (chunk sizes and extensions) "
                                      "is too large for its content", "body_too_large")
                return
        if self.head_bytes != _NO_HEAD:
            # A head (or a chunked body's trailers) is still incomplete and the parser holds its
            # bytes, as a header value is buffered until its line ends: count them now.
            if self.head_bytes == _HEAD_BEGAN:
                self.head_bytes = 0  # it began in this slice: its share is under one slice
            else:
                self.head_bytes += len(data)
                if self.head_bytes > self.max_header_bytes:
                    self.sink.refuse(431, f"request headers (or trailers) are over the limit of "
                                          f"{self.max_header_bytes} bytes", "headers_too_large")

    def path(self) -> str:
        """The request's path as far as it was read (for a refusal's wording); "" if none."""
        return self.url.split(b"?", 1)[0].decode("latin-1")

    def method(self) -> str:
        return self.parser.get_method().decode("ascii")

    def _target(self) -> tuple[str, str]:
        """The path (decoded) and query of the request's target, read once its head is whole
        (the application screens the head: `RequestSink.screened`)."""
        try:
            parsed = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            self._refuse(400, f"request target {self.url[:200]!r} is not a path", "bad_request")
        # An absolute-form target with no path ("http://host") means "/"; its authority is
        # the request's host, whatever Host says (RFC 9112 3.2.2): the Host check reads it.
        path = parsed.path.decode("utf-8", "replace") if parsed.path else "/"
        if parsed.host:
            host = parsed.host.decode("latin-1")
            self.headers["host"] = f"{host}:{parsed.port}" if parsed.port else host
        return (_decoded(path) if "%" in path else path,
                (parsed.query or b"").decode("utf-8", "replace"))

    def _upgrade_body(self, data: bytes | memoryview) -> None:
        assert self.upgrading is not None
        request, left = self.upgrading
        if left <= 0:
            return  # answered already: what follows is not read
        self._add_body(bytes(data[:left]))
        left -= len(data)
        self.upgrading = request, left
        if left <= 0:
            request.body = bytes(self.body)
            self.sink.received(request, False)

    def _refuse(self, status: int, message: str, reason: RejectionReason) -> NoReturn:
        """From a parser callback: answer with an error, close, and stop the parser."""
        self.sink.refuse(status, message, reason)
        raise _Stop

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.head_bytes = _HEAD_BEGAN
        self.deadlines.head_began()
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
        key = name.decode("latin-1").lower()
        if key in ONCE and key in self.fields:
            self._refuse(400, f"the request has more than one {key} field", "bad_request")
        # Whitespace around a value is not part of it (RFC 9112 5.1): kept, `Host: x ` was a
        # 403 and `Content-Length: 73 ` a 400.
        self.fields[key] = value.decode("latin-1").strip(" \t")

    def on_headers_complete(self) -> None:
        self.head_bytes = _NO_HEAD
        self.deadlines.head_started = None
        if self.sink.rejected:
            return
        length = self.headers.get("content-length")
        if length is not None:
            # llhttp checks it too; ASCII digits only here, as `int` refuses '²' that isdigit takes
            if not (length.isascii() and length.isdigit()):
                self._refuse(400, f"Content-Length {length!r} is not a number of bytes",
                             "bad_request")
            if int(length) > self.max_body_bytes:
                self._refuse(413, f"request body of {length} bytes is over the limit of "
                                  f"{self.max_body_bytes} bytes (serve --max-body-bytes)",
                             "body_too_large")
        version = self.parser.get_http_version()
        self.http10 = version == "1.0"
        if version != "1.1" and not self.http10:
            self._refuse(505, f"HTTP/{version} is not served here: send HTTP/1.1",
                         "bad_request")
        if "host" not in self.headers and not self.http10:
            self._refuse(400, "an HTTP/1.1 request needs a Host field", "bad_request")
        coding = self.headers.get("transfer-encoding")
        if coding is not None and self.http10:
            # HTTP/1.0 has no transfer codings (RFC 9112 6.1: faulty framing): an HTTP/1.0
            # proxy before this server reads the chunks as the body, and the two disagree on
            # where the next request begins.
            self._refuse(400, "an HTTP/1.0 request cannot be chunked: send Content-Length",
                         "bad_request")
        if coding is not None:
            # llhttp reads the chunks of `gzip, chunked` and leaves the gzip to us: its bytes
            # were read as the body.
            if coding.lower() != "chunked":
                self._refuse(501, f"transfer coding {coding[:100]!r} is not supported: send "
                                  "the body as it is, or chunked", "bad_request")
            if self.parser.should_upgrade():
                self._refuse(400, "a chunked body with Upgrade is not read: this server "
                                  "speaks HTTP/1.1; send it without Upgrade", "upgrade")
            self.chunked_fed = 0
        self.target = self._target()
        if self.sink.screened():
            raise _Stop
        expect = self.headers.get("expect")
        if expect is not None:
            if expect.lower() != "100-continue":
                self._refuse(417, f"the expectation {expect[:100]!r} cannot be met: this "
                                  "server knows 100-continue", "bad_request")
            if not self.http10:  # an HTTP/1.0 client may take a 100 for the answer
                self.sink.continue_expected()

    def on_chunk_header(self) -> None:
        # The last chunk's header is followed by trailers, which httptools buffers as it does
        # headers: count what follows as a head until body bytes come.
        self.head_bytes = _HEAD_BEGAN
        self.chunks += 1
        # Trailers come only after the last chunk's header: they go here, out of the headers,
        # and are dropped (a new dict here costs nothing to a request without a chunked body).
        self.fields = {}

    def on_body(self, body: bytes) -> None:
        self.head_bytes = _NO_HEAD
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            self._refuse(413, f"request body is over the limit of {self.max_body_bytes} bytes "
                              "(serve --max-body-bytes)", "body_too_large")
        self._add_body(body)

    def _add_body(self, piece: bytes) -> None:
        if not self.body:
            self.body = piece
        elif isinstance(self.body, bytearray):
            self.body += piece
        else:
            self.body = bytearray(self.body) + piece

    def on_message_complete(self) -> None:
        self.in_message = False
        self.head_bytes = _NO_HEAD  # after trailers
        self.chunked_fed = -1
        if self.sink.rejected:
            return
        path, query = self.target
        request = Request(
            method=self.method(),
            path=path,
            query=query,
            headers=self.headers,
            body=self.body if isinstance(self.body, bytes) else bytes(self.body),
        )
        length = int(self.headers.get("content-length") or 0)
        if self.parser.should_upgrade() and length > 0:
            self.upgrading = request, length  # its body follows, unparsed: see `upgrading`
            return
        self.sink.received(request, self.parser.should_keep_alive())
