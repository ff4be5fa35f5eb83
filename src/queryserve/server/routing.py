"""HTTP routing, and what the HTTP front ends share: JSON in and out. (What every front end,
gRPC too, shares is the server's state, `state.py`.)

A front end (one module per protocol) adds its routes to a `Router`: exact paths, or patterns
whose named groups are passed to the handler. The router answers 404 for an unknown path and
405, with Allow, for a known path asked with another method, so no handler checks its method.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from queryserve.errors import InvalidInput, MethodNotAllowed, NotFound
from queryserve.server.http import Request, Response
from queryserve.server.http_types import check_uncompressed

Handler = Callable[[Request], Awaitable[Response]]
PatternHandler = Callable[..., Awaitable[Response]]
"""Called with the request and the pattern's named groups as keyword arguments."""


class Router:
    def __init__(self) -> None:
        self.exact: dict[str, dict[str, Handler]] = {}
        self.patterns: list[tuple[re.Pattern[str], dict[str, PatternHandler]]] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        self.exact.setdefault(path, {})[method] = handler

    def add_pattern(self, method: str, pattern: str, handler: PatternHandler) -> None:
        for compiled, handlers in self.patterns:
            if compiled.pattern == pattern:
                handlers[method] = handler
                return
        self.patterns.append((re.compile(pattern), {method: handler}))

    async def __call__(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        # HEAD is answered as GET (the transport sends no body, RFC 9110 9.3.2); the request
        # keeps its method for the access log and the span.
        method = "GET" if request.method == "HEAD" else request.method
        handlers = self.exact.get(path)
        if handlers is not None:
            handler = handlers.get(method)
            if handler is None:
                raise _not_allowed(request, handlers)
            return await handler(request)
        for pattern, by_method in self.patterns:
            if match := pattern.fullmatch(path):
                if method not in by_method:
                    raise _not_allowed(request, by_method)
                groups = match.groupdict()
                request.model = groups.get("name")
                return await by_method[method](request, **groups)
        raise NotFound(f"no route {request.method} {path[:200]}")


def _not_allowed(request: Request, handlers: dict[str, Any]) -> MethodNotAllowed:
    allowed = sorted({*handlers, "HEAD"} if "GET" in handlers else handlers)  # HEAD is GET's
    return MethodNotAllowed(f"{request.method[:20]} is not allowed on {request.path[:200]}; "
                            f"use {' or '.join(allowed)}", ", ".join(allowed))


def json_response(payload: object, status: int = 200) -> Response:
    """Dataclasses, numpy arrays and plain values as JSON (orjson serializes both natively)."""
    return Response(status, orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY))


def json_body(request: Request, example: str) -> dict[str, Any]:
    """The body as a JSON object; anything else is a 400 that shows what to send."""
    check_uncompressed(request.headers)
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput(f"the body must be a JSON object, e.g. {example}")
    model = body.get("model")
    if request.model is None and isinstance(model, str):  # the access log's, read once here
        request.model = model[:100]
    return body
