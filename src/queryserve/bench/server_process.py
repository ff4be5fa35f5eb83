"""A `queryserve serve` process for a benchmark: a one-model repository to serve from, the
server on a free loopback port pinned to the cores it is given, ready before the load starts and
stopped when the block ends, and its peak resident memory.

Every benchmark starts and stops its servers here (issue 42): `serving` for a measured point,
`running` for any server command (another transport, a fault scenario's flags and
environment), and `launch` / `wait_ready` / `stop` for a script that holds a server across
steps of its own (a rolling deploy, a time-bounded device run)."""

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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from queryserve.errors import BenchError

READY_TIMEOUT_S = 180.0
READY_POLL_S = 0.1
STOP_TIMEOUT_S = 20.0  # SIGTERM, then SIGKILL: a benchmark's server has no queue to drain
KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class ServerProcess:
    """A started server: its base URL on 127.0.0.1, its port, its process and its log."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path


def build_repository(root: Path, model: str, model_dir: Path, config: dict[str, Any]) -> Path:
    """A repository holding one model: symlinks to the prepared files, its own model.yaml."""
    folder = root / model
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():  # an earlier run's links may name another model's files
        if old.is_symlink():
            old.unlink()
    for entry in model_dir.iterdir():
        if entry.name != "model.yaml":
            (folder / entry.name).symlink_to(entry.resolve())
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
    return _summed_mb(pid, "VmHWM:")


def rss_mb(pid: int) -> float | None:
    """The process's resident memory now, with its children's (see `peak_rss_mb`)."""
    return _summed_mb(pid, "VmRSS:")


def _summed_mb(pid: int, key: str) -> float | None:
    found = [kb for p in (pid, *_children(pid)) if (kb := _status_kb(p, key)) is not None]
    return round(sum(found) / 1024, 1) if found else None


def _status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key):
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


Key = TypeVar("Key")


def connections_on(port: int, processes: Mapping[Key, int]) -> dict[str, Key]:
    """The established TCP connections whose local port is `port` (a server's side of its
    clients' connections), each by its socket's inode, with the key of the process that holds
    it (`processes`: key -> pid, e.g. worker number -> pid). Read from /proc: which worker of a
    `--workers N` server the kernel gave each connection to."""
    owners: dict[str, Key] = {}
    for key, pid in processes.items():
        with contextlib.suppress(OSError):  # the process gone, or a descriptor closed meanwhile
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        owners[link[8:-1]] = key
    held: dict[str, Key] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()  # sl local rem st ... inode: st 01 is ESTABLISHED
            local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            if local_port == port and state == "01" and inode in owners:
                held[inode] = owners[inode]
    return held


def serve_command(repository: Path, port: int, *flags: str) -> list[str]:
    """`queryserve serve` of `repository` on 127.0.0.1:`port` with `flags`, in this venv."""
    return [sys.executable, "-m", "queryserve", "serve", "--repository", str(repository),
            "--http", f"127.0.0.1:{port}", *flags]


@contextlib.contextmanager
def serving(repository: Path, cores: int, total_cores: int, log_path: Path,
            grpc: str | None = "off", workers: int | None = None,
            ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`queryserve serve` on a free loopback port, pinned to ``cores`` cores, until the block
    ends; yields (base URL, process) once the model is ready. ``grpc``: the `--grpc` address
    (off by default, so no fixed port is taken); None leaves the flag out, for a commit that
    predates it. ``workers``: `--workers` (None leaves it out, the same way)."""
    port = free_port()
    flags = ["--cores", str(cores), *(("--grpc", grpc) if grpc is not None else ()),
             *(("--workers", str(workers)) if workers is not None else ())]
    # The server gets only its own cores, so a 1-core point is charged for one core.
    cpus = sorted(os.sched_getaffinity(0))[:cores] if cores < total_cores else None
    with running(serve_command(repository, port, *flags), port, log_path, cpus=cpus) as server:
        yield server.url, server.process


@contextlib.contextmanager
def running(command: Sequence[str], port: int, log_path: Path, *,
            env: Mapping[str, str] | None = None, cpus: Sequence[int] | None = None,
            stop_timeout_s: float = STOP_TIMEOUT_S) -> Iterator[ServerProcess]:
    """`command`, a server that listens on 127.0.0.1:`port` and answers KServe's readiness,
    from when it is ready until the block ends (`launch`, `wait_ready`, `stop`)."""
    server = launch(command, port, log_path, env=env, cpus=cpus)
    try:
        wait_ready(server.url, server.process, log_path)
        yield server
    finally:
        stop(server.process, stop_timeout_s)


def launch(command: Sequence[str], port: int, log_path: Path, *,
           env: Mapping[str, str] | None = None, cpus: Sequence[int] | None = None,
           own_group: bool = False) -> ServerProcess:
    """`command` started, its output in `log_path`; `cpus`: the cores it is pinned to (None:
    all). `own_group`: in a process group of its own, which `stop(group=True)` ends with
    whatever is left in it; off by default, so that a signal to the benchmark's group (Ctrl-C,
    a job runner's kill) reaches the server too. Not waited for, and the caller's to stop."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pinned = None if cpus is None else list(cpus)
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT,
            process_group=0 if own_group else None, env=None if env is None else dict(env),
            preexec_fn=None if pinned is None else lambda: os.sched_setaffinity(0, pinned))
    return ServerProcess(f"http://127.0.0.1:{port}", port, process, log_path)


def ready_status(url: str, timeout_s: float = 2.0) -> int:
    """`/v2/health/ready`'s status on a new connection; 0 when nothing answered."""
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path,
               timeout_s: float = READY_TIMEOUT_S) -> float:
    """Until `/v2/health/ready` at `url` answers 200; the seconds that took. A BenchError with
    the log's tail if the process exits first, or after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise BenchError("the server exited before it was ready:\n  " + "\n  ".join(tail))
        if ready_status(url) == 200:
            return time.monotonic() - started
        log = log_path.read_text(errors="replace")
        if "failed to load" in log:  # it will not be ready: waited for, 180 s and no reason
            tail = log.strip().splitlines()[-5:]
            raise BenchError("the server's model failed to load:\n  " + "\n  ".join(tail))
        time.sleep(READY_POLL_S)
    raise BenchError(f"the server at {url} was not ready within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S, *,
         group: bool = False) -> int | None:
    """SIGTERM, and SIGKILL if it has not exited within `timeout_s`; its exit code. `group`
    (a process launched with `own_group`): then SIGKILL to its group, for whatever it left
    behind. Off by default: a fault scenario counts the workers a supervisor left running."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=KILL_WAIT_S)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    code: int | None = proc.returncode
    return code
