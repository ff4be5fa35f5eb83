"""Response cache: an LRU of output rows keyed by one input item (per model).

Search traffic repeats itself (popular queries), so a hit skips tokenizer, queue and model.
Keyed by the item's text as the model reads it (cut at `max_sequence_length`), a pair by the
tuple of its texts: each model has its own cache, so the model is part of the key. Bounded in
entries and in bytes, each entry's size told by the cache's owner.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int = 1 << 62,
                 size: Callable[[K, V], int] = lambda key, value: 0) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._size = size
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V) -> None:
        size = self._size(key, value)
        if size > self.max_bytes:
            return  # it would empty the cache for itself
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._entries[key] = value, size
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self.bytes -= self._entries.popitem(last=False)[1][1]
