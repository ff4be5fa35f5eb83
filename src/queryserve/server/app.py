"""The application: every front end's routes on one router, and the one place where an error
becomes a response.

Front ends are adapters, one module per protocol: KServe v2 HTTP (`kserve_http`), OpenAI's
embeddings (`openai`), the task routes (`tasks`), Prometheus (`metrics`) and the web pages
(`pages`). Each is decode -> `model.infer` -> encode over the model API; none knows another,
and the transport (`http.py`) knows none of them.
"""

from __future__ import annotations

import logging

from queryserve.errors import QueryServeError
from queryserve.repository import ModelRepository
from queryserve.server import kserve_http, metrics, openai, pages, tasks
from queryserve.server.http import Request, Response, json_error
from queryserve.server.routing import Limits, Router, ServerState

log = logging.getLogger(__name__)

FRONT_ENDS = (kserve_http, openai, tasks, metrics, pages)


class ServerApp:
    def __init__(self, repository: ModelRepository, limits: Limits | None = None) -> None:
        self.state = ServerState(repository, limits or Limits())
        self.router = Router()
        for front_end in FRONT_ENDS:
            front_end.add_routes(self.router, self.state)

    async def __call__(self, request: Request) -> Response:
        try:
            return await self.router(request)
        except QueryServeError as exc:
            response = json_error(exc.http_status, exc.message)
            response.headers.extend(exc.headers.items())
            return response
        except Exception:
            log.exception("error answering %s %s", request.method[:20], request.path[:200])
            return json_error(500, "internal server error")
