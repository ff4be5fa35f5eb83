"""A small HTTP/1.1 server on asyncio + httptools (the parser uvicorn uses).

Why not an ASGI server: the hot path is one short request per query, so every microsecond of
per-request Python counts on a 2-core machine; and a connection that drops must cancel its
request's futures so the batcher drops them before the model runs (`connection_lost` does that
here at no per-request cost).

The transport's modules, all imported from this one: here the server (its listener, live
connections and draining shutdown); `connection`, one client, whose parts are `request_parser`
(reading requests, sizes checked as bytes arrive), `deadlines` (its timeouts, on one timer) and
`response_queue` (answers in order, held back while the client does not read); `http_types`, the
request, response, limits and refusal reasons they all speak.

`HttpServer.shutdown` drains: it stops listening, closes idle connections at once, lets busy ones
answer what they have read (the last answer says `connection: close`), and closes the rest at a
deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from email.utils import formatdate

from queryserve.server.connection import FEED_BYTES, HttpConnection
from queryserve.server.http_types import (
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_CONNECTION_AGE_S,
    MAX_HEADER_BYTES,
    MAX_URL_BYTES,
    READ_TIMEOUT_S,
    REJECTION_REASONS,
    ConnectionShare,
    Handler,
    HttpLimits,
    Refusal,
    RejectionReason,
    Request,
    Response,
    Screen,
    json_error,
    plain_refusal,
)
from queryserve.server.response_queue import MAX_PIPELINED

__all__ = [
    "ANSWER_AT_DEADLINE_S", "DRAIN_TIMEOUT_S", "FEED_BYTES", "HEADER_TIMEOUT_S",
    "IDLE_TIMEOUT_S", "MAX_BODY_BYTES",
    "MAX_CONNECTION_AGE_S", "MAX_HEADER_BYTES", "MAX_PIPELINED", "MAX_URL_BYTES",
    "READ_TIMEOUT_S", "REJECTION_REASONS",
    "Handler", "HttpConnection", "HttpLimits", "HttpServer", "Refusal", "RejectionReason",
    "Request", "Response", "json_error", "start_http_server",
]

log = logging.getLogger(__name__)

# What shutdown gives accepted requests (ours take milliseconds): under the 30 s an orchestrator
# such as Kubernetes waits by default between SIGTERM and SIGKILL, with room for the rest.
DRAIN_TIMEOUT_S = 30.0  # on SIGTERM, how long accepted requests get to finish
ANSWER_AT_DEADLINE_S = 0.5
"""After the drain's deadline, how long the requests given up on then have to be answered
(503, written at once) before their connections are closed."""


def _date_line() -> bytes:
    return b"date: %s\r\n" % formatdate(usegmt=True).encode()  # RFC 9110's IMF-fixdate


class HttpServer:
    """A listening server: its live connections, what it refused, and a draining shutdown."""

    listener: asyncio.Server

    def __init__(self, handler: Handler, limits: HttpLimits,
                 share: ConnectionShare | None = None, refusal: Refusal = plain_refusal,
                 screen: Screen | None = None) -> None:
        self.handler = handler
        self.refusal = refusal
        self.screen = screen
        self.limits = limits
        self.share = share  # with workers: the connections each of them holds
        self.rebalanced = 0  # connections closed after an answer to even out the workers
        self.aged = 0  # connections closed after an answer at `max_connection_age_s`
        self.live: set[HttpConnection] = set()
        # Connections that have not sent a byte yet, oldest first: at the cap, the oldest of
        # them makes room for a newcomer, so silent connections cannot lock real clients out.
        self.silent: dict[HttpConnection, None] = {}
        # Every refusal by its reason, connections and malformed requests alike; each reason is
        # there from the start, so a scraper sees a 0 before the first one, not a new series.
        self.rejections: dict[str, int] = dict.fromkeys(REJECTION_REASONS, 0)
        self.draining = False
        self.loop = asyncio.get_running_loop()
        self._drained: asyncio.Event | None = None
        # Every response carries the Date; formatting it costs microseconds, so a timer renews it
        # each second rather than each response paying for it.
        self.date = b""
        self._ticker: asyncio.TimerHandle | None = None
        self._tick()

    @property
    def connections(self) -> int:
        return len(self.live)

    @property
    def refused(self) -> int:
        """Connections turned away: over `max_connections`, or while shutting down."""
        return self.rejections["max_connections"] + self.rejections["draining"]

    @property
    def evicted(self) -> int:
        """Silent or idle connections closed at the cap to let a new one in."""
        return self.rejections["evicted"]

    @property
    def unanswered(self) -> int:
        """Requests read (or being read) and not yet answered, over every connection: summed
        when asked (a scrape, the drain), so requests pay nothing for it."""
        return sum(connection.unanswered for connection in self.live)

    def hand_back(self, opened_at: float) -> bool:
        """Whether the connection that has just been answered (opened at `opened_at`, loop
        time) should close: this worker holds more than its share of the server's connections,
        or the connection is older than `max_connection_age_s`. Its client reconnects, and the
        kernel or a load balancer places the new connection afresh."""
        if self.draining:
            return False  # the drain closes every connection anyway
        if self.share is not None and self.share.over(len(self.live)):
            self.rebalanced += 1
            return True
        if self.loop.time() - opened_at > self.limits.max_connection_age_s:
            self.aged += 1
            return True
        return False

    def _tick(self) -> None:
        self.date = _date_line()
        self._ticker = self.loop.call_later(1.001 - time.time() % 1.0, self._tick)

    def admit(self, connection: HttpConnection) -> bool:
        """Count a new connection in. At `max_connections` one is closed to make room (see
        `_make_room`); with none to close, or while draining, the newcomer is refused and
        counted."""
        if not self.draining and len(self.live) >= self.limits.max_connections:
            self._make_room()
        if self.draining or len(self.live) >= self.limits.max_connections:
            self.rejections["draining" if self.draining else "max_connections"] += 1
            return False
        self.live.add(connection)
        self.silent[connection] = None
        if self.share is not None:
            self.share.hold(len(self.live))
        return True

    def _make_room(self) -> None:
        """Close the connection silent longest (connected, never sent a byte), or else the one
        idle longest between requests: kept alive with nothing to answer, its client reconnects
        when it has more to ask (nginx closes keep-alive connections when it runs out). Only
        silent ones went: 4,096 clients that each sent one request and then idled held every
        slot, and new clients, health probes included, got 503 for the whole idle timeout.
        The scan of every connection is paid only at the cap."""
        if self.silent:
            victim = next(iter(self.silent))
            self.forget(victim)
            victim.abort()
        else:
            idle = [c for c in self.live if c.phase() == "idle"]
            if not idle:
                return
            victim = min(idle, key=lambda c: c.deadlines.last_read)
            self.forget(victim)
            victim.close()
        self.rejections["evicted"] += 1

    def heard(self, connection: HttpConnection) -> None:
        """The connection sent its first bytes: it is a client, no longer a candidate to go."""
        self.silent.pop(connection, None)

    def forget(self, connection: HttpConnection) -> None:
        self.live.discard(connection)
        self.silent.pop(connection, None)
        if self.share is not None:
            self.share.hold(len(self.live))
        if self._drained is not None and not self.live:
            self._drained.set()

    async def shutdown(self, timeout_s: float, answer_s: float = 0.0) -> int:
        """Stop listening, close idle connections, let busy ones answer every request they have
        read (the last answer says `connection: close`), and close whatever is left after
        `timeout_s`, and `answer_s` more for the answers the deadline itself gives (the
        requests given up on then, answered 503). Returns how many requests were still
        unanswered then (0 when drained)."""
        self.draining = True
        self.listener.close()  # its wait_closed() returns at once under uvloop: we track our own
        self._drained = drained = asyncio.Event()
        for connection in list(self.live):
            connection.drain()
        if self.live:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(drained.wait(), timeout_s)
        if self.live and answer_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(drained.wait(), answer_s)
        unanswered = self.unanswered
        for connection in list(self.live):
            connection.abort()
        if self.live:  # aborted transports report connection_lost on the next loop turns
            try:
                await asyncio.wait_for(drained.wait(), 1.0)
            except TimeoutError:
                log.warning("%d connections did not close after abort", len(self.live))
        if self._ticker is not None:
            self._ticker.cancel()
        return unanswered


async def start_http_server(handler: Handler, host: str, port: int, limits: HttpLimits,
                            share: ConnectionShare | None = None,
                            refusal: Refusal = plain_refusal,
                            screen: Screen | None = None) -> HttpServer:
    """Listen on `host:port`; with a `share`, beside the server's other workers on the same
    port (SO_REUSEPORT: the kernel spreads new connections over them), each handing back
    connections while it holds more than its share of them."""
    server = HttpServer(handler, limits, share, refusal, screen)
    server.listener = await server.loop.create_server(
        lambda: HttpConnection(server), host, port, reuse_address=True,
        reuse_port=share is not None,
        backlog=2048)
    return server
