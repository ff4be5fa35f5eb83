"""`/metrics` from a real server on 127.0.0.1 (a fake model, an API key): scraped with httpx,
read with `prometheus_client`'s parsers, in both formats; the counters that requests, malformed
requests and refused credentials move; and the Grafana dashboard's queries against what the
server exports."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from queryserve.scheduling.stats import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS_S
from queryserve.server.http import MAX_BODY_BYTES, MAX_HEADER_BYTES, MAX_URL_BYTES
from tests.conftest import ROOT, RunningServer, start_server, stop_server, write_fake_model

KEY = "metrics-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
TIMEOUT_S = 0.5  # the header and read timeouts, short so that a stalled request is cheap
DASHBOARD = ROOT / "deploy" / "grafana" / "queryserve.json"

# Every sample name `/metrics` exported before it was rendered by the library; README,
# RELIABILITY.md, the benchmarks and the /dashboard page read them.
NAMES_BEFORE = {
    "queryserve_http_connections", "queryserve_http_connections_refused_total",
    "queryserve_http_connections_evicted_total", "queryserve_model_ready",
    "queryserve_requests_total", "queryserve_inferences_total", "queryserve_executions_total",
    "queryserve_cache_hits_total", "queryserve_cache_misses_total", "queryserve_queue_depth",
    *(f"{histogram}{suffix}" for histogram in (
        "queryserve_request_duration_seconds", "queryserve_queue_duration_seconds",
        "queryserve_compute_duration_seconds", "queryserve_batch_size")
      for suffix in ("_bucket", "_sum", "_count")),
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("metrics")
    write_fake_model(repository, "fake", cache=True)
    running = start_server(repository, repository / "server.log", "--api-key", KEY,
                           "--header-timeout", str(TIMEOUT_S), "--read-timeout", str(TIMEOUT_S))
    yield running
    stop_server(running)


def scrape(server: RunningServer) -> Samples:
    response = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert response.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def infer(server: RunningServer, texts: list[str]) -> None:
    response = httpx.post(f"{server.url}/v2/models/fake/infer", headers=AUTH, json={
        "inputs": [{"name": "text", "shape": [len(texts), 1], "datatype": "BYTES",
                    "data": texts}]})
    assert response.status_code == 200, response.text


def exchange(server: RunningServer, raw: bytes) -> int:
    """Send raw bytes on a new connection; the status of the answer the server closes with."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_text_format_keeps_every_name_and_adds_the_process(server: RunningServer) -> None:
    infer(server, ["keep the names"])
    response = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    names = {s.name for f in families.values() for s in f.samples}
    assert names >= NAMES_BEFORE
    assert names >= {"process_cpu_seconds_total", "process_resident_memory_bytes",
                     "process_open_fds", "python_info", "python_gc_collections_total"}
    assert families["queryserve_request_duration_seconds"].type == "histogram"
    for histogram, bounds in (("queryserve_request_duration_seconds", LATENCY_BUCKETS_S),
                              ("queryserve_tokenize_duration_seconds", LATENCY_BUCKETS_S),
                              ("queryserve_batch_size", BATCH_SIZE_BUCKETS)):
        les = [float(s.labels["le"]) for s in families[histogram].samples
               if s.name.endswith("_bucket") and s.labels["model"] == "fake"]
        assert les == [*bounds, float("inf")], histogram


