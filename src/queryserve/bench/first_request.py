"""One request before the load, so a run the server would refuse whole is refused at once.

A wrong ``--model``, ``--protocol``, ``--path`` or API key makes every request of a run fail
the same way; without this the whole plan (a max-rate search is minutes) would run before
saying so. perf_analyzer reads the model's metadata first for the same reason. Only the
client's own mistakes stop the run: 4xx (but 408 and 429, which are load) and their gRPC
equivalents. A 5xx or a 503 is the server's state, which the run is there to measure.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from queryserve.bench.payloads import Payloads
from queryserve.errors import BenchError

TIMEOUT_S = 60.0  # a first request may wait for a cold model


def _refusal(status: int) -> bool:
    """Whether a status says the request itself is wrong: a 4xx but 408 and 429 (load), or a
    501 (the server has no such method or route)."""
    return (400 <= status < 500 and status not in (408, 429)) or status == 501


def check_first_request(url: str, protocol: str, payloads: Payloads,
                        headers: dict[str, str]) -> None:
    """Send the first body once; raise BenchError naming the server's own words if the
    server refuses it as the client's mistake. Nothing listening: left to the load, which
    says so in its own words (over gRPC, after waiting for the channel)."""
    answer = first_answer(url, protocol, payloads, headers)
    if answer is not None and _refusal(answer[0]):
        status, said = answer
        raise BenchError(f"{url} refused the first request with {status}: {said}; "
                         f"nothing was measured (check the URL, --model and --protocol)")


def first_answer(url: str, protocol: str, payloads: Payloads,
                 headers: dict[str, str]) -> tuple[int, str] | None:
    """The status (gRPC's as the load records it) and the server's words when it does not
    answer the first body with a success; None when it does, or nothing answers."""
    if protocol == "grpc":
        return _grpc_answer(url, payloads.bodies[0], headers)
    return _http_answer(url, payloads, headers)


def _http_answer(url: str, payloads: Payloads, headers: dict[str, str]) -> tuple[int, str] | None:
    sent = {"Content-Type": payloads.content_type, **headers,
            **(payloads.body_headers[0] if payloads.body_headers else {})}
    request = urllib.request.Request(url, data=payloads.bodies[0], headers=sent, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S):
            return None
    except urllib.error.HTTPError as exc:
        return exc.code, _message(exc.read())
    except (urllib.error.URLError, OSError):
        return None  # unreachable or reset: the load reports it as it does today


def _message(body: bytes) -> str:
    """The error's text from the shapes servers answer with (KServe's ``{"error": "..."}``,
    OpenAI's ``{"error": {"message": ...}}``, FastAPI's ``{"detail": ...}``), else the body."""
    try:
        document = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:200] or "(no body)"
    if isinstance(document, dict):
        said = document.get("error", document.get("detail", document))
        if isinstance(said, dict) and "message" in said:
            said = said["message"]
        return str(said)[:200]
    return str(document)[:200]


def _grpc_answer(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str] | None:
    import grpc

    from queryserve.bench.loadgen.grpc_open_loop import HTTP_STATUS  # the load's own reading

    address = url.removeprefix("grpc://")
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=None, response_deserializer=None)
        try:
            call(body, timeout=TIMEOUT_S,
                 metadata=[(name.lower(), value) for name, value in headers.items()])
        except grpc.RpcError as exc:
            code = exc.code()
            return HTTP_STATUS.get(code, 500), f"{code.name}: {exc.details()}"
    return None
