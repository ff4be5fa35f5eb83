"""Optimize an encoder: export to ONNX, build variants, gate each against the original, time
those that pass, and write the fastest as a servable model folder.

The gate compares every variant with the original model on real inputs, tokenized exactly as the
server tokenizes them (`tokenizers`, truncation, padding per batch), at several batch sizes:
dynamic int8 quantizes activations per tensor, so an item's output depends on what else is in
its batch, and the gate has to hold for the batches the server forms.
- embed: cosine of the embeddings (fp32: mean >= 0.9999; reduced precision: mean >= 0.99 and
  min >= 0.97) and, for normalising models, unit rows;
- classify and pair: agreement of the top-1 label, or of the decision at the served threshold
  where the plan gives one (fp32: >= 99.9% and probabilities within 1e-3; reduced precision:
  >= 99%); and every hard input the plan names decided exactly as the original decides it, at
  every batch size (a variant that flips one fails, named in its shortfall).
The original is sentence-transformers itself for a sentence-transformers folder (the embed
task), and otherwise the Hugging Face model in PyTorch wrapped with the same pooling or softmax
as the graph (`export.wrap`).

`prepare_encoder` is the default model's first-run preparation: the same steps on
all-MiniLM-L6-v2 with fp32 and int8 candidates, into the default repository's `embed` folder.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from rich.progress import Progress
from tokenizers import Tokenizer

from queryserve.backends.onnxruntime import CPU_DISABLED_OPTIMIZERS
from queryserve.errors import ExportError
from queryserve.optimize.gate import (
    FP32_MAX_PROBABILITY_ERROR,
    FP32_MIN_AGREEMENT,
    FP32_MIN_MEAN,
    NORM_TOLERANCE,
    REDUCED_MIN_AGREEMENT,
    REDUCED_MIN_MEAN,
    REDUCED_MIN_MIN,
    Decision,
    HardItem,
    Parity,
    bounds_met,
    compare,
    hard_items,
)
from queryserve.optimize.plan import (
    PARITY_BATCH_SIZES,
    TIMING_BATCH_SIZES,
    TIMING_ROUNDS,
    TIMING_SECONDS,
    ChoiceRefused,
    Item,
    Plan,
    PrepareReport,
    Runner,
    Speed,
    Steps,
    VariantReport,
    choose_fastest,
    committed_outcome,
    gate_outcome,
    install,
    progress_display,
    rate_of,
    time_runners,
    write_report,
)
from queryserve.optimize.recipes import (
    RECIPES,
    RECIPES_VERSION,
    SMOOTHING_ALPHA,
    BuildInputs,
    Precision,
    Recipe,
    build_variants,
    recipes_for,
    with_bases,
)
from queryserve.optimize.source import Source, inspect_source, tokenizer_file
from queryserve.pipelines.base import open_tokenizer
from queryserve.pipelines.text_embedding import pad_token_ids

log = logging.getLogger(__name__)

__all__ = ["RECIPES", "SMOOTHING_ALPHA", "Precision", "optimize_encoder", "prepare_encoder"]

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]
Feeds = dict[str, Ints]

EMBEDDING_OUTPUT = "embedding"
MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)

THREADS = 2
TIMING_THREADS = {1: 1, 32: THREADS}
"""Intra-op threads each timed batch size runs on. A lone query runs on one, as each of the
server's one-thread instances runs it: on two threads spinning, ONNX Runtime swung between two
speeds from minute to minute on this VM (the int8 MiniLM at about 1,250 or 2,300 queries/s;
one thread held 1,780-1,850 in the same rounds, BENCHMARKS.md section 1). A batch runs on all
of THREADS. The PyTorch original is timed on the same threads."""
CALIBRATION_BATCH = 32
ORIGINAL = "original"  # the PyTorch original's name among the timed runners


# -- tokenization as the server does it ------------------------------------------------------


def load_tokenizer(tokenizer_path: Path, max_length: int = MAX_SEQ_LENGTH) -> Tokenizer:
    """The server's tokenizer, set up as the server sets it up (truncation, no padding)."""
    return open_tokenizer(tokenizer_path, max_length)


def encode(tokenizer: Tokenizer, items: Sequence[Item]) -> list[tuple[list[int], list[int]]]:
    """(token ids, segment ids) per item, one item at a time on the calling thread.

    Not `encode_batch`: it hands the items to the tokenizers' own thread pool, whose threads
    then contend with the engine's spinning threads for the cores, and short queries gain
    nothing from the pool. On 2 cores the int8 MiniLM at batch 32 did 2,354 queries/s with
    `encode_batch` against 2,454 tokenized here, ahead in each of 5 interleaved rounds."""
    encodings = [tokenizer.encode(*item) if isinstance(item, tuple) else tokenizer.encode(item)
                 for item in items]
    return [(e.ids, e.type_ids) for e in encodings]


