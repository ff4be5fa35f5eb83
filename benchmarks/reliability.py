"""Inject faults into a real `queryserve serve` on 127.0.0.1 and write RELIABILITY.md.

The faults are injected on purpose; what the server does then is counted.

Each scenario is a module of benchmarks/faults/ that measures its figures (bounded in count and
time, every child process stopped at the end even on error) and renders them; they run, and
RELIABILITY.md shows them, in this order:

1. `overload`: three times the rate `embed` sustains;
2. `sigterm`: SIGTERM with ~2,000 items queued;
3. `reload`: reloads of `embed` under load, and its memory after 20 in a row;
4. `abusive`: slowloris, a connection flood, a 128 MB header line, a client that never reads;
5. `maximal`: the largest valid request of each route among ordinary ones;
6. `malformed`: thousands of generated malformed requests over every route;
7. `batch-kill`: `queryserve batch duplicates` SIGKILLed at random points and resumed;
8. `workers`: `--workers 2`: SIGTERM with ~2,000 items queued, reloads under load, a worker
   SIGKILLed under load, one stopped (SIGSTOP) under load, HTTP connections and a gRPC
   channel under load ended every 0.25 s;
9. `rolling`: replicas behind HAProxy under load, each replaced in turn for several rounds,
   then scaled 1 -> 3 -> 1.

`--quick` runs each with small counts and short phases (a check that it runs, not figures to
publish). `--only a,b` re-measures those scenarios and keeps the others' figures from the last
run's bench-out/reliability/reliability.json or, where this checkout has none (a fresh clone),
their sections as the report has them. A scenario that fails is reported as failed and the
others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))  # tests.malformed: the malformed-request strategies

from faults import (  # noqa: E402
    abusive,
    batch_kill,
    malformed,
    maximal,
    overload,
    reload,
    rolling,
    sigterm,
    workers,
)
from faults.common import OUT, REPOSITORY, Mode, log  # noqa: E402

from queryserve.bench.bench import machine  # noqa: E402

SCENARIOS: dict[str, ModuleType] = {
    "overload": overload, "sigterm": sigterm, "reload": reload, "abusive": abusive,
    "maximal": maximal, "malformed": malformed, "batch-kill": batch_kill, "workers": workers,
    "rolling": rolling,
}
FIGURES = OUT / "reliability.json"


def machine_line() -> str:
    m = machine()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f"{m['cpu']}, {m['cores']} cores, {memory:.0f} GiB, file descriptors {soft:,} "
            f"(hard {hard:,}); Python {m['python']}")


def measure(name: str, mode: Mode) -> dict[str, Any]:
    log(f"{name} ({mode.name})")
    started = time.monotonic()
    try:
        figures = SCENARIOS[name].measure(mode)
    except Exception as exc:  # reported in RELIABILITY.md; the other scenarios still run
        traceback.print_exc()
        figures = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    figures.update(
        mode=mode.name, machine=machine_line(), took_s=round(time.monotonic() - started),
        measured_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    return figures


def section(number: int, name: str, figures: dict[str, Any] | None) -> list[str]:
    module = SCENARIOS[name]
    lines = [f"## {number}. {module.TITLE}", ""]
    if figures is None:
        return [*lines, f"Not measured yet: run `python benchmarks/reliability.py --only {name}`.",
                ""]
    lines += [f"Measured {figures['measured_at']} in {figures['mode']} mode, in "
              f"{figures['took_s']} s, on {figures['machine']}.", ""]
    if "error" in figures:
        return [*lines, f"**failed to run**: `{figures['error'][:500]}`", ""]
    return [*lines, *module.render(figures), "", *(f"- {v}" for v in figures["verdicts"]), ""]


def earlier_report(path: Path) -> dict[str, tuple[str, list[str]]]:
    """Each scenario's overview row and section as the report at `path` has them: what
    `--only` keeps of the others where no earlier run's JSON is here (a fresh clone), rather
    than write them as not measured."""
    if not path.is_file():
        return {}
    text = path.read_text().splitlines()
    kept = {}
    for number, name in enumerate(SCENARIOS, 1):
        row = next((line for line in text if line.startswith(f"| {number}. {name} |")), None)
        start = next((i for i, line in enumerate(text) if line.startswith(f"## {number}. ")),
                     None)
        if row is None or start is None:
            continue
        end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")),
                   len(text))
        body = text[start:end]
        kept[name] = (row, body if body[-1] == "" else [*body, ""])
    return kept


def overview(figures: dict[str, Any], earlier: dict[str, tuple[str, list[str]]]) -> list[str]:
    lines = ["| scenario | verdicts | measured (UTC, mode) |", "|---|---|---|"]
    for number, name in enumerate(SCENARIOS, 1):
        f = figures.get(name)
        if f is None:
            lines.append(earlier[name][0] if name in earlier
                         else f"| {number}. {name} | not measured | |")
            continue
        verdicts = f.get("verdicts", [])
        missed = sum(v.startswith("**missed**") for v in verdicts)
        said = ("failed to run" if "error" in f else
                f"{len(verdicts) - missed} met, {missed} missed" if missed else
                f"all {len(verdicts)} met")
        lines.append(f"| {number}. {name} | {said} | {f['measured_at']}, {f['mode']} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=lambda v: v.split(","), default=None,
                        help=f"re-measure only these scenarios ({','.join(SCENARIOS)}); the "
                             f"rest come from {FIGURES.relative_to(ROOT)}")
    parser.add_argument("--quick", action="store_true",
                        help="small counts and short phases: checks that each scenario runs")
    parser.add_argument("--out", type=Path, default=ROOT / "RELIABILITY.md",
                        help="the report (default: RELIABILITY.md at the repository root)")
    args = parser.parse_args()
    if args.only and set(args.only) - set(SCENARIOS):
        parser.error(f"--only: no scenario {', '.join(sorted(set(args.only) - set(SCENARIOS)))}"
                     f"; the scenarios are {','.join(SCENARIOS)}")
    if not (REPOSITORY / "embed" / "prepare.json").is_file():
        print("run `queryserve prepare` first (make bench does)", file=sys.stderr)
        return 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # SIGTERM unwinds like Ctrl-C, so that every scenario's `finally` stops its children.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    figures: dict[str, Any] = (json.loads(FIGURES.read_text())
                               if args.only and FIGURES.is_file() else {})
    earlier = earlier_report(args.out) if args.only else {}
    mode = Mode(quick=args.quick)
    for name in SCENARIOS:
        if not args.only or name in args.only:
            figures[name] = measure(name, mode)
            FIGURES.write_text(json.dumps(figures, indent=1, default=str))  # kept as it goes
    command = "python benchmarks/reliability.py" + "".join(f" {a}" for a in sys.argv[1:])
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Reliability", "",
        f"Written by `{command}` on {now}, in {(time.monotonic() - started) / 60:.0f} "
        "minutes" + (" (other scenarios: figures of earlier runs, each dated below)"
                     if args.only else "") + ".",
        f"Machine: {machine_line()}.", "",
        "Faults injected on purpose against a real `queryserve serve` on 127.0.0.1, each",
        "bounded in count and time; every number below was measured by the scenario's run",
        "(bench-out/reliability/ keeps its JSON, the server logs and the `queryserve bench`",
        "results). A target missed says **missed**: nothing is left out.", "",
        *overview(figures, earlier), "",
    ]
    for number, name in enumerate(SCENARIOS, 1):
        kept = name not in figures and name in earlier
        lines += earlier[name][1] if kept else section(number, name, figures.get(name))
    args.out.write_text("\n".join(lines))
    log(f"wrote {args.out}")
    return 1 if any("error" in f for f in figures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
