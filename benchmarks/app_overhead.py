"""CPU per request of the server's application layer, in process: routing, KServe decoding, the
model call through the scheduler (one hop to the instance's thread), encoding; no sockets and
no real model (the fake backend, 16-d vectors).

    python benchmarks/app_overhead.py [--requests 30000] [--variant open|loopback|key|log]

Variants (what the access checks and the access log cost): `open`, no checks (a server bound
beyond loopback without flags); `loopback`, the Host guard a loopback-bound server runs by
default; `key`, that plus an API key checked on every request; `log`, that plus the access log
written to a file.

Against an earlier commit, each run a process of its own, alternating:

    git worktree add /tmp/base 0dff592
    for i in 1 2 3 4 5 6 7 8; do
        PYTHONPATH=/tmp/base/src python benchmarks/app_overhead.py >> /tmp/base.txt
        python benchmarks/app_overhead.py >> /tmp/head.txt
    done

It runs the code that PYTHONPATH finds first, so the same script measures both.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from queryserve.repository import ModelRepository  # noqa: E402
from queryserve.server.app import ServerApp  # noqa: E402

try:  # where the request type lives depends on the commit measured
    from queryserve.server.http_types import Request
except ImportError:
    from queryserve.server.http import Request  # type: ignore[attr-defined,no-redef]

from tests.conftest import write_fake_model  # noqa: E402

BODY = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES",
                               "data": ["play some jazz music"]}]}).encode()


def make_app(repository: ModelRepository, variant: str, folder: Path) -> ServerApp:
    if variant == "open":
        return ServerApp(repository)
    from queryserve.server.access_log import AccessLog
    from queryserve.server.security import AccessControl

    keys = () if variant == "loopback" else ("a-key-of-some-length-0123456789",)
    access_log = AccessLog(str(folder / "access.log")) if variant == "log" else None
    return ServerApp(repository, auth=AccessControl.for_server("127.0.0.1", keys),
                     access_log=access_log)


async def measure(repository_dir: Path, requests: int, variant: str) -> tuple[float, float]:
    repository = ModelRepository(repository_dir, cores=1)
    loaded = repository.load_all()
    if inspect.isawaitable(loaded):  # async since the model API; sync before
        await loaded
    app = make_app(repository, variant, repository_dir)
    headers = {} if variant == "open" else {
        "host": "127.0.0.1:8000", "authorization": "Bearer a-key-of-some-length-0123456789"}

    def request() -> Request:
        return Request("POST", "/v2/models/fast/infer", "", dict(headers), BODY)

    for _ in range(500):  # warm-up
        answer = await app(request())
        assert answer.status == 200, answer.body
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(requests):
        await app(request())
    after, ended = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return (ended - started) / requests * 1e6, cpu / requests * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--variant", choices=("open", "loopback", "key", "log"), default="open")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        write_fake_model(Path(folder), "fast", max_batch_size=8, max_queue_size=256)
        wall_us, cpu_us = asyncio.run(measure(Path(folder), args.requests, args.variant))
    print(f"{args.variant}: wall {wall_us:.1f} us/request, cpu {cpu_us:.1f} us/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
