"""What every text pipeline shares: texts in, one output row per text, through the scheduler,
with the response cache in front.

A pipeline says how to encode texts into payloads (on the event loop, because the batcher needs
each item's token count), how to collate payloads into the backend's inputs and split its
outputs into rows (on an instance's thread), and how to stack rows into the response's array.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from tokenizers import Tokenizer

from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.errors import ConfigError, InvalidInput
from queryserve.scheduling.cache import LruCache
from queryserve.scheduling.scheduler import Scheduler
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array

P = TypeVar("P")  # one item's payload, as queued
R = TypeVar("R")  # one item's output row


def open_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """A `tokenizers` tokenizer as the server uses it: truncation on, padding off (batches
    are padded to their own longest item)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.no_padding()
    return tokenizer


def load_tokenizer(config: ModelConfig) -> Tokenizer:
    path: Path = config.path / config.parameter("tokenizer_file", "tokenizer.json")
    if not path.is_file():
        raise ConfigError(f"{config.path / 'model.yaml'}: tokenizer file {path} does not exist; "
                          "run `queryserve prepare` to build the default models")
    return open_tokenizer(path, config.parameter("max_sequence_length", 256))


@dataclass(frozen=True, slots=True)
class Rows:
    output: Array
    """One row per text, in the order given: FP32 vectors or probabilities, or BYTES texts."""
    tokens: int
    """Tokens the input texts hold (after truncation), for usage reporting."""
    extra: dict[str, Array] = field(default_factory=dict)
    """Further outputs by name, one row per text (a generation's `score`)."""


class TextPipeline(ABC, Generic[P, R]):
    def __init__(self, config: ModelConfig, backends: Sequence[Backend],
                 stats: ModelStats) -> None:
        self.config = config
        self.stats = stats
        self.output_name = config.outputs[0].name
        self.scheduler: Scheduler[P, R] = Scheduler(
            config.name, config.dynamic_batching, config.max_batch_size, backends, self, stats)
        cache = config.response_cache
        self.cache: LruCache[str, tuple[R, int]] | None = (
            LruCache(cache.max_entries) if cache.enable else None)

    # -- what each pipeline defines -----------------------------------------------------------

    @abstractmethod
    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[P]:
        """Tokenize on the event loop: one payload per text (or text pair)."""

    @abstractmethod
    def count(self, payload: P) -> int:
        """The payload's tokens, for the batcher's token budget and usage reporting."""

    @abstractmethod
    def stack(self, rows: Sequence[R]) -> Array:
        """The response's array from the rows, in order."""

    @abstractmethod
    def collate(self, payloads: Sequence[P]) -> dict[str, Array]:
        """On the instance thread: the backend's inputs for a batch."""

    @abstractmethod
    def split(self, outputs: dict[str, Array], payloads: Sequence[P]) -> Sequence[R]:
        """On the instance thread: one row per item of the batch (the payloads as collated, for
        what a row needs beyond the outputs)."""

    def extras(self, rows: Sequence[R]) -> dict[str, Array]:
        """Outputs beyond the first, by name; none unless a pipeline has them."""
        return {}

    def warmup(self) -> None:
        """Run the configured warmup samples on every instance before the model is ready."""
        for sample in self.config.model_warmup:
            self.scheduler.run_now(self.encode([sample.text] * sample.batch_size, None))

    # -- the request path, on the event loop --------------------------------------------------

    async def infer(self, texts: Sequence[str], timeout_s: float | None = None,
                    pairs: Sequence[str] | None = None) -> Rows:
        """One output row per validated, non-empty text (or text pair)."""
        rows: list[R | None] = [None] * len(texts)
        tokens = 0
        misses = list(range(len(texts)))
        keys = (texts if pairs is None or self.cache is None  # pair keys only for the cache
                else [f"{a}\x00{b}" for a, b in zip(texts, pairs, strict=True)])
        if self.cache is not None:
            misses, tokens = self._from_cache(keys, rows)
        if misses:
            payloads = self.encode([texts[i] for i in misses],
                                   None if pairs is None else [pairs[i] for i in misses])
            counts = [self.count(p) for p in payloads]
            tokens += sum(counts)
            futures = self.scheduler.submit(payloads, counts, timeout_s)
            results = await asyncio.gather(*futures) if len(futures) > 1 else [await futures[0]]
            for i, row, count in zip(misses, results, counts, strict=True):
                rows[i] = row
                if self.cache is not None:
                    self.cache.put(keys[i], (_owned(row), count))
        return Rows(self.stack(rows), tokens, self.extras(rows))  # type: ignore[arg-type]

    def _from_cache(self, keys: Sequence[str], rows: list[R | None]) -> tuple[list[int], int]:
        assert self.cache is not None
        started = time.perf_counter()
        misses = []
        tokens = 0
        for i, key in enumerate(keys):
            hit = self.cache.get(key)
            if hit is None:
                misses.append(i)
            else:
                rows[i], count = hit
                tokens += count
        elapsed = time.perf_counter() - started
        hits = len(keys) - len(misses)
        if hits:
            self.stats.cache_hit.add(elapsed * hits / len(keys), hits)
        if misses:
            self.stats.cache_miss.add(elapsed * len(misses) / len(keys), len(misses))
        return misses, tokens


def _owned(row: Any) -> Any:
    """A row the cache may keep: a copy of an array row (not a view pinning the batch)."""
    return row.copy() if hasattr(row, "copy") else row


def decode_texts(raw: Sequence[object], where: str) -> list[str]:
    """Validate each item before batching: UTF-8, not empty. Errors name the item."""
    texts = []
    for i, item in enumerate(raw):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(f"{where}[{i}] is not valid UTF-8 text") from None
        if not isinstance(item, str):
            raise InvalidInput(f"{where}[{i}] must be a string, got {type(item).__name__}")
        if not item.strip():
            raise InvalidInput(f"{where}[{i}] is empty; send non-empty text")
        texts.append(item)
    return texts
