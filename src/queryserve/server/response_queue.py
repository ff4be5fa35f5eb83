"""The write side of one HTTP connection (`ResponseQueue`): the requests read and not yet answered,
run one at a time and answered in the order they came (pipelining), each written as HTTP/1.1.

A client that sends requests faster than it reads the answers is held back, not buffered: while
the transport's write buffer is above its high-water mark the connection reads nothing and starts
no request, and at most `MAX_PIPELINED` requests (plus one `FEED_BYTES` slice of them) are parsed
ahead of the one being answered; the rest stays in the kernel's buffers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from http import HTTPStatus
from typing import Protocol

from queryserve.server.http_types import Handler, Request, Response, json_error

log = logging.getLogger(__name__)

MAX_PIPELINED = 32  # requests parsed ahead of the one being answered before reading pauses

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Answerer(Protocol):
    """What the queue needs of the server that accepted its connection (`HttpServer`)."""

    handler: Handler
    loop: asyncio.AbstractEventLoop
    date: bytes  # the `date` header line, renewed each second

    def hand_back(self, opened_at: float) -> bool:
        """Close this connection after its answer: the worker holds more than its share, or the
        connection is too old (`HttpServer.hand_back`)."""
        ...


class AnsweredConnection(Protocol):
    """What the queue needs of its connection (`HttpConnection`)."""

    transport: asyncio.Transport | None  # None once closed, or lost
    read_paused: bool

    def reading_a_request(self) -> bool:
        """A request is partly read, and will be answered after those queued."""
        ...

    def pause_reading(self) -> None:
        """The pipeline is full: read nothing more for now."""
        ...

    def pipeline_has_room(self) -> None:
        """Read again: the pipeline is half empty, and the client takes its answers."""
        ...

    def close(self) -> None:
        """Close once what is written is sent."""
        ...


class ResponseQueue:
    """Requests waiting for their answer, one running at a time, answered in order."""

    def __init__(self, connection: AnsweredConnection, server: Answerer) -> None:
        self.connection = connection
        self.server = server  # for its `date`, renewed each second
        self.handler = server.handler
        self.loop = server.loop
        self.pending: deque[tuple[Request, bool]] = deque()  # each with its keep-alive
        self.current: asyncio.Task[Response] | None = None
        self.write_paused = False  # the client is not taking its answers: start nothing new
        self.fatal: Response | None = None  # an error to send once the current answer is out
        self.closing = False  # close once the requests read so far are answered
        self.opened_at = self.loop.time()  # made with its connection, when it was accepted
        self.announce_keep_alive = False  # an HTTP/1.0 client's: it waits for a close unless told
        self.continue_owed = False  # a `100 Continue` asked for behind answers still to write

    @property
    def busy(self) -> bool:
        """A request is being answered, or waits for its turn."""
        return self.current is not None or bool(self.pending)

    @property
    def unanswered(self) -> int:
        return len(self.pending) + (self.current is not None)

    @property
    def backed_up(self) -> bool:
        """Read no further: the client is not taking its answers, or the pipeline is full."""
        return self.write_paused or len(self.pending) > MAX_PIPELINED

    @property
    def waiting_on_client(self) -> bool:
        """Answers (or requests to start) wait on the client to take what was written."""
        return self.current is None and (self.write_paused or bool(self.pending))

    def add(self, request: Request, keep_alive: bool) -> None:
        self.continue_owed = False  # its body came anyway: the request is whole
        self.pending.append((request, keep_alive))
        if len(self.pending) > MAX_PIPELINED:
            self.connection.pause_reading()
        if self.current is None and not self.write_paused:
            self._start_next()

    def resume_writing(self) -> None:
        """The client took enough of its answers: go on answering, and reading."""
        self.write_paused = False
        if self.current is None and self.pending:
            self._start_next()
        if not self.write_paused and len(self.pending) <= MAX_PIPELINED // 2:
            self.connection.pipeline_has_room()

    def refuse(self, response: Response) -> None:
        """Answer a request we will not read to the end, after those before it; then close."""
        if self.busy:
            self.fatal = response
        else:
            self.write(response, keep_alive=False)
            self.connection.close()

    def send_continue(self) -> None:
        """`100 Continue`, once nothing is answered before it: an interim answer must come in
        order. Behind a pipelined request it was never sent, and a client without curl's
        1 s fallback waited for the read timeout (408)."""
        transport = self.connection.transport
        if not self.busy:
            if transport:
                transport.write(_CONTINUE)
        else:
            self.continue_owed = True

    def cancel(self) -> None:
        """The client has gone: cancelling its request cancels the futures it waits on, and the
        batcher drops cancelled items before they reach the model."""
        if self.current is not None:
            self.current.cancel()
        self.pending.clear()

    def _start_next(self) -> None:
        request, keep_alive = self.pending.popleft()
        head = request.method == "HEAD"  # the router answers it as GET: sent without the body
        task = self.loop.create_task(self.handler(request))
        self.current = task
        task.add_done_callback(lambda done: self._finished(done, keep_alive, head))

    def _finished(self, task: asyncio.Task[Response], keep_alive: bool, head: bool) -> None:
        self.current = None
        connection = self.connection
        if connection.transport is None or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("unhandled error answering a request", exc_info=exc)
            response = json_error(500, "internal server error")
        else:
            response = task.result()
        # The last answer before closing says so; so does one the worker hands back, to even
        # out the workers' connections or at the connection's age (the client reconnects,
        # maybe to another worker or replica).
        if (not self.pending and self.fatal is None and not connection.reading_a_request()
                and (self.closing or (keep_alive and self.server.hand_back(self.opened_at)))):
            keep_alive = False
        self.write(response, keep_alive, head)
        if self.fatal is not None and not self.pending:
            self.write(self.fatal, keep_alive=False)
            connection.close()
            return
        if not keep_alive:
            connection.close()
            return
        if self.continue_owed and not self.pending:
            self.continue_owed = False
            connection.transport.write(_CONTINUE)
        if self.write_paused:
            return  # resume_writing goes on once the client has taken its answers
        if self.pending:
            self._start_next()
        if connection.read_paused and len(self.pending) <= MAX_PIPELINED // 2:
            connection.pipeline_has_room()

    def write(self, response: Response, keep_alive: bool, head: bool = False) -> None:
        """One response; for a HEAD request its headers alone, Content-Length included."""
        transport = self.connection.transport
        assert transport is not None
        lines = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s" % (
            response.status, _REASONS.get(response.status, b"Unknown"),
            response.content_type.encode(), len(response.body), self.server.date)]
        for name, value in response.headers:
            lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        if not keep_alive:
            lines.append(b"connection: close\r\n")
        elif self.announce_keep_alive:
            lines.append(b"connection: keep-alive\r\n")
        lines.append(b"\r\n")
        transport.writelines([b"".join(lines), b"" if head else response.body])
