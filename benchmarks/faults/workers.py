"""`queryserve serve --workers 2`: the SIGTERM, reload and kill scenarios against two workers
behind one port. Targets: with ~2,000 items queued over both workers, no request sent before
SIGTERM gets anything but a 200 and the supervisor exits 0 within the drain timeout with no
worker left; reloads of `embed` under load fail no request and reach both workers; a worker
SIGKILLed under load is replaced and serves again within 30 s while the other answers, the
only requests lost being those on the killed worker's connections at the kill (in flight, or
written before the client saw the connection close: within LOST_WINDOW_S of it); a worker
stopped under load (SIGSTOP: its event loop still, as a deadlock leaves it) is killed after
`--worker-timeout` and replaced, and every request scheduled once the replacement is ready is
answered 200; under load,
HTTP connections closed at an age of AGE_S fail no request, and one gRPC channel whose
connection is ended at that age (GOAWAY) fails no call and reaches both workers, where
without the age one worker holds it throughout. Also shown,
with no target: how much of the CPU work the replacement does once ready, and how many
connections the survivor, holding them all, handed back (`connection: close`) to even them
out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from faults.client import Background, Stream, post
from faults.common import (
    OUT,
    Mode,
    Server,
    kserve_body,
    log,
    ms,
    one_model_repository,
    queries,
    serving,
    verdict,
)
from faults.records import summarize
from faults.reload import reload_embed
from faults.sigterm import DRAIN_S, QUEUE, sigterm_with_queue
from queryserve.bench.server_process import connections_on, free_port, ready_status

TITLE = ("Two workers (`--workers 2`): SIGTERM, reloads, a killed worker, a stuck one and aged "
         "connections")
PATH = "/v2/models/embed/infer"
FLAGS = ("--workers", "2", "--cores", "2")
REPLACE_S = 30.0
LOST_WINDOW_S = 0.1
"""A request scheduled this long after the kill was sent once the client knew the connection
had gone: it must not be lost."""
AGE_S = 0.25
"""`--max-connection-age` in the aging scenario: far below the 60 s default, so that one run
ends each connection some dozens of times."""
CALLS_IN_FLIGHT = 16
STUCK_TIMEOUT_S = 5.0
"""`--worker-timeout` in the stuck-worker scenario (30 s by default): what it costs scales
with it, and the figure shows how."""
PROBE_EVERY_S = 0.1
PROBES = 128


def worker_pids(server: Server) -> dict[int, int]:
    """Each worker's current pid, from the supervisor's log."""
    return {int(w): int(p) for w, p in
            re.findall(r"worker (\d+) started \(pid (\d+)\)", server.log_text())}


def measure(mode: Mode) -> dict[str, Any]:
    parts = {"sigterm": _sigterm(mode), "sigterm_group": _sigterm(mode, group=True),
             "reload": _reload(mode), "kill": _kill(mode), "stuck": _stuck(mode),
             "http_aging": _http_aging(mode), "grpc": _grpc_aging(mode)}
    return {**parts, "verdicts": [v for part in parts.values() for v in part["verdicts"]]}


def _sigterm(mode: Mode, group: bool = False) -> dict[str, Any]:
    """SIGTERM to the supervisor; `group`: to the whole process group (systemd's default, `kill
    -- -PGID`), which reaches each worker twice: directly and forwarded."""
    pids: dict[int, int] = {}
    run = sigterm_with_queue("workers-sigterm" + "-group" * group, mode.pick(2000, 1000),
                             *FLAGS, on_ready=lambda server: pids.update(worker_pids(server)),
                             group=group)
    said = "SIGTERM to the process group" if group else "SIGTERM"
    depth, code, exit_s, signalled = run.depth, run.code, run.exit_s, run.signalled
    drained = run.log_text.count("every accepted request answered")
    records = run.records
    left = [pid for pid in pids.values() if _alive(pid)]
    before = summarize(records, end=signalled, by="written")
    return {
        "queued_at_signal": depth, "before": before, "exit_code": code,
        "exit_s": round(exit_s, 2), "workers_drained": drained, "left_behind": left,
        "verdicts": [
            verdict(before["non_200"] == 0,
                    f"{said}: {before['non_200']} non-200 among the {before['requests']:,} "
                    f"requests sent before the signal, {depth:,.0f} items queued at it "
                    "(target: 0)"),
            verdict(code == 0 and exit_s <= DRAIN_S and drained == 2 and not left,
                    f"{said}: exit code {code} after {exit_s:.2f} s, {drained} of 2 workers "
                    f"drained, {len(left)} left running (target: 0 within {DRAIN_S:.0f} s, "
                    "both drained, none left)"),
        ],
    }


def _reload(mode: Mode) -> dict[str, Any]:
    reloads = mode.pick(10, 3)
    repository = one_model_repository("embed", OUT / "repositories" / "workers-reload")
    stream = Stream(PATH, [kserve_body([q]) for q in queries(2000)], 200.0, connections=8)
    with serving(repository, "workers-reload", *FLAGS) as server:
        with Background(server.url, stream, max_s=600, drain_s=10) as load:
            time.sleep(2.0)
            log(f"workers: {reloads} reloads of embed under 200 req/s")
            loaded = [reload_embed(server) for _ in range(reloads)]
            time.sleep(2.0)
            (records,) = load.stop()
        time.sleep(2.0)  # the last retired models' queues run out
        text = server.log_text()
    retired = [text.count(f"worker-{w} queryserve.repository: model 'embed' retired")
               for w in (0, 1)]
    whole = summarize(records)
    statuses = [status for status, _ in loaded]
    return {
        "reloads": reloads, "statuses": statuses, "retired": retired, "load": whole,
        "reload_s": [round(s, 2) for _, s in loaded],
        "verdicts": [
            verdict(whole["non_200"] == 0 and set(statuses) == {200},
                    f"reloads: {whole['non_200']} non-200 among {whole['requests']:,} "
                    f"requests while embed was reloaded {reloads} times; every reload "
                    f"answered {sorted(set(statuses))} (target: 0 and 200)"),
            verdict(min(retired) >= reloads,
                    f"reloads: worker 0 retired {retired[0]} and worker 1 {retired[1]} "
                    f"models (target: {reloads} each: every reload reached both)"),
        ],
    }


def _kill(mode: Mode) -> dict[str, Any]:
    repository = one_model_repository("embed", OUT / "repositories" / "workers-kill")
    stream = Stream(PATH, [kserve_body([q]) for q in queries(2000)], 200.0, connections=8)
    with serving(repository, "workers-kill", *FLAGS) as server:
        with Background(server.url, stream, max_s=300, drain_s=10) as load:
            time.sleep(mode.pick(5.0, 2.0))
            victim = worker_pids(server)[0]
            log(f"workers: SIGKILL worker 0 (pid {victim}) under 200 req/s")
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            ready_s = _until_ready_again(server, victim, killed)
            before = _worker_cpu(server)
            time.sleep(mode.pick(5.0, 2.0))
            after_cpu = _worker_cpu(server)
            (records,) = load.stop()
        restarts = server.metric("queryserve_worker_restarts_total")
        handed_back = server.metric("queryserve_http_connections_rebalanced_total")
    spent = {w: after_cpu.get(w, 0.0) - before.get(w, 0.0) for w in after_cpu}
    share = spent.get("0", 0.0) / max(sum(spent.values()), 1e-9)
    during = summarize(records, killed, killed + (ready_s or REPLACE_S))
    in_flight = summarize(records, killed, killed, by="in flight")
    late = summarize(records, killed + LOST_WINDOW_S)
    after = summarize(records, killed + (ready_s or REPLACE_S))
    lost = summarize(records, by="in flight", start=killed, end=killed + LOST_WINDOW_S)
    return {
        "ready_again_s": ready_s, "restarts": restarts, "in_flight": in_flight,
        "replacement_share": share, "handed_back": handed_back,
        "during": during, "after": after, "late": late, "lost": lost["non_200"],
        "verdicts": [
            verdict(ready_s is not None and ready_s <= REPLACE_S and restarts == 1,
                    f"kill: worker 0 replaced and the server ready again after "
                    f"{'never' if ready_s is None else f'{ready_s:.1f} s'}; "
                    f"queryserve_worker_restarts_total {restarts} (target: within "
                    f"{REPLACE_S:.0f} s, 1)"),
            verdict(during["outcomes"].get("200", 0) > 0 and late["non_200"] == 0,
                    f"kill: {during['non_200']} of {during['requests']:,} requests scheduled "
                    f"while it was replaced failed ({in_flight['requests']} in flight at the "
                    f"kill), {late['non_200']} of the {late['requests']:,} scheduled from "
                    f"{LOST_WINDOW_S * 1000:.0f} ms after it on (target: 0 there; the other "
                    "worker answers throughout)"),
        ],
    }


def _stuck(mode: Mode) -> dict[str, Any]:
    """Worker 0 stopped (SIGSTOP) under load until the supervisor kills it for a still loop.
    The load reuses its last freed connection first, so it may never touch the stuck worker;
    new connections, one every PROBE_EVERY_S, show what clients the kernel hands it meet."""
    repository = one_model_repository("embed", OUT / "repositories" / "workers-stuck")
    stream = Stream(PATH, [kserve_body([q]) for q in queries(2000)], 200.0, connections=8)
    with serving(repository, "workers-stuck", *FLAGS,
                 "--worker-timeout", f"{STUCK_TIMEOUT_S:g}") as server:
        with Background(server.url, stream, max_s=300, drain_s=10) as load:
            time.sleep(mode.pick(5.0, 2.0))
            victim = worker_pids(server)[0]
            log(f"workers: SIGSTOP worker 0 (pid {victim}) under 200 req/s, a new connection "
                f"every {PROBE_EVERY_S:g} s")
            with ThreadPoolExecutor(PROBES) as pool:
                stopped = time.monotonic()
                os.kill(victim, signal.SIGSTOP)
                try:
                    probes = []
                    ready_s = None
                    while ready_s is None and time.monotonic() - stopped < REPLACE_S:
                        probes.append(pool.submit(_probe, server.url))
                        time.sleep(PROBE_EVERY_S)
                        if worker_pids(server).get(0) not in (None, victim) and \
                                ready_status(server.url) == 200:
                            ready_s = time.monotonic() - stopped
                finally:  # killed by then, or this scenario failed: never left stopped
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGCONT)
                answers = [probe.result() for probe in probes]
            time.sleep(mode.pick(5.0, 2.0))
            (records,) = load.stop()
        restarts = server.metric("queryserve_worker_restarts_total")
        killed = f"worker 0 (pid {victim}) killed, stuck" in server.log_text()
    until = stopped + (ready_s or REPLACE_S)
    during = summarize(records, stopped, until)
    after = summarize(records, until)
    longest = max((s for _, s in answers), default=0.0)
    waits = {outcome: sorted(s for o, s in answers if o == outcome)
             for outcome in sorted({o for o, _ in answers})}
    return {
        "timeout_s": STUCK_TIMEOUT_S, "ready_again_s": ready_s, "restarts": restarts,
        "during": during, "after": after,
        "probes": {o: {"count": len(w), "median_s": round(float(np.median(w)), 2),
                       "max_s": round(max(w), 2)} for o, w in waits.items()},
        "verdicts": [
            verdict(killed and ready_s is not None and ready_s <= STUCK_TIMEOUT_S + REPLACE_S
                    and restarts == 1,
                    f"stuck: worker 0 {'killed' if killed else 'not killed'} and the server "
                    f"ready again {'never' if ready_s is None else f'{ready_s:.1f} s'} after "
                    f"it stopped; queryserve_worker_restarts_total {restarts} (target: "
                    f"killed after --worker-timeout {STUCK_TIMEOUT_S:g} s, ready within "
                    f"{REPLACE_S:.0f} s more, 1)"),
            verdict(after["requests"] > 0 and after["non_200"] == 0,
                    f"stuck: {after['non_200']} of the {after['requests']:,} requests "
                    "scheduled once the replacement was ready failed (target: 0)"),
            verdict(bool(answers) and longest <= STUCK_TIMEOUT_S + 2,
                    f"stuck: the longest wait of a request on a new connection while it was "
                    f"stuck, {longest:.1f} s (target: at most --worker-timeout + 2 s, "
                    f"{STUCK_TIMEOUT_S + 2:g} s: no client is held longer)"),
        ],
    }


def _probe(url: str) -> tuple[str, float]:
    """One request on a new connection: its status (or how it failed) and its seconds."""
    started = time.monotonic()
    try:
        status, _, _ = post(url + PATH, kserve_body(["a new connection"]), REPLACE_S * 2)
    except OSError as exc:  # reset when the stuck worker's listening socket went with it
        reason = getattr(exc, "reason", exc)
        return type(reason).__name__, time.monotonic() - started
    return str(status), time.monotonic() - started


def _http_aging(mode: Mode) -> dict[str, Any]:
    """200 req/s over 8 keep-alive connections, each closed after an answer at AGE_S."""
    repository = one_model_repository("embed", OUT / "repositories" / "workers-http-aging")
    stream = Stream(PATH, [kserve_body([q]) for q in queries(2000)], 200.0, connections=8)
    with serving(repository, "workers-http-aging", *FLAGS,
                 "--max-connection-age", f"{AGE_S:g}") as server:
        with Background(server.url, stream, max_s=300, drain_s=10) as load:
            log(f"workers: 200 req/s over 8 connections, each closed at an age of {AGE_S:g} s")
            time.sleep(mode.pick(20.0, 4.0))
            (records,) = load.stop()
        aged = server.metric("queryserve_http_connections_aged_total")
    whole = summarize(records)
    return {
        "load": whole, "aged": aged,
        "verdicts": [
            verdict(whole["non_200"] == 0 and (aged or 0) > 0,
                    f"HTTP aging: {whole['non_200']} non-200 among {whole['requests']:,} "
                    f"requests while {aged or 0:.0f} connections were closed at an age of "
                    f"{AGE_S:g} s (target: 0, and some closed)"),
        ],
    }


def _grpc_aging(mode: Mode) -> dict[str, Any]:
    """One tritonclient gRPC channel, CALLS_IN_FLIGHT calls in flight on it, against the two
    workers: once with the connection never aged, once ended every AGE_S."""
    repository = one_model_repository("embed", OUT / "repositories" / "workers-grpc")
    arms = {}
    for name, age in (("never", 0.0), ("aged", AGE_S)):
        port = free_port()
        with serving(repository, f"workers-grpc-{name}", *FLAGS, "--grpc", f"127.0.0.1:{port}",
                     "--max-connection-age", f"{age:g}") as server:
            log(f"workers: one gRPC channel, {CALLS_IN_FLIGHT} calls in flight, connection "
                f"age {'never ended' if not age else f'{age:g} s'}")
            arms[name] = asyncio.run(_one_channel(port, worker_pids(server),
                                                  mode.pick(20.0, 4.0)))
    aged, never = arms["aged"], arms["never"]
    return {
        "age_s": AGE_S, **arms,
        "verdicts": [
            verdict(aged["failed"] == 0 and len(aged["held_by"]) == 2,
                    f"gRPC: {aged['failed']} of {aged['calls']:,} calls on one channel failed "
                    f"while its connection was ended every {AGE_S:g} s "
                    f"({aged['connections']} connections), and it was held by "
                    f"{len(aged['held_by'])} of 2 workers (target: 0, both; never ended: "
                    f"{len(never['held_by'])} worker)"),
        ],
    }


async def _one_channel(port: int, pids: dict[int, int], seconds: float) -> dict[str, Any]:
    """Calls on one channel for `seconds`, and which worker held its connection, sampled."""
    import tritonclient.grpc as grpc
    import tritonclient.grpc.aio as grpc_aio

    client = grpc_aio.InferenceServerClient(f"127.0.0.1:{port}")
    texts = queries(2000)
    outcomes: Counter[str] = Counter()
    end = time.monotonic() + seconds

    async def caller(first: int) -> None:
        for i in range(first, 1 << 30, CALLS_IN_FLIGHT):
            if time.monotonic() >= end:
                return
            text = grpc.InferInput("text", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[texts[i % len(texts)].encode()]], dtype=object))
            try:
                await client.infer("embed", [text])
                outcomes["OK"] += 1
            except Exception as exc:  # counted by kind: the figure is how many
                outcomes[type(exc).__name__ + ": " + str(exc)[:80]] += 1

    samples: Counter[int] = Counter()
    seen: set[str] = set()

    async def sampler() -> None:
        while time.monotonic() < end:
            held = connections_on(port, pids)
            seen.update(held)
            samples.update(set(held.values()))
            await asyncio.sleep(0.02)

    started = time.monotonic()
    await asyncio.gather(sampler(), *(caller(i) for i in range(CALLS_IN_FLIGHT)))
    elapsed = time.monotonic() - started
    await client.close()
    calls = sum(outcomes.values())
    return {"calls": calls, "calls_per_s": round(calls / elapsed, 1),
            "failed": calls - outcomes["OK"], "outcomes": dict(outcomes),
            "connections": len(seen), "held_by": sorted(samples),
            "samples_held": {str(w): n for w, n in sorted(samples.items())}}


def _until_ready_again(server: Server, victim: int, killed: float) -> float | None:
    """Seconds from the kill until a new worker 0 serves and the server is ready."""
    while time.monotonic() - killed < REPLACE_S:
        time.sleep(0.05)
        if worker_pids(server).get(0) in (None, victim):
            continue
        if ready_status(server.url) == 200:
            return time.monotonic() - killed
    return None


def _worker_cpu(server: Server) -> dict[str, float]:
    """Each worker's CPU seconds so far (any worker answers a scrape for all)."""
    return {worker: server.metric("process_cpu_seconds_total", worker=worker) or 0.0
            for worker in ("0", "1")}


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text().lower()


def _sigterm_rows(s: dict[str, Any], to: str) -> list[str]:
    before = s["before"]
    return [
        f"| SIGTERM to {to}, 300 req/s of 16 queries, `max_queue_size` {QUEUE:,} | items "
        f"queued at the signal (both workers) | {s['queued_at_signal']:,.0f} |",
        f"| | requests sent before the signal | {before['requests']:,}: "
        + ", ".join(f"{n:,} x {st}" for st, n in before["outcomes"].items()) + " |",
        f"| | signal to exit; exit code; workers drained; left running | {s['exit_s']:.2f} s; "
        f"{s['exit_code']}; {s['workers_drained']} of 2; {len(s['left_behind'])} |",
    ]


def _stuck_rows(s: dict[str, Any] | None) -> list[str]:
    if s is None:  # a report from before the scenario
        return []
    return [
        f"| worker 0 stopped (SIGSTOP: its event loop still) under 200 req/s, "
        f"`--worker-timeout {s['timeout_s']:g}` | stop to ready again (killed, a new worker 0 "
        "serving) | " + ("never" if s["ready_again_s"] is None
                         else f"{s['ready_again_s']:.1f} s") + " |",
        f"| | requests scheduled until ready again | {s['during']['requests']:,}: "
        + ", ".join(f"{n:,} x {st}" for st, n in s["during"]["outcomes"].items()) + " |",
        f"| | requests after | {s['after']['requests']:,}: "
        + ", ".join(f"{n:,} x {st}" for st, n in s["after"]["outcomes"].items())
        + f" (p99 {ms(s['after']['p99_ms'])} ms) |",
        f"| | a request on a new connection every {PROBE_EVERY_S:g} s until ready again: "
        "outcome x count (median, max seconds) | " + ", ".join(
            f"{o} x {p['count']} ({p['median_s']:.2f}, {p['max_s']:.2f} s)"
            for o, p in s.get("probes", {}).items()) + " |",
    ]


def render(f: dict[str, Any]) -> list[str]:
    r, k, g, h = f["reload"], f["kill"], f["grpc"], f["http_aging"]
    return [
        "`embed` alone, served by `queryserve serve --workers 2 --cores 2` (two workers of one",
        "core each, one instance each): the same faults as sections 2 and 3, a worker killed",
        "and one stopped (its event loop still, as a deadlock leaves it),",
        "and connections the server ends at an age of "
        f"{AGE_S:g} s (`--max-connection-age`, 60 s by",
        "default). Figures are the whole server's (`/metrics` sums both workers).",
        "",
        "| scenario | figure | value |",
        "|---|---|---|",
        *_sigterm_rows(f["sigterm"], "the supervisor"),
        *(_sigterm_rows(f["sigterm_group"], "the process group (each worker gets it twice: "
                        "directly and forwarded)") if "sigterm_group" in f else []),
        f"| {r['reloads']} reloads of `embed` under 200 req/s | requests | "
        f"{r['load']['requests']:,}: "
        + ", ".join(f"{n:,} x {st}" for st, n in r["load"]["outcomes"].items())
        + f" (p99 {ms(r['load']['p99_ms'])} ms) |",
        f"| | each reload (answered when both workers had loaded) | "
        f"{', '.join(f'{x:.1f}' for x in r['reload_s'])} s |",
        f"| | models retired, worker 0 / worker 1 | {r['retired'][0]} / {r['retired'][1]} |",
        "| worker 0 SIGKILLed under 200 req/s | kill to ready again (a new worker 0 serving) | "
        + ("never" if k["ready_again_s"] is None else f"{k['ready_again_s']:.1f} s") + " |",
        f"| | requests in flight at the kill | {k['in_flight']['requests']} |",
        f"| | requests lost (on its connections: in flight, or written within "
        f"{LOST_WINDOW_S * 1000:.0f} ms of the kill) | {k['lost']} |",
        f"| | requests scheduled until ready again | {k['during']['requests']:,}: "
        + ", ".join(f"{n:,} x {st}" for st, n in k["during"]["outcomes"].items()) + " |",
        f"| | requests after | {k['after']['requests']:,}: "
        + ", ".join(f"{n:,} x {st}" for st, n in k["after"]["outcomes"].items()) + " |",
        f"| | the replacement's share of both workers' CPU work after it was ready; "
        f"connections handed back | {k['replacement_share']:.0%}; "
        f"{k['handed_back'] or 0:.0f} |",
        *_stuck_rows(f.get("stuck")),
        f"| 200 req/s over 8 keep-alive connections, each closed after an answer once "
        f"{g['age_s']:g} s old | requests; connections closed at their age | "
        f"{h['load']['requests']:,}: "
        + ", ".join(f"{n:,} x {st}" for st, n in h["load"]["outcomes"].items())
        + f" (p99 {ms(h['load']['p99_ms'])} ms); {h['aged'] or 0:.0f} |",
        *(f"| one gRPC channel (tritonclient), {CALLS_IN_FLIGHT} calls in flight, connection "
          + ("never ended" if arm == "never" else f"ended every {g['age_s']:g} s")
          + f" | calls; failed; connections seen; samples each worker held it "
          f"(every 20 ms), worker 0 / 1 | {g[arm]['calls']:,} ({g[arm]['calls_per_s']:,.0f}/s); "
          f"{g[arm]['failed']}; {g[arm]['connections']}; "
          f"{g[arm]['samples_held'].get('0', 0)} / {g[arm]['samples_held'].get('1', 0)} |"
          for arm in ("never", "aged")),
        "",
        "The replacement's share: the client opens a connection only when none of its idle ones",
        "is free (the last freed is reused first), and at 200 req/s of a few milliseconds",
        "about one request is in flight, so the connections the survivor hands back are not",
        "reopened and the survivor answers alone (it answered every request: the second",
        "verdict below). Under more concurrency the client reopens them, and the kernel",
        "hashes them afresh (README, \"Workers\").",
    ]
