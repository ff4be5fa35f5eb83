"""The model API (`queryserve.model`): every kind of model answers one type, and the server
reaches a model's pipeline only through the model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, get_args

import pytest

from queryserve.api import Classifications, Corrections, Embeddings
from queryserve.config import ModelConfig, PipelineKind, TensorSpec
from queryserve.errors import InvalidInput
from queryserve.model import ANSWERS, Model, pipelines_answering
from queryserve.scheduling.stats import ModelStats, request_recorded

SPELL = ModelConfig(
    name="spell", path=Path("."), backend="fake", pipeline="spelling", max_batch_size=8,
    inputs=(TensorSpec("text", "BYTES", (1,)),), outputs=(TensorSpec("corrected", "BYTES", (1,)),))


class StandInPipeline:
    """Records what the model asked of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.queue_depth = 4

    def close(self) -> asyncio.Future[None]:
        self.calls.append("close")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def abort(self) -> None:
        self.calls.append("abort")


def test_every_pipeline_kind_answers_one_type() -> None:
    assert sorted(ANSWERS) == sorted(get_args(PipelineKind))


def test_pipelines_answering_lists_the_kinds_of_one_answer() -> None:
    assert pipelines_answering(Corrections) == ("text2text", "spelling")
    assert pipelines_answering(Classifications) == ("text_classification",)


def test_a_model_of_another_kind_is_the_clients_mistake() -> None:
    model: Model[Any] = Model(SPELL, StandInPipeline(), ModelStats(), 1)  # type: ignore[arg-type]
    assert model.answering(Corrections, "/v1/spell") is model
    with pytest.raises(InvalidInput, match="is a spelling model; /v1/embed serves "
                                           "text_embedding models only"):
        model.answering(Embeddings, "/v1/embed")


async def test_the_model_answers_for_its_pipeline() -> None:
    pipeline = StandInPipeline()
    model: Model[Any] = Model(SPELL, pipeline, ModelStats(), 1)  # type: ignore[arg-type]
    assert model.queue_depth == 4
    await model.close()
    model.abort()
    assert pipeline.calls == ["close", "abort"]


def test_a_request_that_fails_with_a_bug_is_counted_failed() -> None:
    """Regression: an exception that is no QueryServeError (a 500) was counted a success,
    its time in the success latencies."""
    stats = ModelStats()
    with pytest.raises(RuntimeError), request_recorded(stats):
        raise RuntimeError("a bug")
    with pytest.raises(InvalidInput), request_recorded(stats):
        raise InvalidInput("bad")
    with request_recorded(stats):
        pass
    assert stats.outcomes == {"failed": 1, "invalid": 1, "success": 1}
