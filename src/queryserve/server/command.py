"""`queryserve serve`: its flags, and the `ServeOptions` they make.

The environment is read here: `QUERYSERVE_API_KEY` (keys separated by commas) adds to
`--api-key`, so a key need not appear in the process list. (OpenTelemetry's SDK reads its own
`OTEL_*` variables, `OTEL_SERVICE_NAME` among them: `tracing.py`.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import resource
from pathlib import Path
from urllib.parse import urlsplit

from queryserve.arguments import count, non_negative, positive
from queryserve.config import is_model_name
from queryserve.errors import ServeError
from queryserve.server.http import DRAIN_TIMEOUT_S, HttpLimits
from queryserve.server.workers.plan import WORKER_TIMEOUT_S

DEFAULT_REPOSITORY = Path("model_repository")
DEFAULT_GRPC = "127.0.0.1:8001"
API_KEY_VARIABLE = "QUERYSERVE_API_KEY"

log = logging.getLogger("queryserve")


def address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not HOST:PORT with a port in 1-65535, e.g. 127.0.0.1:8000")
    return host.strip("[]"), int(port)


def _grpc_address(value: str) -> tuple[str, int] | None:
    return None if value == "off" else address(value)


def _alias(value: str) -> tuple[str, str]:
    alias, _, model = value.partition("=")
    if not alias or not is_model_name(model) or any(c.isspace() for c in alias):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not ALIAS=MODEL, e.g. text-embedding-3-small=embed")
    return alias, model


def _traces_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an OTLP/HTTP URL, e.g. http://127.0.0.1:4318/v1/traces")
    return value


def _origin(value: str) -> str:
    """What a browser sends in `Origin`: scheme://host[:port] and nothing after it, or `*`."""
    parts = urlsplit(value)
    if value != "*" and (parts.scheme not in ("http", "https") or not parts.hostname
                         or parts.path or parts.query or parts.fragment):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an origin: scheme://host[:port] (no path), or *")
    return value


def _host(value: str) -> str:
    if not value or any(c.isspace() or c in "/@" for c in value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a host name, e.g. search.internal")
    return value


def _workers(value: str) -> int | None:
    """A count, or None for `auto`."""
    return None if value == "auto" else count(value)


def _api_key(value: str) -> str:
    if not value or not value.isascii() or not value.isprintable() or " " in value:
        raise argparse.ArgumentTypeError("an API key is printable ASCII without spaces")
    return value


def add_serve_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve", help="serve a model repository over HTTP (KServe v2, OpenAI, task routes) and "
                      "KServe v2 gRPC; drains on SIGTERM, SIGINT or SIGHUP")
    serve.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                       help="model repository folder (default: %(default)s)")
    serve.add_argument("--http", type=address, default=("127.0.0.1", 8000),
                       metavar="HOST:PORT", help="HTTP address (default: 127.0.0.1:8000)")
    serve.add_argument("--grpc", type=_grpc_address, default=("127.0.0.1", 8001),
                       metavar="HOST:PORT|off",
                       help="KServe v2 gRPC address, or 'off' (default: 127.0.0.1:8001)")
    serve.add_argument("--cores", type=count, default=None,
                       help="cores the model instances share (default: all this process may "
                            "use); intra-op threads per instance = cores // instances, the "
                            "cores divided between the workers first")
    serve.add_argument("--prepare", action="store_true",
                       help="prepare the default models (queryserve prepare) while serving, "
                            "loading each as soon as it is built; readiness answers 503 until "
                            "the last (what `make run` does)")
    serve.add_argument("--strict-readiness", action=argparse.BooleanOptionalAction,
                       default=True,
                       help="readiness answers 200 only while every model of the repository is "
                            "loaded (the default, as Triton's); --no-strict-readiness: once the "
                            "first load is done, whatever failed or was unloaded, so one "
                            "broken or new folder does not take every replica out of service")
    serve.add_argument("--workers", type=_workers, default=None, metavar="N|auto",
                       help="server processes sharing the HTTP and gRPC ports (SO_REUSEPORT), "
                            "behind a supervisor that drains and replaces them; auto: one per "
                            "4 cores, so 1 on 2 cores (default: auto)")
    serve.add_argument("--worker-timeout", type=positive, default=WORKER_TIMEOUT_S, metavar="S",
                       help="with workers, one whose event loop has not turned for this long "
                            "(stuck: it answers nobody) is killed and replaced "
                            "(default: %(default)g)")
    serve.add_argument("--max-body-bytes", type=count, default=HttpLimits().max_body_bytes,
                       help="largest request body (or gRPC message) accepted "
                            "(default: %(default)s)")
    serve.add_argument("--max-items", type=count, default=1024,
                       help="most items (texts, or pairs of texts) in one request "
                            "(default: %(default)s)")
    _add_access_flags(serve)
    serve.add_argument("--served-model-name", type=_alias, action="append", default=[],
                       metavar="ALIAS=MODEL",
                       help="another name for a model, on every route and over gRPC, e.g. "
                            "text-embedding-3-small=embed (repeatable)")
    serve.add_argument("--access-log", nargs="?", const="-", default=None, metavar="FILE",
                       help="write one JSON line per request (id, route, model, status, bytes, "
                            "time) to FILE, or to standard error with no FILE (default: off)")
    serve.add_argument("--otlp-endpoint", type=_traces_url, default=None, metavar="URL",
                       help="send an OpenTelemetry span per request (traceparent honoured) to "
                            "this OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces; "
                            "needs the tracing extra (default: off)")
    _add_connection_flags(serve)


