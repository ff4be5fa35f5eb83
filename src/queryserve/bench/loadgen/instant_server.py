"""A tiny "answer at once" server, used to measure the generator's own ceiling and by the
tests (it can delay, stall, reject or drop requests on demand). Run it with
``python -m queryserve.bench.loadgen serve-instant``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import cast

import httptools

_OK_BODY = b'{"ok":true}'
_OK_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_OK_BODY), _OK_BODY)
)
_REJECT_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
)


@dataclass
class InstantServerOptions:
    """Misbehaviours for tests; all off = answer every request at once."""

    delay_ms: float = 0.0  # non-blocking delay on every response
    stall_at: int = -1  # request index (0-based) at which the process blocks
    stall_ms: float = 0.0  # how long that stall lasts (time.sleep: all conns)
    reject_every: int = 0  # every Nth request answers 503
    close_every: int = 0  # every Nth request: drop the connection unanswered
    count: int = 0  # requests seen so far (shared by all connections)


class _InstantProtocol(asyncio.Protocol):
    def __init__(self, opts: InstantServerOptions) -> None:
        self.opts = opts
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; cast only.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._close()

    def on_message_complete(self) -> None:
        opts = self.opts
        n = opts.count
        opts.count += 1
        if n == opts.stall_at:
            # Blocking on purpose: the whole server freezes, like a GC pause.
            time.sleep(opts.stall_ms / 1000)
        if opts.close_every and n % opts.close_every == opts.close_every - 1:
            self._close()
            return
        rejected = opts.reject_every and n % opts.reject_every == opts.reject_every - 1
        response = _REJECT_RESPONSE if rejected else _OK_RESPONSE
        if opts.delay_ms > 0:
            asyncio.get_running_loop().call_later(opts.delay_ms / 1000, self._write, response)
        else:
            self._write(response)

    def _write(self, response: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def serve_instant(
    host: str = "127.0.0.1",
    port: int = 0,
    opts: InstantServerOptions | None = None,
    lifetime_s: float = 0.0,
) -> None:
    """Serve fixed responses; prints ``listening HOST:PORT`` once bound.

    ``lifetime_s`` > 0 makes the server exit by itself (a safety net for
    tests and scripts that might not stop it).
    """
    options = opts or InstantServerOptions()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _InstantProtocol(options), host, port)
    bound = server.sockets[0].getsockname()
    print(f"listening {bound[0]}:{bound[1]}", flush=True)
    async with server:
        if lifetime_s > 0:
            await asyncio.sleep(lifetime_s)
        else:
            await server.serve_forever()
