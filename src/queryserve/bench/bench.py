"""`queryserve bench`: load one server with real queries and report what it sustains.

A plan is one of four load shapes, each a list of steps measured one after another:
a fixed rate, a rate sweep, the max-rate search under a latency bar (all open loop: latency
from the scheduled send time), or closed-loop user phases / a concurrency sweep. Around each
step the server's own statistics are read, so the report splits latency into queue and
compute where the server tells (queryserve, Triton).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import shlex
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from queryserve.bench.first_request import check_first_request
from queryserve.bench.loadgen import LoadResult, run_closed_loop, run_open_loop, run_sync
from queryserve.bench.loadgen.requests import parse_target
from queryserve.bench.payloads import DEFAULT_PATHS, Payloads
from queryserve.bench.search import (
    StopConditions,
    Trial,
    passes,
    search_max_rate,
    stop_reason,
    sweep,
)
from queryserve.bench.server_stats import fetch_stats, stats_delta
from queryserve.errors import BenchError

# The generator is one thread: past this share of a core it, not the server, sets the pace.
CLIENT_BOUND_SHARE = 0.8


@dataclass(frozen=True)
class Phase:
    """Closed loop: ``users`` at the start, ``spawn_rate`` more per second, ``duration_s`` long."""

    users: int
    spawn_rate: float
    duration_s: float

    @property
    def label(self) -> str:
        grow = f" +{self.spawn_rate:g}/s" if self.spawn_rate else ""
        return f"{self.users} users{grow}"


@dataclass(frozen=True)
class BenchPlan:
    """Everything one `queryserve bench` run does, parsed and checked once."""

    url: str  # the full endpoint URL
    model: str
    protocol: str
    payloads: Payloads
    shape: str  # "rate", "sweep", "search", "phases"
    rates: list[float] = field(default_factory=list)  # "rate" (one) and "sweep"
    phases: list[Phase] = field(default_factory=list)  # "phases"
    duration_s: float = 10.0
    warmup_s: float = 1.0
    poisson: bool = False
    seed: int | None = 0
    threshold_ms: float | None = None  # the search's bar; also a sweep stop condition
    percentile: str = "p99"
    start_rate: float = 50.0
    max_rate: float = 20_000.0
    min_rate: float = 5.0
    max_probes: int = 12
    stop: StopConditions = field(default_factory=StopConditions)
    price_per_hour: float | None = None
    connections: int = 4
    max_connections: int = 256
    headers: dict[str, str] = field(default_factory=dict)  # on every request and stats read
    command: str = ""


def endpoint_url(url: str, protocol: str, model: str, path: str | None) -> str:
    """The URL to load: ``path`` if given, else the URL's own path, else the protocol's route;
    for gRPC, ``grpc://HOST:PORT`` (every call is `ModelInfer`)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise BenchError(f"{url!r} has no valid port; e.g. http://127.0.0.1:8000") from None
    if protocol == "grpc":
        if parts.scheme != "grpc" or not parts.hostname or port is None:
            raise BenchError("--protocol grpc loads the server's gRPC address, e.g. "
                             f"grpc://127.0.0.1:8001 (serve --grpc); got {url!r}")
        if path is not None:
            raise BenchError("--path does not apply to --protocol grpc: every call is "
                             "ModelInfer")
        return f"grpc://{parts.netloc}"
    if parts.scheme == "grpc":
        raise BenchError(f"{url!r} is a gRPC address: add --protocol grpc")
    if parts.scheme != "http" or not parts.hostname:
        raise BenchError(f"need an http:// URL such as http://127.0.0.1:8000, got {url!r}")
    if path is None:
        path = parts.path if parts.path not in ("", "/") else DEFAULT_PATHS[protocol]
    try:
        route = path.format(model=model)
    except (KeyError, IndexError, ValueError):
        raise BenchError(f"--path {path!r}: the only placeholder it may hold is {{model}}") \
            from None
    return f"http://{parts.netloc}{route}"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version()}


def cost_per_million(price_per_hour: float | None, inferences_per_s: float) -> float | None:
    """What a million inferences cost at this throughput on a machine billed by the hour."""
    if price_per_hour is None or inferences_per_s <= 0:
        return None
    return round(price_per_hour / (inferences_per_s * 3600) * 1e6, 4)


