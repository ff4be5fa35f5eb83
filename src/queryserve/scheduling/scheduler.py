"""The scheduler: one owner of a model's queue, driving its instances.

The step is schedule -> execute -> update. Scheduling runs on the event loop whenever something
changes (an item arrives, an instance frees up, a batching delay expires): no task of its own,
no polling. Executing runs the pipeline's three stages (collate -> backend -> split) on a free
instance's own thread, so the loop keeps accepting requests while the runtime (which releases
the GIL) computes; a model whose batches cost less than that hand-off itself runs them on the
loop instead (`INLINE_BELOW_S`). Updating resolves the batch's futures back on the loop. A batch
that raises, or whose stages return the wrong number of rows, fails its own items and nothing
else.

Closing (an unload, a reload's retired model, shutdown) stops admission at once but runs what
is queued to the end; `closed` resolves when the last batch is done and the threads are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from queryserve.backends import Backend
from queryserve.config import DynamicBatching
from queryserve.errors import ModelFailed, RequestTimeout, Retired, Unavailable
from queryserve.scheduling.batcher import Cut, DynamicBatcher, QueuedItem
from queryserve.scheduling.stats import ModelStats, RequestWork
from queryserve.types import Array

log = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")
P_in = TypeVar("P_in", contravariant=True)
R_out = TypeVar("R_out", covariant=True)
Clock = Callable[[], float]


class Stages(Protocol[P_in, R_out]):
    """The pipeline's pre- and post-processing around the backend, run on instance threads."""

    def collate(self, payloads: Sequence[P_in]) -> dict[str, Array]: ...

    def split(self, outputs: dict[str, Array], payloads: Sequence[P_in]) -> Sequence[R_out]: ...


INLINE_BELOW_S = 100e-6
"""A batch expected to cost less than this runs on the event loop, not on its instance's thread.
Handing a batch to a thread and its result back (a queue put, a thread wake-up, the loop's
self-pipe) cost ~75 us of CPU per request on a 2-core AMD EPYC, about half of what the whole
application spent on a request of the `fake` model (BENCHMARKS, issue 40): for a model that
cheap the hand-off is the larger cost, and the loop is blocked for less time than it would have
spent on it. A real encoder costs milliseconds and always takes the thread."""

PEAK_DECAY = 0.9
"""The expected cost per item is the recent peak, decaying by this much per batch: one slow
batch sends the next ~20 to the thread, however cheap they turn out to be."""

Job = tuple[Callable[..., Any], tuple[Any, ...], Callable[[Any, BaseException | None], None]]


class InstanceThread:
    """The one thread that runs an instance's batches, in order.

    Not a one-thread `ThreadPoolExecutor`: each batch costs it a Future, two locks and a done
    callback, on the event loop's thread, for every request of a cheap model. Here a batch is
    one tuple put on a queue, and its outcome goes to `done` on this thread (which hands it to
    the loop)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        # Started with its first job: a pipeline whose construction fails after its scheduler
        # was made (a calibration.json that does not parse, a missing head.npz) left a thread
        # running for good on every failed load.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def submit(self, function: Callable[..., Any], args: tuple[Any, ...],
               done: Callable[[Any, BaseException | None], None]) -> None:
        self._jobs.put((function, args, done))
        if self._thread.ident is None:
            self._thread.start()

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run `function` on this thread and wait for it (warmup, before serving)."""
        finished = threading.Event()
        outcome: list[Any] = []

        def done(result: Any, error: BaseException | None) -> None:
            outcome.extend((result, error))
            finished.set()

        self.submit(function, args, done)
        finished.wait()
        result, error = outcome
        if error is not None:
            raise error
        return result

    def shutdown(self) -> None:
        """Stop, and wait for the thread to end (the scheduler calls this with no batch in
        flight, so at once): it must not outlive the server, or its last references to a
        backend die on a thread during interpreter exit, which aborted the process ("terminate
        called without an active exception") after a clean drain."""
        if self._thread.ident is not None:
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            function, args, done = job
            try:
                result, error = function(*args), None
            except BaseException as exc:  # the batch's failure, reported on the loop
                result, error = None, exc
            done(result, error)
            del job, function, args, done, result, error  # hold no batch while idle


@dataclass(frozen=True, slots=True)
class Instance:
    """A model instance: a backend session and the one thread that runs it."""

    index: int
    backend: Backend
    thread: InstanceThread


@dataclass(frozen=True, slots=True)
class BatchTimes:
    input_s: float
    infer_s: float
    output_s: float