def feeds(rows: Sequence[tuple[Sequence[int], Sequence[int]]],
          inputs: Sequence[str] = ("input_ids", "attention_mask")) -> Feeds:
    """The server's padding (`pad_token_ids`), with segment ids when the graph takes them."""
    segments = [types for _, types in rows] if "token_type_ids" in inputs else None
    return pad_token_ids([ids for ids, _ in rows], segments)


def batches(tokenizer: Tokenizer, items: Sequence[Item], batch_size: int,
            inputs: Sequence[str]) -> list[Feeds]:
    return [feeds(encode(tokenizer, items[i:i + batch_size]), inputs)
            for i in range(0, len(items), batch_size)]


# -- sessions, outputs and the gate ----------------------------------------------------------


def _session(model: Path | bytes, threads: int = THREADS,
             spinning: bool = False) -> ort.InferenceSession:
    """The server's session settings (backends/onnxruntime.py). Timed engines spin
    (`spinning`, ONNX Runtime's default): an engine alone in its process is timed with its
    own defaults, as PyTorch is, whose OpenMP threads spin too. On two threads spinning
    gave about 1.45x the queries/s at batch 1 (fp32 256 -> 368, int8 459 -> 677) and 1.18x
    for int8 at batch 32 (822 -> 970), medians of 3 interleaved rounds. The server turns it
    off, because there the event loop needs the cores between batches (BENCHMARKS.md
    section 3)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     "1" if spinning else "0")
    options.log_severity_level = 3  # the quantized graphs draw harmless shape-merge warnings
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=CPU_DISABLED_OPTIMIZERS)


def _input_names(session: ort.InferenceSession) -> tuple[str, ...]:
    return tuple(i.name for i in session.get_inputs())


def _check_contract(session: ort.InferenceSession, output: str, width: int) -> None:
    """The server feeds int64 token tensors and reads exactly one float [batch, width]."""
    inputs = {i.name: i.type for i in session.get_inputs()}
    outputs = {o.name: (o.type, o.shape) for o in session.get_outputs()}
    allowed = {"input_ids", "attention_mask", "token_type_ids"}
    if (set(inputs) - allowed or not {"input_ids", "attention_mask"} <= set(inputs)
            or set(inputs.values()) != {"tensor(int64)"} or list(outputs) != [output]):
        raise ExportError(f"the encoder's signature is {inputs} -> {outputs}; the server needs "
                          f"int64 input_ids, attention_mask[, token_type_ids] -> "
                          f"{{'{output}': float [batch, {width}]}}")
    kind, shape = outputs[output]
    if kind != "tensor(float)" or len(shape) != 2 or shape[1] != width:
        raise ExportError(f"the encoder's output is {kind} {shape}; the server needs float "
                          f"[batch, {width}]")


def _outputs(session: ort.InferenceSession, tokenizer: Tokenizer, items: Sequence[Item],
             batch_size: int) -> Floats:
    names = _input_names(session)
    output = session.get_outputs()[0].name
    parts = [np.asarray(session.run([output], feed)[0], dtype=np.float32)
             for feed in batches(tokenizer, items, batch_size, names)]
    return np.concatenate(parts)


def _embed(session: ort.InferenceSession, tokenizer: Tokenizer, queries: Sequence[str],
           batch_size: int) -> Floats:
    return _outputs(session, tokenizer, queries, batch_size)


class Hard(NamedTuple):
    """The plan's hard inputs and what the original returns for them."""

    items: Mapping[str, Item]
    reference: Floats


def _parity(session: ort.InferenceSession, tokenizer: Tokenizer, items: Sequence[Item],
            reference: Floats, precision: Precision, batch_sizes: Sequence[int], *,
            metric: str = "cosine", normalized: bool = True,
            decision: Decision | None = None, hard: Hard | None = None) -> Parity:
    output = session.get_outputs()[0].name
    _check_contract(session, output, reference.shape[1])
    results = [compare(metric, _outputs(session, tokenizer, items, b), reference, normalized,
                       decision) for b in batch_sizes]
    mean = min(r[0] for r in results)
    minimum = min(r[1] for r in results)
    error = max(r[2] for r in results)
    threshold = None if decision is None else decision.threshold
    draft = Parity(precision, metric, mean, minimum, error, tuple(batch_sizes), True, threshold,
                   _hard_items(session, tokenizer, hard, batch_sizes, decision))
    return replace(draft, passed=bounds_met(draft))


