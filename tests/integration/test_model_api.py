"""The model API in process: `Model.infer` over the real repository, pipeline and scheduler, with
the deterministic fake backend standing in for the runtime (its compute time and a poison token
are set per model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from queryserve.api import Corrections, Embeddings, Inputs
from queryserve.errors import InvalidInput, ModelFailed, QueryServeError, Unavailable
from queryserve.repository import ModelRepository
from tests.conftest import minilm_dir, write_fake_model

POISON = "explode"


def poison_token_id() -> int:
    return int(Tokenizer.from_file(str(minilm_dir() / "tokenizer.json")).encode(POISON).ids[1])


async def test_a_failed_item_cancels_the_request_s_other_items(tmp_path: Path) -> None:
    """Regression: when one item of a request failed, its siblings still ran for nothing."""
    # Batches of one 3-token text (the token budget), turns of two: the poisoned text and the
    # next one are queued together, in batches of their own.
    write_fake_model(tmp_path, "one", max_batch_size=4, max_batch_tokens=3, delay_ms=20,
                     fail_on=poison_token_id())
    repository = ModelRepository(tmp_path, cores=1)
    model = (await repository.load("one")).answering(Embeddings, "this test")
    texts = [POISON, "jazz", "rock", "pop", "blues", "soul", "funk", "folk", "metal", "punk"]
    assert {len(model.pipeline.encode([t], None)[0]) for t in texts} == {3}  # type: ignore[attr-defined]
    with pytest.raises(ModelFailed):
        await model.infer(Inputs(texts))
    await asyncio.sleep(0.1)
    assert model.stats.inference_count == 0  # the sibling queued with it never ran
    assert model.stats.outcomes["failed"] == 1
    await repository.close()


async def test_a_large_request_goes_in_turns_and_a_small_one_runs_between(
        tmp_path: Path) -> None:
    write_fake_model(tmp_path, "turns", max_batch_size=4, max_queue_size=8, delay_ms=10)
    repository = ModelRepository(tmp_path, cores=1)
    model = (await repository.load("turns")).answering(Embeddings, "this test")
    large = asyncio.ensure_future(model.infer(Inputs([f"large {i}" for i in range(40)])))
    await asyncio.sleep(0.03)
    small = await model.infer(Inputs(["small"]))  # the queue (8) never held the 40
    assert not large.done() and small.vectors.shape == (1, 16)
    assert (await large).vectors.shape == (40, 16)
    await repository.close()


async def test_a_model_of_another_kind_is_the_client_s_mistake(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "vectors")
    repository = ModelRepository(tmp_path, cores=1)
    model = await repository.load("vectors")

    with pytest.raises(InvalidInput, match="text_embedding model; /v1/spell serves text2text "
                                           "and spelling models only"):
        model.answering(Corrections, "/v1/spell")
    await repository.close()


async def test_an_unload_asked_during_a_reload_is_not_undone_by_it(tmp_path: Path) -> None:
    """Regression: the unload took the old model out while the reload was building, then the
    build was installed: the unload, answered 200, was undone."""
    write_fake_model(tmp_path, "slow", delay_ms=300)
    with (tmp_path / "slow" / "model.yaml").open("a") as config:
        config.write("model_warmup: [{name: one, batch_size: 1, text: warm}]\n")
    repository = ModelRepository(tmp_path, cores=1)
    await repository.load("slow")
    reloading = asyncio.ensure_future(repository.load("slow"))  # 0.3 s of warmup
    await asyncio.sleep(0.05)
    await repository.unload("slow")  # after the reload, in the order asked
    assert reloading.done()
    assert "slow" not in repository.models
    # The names' locks are gone once their changes are: kept, every name a client sent to
    # load or unload stayed for the server's life, unknown and malformed ones too (100 gRPC
    # unloads of 2 MB names: +250 MB).
    for name in ("nobody", "x" * 10_000, "../slow"):
        for change in (repository.load, repository.unload):
            with pytest.raises(QueryServeError):
                await change(name)
    assert len(repository._changes) == 0
    await repository.close()


async def test_a_request_a_reload_overtakes_is_answered_by_the_new_model(tmp_path: Path) -> None:
    """A request of more than 32 texts is tokenized off the loop; a reload that swapped the
    model in the meantime had it refused, 503 "unloading" (1 in 2 such requests during
    back-to-back reloads), though the model was only replaced."""
    write_fake_model(tmp_path, "swapped")
    repository = ModelRepository(tmp_path, cores=1)
    old = await repository.load("swapped")
    new = await asyncio.to_thread(repository.build, "swapped")
    texts = [f"text {i}" for i in range(40)]
    asked = asyncio.ensure_future(old.answering(Embeddings, "this test").infer(Inputs(texts)))
    await asyncio.sleep(0)  # the request is being tokenized on a thread
    repository.install(new)
    assert (await asked).vectors.shape == (40, 16)
    assert new.stats.inference_count == 40
    await repository.unload("swapped")  # unloaded, not replaced: refused
    with pytest.raises(Unavailable, match="unloading"):
        await new.answering(Embeddings, "this test").infer(Inputs(texts))
    await repository.close()
