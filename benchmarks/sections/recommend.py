"""Section 3, `queryserve recommend` for `embed`: the staged sweep, its Pareto front, the
winner against the default config."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from queryserve.bench.console import gains, point_tags
from sections.common import OUT, QUERYSERVE, _ms, _rate, log


def measure() -> tuple[dict[str, Any], str]:
    out = OUT / "recommend"
    shutil.rmtree(out, ignore_errors=True)  # fresh figures, not a resumed sweep
    command = [QUERYSERVE, "recommend", "--p99-ms", "10", "--out", str(out), "--no-progress"]
    log("recommend: $ " + " ".join(command[1:]))
    done = subprocess.run(command, capture_output=True, text=True)
    (OUT / "recommend.log").write_text(done.stderr + done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"queryserve recommend failed:\n{done.stderr[-2000:]}")
    return json.loads((out / "recommend.json").read_text()), "queryserve " + " ".join(
        a.replace(str(OUT), "OUT") for a in command[1:])


def render(results: dict[str, Any], command: str) -> list[str]:
    pct = results["threshold"]["percentile"]
    lines = [
        "## 3. `queryserve recommend` for `embed` (p99 <= 10 ms)",
        "",
        f"`{command}`: the staged sweep (one knob at a time around the best so far: precision,",
        "instances x threads with ONNX Runtime's thread spinning off and on where a layout has",
        "threads to spin, max batch size, the batcher's cut, max queue delay). Each point is",
        "served by its own `queryserve serve`, pinned to the cores it uses, and searched like",
        "section 2 with 2 s runs. `/oN`: `batch_overhead_tokens` N (no `/o`: unset, as few",
        "batches as the limits allow). `*`: on the Pareto front of max rate against p99 there.",
        "(default): `model_repository/embed/model.yaml` as shipped, itself the winner of an",
        "earlier sweep; (untuned): the reference Model Analyzer calls the default config, the",
        "same model file and max batch size with each knob recommend tunes at queryserve's",
        "built-in default (one instance on both cores, no queue delay, no batch cut).",
        "",
        "| point (precision/max batch/delay us/instances x threads[/spin][/oN]) | "
        f"max req/s at {pct} <= 10 ms"
        f" | p50 / {pct} there (ms) | peak RSS (MB) | Pareto |",
        "|---|---:|---:|---:|---|",
    ]
    for p in sorted(results["points"], key=lambda p: -(p.get("max_rate") or 0)):
        lat = p.get("latency_ms") or {}
        name = p["id"] + point_tags(p) + (" **best**" if p.get("best") else "")
        rate = "error: " + p["error"] if p.get("error") else _rate(p.get("max_rate"))
        lines.append(f"| {name} | {rate} | {_ms(lat.get('p50'))} / {_ms(lat.get(pct))} | "
                     f"{p.get('rss_mb') or 'n/a'} | {'*' if p.get('pareto') else ''} |")
    best = next((p for p in results["points"] if p["id"] == results.get("best")), None)
    if best is not None:
        lines += ["", f"Winner: `{best['id']}`, {best['max_rate']:,.0f} req/s: "
                      + "; ".join(gains(results)) + "."]
    return lines
