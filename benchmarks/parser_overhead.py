"""CPU per request of the HTTP/1.1 request parser (`RequestParser.feed`), in process: a KServe
JSON request as an HTTP client library sends it, seven header lines, fed whole, 200,000 times.
It runs the queryserve that PYTHONPATH finds first, so against an earlier commit:

    git worktree add /tmp/base 998b6d2
    for i in 1 2 3 4 5; do
        PYTHONPATH=/tmp/base/src python benchmarks/parser_overhead.py >> /tmp/base.txt
        python benchmarks/parser_overhead.py >> /tmp/head.txt
    done
"""

from __future__ import annotations

import json
import time

from queryserve.server.http_types import HttpLimits
from queryserve.server.request_parser import RequestParser


class Sink:
    """What the connection is to the parser: counts the requests, refuses nothing."""

    rejected = False

    def __init__(self) -> None:
        self.requests = 0

    def received(self, request: object, keep_alive: bool) -> None:
        self.requests += 1

    def continue_expected(self) -> None:
        pass

    def upgrade_requested(self) -> None:
        pass

    def refuse(self, status: int, message: str, reason: str) -> None:
        raise SystemExit(f"refused {status} {message}")


class Deadlines:
    head_started = None

    def head_began(self) -> None:
        pass


body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES",
                               "data": ["play some jazz"]}]}).encode()
request = (b"POST /v2/models/embed/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
           b"User-Agent: python-httpx/0.28.1\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
           b"Connection: keep-alive\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body


def main() -> None:
    sink = Sink()
    parser = RequestParser(sink, HttpLimits(), Deadlines())  # type: ignore[arg-type]
    for _ in range(5000):  # warm
        parser.feed(request)
    n = 200_000
    started = time.process_time()
    for _ in range(n):
        parser.feed(request)
    assert sink.requests == n + 5000
    print(json.dumps({"us_per_request": round((time.process_time() - started) / n * 1e6, 3)}))


if __name__ == "__main__":
    main()
