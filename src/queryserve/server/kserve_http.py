"""The KServe v2 / Triton HTTP front end: health, server and model metadata, model config,
`infer` (JSON and the binary tensor extension), statistics, the repository extension.

Every model, the search ensemble included, is served the same way: decode the tensors against
the model's config (`kserve.py`) -> `model.infer` -> the result as the model's declared
outputs -> encode. The request's `parameters` reach the model as its options (`top_k`,
`threshold`, `k`...).
"""

from __future__ import annotations

from queryserve import __version__
from queryserve.api import Inputs, decode_texts
from queryserve.errors import InvalidInput
from queryserve.pipelines.model import AnyModel
from queryserve.repository import VERSION
from queryserve.server import kserve
from queryserve.server.http import Request, Response
from queryserve.server.routing import Router, ServerState, json_response

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]
_MODEL = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"


def add_routes(router: Router, state: ServerState) -> None:
    repository = state.repository

    async def server_metadata(request: Request) -> Response:
        return json_response({"name": "queryserve", "version": __version__,
                              "extensions": EXTENSIONS})

    async def live(request: Request) -> Response:
        return Response(200)

    async def ready(request: Request) -> Response:
        return Response(200 if state.ready() else 503)

    async def model_ready(request: Request, name: str, version: str | None) -> Response:
        model = repository.models.get(name)
        if model is not None and version in (None, VERSION) and model.ready():
            return Response(200)
        return Response(400 if repository.exists(name) else 404)

    async def metadata(request: Request, name: str, version: str | None) -> Response:
        return json_response(kserve.model_metadata(repository.get(name, version).config,
                                                   VERSION))

    async def config(request: Request, name: str, version: str | None) -> Response:
        model = repository.get(name, version)
        return json_response(kserve.triton_config(model.config, model.threads))

    async def stats(request: Request, name: str, version: str | None) -> Response:
        model = repository.get(name, version)
        return json_response({"model_stats": [model.stats.as_triton_json(model.name, VERSION)]})

    async def all_stats(request: Request) -> Response:
        return json_response({"model_stats": [m.stats.as_triton_json(m.name, VERSION)
                                              for m in repository.models.values()]})

    async def infer(request: Request, name: str, version: str | None) -> Response:
        model = repository.get(name, version)
        parsed = kserve.decode_infer_request(request.body, request.headers, model.config)
        result = await model.infer(_inputs(parsed, model, state))
        body, header_length = kserve.encode_infer_response(
            model.config, VERSION, parsed, model.tensors(result))
        if header_length is None:
            return Response(200, body)
        return Response(200, body, "application/octet-stream",
                        [(kserve.HEADER_LENGTH, str(header_length))])

    async def repository_index(request: Request) -> Response:
        return json_response(repository.index())

    async def load(request: Request, name: str) -> Response:
        await repository.load(name)
        return Response(200)

    async def unload(request: Request, name: str) -> Response:
        repository.unload(name)
        return Response(200)

    router.add("GET", "/v2", server_metadata)
    router.add("GET", "/v2/health/live", live)
    router.add("GET", "/v2/health/ready", ready)
    router.add("GET", "/v2/models/stats", all_stats)
    router.add("POST", "/v2/repository/index", repository_index)
    router.add_pattern("POST", _MODEL + "/infer", infer)  # first: the hot path tries it first
    router.add_pattern("GET", _MODEL, metadata)
    router.add_pattern("GET", _MODEL + "/ready", model_ready)
    router.add_pattern("GET", _MODEL + "/config", config)
    router.add_pattern("GET", _MODEL + "/stats", stats)
    router.add_pattern("POST", r"/v2/repository/models/(?P<name>[^/]+)/load", load)
    router.add_pattern("POST", r"/v2/repository/models/(?P<name>[^/]+)/unload", unload)


def _inputs(parsed: kserve.InferRequest, model: AnyModel, state: ServerState) -> Inputs:
    """The first input's texts, and the second's for a model that takes pairs (same count)."""
    specs = model.config.inputs
    raw = parsed.inputs[specs[0].name]
    state.check_items(len(raw))
    texts = decode_texts(list(raw), f"input '{specs[0].name}'")
    pairs = None
    if len(specs) > 1:
        pairs = decode_texts(list(parsed.inputs[specs[1].name]), f"input '{specs[1].name}'")
        if len(pairs) != len(texts):
            raise InvalidInput(
                f"inputs '{specs[0].name}' and '{specs[1].name}' must hold the same number of "
                f"texts; got {len(texts)} and {len(pairs)}")
    return Inputs(texts, pairs, parsed.parameters, parsed.timeout_s)
