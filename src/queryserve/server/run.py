"""Run the server: listen, load the repository, serve until a signal, then drain.

The lifecycle:
- Listening starts first, so `/v2/health/live` answers while models load (off the loop);
  `/v2/health/ready` answers 200 only once every model is loaded and warmed up.
- SIGTERM, SIGINT or SIGHUP: readiness answers 503 at once and the listener closes; every request
  already accepted, and every item already queued, runs to the end (up to the drain timeout);
  a busy keep-alive connection gets `connection: close` on its last answer, an idle one is
  closed; then the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import uvloop

from queryserve import heap
from queryserve.errors import ServeError
from queryserve.repository import ModelRepository
from queryserve.server.access_log import AccessLog
from queryserve.server.app import ServerApp
from queryserve.server.http import (
    ANSWER_AT_DEADLINE_S,
    DRAIN_TIMEOUT_S,
    HttpLimits,
    HttpServer,
    start_http_server,
)
from queryserve.server.security import AccessControl, binds_loopback
from queryserve.server.state import Limits, ServerState
from queryserve.server.tracing import Tracing
from queryserve.server.workers.peers import Seat, Served, Siblings, answer_siblings

log = logging.getLogger("queryserve")


class GrpcServer(Protocol):
    async def shutdown(self, timeout_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class ServeOptions:
    repository: Path
    host: str = "127.0.0.1"
    port: int = 8000
    cores: int | None = None
    """Cores the models' instances share; threads x instances never exceed it."""
    limits: Limits = field(default_factory=Limits)
    http: HttpLimits = field(default_factory=HttpLimits)
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    """On SIGTERM/SIGINT, how long accepted requests and queued items get to finish."""
    grpc: tuple[str, int] | None = None
    """Where KServe v2 gRPC listens; None: no gRPC."""
    api_keys: tuple[str, ...] = ()
    """Bearer keys every route but `/v2/health/*` needs; none: open."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names answered to, besides loopback names when bound to loopback."""
    cors_origins: tuple[str, ...] = ()
    """Origins allowed to call from a browser (`*`: any)."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Served model names: alias -> the repository's model."""
    access_log: str | None = None
    """A file for the access log's lines, `-` for standard error; None: no access log."""
    otlp_endpoint: str | None = None
    """An OTLP/HTTP traces URL to send a span per request to; None: no tracing."""
    seat: Seat | None = None
    """Set in a worker of `--workers N`: its number and what it shares with the others."""
    prepare: bool = False
    """Prepare the default models (`queryserve prepare`, a child process) while serving, and
    load each as soon as it is ready: `embed` answers minutes before the last is built."""
    strict_readiness: bool = True
    """Ready only while every model of the repository is loaded (`ServerState.ready`)."""


async def serve_async(options: ServeOptions, started: asyncio.Event | None = None) -> int:
    """Serve until a signal, then drain; the work still running at the end, which nothing
    waits for: model builds (a load the signal came in the middle of), and requests and
    queues given up on at the drain's deadline."""
    repository = ModelRepository(options.repository, cap_instances=options.seat is not None)
    if options.cores is not None:
        repository.cores = options.cores
    auth = AccessControl.for_server(options.host, options.api_keys, options.allowed_hosts,
                                    options.cors_origins)
    _warn_if_open(options)
    access_log = AccessLog(options.access_log) if options.access_log is not None else None
    tracing = Tracing(options.otlp_endpoint) if options.otlp_endpoint is not None else None
    app = ServerApp(repository, options.limits, auth, options.aliases, access_log, tracing)
    app.state.strict_readiness = options.strict_readiness
    seat = options.seat
    siblings = app.state.siblings = Siblings(seat) if seat is not None else None
    stop = _stop_on_signals(app.state, worker=siblings is not None)
    listeners = None
    if siblings is None:  # one process: listen first, so /v2/health/live answers while loading
        listeners = await _listen(app, options)
    loading = asyncio.ensure_future(_prepare_and_load(repository, options.repository)
                                    if options.prepare else _load(repository, siblings))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    control = None
    beating: asyncio.Future[None] | None = None
    if loading.done():
        if loading.exception() is not None and listeners is not None:
            await listeners.shutdown(0)  # closed on this loop, not by the collector after it
        loading.result()
        # What loading made (tokenizers, the spell channel's tables, the catalog, the index's
        # items) lives as long as the server. Frozen, the cyclic collector no longer walks it:
        # one full pass over it took 43-57 ms in the middle of a search benchmark.
        gc.collect()
        gc.freeze()
        if siblings is not None:
            # A worker listens only with its models warm: the kernel hands a new connection to
            # any listener on the port, and one still loading would answer it 503.
            control = await answer_siblings(app.state, siblings.seat)
            await _catch_up(repository, siblings)
            listeners = await _listen(app, options)
            siblings.serve(True)
            beating = asyncio.ensure_future(siblings.beat())
        app.state.loading = False
        _log_ready(repository, options.strict_readiness)
        if started is not None:
            started.set()
        await stopping
    else:
        loading.cancel()
    if siblings is not None:
        siblings.serve(False)
    if beating is not None:
        beating.cancel()
    began = time.monotonic()
    unanswered, abandoned = await _drain(listeners, repository, options.drain_timeout_s)
    if control is not None:
        control.close()
    if access_log is not None:
        access_log.close()
    if tracing is not None:  # the last batch of spans goes out, within the drain's time
        await tracing.close(max(1.0, options.drain_timeout_s - (time.monotonic() - began)))
    _log_stopped(time.monotonic() - began, unanswered)
    if repository.builds:
        log.info("%d model build(s) left unfinished", len(repository.builds))
    return len(repository.builds) + unanswered + abandoned


