"""Text in, one encoder row per text out: tokenize -> queue -> encoder -> rows.

Two pipelines share this path. `text_embedding` returns the encoder's pooled vector;
`text_classification` returns its label probabilities and each text's likeliest labels, for one
text or, with a second input (`text_pair`), for a pair of texts, which are tokenized together
with segment ids. Either way the graph does the numeric post-processing (pooling, normalisation
or softmax), so the pipeline tokenizes, pads, slices rows and names the labels.

Tokenization happens per request on the event loop (native code, ~tens of microseconds for a
query) because the batcher needs each item's token count to cut batches against the token
budget. Padding happens per batch on the instance thread (`collate`), so a batch is padded only
to its own longest item.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from queryserve.api import Classifications, Embeddings, Inputs, Label, integer_parameter
from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput
from queryserve.pipelines.base import Res, TextPipeline, graph_output
from queryserve.pipelines.calibration import load_calibration
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array


def pad_token_ids(rows: Sequence[Sequence[int] | Array],
                  segments: Sequence[Sequence[int] | Array] | None = None,
                  token_types: bool = False) -> dict[str, Array]:
    """Pad token ids to the batch's longest row with id 0, with the attention mask, and the
    segment ids as `token_type_ids` when given (text pairs), or all zeros (one segment) with
    `token_types` (an encoder whose graph takes them)."""
    longest = max(len(ids) for ids in rows)
    input_ids = np.zeros((len(rows), longest), dtype=np.int64)
    attention_mask = np.zeros((len(rows), longest), dtype=np.int64)
    for row, ids in enumerate(rows):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    padded = {"input_ids": input_ids, "attention_mask": attention_mask}
    if segments is not None:
        segment_ids = np.zeros_like(input_ids)
        for row, types in enumerate(segments):
            segment_ids[row, : len(types)] = types
        padded["token_type_ids"] = segment_ids
    elif token_types:
        padded["token_type_ids"] = np.zeros_like(input_ids)
    return padded


class EncoderRows(TextPipeline[Array, Array, Res]):
    """BYTES texts in, an FP32 [n, width] array of rows out. A payload is a 1-D array of token
    ids, or for a pair a [2, tokens] array of token ids and segment ids."""

    def __init__(self, config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                 tokenizer: Tokenizer) -> None:
        super().__init__(config, backends, stats)
        self.tokenizer = tokenizer
        self.dim = config.outputs[0].dims[-1]
        self.reads = self.output_read(config, backends)
        self.wants_token_types = "token_type_ids" in backends[0].input_names
        self.vocabulary_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.max_length: int | None = (tokenizer.truncation or {}).get("max_length")
        # The id a truncated text still ends with ([SEP], or </s> for RoBERTa-like models).
        self.end_id = next((i for token in ("[SEP]", "</s>")
                            if (i := tokenizer.token_to_id(token)) is not None), None)
        self.pad_id = next((i for token in ("[PAD]", "<pad>")
                            if (i := tokenizer.token_to_id(token)) is not None), None)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[Array]:
        if pairs is not None:
            return self.tokenize_pairs(list(zip(texts, pairs, strict=True)))
        return self.tokenize(texts)

    def tokenize(self, texts: Sequence[str]) -> list[Array]:
        if len(texts) == 1:
            return [np.asarray(self.tokenizer.encode(texts[0]).ids, dtype=np.int64)]
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(texts)]

    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[Array]:
        """A [2, tokens] array per pair: token ids, then segment ids."""
        encodings = ([self.tokenizer.encode(*pairs[0])] if len(pairs) == 1
                     else self.tokenizer.encode_batch(list(pairs)))
        return [np.asarray([e.ids, e.type_ids], dtype=np.int64) for e in encodings]

    def encode_ids(self, rows: Sequence[Sequence[int]]) -> list[Array]:
        """Rows of ids as given, less trailing padding, truncated to the tokenizer's
        `max_length` as text is; an id outside the vocabulary would index past the embedding
        table, so it is refused. Padding is the client's tokenizer's (a tokenizer.json that pads
        to 128, as some exports ship): read as text, it gave another vector (cosine 0.24)."""
        rows = [self._unpadded(list(ids), i) for i, ids in enumerate(rows)]
        for i, ids in enumerate(rows):
            if not ids:
                raise InvalidInput(f"row {i} of token ids is empty; send at least one id")
            if not 0 <= min(ids) <= max(ids) < self.vocabulary_size:
                bad = next(t for t in ids if not 0 <= t < self.vocabulary_size)
                raise InvalidInput(
                    f"token id {bad} (row {i}) is not in the vocabulary of model "
                    f"'{self.config.name}': ids run from 0 to {self.vocabulary_size - 1}")
        return [np.asarray(self._truncated(list(ids)), dtype=np.int64) for ids in rows]

    def _unpadded(self, ids: list[int], row: int) -> list[int]:
        end = len(ids)
        while end and ids[end - 1] == self.pad_id:
            end -= 1
        if ids and not end:
            raise InvalidInput(f"row {row} of token ids is only padding; send the text's ids")
        return ids[:end]

    def _truncated(self, ids: list[int]) -> list[int]:
        if self.max_length is None or len(ids) <= self.max_length:
            return ids
        if self.end_id is not None and ids[-1] == self.end_id:  # as a cut text keeps it
            return ids[: self.max_length - 1] + ids[-1:]
        return ids[: self.max_length]

    def count(self, payload: Array) -> int:
        return int(payload.shape[-1])

    # -- batch stages, on an instance's thread ------------------------------------------------

    def collate(self, payloads: Sequence[Array]) -> dict[str, Array]:
        if payloads[0].ndim == 2:  # pairs: ids and segment ids
            segments = [p[1] for p in payloads] if self.wants_token_types else None
            return pad_token_ids([p[0] for p in payloads], segments)
        return pad_token_ids(payloads, token_types=self.wants_token_types)

    def output_read(self, config: ModelConfig, backends: Sequence[Backend]) -> str:
        """The backend output the rows are read from: the model's declared one."""
        return graph_output(config, backends, self.output_name, "output[0].name")

    def split(self, outputs: dict[str, Array], payloads: Sequence[Array]) -> Sequence[Array]:
        return list(outputs[self.reads])


