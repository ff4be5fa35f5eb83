"""`queryserve serve --workers 2`, from real clients: one server whichever worker answers.

Both workers answer; `/metrics` and the statistics (HTTP and gRPC) count exactly what was sent,
whichever worker a scrape reaches; a reload under load reaches both and fails no request; a
worker killed with SIGKILL is replaced while the other serves, and so is one stuck; SIGTERM
with ~2,000 items queued answers every request written before it, and every process exits;
one HTTP client and one gRPC channel, their connection aged, reach both workers. A real
server on 127.0.0.1 with fake models (a set compute time per batch), every wait bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from queryserve.bench.server_process import connections_on
from tests.conftest import RunningServer, free_port, start_server, stop_server, write_fake_model
from tests.e2e.test_embed_http import perf_analyzer
from tests.e2e.test_lifecycle import infer_body

WORKERS = ("--workers", "2", "--cores", "2")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[tuple[RunningServer, int]]:
    """Two workers serving `fast` (no delay) and `slow` (20 ms a batch), HTTP and gRPC."""
    write_fake_model(tmp_path, "fast", max_batch_size=8, max_queue_size=256)
    write_fake_model(tmp_path, "slow", max_batch_size=8, max_queue_size=4096, delay_ms=20)
    grpc_port = free_port()
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS,
                          "--grpc", f"127.0.0.1:{grpc_port}")
    yield server, grpc_port
    stop_server(server)


def worker_pids(server: RunningServer) -> dict[int, int]:
    """Each worker's current pid, from the supervisor's log."""
    return {int(w): int(pid) for w, pid in
            re.findall(r"worker (\d+) started \(pid (\d+)\)", server.log_text())}


def answering_process(url: str) -> str:
    """The process that answered, on a new connection: request ids start with a random
    prefix of the process's own."""
    with httpx.Client(timeout=10) as client:
        answer = client.post(f"{url}/v2/models/fast/infer", json=infer_body("which"))
    assert answer.status_code == 200, answer.text
    return answer.headers["x-request-id"].split("-")[0]


def scrape(url: str) -> dict[str, float]:
    with httpx.Client(timeout=10) as client:  # a new connection: any worker may answer
        text = client.get(f"{url}/metrics").text
    return {sample.name + str(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_both_workers_answer_and_the_figures_are_the_whole_server_s(
        workers: tuple[RunningServer, int]) -> None:
    server, grpc_port = workers
    import tritonclient.grpc as grpcclient

    answered_by = {answering_process(server.url) for _ in range(40)}
    assert len(answered_by) == 2, answered_by  # the kernel spread 40 connections over both
    sent = 40
    success = "queryserve_requests_total[('model', 'fast'), ('outcome', 'success')]"
    for _ in range(10):  # ten scrapes on ten connections: whichever worker, the same count
        figures = scrape(server.url)
        assert figures[success] == sent
        assert figures["queryserve_inferences_total[('model', 'fast')]"] == sent
        assert figures["queryserve_workers[]"] == 2
        assert figures["process_cpu_seconds_total[('worker', '0')]"] > 0
        assert figures["process_cpu_seconds_total[('worker', '1')]"] > 0
        with httpx.Client(timeout=10) as client:
            stats = client.get(f"{server.url}/v2/models/fast/stats").json()["model_stats"][0]
        assert stats["inference_count"] == sent
        assert stats["inference_stats"]["success"]["count"] == sent
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    stats = grpc.get_inference_statistics("fast", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == sent


def test_queue_and_compute_count_requests_not_texts_as_triton_does(
        workers: tuple[RunningServer, int]) -> None:
    """perf_analyzer and dashboards divide queue and compute time by the request count, which
    Triton keeps equal to the successful requests: counted per text, a request of 4 texts
    showed 4x its compute time. Requests of 1 and 4 texts over HTTP and 2 over gRPC, sent at
    once so that their texts share batches, whichever worker answers."""
    server, grpc_port = workers
    import tritonclient.grpc as grpcclient

    def http_request(i: int) -> None:
        texts = [f"request {i} text {j}" for j in range(4 if i % 2 else 1)]
        with httpx.Client(timeout=30) as client:
            assert client.post(f"{server.url}/v2/models/slow/infer",
                               json=infer_body(*texts)).status_code == 200

    def grpc_request(i: int) -> None:
        text = grpcclient.InferInput("text", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[f"grpc {i} a".encode()], [f"grpc {i} b".encode()]],
                                          dtype=object))
        grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}").infer("slow", [text])

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(http_request, range(10)))  # 5 of 1 text, 5 of 4
        list(pool.map(grpc_request, range(6)))
    requests, texts = 16, 5 + 20 + 12
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    for stats in (grpc.get_inference_statistics("slow", as_json=True)["model_stats"][0],
                  httpx.get(f"{server.url}/v2/models/slow/stats").json()["model_stats"][0]):
        inference = stats["inference_stats"]
        for name in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            assert int(inference[name]["count"]) == requests, (name, stats)
        assert int(stats["inference_count"]) == texts
        executions = sum(int(b["compute_infer"]["count"]) for b in stats["batch_stats"])
        assert executions == int(stats["execution_count"]) < texts  # texts shared batches
        # A request's compute is its batches' (20 ms each), not one per text.
        assert 20e6 <= int(inference["compute_infer"]["ns"]) / requests < 200e6