def _hard_items(session: ort.InferenceSession, tokenizer: Tokenizer, hard: Hard | None,
                batch_sizes: Sequence[int], decision: Decision | None) -> tuple[HardItem, ...]:
    """The hard inputs as the variant decides them at each batch size: alone at batch 1, all
    together at a larger size, as one request of them all is batched (int8's dynamic scales
    depend on the batch and its padding, so each is checked as it may be served)."""
    if hard is None:
        return ()
    items = list(hard.items.values())
    outputs = [_outputs(session, tokenizer, items, b) for b in batch_sizes]
    return hard_items(list(hard.items), outputs, hard.reference, decision)


def parity(onnx_path: Path, tokenizer_path: Path, queries: Sequence[str], reference: Floats, *,
           precision: Precision = "fp32",
           batch_sizes: Sequence[int] = PARITY_BATCH_SIZES) -> Parity:
    """Cosine agreement of an embedding model with `reference`, worst case over batch sizes."""
    return _parity(_session(onnx_path), load_tokenizer(tokenizer_path), queries, reference,
                   precision, batch_sizes)


def reference_embeddings(hf_dir: Path, queries: Sequence[str]) -> Floats:
    """What sentence-transformers itself returns for the queries."""
    from sentence_transformers import SentenceTransformer  # lazily: imports torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model = SentenceTransformer(str(hf_dir), device="cpu")
    vectors = model.encode(list(queries), batch_size=32, show_progress_bar=False,
                           convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)


def export_onnx(hf_dir: Path, out_path: Path) -> None:
    """Export a sentence-transformers folder for the embed task (the default model's path)."""
    from queryserve.optimize.export import export_encoder

    export_encoder(inspect_source(hf_dir, "embed"), out_path)


# -- timing ----------------------------------------------------------------------------------


def engine(onnx_path: Path, tokenizer_path: Path, *, threads: int = THREADS) -> Runner:
    """A model file as a timed engine: each call tokenizes, pads and runs one batch."""
    return _runner(_session(onnx_path, threads=threads, spinning=True),
                   load_tokenizer(tokenizer_path))


def _runner(session: ort.InferenceSession, tokenizer: Tokenizer) -> Runner:
    """One batch through the session as the server runs it: encode, pad, run."""
    names = _input_names(session)
    output = [session.get_outputs()[0].name]

    def run(group: Sequence[Item]) -> object:
        return session.run(output, feeds(encode(tokenizer, group), names))

    return run


def _measure(session: ort.InferenceSession, tokenizer: Tokenizer, queries: Sequence[Item],
             batch_size: int, seconds: float) -> float:
    return rate_of(_runner(session, tokenizer), queries, batch_size, seconds)


def _onnx_speed(path: Path, speeds: Mapping[int, float]) -> Speed:
    started = time.perf_counter()
    _session(path)
    load_s = time.perf_counter() - started
    return Speed.timed(path.stat().st_size / 1e6, load_s, speeds)


def _torch_runner(source: Source, tokenizer: Tokenizer) -> tuple[dict[int, Runner], float]:
    """The original model in PyTorch fp32 on the variants' threads, run as they are run
    (tokenized and padded per batch), with its load time."""
    import torch

    from queryserve.optimize.export import load_torch_model, run_torch, wrap

    started = time.perf_counter()
    wrapper = wrap(source, load_torch_model(source))
    load_s = time.perf_counter() - started
    names = wrapper.signature.inputs

    def on(threads: int) -> Runner:
        def run(group: Sequence[Item]) -> object:
            torch.set_num_threads(threads)
            return run_torch(wrapper, [feeds(encode(tokenizer, group), names)])
        return run

    return {batch_size: on(threads) for batch_size, threads in TIMING_THREADS.items()}, load_s


# -- the whole run ---------------------------------------------------------------------------


