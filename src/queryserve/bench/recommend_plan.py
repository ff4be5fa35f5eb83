"""`queryserve recommend`'s plan: the points a sweep tries, the `model.yaml` each is served
with, and the rule that picks the winner. Pure functions of the model's config and its prepared
variants (`prepare.json`); nothing here starts a server.

A point is one configuration: the model file (precision), max batch size, max queue delay,
instances x intra-op threads, how the batcher cuts its queue (`batch_overhead_tokens`), and the
server's worker processes (`--workers`; each runs the instances x threads on its share).

By default the sweep is staged, like Model Analyzer's quick search: vary one knob at a time
around the best point so far (precision, then instances x threads, then workers, then max batch
size, then the batch cut, then queue delay), about fifteen points instead of a full grid of
hundreds.
`--grid full` measures every combination. Either way the sweep also measures the untuned
reference (`untuned_point`), so the report says what tuning bought.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from queryserve.config import DynamicBatching, InstanceGroup
from queryserve.errors import BenchError


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
    workers: int = 1  # server processes, each with `instances` x `threads` of its own

    @property
    def id(self) -> str:
        return (f"{self.precision}/b{self.max_batch_size}/d{self.max_queue_delay_us}/"
                f"{self.instances}x{self.threads}" + ("/spin" if self.spinning else "")
                + ("" if self.batch_overhead_tokens is None
                   else f"/o{self.batch_overhead_tokens}")
                + ("" if self.workers == 1 else f"/w{self.workers}"))

    @property
    def cores(self) -> int:
        return self.workers * self.instances * self.threads

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
    workers: tuple[int, ...] = ()  # server processes


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
    workers = tuple(w for w in (1, 2, 4, 8, 16, 32, 64) if w <= cores)
    return Knobs(tuple(files), layouts, batches, delays, spinning, overheads, workers)


def _layout_points(best: Point, knobs: Knobs) -> list[Point]:
    """Each layout, and each spinning setting where there are threads to spin."""
    return [replace(best, instances=i, threads=t, spinning=spin) for i, t in knobs.layouts
            for spin in knobs.spinning or (best.spinning,) if t > 1 or not spin]


def _worker_points(best: Point, knobs: Knobs, cores: int) -> list[Point]:
    """Each worker count, the cores split between the workers: each keeps the best layout's
    instances where its share allows (fewer where not) and spreads its share over them. The
    best point's own count is the best point itself."""
    points = []
    for workers in knobs.workers:
        share = cores // workers
        if workers == best.workers:
            points.append(best)
            continue
        if share < 1:
            continue
        instances = min(best.instances, share)
        points.append(replace(best, workers=workers, instances=instances,
                              threads=share // instances,
                              spinning=best.spinning and share // instances > 1))
    return points


def full_grid(knobs: Knobs, cores: int) -> list[Point]:
    return [replace(layout, precision=p, max_batch_size=b, max_queue_delay_us=d,
                    batch_overhead_tokens=o, workers=w)
            for layout in _layout_points(Point("", 0, 0, 1, 1), knobs)
            for w in knobs.workers or (1,) if w * layout.instances * layout.threads <= cores
            for p in knobs.precisions for b in knobs.max_batch_sizes for d in knobs.delays_us
            for o in knobs.overheads or (None,)]


def stage_points(stage: int, best: Point, knobs: Knobs, cores: int) -> list[Point]:
    """Stage 0 varies the precision around ``best``, 1 the layout, 2 the workers, 3 the batch
    size, 4 the batch overhead, 5 the delay."""
    if stage == 0:
        return [replace(best, precision=p) for p in knobs.precisions]
    if stage == 1:
        return _layout_points(best, knobs)
    if stage == 2:
        return _worker_points(best, knobs, cores)
    if stage == 3:
        return [replace(best, max_batch_size=b) for b in knobs.max_batch_sizes]
    if stage == 4:
        return [replace(best, batch_overhead_tokens=o) for o in knobs.overheads]
    return [replace(best, max_queue_delay_us=d) for d in knobs.delays_us]


STAGES = ("precision", "instances x threads (spinning)", "workers", "max batch size",
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
