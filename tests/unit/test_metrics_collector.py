"""The `/metrics` collector over stand-in models and transport: escaping, histogram layout and
format negotiation, without a server (the end-to-end tests scrape a real one)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from queryserve.repository import ModelRepository
from queryserve.scheduling.stats import LATENCY_BUCKETS_S, ModelStats
from queryserve.server import metrics
from queryserve.server.http import REJECTION_REASONS, Request
from queryserve.server.routing import Router
from queryserve.server.state import ServerState

ODD = 'a "quoted\\ name\nwith a newline'


def state_with(tmp_path: Path, model_name: str, stats: ModelStats,
               reasons: dict[str, int] | None = None) -> ServerState:
    """A server state over one stand-in model (`name`, `stats`, `queue_depth`, `ready` is all
    the collector reads) and a stand-in transport."""
    repository = ModelRepository(tmp_path)
    model: Any = SimpleNamespace(name=model_name, stats=stats,
                                 queue_depth=3, ready=lambda: True)
    repository.models[model_name] = model
    state = ServerState(repository)
    state.transport = SimpleNamespace(  # type: ignore[assignment]
        connections=2, unanswered=1, refused=0, evicted=0, rebalanced=0, aged=0,
        rejections=reasons if reasons is not None else dict.fromkeys(REJECTION_REASONS, 0))
    return state


def collector(state: ServerState) -> metrics.ServerCollector:
    return metrics.ServerCollector(state, state.snapshot_here())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_label_values_with_a_quote_backslash_and_newline_are_escaped(tmp_path: Path) -> None:
    stats = ModelStats()
    stats.record_request("success", 0.002)
    state = state_with(tmp_path, ODD, stats, {ODD: 7})
    text = generate_latest(metrics.ServerCollector(state, state.snapshot_here())).decode()
    assert 'model="a \\"quoted\\\\ name\\nwith a newline"' in text
    assert 'reason="a \\"quoted\\\\ name\\nwith a newline"' in text
    parsed = samples(text)  # and the library's parser reads back the very values
    assert parsed[("queryserve_requests_total", (("model", ODD), ("outcome", "success")))] == 1
    assert parsed[("queryserve_http_rejections_total", (("reason", ODD),))] == 7


def test_histograms_keep_their_buckets_sum_and_count(tmp_path: Path) -> None:
    stats = ModelStats()
    for seconds in (0.00005, 0.003, 0.003, 20.0):  # below the first bound, on one, above all
        stats.record_request("success", seconds)
    text = generate_latest(collector(state_with(tmp_path, "m", stats))).decode()
    family = next(f for f in text_string_to_metric_families(text)
                  if f.name == "queryserve_request_duration_seconds")
    assert family.type == "histogram"
    buckets = [(s.labels["le"], s.value) for s in family.samples if s.name.endswith("_bucket")]
    assert [float(le) for le, _ in buckets] == [*LATENCY_BUCKETS_S, float("inf")]
    assert dict(buckets)["0.0001"] == 1 and dict(buckets)["0.003"] == 3
    assert dict(buckets)["10.0"] == 3 and dict(buckets)["+Inf"] == 4
    by_name = {s.name: s.value for s in family.samples}
    assert by_name["queryserve_request_duration_seconds_count"] == 4
    assert by_name["queryserve_request_duration_seconds_sum"] == pytest.approx(20.00605)


def test_tokenize_time_is_a_histogram_of_seconds(tmp_path: Path) -> None:
    stats = ModelStats()
    stats.record_tokenize(1_500_000)  # 1.5 ms
    text = generate_latest(collector(state_with(tmp_path, "m", stats))).decode()
    parsed = samples(text)
    model = (("model", "m"),)
    assert parsed[("queryserve_tokenize_duration_seconds_count", model)] == 1
    assert parsed[("queryserve_tokenize_duration_seconds_sum", model)] == pytest.approx(0.0015)
    assert parsed[("queryserve_tokenize_duration_seconds_bucket",
                   (("le", "0.002"), ("model", "m")))] == 1


def test_every_rejection_reason_is_exported_from_zero(tmp_path: Path) -> None:
    text = generate_latest(collector(state_with(tmp_path, "m", ModelStats())))
    parsed = samples(text.decode())
    for reason in REJECTION_REASONS:
        assert parsed[("queryserve_http_rejections_total", (("reason", reason),))] == 0
    assert parsed[("queryserve_http_connections_rebalanced_total", ())] == 0
    assert parsed[("queryserve_http_connections_aged_total", ())] == 0


async def scrape(state: ServerState, accept: str | None) -> tuple[str, bytes]:
    router = Router()
    metrics.add_routes(router, state)
    headers = {} if accept is None else {"accept": accept}
    response = await router(Request("GET", "/metrics", "", headers, b""))
    assert response.status == 200
    return response.content_type, response.body


async def test_openmetrics_is_negotiated_and_text_0_0_4_is_the_default(tmp_path: Path) -> None:
    state = state_with(tmp_path, "m", ModelStats())
    content_type, body = await scrape(state, None)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert "queryserve_queue_depth" in {f.name for f in text_string_to_metric_families(
        body.decode())}
    # What Prometheus 2.x and 3.x send.
    for accept in ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                   "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                   "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                   "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"):
        content_type, body = await scrape(state, accept)
        assert content_type.startswith("application/openmetrics-text; version=1.0.0")
        assert body.endswith(b"# EOF\n")
        families = {f.name: f for f in openmetrics_families(body.decode())}
        assert families["queryserve_requests"].type == "counter"
        assert families["queryserve_queue_depth"].samples[0].value == 3
