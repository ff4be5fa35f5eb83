"""`text2text`: text in, generated text out (a seq2seq model such as a spelling corrector).

The tokenizer gives each text's source tokens (the model's vocabulary strings, end token
included, as CTranslate2 takes them); the batcher cuts batches against their count; the
backend decodes a batch at once; `split` turns each hypothesis back into text on the instance
thread, with its score (the geometric mean of its token probabilities: a model with a `score`
output returns it, e.g. for a spelling corrector to say how sure it is). The answer is a
correction per text: the generated text, whether it differs from the input, and the score.
With the response cache on, a query seen before is answered without decoding: for search
traffic, where the head queries repeat, that is the cheapest decoder step of all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer

from queryserve.api import Corrections, Inputs, correction
from queryserve.backends import Backend
from queryserve.backends.ctranslate2 import (
    OUTPUT_SCORES,
    OUTPUT_TOKENS,
    SOURCE_TOKENS,
    token_rows,
)
from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput
from queryserve.pipelines.base import TextPipeline
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array


def source_tokens(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[str]]:
    """Each text's tokens as vocabulary strings, special tokens included."""
    if len(texts) == 1:  # encode() skips encode_batch's thread pool
        return [tokenizer.encode(texts[0]).tokens]
    return [e.tokens for e in tokenizer.encode_batch(list(texts))]


def decode_tokens(tokenizer: Tokenizer, hypotheses: Sequence[Sequence[str]]) -> list[str]:
    """Generated tokens back to text, special tokens dropped."""
    unknown = tokenizer.token_to_id(UNKNOWN) or 0
    ids = [[i if (i := tokenizer.token_to_id(t)) is not None else unknown for t in tokens]
           for tokens in hypotheses]
    return [text.strip() for text in tokenizer.decode_batch(ids, skip_special_tokens=True)]


SCORE = "score"


class Generation(NamedTuple):
    text: str | None  # None: the model cannot read the text, which is kept as typed
    score: float


UNKNOWN = "<unk>"  # the tokenizers' token for a character out of the vocabulary
UNREAD = Generation(None, 1.0)


def generations(tokenizer: Tokenizer, outputs: dict[str, Array]) -> list[Generation]:
    """The backend's outputs for a batch as texts with their scores (the geometric mean of the
    token probabilities)."""
    texts = decode_tokens(tokenizer, list(outputs[OUTPUT_TOKENS]))
    return [Generation(t, math.exp(s)) for t, s in zip(texts, outputs[OUTPUT_SCORES],
                                                         strict=True)]


class GeneratedText(TextPipeline[list[str], Generation, Corrections]):
    """Texts out, one per text in, as corrections of the texts, with their scores (a model
    without a `score` output is sure of itself: its corrections score 1). A payload is a list
    of strings: tokens (`text2text`) or words (`spelling`)."""

    cuts_to_length = False  # a text it would cut is refused (`TextToText.encode`)

    def count(self, payload: list[str]) -> int:
        return max(1, len(payload))

    @cached_property
    def _has_score(self) -> bool:
        return any(spec.name == SCORE for spec in self.config.outputs)

    def result(self, inputs: Inputs, rows: Sequence[Generation], tokens: int) -> Corrections:
        scored = self._has_score
        generated = [" ".join(text.split()) if row.text is None else row.text
                     for text, row in zip(inputs.texts, rows, strict=True)]
        return Corrections([correction(text, out, row.score if scored else 1.0)
                            for text, out, row in zip(inputs.texts, generated, rows,
                                                      strict=True)],
                           generated, tokens)

    def tensors(self, result: Corrections) -> dict[str, Array]:
        texts = np.empty((len(result.generated), 1), dtype=object)
        texts[:, 0] = result.generated
        outputs = {self.output_name: texts}
        if self._has_score:
            outputs[SCORE] = np.array([[c.score] for c in result.corrections],
                                      dtype=np.float32)
        return outputs


class TextToText(GeneratedText):
    def __init__(self, config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                 tokenizer: Tokenizer) -> None:
        super().__init__(config, backends, stats)
        self.tokenizer = tokenizer

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[list[str]]:
        # Spaces as the channel reads them: runs of them were read as tokens of their own, and
        # "  taylor   swift  " came back "taylor   swift your mos dspy swift t".
        texts = [" ".join(text.split()) for text in texts]
        tokens = source_tokens(self.tokenizer, texts)
        limit = (self.tokenizer.truncation or {}).get("max_length")
        for text, row in zip(texts, tokens, strict=True):
            # Cut, a text would be answered with the rewrite of its beginning, as if that were
            # all of it (a correction that drops the rest of the query).
            if limit is not None and len(row) >= limit and self.tokenizer.encode(text).overflowing:
                raise InvalidInput(f"'{text[:40]}...' is longer than model "
                                   f"'{self.config.name}' reads ({limit} tokens); send "
                                   "shorter text")
        return tokens

    def collate(self, payloads: Sequence[list[str]]) -> dict[str, Array]:
        return {SOURCE_TOKENS: token_rows(list(payloads))}

    def split(self, outputs: dict[str, Array],
              payloads: Sequence[list[str]]) -> Sequence[Generation]:
        # A text with characters the model never learned is kept as typed: read as <unk>,
        # "привет мир" came back "#) $$5" and "play some jazz 😀" "play some jazz )", sure
        # enough (0.6) for a search bar to apply.
        return [UNREAD if UNKNOWN in payload else row
                for row, payload in zip(generations(self.tokenizer, outputs), payloads,
                                        strict=True)]
