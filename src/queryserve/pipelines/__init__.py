"""Pipelines: the model's pre- and post-processing around its backend, one per `pipeline:`,
and the search ensemble over other models."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, assert_never

from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.model import AnyModel, Pipeline
from queryserve.pipelines.base import load_tokenizer
from queryserve.scheduling.stats import ModelStats


def create_pipeline(config: ModelConfig, backends: Sequence[Backend], stats: ModelStats,
                    lookup: Callable[[str], AnyModel]) -> Pipeline[Any]:
    """The model's pipeline; `lookup` finds the models an ensemble runs. One branch per
    `config.PipelineKind`: mypy fails here when a kind is added without one."""
    kind = config.pipeline
    if kind == "search":
        from queryserve.pipelines.search.ensemble import SearchPipeline

        return SearchPipeline(config, lookup, stats)
    if kind == "spelling":
        from queryserve.pipelines.spelling import Spelling

        return Spelling(config, backends, stats)
    tokenizer = load_tokenizer(config)
    if kind == "pair_scoring" and config.parameter("encoder", "bi") == "cross":
        from queryserve.pipelines.pairs.cross import CrossPairScoring

        return CrossPairScoring(config, backends, stats, tokenizer)
    if kind == "pair_scoring":
        from queryserve.pipelines.pairs.scoring import PairScoring

        return PairScoring(config, backends, stats, tokenizer)
    if kind == "text2text":
        from queryserve.pipelines.text2text import TextToText

        return TextToText(config, backends, stats, tokenizer)
    from queryserve.pipelines.text_embedding import TextClassification, TextEmbedding

    if kind == "text_classification":
        return TextClassification(config, backends, stats, tokenizer)
    if kind == "text_embedding":
        return TextEmbedding(config, backends, stats, tokenizer)
    assert_never(kind)
