"""The server's own view of a run: Triton's statistics extension read before and after.

`/v2/models/{m}/stats` (gRPC: `ModelStatistics`) is cumulative, so the difference between two
reads is what one step cost the server: how long requests queued, how long they computed, how
batches formed. It works against queryserve and Triton alike; for servers without it
(OpenAI-style peers) the breakdown is simply absent.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit


def base_url(url: str) -> str:
    """``http://host:port`` of a full endpoint URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def fetch_stats(url: str, model: str, headers: dict[str, str] | None = None,
                timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The model's entry of `/v2/models/{model}/stats` (over gRPC for a ``grpc://`` URL: the
    same document, from `ModelStatistics`), or None if the server has none.

    ``headers`` go with the request (PyTriton guards its statistics with an access token)."""
    if url.startswith("grpc://"):
        return _fetch_grpc_stats(urlsplit(url).netloc, model, headers or {}, timeout_s)
    endpoint = f"{base_url(url)}/v2/models/{quote(model, safe='')}/stats"
    request = urllib.request.Request(endpoint, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    entries = body.get("model_stats") if isinstance(body, dict) else None
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        return None
    entry: dict[str, Any] = entries[0]
    return entry


def _fetch_grpc_stats(address: str, model: str, headers: dict[str, str],
                      timeout_s: float) -> dict[str, Any] | None:
    import grpc
    from google.protobuf import json_format

    from queryserve.server.grpc.proto import grpc_service_pb2 as pb

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelStatistics",
                                   request_serializer=pb.ModelStatisticsRequest.SerializeToString,
                                   response_deserializer=pb.ModelStatisticsResponse.FromString)
        try:
            answer = call(pb.ModelStatisticsRequest(name=model), timeout=timeout_s,
                          metadata=[(k.lower(), v) for k, v in headers.items()])
        except grpc.RpcError:
            return None
    # The JSON mapping of the message is the HTTP document (64-bit counts as strings, which
    # `stats_delta` reads with int()).
    entries = json_format.MessageToDict(answer, preserving_proto_field_name=True).get(
        "model_stats")
    if not isinstance(entries, list) or not entries:
        return None
    entry: dict[str, Any] = entries[0]
    return entry


def _pair(stats: dict[str, Any], name: str) -> tuple[int, int]:
    value = stats.get("inference_stats", {}).get(name, {})
    return int(value.get("count", 0)), int(value.get("ns", 0))


def _batches(stats: dict[str, Any]) -> dict[int, int]:
    """Executions by batch size (Triton counts them in each size's compute_infer)."""
    out: dict[int, int] = {}
    for entry in stats.get("batch_stats", []) or []:
        out[int(entry["batch_size"])] = int(entry.get("compute_infer", {}).get("count", 0))
    return out


def _mean_ns(before: dict[str, Any], after: dict[str, Any], name: str) -> float:
    """One duration's mean over its own count, as perf_analyzer reads Triton's: the time a
    request spent there (the server counts queue and compute once per request, as Triton
    does; compute leaves out requests the cache answered)."""
    count = _pair(after, name)[0] - _pair(before, name)[0]
    return (_pair(after, name)[1] - _pair(before, name)[1]) / count if count > 0 else 0.0


def stats_delta(before: dict[str, Any] | None,
                after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What happened between two reads: requests, inferences, executions, mean batch, queue
    and compute time per request (ms) and executions by batch size."""
    if before is None or after is None:
        return None
    requests, _ = (a - b for a, b in zip(_pair(after, "success"), _pair(before, "success"),
                                         strict=True))
    inferences = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    executions = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    old = _batches(before)
    sizes = {size: n - old.get(size, 0) for size, n in sorted(_batches(after).items())}
    return {
        "requests": requests,
        "inferences": inferences,
        "executions": executions,
        "mean_batch": round(inferences / executions, 2) if executions else None,
        "queue_ms_per_request": round(_mean_ns(before, after, "queue") / 1e6, 3),
        "compute_ms_per_request": round(sum(
            _mean_ns(before, after, k)
            for k in ("compute_input", "compute_infer", "compute_output")) / 1e6, 3),
        "batch_sizes": {str(size): n for size, n in sizes.items() if n > 0},
    }
