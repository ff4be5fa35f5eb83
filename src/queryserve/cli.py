"""The `queryserve` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from queryserve.arguments import count, positive
from queryserve.bench.command import (
    add_bench_parser,
    add_recommend_parser,
    run_bench_command,
    run_recommend_command,
)
from queryserve.duplicates.command import (
    add_batch_parser,
    add_duplicates_parser,
    run_batch_command,
    run_duplicates_train_command,
)
from queryserve.errors import QueryServeError
from queryserve.intent.command import add_intent_parser, run_intent_train_command
from queryserve.optimize.command import add_optimize_parser, run_optimize_command
from queryserve.server.http import DRAIN_TIMEOUT_S, HttpLimits
from queryserve.spell.command import (
    add_eval_parser,
    add_spell_parsers,
    run_eval_command,
    run_spell_train_command,
)

DEFAULT_REPOSITORY = Path("model_repository")


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not HOST:PORT with a port in 1-65535, e.g. 127.0.0.1:8000")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queryserve", description="Serve Transformer models for search, fast, on CPU.")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="serve a model repository over HTTP (KServe v2, OpenAI embeddings); "
                      "drains on SIGTERM or SIGINT")
    serve.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                       help="model repository folder (default: %(default)s)")
    serve.add_argument("--http", type=_address, default=("127.0.0.1", 8000),
                       metavar="HOST:PORT", help="HTTP address (default: 127.0.0.1:8000)")
    serve.add_argument("--cores", type=count, default=None,
                       help="cores the model instances share (default: all this process may "
                            "use); intra-op threads per instance = cores // instances")
    serve.add_argument("--max-body-bytes", type=count, default=HttpLimits().max_body_bytes,
                       help="largest request body accepted (default: %(default)s)")
    serve.add_argument("--max-items", type=count, default=1024,
                       help="most items (texts, or pairs of texts) in one request "
                            "(default: %(default)s)")
    http = HttpLimits()
    serve.add_argument("--read-timeout", type=positive, default=http.read_timeout_s,
                       metavar="S", help="a client silent this long in the middle of a request "
                                         "gets a 408 (default: %(default)g)")
    serve.add_argument("--header-timeout", type=positive, default=http.header_timeout_s,
                       metavar="S", help="a request's line and headers must arrive within this "
                                         "time, or it gets a 408 (default: %(default)g)")
    serve.add_argument("--idle-timeout", type=positive, default=http.idle_timeout_s,
                       metavar="S", help="a keep-alive connection idle this long is closed "
                                         "(default: %(default)g)")
    serve.add_argument("--max-connections", type=count, default=http.max_connections,
                       help="open connections at most; at the cap the connection silent longest "
                            "makes room, or a newcomer gets a 503 (default: %(default)s, half "
                            "this process's file limit at most)")
    serve.add_argument("--drain-timeout", type=positive, default=DRAIN_TIMEOUT_S, metavar="S",
                       help="on SIGTERM or SIGINT, how long accepted requests get to finish "
                            "(default: %(default)g)")

    prepare = commands.add_parser(
        "prepare", help="build the default models (export to ONNX, quantize, parity-check)")
    prepare.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                         help="model repository folder (default: %(default)s)")
    prepare.add_argument("--data", type=Path, default=Path("data/massive-en"),
                         help="MASSIVE utterances for the parity check and calibration "
                              "(default: %(default)s)")
    prepare.add_argument("--force", action="store_true",
                         help="rebuild even if the models are already prepared")
    add_optimize_parser(commands)
    add_bench_parser(commands)
    add_recommend_parser(commands)
    train = commands.add_parser("train", help="train a model from the repository's data")
    tasks = train.add_subparsers(dest="task", required=True)
    add_spell_parsers(tasks)
    add_intent_parser(tasks)
    add_duplicates_parser(tasks)
    add_eval_parser(commands)
    add_batch_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            from queryserve.server.routing import Limits
            from queryserve.server.run import ServeOptions, serve

            host, port = args.http
            serve(ServeOptions(
                args.repository, host, port, args.cores, Limits(args.max_items),
                HttpLimits(max_body_bytes=args.max_body_bytes, read_timeout_s=args.read_timeout,
                           idle_timeout_s=args.idle_timeout,
                           header_timeout_s=args.header_timeout,
                           max_connections=args.max_connections),
                args.drain_timeout))
        elif args.command == "bench":
            run_bench_command(args)
        elif args.command == "recommend":
            run_recommend_command(args)
        elif args.command == "train" and args.task == "intent":
            run_intent_train_command(args)
        elif args.command == "train" and args.task == "duplicates":
            run_duplicates_train_command(args)
        elif args.command == "train":
            run_spell_train_command(args)
        elif args.command == "batch":
            run_batch_command(args)
        elif args.command == "eval":
            run_eval_command(args)
        elif args.command == "optimize":
            run_optimize_command(args)
        elif args.command == "prepare":
            from queryserve.prepare import prepare_default_models

            prepare_default_models(args.repository, args.data, force=args.force)
    except QueryServeError as exc:
        print(f"queryserve: error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
