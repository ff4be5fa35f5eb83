"""`GET /metrics`: the server's statistics for Prometheus, rendered by `prometheus_client`.

One collector (`ServerCollector`) renders, at scrape time, a `Snapshot` of the numbers the
server keeps anyway: each model's `ModelStats` (the counters and histograms the scheduler and
pipeline update), the transport's connections and refusals, and the access control's refusals.
Prometheus costs nothing per request: no client-library metric objects on the hot path and no
locks, since all of it is updated on the event loop, where the scrape runs too. With
`--workers N` the snapshot is the whole server's (`snapshot.py` says how), and the per-process
families carry a `worker` label.

The library does the format: label escaping, and the text format 0.0.4 or, for a scraper that
asks for it (`Accept: application/openmetrics-text`, as Prometheus does by default),
OpenMetrics. Its process and platform collectors give `process_*` (CPU, resident memory, open
file descriptors) and `python_*` (the interpreter, the cyclic collector's passes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from functools import cache
from itertools import accumulate

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from queryserve.repository import VERSION
from queryserve.scheduling.stats import Histogram, ModelStats
from queryserve.server.http import Request, Response
from queryserve.server.routing import Router
from queryserve.server.snapshot import Snapshot
from queryserve.server.state import ServerState

# The library's own histograms write `le` with this (Go's float format); it is untyped, and an
# annotated alias keeps strict mypy's untyped-call check on for everything else.
_go_float: Callable[[float], str] = floatToGoString

COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("queryserve_inferences_total", "Items run by the model (a batch of n counts n).",
     lambda s: s.inference_count),
    ("queryserve_executions_total", "Batches run by the model.",
     lambda s: s.execution_count),
    ("queryserve_cache_hits_total", "Items answered from the response cache.",
     lambda s: s.cached_items),
    ("queryserve_cache_misses_total", "Items looked up in the response cache and not found.",
     lambda s: s.missed_items),
)
HISTOGRAMS: tuple[tuple[str, str, Callable[[ModelStats], Histogram]], ...] = (
    ("queryserve_request_duration_seconds", "End-to-end time of successful requests.",
     lambda s: s.request_latency),
    ("queryserve_queue_duration_seconds",
     "Time a request waited in the queue (its longest-waiting item's).",
     lambda s: s.queue_latency),
    ("queryserve_compute_duration_seconds", "Time to run one batch (collate+model+split).",
     lambda s: s.compute_latency),
    ("queryserve_batch_size", "Items per batch run.", lambda s: s.batch_size),
    ("queryserve_tokenize_duration_seconds",
     "Time to tokenize one request's texts (those the response cache did not answer).",
     lambda s: s.tokenize_latency),
)


def add_routes(router: Router, state: ServerState) -> None:
    async def metrics(request: Request) -> Response:
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        # The encoders ask only for `collect()`: no registry of the library's (whose global
        # one two servers in one process, as in tests, would share).
        return Response(200, encode(ServerCollector(state, await state.snapshot())),
                        content_type)

    router.add("GET", "/metrics", metrics)


class ServerCollector:
    """Every family `/metrics` shows: the server's `queryserve_*`, read from one snapshot of
    it, then the process's (`process_*`, `python_*`)."""

    def __init__(self, state: ServerState, snapshot: Snapshot) -> None:
        self.state = state
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from self._transport()
        yield from self._access()
        yield from self._workers()
        yield from self._models()
        yield from self._triton()
        yield from self.snapshot.process

    def _transport(self) -> Iterator[Metric]:
        transport = self.snapshot.transport
        if transport is None:  # not listening yet
            return
        yield GaugeMetricFamily("queryserve_http_connections", "Client connections open now.",
                                value=transport.connections)
        yield GaugeMetricFamily(
            "queryserve_http_requests_in_flight",
            "Requests read and not yet answered, pipelined ones included (this scrape too).",
            value=transport.unanswered)
        yield CounterMetricFamily(
            "queryserve_http_connections_refused_total",
            "Connections answered 503 and closed: over --max-connections, or draining.",
            value=transport.refused)
        yield CounterMetricFamily(
            "queryserve_http_connections_evicted_total",
            "Connections closed at the cap to admit a new one: silent (never sent a byte), "
            "or idle between requests.",
            value=transport.evicted)
        yield CounterMetricFamily(
            "queryserve_http_connections_rebalanced_total",
            "Connections closed after an answer (connection: close) because their worker held "
            "more than its share of the server's (--workers); the client reconnects, hashed "
            "afresh to any worker.",
            value=transport.rebalanced)
        yield CounterMetricFamily(
            "queryserve_http_connections_aged_total",
            "Connections closed after an answer (connection: close) at --max-connection-age; "
            "the client reconnects, placed afresh on a worker or replica.",
            value=transport.aged)
        rejections = CounterMetricFamily(
            "queryserve_http_rejections_total",
            "Requests and connections the transport refused before any route saw them, by "
            "reason: malformed (bad_request, upgrade), over a limit (url_too_long, "
            "headers_too_large, body_too_large), too slow (header_timeout, read_timeout, "
            "not_reading), internal_error, and connections refused or evicted "
            "(max_connections, draining, evicted).",
            labels=["reason"])
        for reason, count in sorted(transport.rejections.items()):
            rejections.add_metric([reason], count)
        yield rejections

    def _access(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "queryserve_auth_failures_total",
            "Requests refused 401: no API key, or a wrong one (HTTP and gRPC).",
            value=self.snapshot.auth_failures)
        yield CounterMetricFamily(
            "queryserve_requests_forbidden_total",
            "Requests refused 403: a Host the server does not answer to, or an Origin not "
            "allowed.",
            value=self.snapshot.auth_forbidden)

    def _workers(self) -> Iterator[Metric]:
        siblings = self.state.siblings
        if siblings is None:  # one process: no fleet to describe
            return
        yield GaugeMetricFamily(
            "queryserve_workers", "Worker processes whose figures this scrape sums.",
            value=self.snapshot.workers)
        yield CounterMetricFamily(
            "queryserve_worker_restarts_total",
            "Workers that died and were replaced by the supervisor.", value=siblings.restarts)

    def _models(self) -> Iterator[Metric]:
        repository = self.state.repository
        models = sorted(self.snapshot.models.items())
        ready = GaugeMetricFamily("queryserve_model_ready",
                                  "1 when the model is loaded and warmed up.", labels=["model"])
        for entry in repository.index():
            ready.add_metric([entry["name"]], int(entry["state"] == "READY"))
        yield ready
        requests = CounterMetricFamily(
            "queryserve_requests_total",
            "Requests by model and outcome (success, invalid, rejected, timeout, failed...).",
            labels=["model", "outcome"])
        for name, figures in models:
            for outcome, count in sorted(figures.stats.outcomes.items()):
                requests.add_metric([name, outcome], count)
        yield requests
        for name, help_text, value in COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=["model"])
            for name, figures in models:
                counter.add_metric([name], value(figures.stats))
            yield counter
        depth = GaugeMetricFamily("queryserve_queue_depth",
                                  "Items waiting in the model's queue now.", labels=["model"])
        for name, figures in models:
            depth.add_metric([name], figures.queue_depth)
        yield depth
        for name, help_text, pick in HISTOGRAMS:
            family = HistogramMetricFamily(name, help_text, labels=["model"])
            for name, figures in models:
                histogram = pick(figures.stats)
                family.add_metric([name], buckets(histogram), sum_value=histogram.total)
            yield family


    def _triton(self) -> Iterator[Metric]:
        """Triton's per-model families, by Triton's names and labels (`model`, `version`), so
        that a dashboard, an alert or an autoscaler written for Triton reads this server as it
        is. They are the statistics' figures (`ModelStats`, counted as Triton counts them).
        Untyped: Triton's counters have no `_total`, which the library would add to a
        counter's family."""
        models = sorted(self.snapshot.models.items())
        for name, help_text, value in TRITON_FAMILIES:
            family = Metric(name, help_text, "unknown")
            for model, figures in models:
                family.add_sample(name, {"model": model, "version": VERSION},
                                  value(figures.stats, figures.queue_depth))
            yield family
        failures = Metric("nv_inference_request_failure",
                          "Number of failed inference requests, by reason", "unknown")
        for model, figures in models:
            by_reason: Counter[str] = Counter()
            for outcome, count in figures.stats.outcomes.items():
                if outcome != "success":
                    by_reason[TRITON_FAILURE_REASONS.get(outcome, "OTHER")] += count
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                failures.add_sample("nv_inference_request_failure",
                                    {"model": model, "version": VERSION, "reason": reason},
                                    by_reason[reason])
        yield failures


