"""The command line as a careless user meets it: each mistake refused at once, in one line that
names the flag or the file, with a non-zero exit and no traceback; before any work, not after it.

Each case here was a traceback, a silent acceptance or an error that hid the real one
(a session's walk through every command with bad input, 2026-11-28).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, start_server, stop_server, write_fake_model
from tests.e2e.test_lifecycle import infer_body, serving_unready


def queryserve(*args: str, cwd: Path = ROOT,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queryserve", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd,
                          env=None if env is None else {**os.environ, **env})


def refused(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


@pytest.mark.parametrize("args", [
    ("train", "intent", "OUT", "--epochs", "0"),  # was a ZeroDivisionError after loading
    ("train", "intent", "OUT", "--batch-size", "0"),
    ("train", "duplicates", "OUT", "--method", "cross-encoder", "--epochs", "0"),
    ("train", "spell", "OUT", "--minutes", "-1"),  # was exit 0 with an untrained model
    ("recommend", "--workers", "0"),  # was accepted, and the sweep ran
], ids=["intent-epochs", "intent-batch", "duplicates-epochs", "spell-minutes", "workers"])
def test_a_count_or_a_duration_that_cannot_be_is_a_usage_error(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    done = queryserve(*(str(tmp_path / "out") if a == "OUT" else a for a in args))
    refused(done, 2, "must be")
    assert not (tmp_path / "out").exists()  # nothing was started, nothing left behind


def test_an_output_that_is_a_file_is_refused_before_the_work(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for args in (("train", "spell-channel", str(a_file)),
                 ("bench", "http://127.0.0.1:9", "--rate", "5", "--out", str(a_file))):
        refused(queryserve(*args), 2, f"{a_file} is a file; give a folder to write into")
    # eval spell's --json was written after the whole evaluation, into a folder not there
    refused(queryserve("eval", "spell", str(tmp_path), "--json", str(tmp_path / "no" / "s.json")),
            1, "--json", "a JSON file's path is needed, in a folder that exists")


def test_recommend_names_a_model_yaml_that_is_not_yaml(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "broken")
    (tmp_path / "broken" / "model.yaml").write_text("backend: [fake\nmax_batch_size: 8\n")
    refused(queryserve("recommend", "--repository", str(tmp_path), "--model", "broken",
                       "--out", str(tmp_path / "out")), 1, "model.yaml is not valid YAML")


def test_serve_refuses_what_it_could_only_fail_at_later(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "fast")
    serve = ("serve", "--repository", str(tmp_path), "--http", f"127.0.0.1:{free_port()}",
             "--grpc", "off")
    refused(queryserve(*serve, "--workers", "3", "--cores", "2"), 1,
            "--workers 3 on 2 core(s): each worker runs at least one model instance thread")
    refused(queryserve(*serve, "--served-model-name", "x=nope"), 1,
            "--served-model-name x=nope:", "has no model 'nope' (it has: fast)")
    # Set and empty (a Secret made of a failed `openssl rand`): it served an open pod.
    refused(queryserve(*serve, env={"QUERYSERVE_API_KEY": " , "}), 1,
            "QUERYSERVE_API_KEY is set and holds no key")
    write_fake_model(tmp_path, "slow")  # an alias that is a model's name hid that model
    refused(queryserve(*serve, "--served-model-name", "slow=fast"), 1,
            "--served-model-name slow=fast: 'slow' is a model of", "name the alias otherwise")
    refused(queryserve(*serve, "--otlp-endpoint", "notaurl"), 2, "is not an OTLP/HTTP URL")
    refused(queryserve(*serve, "--cors-allow-origin", "not an origin"), 2, "is not an origin")
    refused(queryserve(*serve, "--cors-allow-origin", "https://app.example/"), 2,
            "is not an origin")  # a browser's Origin has no path: this one would never match
    refused(queryserve(*serve, "--allowed-hosts", ""), 2, "is not a host name")


def test_the_batch_job_names_a_missing_input_before_the_models(tmp_path: Path) -> None:
    """Run from another folder, the default model paths do not resolve either; the input the
    user typed is what is wrong first."""
    refused(queryserve("batch", "duplicates", "missing.csv", "out.csv", cwd=tmp_path), 1,
            "missing.csv does not exist")
    (tmp_path / "a-folder.csv").mkdir()
    refused(queryserve("batch", "duplicates", "a-folder.csv", "out.csv", cwd=tmp_path), 1,
            "a-folder.csv is not a file")


def test_prepare_away_from_the_checkout_says_where_to_run_it(tmp_path: Path) -> None:
    # Was "model_repository/embed/model.yaml is missing: model_repository is not the default
    # repository", which names no fix.
    refused(queryserve("prepare", cwd=tmp_path), 1, "not found in", "run it (or `make prepare`)"
            " in the checkout")
    # `serve --prepare` of a folder nothing can be prepared in turned ready with no models.
    port = free_port()
    done = queryserve("serve", "--prepare", "--repository", str(tmp_path), "--http",
                      f"127.0.0.1:{port}", "--grpc", "off", cwd=tmp_path)
    refused(done, 1, f"no model of {tmp_path} prepared: nothing to serve")


def test_a_mistaken_repository_is_said_before_the_server_listens(tmp_path: Path) -> None:
    # Outside the checkout: the error, then a traceback of the gRPC server collected after
    # its loop had closed.
    ports = ("--http", f"127.0.0.1:{free_port()}", "--grpc", f"127.0.0.1:{free_port()}")
    refused(queryserve("serve", *ports, cwd=tmp_path), 1,
            "model repository model_repository is not a folder")
    write_fake_model(tmp_path / "repository", "fast")
    refused(queryserve("serve", "--repository", str(tmp_path / "repository" / "fast"), *ports),
            1, "is a model's folder (it holds a model.yaml); --repository takes the folder "
               "that holds the models' folders")


def test_folders_a_repository_does_not_serve_are_named_in_the_log(tmp_path: Path) -> None:
    """Each of these served nothing and answered ready, with not a word in the log."""
    repository = tmp_path / "repository"
    (repository / "My Model").mkdir(parents=True)
    (repository / "notes").mkdir()
    log = tmp_path / "server.log"
    server = start_server(repository, log)
    stop_server(server)
    said = " ".join(log.read_text().split())
    assert "My Model/ is not served: its name is not a model name" in said
    assert "notes/ is not served: it has no model.yaml (or pipeline.yaml, for an ensemble)" \
        in said
    assert f"model repository {repository} holds no model" in said


def test_a_folder_meant_as_a_model_fails_to_load_and_says_why(tmp_path: Path) -> None:
    """A Triton repository (config.pbtxt, 1/model.onnx) or a model.yml served nothing, and
    the server answered ready: a rollout sent it traffic. Now each is a model that failed to
    load, with its reason in the index, and strict readiness is 503."""
    repository = tmp_path / "repository"
    write_fake_model(repository, "fast")
    (repository / "triton" / "1").mkdir(parents=True)
    (repository / "triton" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    (repository / "triton" / "1" / "model.onnx").write_bytes(b"")
    (repository / "typo").mkdir()
    (repository / "typo" / "model.yml").write_text("backend: fake\n")
    with serving_unready(repository) as (url, _, _):
        assert httpx.get(f"{url}/v2/health/ready").status_code == 503
        index = {m["name"]: m for m in httpx.post(f"{url}/v2/repository/index").json()}
        assert index["triton"]["state"] == "UNAVAILABLE"
        assert "holds config.pbtxt, which queryserve does not read: a model's folder holds a " \
               "model.yaml" in index["triton"]["reason"]
        assert "holds model.yml, which queryserve does not read" in index["typo"]["reason"]
        assert httpx.post(f"{url}/v2/models/fast/infer", json=infer_body("x")).status_code \
            == 200
