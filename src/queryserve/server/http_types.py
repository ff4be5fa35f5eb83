"""The HTTP transport's vocabulary: the request a handler is given, the response it returns, the
limits (`HttpLimits`) a server holds its clients to, which each connection enforces, and the
reasons (`RejectionReason`) it refuses a client for.

Import these from `queryserve.server.http`, the transport's public face.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, get_args

import orjson

from queryserve.errors import ConfigError, UnsupportedMediaType

MAX_BODY_BYTES = 8 * 1024 * 1024  # a batch of texts is far smaller; a body this big is a mistake
MAX_URL_BYTES = 8 * 1024  # what common servers and proxies accept (nginx: 8 KiB a line)
MAX_HEADER_BYTES = 64 * 1024  # the request head, request line included
READ_TIMEOUT_S = 30.0  # a request begun may pause this long before it is refused (408)
IDLE_TIMEOUT_S = 300.0  # a keep-alive connection with nothing to do is closed after this
HEADER_TIMEOUT_S = 10.0  # a request head must arrive whole within this of its first byte
MAX_CONNECTION_AGE_S = 60.0
"""A client keeps a connection (HTTP keep-alive, or a gRPC channel's one HTTP/2 connection) for
as long as it can, and the kernel (SO_REUSEPORT, between workers) or a Kubernetes Service
(between pods) placed it once: without an end to it, the workers or replicas that came up
after a client connected (a replaced worker, a scale-up) get none of its requests. At this
age an HTTP connection is closed after its next answer (`connection: close`) and a gRPC one
gets a GOAWAY (grpc adds +-10% jitter) once its calls finish; the client reconnects on its own
and is placed afresh. Once a minute costs a client one connection set-up."""

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
    "evicted",  # closed at the cap to make room for a newcomer: silent, or idle between requests
]
"""Why the transport refused a request or a connection before any handler saw it."""

CLIENT_CLOSED = 499
"""nginx's status for a request whose client left before its answer: how the access log
records one, over HTTP and gRPC alike."""
REJECTION_REASONS: tuple[RejectionReason, ...] = get_args(RejectionReason)


def _default_max_connections() -> int:
    """Half the process's file descriptors, the rest left for models, logs and the listener."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(1, min(4096, soft // 2))


class ConnectionShare(Protocol):
    """The HTTP connections of all the server's workers, shared between them
    (`workers.peers.Seat`): what lets a worker that holds too many hand some back."""

    def hold(self, connections: int) -> None:
        """This worker holds `connections` now."""
        ...

    def over(self, connections: int) -> bool:
        """Holding `connections` is more than this worker's share."""
        ...


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What the transport accepts from a client; each limit, once passed, is refused with its own
    status and the connection is closed."""

    max_body_bytes: int = MAX_BODY_BYTES
    """A request body over this is refused with 413."""
    read_timeout_s: float = READ_TIMEOUT_S
    """A request begun that stops arriving for this long gets a 408; a client that takes none of
    its answers for this long is dropped."""
    idle_timeout_s: float = IDLE_TIMEOUT_S
    """A keep-alive connection with no request for this long is closed."""
    header_timeout_s: float = HEADER_TIMEOUT_S
    """A request head (request line and headers) must complete within this of its first byte,
    and a new connection must send its first head within this: else 408 (or a bare close for a
    connection that sent nothing)."""
    max_url_bytes: int = MAX_URL_BYTES
    """A request target over this is refused with 414 as it streams in."""
    max_header_bytes: int = MAX_HEADER_BYTES
    """A request head over this is refused with 431 as it streams in."""
    max_connections: int = field(default_factory=_default_max_connections)
    """Connections over this are answered 503 and closed at once (`HttpServer.refused`)."""
    max_connection_age_s: float = MAX_CONNECTION_AGE_S
    """A connection older than this is ended after its next answer (HTTP) or once its calls
    finish (gRPC); `math.inf`: never."""

    def __post_init__(self) -> None:
        for limit in fields(self):
            value = getattr(self, limit.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"HTTP limit '{limit.name}' is {value!r}; expected a number > 0")


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    id: str = ""
    """The request id (`x-request-id`, taken or made), set by the application."""
    model: str | None = None
    """The model a route names in its path, set by the router (for the access log)."""
    screened: bool = False
    """Its head passed the application's `Screen` (the transport ran it): not checked again."""


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def json_error(status: int, message: str) -> Response:
    return Response(status, orjson.dumps({"error": message}))


Screen = Callable[[str, str, dict[str, str]], "Response | None"]
"""What the application refuses from a request's head alone (method, path, headers): the API
key, the Host, the Origin. Its answer goes out before the body is read (and before `100
Continue`); None lets the request on. Checked after the body, a client with no key had 8 MiB
read (and, with an access log, parsed) before its 401."""
Refusal = Callable[[str, dict[str, str], int, str], Response]
"""How the application words an error that the transport answers itself (a malformed request,
a body over the limit, a read timeout): from the request's path and headers as far as they
were read, the status and the message. The server's words it in each front end's own shape,
with a request id and CORS headers, as it does every answer."""


def plain_refusal(path: str, headers: dict[str, str], status: int, message: str) -> Response:
    return json_error(status, message)


def check_uncompressed(headers: dict[str, str]) -> None:
    """A body is read as sent: a compressed one is refused (415), not misread as JSON."""
    encoding = headers.get("content-encoding")  # mostly absent: nothing more to do
    if encoding is not None and encoding.strip().lower() not in ("identity", ""):
        raise UnsupportedMediaType("compressed request bodies are not supported; "
                                   "send them uncompressed")
