"""The server's lifecycle from a real client: SIGTERM drains, a second signal exits, reload and
unload under load lose nothing, one large request cannot lock a model out.

A real server on 127.0.0.1 with fake models (a configurable compute time per batch), so the
timing of each fault is under the test's control; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    REPOSITORY,
    RunningServer,
    free_port,
    start_server,
    stop_server,
    write_fake_model,
)


def infer_body(*texts: str) -> dict[str, object]:
    return {"inputs": [{"name": "text", "shape": [len(texts), 1], "datatype": "BYTES",
                        "data": list(texts)}]}


def raw_request(method: str, path: str, body: bytes = b"") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def read_responses(sock: socket.socket, count: int, timeout_s: float = 15) -> list[bytes]:
    """The next `count` responses on a raw connection (heads with their bodies), in order."""
    sock.settimeout(timeout_s)
    data, answers = b"", []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1").lower()
            length = int(head.split("content-length: ")[1].split("\r\n")[0])
            if len(data) >= head_end + 4 + length:
                answers.append(data[:head_end + 4 + length])
                data = data[head_end + 4 + length:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return answers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_answers_every_accepted_request_then_exits_0(tmp_path: Path,
                                                             sig: signal.Signals) -> None:
    """SIGHUP (a closed terminal) exited at once, with nothing drained and no line logged."""
    write_fake_model(tmp_path, "slow", max_batch_size=1, max_queue_size=64, delay_ms=100)
    server = start_server(tmp_path, tmp_path / "server.log")
    body = httpx.Request("POST", "http://x/", json=infer_body("queued")).read()

    async def load() -> list[int | str]:
        limits = httpx.Limits(max_connections=30)
        async with httpx.AsyncClient(base_url=server.url, timeout=20, limits=limits) as client:
            requests = [asyncio.ensure_future(
                client.post("/v2/models/slow/infer", json=infer_body(f"query {i}")))
                for i in range(20)]
            await asyncio.sleep(0.5)  # all sent and accepted; about 5 answered (100 ms each)
            # A pipelined readiness probe behind a queued request, on a connection of its own.
            probe = socket.create_connection(("127.0.0.1", server.port))
            probe.sendall(raw_request("POST", "/v2/models/slow/infer", body)
                          + raw_request("GET", "/v2/health/ready"))
            await asyncio.sleep(0.1)
            server.process.send_signal(sig)
            signalled = time.monotonic()
            outcomes: list[int | str] = []
            for response in await asyncio.gather(*requests, return_exceptions=True):
                outcomes.append(response.status_code if isinstance(response, httpx.Response)
                                else type(response).__name__)
            answers = await asyncio.to_thread(read_responses, probe, 2)
            probe.close()
            assert time.monotonic() - signalled < 10
            assert len(answers) == 2 and answers[0].startswith(b"HTTP/1.1 200")
            # Readiness turned 503 at the signal; the last answer closes the connection.
            assert answers[1].startswith(b"HTTP/1.1 503"), answers[1]
            assert b"connection: close" in answers[1].lower()
            return outcomes

    try:
        outcomes = asyncio.run(load())
        assert outcomes == [200] * 20
        assert server.process.wait(timeout=15) == 0
        log = server.log_text()
        assert "every accepted request answered" in log and "Traceback" not in log
        with pytest.raises(httpx.TransportError):  # the listener is closed
            httpx.get(f"{server.url}/v2/health/live", timeout=2)
    finally:
        if server.process.poll() is None:
            server.process.kill()


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "stuck", max_batch_size=1, delay_ms=5000)
    server = start_server(tmp_path, tmp_path / "server.log")
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(raw_request("POST", "/v2/models/stuck/infer",
                                     httpx.Request("POST", "http://x/",
                                                   json=infer_body("x")).read()))
            time.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            assert server.process.poll() is None  # draining: the 5 s request still runs
            started = time.monotonic()
            server.process.send_signal(signal.SIGINT)
            assert server.process.wait(timeout=5) == 128 + signal.SIGINT
            assert time.monotonic() - started < 2
    finally:
        if server.process.poll() is None:
            server.process.kill()


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[RunningServer]:
    write_fake_model(tmp_path, "fast", max_batch_size=8, max_queue_size=256)
    write_fake_model(tmp_path, "slow", max_batch_size=1, max_queue_size=64, delay_ms=200)
    write_fake_model(tmp_path, "turns", max_batch_size=4, max_queue_size=16, delay_ms=40)
    server = start_server(tmp_path, tmp_path / "server.log")
    yield server
    stop_server(server)


def test_reload_under_load_fails_no_request(fake_server: RunningServer) -> None:
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=fake_server.url, timeout=10) as http:
            while not stop.is_set():
                statuses.append(http.post("/v2/models/fast/infer",
                                          json=infer_body("steady")).status_code)

    threads = [threading.Thread(target=client) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        with httpx.Client(base_url=fake_server.url, timeout=30) as admin:
            for _ in range(5):
                assert admin.post("/v2/repository/models/fast/load").status_code == 200
                time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        assert len(statuses) > 20 and set(statuses) == {200}
        assert fake_server.log_text().count("model 'fast' retired") >= 4
    finally:
        stop.set()


def test_unload_runs_the_queue_then_answers_503_with_retry_after(
        fake_server: RunningServer) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(base_url=fake_server.url, timeout=20) as client:
            queued = [asyncio.ensure_future(
                client.post("/v2/models/slow/infer", json=infer_body(f"queued {i}")))
                for i in range(5)]
            await asyncio.sleep(0.3)  # one running (200 ms each), the rest queued
            assert (await client.post("/v2/repository/models/slow/unload")).status_code == 200
            later = await client.post("/v2/models/slow/infer", json=infer_body("too late"))
            assert later.status_code == 503 and "is not loaded" in later.json()["error"]
            assert later.headers["retry-after"] == "1"
            assert [r.status_code for r in await asyncio.gather(*queued)] == [200] * 5

    asyncio.run(run())


def test_one_large_request_does_not_lock_out_the_others(fake_server: RunningServer) -> None:
    """Regression: an empty queue admitted a request of any size, so while it ran every other
    request found the queue full (503). Now it is queued in turns of a batch per instance."""
    async def run() -> None:
        async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as client:
            large = asyncio.ensure_future(client.post(
                "/v2/models/turns/infer", json=infer_body(*[f"item {i}" for i in range(200)])))
            await asyncio.sleep(0.2)
            started = time.monotonic()
            small = await asyncio.gather(*(
                client.post("/v2/models/turns/infer", json=infer_body(f"small {i}"))
                for i in range(10)))
            small_s = time.monotonic() - started
            assert [r.status_code for r in small] == [200] * 10
            assert not large.done()  # 50 batches of 40 ms: the small ones went between turns
            assert small_s < 1.5
            answer = await large
            assert answer.status_code == 200 and answer.json()["outputs"][0]["shape"][0] == 200

    asyncio.run(run())


@contextmanager
def serving_unready(repository: Path, *flags: str) -> Iterator[tuple[str, Path, int]]:
    """`serve` of a repository one of whose models fails to load: its URL, log and pid once
    the others are loaded (readiness stays 503, so `start_server` would wait for ever)."""
    log = repository / f"server{len(flags)}.log"
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "queryserve", "serve", "--repository", str(repository),
             "--http", f"127.0.0.1:{port}", "--grpc", "off", *flags], stdout=sink,
            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "failed to load" not in log.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", log, process.pid
        assert "Traceback" not in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_a_malformed_ensemble_leaves_the_other_models_serving(tmp_path: Path) -> None:
    """Regression: a malformed search/pipeline.yaml stopped `serve` at start."""
    write_fake_model(tmp_path, "fast")
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "pipeline.yaml").write_text("embed: fast\nk: lots\n")
    with serving_unready(tmp_path) as (url, _, _):
        assert httpx.post(f"{url}/v2/models/fast/infer", json=infer_body("x")).status_code == 200
        assert httpx.get(f"{url}/v2/health/ready").status_code == 503  # search is not loaded
        index = {m["name"]: m for m in httpx.post(f"{url}/v2/repository/index").json()}
        reason = index["search"]["reason"]
        assert "pipeline.yaml: field 'k' is 'lots'; expected an integer" in reason
        search = httpx.post(f"{url}/v1/search", json={"query": "x"})
        assert search.status_code == 503 and "field 'k'" in search.json()["error"]


def test_an_ensemble_whose_steps_do_not_fit_says_so_at_load(tmp_path: Path) -> None:
    """Regression: a search whose spell step was an embedding model loaded READY and answered
    every search 400 (counted "invalid", as if the client's mistake); one whose embedding was
    narrower than its index answered 500, counted a success."""
    write_fake_model(tmp_path, "fast")  # an embedding model of 16 dimensions
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "index").symlink_to(REPOSITORY / "search" / "index")
    steps = tmp_path / "search" / "pipeline.yaml"
    steps.write_text("spell: fast\nembed: fast\nindex: index\n")
    server = start_server(tmp_path, tmp_path / "server.log", "--no-strict-readiness")
    try:
        def reason() -> str:
            index = httpx.post(f"{server.url}/v2/repository/index").json()
            return next(m for m in index if m["name"] == "search")["reason"]

        assert "model 'fast' is a text_embedding model" in reason()
        search = httpx.post(f"{server.url}/v1/search", json={"query": "jazz"})
        assert search.status_code == 503 and "text_embedding" in search.json()["error"]
        steps.write_text("embed: fast\nindex: index\n")
        assert httpx.post(f"{server.url}/v2/repository/models/search/load").status_code == 200
        assert "vectors of 16 dimensions, and the index 384" in reason()
        search = httpx.post(f"{server.url}/v1/search", json={"query": "jazz"})
        assert search.status_code == 503 and "rebuild the index" in search.json()["error"]
        metrics = httpx.get(f"{server.url}/metrics").text
        # (the reload began its counts anew)
        assert 'queryserve_requests_total{model="search",outcome="unavailable"} 1.0' in metrics
        assert 'model="search",outcome="success"' not in metrics
        # A step naming a model the repository lacks (a typo): every search was a 404 naming
        # the step's model, as if the client had asked for it, and nothing said why.
        steps.write_text("spell: speling\nembed: fast\nindex: index\n")
        assert httpx.post(f"{server.url}/v2/repository/models/search/load").status_code == 200
        assert reason() == "its 'spell' step names model 'speling', which the repository " \
                           "does not have"
        search = httpx.post(f"{server.url}/v1/search", json={"query": "jazz"})
        assert search.status_code == 503 and "'speling'" in search.json()["error"]
        # An ensemble naming itself is refused (Triton: "circular dependency"); two naming
        # each other are each a misfit. Readiness asked each the other's readiness, and on:
        # readiness and the index were 500s for the whole server, a 140 KB traceback each.
        steps.write_text("embed: search\nindex: index\n")
        load = httpx.post(f"{server.url}/v2/repository/models/search/load")
        assert load.status_code == 400, load.text
        assert "field 'embed' is 'search'; expected another model's name" in load.json()["error"]
        (tmp_path / "loop").mkdir()
        (tmp_path / "loop" / "index").symlink_to(REPOSITORY / "search" / "index")
        (tmp_path / "loop" / "pipeline.yaml").write_text("embed: search\nindex: index\n")
        steps.write_text("embed: loop\nindex: index\n")
        for name in ("loop", "search"):
            assert httpx.post(f"{server.url}/v2/repository/models/{name}/load").status_code \
                == 200
        assert "model 'loop' is a search model" in reason()
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200  # not strict
        assert httpx.get(f"{server.url}/v2/models/search/ready").status_code == 400  # Triton
        assert httpx.post(f"{server.url}/v2/models/fast/infer",
                          json=infer_body("x")).status_code == 200
    finally:
        stop_server(server)
    assert "Traceback" not in (tmp_path / "server.log").read_text()
    # At start the log says which models are not ready and why.
    assert "is not ready (model 'fast' is a text_embedding model" in " ".join(
        (tmp_path / "server.log").read_text().split())


def test_a_model_whose_files_are_broken_leaves_the_other_models_serving(
        tmp_path: Path) -> None:
    """A model.onnx of garbage (or a cut one, a tokenizer that is not one) failed inside
    onnxruntime with its own error: `serve` stopped at start with a traceback, and a load was
    a 500. Now it is that model's error: reported, left out, and a 400 on load."""
    write_fake_model(tmp_path, "fast")
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(REPOSITORY / "embed" / "model.yaml", broken / "model.yaml")
    shutil.copy(REPOSITORY / "embed" / "tokenizer.json", broken / "tokenizer.json")
    (broken / "model.onnx").write_bytes(os.urandom(20_000))
    # A classifier declared one class wider than its graph loaded, and every label was wrong.
    wide = tmp_path / "wide"
    wide.mkdir()
    for name in ("model.onnx", "tokenizer.json"):
        (wide / name).symlink_to(REPOSITORY / "intent" / name)
    (wide / "model.yaml").write_text((REPOSITORY / "intent" / "model.yaml").read_text()
                                     .replace("dims: [60]", "dims: [61]"))
    # A max_sequence_length past the graph's positions loaded, then every long query was a 500.
    long = tmp_path / "long"
    long.mkdir()
    for name in ("model.onnx", "tokenizer.json"):
        (long / name).symlink_to(REPOSITORY / "intent" / name)
    (long / "model.yaml").write_text(re.sub(r"max_sequence_length: \d+",
                                            "max_sequence_length: 100000",
                                            (REPOSITORY / "intent" / "model.yaml").read_text()))
    # Loaded, then failed every request (a bare KeyError, "expected FP32" to BYTES and "must be
    # a string" to FP32) or answered label_48 for every intent.
    embed, intent = (REPOSITORY / name / "model.yaml" for name in ("embed", "intent"))
    for name, source, before, after in (
            ("renamed", embed, "- name: embedding", "- name: vector"),
            ("floats", embed, "datatype: BYTES", "datatype: FP32"),
            ("unlabelled", intent, "labels: 'datetime_query,", "labels: '"),
            # Served the graph's bytes as the declared type (FP32 read as INT32), served
            # [7, 384] as [384], failed every request (KeyError: 'input_ids'), served the
            # last of two max_batch_size, answered [1, 3] with three rows.
            ("ints", embed, "datatype: FP32", "datatype: INT32"),
            ("ranks", embed, "dims: [384]", "dims: [7, 384]"),
            ("generator", embed, "pipeline: text_embedding", "pipeline: text2text"),
            ("twice", embed, "max_batch_size: ", "max_batch_size: 8\nmax_batch_size: "),
            ("columns", embed, "dims: [1]", "dims: [-1]")):
        (tmp_path / name).mkdir()
        for file in ("model.onnx", "tokenizer.json"):
            (tmp_path / name / file).symlink_to(source.parent / file)
        assert before in source.read_text()
        (tmp_path / name / "model.yaml").write_text(source.read_text().replace(before, after))
    # Triton's layout: the graph in a version folder, which queryserve does not read (the
    # error said to run `queryserve prepare`, which knows nothing of the user's model).
    (tmp_path / "versions" / "1").mkdir(parents=True)
    (tmp_path / "versions" / "1" / "model.onnx").symlink_to(embed.parent / "model.onnx")
    (tmp_path / "versions" / "tokenizer.json").symlink_to(embed.parent / "tokenizer.json")
    (tmp_path / "versions" / "model.yaml").write_text(embed.read_text())
    with serving_unready(tmp_path) as (url, _, pid):
        assert httpx.post(f"{url}/v2/models/fast/infer", json=infer_body("x")).status_code == 200
        index = {m["name"]: m for m in httpx.post(f"{url}/v2/repository/index").json()}
        assert "reads no version folders: move 1/model.onnx beside model.yaml, or set " \
               "parameters.model_file: 1/model.onnx" in index["versions"]["reason"]
        # Paths within the repository: where it is on disk is the operator's business (every
        # reason, load answer and 503 named it, to anyone who could reach the port).
        assert str(tmp_path) not in str(index) and "ints/model.yaml: output" in str(index)
        load = httpx.post(f"{url}/v2/repository/models/broken/load")
        assert str(tmp_path) not in load.text and "broken/model.onnx" in load.text
        assert "cannot be built from its files: InvalidProtobuf" in index["broken"]["reason"]
        assert "output[0].name is 'vector', which the model does not give; its outputs are " \
               "embedding" in index["renamed"]["reason"]
        assert "field 'input[0].datatype' is 'FP32'; expected one of BYTES" in \
            index["floats"]["reason"]
        assert "parameters.labels names 59 labels, and the model gives 60 values an item" in \
            index["unlabelled"]["reason"]
        assert "output 'probabilities' has dims [61], but model.onnx gives [60] an item" in \
            index["wide"]["reason"]
        assert "output 'embedding' is declared INT32, but model.onnx gives FP32" in \
            index["ints"]["reason"]
        assert "output 'embedding' has dims [7, 384], but model.onnx gives 1 dimension(s)" in \
            index["ranks"]["reason"]
        assert "field 'backend' is 'onnxruntime'; expected ctranslate2: pipeline 'text2text' " \
            "runs on no other" in index["generator"]["reason"]
        assert "the key 'max_batch_size' is repeated" in index["twice"]["reason"]
        assert "field 'input[0].dims' is [-1]; expected [1] (one text a row)" in \
            index["columns"]["reason"]
        assert "max_sequence_length is 100000, and the model fails on an input of that many " \
            "tokens" in index["long"]["reason"]
        # A model that fails its warmup takes its instances' threads with it (each failed
        # load of it kept two).
        threads = len(os.listdir(f"/proc/{pid}/task"))
        for _ in range(2):
            load = httpx.post(f"{url}/v2/repository/models/long/load")
            assert load.status_code == 400 and "max_sequence_length" in load.json()["error"]
        assert len(os.listdir(f"/proc/{pid}/task")) == threads
        load = httpx.post(f"{url}/v2/repository/models/broken/load")
        assert load.status_code == 400 and "InvalidProtobuf" in load.json()["error"]
        assert httpx.get(f"{url}/v2/health/ready").status_code == 503  # strict, by default
    # Not strict (Triton's --strict-readiness false): one broken folder does not take every
    # replica out of service; an unload does not either.
    with serving_unready(tmp_path, "--no-strict-readiness") as (url, log, _):
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
        assert httpx.post(f"{url}/v2/repository/models/fast/unload").status_code == 200
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
        said = log.read_text()
        assert "ready: broken failed to load (model 'broken' cannot be built" in said
        assert "; long failed to load (" in said and "; wide failed to load (" in said
        assert "; serving fast" in said


def test_a_signal_during_a_slow_load_exits_within_the_drain_timeout(tmp_path: Path) -> None:
    """A model's build (sessions, warmup) runs on a thread the interpreter joined at exit: a
    SIGTERM 3 s into an 8 s build with `--drain-timeout 1` exited 5.3 s later, past any
    grace period sized from the drain timeout."""
    write_fake_model(tmp_path, "fast")
    write_fake_model(tmp_path, "slow", delay_ms=4000)  # warmed up on 2 instances: 8 s
    with (tmp_path / "slow" / "model.yaml").open("a") as config:
        config.write("model_warmup: [{name: w, batch_size: 1, text: warm}]\n"
                     "instance_group: {count: 2}\n")
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path),
             "--http", f"127.0.0.1:{free_port()}", "--grpc", "off", "--drain-timeout", "1"],
            stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "model 'fast' ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # into the slow model's build
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert time.monotonic() - signalled < 3, log.read_text()
        assert "1 model build(s) left unfinished" in log.read_text()
    finally:
        process.kill()


