"""The hand-written HTTP/1.1 transport against uvicorn and granian serving the same application,
side by side (issue 40, point 4).

    python benchmarks/transports.py [--rounds 2] [--cpu-rate 500] [--cpu-duration 10]

One repository holding only the `fake` backend's model `fast` (a model that costs nothing, so
what is measured is the server) is served three ways, one process each on a free loopback port,
one worker each:

- `queryserve`: `queryserve serve --grpc off --workers 1` (its own transport on uvloop);
- `uvicorn`: `--loop uvloop --http httptools --workers 1` on `benchmarks/asgi_app.py`, the same
  `ServerApp` over raw ASGI (keep-alive timeout raised to queryserve's 300 s idle timeout);
- `granian`: `--interface asgi --workers 1 --runtime-threads 1 --blocking-threads 1 --loop
  uvloop --http 1` on the same adapter (granian serves from a worker process it spawns).

In alternating rounds (queryserve, uvicorn, granian, queryserve, ...) each server is measured
twice: the server's CPU per request, its process tree's utime + stime (every thread, and the
worker granian spawns) over a fixed open-loop load (`queryserve bench --rate`) divided by the
inferences its statistics counted; then the max rate at p99 <= 10 ms (`queryserve bench
--find-max`, KServe v2 JSON, one query per request). Before any load, one request to each must
answer 200 with the same JSON. Prints a markdown table and keeps the results (and each server's
log) under bench-out/transports/; `queryserve bench`'s own output goes where
`sections.common.bench` puts it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

from asgi_app import REPOSITORY_VARIABLE  # noqa: E402
from sections.common import ROOT, bench, log, machine_line  # noqa: E402
from tests.conftest import write_fake_model  # noqa: E402

from queryserve.bench.server_process import (  # noqa: E402
    free_port,
    launch,
    serve_command,
    stop,
    wait_ready,
)

OUT = ROOT / "bench-out" / "transports"
MODEL = "fast"
TRANSPORTS = ("queryserve", "uvicorn", "granian")
PROBE = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES",
                                "data": ["play some jazz music"]}]}).encode()


def server_command(transport: str, repository: Path, port: int) -> list[str]:
    """The command line that serves `repository` on 127.0.0.1:`port` with `transport`."""
    address = ["--host", "127.0.0.1", "--port", str(port)]
    if transport == "queryserve":
        return serve_command(repository, port, "--grpc", "off", "--workers", "1")
    if transport == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "--factory", "asgi_app:make_app",
                "--app-dir", str(HERE), *address, "--loop", "uvloop", "--http", "httptools",
                "--no-access-log", "--workers", "1", "--lifespan", "on",
                "--timeout-keep-alive", "300", "--log-level", "warning"]
    if transport == "granian":
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--factory", *address,
                "--workers", "1", "--runtime-threads", "1", "--blocking-threads", "1",
                "--loop", "uvloop", "--http", "1", "--no-ws", "--no-access-log",
                "--log-level", "warning", "asgi_app:make_app"]
    raise ValueError(f"unknown transport {transport!r}; expected one of {TRANSPORTS}")


@contextlib.contextmanager
def serving(transport: str, repository: Path,
            log_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The server on a free loopback port until the block ends; yields (URL, process) once
    /v2/health/ready answers 200."""
    port = free_port()
    env = {**os.environ, REPOSITORY_VARIABLE: str(repository), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(HERE),
                                                       os.environ.get("PYTHONPATH"))))}
    server = launch(server_command(transport, repository, port), port, log_path, env=env)
    try:
        wait_ready(server.url, server.process, log_path)
        yield server.url, server.process
    finally:
        tree = process_tree(server.process.pid)  # before the stop, while its children live
        stop(server.process)
        for pid in tree[1:]:  # whatever it spawned (granian's worker) and left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def probe(url: str) -> tuple[int, Any]:
    """One KServe infer request: its status and JSON answer."""
    request = urllib.request.Request(f"{url}/v2/models/{MODEL}/infer", data=PROBE,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (the first is the state)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                children[int(_stat(int(entry.name))[1])].append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children[tree[-1]])
    return tree


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of `pid`, its live descendants and the children
    it has reaped."""
    ticks = 0
    for index, member in enumerate(process_tree(pid)):
        with contextlib.suppress(OSError):
            fields = _stat(member)
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
            if index == 0:
                ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def inferences(url: str) -> int:
    """Requests the model answered so far (its KServe statistics)."""
    with urllib.request.urlopen(f"{url}/v2/models/{MODEL}/stats", timeout=5) as resp:
        count: int = json.loads(resp.read())["model_stats"][0]["inference_stats"]["success"][
            "count"]
        return count


def measure(transport: str, round_: int, repository: Path,
            args: argparse.Namespace) -> dict[str, Any]:
    label = f"transports-{transport}-{round_}"
    with serving(transport, repository, OUT / f"{label}.log") as (url, proc):
        status, answer = probe(url)
        if status != 200:
            raise RuntimeError(f"{transport} answered {status}: {answer}")
        cpu_before, count_before = cpu_s(proc.pid), inferences(url)
        fixed = bench(url, "--model", MODEL, "--rate", str(args.cpu_rate), "--duration",
                      str(args.cpu_duration), name=f"{label}-{args.cpu_rate:g}")
        cpu, answered = cpu_s(proc.pid) - cpu_before, inferences(url) - count_before
        search = ("--duration", str(args.search_duration)) if args.search_duration else ()
        at_max = bench(url, "--model", MODEL, "--find-max", "--p99-ms", "10", *search,
                       name=f"{label}-max")
    step = at_max["search"].get("step")
    best = at_max["steps"][step] if step is not None else {}
    steady = fixed["steps"][0]
    return {"round": round_, "transport": transport, "answer": answer,
            "max_rate": at_max["search"].get("max_rate"),
            "max_p99_ms": best.get("latency_ms", {}).get("p99"),
            "cpu_us_per_request": cpu / answered * 1e6 if answered else None,
            "cpu_s": cpu, "answered": answered,
            "fixed_rate": {"target": args.cpu_rate, "throughput": steady["throughput"],
                           "p50_ms": steady["latency_ms"]["p50"],
                           "p99_ms": steady["latency_ms"]["p99"],
                           "failures": sum(n for s, n in steady["by_status"].items()
                                           if not s.startswith("2"))
                           + steady["errors"] + steady["timeouts"]}}


def versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name)
            for name in ("uvicorn", "granian", "httptools", "uvloop")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpu-rate", type=float, default=500.0,
                        help="the open-loop rate (req/s) the CPU per request is read at "
                             "(default: %(default)g)")
    parser.add_argument("--cpu-duration", type=float, default=10.0,
                        help="seconds of that load (default: %(default)g)")
    parser.add_argument("--search-duration", type=float, default=None,
                        help="seconds per step of the max-rate search (default: bench's)")
    args = parser.parse_args()
    missing = [name for name in ("uvicorn", "granian") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"needs {' and '.join(missing)}: "
                         f"{sys.executable} -m pip install {' '.join(missing)}")
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="queryserve-transports-") as folder:
        repository = Path(folder)
        write_fake_model(repository, MODEL, max_batch_size=8, max_queue_size=256)
        for round_ in range(1, args.rounds + 1):
            for transport in TRANSPORTS:
                log(f"round {round_}: {transport}")
                rows.append(measure(transport, round_, repository, args))
    answers = {json.dumps(r["answer"], sort_keys=True) for r in rows}
    if len(answers) != 1:
        raise SystemExit(f"the transports answered the probe differently: {answers}")
    settings = {"rounds": args.rounds, "cpu_rate": args.cpu_rate,
                "cpu_duration_s": args.cpu_duration, "search_duration_s": args.search_duration}
    (OUT / "results.json").write_text(json.dumps(
        {"machine": machine_line(), "versions": versions(), "settings": settings,
         "rows": rows}, indent=2))
    print(render(rows, args.cpu_rate))
    return 0


def render(rows: list[dict[str, Any]], cpu_rate: float) -> str:
    rounds = max(r["round"] for r in rows)
    named = ", ".join(f"{name} {version}" for name, version in versions().items())
    lines = [f"Machine: {machine_line()}; {named}", "",
             "| transport | " + " | ".join(f"max req/s at p99 <= 10 ms, round {i}"
                                          for i in range(1, rounds + 1))
             + f" | median | CPU us/request at {cpu_rate:g} req/s (median) "
               f"| p50 / p99 there (median) |",
             "|---|" + "---:|" * (rounds + 3)]
    for transport in TRANSPORTS:
        mine = [r for r in rows if r["transport"] == transport]
        rates = [r["max_rate"] for r in mine]
        passed = [rate for rate in rates if rate]
        cpus = [r["cpu_us_per_request"] for r in mine if r["cpu_us_per_request"]]
        cpu = f"{statistics.median(cpus):.0f}" if cpus else "-"
        p50 = statistics.median(r["fixed_rate"]["p50_ms"] for r in mine)
        p99 = statistics.median(r["fixed_rate"]["p99_ms"] for r in mine)
        lines.append(f"| {transport} | " + " | ".join(_rate(rate) for rate in rates)
                     + f" | {_rate(statistics.median(passed) if passed else None)} | {cpu} | "
                       f"{p50:.2f} / {p99:.2f} ms |")
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "none passed" if not value else f"{value:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