TRITON_FAMILIES: tuple[tuple[str, str, Callable[[ModelStats, int], float]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests",
     lambda s, _: s.success.count),
    ("nv_inference_count", "Number of inferences performed (a batch of n counts n)",
     lambda s, _: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions (batches)",
     lambda s, _: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative end-to-end handling time of successful requests, in microseconds",
     lambda s, _: s.success.ns // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative time requests waited in the queue, in microseconds",
     lambda s, _: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative time requests spent collating inputs, in microseconds",
     lambda s, _: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative time requests spent running the model, in microseconds",
     lambda s, _: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative time requests spent splitting outputs, in microseconds",
     lambda s, _: s.compute_output.ns // 1000),
    ("nv_inference_pending_request_count",
     "Items waiting in the model's queue now (Triton counts requests; a request of n texts "
     "queues n items here)", lambda _, depth: depth),
    ("nv_cache_num_hits_per_model", "Requests the response cache answered wholly",
     lambda s, _: s.cache_hit.count),
    ("nv_cache_num_misses_per_model", "Requests the response cache did not answer wholly",
     lambda s, _: s.cache_miss.count),
    ("nv_cache_hit_duration_per_model",
     "Cumulative time looking up the cache on hits, in microseconds",
     lambda s, _: s.cache_hit.ns // 1000),
    ("nv_cache_miss_duration_per_model",
     "Cumulative time looking up the cache on misses, in microseconds",
     lambda s, _: s.cache_miss.ns // 1000),
)
"""Triton's per-model families (its docs' user_guide/metrics.md), from a model's statistics
and its queue depth."""
TRITON_FAILURE_REASONS = {"rejected": "REJECTED", "cancelled": "CANCELED", "failed": "BACKEND"}
"""Triton's `reason` label of a failure, by this server's outcome; any other is OTHER."""


def buckets(histogram: Histogram) -> list[tuple[str, float]]:
    """A histogram as the library's families take it: cumulative counts by upper bound, from
    the per-bucket counts `Histogram.observe` keeps (one increment each, not a cumulative
    walk), `+Inf` last."""
    return list(zip(_bounds(histogram.bounds), accumulate(histogram.counts), strict=True))


@cache
def _bounds(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """`le` label values, formatted once per set of bounds rather than once per scrape."""
    return (*(_go_float(bound) for bound in bounds), "+Inf")