class Scheduler(Generic[P, R]):
    def __init__(
        self,
        model: str,
        batching: DynamicBatching,
        max_batch_size: int,
        backends: Sequence[Backend],
        stages: Stages[P, R],
        stats: ModelStats,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.model = model
        self.stages = stages
        self.stats = stats
        self.clock = clock
        self.batcher: DynamicBatcher[P] = DynamicBatcher(batching, max_batch_size, model)
        self.default_timeout_s = batching.default_timeout_microseconds / 1e6
        self.instances = [
            Instance(i, backend, InstanceThread(f"{model}-{i}"))
            for i, backend in enumerate(backends)
        ]
        self._free = list(reversed(self.instances))
        self._item_cost_s = math.inf  # unknown until a batch has run: see `_dispatch`
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._closed: asyncio.Future[None] | None = None  # set by close(): no more admission
        self._in_turns = 0  # requests queued in turns that have not ended: see `turns`
        self._failures = 0  # batches that failed, since load
        self._batches = 0  # batches that succeeded: a number for each (`RequestWork.charge`)
        self._running: dict[int, list[QueuedItem[P]]] = {}  # by instance index: `abort`

    @property
    def queue_depth(self) -> int:
        """Items waiting for a batch, for the metrics (read per scrape, not per request)."""
        return self.batcher.waiting()

    @property
    def turn_items(self) -> int:
        """The most items one request may have queued at a time: a batch for every instance.
        A larger request is queued in turns (`admitted=True` after the first), so it never
        fills the queue and requests that arrive meanwhile run between its turns."""
        turn = self.batcher.max_batch_size * len(self.instances)
        limit = self.batcher.config.max_queue_size
        return min(turn, limit) if limit else turn

    def submit(self, payloads: Sequence[P], tokens: Sequence[int],
               timeout_s: float | None = None, admitted: bool = False,
               work: RequestWork | None = None) -> list[asyncio.Future[R]]:
        """Queue one request's items; their futures resolve to one output row each, and what
        they cost is charged to `work` as their batches succeed.

        Raises Overloaded when the queue is full: then none of the items is queued. A later
        turn of a request already admitted (`admitted`) is never refused half-way.
        """
        if self._closed is not None and not admitted:
            raise Retired(f"model '{self.model}' is unloading")
        loop = self._loop or self._bind_loop()
        now = self.clock()
        timeout_s = timeout_s if timeout_s is not None else self.default_timeout_s
        deadline = now + timeout_s if timeout_s > 0 else math.inf
        futures: list[asyncio.Future[R]] = [loop.create_future() for _ in payloads]
        self.batcher.add([
            QueuedItem(payload, count, now, deadline, future, futures, work)
            for payload, count, future in zip(payloads, tokens, futures, strict=True)
        ], admitted)
        self._schedule()
        return futures

    @contextlib.contextmanager
    def turns(self) -> Iterator[None]:
        """Around a request queued in turns: its later turns run here even once the model is
        closing (a reload or an unload admits no new request, but one it admitted finishes on
        it, as a single turn does), and `close` resolves only after its last turn."""
        self._in_turns += 1
        try:
            yield
        finally:
            self._in_turns -= 1
            if self._closed is not None:
                self._finish_if_idle()

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _schedule(self) -> None:
        """Cut and dispatch batches while an instance is free and a batch is ready; once
        closing, finish when nothing is left (the last items may also expire or be dropped)."""
        while self._free and len(self.batcher):
            cut: Cut[P] = self.batcher.cut(self.clock())
            self._expire(cut.expired)
            if not cut.batch:
                if cut.wake_at is not None:
                    self._wake_at(cut.wake_at)
                break
            self._dispatch(self._free.pop(), cut.batch)
        # What still waits is answered at its deadline, busy instances or not.
        expired, deadline = self.batcher.due(self.clock())
        self._expire(expired)
        if deadline is not None:
            self._wake_at(deadline)
        if self._closed is not None:
            self._finish_if_idle()

    def _wake_at(self, when: float) -> None:
        if self._timer is not None and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        delay = max(0.0, when - self.clock())
        self._timer_at = when
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self._schedule()

    def _expire(self, items: Sequence[QueuedItem[P]]) -> None:
        for item in items:
            if not item.ticket.done():
                _future(item).set_exception(RequestTimeout(
                    f"model '{self.model}': the request waited in the queue past its timeout"))

    def _dispatch(self, instance: Instance, batch: list[QueuedItem[P]]) -> None:
        started = self.clock()
        self._running[instance.index] = batch
        payloads = [item.payload for item in batch]
        loop = self._loop
        assert loop is not None
        if self._item_cost_s * len(batch) < INLINE_BELOW_S:
            try:
                result, error = self._execute(instance.backend, payloads), None
            except Exception as exc:  # the batch's failure, as from the thread
                result, error = None, exc
            # Completed on the next turn of the loop, as a thread's result would be: _schedule
            # may be on the stack, and the instance stays busy until then.
            loop.call_soon(self._complete, instance, batch, started, result, error)
            return

        def done(result: tuple[Sequence[R], BatchTimes] | None,
                 error: BaseException | None) -> None:  # on the instance's thread
            loop.call_soon_threadsafe(self._complete, instance, batch, started, result, error)

        instance.thread.submit(self._execute, (instance.backend, payloads), done)

    def _execute(self, backend: Backend, payloads: list[P]) -> tuple[Sequence[R], BatchTimes]:
        """Runs on the instance's thread."""
        t0 = time.perf_counter()
        inputs = self.stages.collate(payloads)
        t1 = time.perf_counter()
        outputs = backend.run(inputs)
        t2 = time.perf_counter()
        rows = self.stages.split(outputs, payloads)
        t3 = time.perf_counter()
        return rows, BatchTimes(t1 - t0, t2 - t1, t3 - t2)

    def _complete(self, instance: Instance, batch: list[QueuedItem[P]], started: float,
                  result: tuple[Sequence[R], BatchTimes] | None,
                  error: BaseException | None) -> None:
        """Back on the loop: resolve the batch's futures, free the instance, schedule more."""
        self._running.pop(instance.index, None)
        self._free.append(instance)
        try:
            if error is not None:
                raise error
            assert result is not None
            rows, times = result
            if len(rows) != len(batch):
                raise ModelFailed(f"the pipeline returned {len(rows)} rows for a batch of "
                                  f"{len(batch)}")
        except Exception:
            # Numbered, so the request ids the front ends log with this error's message find
            # the traceback (a batch holds many requests; this thread knows none of their ids).
            self._failures += 1
            log.exception("model '%s' instance %d failed a batch of %d (failure %d)",
                          self.model, instance.index, len(batch), self._failures)
            error = ModelFailed(f"model '{self.model}' failed to run a batch of {len(batch)} "
                                f"items; the server log has the details (failure "
                                f"{self._failures})")
            for item in batch:
                if not item.ticket.done():
                    _future(item).set_exception(error)
            # Those requests have failed: their items still queued must not run for nothing
            # (cancelled here, before the instance just freed picks the next batch).
            for item in batch:
                for sibling in item.request:
                    if not sibling.done():
                        sibling.cancel()
        else:
            for item, row in zip(batch, rows, strict=True):
                if not item.ticket.done():
                    _future(item).set_result(row)
            self._batches += 1
            for item in batch:
                if item.work is not None:
                    item.work.charge(self._batches, started - item.enqueued_at,
                                     times.input_s, times.infer_s, times.output_s)
            self.stats.record_batch(len(batch), times.input_s, times.infer_s, times.output_s)
            cost = (times.input_s + times.infer_s + times.output_s) / len(batch)
            self._item_cost_s = cost if self._item_cost_s == math.inf \
                else max(cost, self._item_cost_s * PEAK_DECAY)
        self._schedule()

    def run_now(self, payloads: Sequence[P]) -> None:
        """Run one batch on every instance, synchronously (warmup, before the model is ready)."""
        for instance in self.instances:
            instance.thread.call(self._execute, instance.backend, list(payloads))

    def close(self) -> asyncio.Future[None]:
        """Stop taking work and run what is queued to the end, on the loop. The future resolves
        once the last batch is done and the instances' threads and sessions are released."""
        if self._closed is None:
            self._closed = (self._loop or self._bind_loop()).create_future()
            self._finish_if_idle()
        return self._closed

    def _finish_if_idle(self) -> None:
        assert self._closed is not None
        if self._closed.done() or len(self.batcher) or self._in_turns \
                or len(self._free) < len(self.instances):
            return
        if self._timer is not None:
            self._timer.cancel()
        self.release()
        self._closed.set_result(None)

    def release(self) -> None:
        """End the instances' threads and drop their sessions, with nothing in flight: once
        closed, or at once for a model that failed its warmup (its threads outlived it)."""
        for instance in self.instances:
            instance.thread.shutdown()
        # Drop the sessions now rather than when the cyclic collector finds the retired
        # pipeline: a reload would otherwise hold two models' memory until a full collection.
        self.instances, self._free = [], []

    def abort(self) -> None:
        """Fail whatever still waits, and what the batches still running hold (shutdown past
        its drain deadline): each request is answered 503, to be sent again elsewhere, not
        left to a connection closed without an answer. A running batch's result, when it
        comes, finds its items answered."""
        error = Unavailable(f"model '{self.model}' stopped before answering the request (the "
                            "server is stopping); send it again")
        running = [item for batch in self._running.values() for item in batch]
        waiting = [item for item in [*self.batcher.drain(), *running] if not item.ticket.done()]
        for item in waiting:
            _future(item).set_exception(error)
        if waiting:
            log.warning("model '%s': %d item(s) still queued or running given up on, their "
                        "requests answered 503", self.model, len(waiting))
        if self._closed is not None:
            self._finish_if_idle()


def _future(item: QueuedItem[Any]) -> asyncio.Future[Any]:
    assert isinstance(item.ticket, asyncio.Future)
    return item.ticket

