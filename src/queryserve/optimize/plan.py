"""One optimization run's plan, its report, and its progress display: shared by the encoder
flow (ONNX Runtime) and the seq2seq flow (CTranslate2)."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from queryserve.errors import ExportError
from queryserve.optimize.gate import Decision, Parity
from queryserve.optimize.recipes import Precision
from queryserve.optimize.source import Source

Item = str | tuple[str, str]  # a text, or a pair of texts for the pair task

# Batch 1 (a lone query), 32 (timed) and 64 (the server's max_batch_size).
PARITY_BATCH_SIZES = (1, 32, 64)
TIMING_BATCH_SIZES = (1, 32)
TIMING_SECONDS = 2.0
TIMING_ROUNDS = 3
WARMUP_RUNS = 3  # per runner and batch size, before any round


@dataclass(frozen=True)
class VariantReport:
    name: str
    precision: Precision
    recipe: str
    passed: bool
    parity: Parity | None
    queries_per_second: Mapping[int, float]  # batch size -> median q/s; empty if not timed
    file: str | None  # relative to the model folder; None when not kept
    error: str | None = None  # why it could not be built, if it could not
    differences: tuple[tuple[str, str, str], ...] = ()  # seq2seq: (input, original, variant)


@dataclass(frozen=True)
class Speed:
    """Before/after figures for the report: file size, load time, batch 1 and batch 32."""

    size_mb: float
    load_s: float
    batch_1_ms: float
    batch_32_per_s: float

    @classmethod
    def timed(cls, size_mb: float, load_s: float, rates: Mapping[int, float]) -> Speed:
        """From the median queries/s that `time_runners` gives at batch 1 and 32."""
        return cls(size_mb, load_s, 1000.0 / rates[1], rates[32])


@dataclass(frozen=True)
class PrepareReport:
    chosen: str
    reason: str
    variants: tuple[VariantReport, ...]
    model_path: Path
    report_path: Path
    elapsed_s: float
    forced: bool = False
    before: Speed | None = None  # the original in PyTorch, when measured
    after: Speed | None = None  # the chosen variant
    engine: str = "ONNX"  # what runs the written model, for the report


@dataclass(frozen=True)
class Plan:
    """What to build and check: the inputs of one optimization run."""

    source: Source
    precisions: tuple[Precision, ...]
    parity_items: Sequence[Item]
    calibration_items: Sequence[Item]
    timing_seconds: float = TIMING_SECONDS
    timing_rounds: int = TIMING_ROUNDS
    parity_batch_sizes: Sequence[int] = PARITY_BATCH_SIZES
    force: bool = False  # write the best variant even if none passes its gate
    measure_original: bool = False  # time the PyTorch original for the report
    model_config: str | None = None  # model.yaml to write, or None to keep the folder's own
    decision: Decision | None = None  # a pair model served at its own threshold (the gate's)
    # classify and pair: name -> input (as the model reads it) that every variant must decide
    # exactly as the original does, at every parity batch size (gate.HardItem)
    hard_items: Mapping[str, Item] = field(default_factory=dict)
    extra: Mapping[str, object] = field(default_factory=dict)  # recorded in prepare.json
    # The committed choice (prepare's models/variants.json): build and gate that variant alone
    # (and the fp32 reference), untimed. None sweeps: every recipe built, gated and timed.
    only: str | None = None


def geometric_mean(rates: Mapping[int, float]) -> float:
    """One score over the timed batch sizes: a lone query and a full batch both matter, and
    neither should dominate by its scale."""
    return math.exp(statistics.fmean(math.log(q) for q in rates.values()))


def choose_fastest(speeds: Mapping[str, Mapping[int, float]],
                   results: Mapping[str, Parity]) -> tuple[str, str]:
    """The passing variant with the best geometric mean of its timed batch sizes."""

    def score(name: str) -> float:
        return geometric_mean(speeds[name])

    ranked = sorted(speeds, key=score, reverse=True)
    chosen = ranked[0]
    figures = ", ".join(f"{n} {score(n):.0f}" for n in ranked)
    reason = (f"{chosen} passes its {results[chosen].precision} gate "
              f"({results[chosen].describe()}) and is the fastest that passes: geometric mean of "
              f"batch {'/'.join(map(str, TIMING_BATCH_SIZES))} queries/s: {figures}")
    return chosen, reason


def no_candidate(plan: Plan, results: Mapping[str, Parity], errors: Mapping[str, str]) -> str:
    """The one-line-per-variant error when no variant of the planned precisions passes."""
    lines = [f"no {'/'.join(plan.precisions)} variant of {plan.source.name} passes its "
             "accuracy gate, so nothing was written (--force writes the closest anyway):"]
    for name, result in results.items():
        if result.precision in plan.precisions:
            lines.append(f"  {name}: misses by {result.shortfall()}")
    for name, error in errors.items():
        lines.append(f"  {name}: not built: {error}")
    if len(lines) == 1:
        lines.append("  no variant of that precision could be built")
    return "\n".join(lines)


@dataclass(frozen=True)
class GateOutcome:
    """Which variants a run may serve, after the gate (and `--force`)."""
    candidates: list[str]  # built variants of the planned precisions
    passed: list[str]  # those that passed; with `--force` and none passing, the closest
    kept: list[str]  # every variant written: all that passed, the served choice last
    forced: bool

    def reason(self, plan: Plan, chosen: str, reason: str,
               results: Mapping[str, Parity]) -> str:
        """Why `chosen` is served: `reason`, unless it was forced past the gate."""
        if not self.forced:
            return reason
        return (f"--force: no {'/'.join(plan.precisions)} variant passed its gate; "
                f"{chosen} is the closest and misses by: {results[chosen].shortfall()}")


class ChoiceRefused(ExportError):
    """The committed variant misses its gate on this host (its int8 kernels round otherwise):
    prepare then sweeps and says so."""


def committed_outcome(plan: Plan, results: Mapping[str, Parity],
                      errors: Mapping[str, str]) -> tuple[GateOutcome, str]:
    """The committed choice `plan.only` served if it passes its gate here, and why; else
    ChoiceRefused. Not timed: the sweep that chose it timed every variant, and timing is most
    of a run (and says something of the host it ran on, not of the choice)."""
    name = plan.only
    assert name is not None
    result = results.get(name)
    if result is None or not result.passed:
        why = errors.get(name) or (result.shortfall() if result else "no such recipe")
        raise ChoiceRefused(f"the committed choice {name} misses its gate on this host: {why}")
    kept = [n for n, r in results.items() if r.passed and n != name] + [name]
    reason = (f"{name}, the committed choice, passes its {result.precision} gate here "
              f"({result.describe()}); not timed (`queryserve prepare --sweep` times every "
              "variant and commits the fastest)")
    return GateOutcome([name], [name], kept, False), reason


def gate_outcome(plan: Plan, results: Mapping[str, Parity],
                 errors: Mapping[str, str]) -> GateOutcome:
    """Raises ExportError (naming each miss) when nothing passes and `--force` was not given."""
    candidates = [n for n, r in results.items() if r.precision in plan.precisions]
    passed = [n for n in candidates if results[n].passed]
    forced = not passed
    if forced:
        if not plan.force or not candidates:
            raise ExportError(no_candidate(plan, results, errors))
        passed = [max(candidates, key=lambda n: (results[n].mean, results[n].min))]
    kept = [n for n, r in results.items() if r.passed and n not in passed] + passed
    return GateOutcome(candidates, passed, kept, forced)


def install(work: Path, model_dir: Path, paths: Mapping[str, Path], kept: Sequence[str],
            chosen: str, tokenizer_src: Path, model_config: str | None, *,
            served: str, suffix: str) -> dict[str, str]:
    """Move the kept models into place: the chosen one as `served` (model.onnx, or the
    ctranslate2 folder), the others as `variants/NAME{suffix}`; returns variant -> path
    relative to model_dir. The folder's other files (its model.yaml, when not replaced) stay;
    stale variants go."""
    model_dir.mkdir(parents=True, exist_ok=True)
    for stale in (model_dir / "variants", model_dir / served):
        if stale.is_dir():
            shutil.rmtree(stale)
    (model_dir / "variants").mkdir()
    files: dict[str, str] = {}
    for name in kept:
        relative = served if name == chosen else f"variants/{name}{suffix}"
        os.replace(paths[name], model_dir / relative)
        files[name] = relative
    shutil.copyfile(tokenizer_src, model_dir / "tokenizer.json")
    if model_config is not None:
        staged = work / "model.yaml"
        staged.write_text(model_config, encoding="utf-8")
        os.replace(staged, model_dir / "model.yaml")
    return files


def write_report(report: PrepareReport, plan: Plan, flow: Mapping[str, Any]) -> None:
    """`prepare.json`: what every run reports, with the flow's own fields (gate, timing,
    runtime) after the reason."""
    head = {"model": str(plan.extra.get("model", plan.source.path)),
            "task": plan.source.task, "precisions": list(plan.precisions),
            "chosen": report.chosen, "forced": report.forced, "reason": report.reason}
    document = {
        **head, **flow,
        "before": asdict(report.before) if report.before else None,
        "after": asdict(report.after) if report.after else None,
        "elapsed_s": round(report.elapsed_s, 1),
        "variants": [variant_json(v) for v in report.variants],
        **{k: v for k, v in plan.extra.items() if k != "model"},
    }
    report.report_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def variant_json(variant: VariantReport) -> dict[str, Any]:
    entry = asdict(variant)
    entry["queries_per_second"] = {f"batch_{b}": round(q, 1)
                                   for b, q in variant.queries_per_second.items()}
    entry["differences"] = [{"input": a, "original": b, "optimized": c}
                            for a, b, c in variant.differences]
    if variant.parity is not None and variant.parity.metric != "exact":  # encoders
        entry["parity"]["max_norm_error"] = entry["parity"]["max_error"]
    return entry


# -- timing ----------------------------------------------------------------------------------

Runner = Callable[[Sequence[Any]], object]
"""Runs one batch of items end to end (tokenization included)."""


def rate_of(run: Runner, items: Sequence[Any], batch_size: int, seconds: float) -> float:
    """Queries/s over whole passes of `items` until `seconds` have gone by: every measurement
    runs the same mix of input lengths, so variants and rounds compare like for like."""
    groups = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    done = 0
    start = time.perf_counter()
    while True:
        for group in groups:
            run(group)
        done += len(items)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def at_every_batch_size(run: Runner) -> dict[int, Runner]:
    """One runner for every timed batch size."""
    return dict.fromkeys(TIMING_BATCH_SIZES, run)


def time_runners(runners: Mapping[str, Mapping[int, Runner]], items: Sequence[Any],
                 seconds: float, rounds: int,
                 steps: Steps | None = None) -> dict[str, dict[int, float]]:
    """Median queries/s per runner and batch size (each name has a runner per batch size).
    Rounds interleave the runners, so a slow spell on a shared machine hits all of them alike
    instead of one runner's whole measurement."""
    samples: dict[str, dict[int, list[float]]] = {n: {b: [] for b in TIMING_BATCH_SIZES}
                                                  for n in runners}
    for by_batch in runners.values():
        for batch_size in TIMING_BATCH_SIZES:
            for _ in range(WARMUP_RUNS):
                by_batch[batch_size](items[:batch_size])
    for round_ in range(rounds):
        for batch_size in TIMING_BATCH_SIZES:
            for name, by_batch in runners.items():
                if steps is not None:
                    steps.next(f"timing {name}, batch {batch_size} (round {round_ + 1}/{rounds})")
                samples[name][batch_size].append(
                    rate_of(by_batch[batch_size], items, batch_size, seconds))
    return {n: {b: statistics.median(s) for b, s in by_batch.items()}
            for n, by_batch in samples.items()}


# -- progress --------------------------------------------------------------------------------


class Steps:
    """One progress bar over every step; the timing steps are added once parity is known."""

    def __init__(self, display: Progress, total: int, title: str) -> None:
        self.display = display
        self.total = total
        self.title = title
        self.task: TaskID = display.add_task(title, total=total)
        self.started = False

    def next(self, description: str) -> None:
        if self.started:
            self.display.advance(self.task)
        self.started = True
        self.display.update(self.task, description=description)

    def grow(self, steps: int) -> None:
        self.total += steps
        self.display.update(self.task, total=self.total)

    def finish(self) -> None:
        self.display.update(self.task, completed=self.total, description=f"{self.title}: done")


@contextmanager
def progress_display(progress: Progress | bool) -> Iterator[Progress]:
    if isinstance(progress, Progress):  # the caller's display: add our task to it
        yield progress
        return
    columns = (SpinnerColumn(), TextColumn("[progress.description]{task.description}"),
               BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not progress) as display:
        yield display

