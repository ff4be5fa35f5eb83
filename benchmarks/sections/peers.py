"""Section 4, the peers (benchmarks/peers/: Infinity, FastAPI + sentence-transformers, Ray
Serve, PyTriton) and queryserve, each searched at p99 <= 10 / 50 / 1000 ms."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from sections.common import HERE, OUT, log

PEERS = "queryserve,infinity-onnx,infinity-onnx-int8,fastapi-st,ray-serve,pytriton"


def measure(names: str) -> dict[str, Any]:
    out = OUT / "peers"
    command = [sys.executable, str(HERE / "peers" / "run_peers.py"), "--peers", names,
               "--out", str(out)]
    log("peers: $ " + " ".join(command[1:]))
    subprocess.run(command, check=False)  # a failing peer is a row, not the end of the run
    report: dict[str, Any] = json.loads((out / "peers.json").read_text())
    return report


def render(report: dict[str, Any]) -> list[str]:
    rows = {row["peer"]: row for row in report["peers"]}

    def rate(row: dict[str, Any], p99: str) -> float:
        search = row.get("searches", {}).get(p99) or {}
        return float(search.get("max_rate") or 0.0)

    lines = [
        "## 4. queryserve and its peers, same load, one after another",
        "",
        "`python benchmarks/peers/run_peers.py` (started by `make bench`): each server alone on",
        "127.0.0.1 and the same 2 cores, one query per request, the MASSIVE test utterances,",
        "three `queryserve bench --find-max` searches each (p99 <= 10, 50 and 1000 ms; the last",
        "stands for the max throughput). Ray Serve runs in a loopback-only network namespace",
        "with its load generator. How each peer is installed and configured:",
        "benchmarks/peers/README.md.",
        "",
        report["table"],
    ]
    qs = rows.get("queryserve")
    others = [r for name, r in rows.items() if name != "queryserve" and "error" not in r]
    if qs and "error" not in qs and others:
        best_max = max(others, key=lambda r: rate(r, "1000"))
        best_50 = max(others, key=lambda r: rate(r, "50"))
        lines += [""]
        if rate(best_max, "1000"):
            lines.append(f"- Max throughput: queryserve {rate(qs, '1000'):,.0f} req/s against the "
                         f"best peer's {rate(best_max, '1000'):,.0f} ({best_max['label']}): "
                         f"**{rate(qs, '1000') / rate(best_max, '1000'):.1f}x** (target 2x).")
        if rate(best_50, "50"):
            lines.append(f"- queryserve at p99 <= 10 ms ({rate(qs, '10'):,.0f} req/s) against the "
                         f"best peer at p99 <= 50 ms ({rate(best_50, '50'):,.0f}, "
                         f"{best_50['label']}): **{rate(qs, '10') / rate(best_50, '50'):.1f}x** "
                         "(target 3x).")
        fastapi = rows.get("fastapi-st")
        if fastapi and "error" not in fastapi and rate(fastapi, "1000"):
            # FastAPI passes no 10 ms bound, so the strict figure crosses bounds; the same
            # bound on both sides is what "N times the plain endpoint" reads as to a user.
            same = "; ".join(f"at p99 <= {b} ms {rate(qs, b) / rate(fastapi, b):.1f}x"
                             for b in ("50", "1000") if rate(fastapi, b))
            lines.append(f"- queryserve at p99 <= 10 ms against plain FastAPI + "
                         f"sentence-transformers at its max throughput (p99 <= 1 s): "
                         f"**{rate(qs, '10') / rate(fastapi, '1000'):.1f}x** (issue 2's target: "
                         f"12x); each at the same bound: {same}.")
    return lines