def _check_aliases(args: argparse.Namespace) -> None:
    """An alias names a model of the repository (with --prepare, one not built yet is let be)."""
    if not args.served_model_name or args.prepare:
        return
    from queryserve.repository import ModelRepository

    names = ModelRepository(args.repository).names()
    for alias, model in args.served_model_name:
        if model not in names:
            raise ServeError(f"--served-model-name {alias}={model}: {args.repository} has no "
                             f"model '{model}' (it has: {', '.join(names) or 'none'})")
        if alias in names and alias != model:  # it would hide that model on every route
            raise ServeError(f"--served-model-name {alias}={model}: '{alias}' is a model of "
                             f"{args.repository}; name the alias otherwise")


def _add_access_flags(serve: argparse.ArgumentParser) -> None:
    """Who may call: API keys, and the Host and Origin guard (`security.AccessControl`)."""
    access = serve.add_argument_group("access")
    access.add_argument("--api-key", type=_api_key, action="append", default=[], metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on every route but "
                             f"/v2/health/* (repeatable; also ${API_KEY_VARIABLE}, "
                             f"comma-separated)")
    access.add_argument("--allowed-hosts", type=_host, action="append", default=[],
                        metavar="HOST",
                        help="Host names answered to (repeatable); bound to loopback, loopback "
                             "names are always answered to and no others unless listed here")
    access.add_argument("--cors-allow-origin", type=_origin, action="append", default=[],
                        metavar="ORIGIN",
                        help="let web pages from ORIGIN (scheme://host[:port], or *) call the "
                             "server (repeatable; default: none, cross-origin requests get 403)")


def _add_connection_flags(serve: argparse.ArgumentParser) -> None:
    """The transport's timeouts and caps (`HttpLimits`), and the drain's deadline."""
    http = HttpLimits()
    limits = serve.add_argument_group("connections")
    limits.add_argument("--read-timeout", type=positive, default=http.read_timeout_s,
                        metavar="S", help="a client silent this long in the middle of a request "
                                          "gets a 408 (default: %(default)g)")
    limits.add_argument("--header-timeout", type=positive, default=http.header_timeout_s,
                        metavar="S", help="a request's line and headers must arrive within "
                                          "this time, or it gets a 408 (default: %(default)g)")
    limits.add_argument("--idle-timeout", type=positive, default=http.idle_timeout_s,
                        metavar="S", help="a keep-alive connection idle this long is closed "
                                          "(default: %(default)g)")
    limits.add_argument("--max-connections", type=count, default=None,
                        help="open connections at most, per port and worker; at the cap "
                             "the connection silent "
                             "longest (or else idle longest) makes room, or a newcomer gets a "
                             "503 (default: half the process's file limit, which serve raises "
                             "to its hard limit, at most 4096)")
    limits.add_argument("--max-connection-age", type=non_negative,
                        default=http.max_connection_age_s, metavar="S",
                        help="a connection this old is ended after its next answer (HTTP: "
                             "connection: close; gRPC: GOAWAY once its calls finish) and the "
                             "client reconnects, placed afresh on a worker or replica "
                             "(default: %(default)g; 0: never)")
    limits.add_argument("--drain-timeout", type=positive, default=DRAIN_TIMEOUT_S, metavar="S",
                        help="on SIGTERM, SIGINT or SIGHUP, how long accepted requests get "
                             "to finish (default: %(default)g)")


