"""`spelling`: queries in, corrected queries out, word by word (the `noisy_channel` backend).

A payload is the query's words, lower-cased and split on spaces as the corrector compares
them; the batcher counts words. No tokenizer: the corrector's vocabulary is the catalog's words.
"""

from __future__ import annotations

from collections.abc import Sequence

from queryserve.backends.ctranslate2 import OUTPUT_SCORES, token_rows
from queryserve.backends.noisy_channel import OUTPUT_TEXTS, WORDS
from queryserve.pipelines.text2text import GeneratedText, Generation
from queryserve.spell.corrector import normalized
from queryserve.types import Array


class Spelling(GeneratedText):
    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[list[str]]:
        return [normalized(text).split() for text in texts]

    def collate(self, payloads: Sequence[list[str]]) -> dict[str, Array]:
        return {WORDS: token_rows(list(payloads))}

    def split(self, outputs: dict[str, Array],
              payloads: Sequence[list[str]]) -> Sequence[Generation]:
        return [Generation(str(text), float(score))
                for text, score in zip(outputs[OUTPUT_TEXTS], outputs[OUTPUT_SCORES],
                                       strict=True)]
