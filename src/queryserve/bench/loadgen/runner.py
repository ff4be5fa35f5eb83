"""One run from start to drain, the same for both loops: the collector off, CPU and wall time
clocked, then whatever is still in flight counted as timed out; and `run_sync`, which runs a
coroutine on uvloop.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

import uvloop

T = TypeVar("T")


class _Running(Protocol):
    drained: asyncio.Future[None]

    def start(self, warmup_s: float, duration_s: float) -> None: ...
    def unfinished(self) -> int: ...
    def close_all(self) -> None: ...


async def _drive(
    run: _Running, warmup_s: float, duration_s: float, drain_s: float
) -> tuple[float, int, float]:
    """Run to the end of the schedule plus the drain; returns (CPU s, timeouts, wall s)."""
    # A GC pause in the generator would be charged to the server: collect now,
    # freeze survivors and keep the collector off for the (bounded) run.
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    try:
        run.start(warmup_s, duration_s)
        await asyncio.wait_for(asyncio.shield(run.drained), warmup_s + duration_s + drain_s)
    except TimeoutError:
        pass
    finally:
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        if gc_was_enabled:
            gc.enable()
        gc.unfreeze()
        timeouts = run.unfinished()
        run.close_all()
    return cpu, timeouts, wall


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh uvloop event loop."""
    result: T = uvloop.run(coro)
    return result
