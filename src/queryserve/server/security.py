"""Who may ask: API keys, and the browser guard (Host and Origin).

- **API keys** (`--api-key`, TEI's and Infinity's flag): every route but `/v2/health/*` and the
  pages' HTML (`server.pages`) needs `Authorization: Bearer KEY`, over HTTP and in gRPC
  metadata alike. Keys are compared in
  constant time, each of them, so the answer's timing does not tell which key came close.
- **Host** (DNS rebinding): a page on `evil.example` whose name is made to resolve to
  127.0.0.1 reaches a loopback server as same-origin, but its requests still say
  `Host: evil.example`. Bound to loopback, the server answers only to loopback names; elsewhere,
  to `--allowed-hosts` when given.
- **Origin** (cross-site requests): a browser sends `Origin` with every cross-origin request,
  and a "simple" one (a `text/plain` POST) is sent without asking first. A request whose Origin
  is neither the server's own nor one allowed by `--cors-allow-origin` is refused before it
  reaches a model, so a page the user visits cannot unload their models. curl and the SDKs send
  no Origin and are not affected.

The checks read headers only and are skipped entirely when off: nothing is paid per request
unless a key or a guard is set.
"""

from __future__ import annotations

import hmac
import ipaddress
import itertools
import re
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from queryserve.errors import Forbidden, Unauthorized

PUBLIC_PREFIX = "/v2/health/"
"""Liveness and readiness answer without a key: orchestrators probe them without one."""

CORS_ALLOW_HEADERS = ("authorization, content-type, content-encoding, x-request-id, "
                      "inference-header-content-length")
CORS_EXPOSE_HEADERS = ("x-request-id, inference-header-content-length, retry-after, "
                       "www-authenticate")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP field name (RFC 9110 5.1)
CORS_MAX_AGE_S = 600
MAX_REQUEST_ID_CHARS = 200


def valid_id(value: str) -> bool:
    """Whether a client's request id may be echoed (in a header, or gRPC metadata): visible
    ASCII only, and not too long."""
    return 0 < len(value) <= MAX_REQUEST_ID_CHARS and value.isascii() and value.isprintable() \
        and " " not in value


class RequestIds:
    """The request id of every answer, HTTP and gRPC: the client's when it may be echoed,
    else one made here, this process's random prefix and a counter (unique across restarts
    and replicas, and cheaper than a uuid4 per request)."""

    def __init__(self) -> None:
        self._count = itertools.count(1)
        self._prefix = secrets.token_hex(4)

    def of(self, given: str | None) -> str:
        return given if given is not None and valid_id(given) else self.new()

    def new(self) -> str:
        return f"{self._prefix}-{next(self._count):x}"


