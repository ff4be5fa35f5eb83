"""Text in, one row per text out: tokenize -> queue -> encoder -> rows.

Two pipelines share this path. `text_embedding` returns the encoder's pooled vector;
`text_classification` returns its label probabilities, for one text or, with a second input
(`text_pair`), for a pair of texts, which are tokenized together with segment ids. Either way
the graph does the post-processing (pooling, normalisation or softmax), so the pipeline only
tokenizes, pads and slices rows.

Tokenization happens per request on the event loop (native code, ~tens of microseconds for a
query) because the batcher needs each item's token count to cut batches against the token
budget. Padding happens per batch on the instance thread (`collate`), so a batch is padded only
to its own longest item. The ONNX encoder does pooling and normalisation in its graph, so
`split` only slices rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.errors import ConfigError, InvalidInput
from queryserve.scheduling.cache import LruCache
from queryserve.scheduling.scheduler import Scheduler
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array


def open_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """A `tokenizers` tokenizer as the server uses it: truncation on, padding off (batches
    are padded to their own longest item by `pad_token_ids`)."""
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


def pad_token_ids(rows: Sequence[Sequence[int] | Array],
                  segments: Sequence[Sequence[int] | Array] | None = None) -> dict[str, Array]:
    """Pad token ids to the batch's longest row with id 0, with the attention mask, and the
    segment ids as `token_type_ids` when given (text pairs)."""
    longest = max(len(ids) for ids in rows)
    input_ids = np.zeros((len(rows), longest), dtype=np.int64)
    attention_mask = np.zeros((len(rows), longest), dtype=np.int64)
    for row, ids in enumerate(rows):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    padded = {"input_ids": input_ids, "attention_mask": attention_mask}
    if segments is not None:
        token_types = np.zeros_like(input_ids)
        for row, types in enumerate(segments):
            token_types[row, : len(types)] = types
        padded["token_type_ids"] = token_types
    return padded


@dataclass(frozen=True, slots=True)
class Embeddings:
    vectors: Array
    """FP32 [n, dim], one row per text in the order given."""
    tokens: int
    """Tokens the texts hold (after truncation), for usage reporting."""


class TextEmbedding:
    """The `text_embedding` pipeline: BYTES texts in, an FP32 [n, dim] array out."""

    def __init__(self, config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                 tokenizer: Tokenizer) -> None:
        self.config = config
        self.stats = stats
        self.tokenizer = tokenizer
        self.output_name = config.outputs[0].name
        self.dim = config.outputs[0].dims[-1]
        self.wants_token_types = "token_type_ids" in backends[0].input_names
        self.scheduler: Scheduler[Array, Array] = Scheduler(
            config.name, config.dynamic_batching, config.max_batch_size, backends, self, stats)
        cache = config.response_cache
        self.cache: LruCache[str, tuple[Array, int]] | None = (
            LruCache(cache.max_entries) if cache.enable else None)

    # -- request path, on the event loop ------------------------------------------------------

    async def infer(self, texts: Sequence[str], timeout_s: float | None = None,
                    pairs: Sequence[str] | None = None) -> Embeddings:
        """One output row per validated, non-empty text (or text pair)."""
        rows: list[Array | None] = [None] * len(texts)
        tokens = 0
        misses = list(range(len(texts)))
        keys = (texts if pairs is None or self.cache is None  # pair keys only for the cache
                else [f"{a}\x00{b}" for a, b in zip(texts, pairs, strict=True)])
        if self.cache is not None:
            misses, tokens = self._from_cache(keys, rows)
        if misses:
            payloads = (self.tokenize([texts[i] for i in misses]) if pairs is None else
                        self.tokenize_pairs([(texts[i], pairs[i]) for i in misses]))
            counts = [p.shape[-1] for p in payloads]
            tokens += sum(counts)
            futures = self.scheduler.submit(payloads, counts, timeout_s)
            results = await asyncio.gather(*futures) if len(futures) > 1 else [await futures[0]]
            for i, row, count in zip(misses, results, counts, strict=True):
                rows[i] = row
                if self.cache is not None:
                    self.cache.put(keys[i], (row.copy(), count))  # a copy: no view of the batch
        return Embeddings(np.stack(rows), tokens)  # type: ignore[arg-type]

    def _from_cache(self, texts: Sequence[str],
                    rows: list[Array | None]) -> tuple[list[int], int]:
        assert self.cache is not None
        started = time.perf_counter()
        misses = []
        tokens = 0
        for i, text in enumerate(texts):
            hit = self.cache.get(text)
            if hit is None:
                misses.append(i)
            else:
                rows[i], count = hit
                tokens += count
        elapsed = time.perf_counter() - started
        hits = len(texts) - len(misses)
        if hits:
            self.stats.cache_hit.add(elapsed * hits / len(texts), hits)
        if misses:
            self.stats.cache_miss.add(elapsed * len(misses) / len(texts), len(misses))
        return misses, tokens

    def tokenize(self, texts: Sequence[str]) -> list[Array]:
        if len(texts) == 1:
            return [np.asarray(self.tokenizer.encode(texts[0]).ids, dtype=np.int64)]
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(texts)]

    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[Array]:
        """A [2, tokens] array per pair: token ids, then segment ids."""
        encodings = ([self.tokenizer.encode(*pairs[0])] if len(pairs) == 1
                     else self.tokenizer.encode_batch(list(pairs)))
        return [np.asarray([e.ids, e.type_ids], dtype=np.int64) for e in encodings]

    # -- batch stages, on an instance's thread ------------------------------------------------

    def collate(self, payloads: Sequence[Array]) -> dict[str, Array]:
        if payloads[0].ndim == 2:  # pairs: ids and segment ids
            segments = [p[1] for p in payloads] if self.wants_token_types else None
            return pad_token_ids([p[0] for p in payloads], segments)
        inputs = pad_token_ids(payloads)
        if self.wants_token_types:
            inputs["token_type_ids"] = np.zeros_like(inputs["input_ids"])
        return inputs

    def split(self, outputs: dict[str, Array], count: int) -> Sequence[Array]:
        return list(outputs[self.output_name])

    # -- lifecycle ----------------------------------------------------------------------------

    def warmup(self) -> None:
        """Run the configured warmup samples on every instance before the model is ready."""
        for sample in self.config.model_warmup:
            self.scheduler.run_now(self.tokenize([sample.text] * sample.batch_size))


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
