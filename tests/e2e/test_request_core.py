"""What every route shares, end to end: one item limit and one model lookup (aliases
included), whichever route and protocol carried the request. A real server on 127.0.0.1 with
the prepared `embed`, `intent`, `spell` and `duplicates` models, real clients."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from queryserve.repository import ModelRepository
from queryserve.server.app import ServerApp
from tests.conftest import REPOSITORY, RunningServer, free_port, start_server, stop_server

MAX_ITEMS = 2
TOO_MANY = MAX_ITEMS + 1
REFUSAL = (f"the request has {TOO_MANY} items; at most {MAX_ITEMS} are allowed per request "
           "(serve --max-items)")
MODELS = ("embed", "intent", "spell", "duplicates")
ALIASES = {"my-embed": "embed", "my-intent": "intent", "my-spell": "spell",
           "my-duplicates": "duplicates"}

QUERIES = ["play some jazz", "wake me up at seven", "taylor swfit"][:TOO_MANY]
PAIRS = [["sony dsc-w120", "sony dscw120p"]] * TOO_MANY


def _kserve_json(texts: list[str]) -> dict[str, object]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts), 1],
                        "data": texts}]}


OVER_LIMIT: dict[str, dict[str, object]] = {
    "/v2/models/{name}/infer": _kserve_json(QUERIES),
    "/v1/spell": {"queries": QUERIES},
    "/v1/intent": {"queries": QUERIES},
    "/v1/duplicates": {"pairs": PAIRS},
    "/v1/embeddings": {"model": "embed", "input": QUERIES},
    "/embeddings": {"model": "embed", "input": [[101, 102]] * TOO_MANY},
    "/v1/rerank": {"model": "duplicates", "query": "sony", "documents": QUERIES},
    "/rerank": {"model": "duplicates", "query": "sony", "documents": QUERIES},
}
"""An over-limit request for each POST route that takes items."""

NO_ITEMS = {"/v1/search", "/v2/repository/index", "/v2/repository/models/{name}/load",
            "/v2/repository/models/{name}/unload"}
"""POST routes that take no list of items: a search is one query."""


@dataclass
class Served:
    http: RunningServer
    grpc_address: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default models are not prepared: run `make prepare` (make test does)")
    repository = tmp_path_factory.mktemp("core")
    for name in MODELS:
        (repository / name).symlink_to(REPOSITORY / name)
    address = f"127.0.0.1:{free_port()}"
    aliases = [f"--served-model-name={alias}={name}" for alias, name in ALIASES.items()]
    server = start_server(repository, repository / "server.log", "--grpc", address,
                          "--max-items", str(MAX_ITEMS), "--workers", "1", *aliases)
    yield Served(server, address)
    stop_server(server)


def _post_routes(tmp_path: Path) -> set[str]:
    """Every POST route the application serves, patterns written as `{name}`."""
    router = ServerApp(ModelRepository(tmp_path)).router
    routes = {path for path, handlers in router.exact.items() if "POST" in handlers}
    for pattern, handlers in router.patterns:
        if "POST" in handlers:
            path = re.sub(r"\(\?:/versions.*?\)\?", "", pattern.pattern)
            routes.add(re.sub(r"\(\?P<name>[^)]*\)", "{name}", path))
    return routes


def test_every_route_that_takes_items_is_covered(tmp_path: Path) -> None:
    """A route added later must say how its items are limited (here) or that it has none."""
    assert _post_routes(tmp_path) == set(OVER_LIMIT) | NO_ITEMS


def _message(body: dict[str, object]) -> object:
    error = body["error"]
    return error["message"] if isinstance(error, dict) else error  # OpenAI's object, KServe's


def test_an_over_limit_request_is_the_same_413_on_every_route(served: Served) -> None:
    with httpx.Client(base_url=served.http.url, timeout=60) as client:
        for route, body in OVER_LIMIT.items():
            for name in ("embed", "my-embed"):
                response = client.post(route.format(name=name), json=body)
                assert (route, response.status_code, _message(response.json())) == \
                    (route, 413, REFUSAL)
    # KServe's binary tensor extension, by Triton's own HTTP client
    http = triton_http.InferenceServerClient(served.http.host_port)
    tensor = triton_http.InferInput("text", [TOO_MANY, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[q.encode()] for q in QUERIES], dtype=object),
                               binary_data=True)
    with pytest.raises(InferenceServerException) as refused:
        http.infer("my-embed", [tensor])
    assert refused.value.status() == "413" and REFUSAL in str(refused.value.message())
    # and over gRPC, the same words under gRPC's status for a malformed request
    client = triton_grpc.InferenceServerClient(served.grpc_address)
    tensor = triton_grpc.InferInput("text", [TOO_MANY, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[q.encode()] for q in QUERIES], dtype=object))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("embed", [tensor])
    assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert refused.value.message() == REFUSAL


def test_an_alias_calls_its_model_on_every_route_and_over_grpc(served: Served) -> None:
    with httpx.Client(base_url=served.http.url, timeout=60) as client:
        kserve = client.post("/v2/models/my-intent/infer", json=_kserve_json(["play jazz"]))
        assert kserve.status_code == 200 and kserve.json()["model_name"] == "intent"
        assert client.get("/v2/models/my-intent/ready").status_code == 200
        assert client.get("/v2/models/my-intent").json()["name"] == "intent"
        intent = client.post("/v1/intent", json={"queries": ["play jazz"],
                                                 "model": "my-intent"}).json()
        assert intent["results"][0]["intents"][0]["intent"] == "play_music"
        spell = client.post("/v1/spell", json={"queries": ["taylor swfit"],
                                               "model": "my-spell"}).json()
        assert spell["corrections"][0]["corrected"] == "taylor swift"
        pairs = client.post("/v1/duplicates", json={"pairs": PAIRS[:1],
                                                    "model": "my-duplicates"})
        assert pairs.status_code == 200
        unknown = client.post("/v1/spell", json={"queries": ["x"], "model": "nope"})
        assert unknown.status_code == 404
        assert "my-spell" in unknown.json()["error"]  # the refusal lists what is served
        assert client.get("/v2/models/nope/ready").status_code == 404
    client_grpc = triton_grpc.InferenceServerClient(served.grpc_address)
    assert client_grpc.is_model_ready("my-embed")
    tensor = triton_grpc.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"play jazz"]], dtype=object))
    result = client_grpc.infer("my-embed", [tensor])
    embedding = result.as_numpy("embedding")
    assert embedding is not None and embedding.shape == (1, 384)
    # As Triton answers: not ready, not an error (tritonclient's wait-for-model loops poll it).
    assert not client_grpc.is_model_ready("nope") and not client_grpc.is_model_ready("../x")
