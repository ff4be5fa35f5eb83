"""What the OpenAI-style routes share (`openai`, `rerank`): the paths that answer OpenAI's error
object, that object, and the model a request names as OpenAI's SDKs expect a missing one
(`model_not_found`).

OpenAI's SDKs read an error body as `{"error": {"message", "type", "param", "code"}}`
(`openai._exceptions.APIError` sets `e.type`, `e.param`, `e.code`; `e.status_code` is the
HTTP status). The status stays the error's own (`queryserve.errors`) and so do its headers, so
the SDK's retries on 429 and 503 still honour Retry-After. `type` follows from the status;
`param` (the request field at fault) and `code` (a reason a program can test, such as
`model_not_found`) come from a `DetailedError` where the route knows them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import orjson

from queryserve.errors import InvalidInput, NotFound, QueryServeError
from queryserve.model import AnyModel, Model
from queryserve.server.http import Response
from queryserve.server.state import ServerState

T = TypeVar("T")

PATHS = ("/v1/embeddings", "/embeddings", "/v1/models", "/models", "/v1/rerank", "/rerank")
"""The routes (and what lies below them, `/v1/models/{id}`) whose errors are OpenAI's object.
The unprefixed ones are Infinity's defaults."""

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "invalid_request_error", 429: "rate_limit_error"}
"""OpenAI's error `type` by status; any other 4xx is `invalid_request_error`, a 5xx
`server_error`."""
CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
"""The `code` a status implies when the error names none."""


class DetailedError(QueryServeError):
    """An error as OpenAI reports it: another error's message, status and headers, with the
    request field at fault (`param`) and a reason a program can test (`code`)."""

    def __init__(self, error: QueryServeError, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(error.message, error.headers)
        self.http_status = error.http_status
        self.grpc_code = error.grpc_code
        self.outcome = error.outcome
        self.param = param
        self.code = code


def invalid(message: str, param: str) -> DetailedError:
    """A 400 about one field of the request."""
    return DetailedError(InvalidInput(message), param=param)


@contextmanager
def about(param: str) -> Iterator[None]:
    """Invalid input found inside (by the shared checks, or by the model) is about `param`."""
    try:
        yield
    except InvalidInput as exc:
        raise DetailedError(exc, param=param) from None


def owns(path: str) -> bool:
    path = path.rstrip("/")
    return any(path == p or path.startswith(p + "/") for p in PATHS)


def error_response(error: QueryServeError) -> Response:
    """The error as OpenAI's object, with the error's status (the headers are the caller's)."""
    status = error.http_status
    detailed = error if isinstance(error, DetailedError) else None
    kind = TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return Response(status, orjson.dumps({"error": {
        "message": error.message, "type": kind,
        "param": detailed.param if detailed else None,
        "code": (detailed.code if detailed else None) or CODES.get(status)}}))


# -- models by the names clients call them ----------------------------------------------------


def find_model(state: ServerState, name: str) -> AnyModel:
    """The model `name` calls (`ServerState.model`: aliases included), with OpenAI's
    `model_not_found` for a name the server does not serve, a path or a page included; a known
    model not loaded now stays a 503."""
    try:
        return state.model(name)
    except NotFound as exc:
        raise DetailedError(exc, param="model", code="model_not_found") from None
    except InvalidInput:  # not even a model name
        raise DetailedError(state.unknown_model(name), param="model",
                            code="model_not_found") from None


def model_for(state: ServerState, body: dict[str, Any], kind: type[T], route: str,
              example: str) -> tuple[str, Model[T]]:
    """The name the body's `model` gives (what the answer echoes), and the model it calls,
    checked to answer `kind` on `route`."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise invalid(f"'model' must name a model, e.g. {example}", "model")
    with about("model"):
        return name, find_model(state, name).answering(kind, route)
