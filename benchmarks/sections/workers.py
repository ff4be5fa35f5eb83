"""Section 13, workers: what the cores do in process, and what `queryserve serve --workers N`
serves of it.

- The in-process ceiling: N processes side by side, each running the served `embed` variant on
  one ONNX Runtime thread, one query per call, tokenization included (no server, no latency
  bound), for N = 1 .. the cores; the sum of their rates.
- Served: `embed` alone, `--workers N` for N = 1 .. the cores (the cores split between the
  workers, a worker running at most its share of instances), the max rate at p99 <= 10 ms with
  one query per request (`queryserve bench --find-max`), in alternating rounds so a drift of
  the shared machine lands on every N.

Run alone, from benchmarks/ (prints the section's markdown; the figures go to
bench-out/make-bench/workers.json):

    cd benchmarks && ../.venv/bin/python -m sections.workers

or as part of `make bench` (`python benchmarks/run.py`, `--only workers` once a full run exists).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from queryserve.bench.server_process import peak_rss_mb, serving
from sections.common import (
    MODEL_DIR,
    OUT,
    _rate,
    bench,
    load_queries,
    log,
    machine_line,
    one_model_repository,
)

SECONDS = 5.0
"""Per in-process run: long enough for tens of thousands of queries a process."""
ROUNDS = 2


def measure() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0))
    counts = list(range(1, cores + 1))
    ceiling = {n: in_process_rate(n, SECONDS) for n in counts}
    repository = one_model_repository("embed", OUT / "repository-workers")
    served: dict[int, list[float]] = {n: [] for n in counts}
    rss: dict[int, float | None] = {}
    for round_ in range(ROUNDS):
        for n in counts:
            log(f"workers: --workers {n}, max rate at p99 <= 10 ms (round {round_ + 1})")
            with serving(repository, cores, cores, OUT / f"server-workers-{n}.log",
                         workers=n) as (url, proc):
                found = bench(url, "--find-max", "--p99-ms", "10",
                              name=f"workers-{n}-{round_ + 1}")
                rss[n] = peak_rss_mb(proc.pid)
            served[n].append(float(found["search"].get("max_rate") or 0.0))
    return {"cores": cores, "ceiling": ceiling, "served": served, "rss_mb": rss,
            "model_file": served_file()}


def served_file() -> str:
    report = json.loads((MODEL_DIR / "prepare.json").read_text())
    chosen = report["chosen"]
    return str(next(v["file"] for v in report["variants"] if v["name"] == chosen))


def in_process_rate(processes: int, seconds: float) -> float:
    """Queries per second of `processes` processes running side by side, summed."""
    from queryserve.optimize.candidates import rates_side_by_side

    log(f"workers: in process, {processes} process(es) x 1 thread, batch 1")
    return sum(rates_side_by_side(MODEL_DIR / served_file(), MODEL_DIR / "tokenizer.json",
                                  load_queries(512), processes, seconds))


def render(figures: dict[str, Any]) -> list[str]:
    cores = figures["cores"]
    ceiling = {int(n): rate for n, rate in figures["ceiling"].items()}
    served = {int(n): rates for n, rates in figures["served"].items()}
    best = max(ceiling.values())
    one = statistics.median(served[1]) or 1.0
    lines = [
        "## 13. Workers: the cores in process, and `--workers N` over HTTP",
        "",
        f"`embed` ({figures['model_file']}). In process: N processes side by side, each one",
        "ONNX Runtime thread, one query per call, tokenization included, no server and no",
        f"latency bound, {SECONDS:g} s each (`rate_of` over 512 MASSIVE queries). Served: `embed`",
        f"alone by `queryserve serve --cores {cores} --workers N` (the cores split between the",
        "workers; a worker runs at most as many instances as its share of cores), the max rate",
        "at p99 <= 10 ms with one query per request (`queryserve bench URL --find-max --p99-ms",
        f"10`), {ROUNDS} rounds taking turns over N; the load generator shares the cores.",
        "",
        "| N | in process, N x 1 thread (queries/s) | served, `--workers N`: max rate at p99 <= "
        "10 ms, each round (req/s) | median | vs `--workers 1` | vs the in-process best | "
        "peak memory (MB) |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for n in sorted(served):
        median = statistics.median(served[n])
        lines.append(
            f"| {n} | {ceiling.get(n, 0):,.0f} | {', '.join(_rate(r) for r in served[n])} | "
            f"{_rate(median)} | {median / one:.2f}x | {median / best:.2f} | "
            f"{figures['rss_mb'].get(str(n), figures['rss_mb'].get(n)) or 'n/a'} |")
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    result = measure()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "workers.json").write_text(json.dumps(result, indent=1))
    print(f"Machine: {machine_line()}.\n")
    print("\n".join(render(json.loads(json.dumps(result)))))
