"""`queryserve train spell`, `train spell-channel`, `train spell-hybrid` and `eval spell`:
argument parsing only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from queryserve.arguments import count, folder_to_write, positive, probability
from queryserve.spell.data import DATA, check_data
from queryserve.training import DEVICES


def add_spell_parsers(tasks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`queryserve train spell`, `train spell-channel` and `train spell-hybrid`."""
    spell = tasks.add_parser(
        "spell", help="train the seq2seq query spelling corrector (a small character-level "
                      "BART or T5)")
    spell.add_argument("out", type=folder_to_write,
                       help="folder for the trained model (Hugging Face layout) and its "
                            "checkpoint")
    spell.add_argument("--minutes", type=positive, default=55.0,
                       help="training time budget (default: %(default)s)")
    spell.add_argument("--max-steps", type=count, default=None,
                       help="stop after this many steps too")
    spell.add_argument("--batch-size", type=count, default=64)
    spell.add_argument("--learning-rate", type=positive, default=1e-3)
    spell.add_argument("--warmup-steps", type=int, default=300)
    spell.add_argument("--architecture", choices=["bart", "t5"], default="bart",
                       help="bart: learned absolute positions, which make copying quick to "
                            "learn; t5: relative positions only (default: %(default)s)")
    spell.add_argument("--d-model", type=count, default=192)
    spell.add_argument("--encoder-layers", type=count, default=4)
    spell.add_argument("--decoder-layers", type=count, default=2)
    spell.add_argument("--fp32", action="store_true", help="train without bf16 autocast")
    spell.add_argument("--seed", type=int, default=0)
    spell.add_argument("--device", choices=DEVICES, default="auto",
                       help="auto takes a CUDA GPU when PyTorch sees one (default: "
                            "%(default)s)")
    spell.add_argument("--workers", type=int, default=None,
                       help="processes writing the examples (default: none on a CPU, 8 "
                            "beside a GPU)")
    spell.add_argument("--data", type=Path, default=DATA,
                       help="the repository's data folder (default: %(default)s)")
    spell.add_argument("--copy-share", type=probability, default=0.0,
                       help="share of examples that are a training query with one word "
                            "swapped for a web word it does not know (a name, a brand), to "
                            "copy unchanged: a seq2seq for the hybrid to score with "
                            "(default: %(default)s, as the committed models)")
    spell.add_argument("--development", action="store_true",
                       help="train on the development split's training side only: the model "
                            "`queryserve train spell-hybrid --development-seq2seq` takes")
    spell.add_argument("--resume", action="store_true",
                       help="go on from OUT's checkpoint (its recipe and shape) until "
                            "--minutes of training in all")
    spell.add_argument("--measure-speed", action="store_true",
                       help="only time fp32 at batch 32 against bf16 and a large batch")
    spell.add_argument("--no-progress", action="store_true")
    _folder_parser(tasks, "spell-channel", "learn the noisy-channel spelling corrector "
                                           "(seconds): a servable model folder")
    hybrid = _folder_parser(tasks, "spell-hybrid", "fit the hybrid spelling corrector's "
                            "re-ranker (the channel's candidates scored by a seq2seq) and "
                            "write a servable model folder")
    hybrid.add_argument("--development-seq2seq", type=Path, required=True,
                        help="a served seq2seq folder trained with `train spell --development` "
                             "(then `optimize --task seq2seq`): the re-ranker learns how far to "
                             "trust it on queries it never saw")
    hybrid.add_argument("--seq2seq", type=Path, default=Path("model_repository/spell-seq2seq"),
                        help="the served seq2seq folder the hybrid serves with (default: "
                             "%(default)s)")
    hybrid.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar")


def _folder_parser(tasks: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                   description: str) -> argparse.ArgumentParser:
    """A `train` task that writes a servable spelling model folder from the data."""
    parser = tasks.add_parser(name, help=description)
    parser.add_argument("out", type=folder_to_write,
                        help=f"the model folder to write, e.g. "
                             f"model_repository/{name.replace('-channel', '')}")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="the repository's data folder (default: %(default)s)")
    return parser


