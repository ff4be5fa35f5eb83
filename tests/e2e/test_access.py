"""Who may ask, over HTTP: API keys, the Host and Origin guard, CORS; request ids and the access
log. A real server on 127.0.0.1 with a fake model; real clients (httpx, tritonclient)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from queryserve.server.run import ServeOptions, _warn_if_open
from queryserve.server.security import AccessControl, binds_loopback, host_name, is_loopback
from tests.conftest import (
    RunningServer,
    free_port,
    start_server,
    stop_server,
    write_fake_model,
)

KEY = "qs-test-key-0123456789"
APP = "http://app.example:3000"
INFER = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["jazz"]}]}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    """A server with two keys (one from the environment), one CORS origin and an access log."""
    repository = tmp_path_factory.mktemp("access")
    write_fake_model(repository, "fake")
    access_log = repository / "access.log"
    os.environ["QUERYSERVE_API_KEY"] = "env-key-1, env-key-2"
    try:
        server = start_server(repository, repository / "server.log", "--api-key", KEY,
                              "--cors-allow-origin", APP, "--access-log", str(access_log))
    finally:
        del os.environ["QUERYSERVE_API_KEY"]
    yield server, access_log
    stop_server(server)


def bearer(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def metric(server: RunningServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=bearer()).text
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + " ") or line.startswith(name + "{")]
    return sum(values)


def test_without_a_key_every_route_but_health_is_401_with_a_bearer_challenge(
        guarded: tuple[RunningServer, Path]) -> None:
    server, _ = guarded
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    # The pages' HTML holds no data (their requests need the key): a browser opening one
    # cannot send a key.
    assert httpx.get(f"{server.url}/").status_code == 200
    assert httpx.get(f"{server.url}/dashboard").status_code == 200
    for method, path in (("GET", "/v2"), ("GET", "/v2/models/fake"), ("GET", "/metrics"),
                         ("POST", "/v2/repository/index"), ("POST", "/v2/models/fake/infer"),
                         ("GET", "/v1/models")):
        response = httpx.request(method, f"{server.url}{path}", json=INFER)
        assert response.status_code == 401, (method, path, response.text)
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "API key" in response.json()["error"] or "key" in response.text
    wrong = httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER,
                       headers=bearer("nope"))
    assert wrong.status_code == 401
    basic = httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER,
                       headers={"authorization": f"Basic {KEY}"})
    assert basic.status_code == 401


def test_any_of_the_keys_opens_every_route(guarded: tuple[RunningServer, Path]) -> None:
    server, _ = guarded
    for key in (KEY, "env-key-1", "env-key-2"):
        response = httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER,
                              headers=bearer(key))
        assert response.status_code == 200, response.text
    client = triton_http.InferenceServerClient(server.host_port)
    text = triton_http.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"play some jazz"], dtype=object))
    result = client.infer("fake", [text], headers=bearer())
    assert result.as_numpy("embedding").shape == (1, 16)
    with pytest.raises(InferenceServerException, match=r"401|API key"):
        client.infer("fake", [text])


def test_refusals_are_counted_in_metrics(guarded: tuple[RunningServer, Path]) -> None:
    server, _ = guarded
    before = metric(server, "queryserve_auth_failures_total")
    for _ in range(3):
        httpx.get(f"{server.url}/v2", headers=bearer("wrong"))
    assert metric(server, "queryserve_auth_failures_total") == before + 3


def test_a_request_without_the_key_is_refused_before_its_body_is_read(
        guarded: tuple[RunningServer, Path]) -> None:
    """Checked after the body, a client with no key had up to --max-body-bytes read (and
    parsed, with an access log) before its 401, and was invited by `100 Continue` to send it.
    Now the head decides: 401 at once, no 100, the connection closed, the refusal counted once
    and logged."""
    server, access_log = guarded
    before = metric(server, "queryserve_auth_failures_total")
    head = (b"POST /v1/embeddings HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json"
            b"\r\ncontent-length: 8000000\r\nx-request-id: head-refused\r\n")
    for expect in (b"", b"expect: 100-continue\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(head + expect + b"\r\n")  # and not a byte of the body
            started = time.monotonic()
            answer = b""
            while chunk := sock.recv(65536):  # the server closes after its answer
                answer += chunk
        assert time.monotonic() - started < 2
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
        assert b"100 Continue" not in answer and b"www-authenticate: bearer" in answer.lower()
    assert metric(server, "queryserve_auth_failures_total") == before + 2
    lines = [orjson.loads(line) for line in access_log.read_text().splitlines()]
    refused = [line for line in lines if line.get("id") == "head-refused"]
    assert len(refused) == 2 and {line["status"] for line in refused} == {401}
    assert {line["method"] for line in refused} == {"POST"}


def test_a_cross_origin_page_cannot_unload_a_model(guarded: tuple[RunningServer, Path]) -> None:
    """The attack from the issue: a `text/plain` POST (a "simple" request, sent without a
    preflight) from a page on another origin. Refused even with a valid key."""
    server, _ = guarded
    response = httpx.post(f"{server.url}/v2/repository/models/fake/unload", content=b"{}",
                          headers={"origin": "http://evil.example", "content-type": "text/plain",
                                   **bearer()})
    assert response.status_code == 403
    assert httpx.get(f"{server.url}/v2/models/fake/ready", headers=bearer()).status_code == 200


def test_a_rebound_host_name_is_refused(guarded: tuple[RunningServer, Path]) -> None:
    """DNS rebinding: the page's origin is same-origin as far as the browser knows, but its
    Host names the attacker's domain."""
    server, _ = guarded
    evil = f"evil.example:{server.port}"
    response = httpx.post(f"{server.url}/v2/repository/models/fake/unload",
                          headers={"host": evil, "origin": f"http://{evil}", **bearer()})
    assert response.status_code == 403
    assert "--allowed-hosts" in response.json()["error"]
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "localhost"):
        assert httpx.get(f"{server.url}/v2", headers={"host": host, **bearer()}) \
            .status_code == 200


