"""The dynamic batcher: a bounded queue and the rule that cuts batches from it.

Pure logic with the time passed in, so it is tested with a fake clock and no sleeps. The
scheduler calls `cut(now)` whenever an instance is free; the answer is a batch to run now, the
items that timed out, and when to ask again.

How a batch is cut (Triton's dynamic batcher, plus TEI/Infinity's token budget):
- Look at a window of the oldest live items, sort it by token count and split it into batches
  that respect `max_batch_size` and `max_batch_tokens` (items x longest item, so padding
  counts). Short queries end up together and are not padded to a long one.
- Where to split is a small dynamic programme over the sorted window: as few batches as the
  limits allow or, with `batch_overhead_tokens` set, the least cost, counting each batch's
  padded tokens plus that overhead. On one thread the int8 MiniLM ran a batch of 8 random
  MASSIVE queries padded to its longest no faster per query than 8 runs of one; cut this way,
  the same queries ran 1.45x faster (benchmarks/batch_partition.py, BENCHMARKS.md).
- The batch holding the oldest item goes next, so no item is starved by the sort.
- It runs at once if it is full (size or token budget reached), if a preferred size can be
  formed, or when the oldest item has waited `max_queue_delay_microseconds`; otherwise the
  batcher asks to be woken at that moment.
Items whose client has gone (their ticket is done: cancelled) are dropped here, before the model
ever sees them; items past their deadline are returned as expired, by the cut or, while every
instance is busy, by `due(now)` at their deadline.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from queryserve.config import DynamicBatching
from queryserve.errors import Overloaded
from queryserve.scheduling.stats import RequestWork

P = TypeVar("P")

WINDOW_BATCHES = 4
"""The sort window is this many full batches: enough to group lengths, cheap to sort."""


class Ticket(Protocol):
    """What the batcher needs of an item's result slot: asyncio.Future satisfies it."""

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...


@dataclass(eq=False, slots=True)
class QueuedItem(Generic[P]):
    payload: P
    tokens: int
    enqueued_at: float
    deadline: float
    ticket: Ticket
    request: Sequence[Ticket] = ()
    """The tickets of every item of the same request (turn), this one's included: when one
    fails, the others are not worth running."""
    work: RequestWork | None = None
    """Where its request's queue and compute time gather (None: nobody counts them)."""


@dataclass(frozen=True, slots=True)
class Cut(Generic[P]):
    batch: list[QueuedItem[P]] = field(default_factory=list)
    expired: list[QueuedItem[P]] = field(default_factory=list)
    wake_at: float | None = None
    """When nothing runs now but items wait: the time at which to cut again."""


