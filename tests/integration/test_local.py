"""A model folder opened in process (`queryserve.local`): the served pipeline, run
synchronously, answering exactly what it answers one request at a time."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from queryserve.api import Classifications, Embeddings, Inputs
from queryserve.errors import ConfigError, InvalidInput, QueryServeError
from queryserve.local import embed, open_model
from tests.conftest import REPOSITORY, write_fake_model

TEXTS = ["play jazz", "wake me up at seven tomorrow morning please", "lights off",
         "what is the weather like in the north of scotland this weekend", "hi"] * 9


def test_a_request_of_many_turns_answers_each_text_in_its_place(tmp_path: Path) -> None:
    """45 texts of five lengths through a model of batches of 4: queued shortest first in
    many turns, answered in the order asked, each as it is answered alone."""
    write_fake_model(tmp_path, "fake", max_batch_size=4)
    with open_model(tmp_path / "fake", Embeddings, threads=1) as model:
        together = model.infer(Inputs(TEXTS))
        alone = np.concatenate([model.infer(Inputs([t])).vectors for t in TEXTS])
        parts = model.infer_parts(TEXTS)
        assert model.model.stats.execution_count > len(TEXTS)  # batches were cut
    assert together.vectors.shape == (45, 16)
    assert np.array_equal(together.vectors, alone)
    assert np.array_equal(np.concatenate([p.vectors for p in parts]), alone)


def test_the_kind_and_the_folder_are_checked(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "fake")
    with pytest.raises(InvalidInput, match="is a text_embedding model"):
        open_model(tmp_path / "fake", Classifications)
    with pytest.raises(ConfigError, match="not a served model folder"):
        open_model(tmp_path, Embeddings)


def test_a_bi_encoder_opens_as_its_encoder() -> None:
    """The batch job embeds products with `duplicates-bi`'s encoder alone: a unit vector of the
    encoder's width per text, not the pair model's probability."""
    folder = REPOSITORY / "duplicates-bi"
    if not (folder / "model.yaml").is_file():
        pytest.fail("the default models are not prepared: run `make prepare` (make test does)")
    vectors = embed(folder, TEXTS[:5], threads=1)
    assert vectors.shape == (5, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


@pytest.mark.parametrize(("inputs", "said"), [
    # Each was answered: 14 vectors, one a character; the vector of no text; a NaN of a
    # pandas column a bare TypeError; pairs given to a model of one text a row read as pairs.
    (Inputs("play some jazz"), "Inputs.texts must be a list of texts"),
    (Inputs(["jazz", "  "]), "texts[1] is empty"),
    (Inputs(["jazz", float("nan")]), "texts[1] must be a string, got float"),
    (Inputs([]), "Inputs.texts is empty"),
    (Inputs(["a"], ["b"]), "takes one text a row, not pairs"),
    (["play some jazz"], "infer takes an Inputs"),
])
def test_a_request_is_checked_as_a_front_end_checks_it(tmp_path: Path, inputs: object,
                                                       said: str) -> None:
    write_fake_model(tmp_path, "fake")
    with open_model(tmp_path / "fake", Embeddings, threads=1) as model, \
            pytest.raises(InvalidInput, match=re.escape(said)):
        model.infer(inputs)  # type: ignore[arg-type]


def test_a_model_is_closed_from_async_code_and_refused_after_a_fork(tmp_path: Path) -> None:
    """`with open_model(...)` in async code (Jupyter): closing was a bare RuntimeError, which
    hid the clear error and left the model's threads and sessions; a model opened before a
    fork hung for ever in the child."""
    import asyncio
    import multiprocessing

    write_fake_model(tmp_path, "fake")

    async def in_a_loop() -> str:
        with pytest.raises(QueryServeError, match="this thread runs an event loop") as refused, \
                open_model(tmp_path / "fake", Embeddings, threads=1) as model:
            model.infer(Inputs(["jazz"]))
        return str(refused.value)

    threads = threading.active_count()
    assert "asyncio.to_thread" in asyncio.run(in_a_loop())
    assert threading.active_count() == threads  # closed: its instance thread ended
    with open_model(tmp_path / "fake", Embeddings, threads=1) as model:
        model.infer(Inputs(["warm"]))
        fork = multiprocessing.get_context("fork")
        reading, writing = fork.Pipe(duplex=False)
        child = fork.Process(target=_infer_in_child, args=(model, writing))
        child.start()
        assert reading.poll(30), "the child hung"
        said = reading.recv()
        child.join(10)
    assert "opened in another process" in said


def test_a_model_nobody_holds_is_released(tmp_path: Path) -> None:
    """`open_model(...).infer(...)` on one line, unclosed: each kept its instance thread and
    sessions for the process's life (20 of them: 20 threads, +237 MB)."""
    import gc

    write_fake_model(tmp_path, "fake")
    threads = threading.active_count()
    for _ in range(5):
        open_model(tmp_path / "fake", Embeddings, threads=1).infer(Inputs(["jazz"]))
    gc.collect()
    assert threading.active_count() == threads
    model = open_model(tmp_path / "fake", Embeddings, threads=1)
    model.infer(Inputs(["jazz"]))
    model.close()
    model.close()  # twice is once
    with pytest.raises(QueryServeError, match="the model is closed"):
        model.infer(Inputs(["jazz"]))


def _infer_in_child(model: object, answer: Any) -> None:
    try:
        model.infer(Inputs(["jazz"]))  # type: ignore[attr-defined]
    except QueryServeError as exc:
        answer.send(exc.message)
    else:
        answer.send("answered")