def is_loopback(host: str) -> bool:
    """Whether a bind address or a Host name names this machine's loopback interface."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def binds_loopback(bind_host: str) -> bool:
    """Whether a bind address is loopback, a name resolved as the listener resolves it
    (`--http vm:8000`, vm being 127.0.0.1, was taken for a public bind: no Host guard, and a
    warning that it served beyond loopback)."""
    if is_loopback(bind_host):
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(
            bind_host.strip("[]"), None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(is_loopback(str(a).split("%")[0]) for a in addresses)


def host_name(host: str) -> str:
    """The name in a Host header, without its port: `[::1]:8000` -> `::1`."""
    if host.startswith("["):
        return host[1:host.find("]")].lower() if "]" in host else host.lower()
    name, _, port = host.rpartition(":")
    return (name if name and port.isdigit() else host).lower()


@dataclass
class AccessControl:
    """API keys and the browser guard, as one server holds them; counts what it refuses."""

    api_keys: tuple[str, ...] = ()
    allowed_hosts: frozenset[str] | None = None
    """Host names the server answers to; None: any. `loopback` stands for every loopback
    name and address."""
    cors_origins: frozenset[str] = frozenset()
    """Origins (`scheme://host[:port]`) allowed to call from a browser; `*` for any."""
    failures: int = 0
    """Requests refused 401: no key, or a wrong one."""
    forbidden: int = 0
    """Requests refused 403: a Host not answered to, or an Origin not allowed."""
    _keys: tuple[bytes, ...] = field(init=False, repr=False)
    guarding: bool = field(init=False)
    """Whether any check is on (the application skips them all otherwise): decided once, as
    the keys, hosts and origins never change."""

    def __post_init__(self) -> None:
        self._keys = tuple(key.encode() for key in self.api_keys)
        self.guarding = bool(self._keys) or self.allowed_hosts is not None \
            or bool(self.cors_origins)

    @classmethod
    def for_server(cls, bind_host: str, api_keys: Iterable[str] = (),
                   allowed_hosts: Iterable[str] = (),
                   cors_origins: Iterable[str] = ()) -> AccessControl:
        """The policy for a server bound to `bind_host`: loopback names only when bound to
        loopback (plus `allowed_hosts`); `allowed_hosts` only, when given, elsewhere."""
        hosts = {host_name(h) for h in allowed_hosts}
        if binds_loopback(bind_host):
            # The usual names spelled out, so the common case is one set lookup.
            hosts.update(("loopback", "localhost", "127.0.0.1", "::1"))
        return cls(tuple(api_keys), frozenset(hosts) if hosts else None,
                   frozenset(o.rstrip("/") for o in cors_origins))

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` value carries one of the keys (always, with no keys).
        Every key is compared, in constant time; a refusal is counted."""
        if not self._keys:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        given = token.strip().encode()
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(given, key)
        if not (matched and scheme.lower() == "bearer"):
            self.failures += 1
            return False
        return True

    def check_key(self, authorization: str | None, *, grpc: bool = False) -> None:
        """Refuse a request without one of the keys: the one check, over HTTP (the
        `Authorization` header) and gRPC (its metadata) alike."""
        if not self.allows(authorization):
            where = "the metadata 'authorization: Bearer KEY'" if grpc \
                else "'Authorization: Bearer KEY'"
            raise Unauthorized(f"this server needs an API key: send {where}"
                               if authorization is None else "the API key is not valid")

    def check_host(self, host: str | None) -> None:
        """Refuse a Host the server does not answer to. A request without one (HTTP/1.0) is let
        through: browsers, the only clients rebinding can steer, always send it."""
        if self.allowed_hosts is None or host is None:
            return
        name = host_name(host)
        if name in self.allowed_hosts or ("loopback" in self.allowed_hosts
                                          and is_loopback(name)):
            return
        self.forbidden += 1
        raise Forbidden(f"this server does not answer to host {host[:100]!r}; "
                        "add it with --allowed-hosts")

    def cors_allows(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin in self.cors_origins

    def check_origin(self, origin: str, host: str | None) -> None:
        """Let a browser's request through from the server's own pages (same origin) or an
        allowed CORS origin; refuse it otherwise."""
        if self.cors_allows(origin):
            return
        if host is not None and origin.partition("://")[2].lower() == host.lower():
            return
        self.forbidden += 1
        raise Forbidden(f"cross-origin requests from {origin[:100]!r} are not allowed; "
                        "allow the origin with --cors-allow-origin")

    def cors_headers(self, origin: str) -> list[tuple[str, str]]:
        """What an answer to an allowed cross-origin request carries."""
        return [("access-control-allow-origin", origin), ("vary", "origin"),
                ("access-control-expose-headers", CORS_EXPOSE_HEADERS)]

    def preflight_headers(self, requested: str = "") -> list[tuple[str, str]]:
        """What the answer to a CORS preflight (`OPTIONS` with Access-Control-Request-Method)
        from an allowed origin carries besides `cors_headers`. The headers the page asks to
        send are allowed besides ours: the OpenAI SDKs send `X-Stainless-*` and
        `OpenAI-Organization` with every request, which the server ignores, and a fixed list
        had the browser block them all."""
        asked = [name.strip().lower() for name in requested.split(",")]
        extra = [name for name in asked if _TOKEN.fullmatch(name) and name not in
                 CORS_ALLOW_HEADERS][:50]
        return [("access-control-allow-methods", "GET, POST, OPTIONS"),
                ("access-control-allow-headers", ", ".join([CORS_ALLOW_HEADERS, *extra])),
                ("access-control-max-age", str(CORS_MAX_AGE_S))]
