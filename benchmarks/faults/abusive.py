"""Abusive clients, one kind at a time, while a normal client sends 100 req/s to `embed`
throughout. Targets: the normal client's p99 <= 20 ms in every phase, and all its requests
answered; each abusive connection closed by the server at its deadline; the server's RSS
bounded; the server healthy throughout."""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from typing import Any

from faults.abusers import (
    LATE_S,
    PATH,
    big_header,
    flood,
    idle_flood,
    pipeliner,
    slowloris,
    tiny_chunked_body,
    tiny_chunks,
)
from faults.client import Background, Stream
from faults.common import (
    REPOSITORY,
    Mode,
    RssSampler,
    kserve_body,
    log,
    mb,
    ms,
    queries,
    serving,
    verdict,
)
from faults.records import summarize
from queryserve.bench.server_process import ready_status

TITLE = "Abusive clients beside a normal one"
RATE = 100.0
P99_MS = 20.0
RSS_BOUND_MB = 100.0  # the bound overload uses: none of this should hold more
MAX_CONNECTIONS = 4096  # the server's default here: min(4096, half its 20,000 descriptors)
SETTLE_S = 2.0  # each phase goes on this long after its abusive client, to see the aftermath


def measure(mode: Mode) -> dict[str, Any]:
    header_s, read_s = mode.pick((10.0, 30.0), (3.0, 5.0))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    flood_count = mode.pick(soft - 1000, 6000)
    flags = ("--header-timeout", f"{header_s:g}", "--read-timeout", f"{read_s:g}",
             "--max-connections", str(MAX_CONNECTIONS))
    steady = Stream(PATH, [kserve_body([q]) for q in queries(2000)], RATE, connections=8)
    phases: list[dict[str, Any]] = []
    with serving(REPOSITORY, "abusive", *flags) as server:

        def answered() -> float:
            return server.metric("queryserve_requests_total", "embed", outcome="success") or 0

        def phase(name: str, run: Callable[[], dict[str, Any]]) -> None:
            """Run one abusive client, then watch SETTLE_S more."""
            log(f"abusive: {name}")
            start, cpu, done = time.monotonic(), server.cpu_s(), answered()
            detail = run()
            time.sleep(SETTLE_S)
            phases.append({"name": name, "start": start, "end": time.monotonic(),
                           "cpu_s": round(server.cpu_s() - cpu, 2), "detail": detail,
                           "embed_answered": answered() - done})

        with RssSampler(server) as rss, Background(server.url, steady, max_s=1800,
                                                    drain_s=10) as load:
            quiet_s = mode.pick(10.0, 3.0) - SETTLE_S
            phase("baseline", lambda: time.sleep(quiet_s) or {})
            phase(f"slowloris: {mode.pick(500, 100)} connections", lambda: asyncio.run(
                slowloris(server.port, mode.pick(500, 100), header_s / 4, header_s)))
            phase(f"flood: {flood_count:,} connections", lambda: asyncio.run(
                flood(server, flood_count, header_s)))
            phase("one 128 MB header line", lambda: big_header(server))
            phase("pipelining 20,000 requests, never reading",
                  lambda: pipeliner(server, 20_000, read_s))
            phase(f"keep-alive: {MAX_CONNECTIONS:,} connections ask once, then idle",
                  lambda: asyncio.run(idle_flood(server, MAX_CONNECTIONS)))
            body, chunks = tiny_chunked_body()
            phase("an 8 MB body in 2-byte chunks", lambda: tiny_chunks(server, body, chunks))
            phase("after", lambda: time.sleep(quiet_s) or {})
            (records,) = load.stop()
        baseline_mb = rss.peak_mb(phases[0]["start"], phases[0]["end"]) or 0.0
        ready_after = ready_status(server.url, timeout_s=10)
    for p in phases:
        p["normal"] = summarize(records, p["start"], p["end"])
        p["rss_peak_mb"] = rss.peak_mb(p["start"], p["end"])
        # What `embed` answered to others than the normal client (the pipeliner).
        p["others_answered"] = p.pop("embed_answered") - summarize(
            records, p["start"], p["end"], by="done")["outcomes"].get("200", 0)
    return judge(phases, baseline_mb, ready_after, header_s, read_s, flags)


