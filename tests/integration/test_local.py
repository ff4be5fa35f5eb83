"""A model folder opened in process (`queryserve.local`): the served pipeline, run
synchronously, answering exactly what it answers one request at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from queryserve.api import Classifications, Embeddings, Inputs
from queryserve.errors import ConfigError, InvalidInput
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
