"""The noisy-channel spelling corrector (`spell.channel`) as a backend: word lists in, the
corrected query and its posterior out.

The model folder holds `channel.json` (`queryserve train spell-channel` writes it). Decoding is
plain Python, so it holds the GIL: one instance is as fast as several; the candidates of each
typed word are cached, and head words repeat across queries.
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

    def __init__(self, config: ModelConfig) -> None:
        from queryserve.backends.noisy_channel.channel import FILE, NoisyChannel

        path = config.path / FILE
        if not path.is_file():
            raise ConfigError(f"{config.path / 'model.yaml'}: {path} does not exist; make it "
                              "with `queryserve train spell-channel`")
        self.channel = NoisyChannel.load(config.path)

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        results = [self.channel.correct_words(words) for words in inputs[WORDS]]
        return {OUTPUT_TEXTS: np.array([text for text, _ in results], dtype=object),
                OUTPUT_SCORES: np.array([score for _, score in results], dtype=np.float32)}
