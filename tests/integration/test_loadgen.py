"""The open-loop load generator, run for real against small loopback servers.

Each server is ``python -m queryserve.bench.loadgen serve-instant`` in a child
process (so its stalls and CPU are not ours), bound to an ephemeral port and
given a lifetime so it can never outlive the test session. Every run is short
(about a second) and stops by itself.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httptools
import pytest

from queryserve.bench.loadgen import (
    InstantServerOptions,
    LoadResult,
    build_requests,
    run_closed_loop,
    run_open_loop,
    run_sync,
)
from queryserve.bench.loadgen.requests import parse_target
from queryserve.bench.search import passes, search_max_rate

BODIES = [b'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":["hi"]}]}']
StartServer = Callable[..., str]


@pytest.fixture
def instant_server() -> Iterator[StartServer]:
    """Factory: start an instant server with options, return its base URL."""
    procs: list[subprocess.Popen[str]] = []

    def start(**opts: Any) -> str:
        InstantServerOptions(**opts)  # type-check the option names early
        args = [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "queryserve.bench.loadgen",
                "serve-instant",
                "--port=0",
                "--lifetime-s=30",
                *args,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening HOST:PORT", or "" if it died
        assert line.startswith("listening "), f"server failed to start: {line!r}"
        return "http://" + line.split()[1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=5)


def _accounted(res: LoadResult) -> int:
    """Every scheduled request ends as a status, an error or a timeout."""
    return sum(res.by_status.values()) + res.errors + res.timeouts


def test_constant_rate_is_kept_and_every_request_answered(instant_server: StartServer) -> None:
    url = instant_server() + "/v2/models/embed/infer"
    res = run_sync(run_open_loop(url, BODIES, 400, 1.0, warmup_s=0.2))
    # Index-based schedule: exactly rate x duration requests in the window.
    assert abs(res.scheduled - 400) <= 1
    assert res.ok == res.sent == res.scheduled == _accounted(res)
    assert res.by_status == {200: res.ok}
    assert res.errors == res.timeouts == 0
    assert 0.9 * 400 <= res.throughput <= 1.1 * 400
    assert set(res.percentiles) == {"p50", "p90", "p95", "p99", "p99.9", "max"}
    assert 0 < res.percentiles["p50"] < 5.0  # an instant server on loopback
    assert res.client_cpu_s > 0
    assert passes(res, 1000)


def test_poisson_arrivals_average_to_the_rate(instant_server: StartServer) -> None:
    url = instant_server() + "/"
    res = run_sync(run_open_loop(url, BODIES, 500, 1.0, warmup_s=0.1, poisson=True, seed=7))
    # 500 expected, Poisson sd ~22: +-100 is > 4 sd.
    assert 400 <= res.scheduled <= 600
    assert res.ok == res.scheduled


def test_stall_is_charged_to_every_request_scheduled_during_it(
    instant_server: StartServer,
) -> None:
    # At 1000/s with 0.2 s warm-up, request #600 arrives ~0.4 s into the window;
    # the whole server then blocks for 200 ms.
    url = instant_server(stall_at=600, stall_ms=200) + "/"
    res = run_sync(run_open_loop(url, BODIES, 1000, 1.0, warmup_s=0.2))
    assert res.ok == res.scheduled == _accounted(res)
    # The first request queued behind the stall waited ~200 ms...
    assert res.percentiles["max"] >= 190
    assert res.percentiles["p99.9"] >= 180
    # ...and, timed from their scheduled sends, the ~200 requests due during
    # the stall carry a linearly shrinking share of it: ~100 of them >= 100 ms.
    # A closed-loop client would have reported about one slow request per
    # connection instead.
    assert 60 <= res.count_at_or_above(100) <= 140
    assert res.max_pool > 4  # the pool grew while connections were stuck


def test_capped_pool_queues_requests_and_counts_the_wait(instant_server: StartServer) -> None:
    # 2 connections x 1 request per 20 ms = 100/s capacity, offered 200/s.
    url = instant_server(delay_ms=20) + "/"
    res = run_sync(
        run_open_loop(
            url, BODIES, 200, 1.0, warmup_s=0.1, connections=2, max_connections=2, drain_s=0.3
        )
    )
    assert res.max_pool == 2
    assert res.throughput < 0.7 * 200
    # The queue grows all run long: waiting time dominates the 20 ms service.
    assert res.percentiles["p50"] > 100
    assert res.timeouts > 0  # backlog still queued when the drain gave up
    assert res.scheduled == _accounted(res)
    assert not passes(res, 1000)


def test_rejections_are_counted_by_status(instant_server: StartServer) -> None:
    url = instant_server(reject_every=4) + "/"
    res = run_sync(run_open_loop(url, BODIES, 400, 0.5, warmup_s=0.1))
    assert res.by_status.get(503, 0) >= res.scheduled // 4 - 2
    assert res.by_status[200] + res.by_status[503] == res.scheduled
    assert res.failures == res.by_status[503]
    assert not passes(res, 1000)


def test_dropped_connections_are_errors_and_the_pool_recovers(
    instant_server: StartServer,
) -> None:
    url = instant_server(close_every=10) + "/"
    res = run_sync(run_open_loop(url, BODIES, 400, 0.5, warmup_s=0.1))
    assert res.errors >= res.scheduled // 10 - 2
    assert res.ok >= 0.85 * res.scheduled
    assert res.scheduled == _accounted(res)


def test_nothing_listening_fails_fast() -> None:
    with socket.socket() as sock:  # find a port that is free right now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(OSError):
        run_sync(run_open_loop(f"http://127.0.0.1:{port}/", BODIES, 100, 0.5))


def _max_rate(url: str, p99_ms: float, *, start_rate: float, max_rate: float,
              **load: Any) -> tuple[float, LoadResult]:
    """The max-rate search driving the real generator, with short runs."""

    async def measure(rate: float) -> LoadResult:
        return await run_open_loop(url, BODIES, rate, 0.3, warmup_s=0.1, **load)

    rate, res, _ = run_sync(search_max_rate(measure, p99_ms, start_rate=start_rate,
                                            max_rate=max_rate, max_probes=5))
    assert res is not None
    return rate, res


def test_find_max_rate_reaches_the_cap_on_an_instant_server(instant_server: StartServer) -> None:
    url = instant_server() + "/"
    rate, res = _max_rate(url, 50, start_rate=200, max_rate=800)
    assert rate == 800
    assert res.target_rate == 800 and passes(res, 50)


def test_find_max_rate_stops_below_capacity(instant_server: StartServer) -> None:
    # 2 connections x 1 request per 10 ms = 200/s capacity.
    url = instant_server(delay_ms=10) + "/"
    rate, res = _max_rate(url, 60, start_rate=50, max_rate=1600, connections=2,
                          max_connections=2, drain_s=0.2)
    assert 50 <= rate <= 200
    assert passes(res, 60)


def test_timeline_buckets_every_answer_by_second(instant_server: StartServer) -> None:
    url = instant_server(reject_every=10) + "/"
    res = run_sync(run_open_loop(url, BODIES, 200, 2.0, warmup_s=0.2))
    ok = sum(b["ok"] for b in res.timeline)
    failed = sum(b["errors"] for b in res.timeline)
    assert ok == res.ok and failed == res.by_status[503]
    assert [b["t_s"] for b in res.timeline][:2] == [0.0, 1.0]
    assert all(b["p99_ms"] is not None and b["p99_ms"] >= b["p50_ms"]
               for b in res.timeline if b["ok"])


def test_closed_loop_users_send_back_to_back(instant_server: StartServer) -> None:
    # 2 users against a server that answers after 10 ms: at most 200 answers a second.
    url = instant_server(delay_ms=10) + "/"
    res = run_sync(run_closed_loop(url, BODIES, 2, 1.0, warmup_s=0.2))
    assert res.mode == "closed" and res.users == 2 and res.max_pool == 2
    assert 120 <= res.throughput <= 205
    assert res.ok == res.sent == res.scheduled == _accounted(res)
    assert 10.0 <= res.percentiles["p50"] < 25.0  # measured from the real send


def test_closed_loop_phase_spawns_users(instant_server: StartServer) -> None:
    url = instant_server(delay_ms=5) + "/"
    res = run_sync(run_closed_loop(url, BODIES, 1, 1.0, spawn_rate=4, warmup_s=0.0))
    # one user at the start, four more over the second (the last may land at the very end)
    assert 4 <= res.users <= 5
    assert res.errors == 0 and res.ok > 0


def test_closed_loop_counts_dropped_connections_and_goes_on(instant_server: StartServer) -> None:
    url = instant_server(close_every=5) + "/"
    res = run_sync(run_closed_loop(url, BODIES, 2, 0.5, warmup_s=0.1))
    # the server drops every 5th request it sees (warm-up ones too), so about 4 answers per
    # error in the window, give or take the few at its edges
    assert res.errors > 0 and abs(res.ok - 4 * res.errors) <= 10
    assert res.failures == res.errors


def test_only_loopback_targets_are_accepted() -> None:
    with pytest.raises(ValueError):
        parse_target("http://example.com/v2/models/embed/infer")
    with pytest.raises(ValueError):
        parse_target("https://127.0.0.1/")
    assert parse_target("http://127.0.0.1:8000/v1/embeddings").port == 8000


def test_requests_are_well_formed_http() -> None:
    target = parse_target("http://127.0.0.1:8000/v1/embeddings")
    [raw] = build_requests(target, [b'{"input":["x"]}'], {"X-Test": "1"})
    seen: dict[str, object] = {}

    class Sink:
        def on_url(self, url: bytes) -> None:
            seen["url"] = url

        def on_body(self, body: bytes) -> None:
            seen["body"] = body

        def on_message_complete(self) -> None:
            seen["done"] = True

    parser = httptools.HttpRequestParser(Sink())
    parser.feed_data(raw)
    assert seen == {"url": b"/v1/embeddings", "body": b'{"input":["x"]}', "done": True}
    assert parser.get_method() == b"POST" and parser.should_keep_alive()