def optimize_encoder(plan: Plan, model_dir: Path, *, progress: Progress | bool = True,
                     report_name: str = "prepare.json") -> PrepareReport:
    """Export, build the variants of the planned precisions, gate each against the original,
    time those that pass, and write the fastest as `model_dir/model.onnx` (others that passed
    under `variants/`), with `tokenizer.json`, the report and, if planned, `model.yaml`.

    Raises ExportError if the fp32 export itself fails its gate, or if no candidate passes
    (unless `plan.force`, which writes the closest one and says so)."""
    started = time.perf_counter()
    source = plan.source
    if not plan.parity_items:
        raise ExportError("the accuracy gate needs real inputs; none were given")
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    recipes = recipes_for(plan.precisions)
    if plan.only is not None:  # the committed variant and the variants it is built from
        if plan.only not in ("fp32", *(r.name for r in recipes)):
            raise ChoiceRefused(f"the committed choice {plan.only} is no "
                                f"{'/'.join(plan.precisions)} recipe of this release")
        recipes = with_bases(recipes, plan.only)
    metric = "cosine" if source.task == "embed" else "top1"
    normalized = source.task == "embed" and source.normalize
    if plan.hard_items and metric != "top1":
        raise ExportError("hard inputs are decided by a classifier or a pair model; the "
                          f"{source.task} task has no decision to hold")
    # Build next to the destination so the final moves are renames on one filesystem.
    with tempfile.TemporaryDirectory(dir=model_dir.parent, prefix=f".{model_dir.name}-") as tmp, \
            progress_display(progress) as display:
        work = Path(tmp)
        steps = Steps(display, 4 + 2 * len(recipes) + 1, f"optimizing {source.name}")
        steps.next(f"exporting {source.name} to ONNX (fp32)")
        fp32_path = work / "fp32.onnx"
        export_onnx_for(source, fp32_path)
        tokenizer_src = tokenizer_file(source, work)
        tokenizer = load_tokenizer(tokenizer_src, source.max_length)
        steps.next("outputs of the original model")
        reference = original_outputs(source, tokenizer, plan.parity_items)
        hard = (Hard(plan.hard_items,
                     original_outputs(source, tokenizer, list(plan.hard_items.values())))
                if plan.hard_items else None)
        steps.next("parity of fp32")
        results = {"fp32": _parity(_session(fp32_path), tokenizer, plan.parity_items, reference,
                                   "fp32", plan.parity_batch_sizes, metric=metric,
                                   normalized=normalized, decision=plan.decision, hard=hard)}
        if not results["fp32"].passed:
            raise ExportError(f"the fp32 ONNX export fails its accuracy gate: "
                              f"{results['fp32'].shortfall()} ({results['fp32'].describe()})")
        inputs = BuildInputs(batches(tokenizer, plan.calibration_items, CALIBRATION_BATCH,
                                     ("input_ids", "attention_mask", "token_type_ids")))
        built, errors = build_variants(fp32_path, work, recipes, inputs,
                                       on_recipe=lambda r: steps.next(f"building {r.name}"))
        paths = {"fp32": fp32_path, **built}
        for recipe in recipes:
            steps.next(f"parity of {recipe.name}")
            if recipe.name in built:
                try:
                    results[recipe.name] = _parity(
                        _session(built[recipe.name]), tokenizer, plan.parity_items, reference,
                        recipe.precision, plan.parity_batch_sizes, metric=metric,
                        normalized=normalized, decision=plan.decision, hard=hard)
                except Exception as error:  # a graph the runtime cannot load or run
                    errors[recipe.name] = f"{type(error).__name__}: {error}"
                    del paths[recipe.name]
        speeds: dict[str, dict[int, float]] = {}  # untimed: the committed variant
        if plan.only is not None:
            outcome, reason = committed_outcome(plan, results, errors)
            chosen, before, after = plan.only, None, None
        else:
            outcome = gate_outcome(plan, results, errors)
            speeds, before = _time(plan, outcome.passed, paths, tokenizer, steps)
            chosen, reason = choose_fastest(speeds, results)
            reason = outcome.reason(plan, chosen, reason, results)
            after = _onnx_speed(paths[chosen], speeds[chosen])
        steps.next("writing the model folder")
        files = install(work, model_dir, paths, outcome.kept, chosen, tokenizer_src,
                        plan.model_config, served="model.onnx", suffix=".onnx")
        variants = _reports(results, speeds, files, errors, recipes)
        elapsed = time.perf_counter() - started
        report = PrepareReport(chosen, reason, variants, model_dir / "model.onnx",
                               model_dir / report_name, elapsed, outcome.forced, before, after)
        _write_report(report, plan)
        steps.finish()
    return report


def _time(plan: Plan, names: Sequence[str], paths: Mapping[str, Path], tokenizer: Tokenizer,
          steps: Steps) -> tuple[dict[str, dict[int, float]], Speed | None]:
    """The sweep's timing: each variant of `names` at the timed batch sizes, in rounds; and the
    PyTorch original in the same rounds when the plan measures it (like for like)."""
    runners = {name: {batch_size: _runner(_session(paths[name], threads, spinning=True),
                                          tokenizer)
                      for batch_size, threads in TIMING_THREADS.items()}
               for name in names}
    if plan.measure_original:
        runners[ORIGINAL], original_load_s = _torch_runner(plan.source, tokenizer)
    steps.grow(plan.timing_rounds * len(TIMING_BATCH_SIZES) * len(runners))
    speeds = time_runners(runners, plan.parity_items, plan.timing_seconds, plan.timing_rounds,
                          steps)
    before = (Speed.timed(plan.source.weights_mb, original_load_s, speeds.pop(ORIGINAL))
              if plan.measure_original else None)
    return speeds, before


