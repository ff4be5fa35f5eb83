"""Reloading `embed` under load, then in a row. Targets: no request of the load gets anything
but a 200 while `embed` is reloaded 10 times; after 20 more reloads the server's RSS is within
50 MB of what it was before them."""

from __future__ import annotations

import time
from typing import Any

from faults.client import Background, Stream, post
from faults.common import (
    REPOSITORY,
    Mode,
    Server,
    kserve_body,
    log,
    mb,
    ms,
    queries,
    serving,
    verdict,
)
from faults.records import summarize

TITLE = "Reloading `embed` under load"
PATH = "/v2/models/embed/infer"
RATE = 300.0
RSS_DRIFT_MB = 50.0
RETIRED = "model 'embed' retired"


def reload_embed(server: Server) -> tuple[int, float]:
    """`POST /v2/repository/models/embed/load`: its status and how long it took (s)."""
    status, seconds, _ = post(f"{server.url}/v2/repository/models/embed/load", b"",
                              timeout_s=120)
    return status, seconds


def settle(server: Server, retired: int, timeout_s: float = 30.0) -> int:
    """Wait until the log says `retired` models were retired (each reload retires the model
    it replaces), then for the release that follows (1 s later); returns how many it says."""
    deadline = time.monotonic() + timeout_s
    while server.log_text().count(RETIRED) < retired and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    return server.log_text().count(RETIRED)


def measure(mode: Mode) -> dict[str, Any]:
    under_load, in_a_row = mode.pick(10, 3), mode.pick(20, 5)
    stream = Stream(PATH, [kserve_body([q]) for q in queries(2000)], RATE, connections=8)
    with serving(REPOSITORY, "reload") as server:
        rss_start = server.rss_mb()
        with Background(server.url, stream, max_s=900, drain_s=10) as load:
            time.sleep(2.0)
            log(f"reload: {under_load} reloads of embed under {RATE:.0f} req/s")
            first = time.monotonic()
            loaded = [reload_embed(server) for _ in range(under_load)]
            last = time.monotonic()
            time.sleep(2.0)
            (records,) = load.stop()
        retired = settle(server, under_load)
        rss_before = server.rss_mb()
        log(f"reload: {in_a_row} reloads in a row")
        in_row = [reload_embed(server) for _ in range(in_a_row)]
        retired_after = settle(server, under_load + in_a_row)
        rss_after = server.rss_mb()
    during = summarize(records, first, last)
    whole = summarize(records)
    statuses = [s for s, _ in loaded + in_row]
    drift = rss_after - rss_before
    return {
        "rate": RATE, "reloads_under_load": under_load, "reloads_in_a_row": in_a_row,
        "reload_s": [round(s, 2) for _, s in loaded + in_row],
        "reload_statuses": statuses, "retired": [retired, retired_after],
        "during": during, "whole": whole, "rss_start_mb": rss_start,
        "rss_before_mb": rss_before, "rss_after_mb": rss_after,
        "verdicts": [
            verdict(whole["non_200"] == 0 and set(statuses) == {200},
                    f"{whole['non_200']} non-200 among the {whole['requests']:,} requests of "
                    f"the load ({during['requests']:,} of them during the {under_load} "
                    f"reloads); reloads answered {sorted(set(statuses))} (target: 0 non-200)"),
            verdict(abs(drift) <= RSS_DRIFT_MB,
                    f"server RSS {rss_before:,.0f} MB before {in_a_row} reloads in a row, "
                    f"{rss_after:,.0f} MB after ({drift:+,.0f} MB; target: within "
                    f"{RSS_DRIFT_MB:.0f} MB)"),
        ],
    }


def render(f: dict[str, Any]) -> list[str]:
    during, seconds = f["during"], f["reload_s"]
    return [
        "The whole default repository. A child process sends "
        f"{f['rate']:.0f} req/s to `embed` (one query",
        f"per request, KServe JSON) while `POST /v2/repository/models/embed/load` runs "
        f"{f['reloads_under_load']} times,",
        "one after the other; then, without load, "
        f"{f['reloads_in_a_row']} more in a row. The server's RSS (VmRSS",
        "from /proc) is read once the log says each replaced model was retired, and a",
        "second after its release.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests during the reloads | {during['requests']:,}: "
        + ", ".join(f"{n:,} x {s}" for s, n in during["outcomes"].items())
        + f" (p50 {ms(during['p50_ms'])} / p99 {ms(during['p99_ms'])} / max "
        f"{ms(during['max_ms'])} ms) |",
        f"| requests of the whole load | {f['whole']['requests']:,}: "
        + ", ".join(f"{n:,} x {s}" for s, n in f["whole"]["outcomes"].items()) + " |",
        f"| one reload (mean / max) | {sum(seconds) / len(seconds):.2f} / {max(seconds):.2f} s |",
        f"| models retired, as the log says (after the load / at the end) | "
        f"{f['retired'][0]} / {f['retired'][1]} |",
        f"| server RSS: at start / before the {f['reloads_in_a_row']} in a row / after (MB) | "
        f"{mb(f['rss_start_mb'])} / {mb(f['rss_before_mb'])} / {mb(f['rss_after_mb'])} |",
    ]
