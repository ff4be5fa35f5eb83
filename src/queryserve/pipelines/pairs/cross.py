"""`pair_scoring` with `encoder: cross`: both texts read together by one Transformer run,
`[CLS] text [SEP] text_pair [SEP]`, and a two-class head (different, duplicate) whose softmax is
in the graph (`queryserve optimize --task pair` compiles it like any classifier).

A cross-encoder sees the one token that tells two listings apart ("ipod nano" against "ipod
touch"), which a bi-encoder's separate embeddings blur; it reads a pair's texts in their sorted
order, so (a, b) and (b, a) get one probability; the price is a Transformer run per pair,
so in the batch job it scores only the candidates that a bi-encoder blocked.
A model trained with hints (`hints: true`) reads a few words before the pair that say what
its model numbers and sizes say (`features.pair_hint`), computed here as they were in training.
The answer is the same `PairScores` as the bi-encoder's: the probability of the `duplicate`
label, and the decision at the model's threshold (`parameters.threshold`, chosen on the valid
splits when it was trained) or the request's `threshold`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from tokenizers import Tokenizer

from queryserve.api import Inputs, PairScores
from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.errors import ConfigError, InvalidInput
from queryserve.pipelines.base import graph_output
from queryserve.pipelines.pairs.features import hinted, text_signals
from queryserve.pipelines.pairs.scoring import pair_scores, pair_threshold
from queryserve.pipelines.text_embedding import EncoderRows
from queryserve.scheduling.stats import ModelStats
from queryserve.types import Array

DUPLICATE = "duplicate"  # the label whose probability is the answer
SIGNALS_KEPT = 1 << 16
"""Texts whose signals (for the hints) are kept: in the batch job each product meets many
others, and its text is read once, not once per pair."""


def duplicate_column(config: ModelConfig) -> int:
    """Which of the classifier's outputs is the `duplicate` label's (`parameters.labels`)."""
    labels = [n.strip() for n in config.parameter("labels", "").split(",")]
    if DUPLICATE not in labels:
        raise ConfigError(f"{config.path / 'model.yaml'}: a cross-encoder pair model needs a "
                          f"'{DUPLICATE}' label in parameters.labels (has {', '.join(labels)})")
    return labels.index(DUPLICATE)


def in_order(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each pair as the cross-encoder reads it: its texts in sorted order, whichever order was
    sent. Read as sent, one pair scored 0.21 one way and 0.59 the other, and 68 of the 6,258
    test pairs' decisions changed with the order. The model learned both orders (training
    swaps them at random), and the sorted order keeps its F1 (BENCHMARKS.md, "the
    cross-encoder reads a pair in one order") at no cost, where averaging both orders
    doubled it."""
    return [(a, b) if a <= b else (b, a) for a, b in pairs]


class CrossPairScoring(EncoderRows[PairScores]):
    """Pairs in, P(duplicate) per pair out. The rows the backend gives are the classifier's
    probabilities, from its output `probabilities_output` (the model's declared output is the
    one-column probability that KServe clients read)."""

    takes_pairs = True

    def __init__(self, config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                 tokenizer: Tokenizer) -> None:
        super().__init__(config, backends, stats, tokenizer)
        self.column = duplicate_column(config)
        self.threshold = config.parameter("threshold", 0.5)
        self.hints = config.parameter("hints", False)  # trained with features.pair_hint
        self.read_signals = lru_cache(maxsize=SIGNALS_KEPT)(text_signals)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[Array]:
        if pairs is None:
            raise InvalidInput(f"model '{self.config.name}' scores pairs of texts: send both "
                               "inputs, 'text' and 'text_pair'")
        both = in_order(list(zip(texts, pairs, strict=True)))
        return self.tokenize_pairs(hinted(both, self.read_signals) if self.hints else both)

    def encode_ids(self, rows: Sequence[Sequence[int]]) -> list[Array]:
        raise InvalidInput(f"model '{self.config.name}' scores pairs of texts; it takes text, "
                           "not token ids")

    def output_read(self, config: ModelConfig, backends: Sequence[Backend]) -> str:
        return graph_output(config, backends,
                            config.parameter("probabilities_output", "probabilities"),
                            "parameters.probabilities_output")

    def split(self, outputs: dict[str, Array], payloads: Sequence[Array]) -> Sequence[Array]:
        return list(outputs[self.reads][:, self.column])

    def check_options(self, inputs: Inputs) -> None:
        pair_threshold(inputs, self.threshold)

    def result(self, inputs: Inputs, rows: Sequence[Array], tokens: int) -> PairScores:
        return pair_scores(inputs, [float(r) for r in rows], tokens, self.threshold)

    def tensors(self, result: PairScores) -> dict[str, Array]:
        return {self.output_name: result.probabilities.reshape(-1, 1)}