async def _drain(listeners: Listeners | None, repository: ModelRepository,
                 timeout_s: float) -> tuple[int, int]:
    """Stop listening, answer what was accepted and run every queue, in `timeout_s` in all;
    the requests still unanswered at the deadline, and the models whose queues were given up
    on then."""
    began = time.monotonic()
    log.info("draining: not ready, no new connections; up to %.0f s for accepted work",
             timeout_s)
    unanswered = await listeners.shutdown(timeout_s, repository.give_up) if listeners else 0
    left_s = max(0.0, timeout_s - (time.monotonic() - began))
    return unanswered, await repository.close(left_s)


def _log_stopped(elapsed_s: float, unanswered: int) -> None:
    if unanswered:
        log.warning("stopped after %.1f s: %d request(s) unanswered at the drain timeout",
                    elapsed_s, unanswered)
    else:
        log.info("stopped after %.2f s: every accepted request answered", elapsed_s)


def _stop_on_signals(state: ServerState, worker: bool) -> asyncio.Event:
    """The event the first SIGTERM (or SIGINT) sets; in one process a second one exits at
    once. A worker drains on its first SIGTERM and lets later ones be: a signal to the process
    group (a terminal's Ctrl-C, systemd's default KillMode, `kill -- -PGID`, tini -g) reaches
    it directly and again through its supervisor, and the copy is not an operator's second
    signal (which the supervisor turns into SIGKILL). SIGINT is left to the supervisor."""
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stop.is_set() and worker:
            return
        if stop.is_set():
            log.warning("second signal: exiting now")
            os._exit(128 + signum)
        state.draining = True  # readiness turns 503 before anything else happens
        stop.set()

    loop = asyncio.get_running_loop()
    if worker:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # SIGHUP (the terminal closed, or an operator's habit of "reload") drained nothing and
    # lost what was in flight: it drains now, as SIGTERM does.
    for sig in (signal.SIGTERM,) if worker else (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)
    return stop


async def _load(repository: ModelRepository, siblings: Siblings | None) -> None:
    """Every model of the repository; a replacement worker loads what its siblings serve."""
    served = await siblings.models_served() if siblings is not None else None
    if served is None:
        await repository.load_all()
        return
    await repository.load_all(served.stamps, served.stamps)
    _failed_as_there(repository, served)


def _failed_as_there(repository: ModelRepository, served: Served) -> None:
    """What failed to load in the siblings fails here with their reason: the replacement's
    index and its 503s said "not loaded" with no reason, where the siblings' said why."""
    for name, why in served.errors.items():
        if name not in repository.models:
            repository.errors[name] = why


async def _catch_up(repository: ModelRepository, siblings: Siblings) -> None:
    """What the siblings were asked to load or unload while this worker loaded: those calls
    found no control socket here (it opens once the models are warm). A replacement worker
    that skipped this served what had been unloaded, and not what had been loaded, for good."""
    served = await siblings.models_served()
    if served is None:  # no sibling serves yet: the whole server is starting
        return
    for name in sorted(set(repository.models) - set(served.stamps)):
        log.info("model '%s' was unloaded while this worker started: unloading it", name)
        await repository.unload(name)
    # Loaded, or loaded again (by name alone the old one served here for good).
    changed = sorted(name for name, stamp in served.stamps.items()
                     if name not in repository.models or repository.stamps.get(name) != stamp)
    if changed:
        log.info("loaded while this worker started: %s", ", ".join(changed))
        await repository.load_all(changed, served.stamps)
    _failed_as_there(repository, served)


PREPARED = "prepared:"
"""The line `queryserve prepare --announce` prints as each model is ready (`prepare.ANNOUNCED`:
the tools sit above the server, so the word is repeated here rather than imported)."""


def prepare_argv(folder: Path, *more: str) -> list[str]:
    """`queryserve prepare` of `folder` as a child process of this interpreter."""
    return [sys.executable, "-m", "queryserve", "prepare", "--repository", str(folder), *more]


