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
How one candidate is run, checked and timed is `candidates.py`.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from rich.progress import Progress
from tokenizers import Tokenizer

from queryserve.errors import ExportError
from queryserve.optimize.candidates import (
    TIMING_THREADS,
    Floats,
    Hard,
    batch_runner,
    batches,
    encode,
    feeds,
    load_tokenizer,
    onnx_speed,
    open_session,
    parity_of,
)
from queryserve.optimize.gate import (
    FP32_MAX_PROBABILITY_ERROR,
    FP32_MIN_AGREEMENT,
    FP32_MIN_MEAN,
    NORM_TOLERANCE,
    REDUCED_MIN_AGREEMENT,
    REDUCED_MIN_MEAN,
    REDUCED_MIN_MIN,
    Parity,
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

log = logging.getLogger(__name__)

__all__ = ["RECIPES", "SMOOTHING_ALPHA", "Precision", "optimize_encoder", "prepare_encoder"]

EMBEDDING_OUTPUT = "embedding"
CALIBRATION_BATCH = 32
ORIGINAL = "original"  # the PyTorch original's name among the timed runners


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
        results = {"fp32": parity_of(open_session(fp32_path), tokenizer, plan.parity_items,
                                     reference, "fp32", plan.parity_batch_sizes, metric=metric,
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
                    results[recipe.name] = parity_of(
                        open_session(built[recipe.name]), tokenizer, plan.parity_items, reference,
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
            after = onnx_speed(paths[chosen], speeds[chosen])
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
    runners = {name: {batch_size: batch_runner(open_session(paths[name], threads, spinning=True),
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


