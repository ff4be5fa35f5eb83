"""`GET /metrics`: the models' statistics in Prometheus' text format."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from queryserve.pipelines.model import AnyModel as Model
from queryserve.repository import ModelRepository
from queryserve.scheduling.stats import Histogram
from queryserve.server.http import Request, Response
from queryserve.server.routing import Connections, Router, ServerState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def add_routes(router: Router, state: ServerState) -> None:
    async def metrics(request: Request) -> Response:
        return Response(200, render_metrics(state.repository, state.transport), CONTENT_TYPE)

    router.add("GET", "/metrics", metrics)


def render_metrics(repository: ModelRepository, transport: Connections | None = None) -> bytes:
    lines: list[str] = []
    models = list(repository.models.values())

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    if transport is not None:
        for name, kind, help_text, figure in (
                ("queryserve_http_connections", "gauge", "Client connections open now.",
                 transport.connections),
                ("queryserve_http_connections_refused_total", "counter",
                 "Connections answered 503 and closed: over --max-connections, or draining.",
                 transport.refused),
                ("queryserve_http_connections_evicted_total", "counter",
                 "Silent connections (never sent a byte) closed at the cap to admit a new one.",
                 transport.evicted)):
            family(name, kind, help_text)
            lines.append(f"{name} {figure}")

    family("queryserve_model_ready", "gauge", "1 when the model is loaded and warmed up.")
    for entry in repository.index():
        lines.append(f'queryserve_model_ready{{model="{entry["name"]}"}} '
                     f'{int(entry["state"] == "READY")}')
    family("queryserve_requests_total", "counter",
           "Requests by model and outcome (success, invalid, rejected, timeout, failed...).")
    for m in models:
        for outcome, count in sorted(m.stats.outcomes.items()):
            lines.append(f'queryserve_requests_total{{model="{m.name}",outcome="{outcome}"}} '
                         f"{count}")
    counters: tuple[tuple[str, str, Callable[[Model], int]], ...] = (
        ("queryserve_inferences_total", "Items run by the model (a batch of n counts n).",
         lambda m: m.stats.inference_count),
        ("queryserve_executions_total", "Batches run by the model.",
         lambda m: m.stats.execution_count),
        ("queryserve_cache_hits_total", "Items answered from the response cache.",
         lambda m: m.stats.cache_hit.count),
        ("queryserve_cache_misses_total", "Items looked up in the response cache and not found.",
         lambda m: m.stats.cache_miss.count),
    )
    for name, help_text, value in counters:
        family(name, "counter", help_text)
        lines.extend(f'{name}{{model="{m.name}"}} {value(m)}' for m in models)
    family("queryserve_queue_depth", "gauge", "Items waiting in the model's queue now.")
    lines.extend(f'queryserve_queue_depth{{model="{m.name}"}} {m.pipeline.queue_depth}'
                 for m in models)
    histograms: tuple[tuple[str, str, Callable[[Model], Histogram]], ...] = (
        ("queryserve_request_duration_seconds", "End-to-end time of successful requests.",
         lambda m: m.stats.request_latency),
        ("queryserve_queue_duration_seconds", "Time an item waited in the queue.",
         lambda m: m.stats.queue_latency),
        ("queryserve_compute_duration_seconds", "Time to run one batch (collate+model+split).",
         lambda m: m.stats.compute_latency),
        ("queryserve_batch_size", "Items per batch run.", lambda m: m.stats.batch_size),
    )
    for name, help_text, pick in histograms:
        family(name, "histogram", help_text)
        for m in models:
            lines.extend(_histogram(name, m.name, pick(m)))
    return ("\n".join(lines) + "\n").encode()


def _histogram(name: str, model: str, histogram: Histogram) -> Iterable[str]:
    cumulative = 0
    for bound, count in zip((*histogram.bounds, "+Inf"), histogram.counts, strict=True):
        cumulative += count
        yield f'{name}_bucket{{model="{model}",le="{bound}"}} {cumulative}'
    yield f'{name}_sum{{model="{model}"}} {histogram.total}'
    yield f'{name}_count{{model="{model}"}} {histogram.count}'
