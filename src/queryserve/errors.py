"""The one error hierarchy, and its one mapping to HTTP status and gRPC code.

Every error a client can see is a `QueryServeError`, carrying its own status, gRPC code and
response headers (as starlette's `HTTPException(status_code, detail, headers)` does): the front
ends never decide a status or a header themselves. Anything else that escapes is a bug: it is
logged and answered as a bare 500 whose message leaks no internals.
"""

from __future__ import annotations

from collections.abc import Mapping


class QueryServeError(Exception):
    """Base of every error queryserve reports to a client or a user."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"
    outcome: str = "error"  # the `outcome` label of the request counter

    def __init__(self, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers) if headers else {}
        """Response headers the error needs (Retry-After, Allow), lower-case names."""


class InvalidInput(QueryServeError):
    """The request is malformed: bad JSON, wrong shape or datatype, empty or non-UTF-8 text."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    outcome = "invalid"


class QueryTooLong(InvalidInput):
    """A query longer than the model takes (the spelling channel's `max_words`); the search
    pipeline catches it and searches the query as typed."""


class PayloadTooLarge(InvalidInput):
    """The body is over the server's size limit, or carries more items than allowed."""

    http_status = 413


class UnsupportedMediaType(InvalidInput):
    """A Content-Encoding or Content-Type the server does not read."""

    http_status = 415


class NotFound(QueryServeError):
    """An unknown model, version or route."""

    http_status = 404
    grpc_code = "NOT_FOUND"
    outcome = "not_found"


class Unauthorized(QueryServeError):
    """No API key, or not one of the server's (`--api-key`): a 401 with the challenge RFC 6750
    asks for."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"
    outcome = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, {"www-authenticate": 'Bearer realm="queryserve"'})


class Forbidden(QueryServeError):
    """A request the server refuses to answer whoever sends it: a Host it does not answer to
    (DNS rebinding) or a browser's cross-origin request from an origin not allowed."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"
    outcome = "forbidden"


class MethodNotAllowed(QueryServeError):
    """A known route asked with another method; `allow` names the methods it takes (the
    Allow header HTTP requires on a 405)."""

    http_status = 405
    grpc_code = "UNIMPLEMENTED"
    outcome = "invalid"

    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message, {"allow": allow})


class Unavailable(QueryServeError):
    """The model exists but cannot take the request now (loading, unloading, shutting down).

    Clients should back off for `retry_after_s` seconds (sent as Retry-After).
    """

    http_status = 503
    grpc_code = "UNAVAILABLE"
    outcome = "unavailable"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, {"retry-after": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class Retired(Unavailable):
    """The model was taken out of service (unloaded, or replaced by a reload) before the
    request was queued on it."""


class Overloaded(Unavailable):
    """The model's queue is full: admission control rejected the request (Triton's answer)."""

    outcome = "rejected"


class RequestTimeout(Unavailable):
    """The request waited in the queue past its timeout and was never run."""

    outcome = "timeout"


class ModelFailed(QueryServeError):
    """The backend raised while running a batch; only that batch's requests see this."""

    outcome = "failed"


class ConfigError(QueryServeError):
    """A model repository file is invalid; the message names the file, field, value and fix."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class ExportError(QueryServeError):
    """Preparing a model failed, e.g. an export that misses its accuracy gate."""


class BenchError(QueryServeError):
    """A load test or sweep cannot run: a bad option, a missing queries file, no server."""


class ServeError(QueryServeError):
    """The server cannot start: its address is taken or not this machine's, or a file it must
    write cannot be written."""