def test_repeated_statistics_keep_one_series_per_worker(
        workers: tuple[RunningServer, int]) -> None:
    """Each statistics read gathers the sibling's snapshot. Merging it once extended
    prometheus-client's cached `python_info` family in place, so every read made that family
    longer in the worker that answered, and the next snapshot shipped the longer list to the
    other: it grew like Fibonacci, to 1.3 million samples (1.5 GB) in one worker within one
    `queryserve bench --find-max`, which reads the statistics around each step."""
    server, _ = workers
    for _ in range(30):  # a new connection each time: either worker answers, and asks the other
        with httpx.Client(timeout=10) as client:
            assert client.get(f"{server.url}/v2/models/fast/stats").status_code == 200
    with httpx.Client(timeout=10) as client:
        text = client.get(f"{server.url}/metrics").text
    info = [line for line in text.splitlines() if line.startswith("python_info{")]
    assert len(info) == 2, f"{len(info)} python_info samples: {info[:4]}"
    assert {'worker="0"' in line for line in info} == {True, False}  # one each


def test_tritonclient_and_perf_analyzer_work_unchanged(workers: tuple[RunningServer, int]) -> None:
    server, grpc_port = workers
    import nvidia.cuda_runtime
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    for module, url in ((httpclient, server.host_port), (grpcclient, f"127.0.0.1:{grpc_port}")):
        client = module.InferenceServerClient(url)
        assert client.is_server_ready()
        text = module.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"play some jazz"]], dtype=object))
        assert client.infer("fast", [text]).as_numpy("embedding").shape == (1, 16)
    cuda_lib = Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib"
    for protocol, url in (("http", server.host_port), ("grpc", f"127.0.0.1:{grpc_port}")):
        result = subprocess.run(
            [str(perf_analyzer()), "-m", "fast", "-u", url, "-i", protocol,
             "--string-data", "play some jazz", "--concurrency-range", "4",
             "--measurement-mode", "count_windows", "--measurement-request-count", "200",
             "--max-trials", "3", "--stability-percentage", "999"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "LD_LIBRARY_PATH": str(cuda_lib)})
        assert result.returncode == 0, result.stdout + result.stderr
        # The server-side split, from the statistics of both workers: no negative or huge
        # queue time (one worker's counts against the other's made both).
        split = re.search(r"overhead (\d+) usec \+ queue (\d+) usec", result.stdout)
        assert split is not None, result.stdout
        assert 0 <= int(split.group(1)) < 1_000_000 and 0 <= int(split.group(2)) < 1_000_000


