"""`queryserve optimize`: a local Hugging Face folder in, a servable model folder out.

    queryserve optimize MODEL_DIR --task embed --precision int8 --out model_repository/NAME
    queryserve optimize T5_DIR --task seq2seq --precision int8 --out model_repository/spell

Encoders go to ONNX Runtime (optimize/encoder.py), seq2seq models to CTranslate2
(optimize/seq2seq.py); both gate every variant against the original on real inputs.

Heavy imports (torch, transformers, onnx) happen only once the arguments are checked, so a bad
flag or folder is answered at once, in one line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

from queryserve.arguments import folder_to_write
from queryserve.errors import ExportError
from queryserve.optimize.recipes import PRECISIONS, Precision
from queryserve.optimize.source import TASKS, Source, Task, inspect_source

if TYPE_CHECKING:
    from queryserve.optimize.seq2seq import Decoding

# The repository's real inputs (see each folder's SOURCE.md), found from this file so the
# defaults work from any directory of a source checkout.
_DATA = Path(__file__).resolve().parents[3] / "data"
MASSIVE_TEST = _DATA / "massive-en" / "test.jsonl"
MASSIVE_TRAIN = _DATA / "massive-en" / "train.jsonl"
CATALOG = _DATA / "catalog-titles" / "titles.txt"
PARITY_ITEMS = 512
CALIBRATION_ITEMS = 512

Item = str | tuple[str, str]


def _precisions(value: str) -> tuple[Precision, ...]:
    names = tuple(p.strip() for p in value.split(",") if p.strip())
    unknown = [p for p in names if p not in PRECISIONS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{value!r}: use one or more of {', '.join(PRECISIONS)}, comma-separated")
    return cast(tuple[Precision, ...], names)


def add_optimize_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "optimize", help="compile, quantize and accuracy-gate a Hugging Face model into a "
                         "servable model folder",
        description="Turn a local Hugging Face folder into a model folder queryserve serves: "
                    "for encoders, ONNX export, transformer fusions and reduced precision; for "
                    "T5 and BART, CTranslate2 conversion. Every variant is checked against the "
                    "original on real inputs, and the run ends with a before/after report.")
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR",
                        help="a local Hugging Face model folder (config.json and weights)")
    parser.add_argument("--task", choices=TASKS, required=True,
                        help="embed (pooled vectors), classify (label probabilities of one "
                             "text), pair (of two texts), seq2seq (generated text; T5, BART)")
    parser.add_argument("--precision", type=_precisions, default=("int8",),
                        help="fp32, fp16 (for GPUs; gated here on the CPU), int8 or bf16; "
                             "several, comma-separated, keep the fastest that passes "
                             "(default: int8)")
    parser.add_argument("--out", type=folder_to_write, required=True, metavar="REPO/NAME",
                        help="model folder to write, inside a model repository")
    parser.add_argument("--parity", type=Path, default=None, metavar="FILE",
                        help="real inputs for the accuracy gate: one text per line, .jsonl "
                             "(field 'text', and 'text_pair' for pair) or, for pair, "
                             "TEXT<TAB>TEXT lines (default: MASSIVE test utterances; catalog "
                             "title pairs for pair)")
    parser.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                        help="real text to calibrate an encoder's int8 on, same formats "
                             "(default: MASSIVE train utterances; catalog title pairs for pair); "
                             "seq2seq needs none")
    parser.add_argument("--beam-size", type=int, default=1,
                        help="seq2seq: beam size for the gate and the served model; 1 is greedy "
                             "(default: %(default)s)")
    parser.add_argument("--max-output-length", type=int, default=64,
                        help="seq2seq: most tokens generated per input (default: %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="write the closest variant even if none passes the gate")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a model in --out that was made from another folder "
                             "(re-optimizing the same folder replaces it anyway)")
    parser.add_argument("--timing-seconds", type=float, default=2.0,
                        help="seconds per timing round (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")


def _other_model_in(out: Path, source: Path) -> str | None:
    """What `out` holds if it is a model made from another folder than `source`; None if it
    holds no model, or one made from `source` (re-optimizing replaces it)."""
    if not (out / "model.yaml").is_file():
        return None
    try:
        report = json.loads((out / "prepare.json").read_text())
        origin = str(report.get("source") or report["model"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "a model of unknown source"
    return None if Path(origin).resolve() == source.resolve() else f"a model made from {origin}"


def run_optimize_command(args: argparse.Namespace) -> None:
    precisions: tuple[Precision, ...] = args.precision
    if args.task == "seq2seq":
        _check_seq2seq_args(args)
    elif "bf16" in precisions:
        from queryserve.optimize.recipes import bf16_unsupported_reason

        reason = bf16_unsupported_reason()
        if reason:
            raise ExportError(f"bf16: {reason}; use --precision int8 on this CPU (or fp16 for a "
                              "GPU)")
    source = inspect_source(args.model_dir, cast(Task, args.task))
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; it must be a model folder to write")
    if out.resolve() == source.path.resolve():
        raise ExportError("--out must not be the source folder itself")
    if not args.overwrite and (other := _other_model_in(out, source.path)):
        raise ExportError(f"--out {out} already holds {other}; choose another folder, or "
                          f"pass --overwrite to replace it")
    parity = read_items(args.parity, source.task, PARITY_ITEMS, "parity") if args.parity else \
        default_items(source.task, "parity", PARITY_ITEMS)
    if args.timing_seconds <= 0:
        raise ExportError("--timing-seconds must be > 0")
    calibration: list[Item] = []
    if source.task != "seq2seq":
        calibration = (read_items(args.calibration, source.task, CALIBRATION_ITEMS,
                                  "calibration") if args.calibration
                       else default_items(source.task, "calibration", CALIBRATION_ITEMS))

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: the folder is local
    from queryserve.optimize.plan import Plan
    from queryserve.optimize.report import print_report
    from queryserve.progress import quiet_logs

    quiet_logs()
    if source.task == "seq2seq":
        from queryserve.optimize.seq2seq import Decoding, optimize_seq2seq

        decoding = Decoding(args.beam_size, args.max_output_length)
        plan = Plan(source, precisions, parity, [], timing_seconds=args.timing_seconds,
                    force=args.force, measure_original=True,
                    model_config=seq2seq_model_yaml(source, out.name, decoding),
                    extra={"source": str(source.path)})
        report = optimize_seq2seq(plan, out, decoding, progress=not args.no_progress)
    else:
        from queryserve.optimize.encoder import optimize_encoder

        plan = Plan(source, precisions, parity, calibration, timing_seconds=args.timing_seconds,
                    force=args.force, measure_original=True,
                    model_config=model_yaml(source, out.name), extra={"source": str(source.path)})
        report = optimize_encoder(plan, out, progress=not args.no_progress)
    print_report(report, plan, out)


def _check_seq2seq_args(args: argparse.Namespace) -> None:
    if args.calibration is not None:
        raise ExportError("--calibration is for encoders: CTranslate2's int8 quantizes "
                          "activations as it runs and needs no calibration text")
    if not 1 <= args.beam_size <= 16:
        raise ExportError(f"--beam-size {args.beam_size}: use 1 (greedy) to 16")
    if not 1 <= args.max_output_length <= 1024:
        raise ExportError(f"--max-output-length {args.max_output_length}: use 1 to 1024")
    from queryserve.optimize.seq2seq import unsupported_reason

    reason = unsupported_reason(args.precision)
    if reason:
        raise ExportError(f"--precision {','.join(args.precision)}: {reason}")


def read_items(path: Path, task: Task, limit: int, what: str) -> list[Item]:
    """Texts (or text pairs for the pair task) from a file; one-line errors for bad files."""
    import json

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ExportError(f"--{what} file {path} does not exist") from None
    except UnicodeDecodeError as error:
        raise ExportError(f"--{what} file {path} is not UTF-8 text: {error.reason}") from None
    items: list[Item] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
                text, pair = record.get("text"), record.get("text_pair")
            except (json.JSONDecodeError, AttributeError):
                raise ExportError(f"{path}:{number} is not a JSON object") from None
        else:
            text, _, rest = line.partition("\t")
            pair = rest or None
        if not isinstance(text, str) or not text.strip():
            raise ExportError(f"{path}:{number} has no text")
        if task == "pair":
            if not isinstance(pair, str) or not pair.strip():
                raise ExportError(f"{path}:{number}: the pair task needs two texts per line "
                                  "(TEXT<TAB>TEXT, or 'text' and 'text_pair' in .jsonl)")
            items.append((text.strip(), pair.strip()))
        else:
            items.append(text.strip())
        if len(items) >= limit:
            break
    if not items:
        raise ExportError(f"--{what} file {path} is empty: it needs real text to check the "
                          "model against")
    return items


def default_items(task: Task, what: str, limit: int) -> list[Item]:
    """The repository's real inputs: MASSIVE utterances; catalog title pairs for pair (the
    parity pairs and the calibration pairs come from different halves of the catalog)."""
    if task == "pair":
        if not CATALOG.is_file():
            raise ExportError(f"{CATALOG} is missing; pass --{what} FILE (TEXT<TAB>TEXT lines)")
        titles = [t for t in CATALOG.read_text(encoding="utf-8").splitlines() if t.strip()]
        half = len(titles) // 2
        part = titles[:half] if what == "parity" else titles[half:]
        return [(part[i], part[i + 1]) for i in range(0, min(len(part) - 1, 2 * limit), 2)]
    path = MASSIVE_TEST if what == "parity" else MASSIVE_TRAIN
    if not path.is_file():
        raise ExportError(f"{path} is missing; pass --{what} FILE")
    return read_items(path, task, limit, what)


def seq2seq_model_yaml(source: Source, name: str, decoding: Decoding) -> str:
    """The model.yaml of a CTranslate2 folder: the text2text pipeline and decoding as gated;
    `optimize_seq2seq` sets the threads per instance (and so the instances) it timed fastest."""
    import yaml

    config: dict[str, object] = {
        "backend": "ctranslate2",
        "pipeline": "text2text",
        "max_batch_size": 32,
        "input": [{"name": "text", "datatype": "BYTES", "dims": [1]}],
        "output": [{"name": "generated_text", "datatype": "BYTES", "dims": [1]},
                   {"name": "score", "datatype": "FP32", "dims": [1]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 0, "max_queue_size": 256,
                             "max_batch_tokens": 2048},
        "model_warmup": [{"name": "one text", "batch_size": 1, "text": "warm up"}],
        "parameters": {"model_dir": "ctranslate2", "tokenizer_file": "tokenizer.json",
                       "max_sequence_length": source.max_length,
                       "beam_size": decoding.beam_size,
                       "max_output_length": decoding.max_output_length},
    }
    header = (f"# {name}: a {source.model_type} seq2seq model made by `queryserve optimize` "
              f"from {source.path}\n# (CTranslate2); prepare.json says which compute type was "
              "chosen and why.\n")
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=None)


def model_yaml(source: Source, name: str) -> str:
    """The model.yaml of the optimized folder, with the default embed model's serving choices
    (model_repository/embed/model.yaml says why each is what it is)."""
    import yaml

    texts = ["text", "text_pair"] if source.task == "pair" else ["text"]
    if source.task == "embed":
        pipeline, output, width, kind = ("text_embedding", "embedding", source.hidden,
                                         "an embedding model")
    else:
        pipeline, output, width, kind = ("text_classification", "probabilities",
                                         len(source.labels), "a classifier")
    parameters: dict[str, object] = {"model_file": "model.onnx",
                                     "tokenizer_file": "tokenizer.json",
                                     "max_sequence_length": source.max_length}
    if source.labels:
        parameters["labels"] = ",".join(label.replace(",", " ") for label in source.labels)
    config: dict[str, object] = {
        "backend": "onnxruntime",
        "pipeline": pipeline,
        "max_batch_size": 64,
        "input": [{"name": t, "datatype": "BYTES", "dims": [1]} for t in texts],
        "output": [{"name": output, "datatype": "FP32", "dims": [width]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 0, "max_queue_size": 256,
                             "max_batch_tokens": 1024, "batch_overhead_tokens": 4},
        "instance_group": {"count": 2},
    }
    if source.task in ("embed", "classify"):  # a pair model's warmup would need pairs
        config["model_warmup"] = [{"name": "one text", "batch_size": 1, "text": "warm up"}]
    config["parameters"] = parameters
    header = (f"# {name}: {kind} made by `queryserve optimize` from {source.path}\n"
              f"# (task {source.task}); prepare.json says which variant was chosen and why.\n")
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=None)
