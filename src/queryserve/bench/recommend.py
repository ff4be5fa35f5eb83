"""`queryserve recommend`: find the model configuration that serves the most (or the cheapest)
queries under a latency bar, by measuring each candidate on a real server.

A point is one configuration: the model file (precision), max batch size, max queue delay,
instances x intra-op threads, and how the batcher cuts its queue (`batch_overhead_tokens`).
Each point is served from its own small model repository (symlinks to the prepared files
plus a rewritten `model.yaml`) by a `queryserve serve` process pinned to the cores it is
given, and measured with the open-loop max-rate search.

By default the sweep is staged, like Model Analyzer's quick search: vary one knob at a time
around the best point so far (precision, then instances x threads, then max batch size, then
the batch cut, then queue delay), about fifteen points instead of a full grid of hundreds.
`--grid full` measures every combination. Either way the sweep also measures the untuned
reference (`untuned_point`), so the report says what tuning bought. Finished points are kept
in `recommend-state.json` in the output folder, so a sweep interrupted and run again measures
only what is missing.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from queryserve.bench.bench import StepObserver, cost_per_million, machine, step_record
from queryserve.bench.loadgen import LoadResult, run_open_loop, run_sync
from queryserve.bench.pareto import pareto_axes, pareto_front
from queryserve.bench.payloads import Payloads
from queryserve.bench.search import Trial, search_max_rate
from queryserve.config import DynamicBatching, InstanceGroup
from queryserve.errors import BenchError

STATE_FILE = "recommend-state.json"
READY_TIMEOUT_S = 180.0


@dataclass(frozen=True, order=True)
class Point:
    """One candidate configuration."""

    precision: str  # a variant name from the model's prepare.json
    max_batch_size: int
    max_queue_delay_us: int
    instances: int
    threads: int
    spinning: bool = False  # ONNX Runtime's intra-op threads spin between batches
    # The batcher's cost per batch in padded tokens; None: as few batches as the limits allow.
    batch_overhead_tokens: int | None = None

    @property
    def id(self) -> str:
        return (f"{self.precision}/b{self.max_batch_size}/d{self.max_queue_delay_us}/"
                f"{self.instances}x{self.threads}" + ("/spin" if self.spinning else "")
                + ("" if self.batch_overhead_tokens is None
                   else f"/o{self.batch_overhead_tokens}"))

    @property
    def cores(self) -> int:
        return self.instances * self.threads

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Point:
        """The point a result record's ``params`` describe (every knob, spinning included)."""
        return cls(**{f.name: params[f.name] for f in fields(cls) if f.name in params})


@dataclass(frozen=True)
class Knobs:
    """The values each knob may take (in a `Sweep`, an empty one means the default's)."""

    precisions: tuple[str, ...]
    layouts: tuple[tuple[int, int], ...]  # (instances, threads)
    max_batch_sizes: tuple[int, ...]
    delays_us: tuple[int, ...]
    spinning: tuple[bool, ...] = ()  # tried with each layout of more than one thread
    overheads: tuple[int | None, ...] = ()  # batch_overhead_tokens; None: unset


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
    knobs: Knobs = Knobs((), (), (), ())  # empty fields: derived from the model folder
    total_cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))


# -- the model's knobs ---------------------------------------------------------------------


def model_files(model_dir: Path) -> dict[str, str]:
    """Variant name -> model file (relative to the model folder) of every variant that passed
    its accuracy gate in `queryserve prepare`."""
    report = model_dir / "prepare.json"
    try:
        variants = json.loads(report.read_text())["variants"]
    except (OSError, ValueError, KeyError):
        raise BenchError(f"{report} is missing or unreadable: run `queryserve prepare` "
                         "first") from None
    return {v["name"]: v["file"] for v in variants if v.get("passed") and v.get("file")}


def _model_parameter(config: dict[str, Any]) -> tuple[str, str]:
    """The parameter naming the served variant, and its default: a CTranslate2 model folder
    or an ONNX file."""
    if config.get("backend") == "ctranslate2":
        return "model_dir", "ctranslate2"
    return "model_file", "model.onnx"


