"""Pipelines: the model's pre- and post-processing around its backend, one per `pipeline:`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from queryserve.backends import Backend
from queryserve.config import ModelConfig
from queryserve.pipelines.base import TextPipeline, load_tokenizer
from queryserve.scheduling.stats import ModelStats

Pipeline = TextPipeline[Any, Any]


def create_pipeline(config: ModelConfig, backends: Sequence[Backend],
                    stats: ModelStats) -> Pipeline:
    if config.pipeline == "spelling":
        from queryserve.pipelines.spelling import Spelling

        return Spelling(config, backends, stats)
    tokenizer = load_tokenizer(config)
    if config.pipeline == "pair_scoring":
        from queryserve.pipelines.pair_scoring import PairScoring

        return PairScoring(config, backends, stats, tokenizer)
    if config.pipeline == "text2text":
        from queryserve.pipelines.text2text import TextToText

        return TextToText(config, backends, stats, tokenizer)
    from queryserve.pipelines.text_embedding import TextEmbedding

    return TextEmbedding(config, backends, stats, tokenizer)
