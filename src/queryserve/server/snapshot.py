"""What a server process has counted, taken at one moment: the figures `/metrics` and the
KServe statistics (HTTP and gRPC) report.

With one process the snapshot holds the live objects (nothing is copied: it is read on the event
loop that updates them). With `--workers N` each worker is a server of its own: whichever worker
answers a scrape asks its siblings for theirs (`queryserve.server.workers`, pickled over a Unix
socket) and reports the sum, so the figures do not depend on which worker the kernel picked.

Why not prometheus-client's multiprocess mode: it refuses custom collectors, and the server's
figures are custom collectors over numbers it keeps anyway (no client-library objects on the hot
path); nor does it give Triton's statistics, which perf_analyzer reads. A snapshot on request
costs one round trip per sibling per scrape, and nothing per request.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from queryserve.scheduling.stats import ModelStats


@dataclass(slots=True)
class TransportCounts:
    """The HTTP transport's connections and refusals (`HttpServer`'s counts)."""

    connections: int = 0
    unanswered: int = 0
    """Requests read and not yet answered, the scrape that asks included."""
    rejections: dict[str, int] = field(default_factory=dict)
    """Refusals by reason (`queryserve.server.http.RejectionReason`)."""
    rebalanced: int = 0
    """Connections closed after an answer because their worker held more than its share."""
    aged: int = 0
    """Connections closed after an answer at `--max-connection-age`."""

    @property
    def refused(self) -> int:
        return self.rejections.get("max_connections", 0) + self.rejections.get("draining", 0)

    @property
    def evicted(self) -> int:
        return self.rejections.get("evicted", 0)

    def merge(self, other: TransportCounts) -> None:
        self.connections += other.connections
        self.unanswered += other.unanswered
        self.rebalanced += other.rebalanced
        self.aged += other.aged
        for reason, count in other.rejections.items():
            self.rejections[reason] = self.rejections.get(reason, 0) + count


@dataclass(slots=True)
class ModelFigures:
    stats: ModelStats
    queue_depth: int
    """Items waiting in the model's queue now."""


@dataclass(slots=True)
class Snapshot:
    models: dict[str, ModelFigures] = field(default_factory=dict)
    transport: TransportCounts | None = None
    """None until the process listens."""
    auth_failures: int = 0
    auth_forbidden: int = 0
    process: list[Metric] = field(default_factory=list)
    """`process_*` and `python_*` families; with workers, each sample labelled by `worker`."""
    workers: int = 1
    """Processes summed into this snapshot."""


def process_families(worker: int | None) -> list[Metric]:
    """This process's CPU, memory, file descriptors, interpreter and collector figures, as
    prometheus-client's own collectors read them; with a `worker` number, each sample carries
    it as a label, since these are per process and summing them would mean nothing.

    Each family is a copy: `PlatformCollector` returns the same `python_info` object on every
    collect, and `merged` adds the siblings' samples to the families it keeps. On that object,
    every statistics read of a `--workers 2` server made it longer in the worker that answered,
    and the next snapshot shipped the longer list to the other: 1.3 million samples (1.5 GB)
    in one worker within one `queryserve bench --find-max`."""
    label = None if worker is None else str(worker)
    return [_copy(family, label) for collector in _process_collectors()
            for family in collector.collect()]


def _copy(family: Metric, worker: str | None) -> Metric:
    """`family` with a list of samples of its own, each labelled with `worker` if given."""
    mine = copy.copy(family)  # the same name, type, help and unit
    mine.samples = [sample if worker is None
                    else sample._replace(labels={**sample.labels, "worker": worker})
                    for sample in family.samples]
    return mine


@cache
def _process_collectors() -> tuple[Collector, ...]:
    """The library's collectors, made once, on no registry (they read when collected)."""
    return (ProcessCollector(registry=None), PlatformCollector(registry=None),
            GCCollector(registry=CollectorRegistry()))  # its hint refuses None; a spare one


def merged(snapshots: Sequence[Snapshot]) -> Snapshot:
    """The whole server's snapshot: counters, histograms, queue depths and connections summed
    over the workers', the per-process families side by side (one series per worker). A model
    that some workers have and others not (a load reaching them one after the other) counts
    what those that have it did."""
    if len(snapshots) == 1:
        return snapshots[0]
    whole = Snapshot(transport=None, workers=0)
    families: dict[str, Metric] = {}
    for part in snapshots:
        for name, figures in part.models.items():
            mine = whole.models.get(name)
            if mine is None:
                whole.models[name] = mine = ModelFigures(ModelStats(), 0)
            mine.stats.merge(figures.stats)
            mine.queue_depth += figures.queue_depth
        if part.transport is not None:
            if whole.transport is None:
                whole.transport = TransportCounts()
            whole.transport.merge(part.transport)
        whole.auth_failures += part.auth_failures
        whole.auth_forbidden += part.auth_forbidden
        whole.workers += part.workers
        _side_by_side(families, part.process)
    whole.process = list(families.values())
    return whole


def _side_by_side(families: dict[str, Metric], more: Iterable[Metric]) -> None:
    for family in more:
        kept = families.get(family.name)
        if kept is None:
            families[family.name] = family
        else:
            kept.samples.extend(family.samples)
