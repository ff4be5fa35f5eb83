"""A rolling deploy behind a real HAProxy under steady load: replicas of `queryserve serve`
replaced one at a time for several rounds, then the fleet scaled 1 -> 3 -> 1. Targets: no
request fails (anything but a 200) in any phase; every replica taken out exits 0 within its
drain timeout.

A replica leaves as a Kubernetes pod does: out of the balancer first (HAProxy's maintenance
state: what removing its endpoint does), a pause (the preStop hook), then SIGTERM; it drains
and exits. A new one joins once its readiness answers 200 and HAProxy's own check agrees.
`Fleet` does both; benchmarks/faults/haproxy.py runs the balancer. Between the two, a phase
replaces replicas with no preStop step (SIGTERM while the balancer still sends them requests), as a
deployment without the pause does: then the balancer's retries are what lose nothing.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.client import Background, Stream
from faults.common import (
    OUT,
    STOP_TIMEOUT_S,
    Mode,
    Server,
    kserve_body,
    launch,
    log,
    ms,
    one_model_repository,
    queries,
    stop,
    verdict,
    wait_ready,
)
from faults.haproxy import Balancer, balancing
from faults.records import summarize

TITLE = "A rolling deploy and a 1 -> 3 -> 1 scale behind HAProxy, under load"
PATH = "/v2/models/embed/infer"
FLAGS = ("--workers", "1", "--cores", "1")
REPLICAS = 2  # the rolling phase's fleet
SCALE = (1, 3, 1)
SLOTS = 4  # HAProxy servers declared: REPLICAS + 1 during a replacement, 3 at the peak
RATE = 150.0  # requests/s of one query each, through HAProxy
PRESTOP_S = 1.0  # out of the balancer -> SIGTERM
DRAIN_S = 30.0  # the replicas' default --drain-timeout


@dataclass
class Replica:
    name: str
    server: Server
    slot: str


@dataclass(frozen=True)
class Departure:
    """A replica taken out: its exit code (None: still running at STOP_TIMEOUT_S, killed),
    and seconds from leaving the balancer to its exit (the preStop pause included)."""

    name: str
    exit_code: int | None
    out_s: float


@dataclass
class Fleet:
    """Replicas of `queryserve serve` (`embed` alone, one worker on one core each) behind
    `balancer`, added and removed as a Deployment's rollout does; `close` stops whatever is
    left, whatever happened."""

    balancer: Balancer
    repository: Path
    logs: Path
    replicas: list[Replica] = field(default_factory=list)
    departures: list[Departure] = field(default_factory=list)
    started: int = 0

    def add(self) -> tuple[Replica, float, float]:
        """Start a replica, wait until it is ready, put it in the balancer; it, seconds from
        start to ready and from ready to HAProxy marking it UP."""
        free = [s for s in self.balancer.slots if s not in {r.slot for r in self.replicas}]
        self.started += 1
        name = f"replica-{self.started}"
        began = time.monotonic()
        server = launch(self.repository, self.logs / f"{name}.log", *FLAGS)
        replica = Replica(name, server, free[0])
        self.replicas.append(replica)  # from here on, `close` stops it
        wait_ready(server)
        ready_s = time.monotonic() - began
        up_s = self.balancer.enable(replica.slot, server.port)
        log(f"rolling: {name} on {replica.slot} (port {server.port}) ready after "
            f"{ready_s:.1f} s, UP {up_s:.2f} s later")
        return replica, ready_s, up_s

    def remove(self, replica: Replica, announce: bool = True) -> Departure:
        """Out of the balancer, the preStop pause, SIGTERM; wait for the drain and the exit.
        Without `announce`, SIGTERM at once: the balancer finds out from the replica (refused
        connections, its check), and the slot is put in maintenance after the exit."""
        began = time.monotonic()
        if announce:
            self.balancer.disable(replica.slot)
            time.sleep(PRESTOP_S)
        replica.server.process.terminate()
        try:
            code: int | None = replica.server.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
            stop(replica.server.process)
        if not announce:
            self.balancer.disable(replica.slot)
        departure = Departure(replica.name, code, round(time.monotonic() - began, 2))
        self.replicas.remove(replica)
        self.departures.append(departure)
        log(f"rolling: {replica.name} out, exit code {code} after {departure.out_s:.1f} s")
        return departure

    def replace(self, old: Replica, announce: bool = True) -> dict[str, Any]:
        """A new replica in, then `old` out: the rollout's step (maxSurge 1, maxUnavailable 0)."""
        began = time.monotonic()
        new, ready_s, up_s = self.add()
        gone = self.remove(old, announce)
        return {"old": old.name, "new": new.name, "ready_s": round(ready_s, 2),
                "up_s": round(up_s, 2), "out_s": gone.out_s, "exit_code": gone.exit_code,
                "total_s": round(time.monotonic() - began, 2)}

    def close(self) -> None:
        for replica in self.replicas:
            stop(replica.server.process)
        self.replicas.clear()