def _raise_file_limit() -> int:
    """The soft limit of open files raised to the hard one (as Go's runtime does): systemd
    starts services at 1,024, which a connection flood on the gRPC port (no cap of its own)
    used up, every HTTP client then reset without an answer. The limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def run_serve_command(args: argparse.Namespace) -> int:
    """Serve until a signal; the exit status (0: drained)."""
    from queryserve.server.run import ServeOptions, serve
    from queryserve.server.state import Limits

    keys = [*args.api_key, *(key.strip() for key in
                             os.environ.get(API_KEY_VARIABLE, "").split(",") if key.strip())]
    if API_KEY_VARIABLE in os.environ and not keys:
        # Set, and empty: a Secret made of a failed `openssl rand` served an open pod with a
        # warning. Unset, there is no key (KServe's `optional: true` Secret).
        raise ServeError(f"{API_KEY_VARIABLE} is set and holds no key; give it one, or unset "
                         "it to serve without a key")
    files = _raise_file_limit()
    max_connections = args.max_connections or HttpLimits().max_connections
    if max_connections > files // 2:
        log.warning("--max-connections %d on a limit of %d open files: past half of it, "
                    "connections take the files models, logs and gRPC need, and new clients "
                    "are reset without an answer", max_connections, files)
    host, port = args.http
    options = ServeOptions(
        args.repository, host, port, args.cores, Limits(args.max_items),
        HttpLimits(max_body_bytes=args.max_body_bytes, read_timeout_s=args.read_timeout,
                   idle_timeout_s=args.idle_timeout, header_timeout_s=args.header_timeout,
                   max_connections=max_connections,
                   max_connection_age_s=args.max_connection_age or math.inf),
        args.drain_timeout, grpc=args.grpc, api_keys=tuple(keys),
        allowed_hosts=tuple(args.allowed_hosts), cors_origins=tuple(args.cors_allow_origin),
        aliases=dict(args.served_model_name), access_log=args.access_log,
        otlp_endpoint=args.otlp_endpoint, prepare=args.prepare,
        strict_readiness=args.strict_readiness)
    from queryserve.repository import available_cores
    from queryserve.server.workers.plan import auto_workers, idle_cores

    _check_aliases(args)
    if args.grpc is not None and args.grpc == args.http:  # workers shared it (SO_REUSEPORT)
        raise ServeError(f"--http and --grpc both name {args.http[0]}:{args.http[1]}: give "
                         "gRPC a port of its own (or --grpc off)")
    if not args.prepare:  # else the repository is what `prepare` is about to make
        from queryserve.repository import ModelRepository

        ModelRepository(args.repository).survey()
    available = available_cores()
    cores = args.cores or available
    if cores > available:
        log.warning("--cores %d: this process may use %d core(s); the models' threads will "
                    "oversubscribe them", cores, available)
    workers = args.workers
    if workers is None:  # never more workers than the machine has cores for
        workers, why = auto_workers(min(cores, available), args.repository)
        log.info("--workers auto: %d worker(s): %s", workers, why)
    elif workers > cores:
        raise ServeError(f"--workers {workers} on {cores} core(s): each worker runs at least "
                         f"one model instance thread; give at most {cores}, or more --cores")
    elif idle := idle_cores(cores, workers):
        log.warning("%s", idle)
    if workers == 1:  # one process, no supervisor: nothing between the client and the loop
        serve(options)
        return 0
    from queryserve.server.workers.supervisor import Supervisor

    if args.prepare:  # workers load what is there when they start: prepare it all first
        import subprocess

        from queryserve.server.run import prepare_argv

        prepared = subprocess.run(prepare_argv(args.repository))
        if prepared.returncode != 0:  # its own output above says why
            raise ServeError(f"queryserve prepare exited {prepared.returncode}")
        options = dataclasses.replace(options, prepare=False)
    return Supervisor(options, workers, args.log_level, args.worker_timeout).run()