def test_a_reload_under_load_reaches_both_workers_and_fails_no_request(
        workers: tuple[RunningServer, int]) -> None:
    server, _ = workers
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():  # a new connection each time: both workers get some
            with httpx.Client(base_url=server.url, timeout=10) as http:
                statuses.append(http.post("/v2/models/fast/infer",
                                          json=infer_body("steady")).status_code)

    threads = [threading.Thread(target=client) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        with httpx.Client(base_url=server.url, timeout=60) as admin:
            for _ in range(3):
                assert admin.post("/v2/repository/models/fast/load").status_code == 200
                time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        assert len(statuses) > 20 and set(statuses) == {200}
        log = server.log_text()
        for worker in (0, 1):  # each worker built the model anew three times
            assert log.count(f"worker-{worker} queryserve.repository: model 'fast' retired") >= 3
        # Loaded again everywhere: the model's figures restart from zero in both workers.
        with httpx.Client(base_url=server.url, timeout=60) as admin:
            assert admin.post("/v2/repository/models/fast/load").status_code == 200
        figures = scrape(server.url)
        assert figures.get("queryserve_inferences_total[('model', 'fast')]") == 0
        # A model the repository does not have: refused, as one server refuses it.
        with httpx.Client(base_url=server.url, timeout=60) as admin:
            assert admin.post("/v2/repository/models/nope/load").status_code == 404
    finally:
        stop.set()


def test_a_killed_worker_is_replaced_while_the_other_serves(
        workers: tuple[RunningServer, int]) -> None:
    server, _ = workers
    victim = worker_pids(server)[0]
    os.kill(victim, signal.SIGKILL)
    statuses = []
    deadline = time.monotonic() + 60
    ready_again = False
    while time.monotonic() < deadline and not ready_again:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            statuses.append(client.post("/v2/models/fast/infer",
                                        json=infer_body("still here")).status_code)
            ready_again = (len(worker_pids(server)) == 2 and worker_pids(server)[0] != victim
                           and client.get("/v2/health/ready").status_code == 200)
        time.sleep(0.05)
    assert ready_again, server.log_text()
    assert set(statuses) == {200}  # the other worker answered throughout
    assert f"worker 0 (pid {victim}) died (exit -9)" in server.log_text()
    assert scrape(server.url)["queryserve_worker_restarts_total[]"] == 1
    assert len({answering_process(server.url) for _ in range(40)}) == 2  # both serve again


def test_a_worker_that_keeps_dying_after_serving_is_replaced_later_each_time(
        workers: tuple[RunningServer, int]) -> None:
    """A request that kills whichever worker takes it, sent again and again, must not turn
    into a restart loop: the first death is replaced at once, the next ones after a back-off
    that doubles (a worker that served a minute ends the row), and the other worker serves
    throughout. The server never gives up on a worker that served."""
    server, _ = workers
    statuses: list[int] = []
    for death in range(3):
        victim = worker_pids(server)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                statuses.append(client.post("/v2/models/fast/infer",
                                            json=infer_body("still here")).status_code)
                if (worker_pids(server)[0] != victim
                        and client.get("/v2/health/ready").status_code == 200):
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"worker 0 not replaced after death {death + 1}: {server.log_text()}")
    text = server.log_text()
    delays = re.findall(r"worker 0 \(pid \d+\) died \(exit -9\): replacing it in ([\d.]+) s", text)
    assert delays == ["0.0", "1.0", "2.0"], text
    assert "(3 replaced so far, 3 deaths in a row)" in text, text
    assert set(statuses) == {200}  # the other worker answered throughout
    assert scrape(server.url)["queryserve_worker_restarts_total[]"] == 3


def test_a_stuck_worker_is_killed_and_replaced(tmp_path: Path) -> None:
    """A worker whose event loop stops turning (SIGSTOP here; a deadlock or a call that never
    returns in life) answers nobody, while the kernel goes on handing it new connections and
    readiness said 200: after `--worker-timeout` the supervisor kills it and starts another."""
    write_fake_model(tmp_path, "fast")
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS, "--worker-timeout", "2")
    victim = worker_pids(server)[0]
    try:
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        deadline = stopped + 60
        while time.monotonic() < deadline and worker_pids(server).get(0) == victim:
            time.sleep(0.05)
        replaced_s = time.monotonic() - stopped
        text = server.log_text()
        assert f"worker 0 (pid {victim}): its event loop has not turned for" in text, text
        assert f"worker 0 (pid {victim}) killed, stuck: replacing it" in text, text
        assert 1 <= replaced_s < 10, replaced_s  # its last beat came up to 1 s before
        while time.monotonic() < deadline:
            with httpx.Client(base_url=server.url, timeout=5) as client:
                if client.get("/v2/health/ready").status_code == 200:
                    break
            time.sleep(0.1)
        assert len({answering_process(server.url) for _ in range(40)}) == 2  # both serve
        assert scrape(server.url)["queryserve_worker_restarts_total[]"] == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
        stop_server(server)


