"""What every text pipeline shares: texts in, one output row per text, through the scheduler,
with the response cache in front.

A pipeline says how to encode texts into payloads (on the event loop, because the batcher needs
each item's token count), how to collate payloads into the backend's inputs and split its
outputs into rows (on an instance's thread), and what the rows mean: `result` makes the typed
answer (`queryserve.api`) and `tensors` lays it out as the model's declared outputs.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Hashable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from tokenizers import Tokenizer

from queryserve.api import Inputs
from queryserve.backends import Backend
from queryserve.config import MODEL_FILE, ModelConfig
from queryserve.errors import ConfigError, InvalidInput
from queryserve.scheduling.cache import LruCache
from queryserve.scheduling.scheduler import Scheduler
from queryserve.scheduling.stats import ModelStats, RequestWork
from queryserve.types import Array

P = TypeVar("P")  # one item's payload, as queued
R = TypeVar("R")  # one item's output row
Res = TypeVar("Res")  # the typed answer to a request (queryserve.api)

ENCODE_ON_LOOP_MAX = 32
ENCODE_ON_LOOP_MAX_CHARS = 2048
"""Requests of more texts, or of more characters, are tokenized on a worker thread. On the
loop, 1,024 long texts held every other client for 71-300 ms (measured with the intent
tokenizer); on a thread, the loop's longest pause was 4 ms. Up to this many (the search bar
sends one query; 2,048 characters tokenize in 1-3 ms) stay on the loop, where a thread's
hand-off would cost more than it saves."""

CHARS_PER_TOKEN = 16
"""Each text is cut at this many characters a token the model reads (`max_sequence_length`)
before it is tokenized. A tokenizer works on the whole text and truncates after: one text of
8 MB held the server, health probes included, for 4-17 s (`Tokenizer.encode` keeps the GIL,
so a thread did not help), and a pair's truncation builds every overflow window of both
sides: two texts of 100 KB took 10 GB. MASSIVE's queries run 4.68 characters a WordPiece
token (the worst query 11.0), catalog titles 3.33 (worst 9.5), so a cut text still holds more
tokens than the model reads and gets the same answer; only runs of spaces or words over 100
characters, which become few tokens, could read differently."""


def open_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """A `tokenizers` tokenizer as the server uses it: truncation on, padding off (batches
    are padded to their own longest item)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.no_padding()
    return tokenizer


def graph_output(config: ModelConfig, backends: Sequence[Backend], name: str,
                 field: str) -> str:
    """`name`, the backend output a pipeline reads, once checked to be one the backend gives:
    a name that is not one loaded, and every batch then failed with a bare KeyError."""
    given = backends[0].output_names
    if name not in given:
        raise ConfigError(f"{config.path / MODEL_FILE}: {field} is '{name}', which the model "
                          f"does not give; its outputs are {', '.join(given)}")
    return name


def load_tokenizer(config: ModelConfig) -> Tokenizer:
    path: Path = config.path / config.parameter("tokenizer_file", "tokenizer.json")
    if not path.is_file():
        raise ConfigError(f"{config.path / 'model.yaml'}: tokenizer file {path} does not exist; "
                          "run `queryserve prepare` to build the default models")
    length = config.parameter("max_sequence_length", 256)
    if length < 1:
        raise ConfigError(f"{config.path / 'model.yaml'}: parameters.max_sequence_length is "
                          f"{length}; expected a number of tokens >= 1")
    return open_tokenizer(path, length)


