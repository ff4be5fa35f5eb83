"""Product duplicates end to end, as a user runs them: `queryserve train duplicates` (the
bi-encoder, and the cross-encoder with `--method cross-encoder`) for a few steps on a tiny copy
of the DeepMatcher splits, a student taught by them (`--teacher`), `queryserve prepare`'s
compilation of the cross-encoder, a real server answering `/v1/duplicates` and KServe v2
`duplicates`, the default repository's cross-encoder (`duplicates`) and bi-encoder
(`duplicates-bi`), and `queryserve batch duplicates` on real product tables, blocked by the
bi-encoder and scored by the cross-encoder: run whole, stopped and resumed, killed and resumed,
and on a local Ray inside a loopback-only network namespace; and by the bi-encoder alone.

A few steps of training do not make a good detector, so the tiny runs check the plumbing and
its contracts; the committed model's F1 is in BENCHMARKS.md and its TRAINING.json.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from queryserve import cli
from queryserve.duplicates.hard_pairs import HARD_PAIRS
from queryserve.duplicates.tables import read_pairs
from queryserve.pipelines.pairs.features import FEATURES, features_array
from queryserve.pipelines.pairs.head import PairHead
from tests.conftest import REPOSITORY, ROOT, RunningServer, free_port, start_server, stop_server

SPLITS = ROOT / "data/product-matching"
RECALL, PRECISION = 0.5, 0.5  # the committed model's, on a slice of Walmart-Amazon
TABLES = SPLITS / "walmart-amazon" / "tables"
PAIRS = [["sony cyber-shot dsc-w120 7.2mp digital camera pink",
          "sony dscw120p cyber-shot 7.2 megapixel camera pink"],
         ["sony cyber-shot dsc-w120 7.2mp digital camera pink",
          "garmin nuvi 350 gps navigator"]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 60 pairs of every split of every dataset."""
    folder = tmp_path_factory.mktemp("deepmatcher")
    for split_file in SPLITS.glob("*/deepmatcher_split/*.txt"):
        target = folder / split_file.parent.parent.name / "deepmatcher_split" / split_file.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(split_file.read_text().splitlines()[:60]) + "\n")
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    """The cross-encoder."""
    out = tmp_path_factory.mktemp("train") / "duplicates"
    assert cli.main(["train", "duplicates", str(out), "--method", "cross-encoder", "--data",
                     str(data), "--max-steps", "3", "--epochs", "1", "--batch-size", "8",
                     "--device", "cpu", "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def trained_bi(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    """The bi-encoder, the default method."""
    out = tmp_path_factory.mktemp("train") / "duplicates-bi"
    assert cli.main(["train", "duplicates", str(out), "--data", str(data), "--max-steps", "3",
                     "--epochs", "1", "--batch-size", "8", "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, trained: Path) -> Path:
    from queryserve.prepare import prepare_duplicates

    repository = tmp_path_factory.mktemp("repo")
    prepare_duplicates(repository, source_dir=trained, progress=False)
    return repository


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, repository: Path) -> Iterator[RunningServer]:
    server = start_server(repository, tmp_path_factory.mktemp("server") / "server.log")
    yield server
    stop_server(server)


def test_cross_encoder_training_writes_a_classifier_and_its_figures(trained: Path) -> None:
    from queryserve.optimize.source import inspect_source

    record = json.loads((trained / "TRAINING.json").read_text())
    assert record["steps"] == 3 and record["method"] == "cross-encoder"
    assert record["device"] == "cpu" and record["recipe"]["max_length"] == 128
    assert set(record["test_f1"]) == {"abt-buy", "amazon-google", "walmart-amazon"}
    assert all(0 <= f <= 100 for f in record["test_f1"].values())
    assert 0 < record["threshold"] < 1 and record["best_epoch"] == 1
    # What `queryserve optimize --task pair` reads: a two-label classifier, 128 tokens long.
    source = inspect_source(trained, "pair")
    assert source.labels == ("different", "duplicate") and source.max_length == 128


def test_a_student_learns_from_teachers(trained: Path, data: Path, tmp_path: Path) -> None:
    """--teacher: the train products' neighbours join the labelled pairs, with the teachers'
    mean probability; the student is a cross-encoder like its teachers."""
    out = tmp_path / "student"
    assert cli.main(["train", "duplicates", str(out), "--method", "cross-encoder", "--data",
                     str(data), "--max-steps", "2", "--epochs", "1", "--batch-size", "8",
                     "--device", "cpu", "--no-progress", "--teacher", str(trained),
                     "--teacher", str(trained), "--neighbours", "2"]) == 0
    record = json.loads((out / "TRAINING.json").read_text())
    assert record["recipe"]["teachers"] == [str(trained)] * 2
    assert record["train_pairs"] == 180 and record["unlabelled_pairs"] > 60
    assert (out / "model.safetensors").is_file()
    # The teachers' own figures beside the student's, so the gap distillation leaves shows.
    taught = json.loads((trained / "TRAINING.json").read_text())
    assert record["teachers"][trained.name]["test_f1"] == taught["test_f1"]
    assert record["teachers"][trained.name]["best_epoch"] == taught["best_epoch"] == 1


def test_the_teachers_targets_kept_as_a_file(trained: Path, data: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """--targets: the teachers label once and the file teaches a second student without them
    (another machine, or students side by side); the teachers' mean is judged as one model."""
    teachers, targets = tmp_path / "teachers", tmp_path / "targets.json"
    shutil.copytree(trained, teachers / "t1")
    student = ["train", "duplicates", "--method", "cross-encoder", "--data", str(data),
               "--max-steps", "2", "--epochs", "1", "--batch-size", "8", "--device", "cpu",
               "--no-progress", "--targets", str(targets)]
    assert cli.main([*student[:2], str(tmp_path / "first"), *student[2:], "--teacher",
                     str(teachers / "t1"), "--neighbours", "2"]) == 0
    first = json.loads((tmp_path / "first" / "TRAINING.json").read_text())
    written = json.loads(targets.read_text())
    assert len(written["pairs"]) == first["unlabelled_pairs"] > 60
    assert all(0 <= target <= 1 for _, _, target in written["pairs"])
    mean = first["teachers_mean"]  # one teacher: its mean is itself, judged the same way
    assert mean == written["teachers_mean"] and mean["test_f1"] == first["teachers"]["t1"][
        "test_f1"]
    # The teachers are gone; the file still teaches, and the record says what made it.
    shutil.rmtree(teachers)
    capsys.readouterr()
    assert cli.main([*student[:2], str(tmp_path / "second"), *student[2:]]) == 0
    assert "labelling" not in capsys.readouterr().err
    second = json.loads((tmp_path / "second" / "TRAINING.json").read_text())
    assert second["unlabelled_pairs"] == first["unlabelled_pairs"]
    assert second["recipe"]["neighbours"] == 2 and second["recipe"]["teachers"] == []
    assert second["teachers"] == first["teachers"] and second["teachers_mean"] == mean
    # Refused in one line each: a file that is not there, a teacher that is no model.
    for extra, words in ((["--targets", str(tmp_path / "none.json")], "no such file"),
                         (["--teacher", str(tmp_path)], "not a trained cross-encoder")):
        assert cli.main([*student[:2], str(tmp_path / "x"), *student[2:-2], *extra]) == 1
        assert words in capsys.readouterr().err


def test_training_writes_an_encoder_a_head_and_its_figures(trained_bi: Path) -> None:
    trained = trained_bi
    record = json.loads((trained / "TRAINING.json").read_text())
    assert record["steps"] == 3 and record["recipe"]["method"] == "finetune"
    assert record["device"] == "cpu"  # --device auto, and this host has no GPU
    assert set(record["test_f1"]) == {"abt-buy", "amazon-google", "walmart-amazon"}
    assert all(0 <= f <= 100 for f in record["test_f1"].values())
    head = PairHead.load(trained)
    assert head.w1.shape == (2 * 384 + 1 + len(FEATURES), 256) and 0 < head.threshold < 1
    assert set(record["dataset_thresholds"]) == set(record["test_f1_at_dataset_thresholds"]) \
        == set(record["test_f1"])
    # Read by `queryserve optimize` as mean-pooled and normalized, 64 tokens long.
    assert json.loads((trained / "sentence_bert_config.json").read_text())[
        "max_seq_length"] == 64
    assert (trained / "modules.json").is_file() and (trained / "model.safetensors").is_file()


def test_head_method_and_bad_input(data: Path, trained: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if not torch.cuda.is_available():  # asking for a GPU that is not there is an error
        for method in ("cross-encoder", "finetune"):
            assert cli.main(["train", "duplicates", str(tmp_path / "gpu"), "--data",
                             str(data), "--method", method, "--device", "cuda"]) == 1
            assert "sees no CUDA GPU" in capsys.readouterr().err
    assert cli.main(["train", "duplicates", str(tmp_path / "bi"), "--data", str(data),
                     "--no-hints"]) == 1
    assert "are for --method cross-encoder" in capsys.readouterr().err
    out = tmp_path / "head"
    assert cli.main(["train", "duplicates", str(out), "--method", "head", "--data", str(data),
                     "--epochs", "1", "--no-progress"]) == 0
    assert json.loads((out / "TRAINING.json").read_text())["recipe"]["method"] == "head"
    assert (out / "head.npz").is_file() and not (out / "model.safetensors").exists()
    assert cli.main(["train", "duplicates", str(trained), "--data", str(data)]) == 1
    assert "already holds a trained model" in capsys.readouterr().err
    # A time budget spent before the first step (loading alone takes longer) writes no model:
    # the starting weights would pass for a trained one.
    late = tmp_path / "late"
    assert cli.main(["train", "duplicates", str(late), "--method", "cross-encoder", "--data",
                     str(data), "--minutes", "0.0001", "--device", "cpu", "--no-progress"]) == 1
    assert "budget ran out before the first step" in capsys.readouterr().err
    assert not late.exists()
    assert cli.main(["train", "duplicates", str(tmp_path / "x"), "--data", str(tmp_path)]) == 1
    assert "train.txt is missing" in capsys.readouterr().err


def test_served_probabilities_are_the_models_own(served: RunningServer, repository: Path,
                                                 trained: Path) -> None:
    """The served cross-encoder gives what the trained PyTorch model gives (to int8's
    rounding), and what the batch job's in-process scoring gives (exactly)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from queryserve.api import Inputs, PairScores
    from queryserve.local import open_model
    from queryserve.pipelines.pairs.features import hinted

    # The model was trained with hints: the first segment starts with what the model numbers
    # and sizes say ("same model | sony ...").
    shown = hinted([(a, b) for a, b in PAIRS])
    assert shown[0][0].startswith("same model") and shown[1][0] == PAIRS[1][0]
    original = AutoModelForSequenceClassification.from_pretrained(str(trained)).float().eval()
    encoded = AutoTokenizer.from_pretrained(str(trained))(
        [a for a, _ in shown], [b for _, b in shown], padding=True, return_tensors="pt")
    with torch.inference_mode():
        reference = torch.softmax(original(**encoded).logits, -1)[:, 1].tolist()
    with open_model(repository / "duplicates", PairScores, threads=1) as model:
        in_process = model.infer(Inputs([a for a, _ in PAIRS],
                                        [b for _, b in PAIRS])).probabilities
    answer = httpx.post(f"{served.url}/v1/duplicates", timeout=30, json={"pairs": PAIRS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    got = [r["probability"] for r in body["results"]]
    assert got == pytest.approx(reference, abs=0.02)
    assert got == pytest.approx(in_process.tolist(), abs=1e-5)
    assert body["threshold"] == json.loads((trained / "TRAINING.json").read_text())["threshold"]
    assert [r["duplicate"] for r in body["results"]] == [p >= body["threshold"] for p in got]
    # Its gate checked the decision at that threshold, not the top-1 label's (0.5).
    report = json.loads((repository / "duplicates" / "prepare.json").read_text())
    assert {v["parity"]["threshold"] for v in report["variants"] if v["parity"]} \
        == {body["threshold"]}
    assert f"decision at {body['threshold']:g}" in report["reason"]
    # ... and held every variant to the original's decision on each hard pair.
    assert report["gate"]["hard_items"] == [p.name for p in HARD_PAIRS]
    chosen = next(v for v in report["variants"] if v["name"] == report["chosen"])
    assert [h["name"] for h in chosen["parity"]["hard"]] == report["gate"]["hard_items"]
    assert not any(h["flipped"] for h in chosen["parity"]["hard"])
    # KServe v2, as tritonclient sends it: two BYTES inputs.
    import tritonclient.http as triton

    client = triton.InferenceServerClient(served.url.removeprefix("http://"))
    inputs = []
    for name, column in (("text", [a for a, _ in PAIRS]), ("text_pair", [b for _, b in PAIRS])):
        tensor = triton.InferInput(name, [len(PAIRS), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(column, dtype=object).reshape(-1, 1))
        inputs.append(tensor)
    result = client.infer("duplicates", inputs)
    assert result.as_numpy("probability")[:, 0].tolist() == pytest.approx(got, abs=1e-4)


def test_the_bi_encoder_is_served_too(real_server: RunningServer) -> None:
    """The default repository's `duplicates-bi` (the bi-encoder, which the batch job blocks
    with) answers with what its encoder and head give when run directly; the pair's order
    does not matter to it (the head is symmetric)."""
    from queryserve.local import embed

    folder = REPOSITORY / "duplicates-bi"
    texts = [t for pair in PAIRS for t in pair]
    vectors = embed(folder, texts)
    expected = PairHead.load(folder).probability(
        vectors[0::2], vectors[1::2], features_array([(a, b) for a, b in PAIRS]))
    body = {"model": "duplicates-bi", "pairs": PAIRS}
    answer = httpx.post(f"{real_server.url}/v1/duplicates", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    got = [r["probability"] for r in answer.json()["results"]]
    assert got == pytest.approx(expected.tolist(), abs=1e-4)
    swapped = httpx.post(f"{real_server.url}/v1/duplicates", timeout=30, json={
        "model": "duplicates-bi", "pairs": [[b, a] for a, b in PAIRS]}).json()
    assert [r["probability"] for r in swapped["results"]] == pytest.approx(got, abs=1e-4)


def test_the_cross_encoder_tells_a_decisive_token(real_server: RunningServer) -> None:
    """The committed model, the default of `/v1/duplicates`, on the issue's example and the
    other hard pairs: one token apart is another product. Prepare's gate holds every variant
    to the original's decision on these, so the answer does not depend on which variant the
    host found fastest."""
    pairs = [[p.left, p.right] for p in HARD_PAIRS]
    answer = httpx.post(f"{real_server.url}/v1/duplicates", timeout=30, json={"pairs": pairs})
    results = answer.json()["results"]
    assert [r["duplicate"] for r in results] == [p.duplicate for p in HARD_PAIRS], results
    assert pairs[0] == ["apple ipod nano 8gb", "apple ipod touch 8gb"]
    threshold = json.loads((ROOT / "models/duplicates/TRAINING.json").read_text())["threshold"]
    assert answer.json()["threshold"] == threshold
    # Either order is one pair: it scored 0.21 one way and 0.59 the other.
    both = [["logitech mx518 mouse", "logitech mx-518 gaming mouse"],
            ["logitech mx-518 gaming mouse", "logitech mx518 mouse"], *pairs,
            *([b, a] for a, b in pairs)]
    answer = httpx.post(f"{real_server.url}/v1/duplicates", timeout=30, json={"pairs": both})
    probabilities = [r["probability"] for r in answer.json()["results"]]
    assert probabilities[0] == pytest.approx(probabilities[1], abs=1e-6)
    assert probabilities[2:4] == pytest.approx(probabilities[4:6], abs=1e-6)


def test_bad_duplicates_requests_are_refused_in_words(served: RunningServer) -> None:
    for body, words in [({"pairs": "a"}, '"pairs": a list'),
                        ({"pairs": []}, "'pairs' is empty"),
                        ({"pairs": [["a"]]}, "pairs[0] must be a list of two texts"),
                        ({"pairs": [["a", ""]]}, "pairs[0][1] is empty"),
                        ({"pairs": [["a", "b"]], "threshold": 2}, "'threshold' must be"),
                        ({"pairs": [["a", "b"]], "model": "nope"}, "unknown model 'nope'"),
                        # 404 as on the OpenAI routes (it was a 400 here)
                        ({"pairs": [["a", "b"]], "model": "../x"}, "unknown model '../x'")]:
        bad = httpx.post(f"{served.url}/v1/duplicates", json={"model": "duplicates", **body})
        status = 404 if "unknown model" in words else 400
        assert bad.status_code == status and words in bad.json()["error"], bad.text
    assert "Traceback" not in served.log_text()


# -- the batch job -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """200 Walmart products and 600 Amazon ones, their true matches among them."""
    import csv

    folder = tmp_path_factory.mktemp("tables")
    with (TABLES / "walmart.csv").open(newline="") as f:
        walmart = list(csv.DictReader(f, delimiter="|"))[:200]
    with (TABLES / "gt.csv").open(newline="") as f:
        matches = {r["D1"]: r["D2"] for r in csv.DictReader(f, delimiter="|")}
    wanted = {matches[r["id"]] for r in walmart if r["id"] in matches}
    with (TABLES / "amazon.csv").open(newline="") as f:
        amazon = [r for r in csv.DictReader(f, delimiter="|")]
    amazon = [r for r in amazon if r["id"] in wanted] + \
        [r for r in amazon if r["id"] not in wanted][:600 - len(wanted)]
    paths = folder / "walmart.csv", folder / "amazon.jsonl"
    with paths[0].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(walmart[0]), delimiter="|")
        writer.writeheader()
        writer.writerows(walmart)
    paths[1].write_text("".join(json.dumps(r) + "\n" for r in amazon))
    return paths


def _batch(*args: str | Path) -> list[str]:
    """The job blocked by the bi-encoder and scored by the cross-encoder (a later --model
    or --blocking wins)."""
    return [sys.executable, "-m", "queryserve", "batch", "duplicates", "--model",
            str(REPOSITORY / "duplicates"), "--blocking", str(REPOSITORY / "duplicates-bi"),
            *map(str, args), "--no-progress",
            "--min-probability", "0.05"]


def _rows(path: Path) -> list[tuple[object, ...]]:
    columns = read_pairs(path)
    return list(zip(*columns.values(), strict=True))


@pytest.fixture(scope="module")
def whole_run(tables: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (REPOSITORY / "duplicates" / "model.onnx").is_file():
        pytest.fail("the default models are not prepared: run `make prepare` (make test does)")
    out = tmp_path_factory.mktemp("whole") / "pairs.parquet"
    result = subprocess.run(_batch(*tables, out, "--part-size", "50"), capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)  # stdout is the summary alone, for a script to read
    assert summary["complete"] and summary["products"] == [200, 600]
    assert summary["neighbour_pairs"] < 200 * 600 / 10  # blocking: never all the pairs
    # The cross-encoder scores only the pairs the bi-encoder finds likely (--prefilter).
    assert summary["candidate_pairs"] < summary["neighbour_pairs"]
    assert summary["parts"] >= 4  # a run stopped after two parts leaves work to resume
    assert not out.with_name("pairs.parquet.parts").exists()  # the work folder is cleaned up
    return out


def test_batch_finds_the_true_matches(whole_run: Path, tables: tuple[Path, Path]) -> None:
    """The committed model, through the whole job, on real tables with known matches."""
    import csv

    from queryserve.duplicates.tables import read_products

    rows = _rows(whole_run)
    assert len(rows) == len({(a, b) for a, b, *_ in rows})  # no pair twice
    walmart, amazon = (set(read_products(t).ids) for t in tables)
    with (TABLES / "gt.csv").open(newline="") as f:
        truth = {(r["D1"], r["D2"]) for r in csv.DictReader(f, delimiter="|")
                 if r["D1"] in walmart and r["D2"] in amazon}
    found = {(a, b) for a, b, _, duplicate in rows if duplicate}
    assert len(truth) >= 40
    assert len(found & truth) >= RECALL * len(truth), "too few of the true matches found"
    assert len(found & truth) >= PRECISION * len(found), "too many false matches"


def test_the_bi_encoder_alone_scores_every_neighbour_pair(
        whole_run: Path, tables: tuple[Path, Path], tmp_path: Path) -> None:
    """With the bi-encoder as the model, the job blocks with it and its head scores every
    neighbour pair: faster, no prefilter; the cross-encoder's run scored fewer pairs."""
    out = tmp_path / "pairs.parquet"
    result = subprocess.run(_batch(*tables, out, "--model", REPOSITORY / "duplicates-bi"),
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["candidate_pairs"] == summary["neighbour_pairs"]
    assert len(_rows(out)) > 0
    cross = subprocess.run(_batch(tables[0], tmp_path / "o.parquet", "--blocking",
                                  REPOSITORY / "duplicates"), capture_output=True,
                           text=True, cwd=ROOT)
    assert cross.returncode == 1 and "not a prepared blocking model" in cross.stderr


def test_one_to_one_keeps_each_products_likeliest_match(
        whole_run: Path, tables: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "pairs.parquet"
    result = subprocess.run(_batch(*tables, out, "--part-size", "50", "--one-to-one"),
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rows, every = _rows(out), _rows(whole_run)
    assert [r[:3] for r in rows] == [r[:3] for r in every]  # the same pairs and probabilities
    kept = [(a, b, p) for a, b, p, duplicate in rows if duplicate]
    assert len({a for a, _, _ in kept}) == len(kept) == len({b for _, b, _ in kept})
    before = {(a, b) for a, b, _, duplicate in every if duplicate}
    assert {(a, b) for a, b, _ in kept} <= before
    for a, b, p in kept:  # each kept pair is both products' likeliest duplicate
        assert p == max(q for x, y, q, d in every if d and (x == a or y == b))
    # By default the output holds the duplicates only (it kept the pairs --one-to-one turned
    # down, as duplicate=False); the output may come after an option (it was "unrecognized").
    alone = tmp_path / "alone.parquet"
    result = subprocess.run(
        [sys.executable, "-m", "queryserve", "batch", "duplicates", "--model",
         str(REPOSITORY / "duplicates"), *map(str, tables), "--one-to-one", "--part-size", "50",
         "--no-progress", "--blocking", str(REPOSITORY / "duplicates-bi"), str(alone)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert [(a, b) for a, b, _, duplicate in _rows(alone)] == [(a, b) for a, b, _ in kept]
    one = subprocess.run(_batch(tables[0], tmp_path / "o.csv", "--one-to-one"),
                         capture_output=True, text=True, cwd=ROOT)
    assert one.returncode == 1 and "across two tables" in one.stderr


def test_a_stopped_job_resumes_to_the_same_rows(whole_run: Path, tables: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    out = tmp_path / "pairs.parquet"
    first = subprocess.run(_batch(*tables, out, "--part-size", "50", "--max-parts", "2"),
                           capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert first.returncode == 0 and "run the same command again" in first.stderr
    assert not out.exists() and len(list(out.with_name("pairs.parquet.parts").glob(
        "part-*.parquet"))) == 2
    other = subprocess.run(_batch(*tables, out, "--part-size", "49"), capture_output=True,
                           text=True, timeout=600, cwd=ROOT)
    assert other.returncode == 1 and "different job" in other.stderr  # never mixes two jobs
    # Texts made of other columns are another job too.
    other = subprocess.run(_batch(*tables, out, "--part-size", "50", "--ignore-column", "brand"),
                           capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert other.returncode == 1 and "different job" in other.stderr
    second = subprocess.run(_batch(*tables, out, "--part-size", "50"), capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["resumed"]
    assert _rows(out) == _rows(whole_run)
    again = subprocess.run(_batch(*tables, out), capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 1 and "already exists" in again.stderr  # never overwritten


def test_a_killed_job_resumes_without_lost_or_duplicated_rows(
        whole_run: Path, tables: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "pairs.parquet"
    parts = out.with_name("pairs.parquet.parts")
    job = subprocess.Popen(_batch(*tables, out, "--part-size", "50"), cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any(parts.glob("part-*.parquet")) and time.monotonic() < deadline:
            assert job.poll() is None, "the job ended before it could be killed"
            time.sleep(0.01)
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        job.wait(30)
    assert not out.exists(), "killed after the first part, before the end"
    result = subprocess.run(_batch(*tables, out, "--part-size", "50"), capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert _rows(out) == _rows(whole_run)


def test_two_ctrl_c_at_once_exit_130_and_the_job_resumes(
        whole_run: Path, tables: tuple[Path, Path], tmp_path: Path) -> None:
    """Two SIGINTs together (a Ctrl-C that `timeout` or a wrapper passes on as well): the
    second landed while the model closed, and the process aborted (exit 134, "terminate
    called without an active exception") in 5 runs of 5."""
    out = tmp_path / "pairs.parquet"
    parts = out.with_name("pairs.parquet.parts")
    job = subprocess.Popen(_batch(*tables, out, "--part-size", "50"), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any(parts.glob("part-*.parquet")) and time.monotonic() < deadline:
            assert job.poll() is None, "the job ended before it could be interrupted"
            time.sleep(0.01)
        job.send_signal(signal.SIGINT)
        job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 130, stderr
    assert stderr.strip().endswith("queryserve: interrupted; the parts scored are kept; run "
                                   "the same command again to go on")
    result = subprocess.run(_batch(*tables, out, "--part-size", "50"), capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert _rows(out) == _rows(whole_run)


def test_csv_output_and_bad_tables(whole_run: Path, tables: tuple[Path, Path],
                                   tmp_path: Path) -> None:
    out = tmp_path / "pairs.csv"
    result = subprocess.run(_batch(*tables, out, "--part-size", "50", "--threshold", "0.9"),
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "left_id,right_id,probability,duplicate"
    assert len(lines) - 1 == len(_rows(whole_run))  # the same rows (--min-probability 0.05)
    decided = [(float(p), d == "True") for *_, p, d in (line.split(",") for line in lines[1:])]
    assert all(d == (p >= 0.9) for p, d in decided)  # decided at --threshold, not the model's
    assert any(float(str(p)) < 0.9 and d for *_, p, d in _rows(whole_run))  # the model: yes
    bad = tmp_path / "bad.csv"
    bad.write_text("id,colour\n1,red\n")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    for args, words in [((bad, tmp_path / "o.csv"), "has no title column"),
                        ((binary, tmp_path / "o.csv"), "binary.csv:2: not UTF-8 text"),
                        ((tables[0], tmp_path / "o.csv", "--engine", "ray", "--ray-address",
                          f"127.0.0.1:{free_port()}"), "cannot reach the Ray cluster"),
                        ((tmp_path / "none.csv", tmp_path / "o.csv"), "does not exist"),
                        ((tables[0], tmp_path / "o.xlsx"), "must be .parquet or .csv"),
                        ((tables[0], tmp_path / "o.csv", "--threshold", "1.5"),
                         "--threshold must be a probability from 0 to 1"),
                        # Misspelt, the column stayed in the texts without a word.
                        ((tables[0], tmp_path / "o.csv", "--ignore-column", "descripton"),
                         "--ignore-column 'descripton': no input has that column"),
                        # An output that cannot be written was a traceback.
                        ((tables[0], bad / "o.csv"), "o.csv.parts: Not a directory; choose an "
                                                     "OUTPUT in a writable folder")]:
        refused = subprocess.run(_batch(*args), capture_output=True, text=True, cwd=ROOT)
        assert refused.returncode == 1 and words in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                    reason="a network namespace needs root and iproute2's `ip`")
def test_ray_engine_in_a_loopback_only_namespace(whole_run: Path, tables: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    """Ray opened listeners on every interface here even when told 127.0.0.1, so its test
    runs inside a fresh network namespace whose only interface is loopback."""
    namespace = f"queryserve-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"],
                       check=True)
        interfaces = subprocess.run(["ip", "netns", "exec", namespace, "ip", "-o", "link"],
                                    capture_output=True, text=True, check=True).stdout
        assert [line.split(":")[1].strip() for line in interfaces.splitlines()] == ["lo"]
        out = tmp_path / "pairs.parquet"
        result = subprocess.run(
            ["ip", "netns", "exec", namespace,
             *_batch(*tables, out, "--part-size", "50", "--engine", "ray")],
            capture_output=True, text=True, timeout=600, cwd=ROOT,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        assert result.returncode == 0, result.stderr[-3000:]
        # The same pairs and decisions; probabilities to float32 rounding, since Ray's workers
        # run numpy's BLAS on one thread, which sums in another order.
        ray_rows, local_rows = _rows(out), _rows(whole_run)
        assert [(a, b, d) for a, b, _, d in ray_rows] == [(a, b, d) for a, b, _, d in local_rows]
        assert [p for _, _, p, _ in ray_rows] == pytest.approx(
            [p for _, _, p, _ in local_rows], abs=1e-5)
    finally:
        subprocess.run(["ip", "netns", "delete", namespace], check=False)


def test_a_pair_of_long_texts_costs_what_a_pair_of_cut_texts_does(
        real_server: RunningServer) -> None:
    """A tokenizer truncates a pair after building every overflow window of both texts: two
    texts of 100 KB took 10 GB of the server's memory. Each text is now cut (at 16 characters
    a token the model reads) before it is tokenized, and the answer is the same."""
    def rss_mb() -> float:
        status = Path(f"/proc/{real_server.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("VmRSS:"))) / 1024

    left, right = "apple ipod nano 8gb silver " * 1000, "apple ipod touch 8gb black " * 1000
    before = rss_mb()
    answers = [httpx.post(f"{real_server.url}/v1/duplicates", timeout=60, json={
        "pairs": [[left[:n], right[:n]]]}) for n in (len(left), 4000)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert rss_mb() - before < 200, (before, rss_mb())
    assert answers[0].json()["results"] == answers[1].json()["results"]
