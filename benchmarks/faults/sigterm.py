"""SIGTERM with about 2,000 items queued, under 300 req/s. Targets: no request sent before the
signal gets anything but a 200; the server exits 0 within its drain timeout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faults.client import Background, Stream
from faults.common import (
    OUT,
    STOP_TIMEOUT_S,
    Mode,
    Server,
    groups,
    kserve_body,
    log,
    ms,
    one_model_repository,
    serving,
    verdict,
)
from faults.records import Records, summarize

TITLE = "SIGTERM with ~2,000 items queued"
PATH = "/v2/models/embed/infer"
RATE = 300.0
ITEMS = 16  # queries per request: 4,800 items/s offered, more than embed runs, so it queues
QUEUE = 4096  # embed's max_queue_size here, so that ~2,000 items can wait without a 503
DRAIN_S = 30.0  # the server's default --drain-timeout


@dataclass
class Signalled:
    """What a SIGTERM with a queue built up did: the queue then, every request's record, the
    exit code (None: not within STOP_TIMEOUT_S), seconds to exit, and the server's log."""

    depth: float
    records: Records
    signalled: float
    code: int | None
    exit_s: float
    log_text: str


def sigterm_with_queue(name: str, target: float, *flags: str,
                       on_ready: Callable[[Server], None] | None = None,
                       group: bool = False) -> Signalled:
    """Serve `embed` alone (its queue raised to QUEUE) with `flags`, send RATE req/s of ITEMS
    queries each, SIGTERM the server once `queryserve_queue_depth` reaches `target`, and keep
    the load on a second past its exit. `group`: SIGTERM to the server's whole process group,
    as systemd and `kill -- -PGID` send it."""
    repository = one_model_repository("embed", OUT / "repositories" / name,
                                      max_queue_size=QUEUE)
    stream = Stream(PATH, [kserve_body(g) for g in groups(ITEMS, 256)], RATE,
                    connections=32, max_connections=2048)
    with serving(repository, name, *flags, own_group=group) as server:
        if on_ready is not None:
            on_ready(server)
        with Background(server.url, stream, max_s=120, drain_s=DRAIN_S + 10) as load:
            depth, deadline = 0.0, time.monotonic() + 30
            while depth < target and time.monotonic() < deadline:
                time.sleep(0.05)
                depth = server.metric("queryserve_queue_depth", "embed") or 0.0
            log(f"{name}: {depth:,.0f} items queued; SIGTERM")
            signalled = time.monotonic()
            if group:
                os.killpg(server.process.pid, signal.SIGTERM)
            else:
                server.process.send_signal(signal.SIGTERM)
            try:
                code: int | None = server.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None  # `serving` kills it on the way out
            exited = time.monotonic()
            time.sleep(1.0)  # the load goes on a second past the exit: refused
            (records,) = load.stop()
        text = server.log_text()
    return Signalled(depth, records, signalled, code, exited - signalled, text)


def measure(mode: Mode) -> dict[str, Any]:
    target = mode.pick(2000, 1000)
    run = sigterm_with_queue("sigterm", target)
    depth, code, exit_s = run.depth, run.code, run.exit_s
    said = re.findall(r"stopped after .*", run.log_text)
    before = summarize(run.records, end=run.signalled, by="written")
    after = summarize(run.records, end=run.signalled, by="written", others=True)
    return {
        "queued_at_signal": depth, "target_depth": target, "rate": RATE, "items": ITEMS,
        "queue": QUEUE, "before": before, "after": after, "exit_code": code,
        "exit_s": round(exit_s, 2), "log_line": said[-1] if said else None,
        "verdicts": [
            verdict(before["non_200"] == 0,
                    f"{before['non_200']} non-200 among the {before['requests']:,} requests "
                    f"sent before the signal, with {depth:,.0f} items queued at it (target: 0)"),
            verdict(code == 0 and exit_s <= DRAIN_S,
                    f"exit code {code} after {exit_s:.2f} s (target: 0, within the "
                    f"{DRAIN_S:.0f} s drain timeout)"),
        ],
    }


def render(f: dict[str, Any]) -> list[str]:
    before, after = f["before"], f["after"]
    return [
        f"`embed` alone, its `max_queue_size` raised to {f['queue']:,} so that a queue of",
        "thousands can build without 503s. A child process sends "
        f"{f['rate']:.0f} req/s of {f['items']} queries each",
        "(more than `embed` runs, so the queue grows); `queryserve_queue_depth` is read from",
        "`/metrics` every 50 ms and SIGTERM is sent once it reaches "
        f"{f['target_depth']:,}. The load goes on",
        "until a second after the exit. A request counts as sent before the signal when its",
        "bytes were written before it (the client's clock, the same monotonic clock).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| items queued at the signal (`queryserve_queue_depth`, last read) | "
        f"{f['queued_at_signal']:,.0f} |",
        f"| requests sent before the signal | {before['requests']:,}: "
        + ", ".join(f"{n:,} x {s}" for s, n in before["outcomes"].items())
        + f" (p99 {ms(before['p99_ms'])} ms) |",
        f"| requests sent after it (or never sent) | {after['requests']:,}: "
        + ", ".join(f"{n:,} x {s}" for s, n in after["outcomes"].items()) + " |",
        f"| signal to exit | {f['exit_s']:.2f} s |",
        f"| exit code | {f['exit_code']} |",
        f"| the server's last log line | `{f['log_line']}` |",
    ]
