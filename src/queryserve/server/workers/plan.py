"""How many workers `--workers auto` starts, and why; how long one may be stuck.

One worker per 4 cores, and never fewer cores per worker than a model has instances: the event
loop of one process stops near 1,900 requests/s whatever the model costs, so cores beyond what
one loop can feed are wasted in one process; and each worker runs every model's instances, so a
worker with fewer cores than instances would oversubscribe them. On the 16-core Intel Xeon the
issue "All the cores" measured (2026-11-27, `embed` alone, max rate at p99 <= 10 ms): four
servers of 3 instances served 3,469 req/s, six of 2 instances 2,625, one of 14 instances 1,750.
On 2 cores that gives one worker: a second would halve each loop's cores and add a process
(BENCHMARKS "Workers" measures both).
"""

from __future__ import annotations

import logging
from pathlib import Path

from queryserve.config import load_config
from queryserve.errors import QueryServeError

log = logging.getLogger(__name__)

CORES_PER_WORKER = 4
WORKER_TIMEOUT_S = 10.0
"""A serving worker whose event loop has been still this long is stuck: the supervisor kills
and replaces it (`--worker-timeout`). Every slow step (building a model, running a batch) runs
off the loop, which turns every few milliseconds under load, so seconds of stillness are not
slowness; and until the kill, each new connection the kernel hands the stuck worker waits and
is then reset (RELIABILITY.md section 8: 21 of 57 new connections over a 5 s timeout), so a
short timeout costs clients less. gunicorn's is 30 s, for workers that block on a request."""


def most_instances(repository: Path) -> int:
    """The largest instance count of the repository's models (1 when it has none)."""
    counts = [1]
    if repository.is_dir():
        for folder in sorted(repository.iterdir()):
            try:
                config = load_config(folder)
            except QueryServeError:  # not a model, or one the server will report itself
                continue
            if config.ensemble is None:
                counts.append(config.instance_group.count)
    return max(counts)


def auto_workers(cores: int, repository: Path) -> tuple[int, str]:
    """The number of workers for `cores`, and the reason, for the log."""
    instances = most_instances(repository)
    per_worker = max(CORES_PER_WORKER, instances)
    workers = max(1, cores // per_worker)
    left = f"; {cores % workers} left to no worker" if workers > 1 and cores % workers else ""
    return workers, (f"{cores} cores, {per_worker} per worker (one event loop feeds about "
                     f"{CORES_PER_WORKER} cores; the largest model has {instances} "
                     f"instance(s)){left}")


def idle_cores(cores: int, workers: int) -> str | None:
    """What `workers` leave idle of `cores`, with the counts that would use them all; None when
    they divide them, or outnumber them (`serve` refuses that before asking). The kernel gives
    the workers equal parts of the load, so each gets cores // workers: on the 16-core Intel Xeon
    (14 cores served), 10 workers ran 10 instances and served 2,875 req/s at p99 <= 10 ms where
    7 workers ran 14 and served 4,000 (BENCHMARKS.md, "measured separately")."""
    if workers >= cores or cores % workers == 0:
        return None
    fits = [n for n in range(2, cores + 1) if cores % n == 0]
    return (f"{workers} workers on {cores} cores: {cores // workers} each, and "
            f"{cores % workers} core(s) run no model instance; --workers "
            f"{' or '.join(map(str, fits[-3:]))} would use them all")