def export_onnx_for(source: Source, out_path: Path) -> None:
    """The fp32 export (a seam the tests use to feed a damaged export through the gate)."""
    from queryserve.optimize.export import export_encoder

    export_encoder(source, out_path)


def original_outputs(source: Source, tokenizer: Tokenizer, items: Sequence[Item]) -> Floats:
    """What the original model returns: sentence-transformers for its own folders (embed),
    otherwise the Hugging Face model in PyTorch with the graph's pooling or softmax."""
    if source.task == "embed" and source.sentence_transformers:
        return reference_embeddings(source.path, [str(i) for i in items])
    from queryserve.optimize.export import load_torch_model, run_torch, wrap

    wrapper = wrap(source, load_torch_model(source))
    return run_torch(wrapper, batches(tokenizer, items, 32, wrapper.signature.inputs))


def _reports(results: Mapping[str, Parity], speeds: Mapping[str, Mapping[int, float]],
             files: Mapping[str, str], errors: Mapping[str, str],
             recipes: Sequence[Recipe]) -> tuple[VariantReport, ...]:
    reports = [VariantReport("fp32", "fp32", "torch.onnx.export (TorchScript, opset 17), eager "
                             "attention, pooling/softmax in the graph", results["fp32"].passed,
                             results["fp32"], speeds.get("fp32", {}), files.get("fp32"))]
    for recipe in recipes:
        result = results.get(recipe.name)
        reports.append(VariantReport(recipe.name, recipe.precision, recipe.description,
                                     result is not None and result.passed, result,
                                     speeds.get(recipe.name, {}), files.get(recipe.name),
                                     errors.get(recipe.name)))
    return tuple(reports)


def _write_report(report: PrepareReport, plan: Plan) -> None:
    write_report(report, plan, {
        "gate": {"fp32": {"mean_min": FP32_MIN_MEAN, "top1_agreement_min": FP32_MIN_AGREEMENT,
                          "max_probability_error": FP32_MAX_PROBABILITY_ERROR},
                 "reduced": {"mean_min": REDUCED_MIN_MEAN, "min_min": REDUCED_MIN_MIN,
                             "top1_agreement_min": REDUCED_MIN_AGREEMENT},
                 "max_norm_error": NORM_TOLERANCE,
                 # every variant decides each exactly as the original (prepare reads this back)
                 "hard_items": list(plan.hard_items)},
        "parity_queries": len(plan.parity_items),
        "calibration_texts": len(plan.calibration_items),
        "timing": {"batch_sizes": list(TIMING_BATCH_SIZES),
                   "seconds_per_round": plan.timing_seconds, "rounds": plan.timing_rounds,
                   "statistic": "median", "tokenization_included": True,
                   "intra_op_num_threads": {str(b): t for b, t in TIMING_THREADS.items()},
                   "inter_op_num_threads": 1,
                   "execution_mode": "sequential", "allow_spinning": True},
        "onnxruntime": ort.__version__,
        "recipes_version": RECIPES_VERSION,
    })


# -- the default model's first run -----------------------------------------------------------


def prepare_encoder(hf_dir: Path, model_dir: Path, *, parity_queries: Sequence[str],
                    calibration_texts: Sequence[str], progress: Progress | bool = True,
                    timing_seconds: float = TIMING_SECONDS, timing_rounds: int = TIMING_ROUNDS,
                    parity_batch_sizes: Sequence[int] = PARITY_BATCH_SIZES,
                    only: str | None = None) -> PrepareReport:
    """The default `embed` model: all-MiniLM-L6-v2 with fp32 and int8 candidates, gated against
    sentence-transformers; keeps the repository's own model.yaml."""
    if not parity_queries:
        raise ExportError("prepare_encoder needs parity queries")
    plan = Plan(inspect_source(hf_dir, "embed"), ("fp32", "int8"), parity_queries,
                calibration_texts, timing_seconds, timing_rounds, parity_batch_sizes,
                extra={"model": "sentence-transformers/all-MiniLM-L6-v2"}, only=only)
    return optimize_encoder(plan, model_dir, progress=progress)