async def _prepare_and_load(repository: ModelRepository, folder: Path) -> None:
    """Run `queryserve prepare --announce` in a child process (export and training libraries
    stay out of the server) and load each model the moment it says the model is ready.
    Readiness stays 503 until the last one, as while loading; its progress goes to this
    process's standard error."""
    prepare = await asyncio.create_subprocess_exec(*prepare_argv(folder, "--announce"),
                                                   stdout=asyncio.subprocess.PIPE)
    assert prepare.stdout is not None
    try:
        async for raw in prepare.stdout:
            line = raw.decode(errors="replace").rstrip()
            if not line.startswith(PREPARED):
                print(line, file=sys.stderr, flush=True)  # prepare's own report, passed on
                continue
            await repository.load_all([line[len(PREPARED):].strip()])
    except asyncio.CancelledError:  # a signal before preparation ended: it ends too
        prepare.terminate()
        await prepare.wait()
        raise
    code = await prepare.wait()
    if code != 0 and not repository.models:  # a server of nothing would still turn ready
        raise ServeError(f"queryserve prepare exited {code} with no model of {folder} "
                         "prepared: nothing to serve (its output above says why)")
    if code != 0:
        log.error("queryserve prepare exited %d: the models it had not prepared are not "
                  "served (readiness is 503 while a model of the repository is not); its "
                  "output above says why", code)


@dataclass
class Listeners:
    http: HttpServer
    grpc: GrpcServer | None

    async def shutdown(self, timeout_s: float,
                       at_deadline: Callable[[], None] | None = None) -> int:
        """Both drained at once; the HTTP requests still unanswered at the deadline. There
        `at_deadline` has what still waits answered (HTTP 503, gRPC UNAVAILABLE: "send it
        again"), and both get `ANSWER_AT_DEADLINE_S` more to write those answers before their
        connections close (gRPC's calls were cancelled by its grace period alone)."""
        deadline = (asyncio.get_running_loop().call_later(timeout_s, at_deadline)
                    if at_deadline is not None else None)
        answer_s = ANSWER_AT_DEADLINE_S if at_deadline is not None else 0.0
        grpc_drained = (asyncio.ensure_future(self.grpc.shutdown(timeout_s + answer_s))
                        if self.grpc is not None else None)
        unanswered = await self.http.shutdown(timeout_s, answer_s)
        if grpc_drained is not None:
            await grpc_drained
        if deadline is not None:
            deadline.cancel()  # all drained before it
        return unanswered


async def _listen(app: ServerApp, options: ServeOptions) -> Listeners:
    shared = options.seat is not None  # workers share the port (SO_REUSEPORT)
    try:
        server = await start_http_server(app, options.host, options.port, options.http,
                                         share=options.seat, refusal=app.refused,
                                         screen=app.screen)
    except OSError as exc:  # the port is taken, the address is not this machine's
        raise ServeError(f"cannot listen on {options.host}:{options.port}: "
                         f"{exc.strerror or exc}") from None
    app.state.transport = server
    log.info("listening on http://%s:%d (%s)", options.host, options.port,
             "models warm" if shared else f"loading models from {options.repository}")
    return Listeners(server, await _start_grpc(app.state, options))


async def _start_grpc(state: ServerState, options: ServeOptions) -> GrpcServer | None:
    if options.grpc is None:
        return None
    from queryserve.server.grpc import start_grpc_server  # grpcio only when gRPC is on

    host, port = options.grpc
    grpc_server = await start_grpc_server(state, host, port, options.http,
                                          reuse_port=options.seat is not None,
                                          grace_s=options.drain_timeout_s)
    log.info("listening on grpc://%s:%d (KServe v2 gRPC)", host, port)
    return grpc_server


def _warn_if_open(options: ServeOptions) -> None:
    addresses = [f"http {options.host}:{options.port}",
                 *([f"grpc {options.grpc[0]}:{options.grpc[1]}"] if options.grpc else [])]
    exposed = [address for address in addresses
               if not binds_loopback(address.split(" ", 1)[1].rsplit(":", 1)[0])]
    if exposed and not options.api_keys:
        log.warning("serving on %s without an API key: anyone who can reach it can use and "
                    "unload every model; set --api-key (or QUERYSERVE_API_KEY)",
                    ", ".join(exposed))


def _log_ready(repository: ModelRepository, strict: bool) -> None:
    # strict: /v2/health/ready answers 503 until the models not ready are, and the log says
    # why (a search step naming a model the repository lacks loaded, and said nothing).
    unready = {entry["name"]: entry.get("reason", "not ready") for entry in repository.index()
               if entry["state"] != "READY"}
    if unready:
        log.warning("%s: %s; serving %s", "not ready" if strict else "ready", "; ".join(
                    f"{name} {'failed to load' if name in repository.errors else 'is not ready'}"
                    f" ({why})" for name, why in sorted(unready.items())),
                    ", ".join(sorted(n for n in repository.models if n not in unready))
                    or "no models")
    else:
        log.info("ready: %s", ", ".join(sorted(repository.models)) or "no models loaded")


def serve(options: ServeOptions) -> None:
    heap.cap_arenas(options.cores or len(os.sched_getaffinity(0)))  # before any thread starts
    if uvloop.run(serve_async(options)):
        # Work left at the drain's deadline still runs on its threads. A build (a 10 s
        # warmup, an ONNX session being made) kept the interpreter alive at exit, which joins
        # its thread: a drained server outlived its --drain-timeout by the rest of the build,
        # and a pod its grace period. A batch still inside ONNX Runtime met the interpreter's
        # finalization and aborted the process ("terminate called", exit 134 or 139; the
        # supervisor then exited 1). Everything was answered or given up on and closed; only
        # the logs are left to write.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
