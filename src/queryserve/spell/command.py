"""`queryserve train spell`, `queryserve train spell-channel` and `queryserve eval spell`:
argument parsing only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from queryserve.arguments import count, probability
from queryserve.spell.data import DATA, check_data


def add_spell_parsers(tasks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`queryserve train spell` and `queryserve train spell-channel`."""
    spell = tasks.add_parser(
        "spell", help="train the seq2seq query spelling corrector (a small character-level "
                      "BART or T5)")
    spell.add_argument("out", type=Path, help="folder for the trained model (Hugging Face "
                                              "layout) and its checkpoint")
    spell.add_argument("--minutes", type=float, default=55.0,
                       help="training time budget (default: %(default)s)")
    spell.add_argument("--max-steps", type=int, default=None,
                       help="stop after this many steps too")
    spell.add_argument("--batch-size", type=int, default=64)
    spell.add_argument("--learning-rate", type=float, default=1e-3)
    spell.add_argument("--warmup-steps", type=int, default=300)
    spell.add_argument("--architecture", choices=["bart", "t5"], default="bart",
                       help="bart: learned absolute positions, which make copying quick to "
                            "learn; t5: relative positions only (default: %(default)s)")
    spell.add_argument("--d-model", type=int, default=192)
    spell.add_argument("--encoder-layers", type=int, default=4)
    spell.add_argument("--decoder-layers", type=int, default=2)
    spell.add_argument("--fp32", action="store_true", help="train without bf16 autocast")
    spell.add_argument("--seed", type=int, default=0)
    spell.add_argument("--data", type=Path, default=DATA,
                       help="the repository's data folder (default: %(default)s)")
    spell.add_argument("--resume", action="store_true",
                       help="go on from OUT's checkpoint (its recipe and shape) until "
                            "--minutes of training in all")
    spell.add_argument("--measure-speed", action="store_true",
                       help="only time fp32 at batch 32 against bf16 and a large batch")
    channel = tasks.add_parser(
        "spell-channel", help="learn the noisy-channel spelling corrector (seconds): a servable "
                              "model folder")
    channel.add_argument("out", type=Path, help="the model folder to write, e.g. "
                                                "model_repository/spell")
    channel.add_argument("--data", type=Path, default=DATA,
                         help="the repository's data folder (default: %(default)s)")


def add_eval_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser("eval", help="measure a model on held-out data")
    tasks = evaluate.add_subparsers(dest="task", required=True)
    spell = tasks.add_parser(
        "spell", help="the spelling corrector against SymSpell: word accuracy on real "
                      "misspellings, query accuracy, false corrections")
    spell.add_argument("models", type=Path, nargs="+", metavar="MODEL",
                       help="served model folders: the noisy channel (`queryserve train "
                            "spell-channel` output, e.g. model_repository/spell) or a seq2seq "
                            "model (`queryserve optimize --task seq2seq` output, e.g. "
                            "model_repository/spell-seq2seq)")
    spell.add_argument("--size", type=count, default=1000,
                       help="queries and words per set (default: %(default)s)")
    spell.add_argument("--seed", type=int, default=0)
    spell.add_argument("--data", type=Path, default=DATA,
                       help="the repository's data folder (default: %(default)s)")
    spell.add_argument("--min-score", type=probability, action="append", default=None,
                       help="also score each model as an auto-correct that changes a query "
                            "only at this score or above (repeatable; default: 0.9)")
    spell.add_argument("--json", type=Path, help="also write the scores here")


def run_eval_command(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from queryserve.spell.corrector import Confident, Corrector, open_corrector
    from queryserve.spell.data import (
        dictionary_texts,
        load_catalog,
        load_misspellings,
        load_words,
    )
    from queryserve.spell.evaluate import EvalSets, print_table, score
    from queryserve.spell.symspell import SymSpell

    check_data(args.data)
    correctors = [open_corrector(folder) for folder in args.models]
    sets = EvalSets.build(args.data, args.size, args.seed)
    catalog, misspellings = load_catalog(args.data), load_misspellings(args.data)
    baseline = SymSpell(dictionary_texts(catalog, misspellings, load_words(args.data)))
    confident: list[Corrector] = [Confident(c, m) for c in correctors
                                  for m in args.min_score or [0.9]]
    scores = [score(c, sets) for c in [*correctors, *confident, baseline]]
    print_table(scores, sets)
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in scores], indent=2) + "\n")


def run_spell_train_command(args: argparse.Namespace) -> None:
    check_data(args.data)
    if args.task == "spell-channel":
        from queryserve.spell.channel_model import build_channel_model

        print(json.dumps(build_channel_model(args.out, args.data), indent=2))
        return
    from queryserve.progress import quiet_logs
    from queryserve.spell.train import Recipe, Shape, measure_speed, train_spell

    quiet_logs()
    shape = Shape(architecture=args.architecture, d_model=args.d_model, d_ff=4 * args.d_model,
                  encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers)
    if args.measure_speed:
        print(json.dumps(measure_speed(data=args.data, shape=shape), indent=2))
        return
    recipe = Recipe(minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                    learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
                    bf16=not args.fp32, seed=args.seed)
    record = train_spell(args.out, recipe, shape, args.data, resume=args.resume)
    print(json.dumps(record, indent=2))
