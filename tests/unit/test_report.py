"""Results writers for `queryserve bench` / `queryserve recommend`, and the Pareto front."""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from queryserve.bench.console import gains
from queryserve.bench.pareto import pareto_axes
from queryserve.bench.report import (
    pareto_front,
    write_bench_report,
    write_recommend_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert(1)</script>"


def _timeline(
    seconds: int, ok: int, p50: float | None, p99: float | None, errors: int = 0
) -> list[dict[str, Any]]:
    return [
        {
            "t_s": float(t),
            "ok": ok,
            "errors": errors if t == 1 else 0,
            "p50_ms": p50 if p50 is None else p50 + 0.1 * t,
            "p99_ms": p99 if p99 is None else p99 + 0.5 * t,
        }
        for t in range(seconds)
    ]


def _step(
    rate: float,
    p50: float,
    p99: float,
    *,
    passed: bool | None,
    server: bool = True,
    label: str | None = None,
) -> dict[str, Any]:
    ok = int(rate * 3)
    return {
        "label": label or f"{rate:g} req/s",
        "mode": "open",
        "target_rate": rate,
        "users": None,
        "duration_s": 3.0,
        "throughput": rate * 0.995,
        "inferences_per_s": rate * 0.995,
        "latency_ms": {
            "p50": p50,
            "p90": p50 * 1.5,
            "p95": p50 * 1.8,
            "p99": p99,
            "p99.9": p99 * 1.3,
            "max": p99 * 2,
        },
        "by_status": {"200": ok},
        "errors": 0,
        "timeouts": 0,
        "client_cpu_us_per_request": 80.0,
        "client_cpu_share": rate * 80e-6,
        "client_bound": False,
        "passed": passed,
        "cost_per_million": 0.1 / (rate * 3600) * 1e6,
        "server": {
            "requests": ok,
            "inferences": ok,
            "executions": ok // 2,
            "mean_batch": 2.0,
            "queue_ms_per_request": 0.4,
            "compute_ms_per_request": 1.1,
            "batch_sizes": {"1": ok // 4, "2": ok // 8, "4": ok // 16},
        }
        if server
        else None,
        "timeline": _timeline(3, int(rate), p50, p99),
    }


def bench_results() -> dict[str, Any]:
    steps = [
        _step(100, 2.0, 4.0, passed=True),
        _step(200, 2.2, 5.0, passed=True, label=f"200 req/s {EVIL}"),
        _step(400, 2.8, 8.0, passed=True, server=False),
        _step(800, 9.0, 17.2, passed=False),
    ]
    # Overload: nothing came back, only errors and 503s.
    dead = _step(1600, 0, 0, passed=False)
    dead.update(
        latency_ms={},
        by_status={"503": 40},
        errors=12,
        timeouts=5,
        throughput=0.0,
        inferences_per_s=0.0,
        cost_per_million=None,
        client_bound=True,
        client_cpu_share=0.93,
        timeline=_timeline(3, 0, None, None, errors=7),
    )
    steps.append(dead)
    closed = _step(350, 3.0, 6.5, passed=None, label="32 users $\\frac$")
    closed.update(
        mode="closed", target_rate=None, users=32, throughput=350.0, inferences_per_s=350.0
    )
    steps.append(closed)
    return {
        "kind": "bench",
        "command": "queryserve bench --url http://127.0.0.1:8000 --max-rate",
        "started_at": "2026-11-22T08:50:00Z",
        "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "python": "3.11.7"},
        "url": "http://127.0.0.1:8000/v2/models/embed/infer",
        "model": "embed",
        "protocol": "kserve",
        "items_per_request": 1,
        "price_per_hour": 0.10,
        "search": {"percentile": "p99", "threshold_ms": 10.0, "max_rate": 400.0},
        "stop_reason": "p99 17.2 ms > 10 ms at 800 req/s",
        "steps": steps,
    }


def _point(
    pid: str,
    precision: str,
    batch: int,
    rate: float,
    p99: float | None,
    cost: float | None,
    **extra: Any,
) -> dict[str, Any]:
    point = {
        "id": pid,
        "params": {
            "precision": precision,
            "max_batch_size": batch,
            "max_queue_delay_us": 0,
            "instances": 2,
            "threads": 1,
            "cores": 2,
        },
        "max_rate": rate,
        "latency_ms": {"p50": None if p99 is None else p99 / 2.5, "p99": p99},
        "cost_per_million": cost,
        "rss_mb": 250.0,
        "pareto": False,
        "best": False,
        "default": False,
        "error": None,
    }
    point.update(extra)
    return point


def recommend_results() -> dict[str, Any]:
    points = [
        _point("fp32/b1/d0/2x1", "fp32", 1, 210.0, 7.5, 0.13, default=True),
        _point("fp32/b64/d0/2x1", "fp32", 64, 300.0, 9.1, 0.09, untuned=True),
        _point("int8/b64/d0/2x1", "int8", 64, 520.0, 8.9, 0.05, pareto=True, best=True),
        _point("int8/b8/d0/2x1", "int8", 8, 450.0, 4.2, 0.06, pareto=True),
        _point(
            "int8/b64/d500/2x1",
            "int8",
            64,
            0.0,
            None,
            None,
            error="server exited: <killed> & OOM",
            rss_mb=None,
        ),
    ]
    return {
        "kind": "recommend",
        "command": "queryserve recommend embed",
        "started_at": "2026-11-22T09:10:00Z",
        "machine": {"cpu": "AMD EPYC 7B13", "cores": 2},
        "model": "embed",
        "objective": "throughput",
        "threshold": {"percentile": "p99", "ms": 10.0},
        "price_per_hour": 0.1,
        "points": points,
        "best": "int8/b64/d0/2x1",
        "default": "fp32/b1/d0/2x1",
        "untuned": "fp32/b64/d0/2x1",
        "best_model_yaml": "backend: onnxruntime\nmax_batch_size: 64  # <int8> & fused\n",
    }


def assert_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape[0] >= 300 and image.shape[1] >= 600
    assert image.std() > 0.01  # not a blank canvas


def embedded_images(page: str) -> list[str]:
    return re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)


def win_labels(page: str) -> list[str]:
    """Labels of the bench table's green rows (the step that set the max rate)."""
    return re.findall(r'<tr class="win"><td>\d+</td><td class="l">([^<]*)</td>', page)


def test_bench_report_files_csv_and_html(tmp_path: Path) -> None:
    results = bench_results()
    before = copy.deepcopy(results)
    paths = write_bench_report(results, tmp_path / "out")
    assert results == before  # the writer does not mutate its input
    names = [path.name for path in paths]
    assert names == [
        "results.json",
        "results.csv",
        "latency_over_time.png",
        "latency_vs_throughput.png",
        "batch_sizes.png",
        "report.html",
    ]
    assert all(path.exists() and path.parent == tmp_path / "out" for path in paths)
    for path in paths:
        if path.suffix == ".png":
            assert_png(path)

    assert json.loads((tmp_path / "out" / "results.json").read_text()) == results

    with (tmp_path / "out" / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6
    assert [row["label"] for row in rows] == [step["label"] for step in results["steps"]]
    first, dead, closed = rows[0], rows[4], rows[5]
    assert float(first["p99_ms"]) == 4.0 and float(first["p99.9_ms"]) == pytest.approx(5.2)
    assert float(first["throughput"]) == pytest.approx(99.5)
    assert int(first["ok"]) == 300 and int(first["rejections"]) == 0
    assert first["passed"] == "true" and float(first["server_mean_batch"]) == 2.0
    assert rows[2]["server_mean_batch"] == "" and rows[2]["server_queue_ms_per_request"] == ""
    assert dead["p50_ms"] == "" and dead["max_ms"] == "" and dead["cost_per_million"] == ""
    assert int(dead["ok"]) == 0 and int(dead["rejections"]) == 40
    assert int(dead["errors"]) == 12 and int(dead["timeouts"]) == 5
    assert dead["client_bound"] == "true" and dead["passed"] == "false"
    assert closed["mode"] == "closed" and closed["users"] == "32" and closed["target_rate"] == ""
    assert closed["passed"] == ""

    page = (tmp_path / "out" / "report.html").read_text()
    assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert not re.search(r'src="(?!data:)', page)  # no external resources
    for step in results["steps"]:
        label = step["label"].replace("<", "&lt;").replace(">", "&gt;")
        assert label in page
    assert len(embedded_images(page)) == 3
    assert "400 req/s</strong>" in page  # headline: the max rate
    assert win_labels(page) == ["400 req/s"]  # no search.step: the passed step at the max rate
    assert "<th>cost / 1M inferences</th>" in page and "1M req<" not in page
    assert "p99 17.2 ms &gt; 10 ms at 800 req/s" in page  # stop reason, escaped
    assert "client CPU-bound at step 1600 req/s" in page and "93% of a core" in page
    assert "no successful responses at step 1600 req/s" in page
    assert "AMD EPYC 7B13" in page and "http://127.0.0.1:8000/v2/models/embed/infer" in page


def test_bench_report_without_server_price_or_search(tmp_path: Path) -> None:
    """A third-party server: no server block, no price, no search; one step."""
    results = bench_results()
    results.update(price_per_hour=None, search=None, stop_reason=None)
    results["steps"] = results["steps"][2:3]
    results["steps"][0]["cost_per_million"] = None
    paths = write_bench_report(results, tmp_path)
    assert [p.name for p in paths] == [
        "results.json",
        "results.csv",
        "latency_over_time.png",
        "latency_vs_throughput.png",
        "report.html",
    ]
    assert not (tmp_path / "batch_sizes.png").exists()
    page = (tmp_path / "report.html").read_text()
    assert "Peak throughput" in page and "not given" in page
    assert len(embedded_images(page)) == 2


def test_bench_report_with_no_data_writes_no_plots(tmp_path: Path) -> None:
    results = bench_results()
    results["steps"] = [results["steps"][4]]  # zero successes
    results["steps"][0].update(timeline=[], server=None)
    results["search"]["max_rate"] = None
    names = [p.name for p in write_bench_report(results, tmp_path)]
    assert names == ["results.json", "results.csv", "report.html"]
    page = (tmp_path / "report.html").read_text()
    assert "No tested rate met p99" in page and "no data to plot" in page
    assert embedded_images(page) == []


def test_bench_report_highlights_the_step_search_names(tmp_path: Path) -> None:
    """``search.step`` picks the winning row; older results without it fall back to a guess."""
    results = bench_results()
    results["steps"] = [
        _step(400, 2.0, 6.0, passed=True, server=False, label="400 first"),
        _step(400, 2.5, 7.0, passed=True, server=False, label="400 again"),
    ]
    for step in results["steps"]:
        step["timeline"] = []  # one plot per report is enough here

    def winners(**search: Any) -> list[str]:
        results["search"] = {"percentile": "p99", "threshold_ms": 10.0, "max_rate": 400.0}
        results["search"].update(search)
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        return win_labels(write_bench_report(results, out)[-1].read_text())

    assert winners() == ["400 again"]  # fallback: the last passed step at the max rate
    assert winners(step=0) == ["400 first"]
    assert winners(step=None) == []  # the search says no step set the max rate
    assert winners(step=7) == []  # out of range: nothing highlighted, no crash


def test_recommend_report(tmp_path: Path) -> None:
    results = recommend_results()
    paths = write_recommend_report(results, tmp_path)
    assert [p.name for p in paths] == [
        "recommend.json",
        "recommend.csv",
        "pareto.png",
        "recommend.html",
    ]
    assert_png(tmp_path / "pareto.png")
    assert json.loads((tmp_path / "recommend.json").read_text()) == results

    with (tmp_path / "recommend.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        columns = reader.fieldnames
    assert columns is not None
    assert columns[:7] == [
        "id",
        "precision",
        "max_batch_size",
        "max_queue_delay_us",
        "instances",
        "threads",
        "cores",
    ]
    assert len(rows) == 5
    best = rows[2]
    assert best["id"] == "int8/b64/d0/2x1" and best["precision"] == "int8"
    assert float(best["max_rate"]) == 520.0 and float(best["p99_ms"]) == 8.9
    assert best["best"] == "true" and best["pareto"] == "true"
    assert rows[0]["default"] == "true" and rows[0]["best"] == "false"
    assert [row["untuned"] for row in rows] == ["false", "true", "false", "false", "false"]
    failed = rows[4]
    assert failed["p99_ms"] == "" and failed["cost_per_million"] == ""
    assert failed["error"] == "server exited: <killed> & OOM"

    page = (tmp_path / "recommend.html").read_text()
    assert len(embedded_images(page)) == 1
    assert re.search(r'<tr class="best"><td class="l">int8/b64/d0/2x1', page)
    assert page.count("\u2605 Pareto") == 2
    assert "server exited: &lt;killed&gt; &amp; OOM" in page
    assert "<pre>backend: onnxruntime\nmax_batch_size: 64  # &lt;int8&gt; &amp; fused\n</pre>" in (
        page
    )
    assert "2.48\u00d7 the max rate of the default" in page
    assert "1.73\u00d7 the max rate of the untuned configuration fp32/b64/d0/2x1" in page
    assert "1.73x the untuned config (300 req/s)" in gains(results)
    assert "cost 0.05 per million inferences" in page and "<th>cost / 1M inferences</th>" in page


def test_recommend_report_cost_objective_without_yaml(tmp_path: Path) -> None:
    results = recommend_results()
    results.update(objective="cost", best_model_yaml=None, best=None)
    names = [p.name for p in write_recommend_report(results, tmp_path)]
    assert "pareto.png" in names
    page = (tmp_path / "recommend.html").read_text()
    assert "<pre>" not in page and "No configuration met p99" in page


def test_recommend_front_without_flags_uses_pareto_axes(tmp_path: Path) -> None:
    """Points without a ``pareto`` flag (older files) get the producer's front: cost axis here."""
    results = recommend_results()
    results["objective"] = "cost"
    for point in results["points"]:
        del point["pareto"]
    front = pareto_front(results["points"], *pareto_axes(results))
    assert front == ["int8/b64/d0/2x1"]  # by p99 it would be ["int8/b8/d0/2x1", "int8/b64/d0/2x1"]
    write_recommend_report(results, tmp_path)
    with (tmp_path / "recommend.csv").open(newline="") as handle:
        assert [row["id"] for row in csv.DictReader(handle) if row["pareto"] == "true"] == front
    assert (tmp_path / "recommend.html").read_text().count("\u2605 Pareto") == 1


# --------------------------------------------------------------------------- pareto_front


def pts(*rows: tuple[str, float, float | None]) -> list[dict[str, Any]]:
    return [
        {
            "id": pid,
            "max_rate": rate,
            "cost_per_million": cost,
            "latency_ms": {"p99": None if cost is None else cost * 100, "p99.9": 1.0},
        }
        for pid, rate, cost in rows
    ]


def test_pareto_dominance_ordered_by_the_minimized_field() -> None:
    points = pts(("a", 100, 1.0), ("b", 200, 2.0), ("c", 150, 3.0), ("d", 300, 5.0), ("e", 90, 1.0))
    # c is dominated by b (more rate, less cost); e by a (same cost, less rate).
    assert pareto_front(points, "max_rate", "cost_per_million") == ["a", "b", "d"]


def test_pareto_ties_are_all_kept() -> None:
    points = pts(("a", 100, 1.0), ("b", 100, 1.0), ("c", 50, 2.0))
    assert pareto_front(points, "max_rate", "cost_per_million") == ["a", "b"]


def test_pareto_zero_or_missing_rate_is_never_on_the_front() -> None:
    points = pts(("zero", 0, 0.01), ("ok", 10, 5.0))
    points.append({"id": "failed", "max_rate": None, "cost_per_million": 0.001})
    assert pareto_front(points, "max_rate", "cost_per_million") == ["ok"]
    assert pareto_front(pts(("zero", 0.0, 1.0)), "max_rate", "cost_per_million") == []
    assert pareto_front([], "max_rate", "cost_per_million") == []


def test_pareto_minimize_cost_vs_p99() -> None:
    # cost and p99 disagree: x is cheapest, y has the lowest p99.
    points: list[dict[str, Any]] = [
        {"id": "x", "max_rate": 500, "cost_per_million": 0.05, "latency_ms": {"p99": 9.0}},
        {"id": "y", "max_rate": 400, "cost_per_million": 0.20, "latency_ms": {"p99": 3.0}},
        {"id": "z", "max_rate": 450, "cost_per_million": 0.10, "latency_ms": {"p99": 9.5}},
    ]
    assert pareto_front(points, "max_rate", "cost_per_million") == ["x"]
    assert pareto_front(points, "max_rate", "latency_ms.p99") == ["y", "x"]
    points[0]["latency_ms"]["p99.9"] = 12.0
    points[1]["latency_ms"]["p99.9"] = 11.0
    assert pareto_front(points, "max_rate", "latency_ms.p99.9") == ["y", "x"]  # key with a dot


def test_pareto_missing_minimized_value_counts_as_worst() -> None:
    # No price given: all costs None, so only the highest rate(s) survive.
    points = pts(("a", 100, None), ("b", 300, None), ("c", 300, None))
    assert pareto_front(points, "max_rate", "cost_per_million") == ["b", "c"]
    # A known cost beats an unknown one at the same rate; a higher rate still wins through.
    points = pts(("a", 100, None), ("b", 100, 1.0), ("c", 300, None))
    assert pareto_front(points, "max_rate", "cost_per_million") == ["b", "c"]


def test_pareto_axes() -> None:
    results = recommend_results()
    assert pareto_axes(results) == ("max_rate", "latency_ms.p99")  # objective: throughput
    results["objective"] = "cost"
    assert pareto_axes(results) == ("max_rate", "cost_per_million")
    results["threshold"]["percentile"] = "p99.9"
    for point in results["points"]:
        point["cost_per_million"] = None  # no price given: latency at the threshold percentile
    assert pareto_axes(results) == ("max_rate", "latency_ms.p99.9")
    assert pareto_axes({}) == ("max_rate", "latency_ms.p99")
