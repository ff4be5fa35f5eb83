"""The noisy-channel spelling corrector (`channel.py` here) as a backend: word lists in, the
corrected query and its posterior out.

The model folder holds `channel.json` (`queryserve train spell-channel` writes it). Decoding is
plain Python, so it holds the GIL: one instance is as fast as several; the candidates of each
typed word are cached, and head words repeat across queries. A folder that also holds
`reranker.json` and a `seq2seq/` model is the hybrid corrector (`rerank`, `queryserve train
spell-hybrid`): the channel's candidates re-ranked, the score their calibrated probability.
"""

from __future__ import annotations

import numpy as np

from queryserve.backends.ctranslate2 import OUTPUT_SCORES
from queryserve.config import ModelConfig
from queryserve.errors import ConfigError
from queryserve.types import Array

WORDS = "words"
OUTPUT_TEXTS = "output_texts"


class NoisyChannelBackend:
    input_names: tuple[str, ...] = (WORDS,)
    output_names: tuple[str, ...] = (OUTPUT_TEXTS, OUTPUT_SCORES)

    def __init__(self, config: ModelConfig, threads: int = 1) -> None:
        from queryserve.backends.noisy_channel.channel import NoisyChannel
        from queryserve.backends.noisy_channel.rerank import RERANKER_FILE, HybridCorrector
        from queryserve.backends.noisy_channel.tables import FILE

        path = config.path / FILE
        if not path.is_file():
            raise ConfigError(f"{config.path / 'model.yaml'}: {path} does not exist; make it "
                              "with `queryserve train spell-channel`")
        # `threads` are the seq2seq scorer's (the channel's Python takes one core at most).
        self.hybrid = HybridCorrector.load(config.path, threads) \
            if (config.path / RERANKER_FILE).is_file() else None
        self.channel = NoisyChannel.load(config.path) if self.hybrid is None \
            else self.hybrid.channel

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        rows = [list(words) for words in inputs[WORDS]]
        results = self.hybrid.correct_words(rows) if self.hybrid is not None \
            else [self.channel.correct_words(words) for words in rows]
        return {OUTPUT_TEXTS: np.array([text for text, _ in results], dtype=object),
                OUTPUT_SCORES: np.array([score for _, score in results], dtype=np.float32)}
