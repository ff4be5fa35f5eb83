"""The `queryserve` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

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
from queryserve.server.command import DEFAULT_REPOSITORY, add_serve_parser, run_serve_command
from queryserve.spell.command import (
    add_eval_parser,
    add_spell_parsers,
    run_eval_command,
    run_spell_train_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queryserve", description="Serve Transformer models for search, fast, on CPU.")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True)

    add_serve_parser(commands)

    prepare = commands.add_parser(
        "prepare", help="build the default models (export to ONNX, quantize, parity-check)")
    prepare.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                         help="model repository folder (default: %(default)s)")
    prepare.add_argument("--data", type=Path, default=Path("data/massive-en"),
                         help="MASSIVE utterances for the parity check and calibration "
                              "(default: %(default)s)")
    prepare.add_argument("--force", action="store_true",
                         help="rebuild even if the models are already prepared")
    prepare.add_argument("--sweep", action="store_true",
                         help="rebuild the ONNX models choosing their variants again (every "
                              "recipe built, gated and timed; the fastest that passes served) "
                              "and write the choices to models/variants.json, to commit; "
                              "without it each is built as its committed variant")
    prepare.add_argument("--announce", action="store_true",
                         help="print 'prepared: NAME' as each model is ready to load (what "
                              "`queryserve serve --prepare` reads)")
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
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "batch" and not any(e.startswith("-") for e in extra):
        # Paths after an option (`batch duplicates IN IN2 --one-to-one OUT`): argparse takes
        # positionals in one run only, and OUT was "unrecognized".
        args.paths += [Path(e) for e in extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            return run_serve_command(args)
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

            prepare_default_models(args.repository, args.data, force=args.force,
                                   announce=args.announce, sweep=args.sweep)
    except QueryServeError as exc:
        print(f"queryserve: error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:  # what was cut short says what is kept, if any
        print(f"queryserve: interrupted{f'; {interrupt}' if str(interrupt) else ''}",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
