"""`queryserve recommend`: find the model configuration that serves the most (or the cheapest)
queries under a latency bar, by measuring each candidate on a real server.

A point (`Point`) is one configuration of the model's knobs. Each point is served
from its own small model repository (symlinks to the prepared files plus a rewritten
`model.yaml`) by a `queryserve serve` process pinned to the cores it is given
(`server_process.serving`), and measured with the open-loop max-rate search.

The points come staged or as a full grid (`recommend_plan`), with the untuned reference
(`plan.untuned_point`) measured too, so the report says what tuning bought. Finished points are kept
in `recommend-state.json` in the output folder, so a sweep interrupted and run again measures
only what is missing.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from queryserve.bench import recommend_plan as plan
from queryserve.bench.bench import StepObserver, cost_per_million, machine, step_record
from queryserve.bench.loadgen import LoadResult, run_open_loop, run_sync
from queryserve.bench.pareto import pareto_axes, pareto_front
from queryserve.bench.payloads import Payloads
from queryserve.bench.recommend_plan import Knobs, Point
from queryserve.bench.search import Trial, search_max_rate
from queryserve.bench.server_process import build_repository, peak_rss_mb, serving
from queryserve.errors import BenchError

STATE_FILE = "recommend-state.json"
DERIVED_KNOBS = Knobs((), (), (), ())  # empty fields: derived from the model folder


@dataclass(frozen=True)
class Sweep:
    """What `recommend` measures and how it judges."""

    repository: Path
    model: str
    payloads: Payloads
    threshold_ms: float = 10.0
    percentile: str = "p99"
    objective: str = "throughput"  # or "cost"
    price_per_hour: float | None = None
    grid: str = "staged"  # or "full"
    step_duration_s: float = 2.0
    warmup_s: float = 0.5
    start_rate: float = 100.0
    max_rate: float = 20_000.0
    out_dir: Path = Path("bench-out/recommend")
    command: str = ""
    knobs: Knobs = DERIVED_KNOBS
    total_cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

# -- one point on a real server ------------------------------------------------------------


def measure_point(sweep: Sweep, point: Point, config: dict[str, Any], files: dict[str, str],
                  observer: StepObserver) -> dict[str, Any]:
    """Serve the point and search its max rate under the bar; the point's result record."""
    model_dir = sweep.repository / sweep.model
    safe = point.id.replace("/", "_")
    root = build_repository(sweep.out_dir / "repositories" / safe, sweep.model, model_dir,
                            plan.point_yaml(config, point, files))
    record: dict[str, Any] = {"id": point.id, "params": {**asdict(point), "cores": point.cores},
                              "max_rate": 0.0, "latency_ms": {}, "cost_per_million": None,
                              "rss_mb": None, "error": None}
    try:
        with serving(root, point.cores, sweep.total_cores,
                     sweep.out_dir / "logs" / f"{safe}.log", workers=point.workers) as (url, proc):
            rate, result = _search(sweep, f"{url}/v2/models/{sweep.model}/infer", observer)
            record["rss_mb"] = peak_rss_mb(proc.pid)
    except BenchError as exc:
        record["error"] = exc.message
        return record
    except OSError as exc:  # the point's server went away mid-search: the sweep goes on
        record["error"] = f"the server stopped answering: {exc}"
        return record
    if result is not None and rate > 0:
        inferences = result.throughput * sweep.payloads.items_per_request
        price = (None if sweep.price_per_hour is None
                 else sweep.price_per_hour * point.cores / sweep.total_cores)
        record.update(max_rate=rate, capped=rate >= sweep.max_rate,
                      latency_ms={k: round(v, 3) for k, v in result.percentiles.items()},
                      cost_per_million=cost_per_million(price, inferences))
    return record


def _search(sweep: Sweep, url: str,
            observer: StepObserver) -> tuple[float, LoadResult | None]:
    p = sweep.payloads

    async def measure(rate: float) -> LoadResult:
        observer.step_started(f"{rate:,.0f} req/s", sweep.warmup_s + sweep.step_duration_s)
        return await run_open_loop(url, p.bodies, rate, sweep.step_duration_s,
                                   warmup_s=sweep.warmup_s, content_type=p.content_type,
                                   body_headers=p.body_headers, max_connections=256)

    def show(trial: Trial) -> None:
        observer.step_finished(step_record(f"{trial.level:,.0f} req/s", trial.result,
                                           trial.passed, items_per_request=p.items_per_request))

    rate, result, _ = run_sync(search_max_rate(
        measure, sweep.threshold_ms, percentile=sweep.percentile, start_rate=sweep.start_rate,
        max_rate=sweep.max_rate, on_trial=show, precision=0.1))
    return rate, result


# -- the sweep -----------------------------------------------------------------------------


