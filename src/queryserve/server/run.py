"""Run the server: listen, load the repository off the loop, serve until a signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from queryserve.errors import ServeError
from queryserve.repository import ModelRepository
from queryserve.server.app import Limits, ServerApp
from queryserve.server.http import start_http_server

log = logging.getLogger("queryserve")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    repository: Path
    host: str = "127.0.0.1"
    port: int = 8000
    cores: int | None = None
    """Cores the models' instances share; threads x instances never exceed it."""
    limits: Limits = field(default_factory=Limits)
    drain_s: float = 10.0
    """On SIGINT/SIGTERM, how long requests in flight get to finish."""


async def serve_async(options: ServeOptions, started: asyncio.Event | None = None) -> None:
    repository = ModelRepository(options.repository)
    if options.cores is not None:
        repository.cores = options.cores
    app = ServerApp(repository, options.limits)
    limits = options.limits
    try:
        server = await start_http_server(app, options.host, options.port, limits.max_body_bytes,
                                         limits.read_timeout_s, limits.idle_timeout_s)
    except OSError as exc:  # the port is taken, the address is not this machine's
        repository.close()
        raise ServeError(f"cannot listen on {options.host}:{options.port}: "
                         f"{exc.strerror or exc}") from None
    log.info("listening on http://%s:%d (loading models from %s)", options.host, options.port,
             options.repository)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await loop.run_in_executor(None, repository.load_all)
    await loop.run_in_executor(None, app.load_search)
    # What loading made (tokenizers, the spell channel's tables, the catalog, the index's
    # items) lives as long as the server. Frozen, the cyclic collector no longer walks it:
    # one full pass over it took 43-57 ms in the middle of a search benchmark.
    gc.collect()
    gc.freeze()
    app.loading = False
    if repository.errors:  # /v2/health/ready answers 503 until they load
        log.warning("not ready: %s failed to load; serving %s",
                    ", ".join(sorted(repository.errors)),
                    ", ".join(sorted(repository.models)) or "no models")
    else:
        log.info("ready: %s", ", ".join(sorted(repository.models)) or "no models loaded")
    if started is not None:
        started.set()
    await stop.wait()
    log.info("shutting down: no new connections; %.0f s for requests in flight",
             options.drain_s)
    server.close()
    try:
        await asyncio.wait_for(server.wait_closed(), options.drain_s)
    except TimeoutError:
        log.warning("requests still in flight after %.0f s were dropped", options.drain_s)
    repository.close()


def serve(options: ServeOptions) -> None:
    uvloop.run(serve_async(options))
