"""The encoder export, its accuracy gate and the prepared model folder, on the real model.

The export and the sentence-transformers reference are computed once per module; the whole
file takes about a minute on 2 cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from queryserve.errors import ExportError
from queryserve.optimize import candidates, encoder
from queryserve.optimize.plan import ChoiceRefused, rate_of
from queryserve.optimize.recipes import RECIPES_VERSION, recipes_for
from queryserve.prepare import _already_prepared, read_utterances
from tests.conftest import ROOT, minilm_dir

DATA = ROOT / "data" / "massive-en"


def utterances(split: str, limit: int) -> list[str]:
    return read_utterances(DATA / f"{split}.jsonl", limit)


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    return minilm_dir()


@pytest.fixture(scope="module")
def tokenizer_path(hf_dir: Path) -> Path:
    return hf_dir / "tokenizer.json"


@pytest.fixture(scope="module")
def queries() -> list[str]:
    return utterances("test", 512)


@pytest.fixture(scope="module")
def reference(hf_dir: Path, queries: list[str]) -> np.ndarray:
    return encoder.reference_embeddings(hf_dir, queries)


@pytest.fixture(scope="module")
def fp32_model(tmp_path_factory: pytest.TempPathFactory, hf_dir: Path) -> Path:
    path = tmp_path_factory.mktemp("export") / "fp32.onnx"
    encoder.export_onnx(hf_dir, path)
    return path


def with_noise(fp32_model: Path, out: Path, strength: float) -> Path:
    """The export with Gaussian noise (`strength` x the weights' std) on one FFN weight."""
    model = onnx.load(str(fp32_model))
    by_name = {i.name: i for i in model.graph.initializer}
    target = next(n for n in model.graph.node
                  if n.op_type == "MatMul" and "layer.2/intermediate" in n.name)
    weight = numpy_helper.to_array(by_name[target.input[1]])
    noise = np.random.default_rng(0).normal(0.0, strength * weight.std(), weight.shape)
    by_name[target.input[1]].CopyFrom(
        numpy_helper.from_array((weight + noise).astype(np.float32), target.input[1]))
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def damaged_model(tmp_path_factory: pytest.TempPathFactory, fp32_model: Path) -> Path:
    return with_noise(fp32_model, tmp_path_factory.mktemp("damaged") / "damaged.onnx", 1.0)


def test_export_has_the_served_signature(fp32_model: Path) -> None:
    session = candidates.open_session(fp32_model)
    assert {i.name: i.type for i in session.get_inputs()} == {
        "input_ids": "tensor(int64)", "attention_mask": "tensor(int64)"}
    [output] = session.get_outputs()
    assert (output.name, output.type, output.shape[1]) == ("embedding", "tensor(float)", 384)
    # Dynamic batch and sequence axes: shapes never seen at export time run.
    for batch, seq in ((1, 20), (3, 7)):
        ids = np.full((batch, seq), 1000, dtype=np.int64)
        [out] = session.run(["embedding"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        assert out.shape == (batch, 384)


def test_fp32_export_passes_the_gate_on_real_queries(
        fp32_model: Path, tokenizer_path: Path, queries: list[str],
        reference: np.ndarray) -> None:
    assert len(queries) >= 500
    result = candidates.parity(fp32_model, tokenizer_path, queries, reference)
    assert result.passed, result.describe()
    assert result.mean >= 0.9999
    assert result.max_norm_error <= 1e-3
    assert result.batch_sizes == encoder.PARITY_BATCH_SIZES  # padding is exercised too


def test_damaged_weights_fail_the_gate(damaged_model: Path, tokenizer_path: Path,
                                       queries: list[str], reference: np.ndarray) -> None:
    for precision in ("fp32", "int8"):
        result = candidates.parity(damaged_model, tokenizer_path, queries, reference,
                                precision=precision, batch_sizes=(32,))
        assert not result.passed, result.describe()


def test_the_fp32_gate_is_stricter_than_the_reduced_one(
        tmp_path: Path, fp32_model: Path, tokenizer_path: Path, queries: list[str],
        reference: np.ndarray) -> None:
    # 5% noise on one weight (mean cosine ~0.9994): fine for int8, a bug for an fp32 export.
    path = with_noise(fp32_model, tmp_path / "slightly.onnx", 0.05)
    as_fp32 = candidates.parity(path, tokenizer_path, queries, reference, batch_sizes=(32,))
    as_int8 = candidates.parity(path, tokenizer_path, queries, reference, precision="int8",
                             batch_sizes=(32,))
    assert not as_fp32.passed and as_int8.passed, as_fp32.describe()


def test_unnormalised_output_fails_the_gate(tmp_path: Path, fp32_model: Path,
                                            tokenizer_path: Path, queries: list[str],
                                            reference: np.ndarray) -> None:
    # Cosine cannot see a scaled output, but the server relies on unit rows from the graph.
    model = onnx.load(str(fp32_model))
    last = next(n for n in model.graph.node if "embedding" in n.output)
    last.output[list(last.output).index("embedding")] = "unscaled"
    model.graph.initializer.append(numpy_helper.from_array(np.float32(2.0), "two"))
    model.graph.node.append(onnx.helper.make_node("Mul", ["unscaled", "two"], ["embedding"]))
    path = tmp_path / "scaled.onnx"
    onnx.save(model, str(path))
    result = candidates.parity(path, tokenizer_path, queries, reference, batch_sizes=(32,))
    assert result.mean > 0.9999
    assert not result.passed


def test_prepare_refuses_an_fp32_export_that_fails(tmp_path: Path, hf_dir: Path,
                                                   damaged_model: Path, queries: list[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder, "export_onnx_for",
                        lambda _source, out: shutil.copyfile(damaged_model, out))
    with pytest.raises(ExportError, match=r"fp32 .* fails its accuracy gate: mean cosine 0\."):
        encoder.prepare_encoder(hf_dir, tmp_path / "embed", parity_queries=queries,
                                calibration_texts=utterances("train", 64), progress=False)
    assert not (tmp_path / "embed" / "model.onnx").exists()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, hf_dir: Path,
             queries: list[str]) -> encoder.PrepareReport:
    # Short timing: the test checks the folder and the choice's bookkeeping, not the speeds.
    return encoder.prepare_encoder(
        hf_dir, tmp_path_factory.mktemp("repo") / "embed", parity_queries=queries,
        calibration_texts=utterances("train", 256), progress=False,
        timing_seconds=0.2, timing_rounds=1)


def test_prepare_writes_the_model_folder(prepared: encoder.PrepareReport) -> None:
    folder = prepared.model_path.parent
    assert prepared.model_path == folder / "model.onnx" and prepared.model_path.is_file()
    assert (folder / "tokenizer.json").is_file()
    document = json.loads((folder / "prepare.json").read_text())
    assert document["chosen"] == prepared.chosen
    rows = {v["name"]: v for v in document["variants"]}
    assert set(rows) == {"fp32", *(r.name for r in recipes_for(("fp32", "int8")))}
    assert rows[prepared.chosen]["passed"] and rows[prepared.chosen]["file"] == "model.onnx"
    kept = {p.name for p in (folder / "variants").iterdir()}
    for name, row in rows.items():
        if not row["passed"]:  # a variant that fails the gate is reported, never kept
            assert row["file"] is None and f"{name}.onnx" not in kept
        elif name != prepared.chosen:
            assert row["file"] == f"variants/{name}.onnx" and f"{name}.onnx" in kept
            assert set(row["queries_per_second"]) == {"batch_1", "batch_32"}
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_fused_graphs_leave_residual_adds_to_layer_normalization(
        prepared: encoder.PrepareReport) -> None:
    # ONNX Runtime's CPU SkipLayerNormalization kernel is slow (recipes.py): the fused graph
    # keeps its attention fusions but not that one, and prepare.json says which recipes built it.
    folder = prepared.model_path.parent
    graphs = {p.name: onnx.load(str(p), load_external_data=False).graph
              for p in [prepared.model_path, *(folder / "variants").glob("*.onnx")]}
    for name, graph in graphs.items():
        ops = {n.op_type for n in graph.node}
        assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops, name
    fused = [name for name, graph in graphs.items()
             if any(n.op_type in ("Attention", "QAttention") for n in graph.node)]
    assert fused, "no variant has fused attention"
    document = json.loads((folder / "prepare.json").read_text())
    assert document["recipes_version"] == RECIPES_VERSION


def test_prepare_rebuilds_an_encoder_built_by_older_recipes(
        prepared: encoder.PrepareReport, tmp_path: Path) -> None:
    folder = tmp_path / "encoder"  # no variant is committed for it (models/variants.json)
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"")
    document = json.loads((prepared.model_path.parent / "prepare.json").read_text())
    (folder / "prepare.json").write_text(json.dumps(document))
    assert _already_prepared(folder, "model.onnx", force=False)
    assert not _already_prepared(folder, "model.onnx", force=True)
    document["recipes_version"] = RECIPES_VERSION - 1
    (folder / "prepare.json").write_text(json.dumps(document))
    assert not _already_prepared(folder, "model.onnx", force=False)
    assert _already_prepared(folder, "model.onnx", force=False, encoder=False)


def test_the_committed_choice_is_built_alone_gated_and_untimed(
        tmp_path: Path, hf_dir: Path, queries: list[str]) -> None:
    """prepare's default: the variant models/variants.json commits, built and gated on this
    host with the variants it is built from (the fp32 export, the fused graph), not timed,
    served."""
    chosen = "int8-smoothquant-fused"
    report = encoder.prepare_encoder(hf_dir, tmp_path / "embed", parity_queries=queries,
                                     calibration_texts=utterances("train", 256),
                                     progress=False, only=chosen)
    assert report.chosen == chosen and "the committed choice" in report.reason
    document = json.loads(report.report_path.read_text())
    rows = {v["name"]: v for v in document["variants"]}
    assert set(rows) == {"fp32", "fp32-fused", chosen} and rows[chosen]["file"] == "model.onnx"
    assert all(not row["queries_per_second"] for row in rows.values())
    assert document["after"] is None
    assert sorted(p.name for p in (tmp_path / "embed" / "variants").iterdir()) \
        == ["fp32-fused.onnx", "fp32.onnx"]
    # A name this release has no recipe for is refused before anything is built.
    with pytest.raises(ChoiceRefused, match="no fp32/int8 recipe of this release"):
        encoder.prepare_encoder(hf_dir, tmp_path / "other", parity_queries=queries,
                                calibration_texts=[], progress=False, only="int4-magic")
    assert not (tmp_path / "other").exists()


def test_the_chosen_model_returns_unit_rows_of_384(prepared: encoder.PrepareReport,
                                                   queries: list[str]) -> None:
    folder = prepared.model_path.parent
    session = candidates.open_session(prepared.model_path)
    tokenizer = candidates.load_tokenizer(folder / "tokenizer.json")
    vectors = candidates.embed(session, tokenizer, queries[:100], 32)
    assert vectors.shape == (100, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)


def test_the_serving_path_never_imports_torch() -> None:
    heavy = ("torch", "transformers", "sentence_transformers", "onnx")
    code = ("import sys, queryserve.optimize.encoder; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_a_timed_engine_runs_the_model_as_served(fp32_model: Path, tokenizer_path: Path,
                                                 queries: list[str],
                                                 reference: np.ndarray) -> None:
    run = candidates.engine(fp32_model, tokenizer_path, threads=1)
    vectors = np.asarray(run(queries[:5]))[0]  # the session's one output
    assert vectors.shape == (5, 384)
    assert np.all(np.sum(vectors * reference[:5], axis=1) > 0.9999)
    rate = rate_of(run, queries[:64], 32, 0.05)
    assert 0 < rate < 100_000
