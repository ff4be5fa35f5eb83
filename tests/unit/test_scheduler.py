"""The scheduler on the event loop with a fake backend: batches form, failures stay contained."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from queryserve.config import DynamicBatching
from queryserve.errors import ModelFailed, Overloaded, RequestTimeout, Unavailable
from queryserve.scheduling.scheduler import Scheduler
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array


class Doubler:
    """Stages: payloads are ints, the 'model' doubles them."""

    def collate(self, payloads: Sequence[int]) -> dict[str, Array]:
        return {"x": np.asarray(payloads)}

    def split(self, outputs: dict[str, Array], payloads: Sequence[int]) -> Sequence[int]:
        return [int(v) for v in outputs["y"]]


class GatedBackend:
    """Runs only when the test opens the gate, so a test controls what is queued meanwhile."""

    input_names = ("x",)

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.batches: list[list[int]] = []

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        self.gate.wait(timeout=5)
        batch = [int(v) for v in inputs["x"]]
        self.batches.append(batch)
        if 13 in batch:
            raise RuntimeError("unlucky batch")
        return {"y": inputs["x"] * 2}


def make(backend: GatedBackend, instances: int = 1, **batching: int) -> Scheduler[int, int]:
    config = DynamicBatching(**batching)  # type: ignore[arg-type]
    return Scheduler("m", config, 8, [backend] * instances, Doubler(), ModelStats())


async def test_requests_queued_while_the_instance_is_busy_run_as_one_batch() -> None:
    backend = GatedBackend()
    scheduler = make(backend)
    first = scheduler.submit([1], [3])
    rest = [scheduler.submit([v], [3])[0] for v in (2, 3, 4)]
    backend.gate.set()
    assert await first[0] == 2
    assert await asyncio.gather(*rest) == [4, 6, 8]
    assert backend.batches == [[1], [2, 3, 4]]
    assert scheduler.stats.execution_count == 2 and scheduler.stats.inference_count == 4


async def test_a_failing_batch_fails_only_its_own_requests() -> None:
    backend = GatedBackend()
    scheduler = make(backend)
    busy = scheduler.submit([1], [3])
    doomed = scheduler.submit([13, 5], [3, 3])  # one batch: [13, 5]
    backend.gate.set()
    assert await busy[0] == 2
    with pytest.raises(ModelFailed, match="failed to run a batch of 2"):
        await doomed[0]
    with pytest.raises(ModelFailed):
        await doomed[1]
    after = scheduler.submit([6], [3])
    assert await after[0] == 12  # the instance keeps serving


async def test_a_cancelled_request_never_reaches_the_model() -> None:
    backend = GatedBackend()
    scheduler = make(backend)
    busy = scheduler.submit([1], [3])
    gone = scheduler.submit([7], [3])
    kept = scheduler.submit([8], [3])
    gone[0].cancel()  # what a dropped connection does
    backend.gate.set()
    await busy[0]
    assert await kept[0] == 16
    assert [7] not in backend.batches and all(7 not in b for b in backend.batches)


async def test_queue_full_rejects_and_queue_timeout_expires() -> None:
    backend = GatedBackend()
    scheduler = make(backend, max_queue_size=2)
    busy = scheduler.submit([1], [3])  # running: not in the queue
    waiting = scheduler.submit([2, 3], [3, 3], timeout_s=0.05)
    with pytest.raises(Overloaded):
        scheduler.submit([4], [3])
    for future in waiting:
        with pytest.raises(RequestTimeout):
            await future
    later = scheduler.submit([4], [3])  # the expired items hold no place in the queue
    backend.gate.set()
    assert [await busy[0], await later[0]] == [2, 8]
    assert backend.batches == [[1], [4]]


async def test_a_queued_request_times_out_at_its_deadline_while_the_instances_are_busy() -> None:
    backend = GatedBackend()
    scheduler = make(backend)
    busy = scheduler.submit([1], [3])  # holds the only instance until the gate opens
    waiting = scheduler.submit([2], [3], timeout_s=0.05)
    kept = scheduler.submit([3], [3])
    start = time.perf_counter()
    with pytest.raises(RequestTimeout):
        await asyncio.wait_for(waiting[0], timeout=1)
    # Answered at its deadline, not when the instance freed up (it has not).
    assert time.perf_counter() - start < 0.5 and not backend.gate.is_set()
    assert scheduler.queue_depth == 1
    backend.gate.set()
    assert [await busy[0], await kept[0]] == [2, 6]
    assert backend.batches == [[1], [3]]


async def test_instances_run_batches_concurrently() -> None:
    backend = GatedBackend()
    scheduler = make(backend, instances=2)
    a = scheduler.submit([1], [3])
    b = scheduler.submit([2], [3])
    await asyncio.sleep(0)
    assert scheduler.queue_depth == 0  # both dispatched, one per instance
    backend.gate.set()
    assert [await a[0], await b[0]] == [2, 4]


async def test_close_runs_what_is_queued_then_releases_the_instances() -> None:
    backend = GatedBackend()
    scheduler = make(backend, instances=2)
    busy = scheduler.submit([1], [3]) + scheduler.submit([2], [3])
    waiting = scheduler.submit([3, 4], [3, 3])
    closed = scheduler.close()
    with pytest.raises(Unavailable, match="unloading"):
        scheduler.submit([5], [3])  # no new work once closing
    assert not closed.done()
    backend.gate.set()
    assert await asyncio.gather(*busy, *waiting) == [2, 4, 6, 8]  # queued work still ran
    await asyncio.wait_for(closed, 5)
    assert scheduler.instances == []  # sessions released at once, not at the next collection


async def test_abort_fails_what_waits_when_the_drain_runs_out() -> None:
    backend = GatedBackend()
    scheduler = make(backend)
    busy = scheduler.submit([1], [3])
    waiting = scheduler.submit([2], [3])
    closed = scheduler.close()
    scheduler.abort()
    # The running batch's request too: answered 503 now, not left for its connection to be
    # closed without an answer; the batch's result, when it comes, finds it answered.
    for future in (waiting[0], busy[0]):
        with pytest.raises(Unavailable, match="stopped before answering the request"):
            await future
    backend.gate.set()
    await asyncio.wait_for(closed, 5)


class Miscounting(Doubler):
    """A pipeline bug: `split` drops a row whenever a batch holds 99."""

    def split(self, outputs: dict[str, Array], payloads: Sequence[int]) -> Sequence[int]:
        rows = list(super().split(outputs, payloads))
        return rows[:-1] if 99 in payloads else rows


async def test_a_batch_with_the_wrong_number_of_rows_fails_only_itself(
        caplog: pytest.LogCaptureFixture) -> None:
    """Regression: the row count was checked outside the error handling, so such a batch left
    its requests waiting for ever."""
    backend = GatedBackend()
    scheduler = Scheduler("m", DynamicBatching(), 8, [backend], Miscounting(), ModelStats())
    busy = scheduler.submit([1], [3])
    wrong = scheduler.submit([99, 5], [3, 3])
    backend.gate.set()
    assert await busy[0] == 2
    for future in wrong:
        with pytest.raises(ModelFailed, match="failed to run a batch of 2"):
            await asyncio.wait_for(future, 5)
    assert "returned 1 rows for a batch of 2" in caplog.text
    assert await scheduler.submit([6], [3])[0] == 12  # the model keeps serving


async def test_a_later_turn_of_an_admitted_request_is_never_refused() -> None:
    backend = GatedBackend()
    scheduler = make(backend, max_queue_size=2)
    assert scheduler.turn_items == 2  # one batch of 8 per instance, capped by the queue
    busy = scheduler.submit([1], [3])
    first = scheduler.submit([2, 3], [3, 3])
    with pytest.raises(Overloaded):
        scheduler.submit([4], [3])  # another request: the queue is full
    later = scheduler.submit([5, 6], [3, 3], admitted=True)  # the same request's next turn
    backend.gate.set()
    assert await asyncio.gather(*busy, *first, *later) == [2, 4, 6, 10, 12]


async def test_a_request_in_turns_finishes_on_a_closing_model() -> None:
    """Regression: a reload closed the old model between two turns of a request it had
    admitted, and the next turn got 503 "is unloading" (5 of 8 requests of 100-200 texts)."""
    backend = GatedBackend()
    scheduler = make(backend)
    with scheduler.turns():
        first = scheduler.submit([1], [3])
        closed = scheduler.close()  # the reload comes between turns
        backend.gate.set()
        assert await first[0] == 2
        await asyncio.sleep(0.01)
        assert not closed.done()  # the request's next turn is still to come
        assert await scheduler.submit([2], [3], admitted=True)[0] == 4
        with pytest.raises(Unavailable, match="unloading"):
            scheduler.submit([3], [3])  # a new request is not admitted
    await asyncio.wait_for(closed, 5)


async def test_close_finishes_when_the_last_queued_item_is_dropped_by_the_timer() -> None:
    """Regression: closing finished only after a batch completed, so a queue emptied by the
    batching-delay timer (its items' clients gone) left the close waiting for ever."""
    backend = GatedBackend()
    scheduler = make(backend, max_queue_delay_microseconds=50_000)
    waiting = scheduler.submit([1], [3])  # a free instance waits 50 ms for a fuller batch
    closed = scheduler.close()
    waiting[0].cancel()  # the client leaves before the delay is up
    await asyncio.wait_for(closed, 1)
    assert backend.batches == []


class Timed:
    """A backend that notes whether each batch ran on its instance's thread (named after the
    model) or on the loop's; it sleeps `delay_s` per batch and fails any batch holding 13."""

    input_names = ("x",)

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.on_thread: list[bool] = []

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        time.sleep(self.delay_s)
        self.on_thread.append(threading.current_thread().name.startswith("m-"))
        if 13 in inputs["x"]:
            raise RuntimeError("unlucky batch")
        return {"y": inputs["x"] * 2}


async def test_batches_cheaper_than_the_hand_off_run_on_the_loop_and_slow_ones_leave_it() -> None:
    backend = Timed()
    scheduler = Scheduler("m", DynamicBatching(), 8, [backend], Doubler(), ModelStats())
    # The first batch's cost is unknown, then its peak decays (a busy machine makes some
    # batches slow: it may take many before ~20 in a row are cheap).
    for value in range(100, 3000):
        assert await scheduler.submit([value], [3])[0] == 2 * value
        if not backend.on_thread[-1]:
            break
    assert backend.on_thread[0] and not backend.on_thread[-1]
    backend.delay_s = 0.002  # the model turns slow: at most one batch on the loop, then threads
    ran = len(backend.on_thread)
    for value in (4, 5, 6, 7):
        assert await scheduler.submit([value], [3])[0] == 2 * value
    slow = backend.on_thread[ran:]
    assert slow[-3:] == [True, True, True] and slow.count(False) <= 1


async def test_a_batch_failing_on_the_loop_fails_only_itself() -> None:
    backend = Timed()
    scheduler = Scheduler("m", DynamicBatching(), 8, [backend], Doubler(), ModelStats())
    scheduler._item_cost_s = 0.0  # known to be cheap (as after some batches): on the loop
    with pytest.raises(ModelFailed, match="failed to run a batch of 1"):
        await scheduler.submit([13], [3])[0]
    assert backend.on_thread == [False]
    assert await scheduler.submit([6], [3])[0] == 12  # the model keeps serving
