"""The KServe v2 / Triton HTTP front end: health, server and model metadata, model config,
`infer` (JSON and the binary tensor extension), statistics, the repository extension.

Every model, the search ensemble included, is served the same way: decode the body into the
protocol's parts (`kserve_json.py`) -> the operation, which the gRPC front end shares
(`kserve_service.py`: the model by name or alias, the request built and checked by
`kserve.py`, the item limit, `model.infer`, the outputs asked for) -> encode. The request's
`parameters` reach the model as its options (`top_k`, `threshold`, `k`...).
"""

from __future__ import annotations

from typing import Any

from queryserve.api import as_json
from queryserve.errors import InvalidInput, NotFound
from queryserve.repository import shown
from queryserve.server import kserve, kserve_json
from queryserve.server.http import Request, Response
from queryserve.server.kserve_service import KServeService
from queryserve.server.routing import Router, json_body, json_response
from queryserve.server.state import ServerState

_MODEL = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"


def add_routes(router: Router, state: ServerState) -> None:
    routes = KServeRoutes(state)
    router.add("GET", "/v2", routes.server_metadata)
    router.add("GET", "/v2/health/live", routes.live)
    router.add("GET", "/v2/health/ready", routes.ready)
    router.add("GET", "/v2/models/stats", routes.all_stats)
    router.add("POST", "/v2/repository/index", routes.repository_index)
    router.add_pattern("POST", _MODEL + "/infer", routes.infer)  # first: the hot path tries it
    router.add_pattern("GET", _MODEL, routes.metadata)
    router.add_pattern("GET", _MODEL + "/ready", routes.model_ready)
    router.add_pattern("GET", _MODEL + "/config", routes.config)
    router.add_pattern("GET", _MODEL + "/stats", routes.stats)
    router.add_pattern("POST", r"/v2/repository/models/(?P<name>[^/]+)/load", routes.load)
    router.add_pattern("POST", r"/v2/repository/models/(?P<name>[^/]+)/unload", routes.unload)


class KServeRoutes:
    """The KServe v2 routes' handlers, one method each, over the server's state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.service = KServeService(state)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(kserve.server_metadata())

    async def live(self, request: Request) -> Response:
        return Response(200)

    async def ready(self, request: Request) -> Response:
        return Response(200 if self.service.ready() else 503)

    async def model_ready(self, request: Request, name: str, version: str | None) -> Response:
        try:
            return Response(200 if self.service.model_ready(name, version) else 400)
        except NotFound:  # KServe's answer is the status alone
            return Response(404)

    async def metadata(self, request: Request, name: str, version: str | None) -> Response:
        return json_response(self.service.metadata(name, version))

    async def config(self, request: Request, name: str, version: str | None) -> Response:
        return json_response(self.service.config(name, version))

    async def stats(self, request: Request, name: str, version: str | None) -> Response:
        return json_response({"model_stats": await self.service.statistics(name, version)})

    async def all_stats(self, request: Request) -> Response:
        return json_response({"model_stats": await self.service.statistics()})

    async def infer(self, request: Request, name: str, version: str | None) -> Response:
        answer = await self.service.infer(name, version, lambda config, max_items: (
            kserve_json.decode_infer_request(request.body, request.headers, config,
                                             max_items)))
        body, header_length = kserve_json.encode_infer_response(answer)
        if header_length is None:
            return Response(200, body)
        return Response(200, body, "application/octet-stream",
                        [(kserve_json.HEADER_LENGTH, str(header_length))])

    async def repository_index(self, request: Request) -> Response:
        ready = _optional_body(request, '{"ready": true}').get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput(f"'ready' must be true or false, got {as_json(ready)}")
        return json_response(self.service.index(ready))

    async def load(self, request: Request, name: str) -> Response:
        await self.service.load(name, _parameters(request))
        return Response(200)

    async def unload(self, request: Request, name: str) -> Response:
        await self.service.unload(name, _parameters(request))
        return Response(200)


def _optional_body(request: Request, example: str) -> dict[str, Any]:
    """The repository routes' JSON object, which a client may leave out."""
    return json_body(request, example) if request.body.strip() else {}


def _parameters(request: Request) -> dict[str, Any]:
    body = _optional_body(request, '{"parameters": {}}')
    if unknown := sorted(set(body) - {"parameters"}):  # a misspelt "paramters": ignored, 200
        raise InvalidInput(f"unknown field '{shown(unknown[0])}' in the request; the body is "
                           '{"parameters": {...}}')
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput(f"'parameters' must be an object, got {as_json(parameters)}")
    return parameters
