"""Pipelines: the model's pre- and post-processing around its backend, one per `pipeline:`,
and the search ensemble over other models."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.errors import ConfigError
from queryserve.pipelines.base import load_tokenizer
from queryserve.pipelines.model import AnyModel, Pipeline
from queryserve.scheduling.stats import ModelStats


def create_pipeline(config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                    lookup: Callable[[str], AnyModel]) -> Pipeline[Any]:
    """The model's pipeline; `lookup` finds the models an ensemble runs."""
    if config.pipeline == "search":
        from queryserve.pipelines.search.ensemble import SearchPipeline

        return SearchPipeline(config, lookup)
    if config.pipeline == "spelling":
        from queryserve.pipelines.spelling import Spelling

        return Spelling(config, backends, stats)
    if config.pipeline not in ("pair_scoring", "text2text", "text_embedding",
                               "text_classification"):
        raise ConfigError(f"{config.path / 'model.yaml'}: unknown pipeline "
                          f"{config.pipeline!r}")
    tokenizer = load_tokenizer(config)
    if config.pipeline == "pair_scoring" and config.parameter("encoder", "bi") == "cross":
        from queryserve.pipelines.pairs.cross import CrossPairScoring

        return CrossPairScoring(config, backends, stats, tokenizer)
    if config.pipeline == "pair_scoring":
        from queryserve.pipelines.pairs.scoring import PairScoring

        return PairScoring(config, backends, stats, tokenizer)
    if config.pipeline == "text2text":
        from queryserve.pipelines.text2text import TextToText

        return TextToText(config, backends, stats, tokenizer)
    from queryserve.pipelines.text_embedding import TextClassification, TextEmbedding

    if config.pipeline == "text_classification":
        return TextClassification(config, backends, stats, tokenizer)
    return TextEmbedding(config, backends, stats, tokenizer)