def test_connections_are_evened_out_over_the_workers(tmp_path: Path) -> None:
    """The kernel hashes each connection to one worker for its life, and 64 spread over 4
    workers unevenly (the busiest held 1.06-1.44x the mean, BENCHMARKS.md). A worker over its
    share closes a connection after an answer (`connection: close`, counted); the client
    reconnects, and within a few rounds no worker holds more than one over the mean (its
    share: a tenth over it, or one where that is less). Every request is answered."""
    import http.client

    write_fake_model(tmp_path, "fast", max_batch_size=8, max_queue_size=256)
    server = start_server(tmp_path, tmp_path / "server.log", "--workers", "4", "--cores", "4",
                          "--grpc", "off")
    body = json.dumps(infer_body("spread")).encode()
    try:
        port = int(server.url.rsplit(":", 1)[1])
        clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(64)]
        closed, holders = 0, {}
        for _ in range(30):  # rounds: a request on every connection, the closed ones reopen
            closed_now = 0
            for i, client in enumerate(clients):
                client.request("POST", "/v2/models/fast/infer", body,
                               {"content-type": "application/json"})
                answer = client.getresponse()
                assert answer.status == 200, answer.read()
                answer.read()
                holders[i] = answer.headers["x-request-id"].split("-")[0]
                if answer.headers.get("connection") == "close":
                    closed_now += 1  # http.client reconnects on the next request
            closed += closed_now
            if not closed_now:
                break
        spread = sorted(Counter(holders.values()).values(), reverse=True)
        assert len(spread) == 4 and spread[0] <= 64 / 4 + 1, spread
        assert scrape(server.url)["queryserve_http_connections_rebalanced_total[]"] == closed
        for client in clients:
            client.close()
    finally:
        stop_server(server)


def test_a_connection_is_placed_afresh_as_it_ages(tmp_path: Path) -> None:
    """One keep-alive HTTP connection, or one gRPC channel (one HTTP/2 connection), is given to
    one worker by the kernel for its life. With `--max-connection-age 0.3` the server ends it
    after an answer (HTTP: `connection: close`, counted; gRPC: GOAWAY once its calls finish),
    the client reconnects on its own and the kernel places it afresh: within a few connections
    both workers have served the one client, and no request failed."""
    import tritonclient.grpc as grpcclient

    write_fake_model(tmp_path, "fast", max_batch_size=8, max_queue_size=256)
    grpc_port = free_port()
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS,
                          "--grpc", f"127.0.0.1:{grpc_port}", "--max-connection-age", "0.3")
    try:
        answered_by: set[str] = set()
        deadline = time.monotonic() + 20  # ~60 connections: 2^-59 to miss a worker
        with httpx.Client(timeout=10) as client:  # one keep-alive connection at a time
            while len(answered_by) < 2 and time.monotonic() < deadline:
                answer = client.post(f"{server.url}/v2/models/fast/infer",
                                     json=infer_body("aging"))
                assert answer.status_code == 200, answer.text
                answered_by.add(answer.headers["x-request-id"].split("-")[0])
                time.sleep(0.02)
        assert len(answered_by) == 2, "one worker answered the one HTTP client throughout"
        assert scrape(server.url)["queryserve_http_connections_aged_total[]"] >= 1

        pids = worker_pids(server)
        channel = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        text = grpcclient.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"play some jazz"]], dtype=object))
        holders: set[int] = set()
        calls, deadline = 0, time.monotonic() + 20
        while len(holders) < 2 and time.monotonic() < deadline:
            assert channel.infer("fast", [text]).as_numpy("embedding").shape == (1, 16)
            calls += 1
            holders |= set(connections_on(grpc_port, pids).values())
            time.sleep(0.02)
        assert holders == {0, 1}, f"only worker(s) {holders} held the channel in {calls} calls"
        channel.close()
    finally:
        stop_server(server)


