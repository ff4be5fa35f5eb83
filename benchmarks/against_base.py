"""BENCHMARKS section 2's two figures for this checkout and earlier commits, side by side.

    python benchmarks/against_base.py --base 0dff592 [--base 7067218] [--rounds 2]
        [--model embed|fake] [--head-variant grpc-off] [--latency-only]

Each code serves the same prepared `model_repository` (or, with `--model`, that one model
alone) on both cores, one at a time, in alternating rounds (base, head, base, head...), so a
drift of this shared machine lands on all; each round measures the max rate at p99 <= 10 ms
(`queryserve bench --find-max`) and the latency at 100 req/s for 10 s, exactly as section 2
does, with the server's own compute time per request there (its statistics). An earlier
commit runs from a `git worktree` in a temporary folder (PYTHONPATH put first), with this
checkout's venv and models, and as it serves by default (gRPC on where it has it).
`--head-variant grpc-off` adds this checkout with `--grpc off`: what the gRPC listener costs
the HTTP path. Prints a markdown table of each round and the medians, and keeps the results
under bench-out/against-base/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sections.common import ROOT, bench, log, machine_line, one_model_repository  # noqa: E402

from queryserve.bench.server_process import free_port, peak_rss_mb, serving  # noqa: E402

OUT = ROOT / "bench-out" / "against-base"


def measure(label: str, source: Path | None, grpc: bool, repository: Path,
            find_max: bool) -> dict[str, Any]:
    """Section 2's figures for the code under `source` (None: this checkout); `grpc` False
    serves this checkout with `--grpc off`."""
    previous = os.environ.get("PYTHONPATH")
    if source is not None:
        os.environ["PYTHONPATH"] = str(source / "src")
    else:
        os.environ.pop("PYTHONPATH", None)
    try:
        cores = os.cpu_count() or 2
        # This checkout serves gRPC as `queryserve serve` does by default (on a free port, not
        # the fixed default); an earlier commit is left to its own default.
        flag = None if source is not None else (f"127.0.0.1:{free_port()}" if grpc else "off")
        with serving(repository, cores, cores, OUT / f"{label}.log", flag) as (url, proc):
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
    server = fixed.get("server") or {}
    return {"max_rate": at_max["search"].get("max_rate"),
            "max_p99_ms": best.get("latency_ms", {}).get("p99"),
            "p50_at_100_ms": fixed["latency_ms"]["p50"],
            "p99_at_100_ms": fixed["latency_ms"]["p99"],
            "compute_at_100_ms": server.get("compute_ms_per_request"), "rss_mb": rss}


def fake_repository(folder: Path) -> Path:
    """A repository of one `fake` model (no compute: the server's own cost per request), named
    `embed` so that `queryserve bench`'s default finds it."""
    sys.path.insert(0, str(ROOT))
    from tests.conftest import write_fake_model

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    write_fake_model(folder, "embed", max_batch_size=8, max_queue_size=256)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", action="append", required=True,
                        help="an earlier commit (repeatable)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default=None,
                        help="serve this model of model_repository alone (default: all); "
                             "`fake`: a model that costs nothing, what the application costs")
    parser.add_argument("--head-variant", choices=["grpc-off"], action="append", default=[],
                        help="also measure this checkout with --grpc off")
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
    repository = (fake_repository(OUT / "repository") if args.model == "fake"
                  else one_model_repository(args.model, OUT / "repository") if args.model
                  else ROOT / "model_repository")
    rows: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="queryserve-base-") as tmp, ExitStack() as trees:
        codes: list[tuple[str, Path | None, bool]] = []
        for commit in args.base:
            tree = Path(tmp) / commit
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                            commit], check=True, capture_output=True)
            trees.callback(subprocess.run, ["git", "-C", str(ROOT), "worktree", "remove",
                                            "--force", str(tree)], capture_output=True)
            codes.append((commit, tree, True))
            names[commit] = f"`{commit}`"
        codes.append(("head", None, True))
        names["head"] = f"`{head_label}`"
        if "grpc-off" in args.head_variant:
            codes.append(("head-grpc-off", None, False))
            names["head-grpc-off"] = f"`{head_label}`, `--grpc off`"
        for round_ in range(1, args.rounds + 1):
            for label, source, grpc in codes:
                log(f"round {round_}: {label}")
                rows.append({"round": round_, "code": label, **measure(
                    f"{label}-{round_}", source, grpc, repository, not args.latency_only)})
    (OUT / "results.json").write_text(json.dumps(
        {"bases": args.base, "head": head_label, "model": args.model, "machine": machine_line(),
         "rows": rows}, indent=2))
    print(render(names, rows, args.model))
    return 0


def render(names: dict[str, str], rows: list[dict[str, Any]], model: str | None) -> str:
    served = f"`{model}` alone" if model else "the whole default repository"
    lines = [f"Machine: {machine_line()}; serving {served}.", "",
             "| round | code | max req/s at p99 <= 10 ms | p99 there | p50 / p99 at 100 req/s "
             "| server compute per request at 100 req/s | peak RSS |",
             "|---|---|---:|---:|---:|---:|---:|"]

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} ms"

    for r in rows:
        lines.append(f"| {r['round']} | {names[r['code']]} | {rate(r['max_rate'])} | "
                     f"{ms(r['max_p99_ms'])} | {r['p50_at_100_ms']:.2f} / "
                     f"{r['p99_at_100_ms']:.2f} ms | {ms(r['compute_at_100_ms'])} | "
                     f"{r['rss_mb']:.0f} MB |")
    for code in names:
        mine = [r for r in rows if r["code"] == code]
        rates = [r["max_rate"] for r in mine if r["max_rate"] is not None]
        computes = [r["compute_at_100_ms"] for r in mine if r["compute_at_100_ms"] is not None]
        lines.append(f"| median | {names[code]} | "
                     f"{rate(statistics.median(rates) if rates else None)} | | "
                     f"{statistics.median(r['p50_at_100_ms'] for r in mine):.2f} / "
                     f"{statistics.median(r['p99_at_100_ms'] for r in mine):.2f} ms | "
                     f"{ms(statistics.median(computes) if computes else None)} | "
                     f"{statistics.median(r['rss_mb'] for r in mine):.0f} MB |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