def test_the_server_s_own_page_and_an_allowed_origin_get_through(
        guarded: tuple[RunningServer, Path]) -> None:
    server, _ = guarded
    own = httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER,
                     headers={"origin": server.url, **bearer()})
    assert own.status_code == 200
    assert "access-control-allow-origin" not in own.headers  # same origin needs no CORS
    allowed = httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER,
                         headers={"origin": APP, **bearer()})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == APP
    assert "x-request-id" in allowed.headers["access-control-expose-headers"]


def test_a_cors_preflight_is_answered_for_an_allowed_origin_only(
        guarded: tuple[RunningServer, Path]) -> None:
    server, _ = guarded
    ask = {"access-control-request-method": "POST",
           "access-control-request-headers": "authorization, content-type"}
    preflight = httpx.options(f"{server.url}/v2/models/fake/infer",
                              headers={"origin": APP, **ask})  # a preflight carries no key
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == APP
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    # What the OpenAI SDKs send with every request was blocked by a fixed list.
    sdk = httpx.options(f"{server.url}/v1/embeddings", headers={
        "origin": APP, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type,x-stainless-os,"
                                          "openai-organization,bad header"})
    allowed = sdk.headers["access-control-allow-headers"].split(", ")
    assert {"x-stainless-os", "openai-organization", "authorization"} <= set(allowed)
    assert "bad header" not in allowed
    other = httpx.options(f"{server.url}/v2/models/fake/infer",
                          headers={"origin": "http://other.example", **ask})
    assert other.status_code == 403
    assert "access-control-allow-origin" not in other.headers


