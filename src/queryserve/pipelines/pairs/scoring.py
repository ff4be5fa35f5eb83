"""`pair_scoring`: two texts in, the probability that they name the same product out.

A bi-encoder with a head (`queryserve.duplicates`): each text is embedded on its own by the
encoder (mean-pooled, normalized, in the graph), and a small numpy MLP (`head.npz`) scores the
pair from the two embeddings and a few string features. A batch of n pairs is one encoder run
over its 2n texts, padded together; the head runs right after, on the same instance thread.

The string features are computed with the tokenization, on the event loop (tens of
microseconds a pair), and travel in the payload to the head. The answer says, for each pair,
whether it is a duplicate at the head's threshold (or the request's `threshold`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from queryserve.api import Inputs, PairScores, number_parameter
from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.errors import InvalidInput
from queryserve.pipelines.base import TextPipeline, graph_output
from queryserve.pipelines.pairs.features import features_array
from queryserve.pipelines.pairs.head import PairHead
from queryserve.pipelines.text_embedding import pad_token_ids
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array


def pair_threshold(inputs: Inputs, threshold: float) -> float:
    """The request's `threshold`, else the model's."""
    return number_parameter(inputs, "threshold", threshold, 0.0, 1.0)


def pair_scores(inputs: Inputs, rows: Sequence[float], tokens: int,
                threshold: float) -> PairScores:
    """The answer of a pair model: the probabilities, and each pair's decision at the request's
    `threshold` or the model's."""
    threshold = pair_threshold(inputs, threshold)
    probabilities = np.asarray(rows, dtype=np.float32)
    return PairScores(probabilities, threshold, [bool(p >= threshold) for p in rows], tokens)


@dataclass(frozen=True, slots=True)
class Pair:
    left: Array  # token ids
    right: Array
    features: Array  # features.FEATURES, for the head


class PairScoring(TextPipeline[Pair, float, PairScores]):
    takes_pairs = True

    def __init__(self, config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                 tokenizer: Tokenizer) -> None:
        super().__init__(config, backends, stats)
        self.tokenizer = tokenizer
        self.head = PairHead.load(config.path)
        self.embedding = graph_output(config, backends,
                                      config.parameter("embedding_output", "embedding"),
                                      "parameters.embedding_output")
        self.wants_token_types = "token_type_ids" in backends[0].input_names

    @property
    def threshold(self) -> float:
        return self.head.threshold

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[Pair]:
        if pairs is None:
            raise InvalidInput(f"model '{self.config.name}' scores pairs of texts: send both "
                               "inputs, 'text' and 'text_pair'")
        encodings = self.tokenizer.encode_batch([*texts, *pairs])
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        features = features_array(list(zip(texts, pairs, strict=True)))
        n = len(texts)
        return [Pair(ids[i], ids[n + i], features[i]) for i in range(n)]

    def count(self, payload: Pair) -> int:
        return len(payload.left) + len(payload.right)

    def check_options(self, inputs: Inputs) -> None:
        pair_threshold(inputs, self.threshold)

    def result(self, inputs: Inputs, rows: Sequence[float], tokens: int) -> PairScores:
        return pair_scores(inputs, rows, tokens, self.threshold)

    def tensors(self, result: PairScores) -> dict[str, Array]:
        return {self.output_name: result.probabilities.reshape(-1, 1)}


    # -- batch stages, on an instance's thread ------------------------------------------------

    def collate(self, payloads: Sequence[Pair]) -> dict[str, Array]:
        return pad_token_ids([p.left for p in payloads] + [p.right for p in payloads],
                             token_types=self.wants_token_types)

    def split(self, outputs: dict[str, Array], payloads: Sequence[Pair]) -> Sequence[float]:
        vectors = outputs[self.embedding]
        n = len(payloads)
        features = np.stack([p.features for p in payloads])
        return self.head.probability(vectors[:n], vectors[n:], features).tolist()  # type: ignore[no-any-return]