def step_record(label: str, result: LoadResult, passed: bool | None, *,
                items_per_request: int = 1, price_per_hour: float | None = None,
                server: dict[str, Any] | None = None) -> dict[str, Any]:
    """One step of the results file (the schema the report writers read)."""
    inferences = result.throughput * items_per_request
    return {
        "label": label,
        "mode": result.mode,
        "target_rate": result.target_rate if result.mode == "open" else None,
        "users": result.users,
        "duration_s": result.duration_s,
        "throughput": round(result.throughput, 1),
        "inferences_per_s": round(inferences, 1),
        "latency_ms": {k: round(v, 3) for k, v in result.percentiles.items()},
        "by_status": {str(k): v for k, v in sorted(result.by_status.items())},
        "errors": result.errors,
        "timeouts": result.timeouts,
        "client_cpu_us_per_request": round(result.client_cpu_us_per_request, 1),
        "client_cpu_share": round(result.client_cpu_share, 3),
        "client_bound": result.client_cpu_share >= CLIENT_BOUND_SHARE,
        "send_lag_ms": {k: round(v, 3) for k, v in result.send_lag_ms.items()},
        "passed": passed,
        "cost_per_million": cost_per_million(price_per_hour, inferences),
        "server": server,
        "timeline": result.timeline,
    }


class StepObserver:
    """Hooks the command line uses for its live display; the default shows nothing."""

    def step_started(self, label: str, seconds: float) -> None: ...

    def step_finished(self, record: dict[str, Any]) -> None: ...


def rate_label(rate: float) -> str:
    return f"{rate:,.0f} req/s"


