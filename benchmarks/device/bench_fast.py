"""`queryserve bench` exactly as the command line runs it (its own parser, plan and search),
with three changes for a time-bounded run:

- no plots or HTML page: the report writer writes results.json alone (matplotlib costs seconds
  per run);
- every finished step is also appended, as one JSON line, to $STEPS_FILE, so a run killed at the
  deadline still leaves its trials;
- an open-loop run gives requests still in flight $DRAIN_S seconds (default 0.5; the CLI's
  is 2.0) after its schedule ends: any request later than that is far over a 10 ms bar, so no
  pass/fail verdict changes, only the time an overloaded run spends draining;
- the server's statistics (read before and after each step, for the batch sizes only) wait
  $STATS_TIMEOUT_S (default 1.0; the CLI's is 5.0): they never decide a verdict.

    python .dev16/bench_fast.py URL [queryserve bench flags...]
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import queryserve.bench.bench as bench_module
import queryserve.bench.console as console
import queryserve.bench.report as report
from queryserve.cli import main

STEPS_FILE = os.environ.get("STEPS_FILE")
DRAIN_S = float(os.environ.get("DRAIN_S", "0.5"))
STATS_TIMEOUT_S = float(os.environ.get("STATS_TIMEOUT_S", "1.0"))
T0 = time.monotonic()


def _results_only(results: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(results))
    return [path]


_finished = console.PlainSteps.step_finished


def _step_finished(self: console.PlainSteps, record: dict[str, Any]) -> None:
    _finished(self, record)
    if STEPS_FILE:
        lat = record.get("latency_ms") or {}
        server = record.get("server") or {}
        line = {"t_s": round(time.monotonic() - T0, 2), "target_rate": record.get("target_rate"),
                "throughput": record["throughput"],
                "p50": lat.get("p50"), "p99": lat.get("p99"), "passed": record["passed"],
                "errors": record["errors"], "timeouts": record["timeouts"],
                "by_status": record["by_status"],
                "client_cpu_share": record["client_cpu_share"],
                "client_bound": record["client_bound"],
                "mean_batch": server.get("mean_batch"), "stats_read": bool(server)}
        with open(STEPS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


report.write_bench_report = _results_only  # type: ignore[assignment]
console.PlainSteps.step_finished = _step_finished  # type: ignore[method-assign]
bench_module.run_open_loop = functools.partial(  # type: ignore[assignment]
    bench_module.run_open_loop, drain_s=DRAIN_S)
bench_module.fetch_stats = functools.partial(  # type: ignore[assignment]
    bench_module.fetch_stats, timeout_s=STATS_TIMEOUT_S)

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