def test_request_ids_are_echoed_or_made_and_the_access_log_has_a_line_each(
        guarded: tuple[RunningServer, Path]) -> None:
    server, access_log = guarded
    given = httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER,
                       headers={"x-request-id": "trace-42", **bearer()})
    assert given.headers["x-request-id"] == "trace-42"
    made = {httpx.get(f"{server.url}/v2", headers=bearer()).headers["x-request-id"]
            for _ in range(5)}
    assert len(made) == 5
    bad = httpx.get(f"{server.url}/v2", headers={"x-request-id": "x" * 500, **bearer()})
    assert bad.headers["x-request-id"] != "x" * 500  # too long to echo: a new one is made
    refused = httpx.get(f"{server.url}/v2/models/fake")  # no key: logged, with its id
    lines = [orjson.loads(line) for line in access_log.read_bytes().splitlines()]
    by_id = {line["id"]: line for line in lines}
    line = by_id["trace-42"]
    assert line["method"] == "POST" and line["path"] == "/v2/models/fake/infer"
    assert line["model"] == "fake" and line["status"] == 200
    assert line["bytes_in"] > 0 and line["bytes_out"] > 0 and line["ms"] >= 0
    assert made <= set(by_id)
    assert by_id[refused.headers["x-request-id"]]["status"] == 401


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_access_log_s_folder_is_made_and_one_it_cannot_write_is_said_once(
        tmp_path: Path, workers: str) -> None:
    """`--access-log /var/log/queryserve/access.jsonl` on a machine without that folder: made,
    as a server pointed at a log folder is expected to. One that cannot be made is refused in
    one line, once (not by each worker at each of its tries), with no traceback."""
    write_fake_model(tmp_path, "fake")
    made = tmp_path / "logs" / "queryserve" / "access.jsonl"
    server = start_server(tmp_path, tmp_path / "server.log", "--access-log", str(made),
                          "--workers", workers, "--cores", "2")
    try:
        assert httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER).status_code == 200
    finally:
        stop_server(server)
    lines = [orjson.loads(line) for line in made.read_bytes().splitlines()]
    assert [line["status"] for line in lines if line["path"] == "/v2/models/fake/infer"] == [200]
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "queryserve", "serve", "--repository", str(tmp_path),
         "--http", f"127.0.0.1:{free_port()}", "--grpc", "off", "--workers", workers,
         "--cores", "2", "--access-log", str(blocked / "access.jsonl")],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count(f"cannot write the access log {blocked / 'access.jsonl'}") == 1, \
        done.stderr
    assert "Traceback" not in done.stderr


def test_a_server_without_keys_or_guards_is_open_and_pays_for_no_checks(
        tmp_path: Path) -> None:
    """No flags: loopback-bound, so only the Host guard is on; no key is asked for."""
    write_fake_model(tmp_path, "fake")
    server = start_server(tmp_path, tmp_path / "server.log")
    try:
        assert httpx.post(f"{server.url}/v2/models/fake/infer", json=INFER).status_code == 200
        assert httpx.get(f"{server.url}/v2", headers={"host": "evil.example"}) \
            .status_code == 403
    finally:
        stop_server(server)


def test_a_page_cannot_unload_a_model_of_a_server_open_beyond_loopback(tmp_path: Path) -> None:
    """Bound beyond loopback with no key, hosts or origins (`--http 0.0.0.0:8000`, "it is
    internal"), no check ran: a page any user of the network visited unloaded its models with
    a simple cross-site POST. The Origin check runs on every server; curl and the SDKs send
    none. In process, the server's application as bound to 0.0.0.0, not a listener on it."""
    import asyncio

    from queryserve.repository import ModelRepository
    from queryserve.server.app import ServerApp
    from queryserve.server.http_types import Request

    write_fake_model(tmp_path, "fake")

    async def run() -> list[int]:
        repository = ModelRepository(tmp_path, cores=1)
        await repository.load_all()
        app = ServerApp(repository, auth=AccessControl.for_server("0.0.0.0"))
        statuses = []
        for origin in ("http://evil.example", None, "http://10.1.2.3:8000"):
            headers = {"host": "10.1.2.3:8000", "content-type": "text/plain"}
            if origin is not None:
                headers["origin"] = origin
            body = orjson.dumps(INFER)
            answer = await app(Request("POST", "/v2/models/fake/infer", "", headers, body))
            statuses.append(answer.status)
        unload = await app(Request("POST", "/v2/repository/models/fake/unload", "", {
            "host": "10.1.2.3:8000", "origin": "http://evil.example"}, b""))
        statuses.append(unload.status)
        await repository.close()
        return statuses

    assert asyncio.run(run()) == [403, 200, 200, 403]  # the evil page; curl; its own page


