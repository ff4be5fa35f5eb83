"""The access log (`--access-log`): one JSON line per request, with its id, method, path, model,
status, bytes in and out, and milliseconds in the application.

Off by default, and then nothing is paid. On, a line costs one small `orjson.dumps` and one
`write` system call (unbuffered, so `tail -f` sees every request as it ends and a crash loses
none); its cost is measured in BENCHMARKS.md. A file moved away (logrotate's `create`) is
followed by a new one within a second; one that cannot be written is said once a minute.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import IO

import orjson

from queryserve.errors import ServeError
from queryserve.server.http import Request, Response

log = logging.getLogger(__name__)


def open_log_file(target: str) -> IO[bytes]:
    """`target` opened to append to, unbuffered, its folder made if missing (as `tee -a` does
    not, but a server pointed at /var/log/NAME/ is expected to); what stops it is said in one
    line, not a traceback."""
    path = Path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab", buffering=0)  # lives as long as the server; `close` closes it
    except OSError as exc:
        raise ServeError(f"cannot write the access log {target}: {exc.strerror or exc}") from None


REOPEN_CHECK_S = 1.0
"""How often the file's path is checked against the file written to: logrotate's `create`
renames the file and makes a new one; written on through the old descriptor, every line went
to the renamed file, then nowhere once it was deleted (its space never freed)."""
WARN_EVERY_S = 60.0


class AccessLog:
    def __init__(self, target: str) -> None:
        """`target`: a file to append to, or `-` for standard error."""
        self.target = target
        self.stream: IO[bytes] = sys.stderr.buffer if target == "-" else open_log_file(target)
        self.checked_at = time.monotonic()
        self.failures = 0
        self.warned_at = -math.inf

    def write(self, request: Request, response: Response, seconds: float) -> None:
        model = request.model if request.model is not None else _body_model(request)
        self.line(request.id, request.method, request.path, model, response.status,
                  len(request.body), 0 if request.method == "HEAD" else len(response.body),
                  seconds)

    def line(self, request_id: str, method: str, path: str, model: str | None, status: int,
             bytes_in: int, bytes_out: int, seconds: float) -> None:
        """One request's line: an HTTP request's (`write`), or a gRPC call's (`POST` and the
        call's path, as nginx logs gRPC; its status as the same error's over HTTP)."""
        line = orjson.dumps({
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "id": request_id,
            "method": method[:20], "path": path[:200], "model": model, "status": status,
            "bytes_in": bytes_in, "bytes_out": bytes_out, "ms": round(seconds * 1000, 3)},
            option=orjson.OPT_APPEND_NEWLINE)
        now = time.monotonic()
        if self.target != "-" and now - self.checked_at >= REOPEN_CHECK_S:
            self.checked_at = now
            self._reopen_if_moved()
        try:
            self.stream.write(line)
            if self.stream is sys.stderr.buffer:
                self.stream.flush()
        except OSError as exc:  # a full disk or a closed pipe must not fail the request
            self.failures += 1
            if now - self.warned_at >= WARN_EVERY_S:  # said, at most once a minute
                self.warned_at = now
                log.warning("the access log %s cannot be written (%s): %d line(s) lost so "
                            "far", self.target, exc.strerror or exc, self.failures)

    def _reopen_if_moved(self) -> None:
        try:
            on_disk = os.stat(self.target)
            moved = not os.path.samestat(on_disk, os.fstat(self.stream.fileno()))
        except OSError:
            moved = True  # deleted (or renamed away): a new file at the path
        if moved:
            with contextlib.suppress(ServeError):
                fresh = open_log_file(self.target)
                self.stream.close()
                self.stream = fresh

    def close(self) -> None:
        if self.stream is not sys.stderr.buffer:
            self.stream.close()


MODEL_SCAN_BYTES = 64 * 1024
"""The largest body the log reads a `model` from itself: one a route did not read (refused
before it: 401, 403)."""


def _body_model(request: Request) -> str | None:
    """The `model` a JSON body names (OpenAI's routes, the task routes); None otherwise, and
    for a body over `MODEL_SCAN_BYTES`: parsed here on the event loop, an 8 MiB body refused
    401 cost 85 ms of CPU a request."""
    if request.body[:64].lstrip()[:1] != b"{" or len(request.body) > MODEL_SCAN_BYTES:
        return None
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model[:100] if isinstance(model, str) else None
