"""`make bench`: measure queryserve and the systems a user would pick instead; write BENCHMARKS.md.

Everything in one run on this machine, one measurement at a time, with the project's own tools
(`queryserve bench`, `queryserve recommend`) so the figures are what a user would measure.
Each section is a module of benchmarks/sections/ that measures its figures and renders them;
they run, and BENCHMARKS.md shows them, in this order:

1. `engines`: the in-process engines against sentence-transformers, and the served model with
   requests of several queries;
2. `server`: the served default config over HTTP, and perf_analyzer against `queryserve bench`;
3. `recommend`: `queryserve recommend` for `embed`;
4. `peers`: queryserve and the servers a user would pick instead (benchmarks/peers/);
5. `ceiling`: the load generator's own ceiling;
6. `optimize`: `queryserve optimize` on all-MiniLM-L6-v2;
7. `seq2seq`: `queryserve optimize --task seq2seq` on the committed spelling corrector;
8. `spell`: the spelling correctors: training speed, accuracy against SymSpell, serving;
9. `intent`: query intent, trained two ways and served;
10. `search`: the search bar: ANN recall, hit@10 on misspelled songs, `/v1/search` under load;
11. `duplicates`: product duplicates, trained two ways, served and as a batch job;
12. `grpc`: KServe v2 over gRPC against HTTP on one server (perf_analyzer -i grpc / -i http,
    and the max rate at p99 <= 10 ms over each);
13. `workers`: the in-process ceiling of N processes, and `--workers N` served.

`--only a,b` re-measures those sections and keeps the others' figures from the last run's
bench-out/make-bench/bench.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

from sections import (  # noqa: E402
    ceiling,
    duplicates,
    engines,
    grpc_front_end,
    intent,
    optimize,
    peers,
    recommend,
    search,
    seq2seq,
    server,
    spell,
    workers,
)
from sections.common import MODEL_DIR, OUT, log, machine_line  # noqa: E402


def provenance(only: set[str] | None, sections: list[str], measured_at: dict[str, str]) -> str:
    """What a partial run re-measured, and when each section was measured."""
    if not only:
        return ""
    again = sorted(only & set(sections))
    head = (f" Sections re-measured with `--only {','.join(again)}`; the others come from "
            "earlier runs." if again else
            " Nothing was re-measured; every section comes from an earlier run.")
    return head + (" Each section was measured at (UTC): "
                   + ", ".join(f"{n} {measured_at.get(n, 'an earlier run')}" for n in sections)
                   + ".")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per engine round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default=peers.PEERS, help="peers to measure (comma-separated)")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--only", type=lambda v: set(v.split(",")), default=None,
                        help="re-measure only these sections (engines,server,recommend,peers,"
                             "ceiling,optimize,seq2seq,spell,intent,search,duplicates,grpc,"
                             "workers); the rest come from bench-out/make-bench/bench.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not (MODEL_DIR / "prepare.json").is_file():
        print("run `queryserve prepare` first (make bench does)", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    steps: dict[str, tuple[str, Callable[[], Any]]] = {
        "engines": ("1. in-process engines", lambda: engines.measure(args.seconds, args.repeats)),
        "server": ("2. the default config over HTTP", server.measure),
        "recommend": ("3. recommend", recommend.measure),
        "peers": ("4. peers", lambda: peers.measure(args.peers)),
        "ceiling": ("5. the load generator's ceiling", ceiling.measure),
        "optimize": ("6. queryserve optimize", lambda: optimize.measure(args.seconds)),
        "seq2seq": ("7. queryserve optimize --task seq2seq",
                    lambda: seq2seq.measure(args.seconds)),
        "spell": ("8. the spelling corrector", spell.measure),
        "intent": ("9. query intent", intent.measure),
        "search": ("10. the search bar", search.measure),
        "duplicates": ("11. product duplicates", duplicates.measure),
        "grpc": ("12. KServe v2 over gRPC against HTTP", grpc_front_end.measure),
        "workers": ("13. workers", workers.measure),
    }
    if args.only and args.only - set(steps):
        parser.error(f"--only: no section {', '.join(sorted(args.only - set(steps)))}; "
                     f"the sections are {','.join(steps)}")
    if args.only and not (OUT / "bench.json").is_file():
        parser.error(f"--only keeps the other sections' figures from an earlier full run, and "
                     f"{OUT / 'bench.json'} is missing: run `make bench` first")
    # --only re-measures some sections and keeps the others from the last run's bench.json.
    figures: dict[str, Any] = (json.loads((OUT / "bench.json").read_text()) if args.only
                               else {})
    measured_at: dict[str, str] = figures.setdefault("measured_at", {})
    for name, (title, measure) in steps.items():
        if not args.only or name in args.only or name not in figures:
            log(title)
            figures[name] = measure()
            measured_at[name] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    rec, rec_command = figures["recommend"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks", "",
        f"Written by `make bench` (`python benchmarks/run.py`) on {now}, in "
        f"{(time.monotonic() - started) / 60:.0f} minutes."
        + provenance(args.only, list(steps), measured_at),
        f"Machine: {machine_line()}.",
        ("Every figure below comes from that one run" if not args.only else
         "Within each section every figure comes from one run") +
        ", one measurement at a time; the machine is",
        "shared and noisy, so compare rows with each other rather than with other runs.", "",
        *engines.render(figures["engines"], args.seconds), "",
        *server.render(figures["server"]), "",
        *recommend.render(rec, rec_command), "",
        *peers.render(figures["peers"]), "",
        *ceiling.render(figures["ceiling"]), "",
        *optimize.render(figures["optimize"]), "",
        *seq2seq.render(figures["seq2seq"]), "",
        *spell.render(figures["spell"]), "",
        *intent.render(figures["intent"]), "",
        *search.render(figures["search"]), "",
        *duplicates.render(figures["duplicates"]), "",
        *grpc_front_end.render(figures["grpc"]), "",
        *workers.render(figures["workers"]), "",
    ]
    recorded = (HERE / "recorded.md").read_text()
    args.out.write_text("\n".join(lines) + "\n" + recorded)
    (OUT / "bench.json").write_text(json.dumps(figures, indent=1, default=str))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