def test_the_policy_for_each_bind_address() -> None:
    loopback = AccessControl.for_server("127.0.0.1")
    assert loopback.guarding and loopback.allowed_hosts is not None
    assert "loopback" in loopback.allowed_hosts
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "127.0.0.2:1", "a.localhost"):
        loopback.check_host(host)
    anywhere = AccessControl.for_server("0.0.0.0")
    assert not anywhere.guarding  # no key, no hosts, no CORS: nothing checked per request
    named = AccessControl.for_server("0.0.0.0", allowed_hosts=["search.internal"])
    named.check_host("search.internal:8000")
    with pytest.raises(Exception, match="does not answer"):
        named.check_host("evil.example")
    assert host_name("[::1]:8000") == "::1" and host_name("Example.COM") == "example.com"
    assert is_loopback("::1") and not is_loopback("10.0.0.1")
    # A bind name is resolved as the listener resolves it (one naming 127.0.0.1 was taken for
    # a public bind: no Host guard); one that does not resolve is not loopback.
    assert binds_loopback("127.0.0.1") and binds_loopback("localhost")
    assert not binds_loopback("0.0.0.0") and not binds_loopback("no-such-host.invalid")


def test_serving_beyond_loopback_without_a_key_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="queryserve"):
        _warn_if_open(ServeOptions(Path("."), host="0.0.0.0"))
        _warn_if_open(ServeOptions(Path("."), host="0.0.0.0", api_keys=("k",)))
        _warn_if_open(ServeOptions(Path(".")))
    warnings = [r.message for r in caplog.records]
    assert len(warnings) == 1 and "without an API key" in warnings[0]


def test_the_access_log_keeps_refusals_departures_and_follows_rotation(
        tmp_path: Path) -> None:
    """Regression (the observability walk): a request the transport refused (413, 431...)
    was in no log, and its answer bore a new id, not the client's; a client that left before
    its answer vanished (nginx logs a 499); after logrotate's rename every line went to the
    renamed file; a body beginning with whitespace lost its model; HEAD was logged as GET."""
    write_fake_model(tmp_path, "slow", delay_ms=600)
    log_file = tmp_path / "access.jsonl"
    server = start_server(tmp_path, tmp_path / "server.log", "--access-log", str(log_file),
                          "--max-body-bytes", "1000")
    try:
        big = httpx.post(f"{server.url}/v2/models/slow/infer", content=b"x" * 5000,
                         headers={"x-request-id": "too-big"})
        assert (big.status_code, big.headers["x-request-id"]) == (413, "too-big")
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            body = orjson.dumps(INFER)
            sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                         b"x-request-id: left\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            time.sleep(0.2)  # queued behind nothing, running: then the client goes
        time.sleep(1.0)
        log_file.rename(tmp_path / "access.jsonl.1")
        time.sleep(1.1)  # the path is looked at once a second
        spaced = httpx.post(f"{server.url}/v1/embeddings", content=b'\n {"model": "slow", '
                            b'"input": ["x"]}', headers={"x-request-id": "spaced"})
        assert spaced.status_code == 200
        # HEAD was logged as GET, with the bytes of a body it did not send.
        head = httpx.head(f"{server.url}/v1/models", headers={"x-request-id": "head"})
        assert head.status_code == 200 and head.content == b""
        assert int(head.headers["content-length"]) > 0
    finally:
        stop_server(server)
    before = {line["id"]: line for line in map(
        orjson.loads, (tmp_path / "access.jsonl.1").read_bytes().splitlines())}
    after = {line["id"]: line for line in map(orjson.loads, log_file.read_bytes().splitlines())}
    assert before["too-big"]["status"] == 413
    assert before["left"]["status"] == 499
    assert after["spaced"]["model"] == "slow" and "spaced" not in before
    assert (after["head"]["method"], after["head"]["bytes_out"]) == ("HEAD", 0)