@pytest.mark.parametrize("front_end", ["http", "grpc"])
def test_work_still_running_at_the_drain_deadline_is_answered_503_and_the_exit_is_0(
        tmp_path: Path, front_end: str) -> None:
    """A request still in ONNX Runtime at `--drain-timeout`: its client got no answer (the
    connection closed), and the interpreter's exit met the batch still running on its thread
    ("terminate called": exit -6 in 4 runs of 4; with --workers the supervisor exited 1).
    Now what is left is answered 503 (sent again elsewhere), and the process exits 0. Over
    gRPC alone, the call was cancelled by grpc's grace period ending with the drain's; it is
    now answered UNAVAILABLE first, as HTTP is."""
    (tmp_path / "embed").mkdir()
    for file in (REPOSITORY / "embed").iterdir():
        (tmp_path / "embed" / file.name).symlink_to(file)
    log = tmp_path / "server.log"
    port, grpc_port = free_port(), free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path),
             "--http", f"127.0.0.1:{port}", "--grpc", f"127.0.0.1:{grpc_port}",
             "--drain-timeout", "1"],
            stdout=sink, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            time.sleep(0.1)
        long_text = " ".join(["wireless noise cancelling headphones with a long battery"] * 30)
        body = {"model": "embed", "input": [f"{long_text} {i}" for i in range(1024)]}
        answers: list[httpx.Response] = []
        client = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)))
        grpc_said: list[str] = []
        grpc_client = threading.Thread(target=lambda: grpc_said.append(
            _grpc_refusal(f"127.0.0.1:{grpc_port}", body["input"])))
        (client if front_end == "http" else grpc_client).start()
        time.sleep(0.5)  # 1,024 texts of 256 tokens: seconds of work
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, log.read_text()[-2000:]
        if front_end == "http":
            client.join(timeout=20)
            assert answers and answers[0].status_code == 503, log.read_text()[-2000:]
            assert answers[0].headers["retry-after"] == "1"
            assert "send it again" in answers[0].json()["error"]["message"]
        else:
            grpc_client.join(timeout=20)
            assert grpc_said and grpc_said[0].startswith("StatusCode.UNAVAILABLE"), grpc_said
            assert "send it again" in grpc_said[0]
        said = log.read_text()
        assert "terminate called" not in said and "Traceback" not in said
        assert "given up on, their requests answered 503" in said
    finally:
        process.kill()


