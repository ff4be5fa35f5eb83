"""The spelling correctors end to end, as a user runs them: `queryserve train spell` for a few
steps on a tiny copy of the repository's data, `--resume`, `queryserve optimize --task
seq2seq`, `queryserve train spell-channel`, real servers answering `/v1/spell` and KServe
`spell`, and `queryserve eval spell`.

A few steps of training do not make a good corrector, so these tests check the plumbing and
its contracts (the served text is what the model generates in-process, scores are
probabilities, bad input is refused in words); the committed model's accuracy is measured in
BENCHMARKS.md by `queryserve eval spell`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from queryserve import cli
from queryserve.api import normalized
from queryserve.backends.noisy_channel.channel import NoisyChannel
from queryserve.config import load_model_config
from queryserve.spell.corrector import ServedCorrector
from tests.conftest import ROOT, RunningServer, start_server, stop_server

# A few steps at a high rate, no warm-up: enough for the model to write something.
TINY = ("--batch-size", "8", "--learning-rate", "0.01", "--warmup-steps", "1", "--d-model", "32",
        "--encoder-layers", "1", "--decoder-layers", "1")
QUERIES = ["taylor swfit", "Play Some Jazz", "wake me up at five", "sony turntable",
           "olly set an alarm"]


def tiny_data(folder: Path) -> Path:
    """The first rows of each data file the corrector reads, in the same layout."""
    data = ROOT / "data"
    for name, rows in [("billboard-hot100/hot100_songs_1997_2026.csv", 200),
                       ("catalog-titles/titles.txt", 150), ("massive-en/train.jsonl", 200),
                       ("massive-en/test.jsonl", 120), ("english-words/words.txt", 3000)]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        lines = (data / name).read_text(encoding="utf-8").splitlines()[:rows]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    errors = json.loads((data / "spelling-errors/spell_errors.json").read_text())
    (folder / "spelling-errors").mkdir()
    (folder / "spelling-errors/spell_errors.json").write_text(
        json.dumps(dict(list(errors.items())[:400])))
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    out = tmp_path_factory.mktemp("train") / "spell"
    assert cli.main(["train", "spell", str(out), "--data", str(data), "--max-steps", "4",
                     *TINY]) == 0
    return out


def test_training_writes_a_model_and_resumes(trained: Path, data: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    record = json.loads((trained / "TRAINING.json").read_text())
    assert record["steps"] == 4 and record["examples"] == 32
    assert record["recipe"]["bf16"] and record["recipe"]["seed"] == 0
    assert (trained / "model.safetensors").is_file() and (trained / "checkpoint.pt").is_file()
    # Characters in and out, the word boundary a token of its own.
    from tokenizers import Tokenizer

    chars = Tokenizer.from_file(str(trained / "tokenizer.json"))
    assert chars.encode("Jazz").tokens == ["<s>", "▁", "j", "a", "z", "z", "</s>"]

    # Training into a folder that holds a run is refused; --resume goes on to the new budget.
    argv = ["train", "spell", str(trained), "--data", str(data), *TINY]
    assert cli.main([*argv, "--max-steps", "6"]) == 1
    assert "pass --resume" in capsys.readouterr().err
    assert cli.main([*argv, "--max-steps", "6", "--resume"]) == 0
    assert json.loads((trained / "TRAINING.json").read_text())["steps"] == 6


def test_examples_written_by_workers_train_the_same_recipe(
        tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The stream a GPU run reads from DataLoader workers: pool i is the same wherever it is made.
    from queryserve.backends.noisy_channel.noise import NoiseModel
    from queryserve.spell.data import clean_texts, load_catalog, load_misspellings
    from queryserve.spell.train import Pools, Recipe, build_tokenizer

    catalog, misspellings = load_catalog(data), load_misspellings(data)
    tokenizer = build_tokenizer(clean_texts(catalog, misspellings), 3, "bart")
    pools = Pools(catalog.train, misspellings.lexicon, NoiseModel.learn(misspellings.train),
                  Recipe(batch_size=8), tokenizer)
    first, again, second = pools[0], pools[0], pools[1]
    assert len(first) == 8 and all(len(b["input_ids"]) == 8 for b in first)
    assert all((a["labels"] == b["labels"]).all() for a, b in zip(first, again, strict=True))
    assert any(a["labels"].shape != b["labels"].shape or (a["labels"] != b["labels"]).any()
               for a, b in zip(first, second, strict=True))

    out = tmp_path / "workers"
    assert cli.main(["train", "spell", str(out), "--data", str(data), "--max-steps", "3",
                     "--workers", "2", "--device", "cpu", *TINY]) == 0
    record = json.loads((out / "TRAINING.json").read_text())
    assert (record["steps"], record["workers"], record["device"]) == (3, 2, "cpu")

    # No GPU here (a CPU build of torch): --device cuda is refused, not an hour on the CPU.
    assert cli.main(["train", "spell", str(tmp_path / "gpu"), "--data", str(data),
                     "--device", "cuda", *TINY]) == 1
    assert "PyTorch sees no CUDA GPU" in capsys.readouterr().err


def test_copy_examples_put_a_web_word_the_catalog_lacks_into_a_query_and_keep_it(
        tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 43, item 3: a seq2seq that copies names it does not know, for the hybrid.
    import random

    from queryserve.backends.noisy_channel.noise import NoiseModel
    from queryserve.spell.data import load_catalog, load_misspellings, rare_words
    from queryserve.spell.train import Examples, Recipe

    catalog, misspellings = load_catalog(data), load_misspellings(data)
    typos = {typed for typed, _ in misspellings.train}
    rare = rare_words(catalog.train, misspellings.lexicon, typos)
    known = {w for q in [*catalog.train, *misspellings.lexicon] for w in q.split()}
    assert len(rare) > 1000 and not (set(rare) & (known | typos))
    noise = NoiseModel.learn(misspellings.train)
    copying = Examples(catalog.train, misspellings.lexicon, noise,
                       Recipe(word_share=0.0, clean_share=0.0, copy_share=1.0),
                       random.Random(0), rare)
    for typed, meant in (copying.one() for _ in range(200)):
        assert typed == meant
        assert sum(w not in known for w in typed.split()) >= 1
        assert typed not in catalog.train
    # The committed recipe (copy_share 0) draws the stream it drew before the option existed.
    before = Examples(catalog.train, misspellings.lexicon, noise, Recipe(), random.Random(1))
    after = Examples(catalog.train, misspellings.lexicon, noise, Recipe(), random.Random(1),
                     rare)
    assert [before.one() for _ in range(300)] == [after.one() for _ in range(300)]

    out = tmp_path / "copying"
    assert cli.main(["train", "spell", str(out), "--data", str(data), "--max-steps", "2",
                     "--copy-share", "0.3", *TINY]) == 0
    assert json.loads((out / "TRAINING.json").read_text())["recipe"]["copy_share"] == 0.3
    # With the default word and clean shares (0.45), more leaves no misspelled queries.
    assert cli.main(["train", "spell", str(tmp_path / "all"), "--data", str(data),
                     "--copy-share", "0.6", *TINY]) == 1
    assert "leaves no misspelled queries to learn from: at most 0.55" in \
        capsys.readouterr().err


def test_the_gpu_script_trains_the_development_and_served_models_side_by_side(
        tmp_path: Path, data: Path) -> None:
    # scripts/train-spell-gpu.sh as a GPU session runs it, here on the CPU for two steps.
    import os

    out = tmp_path / "gpu"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "train-spell-gpu.sh"), str(out), "--device", "cpu",
         "--workers", "0", "--max-steps", "2", "--copy-share", "0.2", "--data", str(data),
         *TINY], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr + (out / "served.log").read_text()
    records = {run: json.loads((out / run / "TRAINING.json").read_text())
               for run in ("development", "served")}
    assert {run: (r["recipe"]["development"], r["recipe"]["copy_share"], r["steps"])
            for run, r in records.items()} == {"development": (True, 0.2, 2),
                                               "served": (False, 0.2, 2)}
    assert not list(out.glob("*/checkpoint.pt"))
    assert subprocess.run(["bash", str(ROOT / "scripts" / "train-spell-gpu.sh")],
                          capture_output=True).returncode == 2


def test_resume_without_a_checkpoint_is_refused(tmp_path: Path, data: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "spell", str(tmp_path / "none"), "--data", str(data),
                     "--resume", *TINY]) == 1
    assert "no checkpoint.pt to resume from" in capsys.readouterr().err


def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path: Path, data: Path) -> None:
    """Regression: an interrupt within the first checkpoint's minutes left nothing to resume
    ("no checkpoint.pt to resume from"); `--no-progress` was refused."""
    out = tmp_path / "spell"
    command = [sys.executable, "-m", "queryserve", "train", "spell", str(out), "--data",
               str(data), "--minutes", "5", "--no-progress", *TINY]
    # SIGINT as a terminal's Ctrl-C sends it, even where this test runs with it ignored (a
    # background job): Python then installs no handler of its own.
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (out / "tokenizer.json").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # some steps in
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 130 and "checkpoint saved" in stderr, stderr
    assert cli.main(["train", "spell", str(out), "--data", str(data), "--max-steps", "1",
                     "--resume", "--no-progress", *TINY]) == 0


@pytest.fixture(scope="module")
def served_folder(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("repo") / "spell"
    result = subprocess.run(
        [sys.executable, "-m", "queryserve", "optimize", str(trained), "--task", "seq2seq",
         "--precision", "fp32", "--out", str(out), "--timing-seconds", "0.05",
         "--no-progress", "--max-output-length", "16"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "prepare.json").read_text())["chosen"] == "float32"
    return out


def test_served_spell_over_http(served_folder: Path, tmp_path: Path) -> None:
    corrector = ServedCorrector(served_folder)
    expected, generated = corrector.correct(QUERIES), corrector.generate(QUERIES)
    server = start_server(served_folder.parent, tmp_path / "server.log")
    try:
        answer = httpx.post(f"{server.url}/v1/spell", json={"queries": QUERIES}, timeout=30)
        assert answer.status_code == 200, answer.text
        corrections = answer.json()["corrections"]
        assert [c["query"] for c in corrections] == QUERIES
        assert [c["corrected"] for c in corrections] == [e.corrected for e in expected]
        for c in corrections:
            assert c["changed"] == (c["corrected"] != normalized(c["query"]))
            assert 0.0 < c["score"] <= 1.0
        assert [c["score"] for c in corrections] == pytest.approx([e.score for e in expected],
                                                                  rel=1e-4)

        import tritonclient.http as triton

        client = triton.InferenceServerClient(server.host_port)
        tensor = triton.InferInput("text", [len(QUERIES), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[q.encode()] for q in QUERIES], dtype=object))
        result = client.infer("spell", [tensor])
        texts = [v.decode() for v in result.as_numpy("generated_text").ravel()]
        assert texts == [text for text, _ in generated]  # the model's own text, as generated
        assert result.as_numpy("score").ravel() == pytest.approx(
            [score for _, score in generated], rel=1e-4)

        for body, words in [({"queries": "taylor swfit"}, '"queries": a list'),
                            ({"queries": []}, "'queries' is empty"),
                            ({"queries": ["ok", "  "]}, "queries[1] is empty"),
                            ({"queries": [7]}, "queries[0] must be a string"),
                            ({"queries": ["x"], "model": "nope"}, "nope")]:
            bad = httpx.post(f"{server.url}/v1/spell", json=body)
            assert bad.status_code in (400, 404) and words in bad.json()["error"], bad.text
        assert "Traceback" not in server.log_text()
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def channel_folder(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("channel") / "spell"
    assert cli.main(["train", "spell-channel", str(out), "--data", str(data)]) == 0
    return out


def test_channel_model_is_served_as_it_corrects_in_process(channel_folder: Path,
                                                           tmp_path: Path) -> None:
    assert load_model_config(channel_folder / "model.yaml").pipeline == "spelling"
    expected = NoisyChannel.load(channel_folder).correct(QUERIES)
    server = start_server(channel_folder.parent, tmp_path / "server.log")
    try:
        answer = httpx.post(f"{server.url}/v1/spell", json={"queries": QUERIES}, timeout=30)
        assert answer.status_code == 200, answer.text
        corrections = answer.json()["corrections"]
        assert [c["corrected"] for c in corrections] == [e.corrected for e in expected]
        assert [c["changed"] for c in corrections] == [e.changed for e in expected]
        assert [c["score"] for c in corrections] == pytest.approx([e.score for e in expected],
                                                                  rel=1e-4)
        assert all(0.0 < c["score"] <= 1.0 for c in corrections)

        import tritonclient.http as triton

        client = triton.InferenceServerClient(server.host_port)
        tensor = triton.InferInput("text", [2, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[q.encode()] for q in QUERIES[:2]], dtype=object))
        result = client.infer("spell", [tensor])
        assert [v.decode() for v in result.as_numpy("generated_text").ravel()] == \
            [e.corrected for e in expected[:2]]
        bad = httpx.post(f"{server.url}/v1/spell", json={"queries": ["ok", ""]})
        assert bad.status_code == 400 and "queries[1] is empty" in bad.json()["error"]
        assert "Traceback" not in server.log_text()
    finally:
        stop_server(server)


def test_prepare_keeps_a_current_channel_and_relearns_a_stale_one(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from queryserve.prepare import prepare_spell

    prepare_spell(tmp_path, data=data)
    tables = tmp_path / "spell" / "channel.json"
    learned = tables.read_bytes()
    assert "more from web text" in capsys.readouterr().out
    prepare_spell(tmp_path, data=data)
    assert "already prepared" in capsys.readouterr().out
    # Tables learned with other parameters than this version's (an older release's) are
    # relearned, not served.
    raw = json.loads(learned)
    raw["parameters"]["web_weight"] = 2.0
    tables.write_text(json.dumps(raw))
    prepare_spell(tmp_path, data=data)
    assert "already prepared" not in capsys.readouterr().out
    assert tables.read_bytes() == learned


def test_ceiling_counts_the_meant_query_among_the_channel_k_best(
        channel_folder: Path, data: Path) -> None:
    # benchmarks/spell_ceiling.py: its k = 1 column is the channel's own query accuracy, and a
    # longer list of candidates can only hold more of the meant queries.
    from queryserve.spell.evaluate import SpellSets

    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "spell_ceiling.py"), str(channel_folder),
         "--data", str(data), "--size", "30"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {tuple(cells[:2]): [float(c.rstrip("%")) for c in cells[3:]]
            for line in result.stdout.splitlines()[2:]
            if len(cells := [c.strip() for c in line.strip("|").split("|")]) == 7}
    assert ("hard", "all") in rows and ("realistic", "all") in rows
    assert all(a <= b for shares in rows.values() for a, b in itertools.pairwise(shares))
    sets = SpellSets.build(data, size=30)
    said = NoisyChannel.load(channel_folder).correct([t.typed for t in sets.hard])
    right = sum(c.corrected == normalized(t.meant) for c, t in zip(said, sets.hard, strict=True))
    assert rows["hard", "all"][0] == pytest.approx(100 * right / len(sets.hard), abs=0.05)


@pytest.fixture(scope="module")
def hybrid_folder(served_folder: Path, data: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The tiny seq2seq stands in for both: the development model (that the re-ranker learns
    # to trust) and the served one.
    out = tmp_path_factory.mktemp("hybrid") / "spell"
    assert cli.main(["train", "spell-hybrid", str(out), "--development-seq2seq",
                     str(served_folder), "--seq2seq", str(served_folder), "--data", str(data),
                     "--no-progress"]) == 0
    return out


def test_hybrid_is_trained_and_served_as_it_corrects_in_process(
        hybrid_folder: Path, data: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from queryserve.backends.noisy_channel.rerank import FEATURES, HybridCorrector

    record = json.loads((hybrid_folder / "TRAINING.json").read_text())
    assert record["examples"]["clean"] > 0 and record["examples"]["misspelled"] > 0
    for outcome in record["development"].values():  # shares on the unseen half
        assert set(outcome) <= {"clean", "misspelled", "word"}
        assert all(0.0 <= v <= 1.0 for v in outcome.values())
    weights = json.loads((hybrid_folder / "reranker.json").read_text())
    assert len(weights["hidden"]) == len(FEATURES) == len(weights["mean"])
    # Fitted on the scores of the type it is served with; sure corrections are the channel's.
    assert weights["compute_type"] == record["compute_type"] == "int8"
    assert weights["channel_sure"] == record["channel_sure"] == 0.99
    assert set(record["handed_to_the_channel"]["0.99"]) == {
        "queries", "channel_right", "network_right", "clean_changed"}
    # A reranker.json written before those two fields is served as it was fitted.
    from queryserve.backends.noisy_channel.rerank import RerankerWeights

    older = tmp_path / "reranker.json"
    older.write_text(json.dumps({k: v for k, v in weights.items()
                                 if k not in ("compute_type", "channel_sure")}))
    assert (RerankerWeights.load(older).compute_type,
            RerankerWeights.load(older).channel_sure) == ("float32", None)
    assert (hybrid_folder / "seq2seq" / "ctranslate2" / "model.bin").is_file()

    # The last is longer than the seq2seq's 128 positions: the channel answers it alone.
    queries = [*QUERIES, "plae sleepyhead by pasion pit", "Taylor  Swift", "qwzx " * 40]
    hybrid = HybridCorrector.load(hybrid_folder)
    expected = hybrid.correct(queries)
    assert all(0.0 <= e.score <= 1.0 for e in expected)
    # Where the channel is sure the words are right, its answer and posterior stand.
    channel = NoisyChannel.load(hybrid_folder).correct(queries)
    for e, c in zip(expected, channel, strict=True):
        if not c.changed and c.score >= 0.999:
            assert (e.corrected, e.score) == (c.corrected, c.score)
    # The seq2seq scores the words as typed and what the channel does not all but rule out.
    from queryserve.backends.noisy_channel.rerank import UNLIKELY, candidates

    for words, found in zip([q.split() for q in QUERIES], candidates(
            hybrid.channel, hybrid.scorer, [q.split() for q in QUERIES], hybrid.weights),
            strict=True):
        typed = " ".join(words)
        assert typed in found.texts
        assert all(p >= UNLIKELY for t, p in zip(found.texts, found.posteriors, strict=True)
                   if t != typed)
        every = hybrid.channel.k_best(words, 3, also=[typed])
        assert len(found.texts) == sum(p >= UNLIKELY or t == typed for t, p in every)
    # More pairs than one CTranslate2 batch (`SCORE_BATCH`), of mixed lengths: it sorts them
    # by length, and each score still comes back beside its own pair.
    from queryserve.backends.noisy_channel.rerank import SCORE_BATCH

    pairs = [(q, c) for q in [*QUERIES, "a", ("play " * 12).strip()] for c in (q, q + "s")]
    assert len(pairs) > SCORE_BATCH
    together = hybrid.scorer.log_probs(pairs)
    alone_scores = [hybrid.scorer.log_probs([p])[0] for p in pairs]
    assert [t[1] for t in together] == [a[1] for a in alone_scores]
    assert [t[0] for t in together] == pytest.approx(
        [a[0] for a in alone_scores], rel=0.02)
    # A correction the channel is sure of is not scored, and its answer and posterior stand:
    # with channel_sure 0 that is every correction the channel proposes.
    trusting = HybridCorrector(hybrid.channel, hybrid.scorer,
                               dataclasses.replace(hybrid.weights, channel_sure=0.0))
    proposed = hybrid.channel.correct(QUERIES)
    assert any(c.changed for c in proposed)
    for c, found, answer in zip(proposed, candidates(
            hybrid.channel, hybrid.scorer, [q.split() for q in QUERIES], trusting.weights),
            trusting.correct(QUERIES), strict=True):
        if c.changed:
            assert not len(found.features)
            assert (answer.corrected, answer.score) == (c.corrected, c.score)
    server = start_server(hybrid_folder.parent, tmp_path / "server.log")
    try:
        # One request, and one query per request: the batcher's batches answer the same.
        answer = httpx.post(f"{server.url}/v1/spell", json={"queries": queries}, timeout=30)
        assert answer.status_code == 200, answer.text
        alone = [httpx.post(f"{server.url}/v1/spell", json={"queries": [q]}, timeout=30
                            ).json()["corrections"][0] for q in queries]
        # Each against the same query scored in a batch like its own: CTranslate2's int8
        # scores of a query move (up to 1% on eval's queries) with what shares its batch.
        one_by_one = [hybrid.correct([q])[0] for q in queries]
        for corrections, same in ((answer.json()["corrections"], expected),
                                  (alone, one_by_one)):
            assert [c["corrected"] for c in corrections] == [e.corrected for e in same]
            assert [c["score"] for c in corrections] == pytest.approx(
                [e.score for e in same], rel=1e-4, abs=1e-6)
        bad = httpx.post(f"{server.url}/v1/spell", json={"queries": ["ok", ""]})
        assert bad.status_code == 400 and "queries[1] is empty" in bad.json()["error"]
        assert "Traceback" not in server.log_text()
    finally:
        stop_server(server)
    result = subprocess.run(
        [sys.executable, "-m", "queryserve", "eval", "spell", str(hybrid_folder), "--data",
         str(data), "--size", "10", "--no-progress"], capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr
    assert "hybrid" in result.stdout and "hybrid, score >= 0.5" in result.stdout

    # A served seq2seq folder is required, and said so; a re-ranker fitted on other features
    # is refused when the model loads, not served wrong.
    assert cli.main(["train", "spell-hybrid", str(tmp_path / "x"), "--development-seq2seq",
                     str(tmp_path), "--data", str(data), "--no-progress"]) == 1
    assert "is not a served seq2seq folder" in capsys.readouterr().err
    weights["features"] = weights["features"][:-1]
    (tmp_path / "reranker.json").write_text(json.dumps(weights))
    from queryserve.backends.noisy_channel.rerank import RerankerWeights
    from queryserve.errors import ConfigError

    with pytest.raises(ConfigError, match="fitted on other features"):
        RerankerWeights.load(tmp_path / "reranker.json")


def test_eval_spell_scores_both_sets_against_symspellpy(served_folder: Path,
                                                       channel_folder: Path, data: Path,
                                                       tmp_path: Path) -> None:
    scores_file, curves = tmp_path / "scores.json", tmp_path / "curves.png"
    result = subprocess.run(
        [sys.executable, "-m", "queryserve", "eval", "spell", str(channel_folder),
         str(served_folder), "--data", str(data), "--size", "30", "--min-score", "0.9",
         "--json", str(scores_file), "--curves", str(curves)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    for words in ("symspellpy", "seq2seq", "hard set", "realistic set", "1 edit", "2 edits",
                  "noise seeds 0, 1, 2", "at equal false corrections", "at 1.0%"):
        assert words in result.stdout, words
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"curves: {curves}" in result.stdout
    scores = {s["corrector"]: s for s in json.loads(scores_file.read_text())}
    # No search/pipeline.yaml beside the models: the pipeline's default threshold, 0.5.
    assert list(scores) == ["channel", "seq2seq", "channel, score >= 0.5",
                            "channel, score >= 0.9", "seq2seq, score >= 0.5",
                            "seq2seq, score >= 0.9", "symspellpy"]
    for s in scores.values():
        for key in ("word_accuracy", "query_accuracy", "false_corrections"):
            assert 0.0 <= s[key] <= 1.0
        assert s["clean"]["total"] == 30
        for name in ("hard", "realistic"):
            rate = s[name]["query_accuracy"]
            assert rate["low"] <= rate["share"] <= rate["high"]
        assert s["realistic"]["by_group"]["1"]["total"] >= s["realistic"]["by_group"]["2"][
            "total"]
    # 30 queries x 3 noise seeds, each with one typo or more (the noise model can miss one).
    assert 80 <= scores["channel"]["hard"]["query_accuracy"]["total"] <= 90
    # Both dictionary correctors know the training catalog's words: they fix a good share of
    # one-edit typos, and an auto-correct threshold changes fewer right queries.
    assert scores["symspellpy"]["query_accuracy_by_edits"]["1"] > 0.3
    assert scores["channel"]["realistic"]["by_group"]["1"]["share"] > 0.3
    assert scores["channel, score >= 0.9"]["false_corrections"] <= \
        scores["channel"]["false_corrections"]


def test_eval_spell_on_a_folder_that_is_not_served_says_so(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "queryserve", "eval", "spell",
                             str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "no model.yaml" in result.stderr
    assert "Traceback" not in result.stderr
    # A plot with nowhere to go is refused before minutes of answers, not after.
    for curves in (tmp_path / "no" / "curves.png", tmp_path):
        result = subprocess.run([sys.executable, "-m", "queryserve", "eval", "spell",
                                 str(tmp_path), "--curves", str(curves)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and "a PNG file's path is needed" in result.stderr
        assert "Traceback" not in result.stderr


def test_default_spell_model_fixes_a_typo_and_keeps_right_queries(real_server: RunningServer
                                                                  ) -> None:
    """`make run`'s `spell` (the noisy channel `queryserve prepare` learned), `spell-seq2seq`
    (the committed model, as `queryserve prepare` converted it) and `spell-hybrid` (the channel
    re-ranked with the seq2seq by the committed network)."""
    assert (ROOT / "model_repository" / "spell-hybrid" / "reranker.json").is_file()
    # Runs of spaces too: the seq2seq read them as tokens ("  taylor   swift  " came back
    # "taylor   swift your mos dspy swift t").
    queries = ["taylor swfit", "Taylor Swift", "play some jazz", "sony turntable",
               "  taylor   swift  "]
    for model in ("spell", "spell-seq2seq", "spell-hybrid"):
        answer = httpx.post(f"{real_server.url}/v1/spell", timeout=30,
                            json={"queries": queries, "model": model})
        assert answer.status_code == 200, answer.text
        got = [(c["corrected"], c["changed"]) for c in answer.json()["corrections"]]
        assert got == [("taylor swift", True), ("taylor swift", False),
                       ("play some jazz", False), ("sony turntable", False),
                       ("taylor swift", False)], model
        # What a model cannot read is kept: the seq2seq, reading <unk>, answered "привет мир"
        # with "#) $$5" and the emoji query with "play some jazz )".
        unread = ["привет мир", "play some jazz 😀", "東京  天気"]
        answer = httpx.post(f"{real_server.url}/v1/spell", timeout=30,
                            json={"queries": unread, "model": model})
        got = [(c["corrected"], c["changed"]) for c in answer.json()["corrections"]]
        assert got == [("привет мир", False), ("play some jazz 😀", False),
                       ("東京 天気", False)], model
    # The channel corrects in context: the catalog searches "passion pit" after "sleepyhead".
    answer = httpx.post(f"{real_server.url}/v1/spell", timeout=30,
                        json={"queries": ["plae sleepyhead by pasion pit"]})
    assert answer.json()["corrections"][0]["corrected"] == "play sleepyhead by passion pit"
    # Embeddings are not a spelling model.
    wrong = httpx.post(f"{real_server.url}/v1/spell", json={"queries": ["x"], "model": "embed"})
    assert wrong.status_code == 400
    assert "text2text and spelling models only" in wrong.json()["error"]


def test_hybrid_answers_queries_at_the_seq2seq_position_limit(real_server: RunningServer
                                                              ) -> None:
    """The seq2seq reads 128 positions and scores a candidate's end token one past it: a
    125-character query whose candidate is a character longer (a space put in) got a 500
    from CTranslate2 ("no position encodings") before its length was checked that way.
    Queries of 118 to 130 characters around the limit, each answered."""
    tail = "sony turntable taylorswift shake it off"
    queries = [("play some music by " * 8)[:n - len(tail) - 1] + " " + tail
               for n in range(118, 131)]
    answer = httpx.post(f"{real_server.url}/v1/spell", timeout=60,
                        json={"queries": queries, "model": "spell-hybrid"})
    assert answer.status_code == 200, answer.text
    corrections = answer.json()["corrections"]
    assert len(corrections) == len(queries)
    assert all(0.0 <= c["score"] <= 1.0 and c["corrected"] for c in corrections)


def test_a_query_past_the_word_limit_is_refused_by_spell_and_searched_as_typed(
        real_server: RunningServer) -> None:
    """One pasted page must not hold the single-instance corrector for seconds."""
    long_query = " ".join(["taylr swfit"] * 40)  # 80 words; the channel corrects <= 64
    refused = httpx.post(f"{real_server.url}/v1/spell", timeout=30,
                         json={"queries": [long_query]})
    assert refused.status_code == 400
    assert refused.json()["error"] == ("a query of 80 words is over the 64 that model 'spell' "
                                       "corrects (parameters.max_words in its model.yaml)")
    searched = httpx.post(f"{real_server.url}/v1/search", timeout=30,
                          json={"query": long_query, "k": 1})
    assert searched.status_code == 200, searched.text
    body = searched.json()
    assert body["searched"] == long_query and not body["changed"]
    assert "spell" not in body["timings_ms"]


def test_eval_and_train_on_a_folder_without_the_data_say_what_is_missing(tmp_path: Path
                                                                         ) -> None:
    for args in (["eval", "spell", "model_repository/spell"], ["train", "spell-channel",
                                                              str(tmp_path / "out")]):
        result = subprocess.run([sys.executable, "-m", "queryserve", *args, "--data",
                                 str(tmp_path)], capture_output=True, text=True, timeout=120,
                                cwd=ROOT)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert (f"{tmp_path} is not the repository's data folder: it lacks "
                "billboard-hot100/hot100_songs_1997_2026.csv") in result.stderr


def test_a_query_longer_than_the_seq2seq_reads_is_refused(real_server: RunningServer) -> None:
    """Cut at its 128 positions, the query was answered with the rewrite of its beginning as
    if that were all of it ("changed": true, score 0.97)."""
    long_query = "taylor swfit " * 40
    refused = httpx.post(f"{real_server.url}/v1/spell", timeout=30,
                         json={"queries": ["play some jazz", long_query],
                               "model": "spell-seq2seq"})
    assert refused.status_code == 400, refused.text
    assert "longer than model 'spell-seq2seq' reads (128 tokens)" in refused.json()["error"]
    fits = httpx.post(f"{real_server.url}/v1/spell", timeout=30,
                      json={"queries": [long_query[:100]], "model": "spell-seq2seq"})
    assert fits.status_code == 200, fits.text
