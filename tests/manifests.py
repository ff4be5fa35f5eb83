"""The deployment manifests under deploy/, read as the tests need them: every YAML document of a
folder, one by kind, the container's command line, and the prometheus-adapter rule that the
autoscaler's metric comes from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
ADAPTER_VALUES = KUBERNETES / "prometheus-adapter-values.yaml"

Manifest = dict[str, Any]


def documents(folder: Path) -> list[tuple[Path, Manifest]]:
    """Every Kubernetes object in a folder's YAML files (the kustomization and the adapter's
    Helm values are not objects), with the file it is in."""
    found = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name == "kustomization.yaml" or path == ADAPTER_VALUES:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((path, doc))
    return found


def kustomization(folder: Path) -> Manifest:
    loaded: Manifest = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return loaded


def one(folder: Path, kind: str) -> Manifest:
    """The only object of `kind` in the folder."""
    matches = [doc for _, doc in documents(folder) if doc["kind"] == kind]
    assert len(matches) == 1, f"{folder.name}: {len(matches)} objects of kind {kind}"
    return matches[0]


def container_command(container: Manifest, env: dict[str, str]) -> list[str]:
    """The container's command line as the kubelet runs it: `command` then `args`, with each
    `$(NAME)` replaced by `env[NAME]` (the kubelet's own expansion)."""
    words = [*container.get("command", []), *container.get("args", [])]
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], word)
            for word in words]


def adapter_rules() -> list[Manifest]:
    values: Manifest = yaml.safe_load(ADAPTER_VALUES.read_text())
    rules: list[Manifest] = values["rules"]["custom"]
    return rules


def adapter_rule_serving(metric: str) -> Manifest:
    """The prometheus-adapter rule whose `name.as` is `metric` (the name an HPA asks for)."""
    matches = [rule for rule in adapter_rules() if rule["name"]["as"] == metric]
    assert len(matches) == 1, f"{len(matches)} prometheus-adapter rules serve {metric!r}"
    return matches[0]


def series_name(series_query: str) -> str:
    """The metric a prometheus-adapter `seriesQuery` selects: `name{matchers}`."""
    found = re.fullmatch(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{.*\})?\s*", series_query)
    assert found, f"seriesQuery {series_query!r} does not name one metric"
    return found.group(1)


def expand_metrics_query(rule: Manifest) -> str:
    """The rule's `metricsQuery` as PromQL, its template filled in the way the adapter fills it
    for one pod: `<<.Series>>` the series' name, `<<.LabelMatchers>>` matchers on namespace and
    pod, `<<.GroupBy>>` the pod label."""
    query: str = rule["metricsQuery"]
    return (query
            .replace("<<.Series>>", series_name(rule["seriesQuery"]))
            .replace("<<.LabelMatchers>>", 'namespace="default",pod="queryserve-0"')
            .replace("<<.GroupBy>>", "pod"))
