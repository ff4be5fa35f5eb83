"""The machine-readable files: strict JSON, and CSV rows for bench steps and recommend points."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from queryserve.bench.report.values import PERCENTILES, as_dict, status_counts, text

_SERVER_FIELDS = ("mean_batch", "queue_ms_per_request", "compute_ms_per_request")
BENCH_COLUMNS = [
    "step", "label", "mode", "target_rate", "users", "duration_s", "throughput",
    "inferences_per_s", *(f"{key}_ms" for key in PERCENTILES), "ok", "errors", "timeouts",
    "rejections", "client_cpu_us_per_request", "client_cpu_share", "client_bound", "passed",
    "cost_per_million", *(f"server_{key}" for key in _SERVER_FIELDS),
]


def _json_safe(value: Any) -> Any:
    """Strict JSON: NaN/inf become null, tuples become lists, other objects their str."""
    if isinstance(value, Mapping):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def write_json(results: Mapping[str, Any], path: Path) -> Path:
    text = json.dumps(_json_safe(results), indent=2, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _csv_cell(value: Any) -> Any:
    """CSV cell: empty for None/NaN/inf, lowercase true/false for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # 10 significant digits: no float noise (3.6399999999999997), no loss that matters.
        return float(f"{value:.10g}") if math.isfinite(value) else ""
    return value


def write_csv(rows: list[dict[str, Any]], columns: list[str], path: Path) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({key: _csv_cell(row.get(key)) for key in columns} for row in rows)
    return path


def bench_rows(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step, keyed by ``BENCH_COLUMNS``."""
    rows = []
    for index, step in enumerate(steps):
        ok, rejected = status_counts(step)
        latency, server = as_dict(step.get("latency_ms")), as_dict(step.get("server"))
        row: dict[str, Any] = {"step": index + 1, "ok": ok, "rejections": rejected}
        row |= {f"{key}_ms": latency.get(key) for key in PERCENTILES}
        row |= {f"server_{key}": server.get(key) for key in _SERVER_FIELDS}
        row |= {key: step.get(key) for key in BENCH_COLUMNS if key not in row}
        rows.append(row)
    return rows


def param_names(points: list[dict[str, Any]]) -> list[str]:
    """Names of the swept parameters, in order of first appearance."""
    names = (str(name) for point in points for name in as_dict(point.get("params")))
    return list(dict.fromkeys(names))


def extra_percentile(results: Mapping[str, Any]) -> str:
    """The threshold percentile when it is not p50 or p99 (it then gets its own column), else ""."""
    percentile = text(as_dict(results.get("threshold")).get("percentile")) or "p99"
    return "" if percentile in ("p50", "p99") else percentile


def recommend_rows(
    results: Mapping[str, Any], points: list[dict[str, Any]], front: Collection[str]
) -> tuple[list[str], list[dict[str, Any]]]:
    """(CSV columns, one row per point): id, one column per parameter, then the measurements.

    A parameter whose name clashes with a fixed column becomes ``param_<name>``.
    ``front`` holds the ids on the Pareto front.
    """
    extra = extra_percentile(results)
    fixed = ["id", "max_rate", "p50_ms", "p99_ms", *([f"{extra}_ms"] if extra else []),
             "cost_per_million", "rss_mb", "pareto", "best", "default", "untuned",
             "error"]
    params = {name: name if name not in fixed else f"param_{name}" for name in param_names(points)}
    rows = []
    for point in points:
        latency, values = as_dict(point.get("latency_ms")), as_dict(point.get("params"))
        row: dict[str, Any] = {column: values.get(name) for name, column in params.items()}
        row |= {f"{key}_ms": latency.get(key) for key in ("p50", "p99", extra) if key}
        row |= {key: point.get(key) for key in ("id", "max_rate", "cost_per_million", "rss_mb")}
        # Each flag as the point has it, else whether it is the point the results name.
        for key in ("best", "default", "untuned"):
            row[key] = point.get(key, point.get("id") == results.get(key))
        row |= {"pareto": text(point.get("id")) in front, "error": point.get("error")}
        rows.append(row)
    return fixed[:1] + list(params.values()) + fixed[1:], rows
