"""Malformed requests over every route, as hypothesis strategies, and what a right answer to one
is: shared by tests/e2e/test_malformed_input.py and benchmarks/faults/malformed.py.

A generated request is a valid one of some route with one part replaced by arbitrary JSON,
arbitrary bytes and headers sent to a route, or an arbitrary path. The answer must never be a
5xx, never take 5 s, and a 4xx must say what is wrong; a good request must be answered after
thousands of these as it was before.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

KSERVE_TEXT = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES",
                           "data": ["play some jazz"]}]}
VALID: dict[str, dict[str, Any]] = {
    "/v2/models/embed/infer": KSERVE_TEXT,
    "/v2/models/intent/infer": {**KSERVE_TEXT, "parameters": {"top_k": 2}},
    "/v2/models/spell/infer": KSERVE_TEXT,
    "/v2/models/spell-seq2seq/infer": KSERVE_TEXT,
    "/v2/models/spell-hybrid/infer": KSERVE_TEXT,
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
    "/v1/rerank": {"model": "duplicates", "query": "sony dsc-w120",
                   "documents": ["sony w120", {"text": "canon eos"}], "top_n": 1,
                   "return_documents": True},
}
COMPARED = ("/v1/intent", "/v1/spell", "/v2/models/embed")
"""Routes of VALID whose answer is the same every time (search's carries timings): what "as
before" compares."""
GET_PATHS = ["/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/embed",
             "/v2/models/embed/ready", "/v2/models/embed/config", "/v2/models/embed/stats",
             "/v2/models/search/config", "/metrics", "/v1/models", "/v1/models/embed"]
SLOW_S = 5.0  # an answer this late is a failure

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


@dataclass(frozen=True)
class Malformed:
    """One generated request: sent as is (no content-type unless in `headers`)."""

    method: str
    path: str
    content: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def places(node: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of a JSON document, so that one part can be replaced."""
    found: list[tuple[Any, Any]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        found.append((node, key))
        if isinstance(value, dict | list):
            found.extend(places(value))
    return found


@st.composite
def one_part_replaced(draw: st.DrawFn) -> Malformed:
    """A valid request of any route with any one part replaced by any JSON value."""
    path = draw(st.sampled_from(sorted(VALID)), label="route")
    body = copy.deepcopy(VALID[path])
    container, key = draw(st.sampled_from(places(body)), label="replaced")
    container[key] = draw(json_values, label="with")
    # NaN and Infinity are written as Python writes them: not JSON
    return Malformed("POST", path, json.dumps(body).encode())


@st.composite
def any_bytes_and_headers(draw: st.DrawFn) -> Malformed:
    """Any bytes to any route, with any KServe header length and content encoding."""
    path = draw(st.sampled_from(sorted(VALID)), label="route")
    content = draw(st.binary(max_size=200), label="content")
    length = draw(st.one_of(st.none(), st.text(max_size=6)), label="header length")
    encoding = draw(st.one_of(st.none(), st.sampled_from(["gzip", "identity", "x", ""])),
                    label="content-encoding")
    headers = {}
    # A value the client can send: httpx (h11) itself refuses one with spaces around it, and
    # that refusal was counted as the server's "no answer".
    if length is not None and length.isprintable() and length.isascii() \
            and length == length.strip():
        headers["inference-header-content-length"] = length
    if encoding is not None:
        headers["content-encoding"] = encoding
    return Malformed("POST", path, content, headers)


@st.composite
def any_path(draw: st.DrawFn) -> Malformed:
    """A GET route with any text after it, percent-encoded: the server decodes it."""
    base = draw(st.sampled_from(GET_PATHS), label="route")
    tail = draw(st.text(max_size=30), label="tail")
    return Malformed("GET", base + quote(tail, safe="/%"))


STRATEGIES = {
    "one part of a valid request replaced": one_part_replaced(),
    "any bytes and headers": any_bytes_and_headers(),
    "any path": any_path(),
}


def problem(status: int, body: bytes, elapsed_s: float) -> str | None:
    """What is wrong with the answer to a malformed request, or None: a 5xx, an answer after
    SLOW_S, a 4xx (but 405, which says Allow) without an error message, a traceback."""
    if status >= 500:
        return f"status {status}: {body[:300]!r}"
    if elapsed_s >= SLOW_S:
        return f"answered after {elapsed_s:.1f} s"
    if status >= 400 and status != 405:
        try:
            said = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            said = None
        if not said:
            return f"a {status} that does not say what is wrong: {body[:300]!r}"
    if b"Traceback (most recent call last)" in body:  # not "Traceback" alone: a 404 echoes
        return "a traceback in the answer"  # its path, and "/v2Traceback" is a path
    return None