def _digest(parts: Sequence[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()[:16]


def _files_digest(folder: Path) -> str:
    """Which files a model folder serves: each one's path, size and time of change."""
    entries = sorted(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}".encode()
                     for p in folder.rglob("*") if p.is_file())
    return _digest(entries)


def _load_state(path: Path, key: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Points measured by an earlier run with the same judging settings."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if state.get("key") != key:
        return {}  # other bar, model or queries: those figures do not compare
    points: dict[str, dict[str, Any]] = state.get("points", {})
    return points


def _save_state(path: Path, key: dict[str, Any], points: dict[str, dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "points": points}, indent=1))
    tmp.replace(path)  # atomic: an interrupt never leaves a half-written state


def run_recommend(sweep: Sweep, observer: StepObserver,
                  on_point: Callable[[int, int | None, Point, dict[str, Any] | None, bool],
                                     None]
                  ) -> dict[str, Any]:
    """Measure the sweep's points (reusing finished ones) and pick the best.

    ``on_point(i, total, point, record, kept)`` is called before a point runs (record None)
    and after it (with its record); a point kept from an earlier run gets only the second call,
    with ``kept`` True. ``total`` is None in a staged sweep, whose length depends on what it
    finds.
    """
    model_dir = sweep.repository / sweep.model
    try:
        config = yaml.safe_load((model_dir / "model.yaml").read_text())
    except OSError:
        raise BenchError(f"no model {sweep.model!r} in {sweep.repository}") from None
    except yaml.YAMLError as exc:
        raise BenchError(f"{model_dir / 'model.yaml'} is not valid YAML: "
                         f"{' '.join(str(exc).split())}") from None
    files = plan.model_files(model_dir)
    start = plan.current_point(config, files, sweep.total_cores)
    base = plan.default_knobs(files, start, sweep.total_cores,
                              str(config.get("backend", "onnxruntime")))
    given = sweep.knobs
    knobs = Knobs(given.precisions or base.precisions, given.layouts or base.layouts,
                  given.max_batch_sizes or base.max_batch_sizes,
                  given.delays_us or base.delays_us, given.spinning or base.spinning,
                  given.overheads or base.overheads, given.workers or base.workers)
    unknown = set(knobs.precisions) - set(files)
    if unknown:
        raise BenchError(f"unknown precision {sorted(unknown)}: prepared are {sorted(files)}")
    if any(i * t > sweep.total_cores for i, t in knobs.layouts):
        raise BenchError(f"a layout needs more than the {sweep.total_cores} cores available")
    sweep.out_dir.mkdir(parents=True, exist_ok=True)
    (sweep.out_dir / "logs").mkdir(exist_ok=True)
    state_path = sweep.out_dir / STATE_FILE
    # "points": 3 since points carry the workers; an older state's ids name other points.
    # Everything a point's figure depends on: with the rates, the repository and the queries
    # left out, a rerun with --max-rate 2000 reprinted the points capped at 200, and one on
    # another repository kept the first model's figures for the second's model.yaml.
    key = {"points": 3, "model": sweep.model, "threshold_ms": sweep.threshold_ms,
           "percentile": sweep.percentile, "step_duration_s": sweep.step_duration_s,
           "warmup_s": sweep.warmup_s, "start_rate": sweep.start_rate,
           "max_rate": sweep.max_rate, "model_files": _files_digest(sweep.repository /
                                                                    sweep.model),
           "bodies": _digest(sweep.payloads.bodies), "price_per_hour": sweep.price_per_hour,
           "items_per_request": sweep.payloads.items_per_request}
    done = _load_state(state_path, key)
    measured: list[Point] = []

    def measure(points: Sequence[Point]) -> None:
        for point in points:
            if point in measured:
                continue
            measured.append(point)
            total = None if sweep.grid == "staged" else len(points)
            kept = point.id in done
            if not kept:
                on_point(len(measured), total, point, None, False)
                done[point.id] = measure_point(sweep, point, config, files, observer)
                _save_state(state_path, key, done)
            on_point(len(measured), total, point, done[point.id], kept)

    untuned = plan.untuned_point(start, sweep.total_cores)
    if sweep.grid == "full":
        measure([start, untuned, *plan.full_grid(knobs, sweep.total_cores)])
    else:
        best = start
        for stage in range(len(plan.STAGES)):
            measure([best, *plan.stage_points(stage, best, knobs, sweep.total_cores)])
            winner = plan.best_point([done[p.id] for p in measured], sweep.objective,
                                     sweep.percentile)
            if winner is not None:
                best = next(p for p in measured if p.id == winner["id"])
        # Last, so a reference that ties the current config on a noisy run cannot steer the
        # stages away from it; it still wins if it measures best.
        measure([untuned])
    return _results(sweep, config, files, [done[p.id] for p in measured], start, untuned)


def _results(sweep: Sweep, config: dict[str, Any], files: dict[str, str],
             points: list[dict[str, Any]], start: Point, untuned: Point) -> dict[str, Any]:
    results: dict[str, Any] = {
        "kind": "recommend",
        "command": sweep.command or shlex.join(sys.argv),
        "started_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "model": sweep.model,
        "objective": sweep.objective,
        "threshold": {"percentile": sweep.percentile, "ms": sweep.threshold_ms},
        "price_per_hour": sweep.price_per_hour,
        "points": points,
    }
    maximize, minimize = pareto_axes(results)
    front = set(pareto_front(points, maximize, minimize))
    winner = plan.best_point(points, sweep.objective, sweep.percentile)
    for p in points:
        p["pareto"] = p["id"] in front
        p["best"] = winner is not None and p["id"] == winner["id"]
        p["default"] = p["id"] == start.id
        p["untuned"] = p["id"] == untuned.id
    results["best"] = winner["id"] if winner else None
    results["default"] = start.id
    results["untuned"] = untuned.id
    if winner is not None:
        point = Point.from_params(winner["params"])
        results["best_model_yaml"] = (
            f"# Written by `queryserve recommend` on {results['started_at']}: the best point\n"
            f"# ({sweep.objective}) under {sweep.percentile} <= {sweep.threshold_ms:g} ms, "
            f"{winner['max_rate']:,.0f} req/s measured. Serve it with --cores {point.cores} "
            f"--workers {point.workers}.\n"
            + yaml.safe_dump(plan.point_yaml(config, point, files), sort_keys=False))
    else:
        results["best_model_yaml"] = None
    return results
