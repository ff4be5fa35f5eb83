"""`queryserve batch duplicates` SIGKILLed at random points and run again until done. Target:
the final output holds exactly the rows of an uninterrupted run: none lost, none twice."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from faults.common import OUT, ROOT, Mode, log, verdict
from queryserve.duplicates.tables import read_pairs

TITLE = "Killing `queryserve batch duplicates` and resuming it"
SEED = 20261125
TABLES = ROOT / "data" / "product-matching"
FULL = (TABLES / "amazon-google" / "tables" / "amazon.csv",
        TABLES / "amazon-google" / "tables" / "gp.csv")
QUICK = (TABLES / "abt-buy" / "tables" / "abt.csv", TABLES / "abt-buy" / "tables" / "buy.csv")
# Every candidate pair kept (--min-probability 0), so that a lost or repeated part shows; many
# small parts, so that kills land between and inside them. The job's own blocking otherwise:
# the cross-encoder scores a few hundred of these long pairs a second here, and a wider
# `--block-k 100` made a 9-minute job, near JOB_TIMEOUT_S.
OPTIONS = ("--no-progress", "--min-probability", "0", "--part-size", "500")
JOB_TIMEOUT_S = 600.0
MOST_RERUNS = 5


def run_job(tables: tuple[Path, Path], out: Path, options: tuple[str, ...],
            kill_after_s: float | None = None) -> dict[str, Any]:
    """One run of the job; killed (its whole process group) `kill_after_s` after its start
    unless it ended before. What was on disk at the kill is kept."""
    command = [sys.executable, "-m", "queryserve", "batch", "duplicates", *map(str, tables),
               str(out), *options]
    with (out.parent / f"{out.stem}.log").open("ab") as sink:
        job = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
                               start_new_session=True)
    started = time.monotonic()
    killed, on_disk = False, None
    try:
        job.wait(timeout=kill_after_s if kill_after_s is not None else JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        if kill_after_s is None:
            raise
        os.killpg(job.pid, signal.SIGKILL)
        killed = True
        job.wait(timeout=30)
        on_disk = stage(out.with_name(out.name + ".parts"))
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    return {"seconds": round(time.monotonic() - started, 2), "killed": killed,
            "returncode": job.returncode, "on_disk": on_disk}


def stage(work: Path) -> dict[str, int]:
    """What a killed job had finished: tables embedded, candidates blocked, parts scored."""
    return {"embedded": len(list(work.glob("embeddings-*.npy"))),
            "blocked": int((work / "candidates.npy").is_file()),
            "parts": len(list(work.glob("part-*.parquet")))}


def pairs(path: Path) -> tuple[Counter[tuple[str, str]], dict[tuple[str, str], float]]:
    columns = read_pairs(path)
    keys = [(str(a), str(b)) for a, b in zip(columns["left_id"], columns["right_id"],
                                              strict=True)]
    return Counter(keys), dict(zip(keys, map(float, columns["probability"]), strict=True))


def windows(seconds: float, summary: dict[str, Any], kills: int) -> list[tuple[float, float]]:
    """Where each kill may land, in seconds after the start of a run that took `seconds`
    uninterrupted: within its embedding, within its blocking, then in equal slices of its
    scoring. Every stage gets a kill however the time splits between them (the
    cross-encoder's scoring is ~90% of it; the bi-encoder's was a third)."""
    embedded = seconds - summary["total_s"] + summary["embed_s"]  # from the process's start
    blocked = embedded + summary["block_s"]
    slice_s = summary["score_s"] / (kills - 2)
    return [(embedded - summary["embed_s"], embedded), (embedded, blocked),
            *((blocked + i * slice_s, blocked + (i + 1) * slice_s) for i in range(kills - 2))]


def measure(mode: Mode) -> dict[str, Any]:
    tables, kills = mode.pick(FULL, QUICK), mode.pick(5, 3)
    work = OUT / "batch-kill"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log("batch-kill: the uninterrupted run")
    whole = run_job(tables, work / "whole.parquet", OPTIONS)
    if whole["returncode"] != 0:
        raise RuntimeError(f"the uninterrupted job failed: see {work / 'whole.log'}")
    log_text = (work / "whole.log").read_text()
    summary = json.loads(log_text[log_text.index("{"):])
    reference, probabilities = pairs(work / "whole.parquet")
    rng = random.Random(SEED)
    trials = []
    for trial, (start, end) in enumerate(windows(whole["seconds"], summary, kills)):
        out = work / f"killed-{trial}.parquet"
        at = round(rng.uniform(start + 0.05 * (end - start), end - 0.05 * (end - start)), 2)
        log(f"batch-kill: trial {trial + 1}, SIGKILL {at:.2f} s after the start")
        runs = [run_job(tables, out, OPTIONS, kill_after_s=at)]
        while not out.exists() and len(runs) <= MOST_RERUNS:
            runs.append(run_job(tables, out, OPTIONS))
        found, scores = pairs(out) if out.exists() else (Counter(), {})
        trials.append({
            "kill_at_s": at, "runs": runs, "done": out.exists(),
            "rows": sum(found.values()),
            "lost": sum((reference - found).values()),
            "extra": sum((found - reference).values()),
            "twice": sum(n - 1 for n in found.values() if n > 1),
            "other_probability": sum(1 for k, p in scores.items()
                                     if k in probabilities and p != probabilities[k]),
        })
    bad = [t for t in trials if not t["done"] or t["lost"] or t["extra"] or t["twice"]
           or t["other_probability"]]
    return {
        "tables": [str(t.relative_to(ROOT)) for t in tables], "options": list(OPTIONS),
        "seed": SEED, "whole": whole, "rows": sum(reference.values()),
        "unique_pairs": len(reference),
        "parts": summary["parts"], "trials": trials,
        "verdicts": [
            verdict(not bad and len(reference) == sum(reference.values()),
                    f"{len(trials)} killed jobs, each resumed to the end: "
                    f"{sum(t['lost'] for t in trials)} rows lost, "
                    f"{sum(t['twice'] + t['extra'] for t in trials)} duplicated or extra, "
                    f"{sum(t['other_probability'] for t in trials)} with another probability "
                    "(target: 0 lost, 0 duplicated)"),
        ],
    }


def render(f: dict[str, Any]) -> list[str]:
    lines = [
        f"`queryserve batch duplicates {' '.join(f['tables'])} OUTPUT {' '.join(f['options'])}`",
        f"runs once uninterrupted ({f['whole']['seconds']:.1f} s, {f['rows']:,} rows, "
        f"{f['parts']} parts); then, for each trial, the same",
        "command is started on a fresh OUTPUT and its process group SIGKILLed at a random",
        f"time (seed {f['seed']}; within the uninterrupted run's embedding for the first trial,",
        "its blocking for the second, equal slices of its scoring for the others, so that",
        "every stage is hit), then run again until OUTPUT exists. The final rows are",
        "compared with the uninterrupted run's as",
        "multisets of (left_id, right_id) pairs, and their probabilities pair by pair.",
        "",
        "| trial | SIGKILL at | done then: tables embedded, blocked, parts | reruns to "
        "finish (s each) | rows | lost | duplicated | extra | other probability |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for n, t in enumerate(f["trials"], 1):
        first, reruns = t["runs"][0], t["runs"][1:]
        at = f"{t['kill_at_s']:.2f} s" + ("" if first["killed"] else " (had ended)")
        done = first["on_disk"]
        then = ("n/a" if done is None else f"{done['embedded']} of 2, "
                f"{'yes' if done['blocked'] else 'no'}, {done['parts']} of {f['parts']}")
        lines.append(
            f"| {n} | {at} | {then} | {len(reruns)} ("
            + ", ".join(f"{r['seconds']:.1f}" for r in reruns) + ") | "
            f"{t['rows']:,} | {t['lost']} | {t['twice']} | {t['extra']} | "
            f"{t['other_probability']} |")
    return lines