async def _run_steps(plan: BenchPlan, observer: StepObserver,
                     steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The plan's steps, each appended to `steps` once measured (the caller keeps them if
    the run ends early)."""
    p = plan.payloads
    server_of: dict[int, dict[str, Any] | None] = {}  # id(result) -> the server's breakdown

    async def measured(label: str, warmup_s: float, duration_s: float,
                       run: Coroutine[Any, Any, LoadResult]) -> LoadResult:
        """`run`, and what the server counted from the end of its warmup to its end: read
        from its start, the server's figures held the warmup's requests, which the client's
        do not (50 requests against 40)."""
        observer.step_started(label, warmup_s + duration_s)

        async def at_warm_end() -> dict[str, Any] | None:
            await asyncio.sleep(warmup_s)
            return await asyncio.to_thread(fetch_stats, plan.url, plan.model, plan.headers)

        before = asyncio.ensure_future(at_warm_end())
        try:
            result = await run
        finally:
            if not before.done():
                before.cancel()
        after = fetch_stats(plan.url, plan.model, plan.headers)
        warm = before.result() if before.done() and not before.cancelled() else None
        server_of[id(result)] = stats_delta(warm, after)
        return result

    def record(trial: Trial, label: str) -> None:
        server = server_of.pop(id(trial.result), None)
        rec = step_record(label, trial.result, trial.passed,
                          items_per_request=p.items_per_request,
                          price_per_hour=plan.price_per_hour, server=server)
        steps.append(rec)
        observer.step_finished(rec)

    async def open_loop(rate: float) -> LoadResult:
        if plan.protocol == "grpc":
            from queryserve.bench.loadgen.grpc_open_loop import run_grpc_open_loop

            run = run_grpc_open_loop(
                plan.url, p.bodies, rate, plan.duration_s, warmup_s=plan.warmup_s,
                poisson=plan.poisson, seed=plan.seed, connections=plan.connections,
                max_connections=plan.max_connections, headers=plan.headers)
        else:
            run = run_open_loop(
                plan.url, p.bodies, rate, plan.duration_s, warmup_s=plan.warmup_s,
                poisson=plan.poisson, seed=plan.seed, connections=plan.connections,
                max_connections=plan.max_connections, headers=plan.headers,
                content_type=p.content_type, body_headers=p.body_headers)
        return await measured(rate_label(rate), plan.warmup_s, plan.duration_s, run)

    def open_trial(trial: Trial) -> None:
        record(trial, rate_label(trial.level))

    search: dict[str, Any] | None = None
    reason: str | None = None
    if plan.shape == "search":
        assert plan.threshold_ms is not None
        rate, _, _ = await search_max_rate(
            open_loop, plan.threshold_ms, percentile=plan.percentile,
            start_rate=plan.start_rate, max_rate=plan.max_rate, min_rate=plan.min_rate,
            max_probes=plan.max_probes,
            on_trial=open_trial)
        # The step that set the max rate: the last passing run at that rate.
        step = next((i for i in reversed(range(len(steps))) if steps[i]["passed"]
                     and steps[i]["target_rate"] == rate), None)
        # At --max-rate the search stopped looking, not the server keeping up: said so.
        search = {"percentile": plan.percentile, "threshold_ms": plan.threshold_ms,
                  "max_rate": rate, "step": step, "capped": rate >= plan.max_rate}
        if rate == 0:
            reason = (f"no rate from {plan.start_rate:g} down to {plan.min_rate:g} req/s kept "
                      f"{plan.percentile} <= {plan.threshold_ms:g} ms without failures")
    elif plan.shape in ("rate", "sweep"):
        _, reason = await sweep(plan.rates, open_loop, plan.stop,
                                items_per_request=p.items_per_request, on_trial=open_trial)
    else:
        if plan.protocol == "grpc":
            raise BenchError("closed-loop phases (--phase, --users) run over HTTP only; over "
                             "gRPC use --rate, --rates or the max-rate search")
        history: list[LoadResult] = []
        for i, phase in enumerate(plan.phases):
            # Warm up once, in the first phase; later phases continue a warm server.
            warmup_s = plan.warmup_s if i == 0 else 0.0
            result = await measured(phase.label, warmup_s, phase.duration_s, run_closed_loop(
                plan.url, p.bodies, phase.users, phase.duration_s,
                spawn_rate=phase.spawn_rate, warmup_s=warmup_s, headers=plan.headers,
                content_type=p.content_type, body_headers=p.body_headers))
            history.append(result)
            ok = (None if plan.stop.latency_ms is None
                  else passes(result, plan.stop.latency_ms, plan.stop.percentile, 0.0))
            record(Trial(float(phase.users), result, ok), phase.label)
            reason = stop_reason(history, plan.stop, p.items_per_request)
            if reason:
                break
    return {"steps": steps, "search": search, "stop_reason": reason}


def run_bench(plan: BenchPlan, observer: StepObserver | None = None) -> dict[str, Any]:
    """Measure the plan's steps in order; returns the results (the schema `report/` reads)."""
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    steps: list[dict[str, Any]] = []
    outcome: dict[str, Any] = {"steps": steps, "search": None}
    ended: str | None = None  # why the run ended before its plan did
    try:
        # Loopback only, checked before anything is sent: the first request and the server's
        # statistics went out to any host before the load generator refused it.
        parse_target(plan.url, "grpc" if plan.protocol == "grpc" else "http")
        check_first_request(plan.url, plan.protocol, plan.payloads, plan.headers)
        outcome = run_sync(_run_steps(plan, observer or StepObserver(), steps))
    except (ConnectionRefusedError, OSError) as exc:
        ended = f"cannot reach {plan.url}: {exc.strerror or exc}"
    except ValueError as exc:  # the generator's own checks (loopback only, bad numbers)
        ended = str(exc)
    except KeyboardInterrupt:
        ended = "interrupted (Ctrl-C)"
        if not steps:
            raise
    if ended is not None:
        # The steps measured so far are kept: the server dying or a Ctrl-C near the end of
        # a --find-max of minutes lost every one of them.
        if not steps:
            raise BenchError(ended)
        outcome = {"steps": steps, "search": None, "stop_reason": f"ended early: {ended}",
                   "ended_early": ended}
    return {
        "kind": "bench",
        "command": plan.command or shlex.join(sys.argv),
        "started_at": started,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "machine": machine(),
        "url": plan.url,
        "model": plan.model,
        "protocol": plan.protocol,
        "items_per_request": plan.payloads.items_per_request,
        "price_per_hour": plan.price_per_hour,
        **outcome,
    }
