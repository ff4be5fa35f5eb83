"""Per-model statistics: the numbers behind `/v2/models/{m}/stats` and `/metrics`.

One object feeds both, so Triton's statistics extension (which perf_analyzer reads for its
queue / compute breakdown) and Prometheus always agree. Updated only on the event loop's thread,
so it needs no locks.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from queryserve.errors import QueryServeError

# Seconds; fine at the low end where a CPU query model lives (100 us .. 10 s).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02,
    0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class Histogram:
    """A Prometheus histogram: cumulative bucket counts, a sum and a count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def merge(self, other: Histogram) -> None:
        """Count `other`'s observations here too (same bounds): two workers' histograms as
        one server's."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        self.count += other.count


@dataclass(slots=True)
class Duration:
    """Triton's `{count, ns}` pair."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}

    def merge(self, other: Duration) -> None:
        self.count += other.count
        self.ns += other.ns


@dataclass(slots=True)
class BatchDurations:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)

    def merge(self, other: BatchDurations) -> None:
        self.compute_input.merge(other.compute_input)
        self.compute_infer.merge(other.compute_infer)
        self.compute_output.merge(other.compute_output)


@dataclass(slots=True)
class RequestWork:
    """What one request's items cost in the queue and the model, gathered batch by batch
    (`Scheduler`) and counted once when the request is answered (`ModelStats.record_work`).

    Triton counts queue and compute once per request: perf_analyzer and dashboards divide
    their time by the request count, and counted per item a request of 4 texts showed 4x
    its compute time. A request's items may run in several batches (the batcher groups
    texts by length; a long request runs in turns): its queue time is its longest-waiting
    item's, its compute time that of every batch that ran one of its items."""

    queue_s: float = 0.0
    input_s: float = 0.0
    infer_s: float = 0.0
    output_s: float = 0.0
    batches: int = 0
    last_batch: int = -1
    """The number of the last batch charged here (`charge`): each batch is charged once."""

    def charge(self, batch: int, wait_s: float, input_s: float, infer_s: float,
               output_s: float) -> None:
        """One of the request's items ran in batch number `batch` after waiting `wait_s`."""
        self.queue_s = max(self.queue_s, wait_s)
        if batch != self.last_batch:
            self.last_batch = batch
            self.batches += 1
            self.input_s += input_s
            self.infer_s += infer_s
            self.output_s += output_s


@dataclass(slots=True)
class ModelStats:
    """Cumulative since the model loaded. Times are seconds in, nanoseconds out (Triton)."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    """Requests answered wholly from the response cache (Triton's count)."""
    cache_miss: Duration = field(default_factory=Duration)
    """Requests the cache could not answer wholly: some of their texts ran."""
    cached_items: int = 0
    """Texts answered from the cache (the cache is per text: `/metrics` counts these)."""
    missed_items: int = 0
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    by_batch_size: dict[int, BatchDurations] = field(default_factory=dict)
    request_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    queue_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    compute_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_SIZE_BUCKETS))
    tokenize_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    """Time to tokenize one request's texts (those the cache did not answer), on the loop or
    on a worker thread: the part of a request's time spent before it is queued."""

    def record_request(self, outcome: str, seconds: float) -> None:
        """One client request ended, well or badly; `outcome` labels the counter."""
        self.outcomes[outcome] += 1
        if outcome == "success":
            self.success.add(seconds)
            self.request_latency.observe(seconds)
        else:
            self.fail.add(seconds)

    def record_batch(self, size: int, input_s: float, infer_s: float,
                     output_s: float) -> None:
        """A batch of `size` items ran (its requests' share: `RequestWork`)."""
        self.execution_count += 1
        self.inference_count += size
        self.last_inference_ms = int(time.time() * 1000)
        self.batch_size.observe(size)
        self.compute_latency.observe(input_s + infer_s + output_s)
        per_size = self.by_batch_size.setdefault(size, BatchDurations())
        per_size.compute_input.add(input_s)
        per_size.compute_infer.add(infer_s)
        per_size.compute_output.add(output_s)

    def record_work(self, work: RequestWork) -> None:
        """A request was answered: its queue time, and its compute time unless the cache
        answered it wholly (no batch), counted once, as Triton counts them (queue: every
        successful request, cache hits included; compute: those that ran)."""
        self.queue.add(work.queue_s)
        self.queue_latency.observe(work.queue_s)
        if work.batches:
            self.compute_input.add(work.input_s)
            self.compute_infer.add(work.infer_s)
            self.compute_output.add(work.output_s)

    def record_ensemble(self, size: int, seconds: float) -> None:
        """An ensemble request of `size` queries was answered in `seconds`: as Triton counts
        one, an execution of that batch size, its steps' time its compute (the steps queue,
        and are counted, on their own models)."""
        self.record_batch(size, 0.0, seconds, 0.0)
        self.record_work(RequestWork(infer_s=seconds, batches=1))

    def record_tokenize(self, elapsed_ns: int) -> None:
        """One request's texts were tokenized in `elapsed_ns` (a `perf_counter_ns` pair). Called
        on the event loop, also for texts tokenized on a worker thread, so no lock is needed."""
        self.tokenize_latency.observe(elapsed_ns / 1e9)

    def merge(self, other: ModelStats) -> None:
        """Count `other`'s work here too: the whole server's figures are the sum of its
        workers', each kept by one worker's event loop."""
        for mine, theirs in ((self.success, other.success), (self.fail, other.fail),
                             (self.queue, other.queue),
                             (self.compute_input, other.compute_input),
                             (self.compute_infer, other.compute_infer),
                             (self.compute_output, other.compute_output),
                             (self.cache_hit, other.cache_hit),
                             (self.cache_miss, other.cache_miss)):
            mine.merge(theirs)
        self.cached_items += other.cached_items
        self.missed_items += other.missed_items
        self.inference_count += other.inference_count
        self.execution_count += other.execution_count
        self.last_inference_ms = max(self.last_inference_ms, other.last_inference_ms)
        self.outcomes.update(other.outcomes)
        for size, durations in other.by_batch_size.items():
            self.by_batch_size.setdefault(size, BatchDurations()).merge(durations)
        for histogram, more in ((self.request_latency, other.request_latency),
                                (self.queue_latency, other.queue_latency),
                                (self.compute_latency, other.compute_latency),
                                (self.batch_size, other.batch_size),
                                (self.tokenize_latency, other.tokenize_latency)):
            histogram.merge(more)

    def as_triton_json(self, name: str, version: str) -> dict[str, object]:
        """The model's entry of Triton's statistics extension (`model_stats[i]`)."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": self.cache_hit.as_json(),
                "cache_miss": self.cache_miss.as_json(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": d.compute_input.as_json(),
                    "compute_infer": d.compute_infer.as_json(),
                    "compute_output": d.compute_output.as_json(),
                }
                for size, d in sorted(self.by_batch_size.items())
            ],
        }


@contextmanager
def request_recorded(stats: ModelStats) -> Iterator[None]:
    """Count one request of a model under its outcome and time it, whatever happens inside:
    a client's request, or a step of the search pipeline (as Triton counts an ensemble's
    steps on their own models)."""
    started = time.perf_counter()
    outcome = "success"
    try:
        yield
    except QueryServeError as exc:
        outcome = exc.outcome
        raise
    except asyncio.CancelledError:
        outcome = "cancelled"  # the client went away
        raise
    except Exception:
        outcome = "failed"  # a 500: counted as a success, it vanished from error rates
        raise
    finally:
        stats.record_request(outcome, time.perf_counter() - started)