class DynamicBatcher(Generic[P]):
    def __init__(self, config: DynamicBatching, max_batch_size: int, model: str = "") -> None:
        self.config = config
        self.max_batch_size = max_batch_size
        self.model = model
        self._delay_s = config.max_queue_delay_microseconds / 1e6
        self._queue: deque[QueuedItem[P]] = deque()
        # The queued items that have a deadline, earliest first (a heap), so they are answered
        # at it: a cut finds them only when an instance frees up, and a search's 50 ms budget
        # was answered at 273 ms behind busy instances. An entry is stale once its item is
        # answered or cut into a batch; stale entries leave as they reach the top.
        self._deadlines: list[tuple[float, int, QueuedItem[P]]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._queue)

    def waiting(self) -> int:
        """Items whose clients still wait (a scrape's queue depth): those that left stay
        queued until an instance frees up, and counted, a gauge showed a full queue that
        nobody waited on."""
        return sum(not item.ticket.done() for item in self._queue)

    def add(self, items: list[QueuedItem[P]], admitted: bool = False) -> None:
        """Queue one request's items, or reject them all when they do not fit (admission
        control). An empty queue takes a turn of any size, so a large one is never starved;
        a later turn of a request already admitted (`admitted`) is never refused.
        """
        limit = self.config.max_queue_size
        if limit and not admitted and self._queue and len(self._queue) + len(items) > limit:
            # Items whose clients left are dropped only when an instance frees up: counted,
            # they turned live requests away while nobody waited (a retry storm's shape).
            self._queue = deque(item for item in self._queue if not item.ticket.done())
        if limit and not admitted and self._queue and len(self._queue) + len(items) > limit:
            raise Overloaded(f"model '{self.model}' is overloaded: its queue holds "
                             f"{len(self._queue)} of at most {limit} items; retry later")
        self._queue.extend(items)
        for item in items:
            if item.deadline != math.inf:
                heapq.heappush(self._deadlines, (item.deadline, next(self._order), item))

    def due(self, now: float) -> tuple[Sequence[QueuedItem[P]], float | None]:
        """The queued items past their deadline (left queued: the scheduler fails them, and a
        cut drops them), and the next deadline of one still queued, to be woken at."""
        heap = self._deadlines
        if not heap:  # no timeouts: the common case, on every schedule
            return (), None
        expired: list[QueuedItem[P]] = []
        while heap:
            deadline, _, item = heap[0]
            if item.ticket.done() or item.deadline != deadline:
                heapq.heappop(heap)  # answered, gone, or cut into a batch: stale
            elif deadline <= now:
                expired.append(heapq.heappop(heap)[2])
            else:
                return expired, deadline
        return expired, None

    def drain(self) -> list[QueuedItem[P]]:
        """Empty the queue, returning what waited (on unload)."""
        items = list(self._queue)
        self._queue.clear()
        return items

    def cut(self, now: float) -> Cut[P]:
        window, expired = self._take_window(now)
        if not window:
            return Cut(expired=expired)
        oldest = window[0]
        batch, full = self._batch_with(oldest, window)
        if not full:
            preferred = [p for p in self.config.preferred_batch_size if p <= len(batch)]
            if preferred:
                batch, full = _oldest_first(batch)[: preferred[-1]], True
        if full or now >= oldest.enqueued_at + self._delay_s:
            for item in batch:
                item.deadline = math.inf  # it runs now: it cannot time out in the queue
            chosen = {id(item) for item in batch}
            self._queue.extendleft(reversed([i for i in window if id(i) not in chosen]))
            return Cut(batch=batch, expired=expired)
        self._queue.extendleft(reversed(window))
        wake_at = min(oldest.enqueued_at + self._delay_s, min(i.deadline for i in window))
        return Cut(expired=expired, wake_at=wake_at)

    def _take_window(self, now: float) -> tuple[list[QueuedItem[P]], list[QueuedItem[P]]]:
        """Pop up to a window of live items, in arrival order; drop gone and expired ones."""
        size = self.max_batch_size * WINDOW_BATCHES
        window: list[QueuedItem[P]] = []
        expired: list[QueuedItem[P]] = []
        while self._queue and len(window) < size:
            item = self._queue.popleft()
            if item.ticket.done():
                continue  # the client left (or was answered): never run it
            if now >= item.deadline:
                expired.append(item)
            else:
                window.append(item)
        return window, expired

    def _batch_with(
        self, oldest: QueuedItem[P], window: list[QueuedItem[P]]
    ) -> tuple[list[QueuedItem[P]], bool]:
        """Partition the length-sorted window into batches; return the one holding `oldest`.

        The second value says whether that batch is full: it could not take its next item.
        """
        if len(window) == 1:  # one query at a time, the light-load case: nothing to partition
            return window, bool(self._queue)
        batches = self._partition(sorted(window, key=lambda item: item.tokens))
        for k, batch in enumerate(batches):
            if any(item is oldest for item in batch):
                return batch, k < len(batches) - 1 or bool(self._queue)
        raise AssertionError("the oldest item is in the window")

    def _partition(self, ordered: list[QueuedItem[P]]) -> list[list[QueuedItem[P]]]:
        """Cut items sorted by length into consecutive batches within the size and token
        limits, of least total cost: each batch's padded tokens (items x longest) plus the
        overhead of one more batch."""
        # Items of one length go together as far as the limits allow: moving such an item to
        # the shorter batch never adds padding. So the programme runs over these groups.
        groups: list[list[QueuedItem[P]]] = []
        for item in ordered:
            if groups and groups[-1][0].tokens == item.tokens \
                    and len(groups[-1]) < self._most_items(item.tokens):
                groups[-1].append(item)
            else:
                groups.append([item])
        overhead = self.config.batch_overhead_tokens
        # None: fewest batches first. No window pads to this many tokens, so one batch fewer
        # always outweighs any padding it costs.
        per_batch = float(overhead) if overhead is not None else 1e12
        cost, starts = [0.0], [0]  # over groups[:end]: least cost, where its last batch starts
        for end in range(1, len(groups) + 1):
            longest = groups[end - 1][0].tokens
            most = self._most_items(longest)
            best, best_start, size = math.inf, end - 1, 0
            for first in range(end - 1, -1, -1):
                size += len(groups[first])
                if size > most:
                    break
                total = cost[first] + per_batch + size * longest
                if total < best:
                    best, best_start = total, first
            cost.append(best)
            starts.append(best_start)
        batches: list[list[QueuedItem[P]]] = []
        end = len(groups)
        while end:
            first = starts[end]
            batches.append([item for group in groups[first:end] for item in group])
            end = first
        return batches[::-1]

    def _most_items(self, tokens: int) -> int:
        """Most items of up to `tokens` tokens one batch may hold (at least one)."""
        return min(self.max_batch_size, max(1, self.config.max_batch_tokens // max(tokens, 1)))


def _oldest_first(batch: list[QueuedItem[P]]) -> list[QueuedItem[P]]:
    return sorted(batch, key=lambda item: item.enqueued_at)