def _grpc_refusal(address: str, texts: list[str]) -> str:
    """The status and message a long gRPC infer of `texts` to `embed` ends with."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    text = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    try:
        grpcclient.InferenceServerClient(address).infer("embed", [text], client_timeout=60)
    except InferenceServerException as exc:
        return f"{exc.status()}: {exc.message()}"
    return "answered"


def test_serve_raises_its_file_limit_and_warns_of_a_cap_past_half_of_it(
        tmp_path: Path) -> None:
    """systemd starts a service with 1,024 open files (hard limit far above): a flood of
    connections to the gRPC port, which has no cap of its own, used them up and every HTTP
    client was reset without an answer; a --max-connections past the limit was taken
    without a word."""
    write_fake_model(tmp_path, "fast")
    log = tmp_path / "server.log"
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path),
             "--http", f"127.0.0.1:{port}", "--grpc", "off", "--max-connections", "5000"],
            stdout=sink, stderr=subprocess.STDOUT,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)))
    try:
        deadline = time.monotonic() + 60
        while "ready:" not in log.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        files = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert files.split()[3:5] == ["4096", "4096"], files
        assert "--max-connections 5000 on a limit of 4096 open files" in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=15)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_reloads_give_the_old_model_s_memory_back(tmp_path: Path) -> None:
    """Regression: each reload of a real model kept ~50 MB (the retired pipeline and its
    scheduler referenced each other, and after gc.freeze() full collections are rare)."""
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default model is not prepared: run `make prepare` (make test does)")
    (tmp_path / "embed").symlink_to(REPOSITORY / "embed")
    server = start_server(tmp_path, tmp_path / "server.log")
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            def reload_and_use() -> None:
                assert client.post("/v2/repository/models/embed/load").status_code == 200
                assert client.post("/v1/embeddings", json={"model": "embed",
                                                           "input": "jazz"}).status_code == 200

            reload_and_use()  # the first reload's one-off allocations are not a leak
            time.sleep(1.5)
            start = rss_mb(server.process.pid)
            for _ in range(10):
                reload_and_use()
            time.sleep(1.5)  # the last retired model is collected a second after its queue ran
            grown = rss_mb(server.process.pid) - start
        assert grown < 50, f"RSS grew {grown:.0f} MB over 10 reloads"
        assert server.log_text().count("model 'embed' retired") == 11
    finally:
        stop_server(server)
