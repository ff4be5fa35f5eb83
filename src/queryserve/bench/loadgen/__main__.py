"""``python -m queryserve.bench.loadgen serve-instant``: the answer-at-once server.

Load itself is `queryserve bench`; this package's own command only serves at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from queryserve.bench.loadgen.instant_server import InstantServerOptions, serve_instant
from queryserve.bench.loadgen.runner import run_sync


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m queryserve.bench.loadgen")
    sub = ap.add_subparsers(dest="cmd", required=True)
    srv = sub.add_parser("serve-instant", help="server that answers 200 at once")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=0)
    srv.add_argument("--delay-ms", type=float, default=0.0)
    srv.add_argument("--stall-at", type=int, default=-1)
    srv.add_argument("--stall-ms", type=float, default=0.0)
    srv.add_argument("--reject-every", type=int, default=0)
    srv.add_argument("--close-every", type=int, default=0)
    srv.add_argument("--lifetime-s", type=float, default=0.0)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    opts = InstantServerOptions(
        delay_ms=args.delay_ms,
        stall_at=args.stall_at,
        stall_ms=args.stall_ms,
        reject_every=args.reject_every,
        close_every=args.close_every,
    )
    run_sync(serve_instant(args.host, args.port, opts, args.lifetime_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
