"""`queryserve train intent`: argument parsing only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from queryserve.arguments import count, folder_to_write, positive
from queryserve.intent.train import DATA, METHODS
from queryserve.training import DEVICES


def add_intent_parser(tasks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    intent = tasks.add_parser(
        "intent", help="train the query intent classifier (MASSIVE's 60 intents) on the "
                       "MiniLM encoder")
    intent.add_argument("out", type=folder_to_write,
                        help="folder for the trained model (Hugging Face layout) and "
                             "TRAINING.json")
    intent.add_argument("--method", choices=METHODS, default="finetune",
                        help="finetune: the whole encoder with a classification head; head: a "
                             "linear head on the frozen encoder's embeddings, for comparison "
                             "(default: %(default)s)")
    intent.add_argument("--epochs", type=count, default=7,
                        help="(default: %(default)s; --method head runs 40 of its own each)")
    intent.add_argument("--batch-size", type=count, default=32,
                        help="finetune's (default: %(default)s; head's is 256)")
    intent.add_argument("--learning-rate", type=positive, default=1.5e-4,
                        help="finetune's AdamW's (default: %(default)g; head's is 1e-2)")
    intent.add_argument("--max-steps", type=count, default=None,
                        help="finetune: stop after this many steps")
    intent.add_argument("--seed", type=int, default=0)
    intent.add_argument("--device", choices=DEVICES, default="auto",
                        help="auto takes a CUDA GPU when PyTorch sees one (default: "
                             "%(default)s)")
    intent.add_argument("--data", type=Path, default=DATA,
                        help="MASSIVE's train/validation/test.jsonl (default: %(default)s)")
    intent.add_argument("--no-progress", action="store_true")


def run_intent_train_command(args: argparse.Namespace) -> None:
    from queryserve.intent.train import IntentRecipe, train_intent
    from queryserve.progress import quiet_logs

    quiet_logs()
    recipe = IntentRecipe(method=args.method, epochs=args.epochs, batch_size=args.batch_size,
                          learning_rate=args.learning_rate, max_steps=args.max_steps,
                          seed=args.seed, device=args.device)
    record = train_intent(args.out, recipe, args.data, progress=not args.no_progress)
    print(json.dumps(record, indent=2))
