"""The batch job's scoring stage on Ray Data (`--engine ray`): each part becomes a row of a Ray
dataset, and `job.score_part` runs on Ray's workers, one task per part.

`score_part` reads only the work folder's files and writes its part whole or not at all, so
Ray's retries cannot duplicate rows, and a job killed under Ray resumes like a local one. On a
cluster (`--ray-address`), the work folder (beside OUTPUT) must be on storage that every node
sees. Without an address, a local Ray is started, on 127.0.0.1 only, and stopped at the end.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from functools import partial
from typing import Any

from queryserve.duplicates.job import Job, score_part
from queryserve.duplicates.products import DuplicatesError

CONNECT_TIMEOUT_S = 5.0


def check_reachable(address: str) -> None:
    """Fail in seconds on a HOST:PORT nobody listens on: Ray's own client retries for minutes
    before it gives up. Other address forms ("auto", ray://) go to Ray as they are."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise DuplicatesError(f"cannot reach the Ray cluster at {address}: "
                              f"{exc.strerror or exc}") from None


def _score(row: dict[str, Any], job: Job) -> dict[str, Any]:
    number = int(row["part"])
    # One ONNX Runtime thread per task: Ray runs a task per core, and threads x tasks must not
    # exceed the cores.
    return {"part": number, "pairs": score_part(job, number, threads=1)}


def score_parts(job: Job, todo: list[int], address: str | None,
                on_part: Callable[[], None]) -> int:
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        if address is None:
            ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
                     _node_ip_address="127.0.0.1", logging_level=logging.WARNING,
                     log_to_driver=False, configure_logging=False)
        else:
            check_reachable(address)
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its per-run INFO and WARNING lines
    ray.data.DataContext.get_current().enable_progress_bars = False  # ours is on screen
    try:
        scored = 0
        if todo:
            parts = ray.data.from_items([{"part": n} for n in todo],
                                        override_num_blocks=len(todo))
            for row in parts.map(partial(_score, job=job)).iter_rows():
                scored += int(row["pairs"])
                on_part()
        return scored
    finally:
        if started_here:
            ray.shutdown()
