"""Scheduling behaviour seen from a real client: a real server on 127.0.0.1 with fake models.

The fake backend stands in for the model (deterministic vectors, a configurable compute time
and a poison token) so that overload, timeouts, failures and disconnects can be provoked
cheaply; the server, scheduler and HTTP stack are the real ones.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from tests.conftest import (
    RunningServer,
    minilm_dir,
    start_server,
    stop_server,
    write_fake_model,
)

POISON = "explode"


def poison_token_id() -> int:
    return int(Tokenizer.from_file(str(minilm_dir() / "tokenizer.json")).encode(POISON).ids[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("repo")
    write_fake_model(repository, "fast", cache=True)
    write_fake_model(repository, "slow", max_batch_size=1, max_queue_size=2, delay_ms=300)
    write_fake_model(repository, "tight", max_batch_size=1, delay_ms=300, timeout_us=50_000)
    write_fake_model(repository, "flaky", max_batch_size=1, fail_on=poison_token_id())
    running = start_server(repository, repository / "server.log")
    yield running
    stop_server(running)


def infer_body(*texts: str) -> dict[str, object]:
    return {"inputs": [{"name": "text", "shape": [len(texts), 1], "datatype": "BYTES",
                        "data": list(texts)}]}


def stats(server: RunningServer, model: str) -> dict[str, int]:
    response = httpx.get(f"{server.url}/v2/models/{model}/stats")
    return response.json()["model_stats"][0]  # type: ignore[no-any-return]


def metric(server: RunningServer, line_prefix: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_full_queue_answers_503_with_retry_after(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        responses = await asyncio.gather(*(
            client.post("/v2/models/slow/infer", json=infer_body(f"query {i}"))
            for i in range(6)))
    statuses = sorted(r.status_code for r in responses)
    # one running + two queued fit; the other three are turned away at once
    assert statuses == [200, 200, 200, 503, 503, 503]
    rejected = [r for r in responses if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" for r in rejected)
    assert "overloaded" in rejected[0].json()["error"]
    assert metric(server, 'queryserve_requests_total{model="slow",outcome="rejected"}') == 3


async def test_request_past_its_queue_timeout_is_not_run(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        responses = await asyncio.gather(
            client.post("/v2/models/tight/infer", json=infer_body("one")),
            client.post("/v2/models/tight/infer", json=infer_body("another")))
    # Whichever arrives first runs (300 ms); the other waits past its 50 ms queue timeout and
    # is answered 503 without running. Two connections give no order of arrival.
    ran, timed_out = sorted(responses, key=lambda r: r.status_code)
    assert ran.status_code == 200
    assert timed_out.status_code == 503 and "timeout" in timed_out.json()["error"]
    assert stats(server, "tight")["inference_count"] == 1


def test_a_failing_batch_fails_only_its_own_request(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        bad = client.post("/v2/models/flaky/infer", json=infer_body(f"please {POISON} now"),
                          headers={"x-request-id": "the-bad-one"})
        good = client.post("/v2/models/flaky/infer", json=infer_body("a fine query"))
    assert bad.status_code == 500
    error = bad.json()["error"]
    assert re.fullmatch(r"model 'flaky' failed to run a batch of 1 items; the server log has "
                        r"the details \(failure (\d+)\)", error), error
    assert good.status_code == 200
    assert "Traceback" not in bad.text
    # The server's log ties the request id to the failure's traceback, by its number.
    failure = error.rsplit(" ", 1)[1].rstrip(")")
    log = server.log_text()
    assert f"request the-bad-one (POST /v2/models/flaky/infer) answered 500: {error}" in log
    assert f"model 'flaky' instance 0 failed a batch of 1 (failure {failure})\nTraceback" in log


def test_request_of_a_client_that_left_is_dropped_before_the_model(
        server: RunningServer) -> None:
    before = stats(server, "slow")["inference_count"]
    body = httpx.Request("POST", "http://x/", json=infer_body("left early")).read()
    head = (f"POST /v2/models/slow/infer HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.url, timeout=10) as client:
        # "stays" occupies the single instance for 300 ms; "left early" queues behind it and
        # its client hangs up before the instance is free.
        stays = pool.submit(client.post, "/v2/models/slow/infer", json=infer_body("stays"))
        time.sleep(0.15)  # "stays" is on the instance (it runs 300 ms)
        with socket.create_connection(("127.0.0.1", server.port)) as leaving:
            leaving.sendall(head + body)
            deadline = time.monotonic() + 2
            while (metric(server, 'queryserve_queue_depth{model="slow"}') < 1
                   and time.monotonic() < deadline):
                time.sleep(0.01)  # hang up only once "left early" is really queued
        assert stays.result().status_code == 200
    time.sleep(0.1)
    assert stats(server, "slow")["inference_count"] == before + 1  # only "stays" ran
    assert metric(server, 'queryserve_requests_total{model="slow",outcome="cancelled"}') == 1


def test_response_cache_answers_repeats(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        first = client.post("/v2/models/fast/infer", json=infer_body("repeat me"))
        second = client.post("/v2/models/fast/infer", json=infer_body("repeat me"))
    assert first.json()["outputs"] == second.json()["outputs"]
    assert metric(server, 'queryserve_cache_hits_total{model="fast"}') == 1
    assert stats(server, "fast")["inference_count"] == 1


def test_the_cache_and_the_queue_count_requests_as_triton_does(server: RunningServer) -> None:
    """Triton's statistics count requests: a cache hit is a request the cache answered
    wholly, queue counts every successful request, compute those that ran. The cache is per
    text, so `/metrics` counts the texts too."""
    def figures() -> dict[str, float]:
        inference = stats(server, "fast")["inference_stats"]
        return {"hit": inference["cache_hit"]["count"], "miss": inference["cache_miss"]["count"],
                **{name: inference[name]["count"] for name in (
                    "success", "queue", "compute_input", "compute_infer", "compute_output")},
                "hit texts": metric(server, 'queryserve_cache_hits_total{model="fast"}'),
                "missed texts": metric(server, 'queryserve_cache_misses_total{model="fast"}')}

    before = figures()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for texts in (("count a", "count b", "count c"), ("count a", "count b", "count c"),
                      ("count a", "count d")):
            assert client.post("/v2/models/fast/infer", json=infer_body(*texts)).is_success
    after = figures()
    assert {name: after[name] - before[name] for name in after} == {
        "hit": 1, "miss": 2, "success": 3, "queue": 3, "compute_input": 2, "compute_infer": 2,
        "compute_output": 2, "hit texts": 4, "missed texts": 4}


def test_pipelined_requests_are_answered_in_order(server: RunningServer) -> None:
    requests = b""
    for text in ("first", "second", "third"):
        body = httpx.Request("POST", "http://x/", json=infer_body(text)).read()
        requests += (f"POST /v2/models/flaky/infer HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                     f"content-length: {len(body)}\r\n\r\n").encode() + body
    requests += b"GET /v2/health/live HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    port = server.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(requests)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.count(b"HTTP/1.1 200 OK") == 4
    assert received.endswith(b"\r\n\r\n")  # the last answer: live, empty body, then close


def test_malformed_http_gets_400_and_oversized_headers_431(server: RunningServer) -> None:
    port = server.port
    for raw, status in ((b"NOT HTTP AT ALL\r\n\r\n", b"400"),
                        (b"GET / HTTP/1.1\r\nx: " + b"a" * 70000 + b"\r\n\r\n", b"431")):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(raw)
            assert sock.recv(4096).startswith(b"HTTP/1.1 " + status)


def test_expect_100_continue_is_honoured(server: RunningServer, tmp_path: Path) -> None:
    port = server.port
    body = httpx.Request("POST", "http://x/", json=infer_body("x" * 3000)).read()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall((f"POST /v2/models/fast/infer HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                      f"expect: 100-continue\r\ncontent-length: {len(body)}\r\n\r\n").encode())
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")


def test_repository_unload_and_load(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/v2/repository/models/fast/unload").status_code == 200
        gone = client.post("/v2/models/fast/infer", json=infer_body("anyone there"))
        assert gone.status_code == 503 and "is not loaded" in gone.json()["error"]
        index = {m["name"]: m["state"] for m in client.post("/v2/repository/index").json()}
        assert index["fast"] == "UNAVAILABLE" and index["slow"] == "READY"
        assert client.get("/v2/health/ready").status_code == 503
        assert client.post("/v2/repository/models/fast/load").status_code == 200
        assert client.post("/v2/models/fast/infer", json=infer_body("back")).status_code == 200
        assert client.get("/v2/health/ready").status_code == 200
        missing = client.post("/v2/repository/models/ghost/load")
        assert missing.status_code == 404


def test_a_stalled_request_gets_408_and_an_idle_connection_is_closed(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "fast")
    running = start_server(tmp_path, tmp_path / "server.log", "--read-timeout", "1",
                           "--idle-timeout", "1.5")
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
            sock.sendall(b"POST /v2/models/fast/infer HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                         b"content-length: 10\r\n\r\n{")  # 9 bytes never come
            started = time.monotonic()
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert b"sent nothing for 1 s" in answer
            assert sock.recv(4096) == b""  # closed after the 408
            assert 0.9 < time.monotonic() - started < 5
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            assert sock.recv(4096) == b""  # idle keep-alive connection closed by the server
            assert 1.4 < time.monotonic() - started < 5
    finally:
        stop_server(running)


def test_an_upgrade_request_is_answered_once_as_plain_http(server: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: upgrade\r\n"
                     b"upgrade: websocket\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.count(b"HTTP/1.1 ") == 1 and received.startswith(b"HTTP/1.1 200")


def test_http_details_methods_encoded_paths_and_repeated_inputs(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        wrong = client.post("/v2/health/live")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD"
        head = client.head("/v2/models/fast")  # as GET, headers only
        assert head.status_code == 200 and head.content == b""
        assert int(head.headers["content-length"]) == len(client.get("/v2/models/fast").content)
        assert client.head("/v2/health/ready").status_code == 200
        infer_get = client.get("/v2/models/fast/infer")
        assert infer_get.status_code == 405 and infer_get.headers["allow"] == "POST"
        assert client.post("/v2/models/fast/ready").status_code == 405
        assert client.get("/v2/repository/models/fast/load").headers["allow"] == "POST"
        assert client.get("/v2/models/%66ast/ready").status_code == 200  # %66 is "f"
        ghost = client.post("/v2/repository/models/ghost/unload")
        assert ghost.status_code == 404 and "ghost" in ghost.json()["error"]
        twice = {"inputs": [infer_body("a")["inputs"][0],  # type: ignore[index]
                            infer_body("b")["inputs"][0]]}  # type: ignore[index]
        repeated = client.post("/v2/models/fast/infer", json=twice)
        assert repeated.status_code == 400
        assert repeated.json()["error"] == "inputs[1]: input 'text' is given twice"


def test_serve_on_a_taken_port_or_with_a_bad_limit_says_so(server: RunningServer,
                                                             tmp_path: Path) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "queryserve", "serve", "--repository",
                               str(tmp_path), "--grpc", "off", *args],
                              capture_output=True, text=True, timeout=60)

    taken = serve("--http", server.host_port)
    assert taken.returncode == 1 and "Traceback" not in taken.stderr
    assert (f"queryserve: error: cannot listen on {server.host_port}: " in taken.stderr
            and "address already in use" in taken.stderr)
    for args, said in ((("--http", "127.0.0.1:99999"), "with a port in 1-65535"),
                       (("--max-body-bytes", "-1"), "'-1' must be >= 1"),
                       (("--read-timeout", "inf"), "'inf' must be a finite number > 0")):
        refused = serve(*args)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