class TextPipeline(ABC, Generic[P, R, Res]):
    """Texts in, one row per text through the cache and the scheduler, a typed result out."""

    def __init__(self, config: ModelConfig, backends: Sequence[Backend],
                 stats: ModelStats) -> None:
        self.config = config
        self.stats = stats
        self.output_name = config.outputs[0].name
        self.scheduler: Scheduler[P, R] = Scheduler(
            config.name, config.dynamic_batching, config.max_batch_size, backends, self, stats)
        self.max_chars = config.parameter("max_sequence_length", 256) * CHARS_PER_TOKEN
        cache = config.response_cache
        self.cache: LruCache[Hashable, tuple[R, int]] | None = (
            LruCache(cache.max_entries, cache.max_bytes, _entry_bytes) if cache.enable
            else None)

    # -- what each pipeline defines -----------------------------------------------------------

    @abstractmethod
    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[P]:
        """Tokenize on the event loop: one payload per text (or text pair)."""

    @abstractmethod
    def count(self, payload: P) -> int:
        """The payload's tokens, for the batcher's token budget and usage reporting."""

    @abstractmethod
    def collate(self, payloads: Sequence[P]) -> dict[str, Array]:
        """On the instance thread: the backend's inputs for a batch."""

    @abstractmethod
    def split(self, outputs: dict[str, Array], payloads: Sequence[P]) -> Sequence[R]:
        """On the instance thread: one row per item of the batch (the payloads as collated, for
        what a row needs beyond the outputs)."""

    @abstractmethod
    def result(self, inputs: Inputs, rows: Sequence[R], tokens: int) -> Res:
        """The typed answer from the rows, in order: the model's own post-processing."""

    @abstractmethod
    def tensors(self, result: Res) -> dict[str, Array]:
        """The answer as the model's declared outputs, by name (KServe v2)."""

    takes_pairs: ClassVar[bool] = False
    """An item is a pair of texts (`text`, `text_pair`): warmup sends both."""
    cuts_to_length: ClassVar[bool] = True
    """The tokenizer cuts a text at `max_sequence_length` tokens and the model reads the rest
    (a generator refuses what it would cut instead)."""

    def warmup(self) -> None:
        """Run the configured warmup samples on every instance before the model is ready, then
        the longest input the model is configured to read."""
        try:
            for sample in self.config.model_warmup:
                texts = [sample.text] * sample.batch_size
                self.scheduler.run_now(self.encode(texts, texts if self.takes_pairs else None))
            # A graph's positions are a table of fixed size; the stand-in `fake` backend has
            # none (and its `delay_ms` would make each load of it that much slower).
            if self.cuts_to_length and self.config.backend == "onnxruntime":
                self._read_longest()
        except BaseException:
            self.scheduler.release()  # never served: nothing else would end its threads
            raise

    def _read_longest(self) -> None:
        """A `max_sequence_length` over what the graph holds (its table of positions: 512 for
        BERT) loaded, and then every long query was a 500: it is refused at load."""
        length = self.config.parameter("max_sequence_length", 256)
        text = "a " * length  # a token a word: the tokenizer cuts it at `length` tokens
        try:
            self.scheduler.run_now(self.encode([text], [text] if self.takes_pairs else None))
        except Exception as exc:
            raise ConfigError(
                f"{self.config.path / 'model.yaml'}: parameters.max_sequence_length is {length}, "
                f"and the model fails on an input of that many tokens ({type(exc).__name__}: "
                f"{exc}); set it to at most the positions the model was trained with (512 for "
                "BERT-like models)") from exc

    # -- lifecycle ------------------------------------------------------------------------------

    def ready(self) -> bool:
        return True

    @property
    def queue_depth(self) -> int:
        return self.scheduler.queue_depth

    def close(self) -> Awaitable[None]:
        """Take no more work; resolves when the queue has run to the end."""
        return self.scheduler.close()

    def abort(self) -> None:
        self.scheduler.abort()

    # -- the request path, on the event loop --------------------------------------------------

    def check_options(self, inputs: Inputs) -> None:
        """Refuse a request's bad options (`top_k`, `threshold`...) before any of its items is
        queued: `result` reads them after the model has run, which is work for nothing."""

    async def infer(self, inputs: Inputs) -> Res:
        self.check_options(inputs)
        if inputs.token_ids is not None:
            return await self._infer_ids(inputs, inputs.token_ids)
        rows, tokens = await self.rows(inputs.texts, inputs.pairs, inputs.timeout_s)
        return self.result(inputs, rows, tokens)

    def encode_ids(self, rows: Sequence[Sequence[int]]) -> list[P]:
        """Payloads from rows already tokenized (`Inputs.token_ids`); a pipeline that takes
        them checks each id against its vocabulary. By default a model takes text only."""
        raise InvalidInput(f"model '{self.config.name}' takes text, not token ids")

    async def _infer_ids(self, inputs: Inputs, token_ids: Sequence[Sequence[int]]) -> Res:
        """Rows of token ids skip the tokenizer and the response cache (keyed by text), and
        take the same queue and batches as text."""
        payloads = self.encode_ids(token_ids)
        counts = [self.count(p) for p in payloads]
        rows = await self._run(payloads, counts, inputs.timeout_s)
        return self.result(inputs, rows, sum(counts))

    async def rows(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                   timeout_s: float | None = None) -> tuple[list[R], int]:
        """One row per validated, non-empty text (or text pair), and the tokens they hold."""
        rows: list[R | None] = [None] * len(texts)
        tokens = 0
        misses = list(range(len(texts)))
        cut = self.max_chars  # a text no longer than this is its own slice: no copy
        texts = [text[:cut] for text in texts]
        pairs = None if pairs is None else [text[:cut] for text in pairs]
        # Cache keys are what the model reads, a pair's a tuple: keyed by the whole text, 40
        # texts of 2 MB held 150 MB; keyed "3:abcdef", a text had the pair ("abc", "def")'s
        # answer.
        keys: Sequence[Hashable] = ()
        if self.cache is not None:
            keys = texts if pairs is None else list(zip(texts, pairs, strict=True))
            misses, tokens = self._from_cache(keys, rows)
            if not misses:  # answered without queueing: it waited for nothing
                self.stats.record_work(RequestWork())
        if misses:
            fresh = [texts[i] for i in misses]
            fresh_pairs = None if pairs is None else [pairs[i] for i in misses]
            chars = sum(map(len, fresh)) + sum(map(len, fresh_pairs or ()))
            if len(misses) <= ENCODE_ON_LOOP_MAX and chars <= ENCODE_ON_LOOP_MAX_CHARS:
                payloads, elapsed_ns = self._encode_timed(fresh, fresh_pairs)
            else:  # the tokenizer releases the GIL: the loop serves others meanwhile
                payloads, elapsed_ns = await asyncio.get_running_loop().run_in_executor(
                    None, self._encode_timed, fresh, fresh_pairs)
            self.stats.record_tokenize(elapsed_ns)  # on the loop, wherever it ran: no lock
            counts = [self.count(p) for p in payloads]
            tokens += sum(counts)
            results = await self._run(payloads, counts, timeout_s)
            for i, row, count in zip(misses, results, counts, strict=True):
                rows[i] = row
                if self.cache is not None:
                    self.cache.put(keys[i], (_owned(row), count))
        return rows, tokens  # type: ignore[return-value]  # every row is filled

    def _encode_timed(self, texts: Sequence[str],
                      pairs: Sequence[str] | None) -> tuple[list[P], int]:
        """`encode`, and the nanoseconds it took: one clock pair per request, read where the
        work runs (a worker thread's wait for the executor is not tokenizing)."""
        started = time.perf_counter_ns()
        payloads = self.encode(texts, pairs)
        return payloads, time.perf_counter_ns() - started

    async def _run(self, payloads: list[P], counts: list[int],
                   timeout_s: float | None) -> list[R]:
        """Queue the items in turns of about a batch per instance (`Scheduler.turn_items`
        items, a batch's token budget per instance): a request of a thousand long queries
        never fills the queue, and a request that arrives meanwhile waits one batch, not the
        whole request. The first turn passes admission control; the rest of an admitted
        request is never refused."""
        work = RequestWork()  # counted once the request is answered, as Triton counts
        rows = await self._queued(payloads, counts, timeout_s, work)
        self.stats.record_work(work)
        return rows

    async def _queued(self, payloads: list[P], counts: list[int], timeout_s: float | None,
                      work: RequestWork) -> list[R]:
        scheduler = self.scheduler
        if len(payloads) == 1:  # the search bar's case: no turns, no gather
            return [await scheduler.submit(payloads, counts, timeout_s, work=work)[0]]
        if len(payloads) <= scheduler.turn_items:
            return await self._run_turns(payloads, counts, timeout_s, work)
        # Many turns: queued shortest first, so that each turn's batches hold texts of about
        # one length (the batcher sorts only the window it sees), then put back in order.
        order = sorted(range(len(payloads)), key=counts.__getitem__)
        rows = await self._run_turns([payloads[i] for i in order], [counts[i] for i in order],
                                     timeout_s, work)
        ordered: list[R] = [rows[0]] * len(rows)
        for position, row in zip(order, rows, strict=True):
            ordered[position] = row
        return ordered

    async def _run_turns(self, payloads: list[P], counts: list[int],
                         timeout_s: float | None, work: RequestWork) -> list[R]:
        scheduler = self.scheduler
        most_tokens = self.config.dynamic_batching.max_batch_tokens * len(scheduler.instances)
        rows: list[R] = []
        start = 0
        with scheduler.turns():  # admitted, it finishes on this model even if a reload comes
            while start < len(payloads):
                end, budget = start, 0
                while end < len(payloads) and end - start < scheduler.turn_items and (
                        end == start or budget + counts[end] <= most_tokens):
                    budget += counts[end]
                    end += 1
                futures = scheduler.submit(payloads[start:end], counts[start:end], timeout_s,
                                           admitted=start > 0, work=work)
                try:
                    rows += await asyncio.gather(*futures)
                except BaseException:
                    # One item failed (or the client left): its siblings must not run for
                    # nothing.
                    for future in futures:
                        future.cancel()
                    raise
                start = end
        return rows

    def _from_cache(self, keys: Sequence[Hashable],
                    rows: list[R | None]) -> tuple[list[int], int]:
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
        # Triton counts requests: a hit is one the cache answered wholly. The cache is per
        # text, so `/metrics` also counts the texts.
        (self.stats.cache_miss if misses else self.stats.cache_hit).add(
            time.perf_counter() - started)
        self.stats.cached_items += len(keys) - len(misses)
        self.stats.missed_items += len(misses)
        return misses, tokens


def _entry_bytes(key: Hashable, value: tuple[Any, int]) -> int:
    """About what a cache entry holds: its text (a character a byte) and its row."""
    parts: tuple[str, ...] = (key,) if isinstance(key, str) else key  # type: ignore[assignment]
    return 100 + sum(len(part) for part in parts) + getattr(value[0], "nbytes", 100)


def _owned(row: Any) -> Any:
    """A row the cache may keep: a copy of an array row (not a view pinning the batch)."""
    return row.copy() if hasattr(row, "copy") else row
