"""BENCHMARKS section 2's two figures for this checkout and an earlier commit, side by side.

    python benchmarks/against_base.py --base 0dff592 [--rounds 2]

Both servers serve the same prepared `model_repository` on both cores, one at a time, in
alternating rounds (base, head, base, head...), so a drift of this shared machine lands on both;
each round measures the max rate at p99 <= 10 ms (`queryserve bench --find-max`) and the latency
at 100 req/s for 10 s, exactly as section 2 does. The earlier commit runs from a `git worktree`
in a temporary folder (PYTHONPATH put first), with this checkout's venv and models. Prints a
markdown table of each round and the medians, and keeps the results under
bench-out/against-base/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sections.common import ROOT, bench, log, machine_line  # noqa: E402

from queryserve.bench.server_process import free_port, peak_rss_mb, serving  # noqa: E402

OUT = ROOT / "bench-out" / "against-base"


def measure(label: str, source: Path | None, out: Path, find_max: bool) -> dict[str, Any]:
    """Section 2's figures for the code under `source` (None: this checkout)."""
    previous = os.environ.get("PYTHONPATH")
    if source is not None:
        os.environ["PYTHONPATH"] = str(source / "src")
    else:
        os.environ.pop("PYTHONPATH", None)
    try:
        cores = os.cpu_count() or 2
        # The head serves gRPC too, as `queryserve serve` does by default (on a free port);
        # a base from before gRPC knows no --grpc flag.
        grpc = None if source is not None else f"127.0.0.1:{free_port()}"
        with serving(ROOT / "model_repository", cores, cores, out / f"{label}.log",
                     grpc) as (url, proc):
            at_max = (bench(url, "--find-max", "--p99-ms", "10", name=f"{label}-max")
                      if find_max else {"search": {}, "steps": []})
            at_100 = bench(url, "--rate", "100", "--duration", "10", name=f"{label}-100")
            rss = peak_rss_mb(proc.pid)
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
    step = at_max["search"].get("step")
    best = at_max["steps"][step] if step is not None else {}
    fixed = at_100["steps"][0]
    return {"max_rate": at_max["search"].get("max_rate"),
            "max_p99_ms": best.get("latency_ms", {}).get("p99"),
            "p50_at_100_ms": fixed["latency_ms"]["p50"],
            "p99_at_100_ms": fixed["latency_ms"]["p99"], "rss_mb": rss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-only", action="store_true",
                        help="only the latency at 100 req/s (no max-rate search): more rounds "
                             "in the same time")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src"],
                           capture_output=True, text=True, check=True).stdout.strip()
    head_label = head + (" + uncommitted changes" if dirty else "")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="queryserve-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base),
                        args.base], check=True, capture_output=True)
        try:
            for round_ in range(1, args.rounds + 1):
                for label, source in (("base", base), ("head", None)):
                    log(f"round {round_}: {label}")
                    rows.append({"round": round_, "code": label, **measure(
                        f"{label}-{round_}", source, OUT, not args.latency_only)})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(base)], capture_output=True)
    (OUT / "results.json").write_text(json.dumps(
        {"base": args.base, "head": head_label, "machine": machine_line(), "rows": rows},
        indent=2))
    print(render(args.base, head_label, rows))
    return 0


def render(base: str, head: str, rows: list[dict[str, Any]]) -> str:
    names = {"base": f"`{base}`", "head": f"`{head}`"}
    lines = [f"Machine: {machine_line()}", "",
             "| round | code | max req/s at p99 <= 10 ms | p99 there | p50 / p99 at 100 req/s "
             "| peak RSS |", "|---|---|---:|---:|---:|---:|"]
    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    for r in rows:
        p99 = "-" if r["max_p99_ms"] is None else f"{r['max_p99_ms']:.2f} ms"
        lines.append(f"| {r['round']} | {names[r['code']]} | {rate(r['max_rate'])} | {p99} | "
                     f"{r['p50_at_100_ms']:.2f} / {r['p99_at_100_ms']:.2f} ms | "
                     f"{r['rss_mb']:.0f} MB |")
    for code in ("base", "head"):
        mine = [r for r in rows if r["code"] == code]
        rates = [r["max_rate"] for r in mine if r["max_rate"] is not None]
        lines.append(f"| median | {names[code]} | "
                     f"{rate(statistics.median(rates) if rates else None)} | | "
                     f"{statistics.median(r['p50_at_100_ms'] for r in mine):.2f} / "
                     f"{statistics.median(r['p99_at_100_ms'] for r in mine):.2f} ms | "
                     f"{statistics.median(r['rss_mb'] for r in mine):.0f} MB |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
