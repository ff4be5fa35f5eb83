"""Where load may go (loopback only) and the requests sent there, encoded before the run.

A request is complete HTTP/1.1 bytes built once, so sending it during the run is one
``transport.write``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str


def parse_target(url: str, scheme: str = "http") -> _Target:
    """Split ``http://127.0.0.1:PORT/path`` (or ``grpc://127.0.0.1:PORT``); only loopback
    targets are allowed."""
    parts = urlsplit(url)
    if parts.scheme != scheme or parts.hostname is None:
        raise ValueError(f"need a {scheme}://HOST:PORT URL, got {url!r}")
    # Load tests here must never leave the machine.
    if parts.hostname not in _LOOPBACK:
        raise ValueError(f"load generator only targets loopback, got {parts.hostname!r}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(parts.hostname, parts.port or 80, path)


def build_requests(
    target: _Target,
    bodies: Sequence[bytes],
    headers: dict[str, str] | None,
    content_type: str = "application/json",
    body_headers: Sequence[dict[str, str]] | None = None,
) -> list[bytes]:
    """Pre-encode complete HTTP/1.1 POST requests so sending is one write.

    ``headers`` go on every request; ``body_headers[i]`` only on body ``i`` (the KServe
    binary extension's header length differs per body).
    """
    if not bodies:
        raise ValueError("need at least one request body")
    if body_headers is not None and len(body_headers) != len(bodies):
        raise ValueError("body_headers needs one entry per body")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    host = f"{target.host}:{target.port}"
    out = []
    for i, body in enumerate(bodies):
        own = "".join(f"{k}: {v}\r\n" for k, v in body_headers[i].items()) if body_headers else ""
        head = (
            f"POST {target.path} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}{own}\r\n"
        )
        out.append(head.encode("latin-1") + body)
    return out