@pytest.mark.parametrize("to", ["supervisor", "group"])
def test_sigterm_with_2000_items_queued_answers_every_request_then_exits_0(
        tmp_path: Path, to: str) -> None:
    """SIGTERM to the supervisor, or to the whole process group as systemd, `kill -- -PGID`
    and tini -g send it: each worker then gets it twice, directly and forwarded, and the copy
    made it exit at once, its queue unanswered."""
    write_fake_model(tmp_path, "slow", max_batch_size=8, max_queue_size=4096, delay_ms=20)
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS, own_group=True)
    pids = worker_pids(server)
    items, per_request = 2000, 20

    async def load() -> list[int | str]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            requests = [asyncio.ensure_future(client.post(
                "/v2/models/slow/infer",
                json=infer_body(*(f"query {i} item {j}" for j in range(per_request)))))
                for i in range(items // per_request)]
            await asyncio.sleep(1.0)  # every request written and queued (2,000 items at 8 a
            # batch take 2.5 s per worker at 20 ms a batch)
            if to == "group":
                os.killpg(server.process.pid, signal.SIGTERM)
            else:
                server.process.send_signal(signal.SIGTERM)
            return [r.status_code if isinstance(r, httpx.Response) else type(r).__name__
                    for r in await asyncio.gather(*requests, return_exceptions=True)]

    try:
        outcomes = asyncio.run(load())
        assert outcomes == [200] * (items // per_request)
        assert server.process.wait(timeout=30) == 0
        log = server.log_text()
        assert log.count("every accepted request answered") == 2, log
        assert "every worker drained and exited 0" in log and "Traceback" not in log
        for pid in pids.values():  # no worker left behind
            assert not Path(f"/proc/{pid}").exists() or \
                "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    finally:
        if server.process.poll() is None:
            server.process.kill()


def test_cores_that_the_workers_do_not_divide_are_said_to_run_no_instance(
        tmp_path: Path) -> None:
    """Each worker gets cores // workers (the kernel gives them equal load); a remainder runs
    no model instance, and the log says which --workers would use every core."""
    write_fake_model(tmp_path, "fast")
    server = start_server(tmp_path, tmp_path / "server.log", "--workers", "2", "--cores", "3")
    try:
        assert ("2 workers on 3 cores: 1 each, and 1 core(s) run no model instance; "
                "--workers 3 would use them all") in server.log_text()
    finally:
        stop_server(server)


def test_a_repository_that_is_not_one_is_refused_once_not_by_every_worker(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path / "nope"),
         "--http", f"127.0.0.1:{free_port()}", "--grpc", "off", "--workers", "2"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("is not a folder") == 1, done.stderr
    assert "started (pid" not in done.stderr


def test_a_replacement_catches_up_with_an_unload_made_while_it_loaded(tmp_path: Path) -> None:
    """Regression: a replacement worker read what its siblings served once, as it began to
    load; an unload answered while it loaded (its control socket not yet open) never reached
    it, and it served the unloaded model for good."""
    write_fake_model(tmp_path, "fast")
    write_fake_model(tmp_path, "heavy", delay_ms=2000)  # its warmup: 2 s of loading
    with (tmp_path / "heavy" / "model.yaml").open("a") as config:
        config.write("model_warmup: [{name: one, batch_size: 1, text: warm}]\n")
    write_fake_model(tmp_path, "slow")
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS)
    try:
        victim = worker_pids(server)[0]
        before = server.log_text().count("worker-0 queryserve.repository: model 'fast' ready")
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while server.log_text().count(
                "worker-0 queryserve.repository: model 'fast' ready") == before:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.05)
        # The replacement loads `heavy` now: `slow` was served when it asked, and `fast` it
        # has already (by name alone it kept that one for good, from before this reload).
        assert httpx.post(f"{server.url}/v2/repository/models/slow/unload").status_code == 200
        config = tmp_path / "fast" / "model.yaml"
        config.write_text(config.read_text().replace("dims: [16]", "dims: [8]"))
        assert httpx.post(f"{server.url}/v2/repository/models/fast/load").status_code == 200
        while "worker-0 queryserve: listening on" not in \
                server.log_text().split(f"pid {victim}) died")[-1]:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.05)
        assert len({answering_process(server.url) for _ in range(40)}) == 2  # both serve
        with httpx.Client(timeout=10) as client:
            statuses = {client.post(f"{server.url}/v2/models/slow/infer",
                                    json=infer_body("gone"), headers={"connection": "close"}
                                    ).status_code for _ in range(40)}
            assert statuses == {503}, server.log_text()  # from both workers
            widths = {len(client.post(f"{server.url}/v2/models/fast/infer",
                                      json=infer_body("new"), headers={"connection": "close"}
                                      ).json()["outputs"][0]["data"]) for _ in range(40)}
        assert widths == {8}, server.log_text()  # the reloaded model, from both workers
    finally:
        stop_server(server)


