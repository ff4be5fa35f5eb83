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
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import numpy as np

from queryserve.api import Embeddings, Inputs, decode_texts
from queryserve.config import MODEL_FILE, ModelConfig, TensorSpec, load_model_config
from queryserve.errors import ConfigError, InvalidInput, QueryServeError
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
        self._pid = os.getpid()
        # Released when nothing holds it any more, or at exit, if not closed before: each
        # unclosed `open_model(...).infer(...)` kept an instance thread and its sessions
        # (20 of them: 20 threads, +237 MB), and one left running at exit could abort it.
        self._release = weakref.finalize(self, _release, model, self._loop, self._turn,
                                         self._pid)

    def infer(self, inputs: Inputs) -> Res:
        """One request's answer; `inputs` checked as a front end checks a request's (a bare
        string was read as one text a character, a blank text answered, pairs given to a
        model of one text a row read as pairs)."""
        return self._run(self.model.infer(_checked(inputs, self.model.config)))

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` to its end on the model's loop. Interrupted (Ctrl-C), it is cancelled: left
        queued, it slowed every later call and `close` finished it."""
        if os.getpid() != self._pid:  # its threads and loop stayed in the parent: it hung
            raise QueryServeError("this model was opened in another process (before a fork, "
                                  "as multiprocessing's Pool makes them): open it in this one")
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
        """Run what is queued to the end, then release the sessions and threads. From a
        thread that runs an event loop (Jupyter, `with` in async code), on a thread of its
        own: there it was a bare RuntimeError, which hid the error that ended the `with`, and
        the model's threads and sessions stayed."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._release()  # once: a finalizer runs at most once
        else:
            closing = threading.Thread(target=self._release, name="queryserve-close")
            closing.start()
            closing.join()

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
        config = replace(config, pipeline="text_embedding", inputs=config.inputs[:1],
                         outputs=(TensorSpec(output, "FP32", (-1,)),))
    # One instance on all the threads: the batches, and so int8's per-batch rounding of the
    # activations, are the same whatever the cores (a one-core Ray worker and a 16-core run of
    # the batch job give the same probabilities), and a long offline request keeps it busy.
    config = replace(config, instance_group=replace(config.instance_group, count=1))
    # Checked before it is built: built first, each refusal kept a thread and its sessions.
    check_answers(config, answers, f"open_model({folder})")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise InvalidInput(f"threads must be a whole number of cores >= 1, got {threads!r}")
    repository = ModelRepository(folder.parent, cores=threads or available_cores())
    try:
        model: Model[Any] = repository.assemble(config)
    except QueryServeError:
        raise
    except Exception as exc:  # the libraries' own errors for broken files, as a server says
        raise ConfigError(f"{folder} cannot be built from its files: {type(exc).__name__}: "
                          f"{exc}"[:400]) from exc
    return LocalModel(model)


def _checked(inputs: Inputs, config: ModelConfig) -> Inputs:
    """`inputs` as the front ends hand a request on: texts (and pairs, for a model that takes
    them, as many), each a non-blank string."""
    if not isinstance(inputs, Inputs):
        raise InvalidInput(f"infer takes an Inputs, e.g. Inputs([\"play some jazz\"]), not "
                           f"a {type(inputs).__name__}")
    if inputs.token_ids is not None:  # checked against the vocabulary by the model
        return inputs
    texts = decode_texts(_rows(inputs.texts, "texts"), "texts")
    if not texts:
        raise InvalidInput("Inputs.texts is empty; send at least one text")
    takes_pairs = len(config.inputs) > 1  # a classifier may take a text alone, or a pair
    if inputs.pairs is None:
        if config.pipeline == "pair_scoring":
            raise InvalidInput(f"model '{config.name}' scores pairs of texts: "
                               "Inputs(texts, pairs)")
        return replace(inputs, texts=texts)
    if not takes_pairs:
        raise InvalidInput(f"model '{config.name}' takes one text a row, not pairs")
    pairs = decode_texts(_rows(inputs.pairs, "pairs"), "pairs")
    if len(pairs) != len(texts):
        raise InvalidInput(f"texts and pairs must hold as many rows; got {len(texts)} and "
                           f"{len(pairs)}")
    return replace(inputs, texts=texts, pairs=pairs)


def _rows(given: object, name: str) -> list[object]:
    if isinstance(given, str | bytes) or not isinstance(given, Sequence | np.ndarray):
        raise InvalidInput(f"Inputs.{name} must be a list of texts, e.g. [\"play some jazz\"]; "
                           f"got a {type(given).__name__}")
    return list(np.ravel(given)) if isinstance(given, np.ndarray) else list(given)


def _release(model: Model[Any], loop: asyncio.AbstractEventLoop, turn: threading.Lock,
             pid: int) -> None:
    """A `LocalModel`'s closing, which must not hold the `LocalModel` (its finalizer)."""
    with turn:
        if not loop.is_closed() and os.getpid() == pid:
            # On the loop: a model that never ran a request has no loop of its own yet.
            loop.run_until_complete(_closed(model))
            loop.close()


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
