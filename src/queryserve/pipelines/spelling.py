"""`spelling`: queries in, corrected queries out, word by word (the `noisy_channel` backend).

A payload is the query's words, lower-cased and split on spaces as the corrector compares
them; the batcher counts words. No tokenizer: the corrector's vocabulary is the catalog's words.
"""

from __future__ import annotations

from collections.abc import Sequence

from queryserve.api import normalized
from queryserve.backends.ctranslate2 import OUTPUT_SCORES, token_rows
from queryserve.backends.noisy_channel import OUTPUT_TEXTS, WORDS
from queryserve.errors import QueryTooLong
from queryserve.pipelines.text2text import GeneratedText, Generation
from queryserve.types import Array

MAX_WORDS = 64
"""The longest query corrected by default (`parameters.max_words`; MASSIVE's longest
utterance has 61 words). Decoding runs under the GIL at ~0.7 ms a word (a 3,000-word query
took 2.1 s): without a bound, one pasted page stalls every other query's correction."""


class Spelling(GeneratedText):
    @property
    def max_words(self) -> int:
        return self.config.parameter("max_words", MAX_WORDS)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[list[str]]:
        rows = [normalized(text).split() for text in texts]
        for words in rows:
            if len(words) > self.max_words:
                raise QueryTooLong(f"a query of {len(words)} words is over the {self.max_words} "
                                   f"that model '{self.config.name}' corrects "
                                   f"(parameters.max_words in its model.yaml)")
        return rows

    def collate(self, payloads: Sequence[list[str]]) -> dict[str, Array]:
        return {WORDS: token_rows(list(payloads))}

    def split(self, outputs: dict[str, Array],
              payloads: Sequence[list[str]]) -> Sequence[Generation]:
        return [Generation(str(text), float(score))
                for text, score in zip(outputs[OUTPUT_TEXTS], outputs[OUTPUT_SCORES],
                                       strict=True)]
