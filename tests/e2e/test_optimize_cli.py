"""`queryserve optimize` end to end: real Hugging Face folders in, servable model folders out.

The folders are the MiniLM package itself (embed) and a classifier made here from it: MiniLM
with a sequence-classification head whose rows are the class centroids of MASSIVE training
utterances (a nearest-centroid classifier: real weights, real text, built in seconds). Each
optimized folder is served by a real server and queried over HTTP. A deliberately damaged
recipe checks the gate the other way: refused, then written only with --force.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from queryserve import cli
from queryserve.optimize import recipes
from tests.conftest import ROOT, minilm_dir, start_server, stop_server

DATA = ROOT / "data" / "massive-en"
LABELS = 5
FAST = ("--timing-seconds", "0.05", "--no-progress")


def massive(split: str, limit: int) -> list[dict[str, object]]:
    with (DATA / f"{split}.jsonl").open(encoding="utf-8") as lines:
        return [json.loads(line) for _, line in zip(range(limit), lines, strict=False)]


@pytest.fixture(scope="module")
def parity_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "parity.txt"
    path.write_text("\n".join(str(r["text"]) for r in massive("test", 128)) + "\n")
    return path


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM + a head of class centroids over the 5 commonest intents in 3,000 utterances."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rows = massive("train", 3000)
    common = [label for label, _ in Counter(str(r["label_text"]) for r in rows).most_common(LABELS)]
    out = tmp_path_factory.mktemp("classifier") / "intent-minilm"
    model = AutoModelForSequenceClassification.from_pretrained(
        str(minilm_dir()), num_labels=LABELS, id2label=dict(enumerate(common)),
        label2id={label: i for i, label in enumerate(common)}).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    centroids = []
    with torch.inference_mode():
        for label in common:
            texts = [str(r["text"]) for r in rows if r["label_text"] == label][:64]
            batch = tokenizer(texts, padding=True, return_tensors="pt")
            pooled = model.bert(**batch).pooler_output
            centroids.append(torch.nn.functional.normalize(pooled.mean(0), dim=0))
        model.classifier.weight.copy_(torch.stack(centroids) * 20.0)
        model.classifier.bias.zero_()
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def optimize(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queryserve", "optimize", *args],
                          capture_output=True, text=True, timeout=600)


def infer(url: str, model: str, inputs: dict[str, list[str]]) -> dict[str, object]:
    body = {"inputs": [{"name": name, "datatype": "BYTES", "shape": [len(v), 1], "data": v}
                       for name, v in inputs.items()]}
    response = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return {o["name"]: o for o in response.json()["outputs"]}


def test_embed_int8_folder_is_served_and_matches_sentence_transformers(
        tmp_path: Path, parity_file: Path) -> None:
    repo = tmp_path / "repo"
    result = optimize(str(minilm_dir()), "--task", "embed", "--precision", "int8",
                      "--out", str(repo / "minilm"), "--parity", str(parity_file), *FAST)
    assert result.returncode == 0, result.stderr
    assert "PyTorch fp32 (original)" in result.stdout and "speed-up" in result.stdout
    report = json.loads((repo / "minilm" / "prepare.json").read_text())
    assert report["task"] == "embed" and report["chosen"].startswith("int8")
    assert report["before"]["batch_1_ms"] > 0 and report["after"]["batch_32_per_s"] > 0
    assert not report["forced"]

    from sentence_transformers import SentenceTransformer

    queries = ["cheap flights to lisbon", "turn the lights off in the kitchen"]
    expected = SentenceTransformer(str(minilm_dir()), device="cpu").encode(queries)
    server = start_server(repo, tmp_path / "server.log")
    try:
        out = infer(server.url, "minilm", {"text": queries})["embedding"]
        vectors = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        cosines = (vectors * expected).sum(1) / np.linalg.norm(expected, axis=1)
        assert vectors.shape == (2, 384) and cosines.min() > 0.97, cosines
    finally:
        stop_server(server)


def test_classifier_and_pair_folders_are_served(tmp_path: Path, classifier_dir: Path,
                                                parity_file: Path) -> None:
    repo = tmp_path / "repo"
    result = optimize(str(classifier_dir), "--task", "classify", "--precision", "int8,fp32",
                      "--out", str(repo / "intent"), "--parity", str(parity_file), *FAST)
    assert result.returncode == 0, result.stderr
    report = json.loads((repo / "intent" / "prepare.json").read_text())
    chosen = next(v for v in report["variants"] if v["name"] == report["chosen"])
    assert chosen["parity"]["metric"] == "top1" and chosen["parity"]["mean"] >= 0.99

    pairs = tmp_path / "pairs.tsv"
    rows = massive("test", 200)
    pairs.write_text("".join(f"{a['text']}\t{b['text']}\n" for a, b in pairwise(rows)))
    result = optimize(str(classifier_dir), "--task", "pair", "--precision", "fp32",
                      "--out", str(repo / "pairs"), "--parity", str(pairs), *FAST)
    assert result.returncode == 0, result.stderr
    graph = onnx.load(str(repo / "pairs" / "model.onnx"), load_external_data=False)
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask",
                                                   "token_type_ids"]

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    original = AutoModelForSequenceClassification.from_pretrained(str(classifier_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(classifier_dir))
    texts = ["wake me up at seven", "what's the weather in paris"]
    others = ["set an alarm please", "will it rain tomorrow"]
    server = start_server(repo, tmp_path / "server.log")
    try:
        with torch.inference_mode():
            single = torch.softmax(original(**tokenizer(texts, padding=True,
                                                        return_tensors="pt")).logits, -1)
            paired = torch.softmax(original(**tokenizer(texts, others, padding=True,
                                                        return_tensors="pt")).logits, -1)
        out = infer(server.url, "intent", {"text": texts})["probabilities"]
        assert out["shape"] == [2, LABELS]
        probabilities = np.asarray(out["data"]).reshape(2, LABELS)
        assert (probabilities.argmax(1) == single.numpy().argmax(1)).all()
        out = infer(server.url, "pairs", {"text": texts, "text_pair": others})["probabilities"]
        np.testing.assert_allclose(np.asarray(out["data"]).reshape(2, LABELS), paired.numpy(),
                                   atol=1e-3)
        # A pair model needs both texts of each pair; an embedding route is not for it.
        response = httpx.post(f"{server.url}/v2/models/pairs/infer", timeout=30, json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": texts},
                       {"name": "text_pair", "datatype": "BYTES", "shape": [1, 1],
                        "data": others[:1]}]})
        assert response.status_code == 400 and "same number" in response.json()["error"]
        response = httpx.post(f"{server.url}/v1/embeddings", timeout=30,
                              json={"model": "intent", "input": "hello"})
        assert response.status_code == 400
        assert "text_embedding" in response.json()["error"]["message"]
    finally:
        stop_server(server)


def _damage(src: Path, dst: Path, inputs: recipes.BuildInputs | None = None) -> None:
    """Noise as large as the weights on one FFN matrix: the kind of error a broken quantizer
    makes, far outside any gate."""
    model = onnx.load(str(src))
    by_name = {i.name: i for i in model.graph.initializer}
    target = next(n for n in model.graph.node
                  if n.op_type == "MatMul" and "layer.2/intermediate" in n.name)
    weight = numpy_helper.to_array(by_name[target.input[1]])
    noise = np.random.default_rng(0).normal(0.0, weight.std(), weight.shape)
    by_name[target.input[1]].CopyFrom(
        numpy_helper.from_array((weight + noise).astype(np.float32), target.input[1]))
    onnx.save(model, str(dst))


def test_a_variant_that_misses_the_gate_is_refused_unless_forced(
        tmp_path: Path, parity_file: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    damaged = recipes.Recipe("int8-damaged", "int8", "fp32", "noise on one weight", _damage)
    monkeypatch.setattr(recipes, "RECIPES", (damaged,))
    out = tmp_path / "repo" / "minilm"
    argv = ["optimize", str(minilm_dir()), "--task", "embed", "--precision", "int8", "--out",
            str(out), "--parity", str(parity_file), *FAST]
    assert cli.main(argv) == 1
    error = capsys.readouterr().err
    assert "int8-damaged: misses by mean cosine 0." in error and "< 0.99" in error
    assert not out.exists() or not (out / "model.onnx").exists()

    assert cli.main([*argv, "--force"]) == 0
    report = json.loads((out / "prepare.json").read_text())
    assert report["forced"] and report["chosen"] == "int8-damaged"
    assert "misses by" in report["reason"]
    assert "written with --force" in capsys.readouterr().out


def cpu_compute_types() -> set[str]:
    import ctranslate2

    return set(ctranslate2.get_supported_compute_types("cpu"))


@pytest.mark.parametrize("case", ["not-a-folder", "no-config", "gpt2", "no-head", "seq2seq",
                                  "t5-as-embed", "seq2seq-calibration", "seq2seq-bf16",
                                  "empty-calibration", "bf16", "bad-precision",
                                  "another-model-in-out"])
def test_bad_input_gets_one_line(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    args = [str(folder), "--task", "embed", "--out", str(tmp_path / "repo" / "m")]
    if case == "not-a-folder":
        args[0] = str(tmp_path / "missing")
    elif case in ("gpt2", "seq2seq", "t5-as-embed", "seq2seq-calibration", "seq2seq-bf16"):
        model_type = "gpt2" if case == "gpt2" else "t5"
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        if case.startswith("seq2seq"):
            args[2] = "seq2seq"
        if case == "seq2seq-calibration":
            args += ["--calibration", str(folder / "config.json")]
        elif case == "seq2seq-bf16":
            args += ["--precision", "bf16"]
    elif case in ("no-head", "empty-calibration", "bf16", "bad-precision",
                  "another-model-in-out"):
        shutil.copytree(minilm_dir(), folder, dirs_exist_ok=True)
        if case == "another-model-in-out":  # a model `optimize` made from another folder
            (tmp_path / "repo" / "m").mkdir(parents=True)
            (tmp_path / "repo" / "m" / "model.yaml").write_text("backend: onnxruntime\n")
            (tmp_path / "repo" / "m" / "prepare.json").write_text('{"source": "/else/where"}')
        elif case == "no-head":
            args[2] = "classify"
        elif case == "empty-calibration":
            (tmp_path / "empty.txt").write_text("\n\n")
            args += ["--calibration", str(tmp_path / "empty.txt")]
        else:
            args += ["--precision", "bf16" if case == "bf16" else "int4"]
    result = optimize(*args)
    expected_code = 2 if case == "bad-precision" else 1
    assert result.returncode == expected_code, result.stderr
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert {"not-a-folder": "is not a folder", "no-config": "no config.json",
            "gpt2": "'gpt2' is not supported", "no-head": "needs a sequence-classification head",
            "seq2seq": "has a config.json but no weights",
            "t5-as-embed": "is a seq2seq model; use --task seq2seq",
            "seq2seq-calibration": "CTranslate2's int8 quantizes activations as it runs",
            # What CTranslate2 offers depends on the CPU (int16 on Intel's, not on AMD's).
            "seq2seq-bf16": f"runs {', '.join(sorted(cpu_compute_types()))}, "
                            "not int8_bfloat16, bfloat16",
            "empty-calibration": "is empty",
            "bf16": "bfloat16 MatMul", "bad-precision": "use one or more of",
            "another-model-in-out": "already holds a model made from /else/where; choose "
                                    "another folder, or pass --overwrite"}[case] in message


@pytest.mark.parametrize("family", ["distilbert", "roberta", "mpnet"])
def test_other_encoder_families_export_and_pass_fp32(tmp_path: Path, family: str,
                                                     parity_file: Path) -> None:
    """Small randomly initialised models of each family (no other checkpoints ship here):
    the export, pooling and gate run for each; the real-weights case is MiniLM above."""
    from transformers import (
        DistilBertConfig,
        DistilBertModel,
        MPNetConfig,
        MPNetModel,
        RobertaConfig,
        RobertaModel,
    )

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128}
    model = {
        "distilbert": lambda: DistilBertModel(DistilBertConfig(dim=64, n_layers=2, n_heads=4,
                                                               hidden_dim=128)),
        "roberta": lambda: RobertaModel(RobertaConfig(**small, max_position_embeddings=258,
                                                      type_vocab_size=1, pad_token_id=1)),
        "mpnet": lambda: MPNetModel(MPNetConfig(**small, vocab_size=30527)),
    }[family]()
    folder = tmp_path / family
    model.save_pretrained(str(folder))
    shutil.copy(minilm_dir() / "tokenizer.json", folder)
    result = optimize(str(folder), "--task", "embed", "--precision", "fp32", "--out",
                      str(tmp_path / "repo" / family), "--parity", str(parity_file), *FAST)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "repo" / family / "prepare.json").read_text())
    chosen = next(v for v in report["variants"] if v["name"] == report["chosen"])
    assert chosen["parity"]["mean"] >= 0.9999
