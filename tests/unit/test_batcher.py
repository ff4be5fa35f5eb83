"""The dynamic batcher's cutting rule, with a fake clock (times are plain numbers) and no sleeps."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from queryserve.config import DynamicBatching
from queryserve.errors import Overloaded
from queryserve.scheduling.batcher import DynamicBatcher, QueuedItem


@dataclass
class FakeTicket:
    cancelled: bool = False

    def done(self) -> bool:
        return self.cancelled

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def item(name: str, tokens: int = 5, at: float = 0.0, deadline: float = math.inf,
         ticket: FakeTicket | None = None) -> QueuedItem[str]:
    return QueuedItem(name, tokens, at, deadline, ticket or FakeTicket())


def batcher(max_batch_size: int = 4, **config: int | tuple[int, ...]) -> DynamicBatcher[str]:
    return DynamicBatcher(DynamicBatching(**config), max_batch_size, "m")  # type: ignore[arg-type]


def names(items: list[QueuedItem[str]]) -> list[str]:
    return sorted(i.payload for i in items)


def test_empty_queue_cuts_nothing() -> None:
    cut = batcher().cut(now=0.0)
    assert cut.batch == [] and cut.wake_at is None


def test_zero_delay_runs_whatever_is_queued_at_once() -> None:
    b = batcher()
    b.add([item("a")])
    assert names(b.cut(now=0.0).batch) == ["a"]
    assert len(b) == 0


def test_partial_batch_waits_for_the_delay_then_runs() -> None:
    b = batcher(max_queue_delay_microseconds=2000)
    b.add([item("a", at=1.0)])
    waiting = b.cut(now=1.0005)
    assert waiting.batch == [] and waiting.wake_at == pytest.approx(1.002)
    b.add([item("b", at=1.001)])
    assert names(b.cut(now=1.002).batch) == ["a", "b"]


def test_full_batch_runs_without_waiting_and_leaves_the_rest_queued() -> None:
    b = batcher(max_batch_size=3, max_queue_delay_microseconds=10_000)
    b.add([item(str(i), at=0.0) for i in range(5)])
    first = b.cut(now=0.0)
    assert len(first.batch) == 3 and len(b) == 2
    assert b.cut(now=0.0).batch == []  # the last two wait for the delay


def test_preferred_size_is_cut_as_soon_as_it_can_be_formed() -> None:
    b = batcher(max_batch_size=8, max_queue_delay_microseconds=10_000, preferred_batch_size=(2,))
    b.add([item("a", at=0.0)])
    assert b.cut(now=0.0).batch == []
    b.add([item("b", at=0.1), item("c", at=0.2)])
    assert names(b.cut(now=0.2).batch) == ["a", "b"]  # the two oldest
    assert len(b) == 1


def test_token_budget_counts_padding_and_keeps_long_items_apart() -> None:
    # budget 40: four 5-token queries fit (4 x 5); one 30-token item padded with them would not.
    b = batcher(max_batch_size=8, max_batch_tokens=40)
    b.add([item("s1", 5), item("long", 30), item("s2", 5), item("s3", 5)])
    first = b.cut(now=0.0)
    assert names(first.batch) == ["s1", "s2", "s3"]
    assert names(b.cut(now=0.0).batch) == ["long"]


def test_batch_overhead_splits_off_a_long_item_the_token_budget_would_let_in() -> None:
    # 3 x 5 tokens + 1 x 30: padded together 4 x 30 = 120 tokens, apart 15 + 30 plus one
    # more batch's overhead of 4: apart is cheaper, although 120 fits the budget.
    mixed = [item("s1", 5), item("long", 30, at=0.1), item("s2", 5), item("s3", 5)]
    fewest = batcher(max_batch_size=8, max_queue_delay_microseconds=10_000)
    fewest.add(list(mixed))
    assert names(fewest.cut(now=0.2).batch) == ["long", "s1", "s2", "s3"]
    cheapest = batcher(max_batch_size=8, max_queue_delay_microseconds=10_000,
                       batch_overhead_tokens=4)
    cheapest.add([item(i.payload, i.tokens, i.enqueued_at) for i in mixed])
    first = cheapest.cut(now=0.0)  # the oldest item's batch runs at once: more waits behind
    assert names(first.batch) == ["s1", "s2", "s3"]
    assert cheapest.cut(now=0.0).batch == []  # the long one alone waits for the delay
    assert names(cheapest.cut(now=0.2).batch) == ["long"]


def test_batch_overhead_keeps_near_lengths_together() -> None:
    # 5, 5, 6 tokens: together 3 x 6 = 18 (+ 4), apart 10 + 6 (+ 2 x 4): together is cheaper.
    b = batcher(max_batch_size=8, batch_overhead_tokens=4)
    b.add([item("a", 5), item("b", 5), item("c", 6)])
    assert names(b.cut(now=0.0).batch) == ["a", "b", "c"]


def test_batch_overhead_partition_respects_the_size_and_token_limits() -> None:
    b = batcher(max_batch_size=3, max_batch_tokens=20, batch_overhead_tokens=100)
    b.add([item(f"s{i}", 4) for i in range(5)] + [item("m", 9)])
    sizes = []
    while len(b):
        batch = b.cut(now=0.0).batch
        assert len(batch) <= 3 and len(batch) * max(i.tokens for i in batch) <= 20
        sizes.append(len(batch))
    assert sorted(sizes) == [1, 2, 3]  # fewest batches the limits allow: 4-token x 3, x 2, m


def test_length_sorting_never_starves_the_oldest_item() -> None:
    b = batcher(max_batch_size=2)
    b.add([item("old-long", 50, at=0.0)] + [item(f"s{i}", 4, at=0.1) for i in range(6)])
    assert "old-long" in names(b.cut(now=0.2).batch)


def test_item_longer_than_the_budget_still_runs_alone() -> None:
    b = batcher(max_batch_tokens=10)
    b.add([item("huge", 500)])
    assert names(b.cut(now=0.0).batch) == ["huge"]


def test_items_whose_client_left_are_dropped_before_the_model() -> None:
    b = batcher()
    gone = FakeTicket()
    b.add([item("gone", ticket=gone), item("kept")])
    gone.cancelled = True
    cut = b.cut(now=0.0)
    assert names(cut.batch) == ["kept"] and cut.expired == []


def test_items_past_their_deadline_expire_instead_of_running() -> None:
    b = batcher(max_queue_delay_microseconds=1_000_000)
    b.add([item("late", at=0.0, deadline=0.5), item("fine", at=0.0, deadline=9.0)])
    early = b.cut(now=0.1)
    assert early.batch == [] and early.wake_at == pytest.approx(0.5)
    cut = b.cut(now=0.6)
    assert names(cut.expired) == ["late"]
    assert len(b) == 1


def test_items_are_due_at_their_deadline_until_a_batch_takes_them() -> None:
    b = batcher(max_queue_delay_microseconds=0)
    b.add([item("runs", deadline=0.5), item("later", deadline=2.0), item("never")])
    b.add([item("soon", deadline=1.0)])
    assert b.due(now=0.1) == ([], 0.5)
    b.cut(now=0.1)  # one batch of all four: none of them can time out in the queue now
    expired, wake = b.due(now=5.0)
    assert not expired and wake is None
    left = FakeTicket()
    b.add([item("a", deadline=3.0), item("b", deadline=3.5),
           item("gone", deadline=2.5, ticket=left), item("c", deadline=4.0)])
    left.cancelled = True
    expired, wake = b.due(now=3.6)
    assert names(expired) == ["a", "b"] and wake == 4.0


def test_full_queue_rejects_a_whole_request() -> None:
    b = batcher(max_queue_size=3)
    b.add([item("a"), item("b")])
    with pytest.raises(Overloaded, match="queue holds 2 of at most 3"):
        b.add([item("c"), item("d")])
    assert len(b) == 2  # nothing of the rejected request was queued
    b.add([item("c")])
    assert len(b) == 3


def test_items_whose_clients_left_take_no_place_in_the_queue() -> None:
    """Regression: two abandoned items filled a queue of 2 until an instance freed up, and a
    live request meanwhile got 503 "its queue holds 2 of at most 2"."""
    b = batcher(max_queue_size=2)
    gone = [item("gone-1"), item("gone-2")]
    b.add(gone)
    for abandoned in gone:
        abandoned.ticket.cancel()
    assert (len(b), b.waiting()) == (2, 0)  # the depth a scrape reads: nobody waits
    b.add([item("live")])
    assert names(b.cut(0.0).batch) == ["live"]


def test_empty_queue_admits_a_request_larger_than_the_limit() -> None:
    b = batcher(max_queue_size=2)
    b.add([item(str(i)) for i in range(5)])
    assert len(b) == 5


def test_drain_returns_everything_queued() -> None:
    b = batcher()
    b.add([item("a"), item("b")])
    assert names(b.drain()) == ["a", "b"] and len(b) == 0
