"""What every section shares: where things are, the log, running `queryserve bench` and
`queryserve optimize`, the figures' formats."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from queryserve.bench.bench import machine

HERE = Path(__file__).resolve().parent.parent  # benchmarks/
ROOT = HERE.parent
MODEL_DIR = ROOT / "model_repository" / "embed"
QUERIES = ROOT / "data" / "massive-en" / "test.jsonl"
OUT = ROOT / "bench-out" / "make-bench"
QUERYSERVE = str(Path(sys.executable).parent / "queryserve")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def machine_line() -> str:
    """The machine as BENCHMARKS.md states it: `queryserve bench`'s view plus what it ran on."""
    import onnxruntime
    import torch

    m = machine()
    return (f"{m['cpu']}, {m['cores']} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
            f"Python {m['python']}, onnxruntime {onnxruntime.__version__}, "
            f"torch {torch.__version__}")


def load_queries(limit: int = 0) -> list[str]:
    texts = [json.loads(line)["text"] for line in QUERIES.read_text().splitlines() if line]
    return texts[:limit] if limit else texts


def bench(url: str, *args: str, name: str) -> dict[str, Any]:
    """One `queryserve bench` run; its results.json."""
    out = OUT / "bench" / name
    shutil.rmtree(out, ignore_errors=True)
    command = [QUERYSERVE, "bench", url, *args, "--out", str(out), "--no-progress"]
    log("  $ " + " ".join(command[1:]))
    done = subprocess.run(command, capture_output=True, text=True)
    (OUT / "bench").mkdir(parents=True, exist_ok=True)
    (OUT / "bench" / f"{name}.log").write_text(done.stderr + done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"queryserve bench failed:\n{done.stderr[-2000:]}")
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    results["command_shown"] = "queryserve " + " ".join(
        a.replace(str(OUT), "OUT") for a in command[1:])
    return results


def one_model_repository(model: str, folder: Path) -> Path:
    """A repository serving one prepared model of the default repository (a link to it), so
    that a section measures that model alone."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / model).symlink_to(ROOT / "model_repository" / model)
    return folder


def run_optimize(model: Path, out: Path, *args: str) -> dict[str, Any]:
    """One `queryserve optimize MODEL ARGS --out OUT` run; its prepare.json. Its output goes
    to optimize.log in OUT's parent folder."""
    command = [QUERYSERVE, "optimize", str(model), *args, "--out", str(out), "--no-progress"]
    log("  $ " + " ".join(command[1:]))
    done = subprocess.run(command, capture_output=True, text=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "optimize.log").write_text(done.stderr + done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:4])} failed:\n{done.stderr}")
    report: dict[str, Any] = json.loads((out / "prepare.json").read_text())
    return report


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return "none passed" if not value else f"{value:,.0f}"