def current_point(config: dict[str, Any], files: dict[str, str], cores: int) -> Point:
    """The configuration `model.yaml` serves today (the point to beat)."""
    key, default = _model_parameter(config)
    model_file = str(config.get("parameters", {}).get(key, default))
    precision = next((name for name, f in files.items() if f == model_file), None)
    if precision is None:
        raise BenchError(f"{key} {model_file!r} is not one of the prepared variants "
                         f"({', '.join(files.values())})")
    instances = int(config.get("instance_group", {}).get("count", 1))
    spinning = bool(config.get("parameters", {}).get("allow_spinning", False))
    batching = config.get("dynamic_batching") or {}
    overhead = batching.get("batch_overhead_tokens")
    return Point(precision, int(config["max_batch_size"]),
                 int(batching.get("max_queue_delay_microseconds", 0)),
                 instances, max(1, cores // instances), spinning,
                 None if overhead is None else int(overhead))


def untuned_point(start: Point, cores: int) -> Point:
    """What Model Analyzer calls the default config, the reference a tuned config is judged
    against: the same model file and max batch size, with every knob recommend tunes at
    queryserve's built-in default (one instance on all the cores, no queue delay, no batch
    cut, no thread spinning). The shipped model.yaml files are themselves past winners, so
    the gain over them alone says little about what tuning buys."""
    batching, instances = DynamicBatching(), InstanceGroup().count
    return Point(start.precision, start.max_batch_size, batching.max_queue_delay_microseconds,
                 instances, max(1, cores // instances), False, batching.batch_overhead_tokens)


def default_knobs(files: dict[str, str], start: Point, cores: int,
                  backend: str = "onnxruntime") -> Knobs:
    """Every passing precision; each instances x threads layout that fits the cores, with
    ONNX Runtime's thread spinning off and on; batch sizes, batch overheads and delays around
    the current ones."""
    layouts = tuple((i, t) for i in range(1, cores + 1) for t in range(1, cores + 1)
                    if i * t <= cores)
    batches = tuple(sorted({8, 16, 64, start.max_batch_size}))
    delays = tuple(sorted({0, 1000, 4000, start.max_queue_delay_us}))
    spinning = (False, True) if backend == "onnxruntime" else (start.spinning,)
    # Unset (fewest batches), and least-cost cuts around the one-thread optimum of 3-6
    # padded tokens per batch measured for MiniLM (BENCHMARKS.md, "The batcher's cut").
    current = start.batch_overhead_tokens
    overheads = (None, *sorted({1, 4, 16} | ({current} if current is not None else set())))
    return Knobs(tuple(files), layouts, batches, delays, spinning, overheads)


def _layout_points(best: Point, knobs: Knobs) -> list[Point]:
    """Each layout, and each spinning setting where there are threads to spin."""
    return [replace(best, instances=i, threads=t, spinning=spin) for i, t in knobs.layouts
            for spin in knobs.spinning or (best.spinning,) if t > 1 or not spin]


def full_grid(knobs: Knobs) -> list[Point]:
    return [replace(layout, precision=p, max_batch_size=b, max_queue_delay_us=d,
                    batch_overhead_tokens=o)
            for layout in _layout_points(Point("", 0, 0, 1, 1), knobs)
            for p in knobs.precisions for b in knobs.max_batch_sizes for d in knobs.delays_us
            for o in knobs.overheads or (None,)]


def stage_points(stage: int, best: Point, knobs: Knobs) -> list[Point]:
    """Stage 0 varies the precision around ``best``, 1 the layout, 2 the batch size, 3 the
    batch overhead, 4 the delay."""
    if stage == 0:
        return [replace(best, precision=p) for p in knobs.precisions]
    if stage == 1:
        return _layout_points(best, knobs)
    if stage == 2:
        return [replace(best, max_batch_size=b) for b in knobs.max_batch_sizes]
    if stage == 3:
        return [replace(best, batch_overhead_tokens=o) for o in knobs.overheads]
    return [replace(best, max_queue_delay_us=d) for d in knobs.delays_us]


STAGES = ("precision", "instances x threads (spinning)", "max batch size",
          "batch cut (overhead tokens)", "max queue delay")


def best_point(points: Sequence[dict[str, Any]], objective: str,
               percentile: str = "p99") -> dict[str, Any] | None:
    """The winner among measured points: most throughput, or least cost per inference; ties go
    to more throughput, then to the lower latency percentile there (so the winner is always on
    the Pareto front). None when nothing passed."""
    passed = [p for p in points if (p.get("max_rate") or 0) > 0]
    if not passed:
        return None

    def latency(p: dict[str, Any]) -> float:
        return float((p.get("latency_ms") or {}).get(percentile, float("inf")))

    if objective == "cost" and all(p.get("cost_per_million") is not None for p in passed):
        return min(passed, key=lambda p: (p["cost_per_million"], -p["max_rate"], latency(p)))
    return min(passed, key=lambda p: (-p["max_rate"], latency(p)))


# -- one point on a real server ------------------------------------------------------------


def point_yaml(config: dict[str, Any], point: Point, files: dict[str, str]) -> dict[str, Any]:
    """The model's config with the point's knobs set (warmup batches capped to fit)."""
    out: dict[str, Any] = json.loads(json.dumps(config))  # deep copy of plain YAML data
    out["max_batch_size"] = point.max_batch_size
    out.setdefault("dynamic_batching", {})["max_queue_delay_microseconds"] = (
        point.max_queue_delay_us)
    if point.batch_overhead_tokens is None:
        out["dynamic_batching"].pop("batch_overhead_tokens", None)
    else:
        out["dynamic_batching"]["batch_overhead_tokens"] = point.batch_overhead_tokens
    out.setdefault("instance_group", {})["count"] = point.instances
    if config.get("backend", "onnxruntime") == "onnxruntime":
        out.setdefault("parameters", {})["allow_spinning"] = point.spinning
    out.setdefault("parameters", {})[_model_parameter(config)[0]] = files[point.precision]
    for sample in out.get("model_warmup") or []:
        sample["batch_size"] = min(int(sample.get("batch_size", 1)), point.max_batch_size)
    preferred = out["dynamic_batching"].get("preferred_batch_size")
    if preferred:
        out["dynamic_batching"]["preferred_batch_size"] = [
            b for b in preferred if b <= point.max_batch_size] or [point.max_batch_size]
    return out


def _build_repository(root: Path, model: str, model_dir: Path, config: dict[str, Any]) -> Path:
    """A repository holding one model: symlinks to the prepared files, its own model.yaml."""
    folder = root / model
    folder.mkdir(parents=True, exist_ok=True)
    for entry in model_dir.iterdir():
        if entry.name == "model.yaml":
            continue
        link = folder / entry.name
        if not link.is_symlink():
            link.symlink_to(entry.resolve())
    (folder / "model.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


@contextlib.contextmanager
def serving(repository: Path, cores: int, total_cores: int,
            log_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`queryserve serve` on a free loopback port, pinned to ``cores`` cores, until the block
    ends; yields (base URL, process) once the model is ready."""
    port = _free_port()
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    command = [sys.executable, "-m", "queryserve", "serve", "--repository", str(repository),
               "--http", f"127.0.0.1:{port}", "--cores", str(cores)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT,
            # The server gets only its own cores, so a 1-core point is charged for one core.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cores < total_cores else None)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, proc, log_path)
            yield url, proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise BenchError("the server exited before it was ready:\n  " + "\n  ".join(tail))
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise BenchError(f"the server at {url} was not ready within {READY_TIMEOUT_S:.0f} s")


def measure_point(sweep: Sweep, point: Point, config: dict[str, Any], files: dict[str, str],
                  observer: StepObserver) -> dict[str, Any]:
    """Serve the point and search its max rate under the bar; the point's result record."""
    model_dir = sweep.repository / sweep.model
    safe = point.id.replace("/", "_")
    root = _build_repository(sweep.out_dir / "repositories" / safe, sweep.model, model_dir,
                             point_yaml(config, point, files))
    record: dict[str, Any] = {"id": point.id, "params": {**asdict(point), "cores": point.cores},
                              "max_rate": 0.0, "latency_ms": {}, "cost_per_million": None,
                              "rss_mb": None, "error": None}
    try:
        with serving(root, point.cores, sweep.total_cores,
                     sweep.out_dir / "logs" / f"{safe}.log") as (url, proc):
            rate, result = _search(sweep, f"{url}/v2/models/{sweep.model}/infer", observer)
            record["rss_mb"] = peak_rss_mb(proc.pid)
    except BenchError as exc:
        record["error"] = exc.message
        return record
    if result is not None and rate > 0:
        inferences = result.throughput * sweep.payloads.items_per_request
        price = (None if sweep.price_per_hour is None
                 else sweep.price_per_hour * point.cores / sweep.total_cores)
        record.update(max_rate=rate,
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
    files = model_files(model_dir)
    start = current_point(config, files, sweep.total_cores)
    base = default_knobs(files, start, sweep.total_cores,
                         str(config.get("backend", "onnxruntime")))
    given = sweep.knobs
    knobs = Knobs(given.precisions or base.precisions, given.layouts or base.layouts,
                  given.max_batch_sizes or base.max_batch_sizes,
                  given.delays_us or base.delays_us, given.spinning or base.spinning,
                  given.overheads or base.overheads)
    unknown = set(knobs.precisions) - set(files)
    if unknown:
        raise BenchError(f"unknown precision {sorted(unknown)}: prepared are {sorted(files)}")
    if any(i * t > sweep.total_cores for i, t in knobs.layouts):
        raise BenchError(f"a layout needs more than the {sweep.total_cores} cores available")
    sweep.out_dir.mkdir(parents=True, exist_ok=True)
    (sweep.out_dir / "logs").mkdir(exist_ok=True)
    state_path = sweep.out_dir / STATE_FILE
    # "points": 2 since points carry the batch overhead; an older state's ids name other points.
    key = {"points": 2, "model": sweep.model, "threshold_ms": sweep.threshold_ms,
           "percentile": sweep.percentile, "step_duration_s": sweep.step_duration_s,
           "bodies": len(sweep.payloads.bodies), "price_per_hour": sweep.price_per_hour,
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

    untuned = untuned_point(start, sweep.total_cores)
    if sweep.grid == "full":
        measure([start, untuned, *full_grid(knobs)])
    else:
        best = start
        for stage in range(len(STAGES)):
            measure([best, *stage_points(stage, best, knobs)])
            winner = best_point([done[p.id] for p in measured], sweep.objective,
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
    winner = best_point(points, sweep.objective, sweep.percentile)
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
            f"{winner['max_rate']:,.0f} req/s measured. Serve it with --cores {point.cores}.\n"
            + yaml.safe_dump(point_yaml(config, point, files), sort_keys=False))
    else:
        results["best_model_yaml"] = None
    return results
