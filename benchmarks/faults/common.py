"""What every fault scenario shares: where its files go, how long it runs (`Mode`), the server
under test (started on 127.0.0.1, always stopped), the server's memory, CPU and metrics as
/proc and `/metrics` tell them, `queryserve bench`, and how a figure is judged."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from queryserve.bench import server_process
from queryserve.bench.server_process import free_port, serve_command

HERE = Path(__file__).resolve().parent.parent  # benchmarks/
ROOT = HERE.parent
OUT = ROOT / "bench-out" / "reliability"
REPOSITORY = ROOT / "model_repository"
QUERIES = ROOT / "data" / "massive-en" / "test.jsonl"
STOP_TIMEOUT_S = 40.0  # SIGTERM, then SIGKILL: the drain timeout (30 s) and some


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Mode:
    """Full (the figures RELIABILITY.md is for) or quick (small counts and short phases, to
    check that a scenario runs)."""

    quick: bool = False

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full

    @property
    def name(self) -> str:
        return "quick" if self.quick else "full"


def queries(limit: int = 0) -> list[str]:
    """Real queries: the MASSIVE en-US test utterances, in file order."""
    texts = [json.loads(line)["text"] for line in QUERIES.read_text().splitlines() if line]
    return texts[:limit] if limit else texts


def groups(size: int, count: int) -> list[list[str]]:
    """`count` groups of `size` real queries, cycling through the file."""
    texts = queries()
    return [[texts[(i * size + j) % len(texts)] for j in range(size)] for i in range(count)]


def kserve_body(texts: list[str]) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "shape": [len(texts), 1],
                                   "datatype": "BYTES", "data": texts}]}).encode()


# -- the server under test --------------------------------------------------------------------


@dataclass
class Server:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    flags: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_mb(self) -> float:
        """The server's resident memory now (VmRSS), MB."""
        return _status_kb(self.pid, "VmRSS:") / 1024

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far (user + system)."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, name: str, model: str = "", **labels: str) -> float | None:
        """One sample of `/metrics`, e.g. metric("queryserve_queue_depth", "embed"); without a
        model, the sample with exactly `labels` (`process_cpu_seconds_total`, worker="0"), or
        with none (`queryserve_http_connections`)."""
        wanted = ({"model": model} if model else {}) | labels
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if not wanted and line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
            if not line.startswith(name + "{"):
                continue
            inside, value = line[len(name) + 1:].rsplit("} ", 1)
            found = dict(part.split("=", 1) for part in inside.split(","))
            if {k: v.strip('"') for k, v in found.items()} == wanted:
                return float(value)
        return None


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


@contextlib.contextmanager
def serving(repository: Path, name: str, *flags: str,
            own_group: bool = False) -> Iterator[Server]:
    """`queryserve serve` on a free loopback port with `flags`, until the block ends (then
    SIGTERM, and SIGKILL if it has not exited within STOP_TIMEOUT_S); its log is
    OUT/logs/NAME.log. `own_group`: in a process group of its own, for a scenario that
    signals the whole group."""
    server = launch(repository, OUT / "logs" / f"{name}.log", *flags, own_group=own_group)
    try:
        wait_ready(server)
        yield server
    finally:
        stop(server.process)


def launch(repository: Path, log_path: Path, *flags: str, own_group: bool = False) -> Server:
    """`queryserve serve --grpc off` with `flags` started on a free loopback port, its output
    in `log_path`; not waited for (`wait_ready`), and the caller's to stop (`stop`)."""
    port = free_port()
    command = serve_command(repository, port, "--grpc", "off", *flags)
    # Unbuffered, so that a scenario reading the log (worker pids, "retired") sees each line
    # at once; the environment read now, after reliability.py's own settings.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = server_process.launch(command, port, log_path, env=env, own_group=own_group)
    return Server(started.url, port, started.process, log_path, list(flags))


def stop(process: subprocess.Popen[Any]) -> None:
    """The runner's stop, with time for the server's drain (its timeout is 30 s)."""
    server_process.stop(process, STOP_TIMEOUT_S)


def wait_ready(server: Server) -> None:
    """Until the server is ready (the runner's wait: a BenchError with the log's tail if it
    exits first)."""
    server_process.wait_ready(server.url, server.process, server.log)


def one_model_repository(model: str, folder: Path, **batching: int) -> Path:
    """A repository serving one model of the default one: its files linked, its model.yaml
    with `dynamic_batching` fields overridden (e.g. max_queue_size=4096)."""
    shutil.rmtree(folder, ignore_errors=True)
    target = folder / model
    target.mkdir(parents=True)
    source = REPOSITORY / model
    for item in source.iterdir():
        if item.name != "model.yaml":
            (target / item.name).symlink_to(item)
    config = yaml.safe_load((source / "model.yaml").read_text())
    config.setdefault("dynamic_batching", {}).update(batching)
    (target / "model.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


class RssSampler:
    """The server's RSS every `interval_s` on a thread, with when (time.monotonic)."""

    def __init__(self, server: Server, interval_s: float = 0.25) -> None:
        self.server = server
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, RuntimeError):  # the server has exited
                self.samples.append((time.monotonic(), self.server.rss_mb()))
            self._stop.wait(self.interval_s)

    def peak_mb(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        inside = [mb for t, mb in self.samples if start <= t <= end]
        return max(inside) if inside else None


# -- queryserve bench -------------------------------------------------------------------------


def bench(url: str, *args: str, name: str) -> dict[str, Any]:
    """One `queryserve bench` run; its results.json, with the command as shown."""
    out = OUT / "bench" / name
    shutil.rmtree(out, ignore_errors=True)
    command = [str(Path(sys.executable).parent / "queryserve"), "bench", url, *args,
               "--out", str(out), "--no-progress"]
    log("  $ queryserve " + " ".join(command[2:]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    (out.parent / f"{name}.log").write_text(done.stderr + done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"queryserve bench failed:\n{done.stderr[-2000:]}")
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    results["command_shown"] = "queryserve bench URL " + " ".join(args)
    return results


# -- judging ----------------------------------------------------------------------------------


def verdict(met: bool, text: str) -> str:
    """The one-line verdict against a target: never hides a miss."""
    return f"**{'met' if met else 'missed'}**: {text}"


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def how(lines: list[str]) -> list[str]:
    """A scenario's sentence on how it measures, as a paragraph."""
    return [*lines, ""]
