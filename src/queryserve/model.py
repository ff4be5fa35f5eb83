"""A served model: its config, its pipeline and its statistics behind one call,
`await model.infer(Inputs) -> result`.

This is the model API every front end uses. The model records its own requests (count, outcome,
latency), so a protocol added later cannot forget to; the search ensemble is a `Model` too, and
its steps are counted on their own models, as Triton counts an ensemble's composing models.
Nothing outside reaches through a model to its pipeline: what the server asks of one (its
queue, its close) the model answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from queryserve.api import (
    Classifications,
    Corrections,
    Embeddings,
    Inputs,
    PairScores,
    Searches,
)
from queryserve.config import ModelConfig, PipelineKind
from queryserve.errors import InvalidInput, Retired
from queryserve.scheduling.stats import ModelStats, request_recorded
from queryserve.types import Array

Res = TypeVar("Res")
T = TypeVar("T")


ANSWERS: Mapping[PipelineKind, type] = {
    "text_embedding": Embeddings,
    "text_classification": Classifications,
    "pair_scoring": PairScores,
    "text2text": Corrections,
    "spelling": Corrections,
    "search": Searches,
}
"""What each `pipeline:` answers (`queryserve.api`): a front end asks for a model by it. Every
`config.PipelineKind` has its row (`tests/unit/test_model.py` checks)."""


def pipelines_answering(kind: type) -> tuple[PipelineKind, ...]:
    """The pipeline kinds whose models answer `kind`, as error messages list them."""
    return tuple(pipeline for pipeline, answer in ANSWERS.items() if answer is kind)


class Pipeline(Protocol[Res]):
    """What a model runs: a text pipeline over a scheduler, or the search ensemble."""

    config: ModelConfig

    @property
    def queue_depth(self) -> int: ...

    def warmup(self) -> None: ...

    def ready(self) -> bool: ...

    async def infer(self, inputs: Inputs) -> Res: ...

    def tensors(self, result: Res) -> dict[str, Array]: ...

    def close(self) -> Awaitable[None]: ...

    def abort(self) -> None: ...


def check_answers(config: ModelConfig, kind: type, route: str) -> None:
    """Refuse a model of another kind than `route` serves (one answering `kind`)."""
    if ANSWERS[config.pipeline] is not kind:
        kinds = " and ".join(pipelines_answering(kind))
        raise InvalidInput(f"model '{config.name}' is a {config.pipeline} model; {route} "
                           f"serves {kinds} models only")


@dataclass(eq=False)
class Model(Generic[Res]):
    config: ModelConfig
    pipeline: Pipeline[Res]
    stats: ModelStats
    threads: int
    replaced_by: Model[Res] | None = field(default=None, repr=False)
    """The model a reload installed in this one's place (set as this one is retired)."""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def queue_depth(self) -> int:
        """Items waiting for a batch (0 for the ensemble: its steps queue on their models)."""
        return self.pipeline.queue_depth

    def ready(self) -> bool:
        """Loaded and warmed up, and (an ensemble) every step loaded."""
        return self.pipeline.ready()

    async def infer(self, inputs: Inputs) -> Res:
        try:
            with request_recorded(self.stats):
                return await self.pipeline.infer(inputs)
        except Retired:
            # A reload swapped this model out while the request was read (a long one is
            # tokenized off the loop): the model that replaced it answers, as it answers
            # every request sent since. Refused instead, 1 in 2 requests of 33 texts got a 503
            # "unloading" during back-to-back reloads, where the model was only replaced.
            if self.replaced_by is None:
                raise
            return await self.replaced_by.infer(inputs)

    def tensors(self, result: Res) -> dict[str, Array]:
        """A result as the model's declared outputs, by name (KServe v2's tensors)."""
        return self.pipeline.tensors(result)

    def close(self) -> Awaitable[None]:
        """Take no more work and run the queue to the end (the model is retired)."""
        return self.pipeline.close()

    def abort(self) -> None:
        """Fail whatever still waits: a close that ran past its deadline."""
        self.pipeline.abort()

    def answering(self, kind: type[T], route: str) -> Model[T]:
        """This model, typed as one whose `infer` answers `kind`; a model of another kind is
        the client's mistake (it named the wrong model for the route)."""
        check_answers(self.config, kind, route)
        return self  # type: ignore[return-value]  # checked just above


AnyModel = Model[Any]