def add_eval_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser("eval", help="measure a model on held-out data")
    tasks = evaluate.add_subparsers(dest="task", required=True)
    spell = tasks.add_parser(
        "spell", help="the spelling correctors against symspellpy on a hard and a realistic "
                      "typo set: query accuracy (by number of edits), false corrections, word "
                      "accuracy on real misspellings, with 95%% intervals")
    spell.add_argument("models", type=Path, nargs="+", metavar="MODEL",
                       help="served model folders: the noisy channel (`queryserve train "
                            "spell-channel` output, e.g. model_repository/spell) or a seq2seq "
                            "model (`queryserve optimize --task seq2seq` output, e.g. "
                            "model_repository/spell-seq2seq)")
    spell.add_argument("--size", type=count, default=None,
                       help="a sample of this many held-out queries and words (default: all)")
    spell.add_argument("--seed", type=int, default=0,
                       help="the first noise seed (and the sample's, with --size)")
    spell.add_argument("--seeds", type=count, default=None,
                       help="noise seeds: each misspelled set is drawn this many times "
                            "(default: 3)")
    spell.add_argument("--data", type=Path, default=DATA,
                       help="the repository's data folder (default: %(default)s)")
    spell.add_argument("--min-score", type=probability, action="append", default=None,
                       help="also score each model as an auto-correct that changes a query "
                            "only at this score or above (repeatable); the served threshold "
                            "(min_score in search/pipeline.yaml beside the first MODEL, else "
                            "the search pipeline's default) is always scored")
    spell.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar")
    spell.add_argument("--json", type=Path, help="also write the scores here")
    spell.add_argument("--curves", type=Path, metavar="PNG",
                       help="also sweep each model's threshold from 0 to 1: print its accuracy "
                            "at 0.5%%, 1%% and 2%% false corrections, plot accuracy against "
                            "false corrections here (dots at the thresholds scored) and write "
                            "the points beside it (.json)")


def served_min_score(model: Path) -> float:
    """The search pipeline's auto-correct threshold: `min_score` of the `search/pipeline.yaml`
    in the model's repository, or the default when there is none."""
    from queryserve.config import ENSEMBLE_FILE, SearchSteps, load_ensemble_config

    pipeline = model.parent / "search" / ENSEMBLE_FILE
    if pipeline.is_file():
        steps = load_ensemble_config(pipeline).ensemble
        if steps is not None:
            return steps.min_score
    return SearchSteps(embed="embed").min_score


