"""The response cache: keyed by what the model reads, a pair apart from a text, bounded in
bytes; and a model that cannot be made leaves nothing running (the model walk's findings,
each answered otherwise before)."""

from __future__ import annotations

import asyncio
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from queryserve.api import Classifications, Embeddings, Inputs
from queryserve.errors import ConfigError, InvalidInput, QueryServeError
from queryserve.local import open_model
from queryserve.repository import ModelRepository
from queryserve.scheduling.cache import LruCache
from tests.conftest import minilm_dir

CLASSIFIER = """
backend: fake
pipeline: text_classification
max_batch_size: 8
input: [{name: text, datatype: BYTES, dims: [1]}, {name: text_pair, datatype: BYTES, dims: [1]}]
output: [{name: probabilities, datatype: FP32, dims: [4]}]
response_cache: {enable: true, max_bytes: 20000}
parameters: {tokenizer_file: tokenizer.json, labels: 'a,b,c,d', max_sequence_length: 16}
"""


def test_the_cache_bounds_entries_and_bytes() -> None:
    cache: LruCache[str, bytes] = LruCache(3, 10, lambda key, value: len(value))
    for key in "abc":
        cache.put(key, b"xx")
    cache.put("d", b"xx")  # the fourth entry: the oldest goes
    assert (cache.get("a"), len(cache), cache.bytes) == (None, 3, 6)
    cache.put("e", b"x" * 7)  # 13 bytes: the two oldest go
    assert (cache.get("b"), cache.get("c"), cache.get("d")) == (None, None, b"xx")
    assert cache.bytes == 9
    cache.put("d", b"x")  # replaced: its size counted once
    assert cache.bytes == 8
    cache.put("big", b"x" * 11)  # over the whole cache: not kept, nothing evicted for it
    assert (cache.get("big"), len(cache)) == (None, 2)


def test_a_text_and_a_pair_never_share_an_entry_and_keys_are_what_the_model_reads(
        tmp_path: Path) -> None:
    folder = tmp_path / "cls"
    folder.mkdir()
    shutil.copy(minilm_dir() / "tokenizer.json", folder / "tokenizer.json")
    (folder / "model.yaml").write_text(CLASSIFIER)
    with open_model(folder, Classifications) as local:
        pipeline = local.model.pipeline
        # Keyed "3:abcdef", the text had the pair ("abc", "def")'s answer, and the other way.
        text = local.infer(Inputs(["3:abcdef"])).probabilities
        pair = local.infer(Inputs(["abc"], ["def"])).probabilities
        assert not np.allclose(text, pair)
        assert pipeline.stats.cache_hit.count == 0
        # The model reads 16 x 16 characters: a text of megabytes is kept as those (40 texts of
        # 2 MB held 150 MB), and another text of the same beginning is the same entry.
        start = "jazz " * 60
        local.infer(Inputs([start + "x" * 2_000_000]))
        local.infer(Inputs([start + "y" * 2_000_000]))
        assert pipeline.stats.cache_hit.count == 1
        assert pipeline.cache.bytes < 20_000


def test_a_model_that_fails_to_be_made_leaves_no_thread(tmp_path: Path) -> None:
    """Regression: a pipeline whose construction failed after its scheduler was made (here a
    calibration.json that does not parse) left its instances' threads running, one per
    failed load, for good."""
    folder = tmp_path / "cls"
    folder.mkdir()
    shutil.copy(minilm_dir() / "tokenizer.json", folder / "tokenizer.json")
    (folder / "model.yaml").write_text(CLASSIFIER)
    (folder / "calibration.json").write_text("{not json")
    repository = ModelRepository(tmp_path)
    before = threading.active_count()
    for _ in range(3):
        with pytest.raises(ConfigError, match=r"calibration\.json: cannot read it as JSON"):
            repository.build("cls")
    assert threading.active_count() == before


def test_a_local_model_as_a_notebook_uses_it(tmp_path: Path) -> None:
    """The observability walk's findings on `queryserve.local`, each answered otherwise
    before (in brackets)."""
    folder = tmp_path / "cls"
    folder.mkdir()
    shutil.copy(minilm_dir() / "tokenizer.json", folder / "tokenizer.json")
    (folder / "model.yaml").write_text(CLASSIFIER)
    # Opened and closed without a request ("no running event loop", the model leaked).
    with open_model(folder, Classifications):
        pass
    # The wrong kind is refused before the model is built (a thread and its sessions kept).
    before = threading.active_count()
    for _ in range(3):
        with pytest.raises(InvalidInput, match="is a text_classification model"):
            open_model(folder, Embeddings)
    assert threading.active_count() == before
    local = open_model(folder, Classifications)
    # Threads take turns ("This event loop is already running" for two of three).
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda text: local.infer(Inputs([text])), ["a", "b", "c"]))
    assert [a.probabilities.shape for a in answers] == [(1, 4)] * 3
    # numpy's numbers as options (np.int64 was refused, quoted as "2").
    import numpy as np

    top = local.infer(Inputs(["a"], parameters={"top_k": np.int64(2)})).top
    assert len(top[0]) == 2

    # From code running a loop (Jupyter), said what to do ("Cannot run the event loop while
    # another loop is running").
    async def in_a_notebook() -> None:
        with pytest.raises(QueryServeError, match=r"asyncio\.to_thread"):
            local.infer(Inputs(["a"]))
        assert (await asyncio.to_thread(local.infer, Inputs(["a"]))).probabilities.shape == (1, 4)

    asyncio.run(in_a_notebook())
    local.close()
    local.close()
    with pytest.raises(QueryServeError, match="the model is closed"):  # ("Event loop is closed")
        local.infer(Inputs(["a"]))
