"""Malformed input over every route gets a 4xx that says what is wrong: never a 5xx, never a
hang, never a change of what a good request is answered.

First the inputs that used to reach a 500 (or worse), each as a regression test; then
property-based generation (hypothesis): valid requests of every route with one part replaced
by arbitrary JSON, arbitrary bodies and headers, arbitrary paths, against the default models.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import RunningServer, start_server, stop_server, write_fake_model

KSERVE_TEXT = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES",
                           "data": ["play some jazz"]}]}
VALID: dict[str, dict[str, Any]] = {
    "/v2/models/embed/infer": KSERVE_TEXT,
    "/v2/models/intent/infer": {**KSERVE_TEXT, "parameters": {"top_k": 2}},
    "/v2/models/spell/infer": KSERVE_TEXT,
    "/v2/models/spell-seq2seq/infer": KSERVE_TEXT,
    "/v2/models/duplicates/infer": {"inputs": [
        {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["sony dsc-w120"]},
        {"name": "text_pair", "shape": [1, 1], "datatype": "BYTES", "data": ["sony w120"]}],
        "outputs": [{"name": "probability", "parameters": {"binary_data": False}}]},
    "/v2/models/search/infer": {"inputs": [{"name": "query", "shape": [1], "datatype": "BYTES",
                                            "data": ["blank spase"]}]},
    "/v1/embeddings": {"model": "embed", "input": ["play some jazz"],
                       "encoding_format": "float"},
    "/v1/spell": {"queries": ["taylor swfit"]},
    "/v1/intent": {"queries": ["wake me up at seven"], "top_k": 2},
    "/v1/duplicates": {"pairs": [["sony dsc-w120", "sony w120"]], "threshold": 0.5},
    "/v1/search": {"query": "blank spase", "k": 3, "catalog": "songs", "spell": True},
}
GET_PATHS = ["/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/embed",
             "/v2/models/embed/ready", "/v2/models/embed/config", "/v2/models/embed/stats",
             "/v2/models/search/config", "/metrics"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def places(node: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of a JSON document, so that one part can be replaced."""
    found: list[tuple[Any, Any]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        found.append((node, key))
        if isinstance(value, dict | list):
            found.extend(places(value))
    return found


def check(response: httpx.Response, started: float) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    assert time.monotonic() - started < 5
    if response.status_code >= 400 and response.status_code != 405:
        assert response.json()["error"]  # says what is wrong
    assert "Traceback" not in response.text


def post(server: RunningServer, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, timeout=10, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def answers_before(real_server: RunningServer) -> dict[str, Any]:
    """What the good requests are answered before anything malformed is sent."""
    return {path: post(real_server, path, json=body).json() for path, body in VALID.items()
            if path.startswith(("/v1/intent", "/v1/spell", "/v2/models/embed"))}


# -- what used to reach a 500 -----------------------------------------------------------------


@pytest.mark.parametrize(("case", "path", "kwargs", "status", "words"), [
    ("superscript two as a header length", "/v2/models/embed/infer",
     {"content": json.dumps(KSERVE_TEXT).encode(),
      "headers": {"inference-header-content-length": b"\xb2"}}, 400,
     "inference-header-content-length is '²'"),
    ("an output name that is a list", "/v2/models/embed/infer",
     {"json": {**KSERVE_TEXT, "outputs": [{"name": ["embedding"]}]}}, 400, "has no output"),
    ("an output name that is an object", "/v2/models/embed/infer",
     {"json": {**KSERVE_TEXT, "outputs": [{"name": {"a": 1}}]}}, 400, "has no output"),
    ("data nested 990 deep", "/v2/models/embed/infer",
     {"content": (b'{"inputs":[{"name":"text","shape":[1,1],"datatype":"BYTES","data":'
                  + b"[" * 990 + b'"x"' + b"]" * 990 + b"}]}")}, 400, "nested deeper"),
    ("a model name of 5,000 characters", "/v2/models/" + "m" * 5000 + "/infer",
     {"json": KSERVE_TEXT}, 400, "is not a model name"),
    ("a model name of 5,000 characters, loaded", "/v2/repository/models/" + "m" * 5000
     + "/load", {}, 400, "is not a model name"),
    ("numbers out of range", "/v1/search",
     {"json": {"query": "jazz", "k": 10 ** 30}}, 400, "'k' must be an integer from 1 to 100"),
])
def test_what_used_to_be_a_500_is_a_4xx(real_server: RunningServer, case: str, path: str,
                                         kwargs: dict[str, Any], status: int,
                                         words: str) -> None:
    response = post(real_server, path, **kwargs)
    assert response.status_code == status, response.text[:300]
    assert words in response.json()["error"]


def test_dot_dot_is_no_model_name(tmp_path: Path) -> None:
    """Regression: `POST /v2/repository/models/%2e%2e/load` loaded the model.yaml of the
    repository's parent folder and served it."""
    repository = tmp_path / "repository"
    write_fake_model(repository, "fast")
    (tmp_path / "model.yaml").write_text((repository / "fast" / "model.yaml").read_text())
    server = start_server(repository, tmp_path / "server.log")
    try:
        for name in ("%2e%2e", "..", ".hidden", "a%2fb"):
            answer = post(server, f"/v2/repository/models/{name}/load")
            assert answer.status_code in (400, 404), (name, answer.text)
            assert answer.status_code != 200
        names = [m["name"] for m in post(server, "/v2/repository/index").json()]
        assert names == ["fast"]
        assert httpx.get(f"{server.url}/v2/models/%2e%2e/ready").status_code == 400
    finally:
        stop_server(server)


def test_every_answer_carries_a_date(real_server: RunningServer) -> None:
    for response in (httpx.get(f"{real_server.url}/v2/health/live"),
                     post(real_server, "/v1/spell", json={"queries": 1})):
        assert response.headers["date"].endswith(" GMT")


# -- generated --------------------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.data())
def test_any_one_part_of_a_valid_request_replaced(real_server: RunningServer,
                                                  data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(sorted(VALID)), label="route")
    body = copy.deepcopy(VALID[path])
    container, key = data.draw(st.sampled_from(places(body)), label="replaced")
    container[key] = data.draw(json_values, label="with")
    started = time.monotonic()  # NaN and Infinity are written as Python writes them: not JSON
    check(post(real_server, path, content=json.dumps(body).encode()), started)


@FUZZ
@given(path=st.sampled_from(sorted(VALID)), content=st.binary(max_size=200),
       length=st.one_of(st.none(), st.text(max_size=6)),
       encoding=st.one_of(st.none(), st.sampled_from(["gzip", "identity", "x", ""])))
def test_any_bytes_and_headers(real_server: RunningServer, path: str, content: bytes,
                               length: str | None, encoding: str | None) -> None:
    headers = {}
    if length is not None and length.isprintable() and length.isascii():
        headers["inference-header-content-length"] = length
    if encoding is not None:
        headers["content-encoding"] = encoding
    started = time.monotonic()
    check(post(real_server, path, content=content, headers=headers), started)


@FUZZ
@given(base=st.sampled_from(GET_PATHS), tail=st.text(max_size=30))
def test_any_path(real_server: RunningServer, base: str, tail: str) -> None:
    started = time.monotonic()  # any text, percent-encoded: the server decodes it
    response = httpx.get(real_server.url + base + quote(tail, safe="/%"), timeout=10)
    check(response, started)


def test_good_requests_are_answered_as_before_the_malformed_ones(
        real_server: RunningServer, answers_before: dict[str, Any]) -> None:
    for path, body in VALID.items():
        answer = post(real_server, path, json=body)
        assert answer.status_code == 200, (path, answer.text)
        if path in answers_before:
            assert answer.json() == answers_before[path], path