def test_openmetrics_when_the_scraper_asks_for_it(server: RunningServer) -> None:
    # What Prometheus 3 sends by default.
    accept = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
              "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;"
              "escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
    response = httpx.get(f"{server.url}/metrics", headers={**AUTH, "accept": accept})
    assert response.headers["content-type"].startswith(
        "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert response.text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(response.text)}
    assert families["queryserve_requests"].type == "counter"
    assert families["queryserve_request_duration_seconds"].type == "histogram"
    assert "process_cpu_seconds" in families


def test_requests_move_the_model_counters_and_tokenize_time(server: RunningServer) -> None:
    before = scrape(server)
    infer(server, ["on the loop"])  # tokenized on the event loop
    infer(server, [f"text number {i}" for i in range(40)])  # on a worker thread (over 32)
    infer(server, ["on the loop"])  # answered by the response cache: nothing to tokenize
    after = scrape(server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("queryserve_requests_total", model="fake", outcome="success") == 3
    assert moved("queryserve_inferences_total", model="fake") == 41
    assert moved("queryserve_executions_total", model="fake") >= 1 + 40 / 8
    assert moved("queryserve_cache_hits_total", model="fake") == 1  # texts, not requests
    assert moved("queryserve_cache_misses_total", model="fake") == 41
    assert moved("queryserve_request_duration_seconds_count", model="fake") == 3
    assert moved("queryserve_batch_size_sum", model="fake") == 41
    assert moved("queryserve_tokenize_duration_seconds_count", model="fake") == 2
    assert moved("queryserve_tokenize_duration_seconds_sum", model="fake") > 0
    assert value(after, "queryserve_queue_depth", model="fake") == 0
    assert value(after, "queryserve_model_ready", model="fake") == 1
    assert value(after, "queryserve_http_requests_in_flight") >= 1  # the scrape itself


def test_triton_s_families_say_what_the_statistics_say(server: RunningServer) -> None:
    """A dashboard, alert or autoscaler written for Triton reads `nv_inference_*` and
    `nv_cache_*` by model and version: the same figures as the statistics extension, in
    both formats (Prometheus 3 asks for OpenMetrics)."""
    infer(server, ["triton one"])
    infer(server, ["triton two", "triton three", "triton four"])
    infer(server, ["triton one"])  # the response cache answers it wholly
    assert httpx.post(f"{server.url}/v2/models/fake/infer", headers=AUTH,
                      json={"inputs": []}).status_code == 400
    samples = scrape(server)
    stats = httpx.get(f"{server.url}/v2/models/fake/stats", headers=AUTH).json()[
        "model_stats"][0]
    inference = stats["inference_stats"]

    def nv(name: str, **labels: str) -> float:
        return value(samples, name, model="fake", version="1", **labels)

    assert nv("nv_inference_request_success") == inference["success"]["count"] >= 3
    assert nv("nv_inference_count") == stats["inference_count"]
    assert nv("nv_inference_exec_count") == stats["execution_count"]
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert nv(f"nv_inference_{name}_duration_us") == inference[name]["ns"] // 1000, name
    assert nv("nv_inference_request_duration_us") == inference["success"]["ns"] // 1000 > 0
    assert nv("nv_cache_num_hits_per_model") == inference["cache_hit"]["count"] >= 1
    assert nv("nv_cache_num_misses_per_model") == inference["cache_miss"]["count"] >= 2
    assert nv("nv_inference_pending_request_count") == 0
    failures = sum(nv("nv_inference_request_failure", reason=reason)
                   for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"))
    assert failures == inference["fail"]["count"] >= 1
    openmetrics = httpx.get(f"{server.url}/metrics", headers={
        **AUTH, "accept": "application/openmetrics-text;version=1.0.0"}).text
    families = {f.name: f for f in openmetrics_families(openmetrics)}
    assert families["nv_inference_request_success"].type == "unknown"
    assert {s.name for s in families["nv_inference_request_success"].samples} == {
        "nv_inference_request_success"}  # Triton's name: no _total


def test_every_bad_request_to_a_model_is_counted_invalid(server: RunningServer) -> None:
    """Regression: only what `Model.infer` refused itself was counted; a wrong datatype, an
    empty text, 1,025 items (413) or a bad OpenAI input were not, so 2 of 6 bad requests
    showed in a model's error rate."""
    before = value(scrape(server), "queryserve_requests_total", model="fake", outcome="invalid")
    bad = [
        ("/v2/models/fake/infer", {"inputs": [{"name": "text", "shape": [1, 1],
                                               "datatype": "FP32", "data": [1.0]}]}),
        ("/v2/models/fake/infer", {"inputs": [{"name": "text", "shape": [1, 1],
                                               "datatype": "BYTES", "data": [""]}]}),
        ("/v2/models/fake/infer", {"inputs": [{"name": "text", "shape": [1025, 1],
                                               "datatype": "BYTES", "data": ["a"] * 1025}]}),
        ("/v1/embeddings", {"model": "fake", "input": 5}),
        ("/v1/embeddings", {"model": "fake", "input": ["a"] * 1025}),
    ]
    for path, body in bad:
        status = httpx.post(f"{server.url}{path}", headers=AUTH, json=body).status_code
        assert status in (400, 413), (path, status)
    after = value(scrape(server), "queryserve_requests_total", model="fake", outcome="invalid")
    assert after - before == len(bad)


@pytest.mark.parametrize(("raw", "status", "reason"), [
    (b"GET / HTTP/1.1 trailing\r\nhost: 127.0.0.1\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nbad header\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: " + b"a" * (MAX_HEADER_BYTES + 1)
     + b"\r\n\r\n", 431, "headers_too_large"),
    (b"GET /" + b"a" * MAX_URL_BYTES + b" HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n", 414,
     "url_too_long"),
    (b"POST /v2/models/fake/infer HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: %d\r\n\r\n"
     % (MAX_BODY_BYTES + 1), 413, "body_too_large"),
    # A head that never ends (slowloris): 408 after the header timeout.
    (b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n", 408, "header_timeout"),
    # A body that stops arriving: 408 after the read timeout (with the key: without it, the
    # head is refused 401 before any of the body is waited for).
    (b"POST /v2/models/fake/infer HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer "
     + KEY.encode() + b"\r\ncontent-length: 10\r\n\r\n{", 408, "read_timeout"),
], ids=["request-line", "header-line", "header-size", "url-size", "body-size", "head-timeout",
        "body-timeout"])
def test_a_request_refused_by_the_transport_is_counted_by_reason(
        server: RunningServer, raw: bytes, status: int, reason: str) -> None:
    before = scrape(server)
    assert exchange(server, raw) == status
    after = scrape(server)
    name = "queryserve_http_rejections_total"
    assert value(after, name, reason=reason) == value(before, name, reason=reason) + 1
    others = {labels for (sample, labels) in after if sample == name} - {
        frozenset({("reason", reason)})}
    assert all(value(after, name, **dict(labels)) == value(before, name, **dict(labels))
               for labels in others)


def test_auth_failures_and_forbidden_hosts_are_counted(server: RunningServer) -> None:
    before = scrape(server)
    assert httpx.get(f"{server.url}/v2/models/fake").status_code == 401
    assert httpx.get(f"{server.url}/v2/models/fake",
                     headers={"authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{server.url}/v2/models/fake",
                     headers={**AUTH, "host": "rebound.example"}).status_code == 403
    after = scrape(server)
    for name, moved in (("queryserve_auth_failures_total", 2),
                        ("queryserve_requests_forbidden_total", 1)):
        assert value(after, name) == value(before, name) + moved, name


# -- the Grafana dashboard ----------------------------------------------------------------------

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers, less functions and
    aggregations (followed by '('), keywords, label matchers, grouping labels, ranges and
    strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", expr):
        if match.group() not in PROMQL_WORDS and not expr[match.end():].lstrip().startswith("("):
            names.add(match.group())
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
    queries = [(f"panel {p['title']!r}", target["expr"])
               for p in panels for target in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"]["query"])
            assert found, variable["name"]
            queries.append((f"variable ${variable['name']}", found.group(1)))
    return queries


def test_metric_names_are_read_from_promql() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (model, le) (rate(a_bucket{model=~'
                        '"$model",x!="y(z)"}[$__rate_interval]))) / on(x) b_total > 0') == {
        "a_bucket", "b_total"}


def test_the_grafana_dashboard_queries_only_what_the_server_exports(
        server: RunningServer) -> None:
    exported = {name for name, _ in scrape(server)}
    queries = dashboard_queries()
    assert len(queries) >= 20
    selected: set[str] = set()
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= exported, f"{where}: {sorted(names - exported)} are not exported"
        selected |= names
    for wanted in ("queryserve_request_duration_seconds_bucket",
                   "queryserve_tokenize_duration_seconds_bucket",
                   "queryserve_http_rejections_total", "queryserve_auth_failures_total",
                   "process_cpu_seconds_total", "process_resident_memory_bytes"):
        assert wanted in selected


def test_the_grafana_dashboard_is_importable_json() -> None:
    dashboard = json.loads(Path(DASHBOARD).read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "queryserve"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "instance", "model"}
    for panel in dashboard["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
