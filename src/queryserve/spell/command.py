"""`queryserve train spell` and `queryserve eval spell`: argument parsing only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from queryserve.spell.data import DATA


def add_spell_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = commands.add_parser("train", help="train a model from the repository's data")
    tasks = train.add_subparsers(dest="task", required=True)
    spell = tasks.add_parser(
        "spell", help="train the query spelling corrector (a small character-in T5)")
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


def add_eval_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser("eval", help="measure a model on held-out data")
    tasks = evaluate.add_subparsers(dest="task", required=True)
    spell = tasks.add_parser(
        "spell", help="the spelling corrector against SymSpell: word accuracy on real "
                      "misspellings, query accuracy, false corrections")
    spell.add_argument("model", type=Path,
                       help="the served model folder (`queryserve optimize --task seq2seq` "
                            "output, e.g. model_repository/spell)")
    spell.add_argument("--size", type=int, default=1000,
                       help="queries and words per set (default: %(default)s)")
    spell.add_argument("--seed", type=int, default=0)
    spell.add_argument("--data", type=Path, default=DATA,
                       help="the repository's data folder (default: %(default)s)")
    spell.add_argument("--json", type=Path, help="also write the scores here")


def run_eval_command(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from queryserve.errors import ConfigError
    from queryserve.spell.corrector import Seq2SeqCorrector
    from queryserve.spell.data import clean_texts, load_catalog, load_misspellings
    from queryserve.spell.evaluate import EvalSets, print_table, score
    from queryserve.spell.symspell import SymSpell

    if not (args.model / "model.yaml").is_file():
        raise ConfigError(f"{args.model} is not a served model folder (no model.yaml); make "
                          "one with `queryserve optimize TRAINED_FOLDER --task seq2seq`")
    sets = EvalSets.build(args.data, args.size, args.seed)
    catalog, misspellings = load_catalog(args.data), load_misspellings(args.data)
    baseline = SymSpell(clean_texts(catalog, misspellings))
    scores = [score(Seq2SeqCorrector(args.model), sets), score(baseline, sets)]
    print_table(scores, sets)
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in scores], indent=2) + "\n")


def run_train_command(args: argparse.Namespace) -> None:
    from queryserve.optimize.report import quiet_logs
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