def load(rate: float) -> Stream:
    """KServe infer requests for `embed`, one real query each."""
    return Stream(PATH, [kserve_body([q]) for q in queries(2000)], rate, connections=8)


def measure(mode: Mode) -> dict[str, Any]:
    repository = one_model_repository("embed", OUT / "repositories" / "rolling")
    with balancing(OUT / "haproxy", SLOTS) as balancer:
        fleet = Fleet(balancer, repository, OUT / "logs" / "rolling")
        try:
            rolling = _rolling(fleet, mode, mode.pick(4, 1), announce=True)
            unannounced = _rolling(fleet, mode, mode.pick(2, 1), announce=False)
            while len(fleet.replicas) > SCALE[0]:  # between the phases, without load
                fleet.remove(fleet.replicas[0])
            scaling = _scaling(fleet, mode)
            while fleet.replicas:
                fleet.remove(fleet.replicas[0])
        finally:
            fleet.close()
        config = (OUT / "haproxy" / "haproxy.cfg").read_text().replace(
            str(balancer.api), "/tmp/haproxy-XXXX/api.sock")  # a temporary folder of its own
    departures = fleet.departures
    codes = [d.exit_code for d in departures]
    slowest_s = max(d.out_s for d in departures)
    return {
        "rate": mode.pick(RATE, 100.0), "replicas": REPLICAS, "prestop_s": PRESTOP_S,
        "rolling": rolling, "unannounced": unannounced, "scaling": scaling,
        "departures": [vars(d) for d in departures], "haproxy_config": config,
        "verdicts": [
            _no_failure("rolling deploy", rolling,
                        f"{len(rolling['replacements'])} replacements"),
            _no_failure("rolling deploy without the preStop step", unannounced,
                        f"{len(unannounced['replacements'])} replacements"),
            _no_failure("scale 1 -> 3 -> 1", scaling, f"{len(scaling['steps'])} steps"),
            verdict(all(c == 0 for c in codes) and slowest_s <= PRESTOP_S + DRAIN_S,
                    f"{codes.count(0)} of the {len(codes)} replicas taken out exited 0, the "
                    f"slowest {slowest_s:.1f} s after leaving the balancer (target: all, "
                    f"within the {PRESTOP_S:.0f} s pause + {DRAIN_S:.0f} s drain timeout)"),
        ],
    }


def _no_failure(phase: str, figures: dict[str, Any], did: str) -> str:
    whole = figures["load"]
    return verdict(whole["non_200"] == 0 and whole["requests"] > 0,
                   f"{phase}: {whole['non_200']} of {whole['requests']:,} requests failed "
                   f"through HAProxy during {did} (target: 0)")


def _rolling(fleet: Fleet, mode: Mode, rounds: int, announce: bool) -> dict[str, Any]:
    steady_s = mode.pick(3.0, 1.0)
    while len(fleet.replicas) < REPLICAS:
        fleet.add()
    with Background(fleet.balancer.url, load(mode.pick(RATE, 100.0)), max_s=900,
                    drain_s=10) as running:
        time.sleep(steady_s)
        before = fleet.balancer.counters()
        replacements = []
        for number in range(1, rounds + 1):
            log(f"rolling: round {number} of {rounds}" + ("" if announce else ", no preStop"))
            for old in list(fleet.replicas):
                replacements.append({"round": number, **fleet.replace(old, announce)})
                time.sleep(steady_s)
        after = fleet.balancer.counters()
        (records,) = running.stop()
    return {"rounds": rounds, "replacements": replacements, "load": summarize(records),
            "haproxy": {k: after[k] - before[k] for k in after}}