def run_eval_command(args: argparse.Namespace) -> None:
    import sys
    from functools import partial

    from queryserve.errors import ConfigError
    from queryserve.progress import progress_bar
    from queryserve.spell.baseline import SymSpellPy
    from queryserve.spell.corrector import Corrector, open_corrector
    from queryserve.spell.curves import THRESHOLDS, Curve, plot, print_rates, sweep
    from queryserve.spell.curves import to_json as curves_json
    from queryserve.spell.data import (
        dictionary_texts,
        load_catalog,
        load_misspellings,
        load_words,
    )
    from queryserve.spell.evaluate import SEEDS, SpellSets
    from queryserve.spell.report import print_tables
    from queryserve.spell.scoring import Score, answer, at_min_score, score

    for flag, kind, path in (("--curves", "PNG", args.curves), ("--json", "JSON", args.json)):
        # Checked before minutes of evaluation, not at the end when the file is written.
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            raise ConfigError(f"{flag} {path}: a {kind} file's path is needed, in a folder "
                              "that exists")
    check_data(args.data)
    correctors: list[Corrector] = [open_corrector(folder) for folder in args.models]
    sets = SpellSets.build(args.data, args.size, args.seed, args.seeds or SEEDS)
    catalog, misspellings = load_catalog(args.data), load_misspellings(args.data)
    correctors.append(SymSpellPy(dictionary_texts(catalog, misspellings, load_words(args.data))))
    min_scores = sorted({served_min_score(args.models[0]), *(args.min_score or [])})
    texts = sets.texts()
    scores: list[Score] = []
    thresholded: list[Score] = []
    curves: list[Curve] = []
    with progress_bar(args.progress and sys.stderr.isatty()) as display:
        for corrector in correctors:
            task = display.add_task(corrector.name, total=len(texts), status="")
            answers = answer(corrector, texts, partial(display.advance, task))
            scores.append(score(answers, sets))
            if corrector.name != SymSpellPy.name:  # its answers carry no score
                thresholded += [score(at_min_score(answers, m), sets, m) for m in min_scores]
                if args.curves is not None:
                    curves.append(sweep(answers, sets, sorted({*THRESHOLDS, *min_scores})))
    scores = [*scores[:-1], *thresholded, scores[-1]]
    print_tables(scores, sets)
    if args.curves is not None:
        print_rates(curves, scores[-1:])
        print(f"curves: {plot(curves, scores[-1:], min_scores, args.curves)}")
        args.curves.with_suffix(".json").write_text(
            json.dumps(curves_json(curves, scores[-1:]), indent=1) + "\n")
    if args.json:
        args.json.write_text(json.dumps([s.to_json() for s in scores], indent=2) + "\n")


def run_spell_train_command(args: argparse.Namespace) -> None:
    check_data(args.data)
    if args.task == "spell-channel":
        from queryserve.spell.channel_model import build_channel_model

        print(json.dumps(build_channel_model(args.out, args.data), indent=2))
        return
    if args.task == "spell-hybrid":
        run_hybrid_train_command(args)
        return
    from queryserve.progress import quiet_logs
    from queryserve.spell.train import Recipe, Shape, measure_speed, train_spell

    quiet_logs()
    shape = Shape(architecture=args.architecture, d_model=args.d_model, d_ff=4 * args.d_model,
                  encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers)
    if args.measure_speed:
        print(json.dumps(measure_speed(data=args.data, shape=shape,
                                       large_batch=max(256, args.batch_size),
                                       device_name=args.device), indent=2))
        return
    recipe = Recipe(minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                    learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
                    bf16=not args.fp32, seed=args.seed, device=args.device,
                    workers=args.workers, development=args.development,
                    copy_share=args.copy_share)
    record = train_spell(args.out, recipe, shape, args.data, resume=args.resume,
                         progress=not args.no_progress)
    print(json.dumps(record, indent=2))


def run_hybrid_train_command(args: argparse.Namespace) -> None:
    import sys

    from queryserve.errors import ConfigError
    from queryserve.progress import progress_bar
    from queryserve.spell.hybrid import assemble_hybrid, fit_reranker

    for folder in (args.development_seq2seq, args.seq2seq):
        if not (folder / "ctranslate2" / "model.bin").is_file():
            raise ConfigError(f"{folder} is not a served seq2seq folder (no ctranslate2/"
                              "model.bin); make one with `queryserve optimize TRAINED_FOLDER "
                              "--task seq2seq`")
    args.out.mkdir(parents=True, exist_ok=True)
    with progress_bar(args.progress and sys.stderr.isatty()) as display:
        task = display.add_task("development queries", total=None, status="")
        weights, record = fit_reranker(
            args.development_seq2seq, args.data,
            lambda done, total: display.update(task, completed=done, total=total))
    weights.save(args.out)
    built = assemble_hybrid(args.out, args.data, args.seq2seq, args.out / "reranker.json")
    record = {"command": "queryserve train spell-hybrid OUT --development-seq2seq "
                         f"{args.development_seq2seq} --seq2seq {args.seq2seq}",
              **record, "served": built}
    (args.out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
