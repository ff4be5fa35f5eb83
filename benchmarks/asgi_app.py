"""`ServerApp` as a raw ASGI 3 application, so that uvicorn and granian can serve the very
application `queryserve serve` serves; `benchmarks/transports.py` measures the three side by side.

    QUERYSERVE_REPOSITORY=R python -m uvicorn --factory asgi_app:make_app --app-dir benchmarks \
        --loop uvloop --http httptools
    QUERYSERVE_REPOSITORY=R PYTHONPATH=benchmarks python -m granian --interface asgi \
        --factory asgi_app:make_app

The application is built as `queryserve serve --http 127.0.0.1:PORT` builds it: the loopback
Host guard, the default limits, no access log. The repository loads at lifespan startup, and what
loading made is then frozen out of the cyclic collector's way, as `serve` does. What the ASGI
server does not give it: the transport's counts on /metrics (`ServerState.transport` stays None),
the HTTP limits (`HttpLimits`) and the drain on SIGTERM.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from queryserve import heap
from queryserve.repository import ModelRepository
from queryserve.server.app import ServerApp
from queryserve.server.http import DRAIN_TIMEOUT_S, Request
from queryserve.server.security import AccessControl

REPOSITORY_VARIABLE = "QUERYSERVE_REPOSITORY"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class AsgiServerApp:
    """One `ServerApp` behind the ASGI `http` and `lifespan` scopes."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.app = ServerApp(repository, auth=AccessControl.for_server("127.0.0.1"))

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: Message, receive: Receive, send: Send) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = Request(scope["method"], scope["path"],
                          scope["query_string"].decode("utf-8", "replace"),
                          {name.decode("latin-1"): value.decode("latin-1")
                           for name, value in scope["headers"]}, body)
        response = await self.app(request)
        headers = [(b"content-type", response.content_type.encode()),
                   (b"content-length", b"%d" % len(response.body))]
        headers += [(name.encode("latin-1"), value.encode("latin-1"))
                    for name, value in response.headers]
        await send({"type": "http.response.start", "status": response.status,
                    "headers": headers})
        await send({"type": "http.response.body", "body": response.body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.repository.load_all()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                gc.collect()
                gc.freeze()
                self.app.state.loading = False
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.repository.close(DRAIN_TIMEOUT_S)
                await send({"type": "lifespan.shutdown.complete"})
                return


def make_app() -> AsgiServerApp:
    """The factory uvicorn and granian call (`--factory`): the repository $QUERYSERVE_REPOSITORY
    names, on every core this process may use."""
    heap.cap_arenas(len(os.sched_getaffinity(0)))  # as `serve` does, before the models' threads
    return AsgiServerApp(ModelRepository(Path(os.environ[REPOSITORY_VARIABLE])))