def judge(phases: list[dict[str, Any]], baseline_mb: float, ready_after: int, header_s: float,
          read_s: float, flags: tuple[str, ...]) -> dict[str, Any]:
    slow, fld, big, pipe = (p["detail"] for p in phases[1:5])
    worst = max(phases, key=lambda p: p["normal"]["p99_ms"] or 0)
    failures = sum(p["normal"]["non_200"] for p in phases)
    growth = max(p["rss_peak_mb"] or baseline_mb for p in phases) - baseline_mb
    accepted = fld["outcomes"].get("closed without an answer", 0)
    refused = fld["outcomes"].get("503 with Retry-After", 0)
    on_time = [
        slow["on_time"] == slow["connections"],
        fld["closed_on_time"] == accepted and fld["refused_on_time"] == refused
        and accepted + refused == fld["attempts"],
        big["status"] == "431" and (big.get("answered_s") or 99) <= LATE_S,
        pipe["closed_after_last_byte_s"] is not None
        and pipe["closed_after_last_byte_s"] <= read_s + LATE_S,
    ]
    idle, tiny = phases[5]["detail"], phases[6]["detail"]
    healthy = set(fld["probes"]) == {"200"} and ready_after == 200
    return {
        "flags": list(flags), "rate": RATE, "baseline_mb": baseline_mb, "phases": phases,
        "ready_after": ready_after,
        "verdicts": [
            verdict((worst["normal"]["p99_ms"] or 1e9) <= P99_MS,
                    f"the normal client's p99 was {ms(worst['normal']['p99_ms'])} ms at worst "
                    f"({worst['name']}) (target: <= {P99_MS:.0f} ms in every phase)"),
            verdict(failures == 0,
                    f"{failures} of the normal client's requests got no 200"
                    + "".join(f"; {p['name']}: {p['normal']['outcomes']}, after opening "
                              f"{p['normal']['connections_opened']} new connection(s)"
                              for p in phases if p["normal"]["non_200"])
                    + " (target: 0)"),
            verdict(all(on_time),
                    "each abusive connection closed at its deadline: slowloris "
                    f"{slow['on_time']}/{slow['connections']}, flood "
                    f"{fld['closed_on_time']}/{accepted} accepted and "
                    f"{fld['refused_on_time']}/{refused} refused, 128 MB header "
                    f"{big['status']}, pipeliner closed "
                    f"{pipe['closed_after_last_byte_s']} s after its last byte "
                    f"(deadlines: {header_s:g} s, at once, at once, {read_s:g} s; "
                    f"+{LATE_S:g} s allowed)"),
            verdict(growth <= RSS_BOUND_MB,
                    f"server RSS at most {growth:+,.0f} MB over the baseline's "
                    f"{baseline_mb:,.0f} MB (bound: {RSS_BOUND_MB:.0f} MB)"),
            verdict(healthy, f"readiness probes during the flood: {fld['probes']}; a new "
                             f"connection after everything: {ready_after} (target: all 200)"),
            verdict(set(idle["newcomers"]) == {"200"} and tiny["status"] == "200",
                    f"new connections with {idle['connections']:,} idle keep-alive ones at "
                    f"the cap: {idle['newcomers']}; the body in 2-byte chunks: "
                    f"{tiny['status']} (target: all 200)"),
        ],
    }


def spread(s: dict[str, float] | None) -> str:
    return "n/a" if s is None else f"{s['min']:.2f} / {s['median']:.2f} / {s['max']:.2f} s"