class TextEmbedding(EncoderRows[Embeddings]):
    """`text_embedding`: one vector per text."""

    def result(self, inputs: Inputs, rows: Sequence[Array], tokens: int) -> Embeddings:
        return Embeddings(np.stack(rows), tokens)

    def tensors(self, result: Embeddings) -> dict[str, Array]:
        return {self.output_name: result.vectors}


MAX_TOP_K = 1000


class TextClassification(EncoderRows[Classifications]):
    """`text_classification`: label probabilities, and the `top_k` likeliest labels (default 1)
    named by `parameters.labels`. With a `calibration.json` beside the model
    (`pipelines/calibration.py`) the probabilities are temperature-scaled, in every front end
    alike, and a label under its threshold is not `confident`."""

    def __init__(self, config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                 tokenizer: Tokenizer) -> None:
        super().__init__(config, backends, stats, tokenizer)
        self.labels = config.labels(self.dim)
        self.calibration = load_calibration(config.path)

    def check_options(self, inputs: Inputs) -> None:
        integer_parameter(inputs, "top_k", 1, 1, MAX_TOP_K)

    def result(self, inputs: Inputs, rows: Sequence[Array], tokens: int) -> Classifications:
        top_k = integer_parameter(inputs, "top_k", 1, 1, MAX_TOP_K)
        probabilities = np.stack(rows)  # the graph's own: the response cache keeps those
        threshold = 0.0
        if self.calibration is not None:
            probabilities = self.calibration.apply(probabilities)
            threshold = self.calibration.threshold
        best = np.argsort(-probabilities, axis=1, kind="stable")[:, :top_k]
        top = [[Label(self.labels[j], float(probabilities[i, j]),
                      bool(probabilities[i, j] >= threshold)) for j in best[i]]
               for i in range(len(rows))]
        return Classifications(probabilities, top, tokens)

    def tensors(self, result: Classifications) -> dict[str, Array]:
        return {self.output_name: result.probabilities}
