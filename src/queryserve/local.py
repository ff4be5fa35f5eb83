"""A served model folder run in this process: the tools' one entry point to the runtime.

`open_model(folder, Embeddings)` builds the model as the server builds it (backends, pipeline,
warmup: `ModelRepository.assemble`), and `LocalModel.infer(Inputs)` runs a request through the
very code a served request takes: encode -> the scheduler's batches, length-sorted and cut by
the model's `max_batch_size` and `max_batch_tokens` -> the backend on its instances' threads ->
the typed answer (`queryserve.api`). Synchronously, on an event loop of the model's own. vLLM's
offline `LLM` beside its server is the model: the batch job, the search index, the evaluations
and the tests run what is served, not a copy of it that could drift from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import numpy as np

from queryserve.api import Embeddings, Inputs
from queryserve.config import MODEL_FILE, TensorSpec, load_model_config
from queryserve.errors import ConfigError, QueryServeError
from queryserve.model import Model, check_answers
from queryserve.repository import ModelRepository, available_cores
from queryserve.types import Array

Res = TypeVar("Res")
T = TypeVar("T")

PART = 2048
"""Rows per request in `infer_parts`: a progress bar moves every part, and a part is long
enough for the length sort to leave little padding."""


class LocalModel(Generic[Res]):
    """A model answering in this process; close it (or use `with`) to release its sessions.
    Any thread may call it, one request at a time; from code that runs an event loop itself
    (Jupyter, an async application), through a thread: `await asyncio.to_thread(model.infer,
    inputs)`."""

    def __init__(self, model: Model[Res]) -> None:
        self.model = model
        self._loop = asyncio.new_event_loop()
        self._turn = threading.Lock()  # the loop runs one request at a time

    def infer(self, inputs: Inputs) -> Res:
        """One request's answer."""
        return self._run(self.model.infer(inputs))

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` to its end on the model's loop. Interrupted (Ctrl-C), it is cancelled: left
        queued, it slowed every later call and `close` finished it."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            work.close()
            raise QueryServeError("this thread runs an event loop (Jupyter, async code): call "
                                  "the model through a thread, `await asyncio.to_thread("
                                  "model.infer, inputs)`")
        with self._turn:
            if self._loop.is_closed():
                work.close()
                raise QueryServeError("the model is closed")
            task = self._loop.create_task(work)
            try:
                return self._loop.run_until_complete(task)
            except BaseException:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        self._loop.run_until_complete(task)
                raise

    def infer_parts(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                    on_rows: Callable[[int], None] | None = None) -> list[Res]:
        """`infer` over `texts` (and `pairs`) in requests of `PART` rows, one answer each;
        `on_rows` hears how many rows each one answered (a progress bar)."""
        answers = []
        for start in range(0, len(texts), PART):
            part = texts[start:start + PART]
            answers.append(self.infer(Inputs(
                part, None if pairs is None else pairs[start:start + PART])))
            if on_rows:
                on_rows(len(part))
        return answers

    def close(self) -> None:
        """Run what is queued to the end, then release the sessions and threads."""
        with self._turn:
            if not self._loop.is_closed():
                # On the loop: a model that never ran a request has no loop of its own yet.
                self._loop.run_until_complete(_closed(self.model))
                self._loop.close()

    def __enter__(self) -> LocalModel[Res]:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def open_model(folder: Path, answers: type[Res], *, threads: int | None = None,
               encoder: bool = False) -> LocalModel[Res]:
    """The served model in `folder`, run here on `threads` cores (all this process may use by
    default), answering `answers` (a model of another kind is refused). `encoder=True` opens a
    `pair_scoring` bi-encoder's encoder alone, as a `text_embedding` model (a `text_embedding`
    model opens as itself): what the duplicates batch job embeds each product with once."""
    if not (folder / MODEL_FILE).is_file():
        raise ConfigError(f"{folder} is not a served model folder (no {MODEL_FILE}); "
                          "`queryserve prepare` or `queryserve optimize` makes one")
    config = load_model_config(folder / MODEL_FILE)
    if encoder and config.pipeline == "pair_scoring":
        output = config.parameter("embedding_output", "embedding")
        config = replace(config, pipeline="text_embedding",
                         outputs=(TensorSpec(output, "FP32", (-1,)),))
    # One instance on all the threads: the batches, and so int8's per-batch rounding of the
    # activations, are the same whatever the cores (a one-core Ray worker and a 16-core run of
    # the batch job give the same probabilities), and a long offline request keeps it busy.
    config = replace(config, instance_group=replace(config.instance_group, count=1))
    # Checked before it is built: built first, each refusal kept a thread and its sessions.
    check_answers(config, answers, f"open_model({folder})")
    repository = ModelRepository(folder.parent, cores=threads or available_cores())
    model: Model[Any] = repository.assemble(config)
    return LocalModel(model)


async def _closed(model: Model[Any]) -> None:
    await model.close()


def embed(folder: Path, texts: Sequence[str], *, threads: int | None = None,
          on_rows: Callable[[int], None] | None = None) -> Array:
    """The unit vectors [n, width] the served encoder in `folder` (a `text_embedding` model, or
    a `pair_scoring` bi-encoder's encoder) gives `texts`: the search index's and the batch
    job's embedding."""
    with open_model(folder, Embeddings, threads=threads, encoder=True) as model:
        parts = [answer.vectors for answer in model.infer_parts(texts, on_rows=on_rows)]
        width = max(model.model.config.outputs[0].dims[-1], 0)
    return np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.float32)
