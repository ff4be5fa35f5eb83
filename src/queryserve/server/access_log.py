"""The access log (`--access-log`): one JSON line per request, with its id, method, path, model,
status, bytes in and out, and milliseconds in the application.

Off by default, and then nothing is paid. On, a line costs one small `orjson.dumps` and one
`write` system call (unbuffered, so `tail -f` sees every request as it ends and a crash loses
none); its cost is measured in BENCHMARKS.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO

import orjson

from queryserve.errors import ServeError
from queryserve.server.http import Request, Response


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


class AccessLog:
    def __init__(self, target: str) -> None:
        """`target`: a file to append to, or `-` for standard error."""
        self.stream: IO[bytes] = sys.stderr.buffer if target == "-" else open_log_file(target)

    def write(self, request: Request, response: Response, seconds: float) -> None:
        model = request.model if request.model is not None else _body_model(request)
        line = orjson.dumps({
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "id": request.id,
            "method": request.method[:20], "path": request.path[:200], "model": model,
            "status": response.status, "bytes_in": len(request.body),
            "bytes_out": len(response.body), "ms": round(seconds * 1000, 3)},
            option=orjson.OPT_APPEND_NEWLINE)
        try:
            self.stream.write(line)
            if self.stream is sys.stderr.buffer:
                self.stream.flush()
        except OSError:  # a full disk or a closed pipe must not fail the request it logs
            pass

    def close(self) -> None:
        if self.stream is not sys.stderr.buffer:
            self.stream.close()


def _body_model(request: Request) -> str | None:
    """The `model` a JSON body names (OpenAI's routes, the task routes); None otherwise."""
    if not request.body.startswith(b"{"):
        return None
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model[:100] if isinstance(model, str) else None
