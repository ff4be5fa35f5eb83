"""The KServe v2 / Triton HTTP front end: health, server and model metadata, model config,
`infer` (JSON and the binary tensor extension), statistics, the repository extension.

Every model, the search ensemble included, is served the same way: decode the tensors against
the model's config (`kserve_json.py` over `kserve.py`, the core the gRPC front end shares) ->
`model.infer` -> the result as the model's declared outputs (or, asked for, their top
classes) -> encode. The request's `parameters` reach the model as its options (`top_k`,
`threshold`, `k`...).
"""

from __future__ import annotations

from queryserve.repository import VERSION
from queryserve.server import kserve, kserve_json
from queryserve.server.http import Request, Response
from queryserve.server.routing import Router, json_response
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
        self.repository = state.repository

    async def server_metadata(self, request: Request) -> Response:
        return json_response(kserve.server_metadata())

    async def live(self, request: Request) -> Response:
        return Response(200)

    async def ready(self, request: Request) -> Response:
        return Response(200 if self.state.ready() else 503)

    async def model_ready(self, request: Request, name: str, version: str | None) -> Response:
        model = self.repository.models.get(name)
        if model is not None and version in (None, VERSION) and model.ready():
            return Response(200)
        return Response(400 if self.repository.exists(name) else 404)

    async def metadata(self, request: Request, name: str, version: str | None) -> Response:
        return json_response(kserve.model_metadata(self.repository.get(name, version).config,
                                                   VERSION))

    async def config(self, request: Request, name: str, version: str | None) -> Response:
        model = self.repository.get(name, version)
        return json_response(kserve.triton_config(model.config, model.threads))

    async def stats(self, request: Request, name: str, version: str | None) -> Response:
        model = self.repository.get(name, version)
        return json_response({"model_stats": kserve.statistics(await self.state.snapshot(),
                                                               [model.name])})

    async def all_stats(self, request: Request) -> Response:
        return json_response({"model_stats": kserve.statistics(await self.state.snapshot())})

    async def infer(self, request: Request, name: str, version: str | None) -> Response:
        model = self.repository.get(name, version)
        parsed = kserve_json.decode_infer_request(request.body, request.headers, model.config)
        result = await model.infer(kserve.model_inputs(parsed, model.config,
                                                       self.state.check_items))
        body, header_length = kserve_json.encode_infer_response(
            model.config, VERSION, parsed, model.tensors(result))
        if header_length is None:
            return Response(200, body)
        return Response(200, body, "application/octet-stream",
                        [(kserve_json.HEADER_LENGTH, str(header_length))])

    async def repository_index(self, request: Request) -> Response:
        return json_response(self.repository.index())

    async def load(self, request: Request, name: str) -> Response:
        await self.state.load(name)
        return Response(200)

    async def unload(self, request: Request, name: str) -> Response:
        await self.state.unload(name)
        return Response(200)