def render(f: dict[str, Any]) -> list[str]:
    phases = f["phases"]
    slow, fld, big, pipe = (p["detail"] for p in phases[1:5])
    lines = [
        f"The whole default repository, `queryserve serve {' '.join(f['flags'])}`. A child",
        f"process sends {f['rate']:.0f} req/s to `embed` throughout (one query per request, open",
        "loop, 8 keep-alive connections opened first); the abusive clients come one kind at a",
        "time from this process. The server's RSS is read every 0.25 s and its CPU time at each",
        "phase's ends (/proc); each abusive connection's close is timed by the client from its",
        "connect (the pipeliner's from its last byte the kernel took).",
        "",
        "| phase | seconds | normal client: requests, non-200, p50 / p99 / max (ms) | its new "
        "connections | server RSS peak (MB, vs baseline) | server CPU (s) |",
        "|---|---:|---|---:|---|---:|",
    ]
    for p in phases:
        n = p["normal"]
        other = ", ".join(f"{k:,} x {s}" for s, k in n["outcomes"].items() if s != "200")
        lines.append(f"| {p['name']} | {p['end'] - p['start']:.1f} | {n['requests']:,}, "
                     f"{n['non_200']}{f' ({other})' if other else ''}, "
                     f"{ms(n['p50_ms'])} / {ms(n['p99_ms'])} / "
                     f"{ms(n['max_ms'])} | {n['connections_opened']} | {mb(p['rss_peak_mb'])} "
                     f"({(p['rss_peak_mb'] or f['baseline_mb']) - f['baseline_mb']:+,.0f}) | "
                     f"{p['cpu_s']} |")
    lines += [
        "",
        "| abusive connection | what the server did | when (min / median / max) | deadline |",
        "|---|---|---|---|",
        f"| slowloris: {slow['connections']} connections, a head byte every "
        f"{slow['every_s']:g} s | {slow['closed']} closed; answers "
        + ", ".join(f"{n} x {s}" for s, n in slow["answers"].items())
        + f" | {spread(slow['closed_after_s'])} after connect | header timeout "
        f"{slow['deadline_s']:g} s |",
        f"| flood, accepted (at most {fld['most_open']:,} open on the client at once) | "
        f"{fld['outcomes'].get('closed without an answer', 0):,} closed without an answer | "
        f"{spread(fld['closed_after_s'])} after connect | header timeout "
        f"{fld['deadline_s']:g} s |",
        "| flood, over --max-connections | "
        + "; ".join([f"{fld.get('evicted', 0):,} silent ones closed to make room "
                     "(`queryserve_http_connections_evicted_total`)"]
                    + [f"{n:,} x {s}" for s, n in fld["outcomes"].items()
                       if s != "closed without an answer"])
        + (f"; connect errors: {fld['connect_errors']}" if fld["connect_errors"] else "")
        + f" | {spread(fld['refused_after_s'])} after connect | at once |",
        f"| one 128 MB header line, no newline | {big['status']}; the client got "
        f"{big['sent_mb']:.1f} MB out ({big.get('send_error') or 'no error'}) | answered "
        f"{ms((big.get('answered_s') or 0) * 1000)} ms after connect, closed "
        f"{ms((big.get('closed_s') or 0) * 1000)} ms | at once (64 KiB heads) |",
        f"| pipelining {pipe['requests']:,} requests, never reading | {pipe['written']:,} "
        f"of them taken by the kernel before the close, {phases[4]['others_answered']:,.0f} "
        "answered into the void "
        "(`queryserve_requests_total` less the normal client's); connection "
        f"closed | {pipe['closed_after_last_byte_s']} s after the client's last byte was taken "
        f"| read timeout {pipe['deadline_s']:g} s |",
    ]
    if len(phases) > 7:  # measured since 2026-11-28 14:30 UTC
        idle, tiny = phases[5]["detail"], phases[6]["detail"]
        asked = ", ".join(f"{n:,} x {s}" for s, n in idle["answers"].items())
        new = ", ".join(f"{n} x {s}" for s, n in idle["newcomers"].items())
        lines += [
            f"| keep-alive: {idle['connections']:,} connections ask once, then idle (answers: "
            f"{asked}) | {idle['evicted']:,} idle ones closed to make room for 20 new "
            f"connections, one every 0.25 s after them: {new} | at once | at once |",
            f"| one request of {tiny['content_bytes'] / 1e6:.1f} MB in 2-byte chunks "
            f"({tiny['wire_bytes'] / 1e6:.1f} MB on the wire) | {tiny['status']} | answered "
            f"{tiny['answered_s']} s after connect (RSS in the table above) | n/a |",
        ]
    return lines
