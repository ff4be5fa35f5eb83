"""The real ONNX model through the real pipeline and scheduler, in process (no HTTP)."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from queryserve.api import Embeddings, Inputs
from queryserve.repository import ModelRepository, threads_per_instance
from tests.conftest import REPOSITORY

LONG = ("i would like you to find me a song that was played on the radio yesterday morning "
        "about a long road trip across the country with friends and a dog")


# One loop for the module, as in the server: a scheduler serves the loop it first ran on.
LOOP = asyncio.new_event_loop()


@pytest.fixture(scope="module")
def repository() -> Iterator[ModelRepository]:
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default model is not prepared: run `make prepare` (make test does)")
    repo = ModelRepository(REPOSITORY, cores=2)
    LOOP.run_until_complete(repo.load("embed"))
    yield repo
    LOOP.run_until_complete(repo.close())


def embed(repository: ModelRepository, texts: list[str]) -> np.ndarray:
    model = repository.get("embed").answering(Embeddings, "this test")
    return LOOP.run_until_complete(model.infer(Inputs(texts))).vectors


def test_vectors_are_unit_length_and_distinct(repository: ModelRepository) -> None:
    vectors = embed(repository, ["play some jazz", "set an alarm for six", "play jazz music"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    similar, different = vectors[0] @ vectors[2], vectors[0] @ vectors[1]
    assert similar > 0.7 > different


def test_a_query_gets_the_same_vector_alone_or_batched_with_a_long_one(
        repository: ModelRepository) -> None:
    alone = embed(repository, ["wake me up at five am"])[0]
    batched = embed(repository, [LONG, "wake me up at five am", "hi"])[1]
    # padding must not leak into the pooled vector; only quantization noise may differ
    assert float(alone @ batched) > 0.995


def test_instances_times_threads_never_exceed_the_cores(tmp_path: Path) -> None:
    assert threads_per_instance(1, 2) == 2
    assert threads_per_instance(2, 2) == 1
    assert threads_per_instance(4, 2) == 1  # oversubscribed: warned about, never zero
    folder = tmp_path / "embed"
    shutil.copytree(REPOSITORY / "embed", folder,
                    ignore=shutil.ignore_patterns("variants", "prepare.json"))
    yaml = re.sub(r"count: \d+", "count: 2", (folder / "model.yaml").read_text())
    (folder / "model.yaml").write_text(yaml)
    repo = ModelRepository(tmp_path, cores=2)
    model = repo.build("embed")
    assert model.threads == 1 and len(model.pipeline.scheduler.instances) == 2  # type: ignore[attr-defined]


def test_a_cuda_session_that_cannot_start_cuda_is_made_again_for_the_cpu(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """onnxruntime-gpu where CUDA's libraries or the device are missing falls back to the CPU
    with the graph fused as for CUDA (SkipLayerNormalization), 1.32x slower there
    (benchmarks/cuda_fallback.py, BENCHMARKS.md). The backend then makes a CPU session and
    says so. Here the CPU build refuses CUDA the same way (a provider it cannot start), and the
    same branch runs: the graph the session runs is the CPU's."""
    import onnx
    import onnxruntime as ort

    from queryserve.backends.onnxruntime import _cuda_session

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")  # the last session's
    with caplog.at_level("WARNING", logger="queryserve.backends.onnxruntime"):
        session = _cuda_session("embed", REPOSITORY / "embed" / "model.onnx", options)
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert "model 'embed': this onnxruntime build has CUDA but could not start it" in caplog.text
    ops = {node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}
    assert "LayerNormalization" in ops and "SkipLayerNormalization" not in ops


def _graph(path: Path, inputs: dict[str, int], output_shape: list[int | str]) -> None:
    """A tiny ONNX graph: its inputs (name: element type) in, one float output `embedding` of
    `output_shape` out (the ids' sum, broadcast)."""
    import onnx
    from onnx import TensorProto, helper

    first = next(iter(inputs))
    nodes = [helper.make_node("Cast", [first], ["as_float"], to=TensorProto.FLOAT),
             helper.make_node("Expand", ["as_float", "shape"], ["embedding"])]
    shape = helper.make_tensor("shape", TensorProto.INT64, [len(output_shape)],
                               [1] * len(output_shape))
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info(name, kind, ["batch", "tokens"])
         for name, kind in inputs.items()],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, output_shape)],
        [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize(("inputs", "output_shape", "said"), [
    ({"ids": 7}, ["batch", 8], "model.onnx takes input 'ids' (tensor(int64)); queryserve feeds"),
    ({"input_ids": 6}, ["batch", 8], "takes input 'input_ids' (tensor(int32))"),
    ({"input_ids": 7, "position_ids": 7}, ["batch", 8], "takes input 'position_ids'"),
    ({"input_ids": 7}, ["batch", "tokens", 8],
     "output 'embedding' has dims [8], but model.onnx gives 2 dimension(s) an item "
     "(['tokens', 8]); a text encoder exported without its pooling"),
])
def test_a_graph_the_pipeline_cannot_feed_or_read_is_refused_at_load(
        tmp_path: Path, inputs: dict[str, int], output_shape: list[int | str],
        said: str) -> None:
    """A user's own export: inputs named otherwise, int32 ids or an extra input failed the
    first batch and were refused as a `max_sequence_length` too long; an export without its
    pooling loaded and served each text padded to its batch-mates' length."""
    from queryserve.backends.onnxruntime import OnnxRuntimeBackend
    from queryserve.config import load_model_config
    from queryserve.errors import ConfigError

    _graph(tmp_path / "model.onnx", inputs, output_shape)
    (tmp_path / "model.yaml").write_text(
        "backend: onnxruntime\nmax_batch_size: 8\n"
        "input: [{name: text, datatype: BYTES, dims: [1]}]\n"
        "output: [{name: embedding, datatype: FP32, dims: [8]}]\n")
    with pytest.raises(ConfigError, match=re.escape(said)):
        OnnxRuntimeBackend(load_model_config(tmp_path / "model.yaml"), 1)
