"""A `queryserve serve` process for a benchmark: a one-model repository to serve from, the
server on a free loopback port pinned to the cores it is given, ready before the load starts and
stopped when the block ends, and its peak resident memory."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from queryserve.errors import BenchError

READY_TIMEOUT_S = 180.0


def build_repository(root: Path, model: str, model_dir: Path, config: dict[str, Any]) -> Path:
    """A repository holding one model: symlinks to the prepared files, its own model.yaml."""
    folder = root / model
    folder.mkdir(parents=True, exist_ok=True)
    for entry in model_dir.iterdir():
        if entry.name == "model.yaml":
            continue
        link = folder / entry.name
        if not link.is_symlink():
            link.symlink_to(entry.resolve())
    (folder / "model.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident memory, with its children's (a server of several workers
    is its supervisor and their processes)."""
    peaks = [_peak_kb(p) for p in (pid, *_children(pid))]
    found = [kb for kb in peaks if kb is not None]
    return round(sum(found) / 1024, 1) if found else None


def _peak_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


@contextlib.contextmanager
def serving(repository: Path, cores: int, total_cores: int, log_path: Path,
            grpc: str | None = "off", workers: int | None = None,
            ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`queryserve serve` on a free loopback port, pinned to ``cores`` cores, until the block
    ends; yields (base URL, process) once the model is ready. ``grpc``: the `--grpc` address
    (off by default, so no fixed port is taken); None leaves the flag out, for a commit that
    predates it. ``workers``: `--workers` (None leaves it out, the same way)."""
    port = free_port()
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    command = [sys.executable, "-m", "queryserve", "serve", "--repository", str(repository),
               "--http", f"127.0.0.1:{port}", "--cores", str(cores),
               *(("--grpc", grpc) if grpc is not None else ()),
               *(("--workers", str(workers)) if workers is not None else ())]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT,
            # The server gets only its own cores, so a 1-core point is charged for one core.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cores < total_cores else None)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, proc, log_path)
            yield url, proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until `/v2/health/ready` at `url` answers 200; a BenchError with the log's tail if the
    process exits first, or after READY_TIMEOUT_S."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise BenchError("the server exited before it was ready:\n  " + "\n  ".join(tail))
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise BenchError(f"the server at {url} was not ready within {READY_TIMEOUT_S:.0f} s")
