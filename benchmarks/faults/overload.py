"""Overload: three times the rate `embed` sustains, open loop. Targets: every answer a 200 or a
503 with Retry-After, server RSS growth <= 100 MB, and the p99 at 100 req/s right after within
20% of the p99 before."""

from __future__ import annotations

from typing import Any

from faults.client import Background, Stream
from faults.common import (
    REPOSITORY,
    Mode,
    RssSampler,
    bench,
    kserve_body,
    log,
    mb,
    ms,
    queries,
    serving,
    verdict,
)
from faults.records import summarize

TITLE = "Overload: three times the sustainable rate"
PATH = "/v2/models/embed/infer"
RSS_GROWTH_MB = 100.0
P99_DRIFT = 0.20


def measure(mode: Mode) -> dict[str, Any]:
    seconds = mode.pick(60.0, 10.0)
    at_100 = ("--rate", "100", "--duration", mode.pick("10", "3"))
    with serving(REPOSITORY, "overload") as server:
        log("overload: the sustainable rate of embed at p99 <= 10 ms")
        found = bench(server.url, "--find-max", "--p99-ms", "10",
                      *mode.pick((), ("--duration", "1", "--warmup", "0.5",
                                      "--start-rate", "400")),
                      name="overload-find-max")
        sustainable = float(found["search"]["max_rate"] or 0)
        if not sustainable:
            raise RuntimeError("queryserve bench --find-max found no rate with p99 <= 10 ms")
        before = bench(server.url, *at_100, name="overload-100-before")
        rate = 3 * sustainable
        log(f"overload: {rate:,.0f} req/s for {seconds:.0f} s")
        rejected_before = server.metric("queryserve_requests_total", "embed",
                                        outcome="rejected") or 0
        rss_before = server.rss_mb()
        stream = Stream(PATH, [kserve_body([q]) for q in queries(2000)], rate,
                        connections=16, max_connections=1024)
        with RssSampler(server) as rss, Background(server.url, stream, max_s=seconds,
                                                    drain_s=10) as load:
            (records,) = load.result()
        rss_after = server.rss_mb()
        rejected = (server.metric("queryserve_requests_total", "embed", outcome="rejected")
                    or 0) - rejected_before
        log("overload: 100 req/s right after")
        after = bench(server.url, *at_100, name="overload-100-after")
    seen = summarize(records)
    p99_before = before["steps"][0]["latency_ms"].get("p99")
    p99_after = after["steps"][0]["latency_ms"].get("p99")
    peak = rss.peak_mb() or rss_after
    only_allowed = (set(seen["outcomes"]) <= {"200", "503"}
                    and seen["503_without_retry_after"] == 0)
    drift = (p99_after / p99_before - 1) if p99_before and p99_after else None
    return {
        "sustainable_rate": sustainable, "rate": rate, "seconds": seconds,
        "find_max_command": found["command_shown"], "at_100_command": before["command_shown"],
        "answers": seen, "ok_per_s": seen["outcomes"].get("200", 0) / seconds,
        "server_rejected": rejected, "rss_before_mb": rss_before, "rss_peak_mb": peak,
        "rss_after_mb": rss_after, "p99_before_ms": p99_before, "p99_after_ms": p99_after,
        "verdicts": [
            verdict(only_allowed,
                    f"{seen['requests']:,} requests: "
                    + ", ".join(f"{n:,} x {s}" for s, n in seen["outcomes"].items())
                    + f"; {seen['503_without_retry_after']} 503s without Retry-After "
                    "(target: only 200 and 503 with Retry-After)"),
            verdict(peak - rss_before <= RSS_GROWTH_MB,
                    f"server RSS grew by {peak - rss_before:,.0f} MB at most "
                    f"(target <= {RSS_GROWTH_MB:.0f} MB)"),
            verdict(drift is not None and drift <= P99_DRIFT,
                    f"p99 at 100 req/s {ms(p99_before)} ms before, {ms(p99_after)} ms after "
                    f"({'n/a' if drift is None else f'{drift:+.0%}'}; target: at most "
                    f"{P99_DRIFT:.0%} higher)"),
        ],
    }


def render(f: dict[str, Any]) -> list[str]:
    seen = f["answers"]
    return [
        "`embed` served with the whole default repository. The sustainable rate is what",
        f"`{f['find_max_command']}` finds (one query per request, KServe JSON); then a child",
        f"process sends {f['rate']:,.0f} req/s (3x) for {f['seconds']:.0f} s, open loop (each",
        "request on its schedule whatever the server does), and reads the status and headers",
        "of every answer. The server's RSS is read from /proc every 0.25 s; the p99 at",
        f"100 req/s is `{f['at_100_command']}` just before and just after.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| sustainable rate (p99 <= 10 ms) | {f['sustainable_rate']:,.0f} req/s |",
        f"| offered | {f['rate']:,.0f} req/s for {f['seconds']:.0f} s: "
        f"{seen['requests']:,} requests |",
        "| answers | " + ", ".join(f"{n:,} x {s}" for s, n in seen["outcomes"].items())
        + " |",
        f"| 503s without Retry-After | {seen['503_without_retry_after']} |",
        f"| 503s the server counted (`queryserve_requests_total{{outcome=\"rejected\"}}`) | "
        f"{f['server_rejected']:,.0f} |",
        f"| 200s per second during the overload | {f['ok_per_s']:,.0f} "
        f"(p50 {ms(seen['p50_ms'])} / p99 {ms(seen['p99_ms'])} ms) |",
        f"| the client's send lag, p99 (written after the scheduled time) | "
        f"{ms(seen['send_lag_p99_ms'])} ms |",
        f"| server RSS before / peak / after (MB) | {mb(f['rss_before_mb'])} / "
        f"{mb(f['rss_peak_mb'])} / {mb(f['rss_after_mb'])} |",
        f"| p99 at 100 req/s before / after | {ms(f['p99_before_ms'])} / "
        f"{ms(f['p99_after_ms'])} ms |",
    ]