def _scaling(fleet: Fleet, mode: Mode) -> dict[str, Any]:
    hold_s = mode.pick(5.0, 1.0)
    with Background(fleet.balancer.url, load(mode.pick(RATE, 100.0)), max_s=900,
                    drain_s=10) as running:
        time.sleep(hold_s)
        before = fleet.balancer.counters()
        steps = []
        for target in SCALE[1:]:
            log(f"rolling: scale {len(fleet.replicas)} -> {target}")
            while len(fleet.replicas) != target:
                began, count = time.monotonic(), len(fleet.replicas)
                step: dict[str, Any]
                if count < target:
                    _, ready_s, up_s = fleet.add()
                    step = {"ready_s": round(ready_s, 2), "up_s": round(up_s, 2)}
                else:
                    gone = fleet.remove(fleet.replicas[0])
                    step = {"out_s": gone.out_s, "exit_code": gone.exit_code}
                steps.append({"from": count, "to": len(fleet.replicas),
                              "took_s": round(time.monotonic() - began, 2), **step})
            time.sleep(hold_s)
        after = fleet.balancer.counters()
        (records,) = running.stop()
    return {"steps": steps, "load": summarize(records),
            "haproxy": {k: after[k] - before[k] for k in after}}


def _outcomes(whole: dict[str, Any]) -> str:
    return ", ".join(f"{n:,} x {s}" for s, n in whole["outcomes"].items()) or "none"


def render(f: dict[str, Any]) -> list[str]:
    r, u, s = f["rolling"], f["unannounced"], f["scaling"]
    lines = [
        "Replicas of `queryserve serve --workers 1 --cores 1 --grpc off` serving `embed` alone,",
        "each on its own port, behind Debian's HAProxy (its config below). A child process",
        f"sends {f['rate']:.0f} req/s of one MASSIVE query each to HAProxy throughout each phase.",
        "A replica leaves as a pod does: HAProxy's maintenance state first (its endpoint",
        f"removed), a {f['prestop_s']:.0f} s pause (preStop), then SIGTERM; a new one is added "
        "once ready and",
        "once HAProxy's own check (every 200 ms, rise 2) has passed. Rolling deploy: "
        f"{f['replicas']} replicas,",
        "each replaced in turn (a new one in, then the old one out), "
        f"{r['rounds']} round{'s' * (r['rounds'] > 1)}; then "
        f"{u['rounds']} round{'s' * (u['rounds'] > 1)}",
        "with no preStop step (SIGTERM while HAProxy still sends the replica requests: it",
        "learns from refused connections, which it sends again to another replica, and from",
        "its check); then the fleet scaled 1 -> 3 -> 1, a replica at a time. HAProxy's",
        "redispatches are requests it sent again to another replica after a refused or closed",
        "connection.",
        "",
        "| phase | requests | outcomes | p50 / p99 ms | HAProxy retries / redispatches / 5xx |",
        "|---|---|---|---|---|",
    ]
    for name, phase, did in (
            ("rolling deploy", r, f"{len(r['replacements'])} replacements"),
            ("rolling deploy, no preStop", u, f"{len(u['replacements'])} replacements"),
            ("scale 1 -> 3 -> 1", s, f"{len(s['steps'])} steps")):
        whole, h = phase["load"], phase["haproxy"]
        lines.append(f"| {name} ({did}) | {whole['requests']:,} | {_outcomes(whole)} | "
                     f"{ms(whole['p50_ms'])} / {ms(whole['p99_ms'])} | "
                     f"{h['wretr']} / {h['wredis']} / {h['hrsp_5xx']} |")
    lines += ["", "| replacement | new one ready | then in HAProxy | old one out (pause, "
              "drain, exit) | took | old one's exit code |", "|---|---|---|---|---|---|"]
    for label, phase in (("", r), (", no preStop", u)):
        for x in phase["replacements"]:
            lines.append(
                f"| round {x['round']}{label}: {x['old']} -> {x['new']} | {x['ready_s']:.1f} s "
                f"| {x['up_s']:.2f} s | {x['out_s']:.1f} s | {x['total_s']:.1f} s | "
                f"{x['exit_code']} |")
    lines += ["", "| scale step | took | detail |", "|---|---|---|"]
    for x in s["steps"]:
        detail = (f"ready after {x['ready_s']:.1f} s, in HAProxy {x['up_s']:.2f} s later"
                  if "ready_s" in x else f"exit code {x['exit_code']}")
        lines.append(f"| {x['from']} -> {x['to']} | {x['took_s']:.1f} s | {detail} |")
    lines += ["", "The HAProxy config (the scenario drives the runtime API on its stats socket):",
              "", "```", *f["haproxy_config"].rstrip().splitlines(), "```"]
    return lines
