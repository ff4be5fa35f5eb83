"""The application: every front end's routes on one router, what every request goes through
(its id, the access checks, CORS, the access log, a trace span), and the one place where an
error becomes a response.

Front ends are adapters, one module per protocol: KServe v2 HTTP (`kserve_http`), OpenAI's
embeddings and models (`openai`), Cohere-style rerank (`rerank`), the task routes (`tasks`),
Prometheus (`metrics`) and the web pages (`pages`). Each is decode -> `state.infer(model, ...)`
-> encode over the model API, the model found by `state.model` (aliases included); none knows
another, and the transport (`http.py`) knows none of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from queryserve.errors import QueryServeError
from queryserve.repository import ModelRepository
from queryserve.server import kserve_http, metrics, openai, openai_protocol, pages, rerank, tasks
from queryserve.server.access_log import AccessLog
from queryserve.server.http import Request, Response, json_error
from queryserve.server.http_types import CLIENT_CLOSED
from queryserve.server.routing import Router
from queryserve.server.security import PUBLIC_PREFIX, AccessControl
from queryserve.server.state import Limits, ServerState
from queryserve.server.tracing import Tracing

log = logging.getLogger(__name__)

FRONT_ENDS = (kserve_http, openai, rerank, tasks, metrics, pages)


class ServerApp:
    def __init__(self, repository: ModelRepository, limits: Limits | None = None,
                 auth: AccessControl | None = None, aliases: dict[str, str] | None = None,
                 access_log: AccessLog | None = None, tracing: Tracing | None = None) -> None:
        self.state = ServerState(repository, limits or Limits(), auth=auth or AccessControl(),
                                 aliases=aliases or {})
        self.router = Router()
        for front_end in FRONT_ENDS:
            front_end.add_routes(self.router, self.state)
        self.access_log = self.state.access_log = access_log
        self.tracing = self.state.tracing = tracing
        self.request_ids = self.state.request_ids

    async def __call__(self, request: Request) -> Response:
        access_log = self.access_log
        started = time.perf_counter() if access_log is not None else 0.0
        headers = request.headers
        request.id = self.request_ids.of(headers.get("x-request-id"))
        tracing = self.tracing
        span = tracing.start(request) if tracing is not None else None
        origin = headers.get("origin")
        auth = self.state.auth
        try:
            # A browser's request is checked even on a server with no key, hosts or origins
            # set (bound beyond loopback): a page the user visited unloaded its models.
            if auth.guarding or origin is not None:
                response = await self._guarded(request, origin)
            else:
                response = await self.router(request)
        except QueryServeError as exc:
            if exc.http_status == 500:  # the server's failure: which request met it
                log.error("request %s (%s %s) answered 500: %s", request.id,
                          request.method[:20], request.path[:200], exc.message)
            response = error_response(request.path, exc)
        except Exception:
            log.exception("error answering %s %s (request %s)", request.method[:20],
                          request.path[:200], request.id)
            response = error_response(request.path, QueryServeError("internal server error"))
        except asyncio.CancelledError:
            # The client left before its answer: logged and traced as nginx logs it (499),
            # or it vanished from every record, when clients timing out is what to look for.
            self._record(request, Response(CLIENT_CLOSED), started, span)
            raise
        self._sign(response, request.id, origin)
        if access_log is not None or tracing is not None:  # off: no call per request
            self._record(request, response, started, span)
        return response

    def _record(self, request: Request, response: Response, started: float,
                span: Any) -> None:
        """The request's access-log line and the end of its span, each when on."""
        if self.access_log is not None:
            self.access_log.write(request, response, time.perf_counter() - started)
        if self.tracing is not None:
            self.tracing.end(span, request, response)

    def refused(self, path: str, headers: dict[str, str], status: int,
                message: str) -> Response:
        """An answer the transport gives itself (`http_types.Refusal`), worded as the route's
        front end words its errors (OpenAI's object on its routes: the SDKs read its type),
        with a request id and, for an allowed page, CORS headers, as every answer has."""
        error = QueryServeError(message)
        error.http_status = status
        response = error_response(path, error)
        request_id = self.request_ids.of(headers.get("x-request-id"))  # as far as it was read
        self._sign(response, request_id, headers.get("origin"))
        if self.access_log is not None:  # an operator looks for these ("why did it fail")
            self.access_log.write(Request("-", path, "", headers, b"", request_id), response,
                                  0.0)
        return response

    def screen(self, method: str, path: str, headers: dict[str, str]) -> Response | None:
        """A request refused from its head alone (`http_types.Screen`): the Host, the Origin
        and the key, as `_guarded` checks them after the body (which then finds them passed).
        A CORS preflight is let on: the route answers it, key or none."""
        origin = headers.get("origin")
        preflight = method == "OPTIONS" and "access-control-request-method" in headers
        if not (self.state.auth.guarding or origin is not None) or preflight:
            return None
        try:
            self._check_head(path, headers, origin)
        except QueryServeError as exc:
            response = error_response(path, exc)
            request_id = self.request_ids.of(headers.get("x-request-id"))
            self._sign(response, request_id, origin)
            if self.access_log is not None:
                self.access_log.write(Request(method, path, "", headers, b"", request_id),
                                      response, 0.0)
            return response
        return None

    def _sign(self, response: Response, request_id: str, origin: str | None) -> None:
        """What every answer carries: its request id, and CORS headers for an allowed page."""
        response.headers.append(("x-request-id", request_id))
        auth = self.state.auth
        if origin is not None and auth.cors_origins and auth.cors_allows(origin):
            response.headers.extend(auth.cors_headers(origin))

    async def _guarded(self, request: Request, origin: str | None) -> Response:
        """A CORS preflight's answer, or the Host and Origin checks and the API key (unless
        the transport's `screen` ran them on the head); then the route."""
        headers = request.headers
        if origin is not None and request.method == "OPTIONS" and \
                "access-control-request-method" in headers:
            auth = self.state.auth
            auth.check_host(headers.get("host"))
            auth.check_origin(origin, headers.get("host"))
            return Response(204, headers=auth.preflight_headers(
                headers.get("access-control-request-headers", "")))
        if not request.screened:  # handed to the app directly (in process, a test)
            self._check_head(request.path, headers, origin)
        return await self.router(request)

    def _check_head(self, path: str, headers: dict[str, str], origin: str | None) -> None:
        """The Host and Origin checks and the API key, each refusal its own error."""
        auth = self.state.auth
        host = headers.get("host")
        auth.check_host(host)
        if origin is not None:
            auth.check_origin(origin, host)
        if not (path.startswith(PUBLIC_PREFIX) or path in pages.PAGES):
            auth.check_key(headers.get("authorization"))


def error_response(path: str, error: QueryServeError) -> Response:
    """The error as the front end that owns `path` writes one, with the headers it carries
    (Retry-After, Allow, WWW-Authenticate): OpenAI's error object on the OpenAI-style routes,
    whose SDKs read its `type`, `param` and `code`; `{"error": message}`, KServe's shape,
    everywhere else."""
    if openai_protocol.owns(path):
        response = openai_protocol.error_response(error)
    else:
        response = json_error(error.http_status, error.message)
    response.headers.extend(error.headers.items())
    return response
