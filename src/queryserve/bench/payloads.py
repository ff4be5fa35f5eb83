"""Request bodies built from real queries, one wire format per protocol.

Bodies are encoded once, before the run, so the load generator only writes bytes. Queries
come from a file of real text (MASSIVE utterances by default): ``.jsonl`` (one object per
line; the ``text`` field unless told otherwise) or plain text (one query per line).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from queryserve.errors import BenchError

PROTOCOLS = ("kserve", "kserve-binary", "grpc", "openai", "spell", "intent", "search",
             "duplicates")
DEFAULT_PATHS = {
    "kserve": "/v2/models/{model}/infer",
    "kserve-binary": "/v2/models/{model}/infer",
    "openai": "/v1/embeddings",
    "spell": "/v1/spell",
    "intent": "/v1/intent",
    "search": "/v1/search",  # one query per request; --model is ignored
    "duplicates": "/v1/duplicates",  # a query is a pair: TEXT<TAB>TEXT
    "grpc": "/inference.GRPCInferenceService/ModelInfer",  # KServe v2 gRPC, a grpc:// URL
}


@dataclass(frozen=True)
class Payloads:
    """Pre-encoded bodies and the headers they need."""

    bodies: list[bytes]
    content_type: str
    body_headers: list[dict[str, str]] | None  # per body; None when all share the headers
    items_per_request: int


def read_queries(path: Path, field: str = "text", limit: int = 0) -> list[str]:
    """The non-empty queries in ``path``; a clear error for a missing file or field."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BenchError(f"queries file {path} does not exist") from None
    except OSError as exc:  # a folder, no permission
        raise BenchError(f"cannot read queries file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise BenchError(f"queries file {path} is not UTF-8 text: {exc.reason}") from None
    queries: list[str] = []
    jsonl = path.suffix == ".jsonl"
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if jsonl:
            try:
                value = json.loads(line).get(field)
            except (json.JSONDecodeError, AttributeError):
                raise BenchError(f"{path}:{number} is not a JSON object") from None
            if not isinstance(value, str):
                raise BenchError(f"{path}:{number} has no string field {field!r}")
            line = value
        if line.strip():
            queries.append(line.strip())
        if limit and len(queries) >= limit:
            break
    if not queries:
        raise BenchError(f"queries file {path} holds no queries")
    return queries


def build_payloads(protocol: str, queries: Sequence[str], *, model: str,
                   items_per_request: int = 1, input_name: str = "text") -> Payloads:
    """One body per group of ``items_per_request`` consecutive queries (cycling through the
    list so every body is full)."""
    if protocol not in PROTOCOLS:
        raise BenchError(f"protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if items_per_request < 1:
        raise BenchError("items per request must be >= 1")
    if not queries:
        raise BenchError("need at least one query")
    count = max(1, len(queries) // items_per_request)
    groups = [[queries[(i * items_per_request + j) % len(queries)]
               for j in range(items_per_request)] for i in range(count)]
    if protocol == "openai":
        bodies = [json.dumps({"model": model, "input": g}).encode() for g in groups]
        return Payloads(bodies, "application/json", None, items_per_request)
    if protocol in ("spell", "intent"):
        bodies = [json.dumps({"model": model, "queries": g}).encode() for g in groups]
        return Payloads(bodies, "application/json", None, items_per_request)
    if protocol == "duplicates":
        if any("\t" not in q for q in queries):
            bad = next(q for q in queries if "\t" not in q)
            raise BenchError(f"the duplicates route takes pairs: each query must be "
                             f"TEXT<TAB>TEXT, and {bad[:60]!r} has no tab")
        bodies = [json.dumps({"model": model, "pairs": [q.split("\t", 1) for q in g]}).encode()
                  for g in groups]
        return Payloads(bodies, "application/json", None, items_per_request)
    if protocol == "search":
        if items_per_request != 1:
            raise BenchError("the search route takes one query per request")
        bodies = [json.dumps({"query": g[0]}).encode() for g in groups]
        return Payloads(bodies, "application/json", None, 1)
    if protocol == "kserve":
        bodies = [json.dumps({"inputs": [{"name": input_name, "shape": [len(g), 1],
                                          "datatype": "BYTES", "data": g}]}).encode()
                  for g in groups]
        return Payloads(bodies, "application/json", None, items_per_request)
    if protocol == "grpc":
        return Payloads([_model_infer_request(model, input_name, g) for g in groups],
                        "application/grpc", None, items_per_request)
    bodies, headers = [], []
    for g in groups:
        blob = _bytes_tensor(g)
        header = json.dumps({
            "inputs": [{"name": input_name, "shape": [len(g), 1], "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(blob)}}],
            "parameters": {"binary_data_output": True},
        }).encode()
        bodies.append(header + blob)
        headers.append({"Inference-Header-Content-Length": str(len(header))})
    return Payloads(bodies, "application/octet-stream", headers, items_per_request)


def _bytes_tensor(texts: Sequence[str]) -> bytes:
    """Texts as a raw BYTES tensor: each a 4-byte little-endian length, then its UTF-8."""
    return b"".join(struct.pack("<I", len(b)) + b for b in (t.encode() for t in texts))


def _model_infer_request(model: str, input_name: str, texts: Sequence[str]) -> bytes:
    """A serialized KServe v2 gRPC `ModelInferRequest` with the texts as a raw BYTES tensor,
    as tritonclient and perf_analyzer send them (and are answered raw)."""
    from queryserve.server.grpc.proto import grpc_service_pb2 as pb  # grpcio for gRPC runs only

    request = pb.ModelInferRequest(model_name=model, raw_input_contents=[_bytes_tensor(texts)])
    request.inputs.add(name=input_name, datatype="BYTES", shape=[len(texts), 1])
    serialized: bytes = request.SerializeToString()
    return serialized
