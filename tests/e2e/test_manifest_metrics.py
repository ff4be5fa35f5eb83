"""Every metric the Kubernetes autoscaler names is one a running server exports at `/metrics`,
through the prometheus-adapter rule that serves it (the Grafana dashboard's queries are checked
the same way in test_metrics.py, whose PromQL reader this uses). The server is real, on
127.0.0.1, over a fake model; its scrape is read with `prometheus_client`'s parser, so a renamed
or dropped metric fails here, not in a cluster."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunningServer, start_server, stop_server, write_fake_model
from tests.e2e.test_metrics import metric_names
from tests.manifests import (
    KUBERNETES,
    adapter_rule_serving,
    adapter_rules,
    expand_metrics_query,
    one,
    series_name,
)

KEY = "manifest-metrics-key"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, set[str]]]:
    """Each sample name the server exports, with the label names it carries."""
    repository = tmp_path_factory.mktemp("manifest-metrics")
    write_fake_model(repository, "fake")
    server: RunningServer = start_server(repository, repository / "server.log", "--api-key", KEY)
    try:
        response = httpx.get(f"{server.url}/metrics",
                             headers={"authorization": f"Bearer {KEY}"})
        assert response.status_code == 200
        labels: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                labels.setdefault(sample.name, set()).update(sample.labels)
        yield labels
    finally:
        stop_server(server)


def test_the_autoscaler_scales_on_a_metric_the_server_exports(
        exported: dict[str, set[str]]) -> None:
    autoscaler = one(KUBERNETES, "HorizontalPodAutoscaler")
    names = [m["pods"]["metric"]["name"] for m in autoscaler["spec"]["metrics"]
             if m["type"] == "Pods"]
    assert names, "the autoscaler has no Pods metric"
    for name in names:
        rule = adapter_rule_serving(name)
        series = series_name(rule["seriesQuery"])
        assert series in exported, f"{name}: the adapter reads {series}, not exported"
        assert metric_names(expand_metrics_query(rule)) == {series}
        # The rule sums a pod's series over the model label: the gauge must be per model.
        assert "model" in exported[series]


def test_every_adapter_rule_reads_an_exported_metric(exported: dict[str, set[str]]) -> None:
    for rule in adapter_rules():
        names = metric_names(expand_metrics_query(rule)) | {series_name(rule["seriesQuery"])}
        assert names <= set(exported), f"{rule['name']['as']}: {sorted(names - set(exported))}"