def test_a_replacement_says_why_a_model_failed_as_its_sibling_does(tmp_path: Path) -> None:
    """Regression: a replacement loads what its siblings serve, so it never tried the model
    that failed to load there, and its index and its 503s said "not loaded" with no reason
    where the sibling's said why: two answers from one server."""
    write_fake_model(tmp_path, "fast")
    write_fake_model(tmp_path, "broken")
    (tmp_path / "broken" / "tokenizer.json").write_text("not a tokenizer")
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS, "--no-strict-readiness")
    try:
        victim = worker_pids(server)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        died = f"pid {victim}) died"
        while died not in (text := server.log_text()) or \
                "worker-0 queryserve: listening on" not in text.split(died)[-1]:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.05)
        reasons, failures = set(), set()
        answered = set()
        with httpx.Client(timeout=10, headers={"connection": "close"}) as client:
            for _ in range(40):  # a new connection each: either worker answers
                index = client.post(f"{server.url}/v2/repository/index")
                answered.add(index.headers["x-request-id"].split("-")[0])
                reasons |= {entry.get("reason") for entry in index.json()
                            if entry["name"] == "broken"}
                failed = client.post(f"{server.url}/v2/models/broken/infer",
                                     json=infer_body("which"))
                failures.add((failed.status_code, failed.json()["error"]))
        assert len(answered) == 2, answered
        assert len(reasons) == 1 and None not in reasons, reasons
        assert len(failures) == 1 and next(iter(failures))[0] == 503, failures
        assert next(iter(reasons)) in next(iter(failures))[1]
    finally:
        stop_server(server)


def one_client_per_worker(server: RunningServer, clients: dict[str, httpx.Client]) -> None:
    """Fills `clients` with a keep-alive connection to each of two workers, by the process
    its first answer names (a model `fast` answers it)."""
    while len(clients) < 2:
        client = httpx.Client(base_url=server.url, timeout=60)
        process = client.post("/v2/models/fast/infer", json=infer_body("which")
                              ).headers["x-request-id"].split("-")[0]
        if clients.setdefault(process, client) is not client:
            client.close()


def test_a_load_and_an_unload_at_once_leave_the_workers_agreeing(tmp_path: Path) -> None:
    """Regression (the workers walk): each worker ran the change a client asked of it first,
    then had the other run it: a load and an unload asked at once ran in opposite orders in
    the two workers, and one served the model while the other answered 503, for good."""
    write_fake_model(tmp_path, "fast")
    write_fake_model(tmp_path, "slow", delay_ms=300)  # its loads take a while: they overlap
    with (tmp_path / "slow" / "model.yaml").open("a") as config:
        config.write("model_warmup: [{name: one, batch_size: 1, text: warm}]\n")
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS)
    clients: dict[str, httpx.Client] = {}  # a keep-alive connection to each worker
    try:
        one_client_per_worker(server, clients)
        one, other = clients.values()
        for _ in range(4):
            with ThreadPoolExecutor(2) as pool:
                loaded = pool.submit(one.post, "/v2/repository/models/slow/load")
                unloaded = pool.submit(other.post, "/v2/repository/models/slow/unload")
                assert loaded.result().status_code == unloaded.result().status_code == 200
            statuses = {client.post("/v2/models/slow/infer", json=infer_body("which")
                                    ).status_code for client in (one, other)}
            assert len(statuses) == 1, (statuses, server.log_text())  # one server
            assert one.post("/v2/repository/models/slow/load").status_code == 200
    finally:
        for client in clients.values():
            client.close()
        stop_server(server)


