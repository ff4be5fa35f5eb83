"""The time limits of one HTTP connection (`Deadlines`), and the one timer that checks them.

A head must complete within `header_timeout_s` of its first byte (slowloris), a body that stops
arriving gets a 408 after the read timeout, and a connection idle between requests is closed
after the idle timeout. One timer per connection, re-arming itself, checks every time limit: the
hot path pays a clock read per read, never a timer per request.

The rule is here; what to do once a limit is passed (answer 408, close, or drop the client) is
the connection's, told by `Expiry`.
"""

from __future__ import annotations

import asyncio
from typing import Literal, Protocol

from queryserve.server.http_types import HttpLimits

Phase = Literal["answering", "waiting_on_client", "reading", "idle"]
"""Where a connection stands, as its deadlines see it:
- `answering`: a handler runs (a slow model is not a slow client: no deadline);
- `waiting_on_client`: answers wait on the client to read them, before or after we closed;
- `reading`: a request is partly read;
- `idle`: nothing read, nothing to answer (a new connection, or one between requests)."""

Expiry = Literal["not_reading", "header_timeout", "read_timeout", "silent", "idle"]
"""The limit a connection passed: the first three are `RejectionReason`s; `silent` is a new
connection that sent nothing within the header timeout, `idle` a keep-alive one with no next
request within the idle timeout (both are closed, with no request to answer)."""

MIN_CHECK_S = 0.005  # the timer is never re-armed sooner than this


class Watched(Protocol):
    """What the deadlines ask of their connection (`HttpConnection`)."""

    def phase(self) -> Phase:
        """Where the connection stands now."""
        ...

    def expire(self, expiry: Expiry) -> None:
        """A limit is passed: refuse, close or drop the connection."""
        ...


class Deadlines:
    """One connection's clocks: its last sign of life, when its pending head began, and the
    timer that holds them to the limits."""

    __slots__ = ("connection", "head_started", "last_read", "limits", "loop", "timer")

    def __init__(self, connection: Watched, limits: HttpLimits,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.connection = connection
        self.limits = limits
        self.loop = loop
        self.last_read = 0.0  # the last sign of life from the client: a read, or a drained write
        self.head_started: float | None = None  # when the incomplete (or awaited) head began
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """The connection is accepted: its first head is due from now."""
        self.last_read = self.head_started = self.loop.time()
        self.timer = self.loop.call_later(self._check_every_s(), self._check)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def heard(self) -> None:
        """A sign of life: the client sent bytes, or took some of its answers."""
        self.last_read = self.loop.time()

    def head_began(self) -> None:
        if self.head_started is None:  # else the connection's first head, due since connecting
            self.head_started = self.last_read

    def _check_every_s(self) -> float:
        # Never later than the header or read timeout: a request may begin at any moment.
        return min(self.limits.header_timeout_s, self.limits.read_timeout_s)

    def _check(self) -> None:
        limits = self.limits
        now = self.loop.time()
        quiet = now - self.last_read
        next_s = self._check_every_s()
        phase = self.connection.phase()
        if phase == "waiting_on_client":
            # One that has taken none of its answers for the read timeout is gone or hostile,
            # and a 408 would only queue behind what it does not read.
            if quiet >= limits.read_timeout_s:
                self.connection.expire("not_reading")
                return
            next_s = min(next_s, limits.read_timeout_s - quiet)
        elif phase != "answering":
            reading = phase == "reading"
            if self.head_started is not None:
                late = now - self.head_started
                if late >= limits.header_timeout_s:
                    self.connection.expire("header_timeout" if reading else "silent")
                    return
                next_s = min(next_s, limits.header_timeout_s - late)
            limit = limits.read_timeout_s if reading else limits.idle_timeout_s
            if quiet >= limit:
                self.connection.expire("read_timeout" if reading else "idle")
                return
            next_s = min(next_s, limit - quiet)
        self.timer = self.loop.call_later(max(next_s, MIN_CHECK_S), self._check)
