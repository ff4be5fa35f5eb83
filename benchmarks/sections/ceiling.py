"""Section 5, the load generator's own ceiling against a server that answers at once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

from sections.common import OUT, QUERYSERVE, _ms, log


def measure() -> dict[str, Any]:
    """The instant server on core 1, `queryserve bench` on core 0 alone."""
    server = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "queryserve.bench.loadgen",
         "serve-instant", "--port", "0", "--lifetime-s", "300"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        address = server.stdout.readline().split()[1]
        out = OUT / "bench" / "ceiling"
        shutil.rmtree(out, ignore_errors=True)
        command = ["taskset", "-c", "0", QUERYSERVE, "bench", f"http://{address}/x",
                   "--protocol", "openai", "--rates", "5000,20000,50000", "--duration", "5",
                   "--out", str(out), "--no-progress"]
        log("ceiling: $ " + " ".join(command))
        subprocess.run(command, check=True, capture_output=True)
        results: dict[str, Any] = json.loads((out / "results.json").read_text())
        results["command_shown"] = " ".join(command).replace(str(out), "OUT").replace(
            QUERYSERVE, "queryserve").replace(address, "127.0.0.1:PORT")
        return results
    finally:
        server.kill()
        server.wait()


def render(results: dict[str, Any]) -> list[str]:
    lines = [
        "## 5. The load generator's own ceiling",
        "",
        "`queryserve bench` alone on core 0 against a server that answers at once on core 1:",
        f"`{results['command_shown']}` (server: `taskset -c 1 python -m "
        "queryserve.bench.loadgen serve-instant`).",
        "",
        "| target req/s | achieved req/s | p50 / p99 (ms) | generator CPU per request (us) | "
        "generator's share of its core |",
        "|---:|---:|---:|---:|---:|",
    ]
    for step in results["steps"]:
        lat = step["latency_ms"]
        lines.append(f"| {step['target_rate']:,.0f} | {step['throughput']:,.0f} | "
                     f"{_ms(lat.get('p50'))} / {_ms(lat.get('p99'))} | "
                     f"{step['client_cpu_us_per_request']:.1f} | "
                     f"{step['client_cpu_share']:.0%} |")
    return lines
