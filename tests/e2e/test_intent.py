"""The intent classifier end to end, as a user runs it: `queryserve train intent` for a few
steps on a tiny copy of MASSIVE (both methods), `queryserve optimize --task classify`, a real
server answering `/v1/intent`, and the default `intent` model that `make run` serves.

A few steps of training do not make a good classifier, so the tiny runs check the plumbing and
its contracts (the served labels are the model's own, in order of probability; bad input is
refused in words); the committed model's accuracy is in BENCHMARKS.md and its TRAINING.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from queryserve import cli
from tests.conftest import ROOT, RunningServer, start_server, stop_server

TINY = {"train": 300, "validation": 60, "test": 60}
QUERIES = ["wake me up at seven am", "play some jazz", "what's the weather in paris"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("massive")
    for split, rows in TINY.items():
        lines = (ROOT / "data/massive-en" / f"{split}.jsonl").read_text().splitlines()[:rows]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    out = tmp_path_factory.mktemp("train") / "intent"
    assert cli.main(["train", "intent", str(out), "--data", str(data), "--max-steps", "4",
                     "--epochs", "1", "--batch-size", "16", "--no-progress"]) == 0
    return out


def test_finetuning_writes_a_classifier_with_its_figures(trained: Path) -> None:
    record = json.loads((trained / "TRAINING.json").read_text())
    assert record["steps"] == 4 and record["recipe"]["method"] == "finetune"
    assert record["device"] == "cpu"  # --device auto, and this host has no GPU
    assert 0.0 <= record["test_accuracy"] <= 1.0 and record["best_epoch"] == 1
    config = json.loads((trained / "config.json").read_text())
    assert config["id2label"]["48"] == "alarm_set"  # MASSIVE's own label ids and names
    assert (trained / "model.safetensors").is_file() and (trained / "tokenizer.json").is_file()


def test_head_method_trains_a_head_on_the_frozen_encoder(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "head"
    assert cli.main(["train", "intent", str(out), "--method", "head", "--data", str(data),
                     "--epochs", "1", "--no-progress"]) == 0
    record = json.loads((out / "TRAINING.json").read_text())
    assert record["recipe"]["method"] == "head" and 0.0 <= record["test_accuracy"] <= 1.0
    assert (out / "head.npz").is_file()
    # The recipe recorded is what ran (it said `epochs: 1` beside a best epoch of 2).
    recipe = record["recipe"]
    assert (recipe["epochs"], recipe["batch_size"], recipe["learning_rate"]) == (40, 256, 1e-2)
    assert 1 <= record["best_epoch"] <= recipe["epochs"]


def test_bad_input_is_refused_in_one_line(trained: Path, data: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "intent", str(trained), "--data", str(data)]) == 1
    assert "already holds a trained model" in capsys.readouterr().err
    assert cli.main(["train", "intent", str(trained.parent / "x"), "--data",
                     str(trained)]) == 1
    assert "train.jsonl is missing" in capsys.readouterr().err
    # No GPU here (a CPU build of torch): --device cuda is refused before any work.
    assert cli.main(["train", "intent", str(trained.parent / "gpu"), "--data", str(data),
                     "--device", "cuda"]) == 1
    assert "PyTorch sees no CUDA GPU" in capsys.readouterr().err
    assert not (trained.parent / "gpu").exists()


def test_served_intent_answers_top_k_labels(trained: Path, data: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    repo = tmp_path / "repo"
    parity = tmp_path / "parity.txt"
    parity.write_text("\n".join(json.loads(line)["text"] for line in
                                (data / "test.jsonl").read_text().splitlines()) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "queryserve", "optimize", str(trained), "--task", "classify",
         "--precision", "fp32", "--out", str(repo / "intent"), "--parity", str(parity),
         "--timing-seconds", "0.05", "--no-progress"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    model = AutoModelForSequenceClassification.from_pretrained(str(trained)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(trained))
    with torch.inference_mode():
        probabilities = torch.softmax(
            model(**tokenizer(QUERIES, padding=True, return_tensors="pt")).logits, -1)
    expected = [[model.config.id2label[int(i)] for i in row.argsort(descending=True)[:3]]
                for row in probabilities]
    server = start_server(repo, tmp_path / "server.log")
    try:
        answer = httpx.post(f"{server.url}/v1/intent", timeout=30,
                            json={"queries": QUERIES, "top_k": 3})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [r["query"] for r in results] == QUERIES
        assert [[i["intent"] for i in r["intents"]] for r in results] == expected
        for r, row in zip(results, probabilities, strict=True):
            scores = [i["score"] for i in r["intents"]]
            assert scores == sorted(scores, reverse=True)
            assert scores == pytest.approx(sorted(row.tolist(), reverse=True)[:3], abs=1e-4)
        one = httpx.post(f"{server.url}/v1/intent", json={"queries": ["play some jazz"]})
        assert len(one.json()["results"][0]["intents"]) == 1  # top_k defaults to 1
        for body, words in [({"queries": "play"}, '"queries": a list'),
                            ({"queries": []}, "'queries' is empty"),
                            ({"queries": ["ok"], "top_k": 0}, "'top_k' must be an integer"),
                            ({"queries": ["ok"], "top_k": "3"}, "'top_k' must be an integer"),
                            ({"queries": [""]}, "queries[0] is empty")]:
            before = httpx.get(f"{server.url}/v2/models/intent/stats").json()
            bad = httpx.post(f"{server.url}/v1/intent", json=body)
            assert bad.status_code == 400 and words in bad.json()["error"], bad.text
            after = httpx.get(f"{server.url}/v2/models/intent/stats").json()
            # Refused before its items were queued: the model ran nothing for it.
            assert after["model_stats"][0]["inference_count"] == \
                before["model_stats"][0]["inference_count"]
        assert "Traceback" not in server.log_text()
    finally:
        stop_server(server)


def test_default_intent_model_labels_real_queries(real_server: RunningServer) -> None:
    """`make run`'s `intent`: the committed classifier, as `queryserve prepare` compiled it."""
    answer = httpx.post(f"{real_server.url}/v1/intent", timeout=30,
                        json={"queries": QUERIES, "top_k": 2})
    assert answer.status_code == 200, answer.text
    top = [r["intents"][0]["intent"] for r in answer.json()["results"]]
    assert top == ["alarm_set", "play_music", "weather_query"]
    wrong = httpx.post(f"{real_server.url}/v1/intent", json={"queries": ["x"], "model": "spell"})
    assert wrong.status_code == 400
    assert "text_classification models only" in wrong.json()["error"]