def test_a_load_whose_client_leaves_is_done_in_both_workers(tmp_path: Path) -> None:
    """Regression (the state walk): a load whose client gave up (a timeout, a gRPC deadline)
    was cancelled with its request after the build, before the swap; the other worker
    installed it, and the two served two versions, both READY, until the next load."""
    def configure(queue: int) -> None:
        shutil.rmtree(tmp_path / "slow", ignore_errors=True)
        write_fake_model(tmp_path, "slow", max_queue_size=queue, delay_ms=300)
        with (tmp_path / "slow" / "model.yaml").open("a") as config:
            config.write("model_warmup: [{name: one, batch_size: 1, text: warm}]\n")

    write_fake_model(tmp_path, "fast")
    configure(64)
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS)
    clients: dict[str, httpx.Client] = {}  # a keep-alive connection to each worker
    try:
        one_client_per_worker(server, clients)
        for queue, client in zip((65, 66), clients.values(), strict=True):  # each asks once
            configure(queue)
            with pytest.raises(httpx.TimeoutException):
                client.post("/v2/repository/models/slow/load", timeout=0.1)  # builds 0.3 s
            deadline = time.monotonic() + 20
            while True:
                seen = [c.get("/v2/models/slow/config").json()["dynamic_batching"][
                    "default_queue_policy"]["max_queue_size"] for c in clients.values()]
                if seen == [queue, queue] or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert seen == [queue, queue], server.log_text()
        assert "left; the load goes on" in server.log_text()
    finally:
        for client in clients.values():
            client.close()
        stop_server(server)


def test_a_load_cut_short_by_sigterm_is_a_503_not_a_500(tmp_path: Path) -> None:
    """A SIGTERM while a load ran in both workers: the sibling stopped answering, and the
    load was a 500 naming asyncio's own error ("0 bytes read on a total of 4")."""
    write_fake_model(tmp_path, "fast")
    write_fake_model(tmp_path, "heavy", delay_ms=3000)  # its warmup: 3 s of loading
    with (tmp_path / "heavy" / "model.yaml").open("a") as config:
        config.write("model_warmup: [{name: one, batch_size: 1, text: warm}]\n")
    server = start_server(tmp_path, tmp_path / "server.log", *WORKERS, ready_s=60)
    try:
        with httpx.Client(timeout=60) as client:
            loading = threading.Thread(target=lambda: outcome.append(client.post(
                f"{server.url}/v2/repository/models/heavy/load")))
            outcome: list[httpx.Response] = []
            loading.start()
            time.sleep(1.0)  # both workers build it now
            server.process.send_signal(signal.SIGTERM)
            loading.join(60)
        assert outcome and outcome[0].status_code in (200, 503), outcome[0].text
        assert server.process.wait(timeout=60) == 0
        assert "Traceback" not in server.log_text()
    finally:
        if server.process.poll() is None:
            server.process.kill()


def test_ports_another_server_starts_on_or_both_protocols_name_are_refused(
        tmp_path: Path) -> None:
    """Regression (the workers walk): a second server started while the first one's workers
    loaded (nothing listening yet) took the same ports, and the kernel split clients between
    the two; one port for HTTP and gRPC started, said ready, and no gRPC call got through."""
    write_fake_model(tmp_path, "heavy", delay_ms=3000)  # its warmup: 3 s of loading
    with (tmp_path / "heavy" / "model.yaml").open("a") as config:
        config.write("model_warmup: [{name: one, batch_size: 1, text: warm}]\n")
    port = free_port()

    def serve(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path),
             "--http", f"127.0.0.1:{port}", *WORKERS, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first = serve("--grpc", "off")
    second = None
    try:
        time.sleep(1.5)  # its workers load: nothing listens on the port
        assert first.poll() is None
        second = serve("--grpc", "off")
        said, _ = second.communicate(timeout=60)
        assert second.returncode == 1, said
        assert f"cannot listen on 127.0.0.1:{port}: another queryserve server is starting " \
               "or serving there" in said
    finally:
        for server in (first, second):
            if server is not None and server.poll() is None:
                server.terminate()
                server.communicate(timeout=60)
    both = serve("--grpc", f"127.0.0.1:{port}")
    said, _ = both.communicate(timeout=60)
    assert both.returncode == 1 and "--http and --grpc both name" in said, said


def test_a_sigterm_in_the_first_second_exits_0(tmp_path: Path) -> None:
    """Regression: a worker drained on SIGTERM only once `serve` had started, about a second
    of imports in; before, the signal killed it and the server exited 1 (a pod deleted as it
    was scheduled, recorded as a failure)."""
    write_fake_model(tmp_path, "fast")
    server = subprocess.Popen(
        [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path),
         "--http", f"127.0.0.1:{free_port()}", "--grpc", "off", *WORKERS],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = ""
    try:
        while "worker 1 started" not in said:  # both spawned, importing
            line = server.stdout.readline()  # type: ignore[union-attr]
            assert line, said
            said += line
        server.send_signal(signal.SIGTERM)
        rest, _ = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == 0, said + rest
