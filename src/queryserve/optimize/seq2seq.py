"""Optimize a seq2seq model (T5, BART): convert to CTranslate2 at each planned precision, gate
each against Hugging Face `generate` on real inputs, time those that pass, and write the fastest
as a servable model folder.

The gate is exact match of the generated text: the original runs `generate` in PyTorch with the
same decoding (greedy or beam, same maximum length) and the optimized model runs exactly as the
server runs it (`tokenizers` encoding, `backends.ctranslate2.generate`, the pipeline's
decoding), at batch 1 and 32. fp32 is always converted and checked first: a converter problem
shows there, before any precision is blamed. Timing runs each variant at one intra-op thread
and at all cores, each alone in a fresh process without PyTorch (`time_in_fresh_process` says
why); the faster setting goes into the written model.yaml.

Precisions map to CTranslate2 compute types: fp32 -> float32, int8 -> int8 (int8 weights and
matrix products, the rest in float32), bf16 -> int8_bfloat16 and bfloat16, fp16 -> int8_float16
and float16. A type this CTranslate2 build cannot run on this device is reported as not built,
in the runtime's own words.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress
from tokenizers import Tokenizer

from queryserve.backends.ctranslate2 import generate
from queryserve.errors import ExportError
from queryserve.optimize.gate import SEQ2SEQ_MIN_EXACT, Parity, bounds_met
from queryserve.optimize.plan import (
    TIMING_BATCH_SIZES,
    Plan,
    PrepareReport,
    Runner,
    Speed,
    Steps,
    VariantReport,
    at_every_batch_size,
    choose_fastest,
    gate_outcome,
    geometric_mean,
    install,
    progress_display,
    time_runners,
    write_report,
)
from queryserve.optimize.recipes import Precision
from queryserve.optimize.source import Source, tokenizer_file
from queryserve.pipelines.base import open_tokenizer
from queryserve.pipelines.text2text import decode_tokens, source_tokens
from queryserve.pipelines.text_embedding import pad_token_ids

COMPUTE_TYPES: Mapping[Precision, tuple[str, ...]] = {
    "fp32": ("float32",),
    "int8": ("int8",),
    "bf16": ("int8_bfloat16", "bfloat16"),
    "fp16": ("int8_float16", "float16"),
}
PARITY_BATCH_SIZES = (1, 32)
TIMING_ITEMS = 64  # the first parity inputs; batch 1 in PyTorch takes ~0.1 s per query
# Intra-op threads are timed, not assumed: on this 2-core VM a second thread made int8 about
# 9x slower at batch 1 and float32 about 1.8x faster (BENCHMARKS.md section 7).
TORCH_THREADS = 2  # PyTorch's own best here: all the cores
MAX_DIFFERENCES = 5  # examples of differing outputs kept in the report


@dataclass(frozen=True)
class Decoding:
    """How both the original and the optimized model generate; written into model.yaml."""

    beam_size: int = 1
    max_output_length: int = 64


def device() -> str:
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def unsupported_reason(precisions: Sequence[Precision]) -> str:
    """Why none of `precisions` can run on this machine's CTranslate2, or '' if one can."""
    import ctranslate2

    offered = ctranslate2.get_supported_compute_types(device())
    if any(t in offered for p in precisions for t in COMPUTE_TYPES[p]):
        return ""
    asked = ", ".join(t for p in precisions for t in COMPUTE_TYPES[p])
    return (f"CTranslate2 {ctranslate2.__version__} on {device()} runs "
            f"{', '.join(sorted(offered))}, not {asked}")


# -- the original: Hugging Face generate in PyTorch ------------------------------------------


class Original:
    """The source model in PyTorch, generating as `generate` does with the planned decoding."""

    def __init__(self, source: Source, tokenizer: Tokenizer, decoding: Decoding) -> None:
        import torch
        from transformers import AutoModelForSeq2SeqLM

        torch.set_num_threads(TORCH_THREADS)
        started = time.perf_counter()
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(source.path)).eval()
        self.load_s = time.perf_counter() - started
        self.tokenizer = tokenizer
        self.decoding = decoding

    def generate(self, texts: Sequence[str]) -> list[str]:
        import torch

        # The server's padding; padded positions are masked, so their id does not matter.
        padded = pad_token_ids([e.ids for e in self.tokenizer.encode_batch(list(texts))])
        ids, mask = (torch.from_numpy(padded[k]) for k in ("input_ids", "attention_mask"))
        beams = self.decoding.beam_size
        # CTranslate2 ends a beam search once `beam_size` hypotheses are finished, as
        # early_stopping=True does; a folder's own generation settings are overridden by what
        # the served model does (no n-gram blocking, no length or repetition penalty, no end
        # token forced at the maximum length).
        extra = {"num_beams": beams, "early_stopping": True} if beams > 1 else {}
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False,
                max_new_tokens=self.decoding.max_output_length, min_length=0,
                length_penalty=1.0, no_repeat_ngram_size=0, repetition_penalty=1.0,
                forced_eos_token_id=None, **extra)
        return [t.strip() for t in self.tokenizer.decode_batch(out.tolist(),
                                                               skip_special_tokens=True)]


def original_generations(original: Original, texts: Sequence[str]) -> list[str]:
    return [out for i in range(0, len(texts), 32) for out in original.generate(texts[i:i + 32])]


# -- the optimized model, as the server runs it ----------------------------------------------


def convert(source: Source, out: Path, compute_type: str) -> None:
    """A CTranslate2 model folder with weights stored in `compute_type`."""
    from ctranslate2.converters import TransformersConverter

    try:
        with _convertible(source) as folder:
            TransformersConverter(str(folder)).convert(str(out), quantization=compute_type,
                                                       force=True)
    except Exception as error:  # the converter raises many kinds; the report needs one line
        raise ExportError(f"CTranslate2 could not convert {source.path}: "
                          f"{type(error).__name__}: {error}") from None


@contextmanager
def _convertible(source: Source) -> Iterator[Path]:
    """The folder as CTranslate2's converter can read it. Its BART loader (4.8.5) reads
    `config.normalize_before`, which transformers 5 no longer writes; BART is post-norm, so a
    scratch copy of the folder (weights linked, not copied) says so. Other folders go as they
    are; the user's folder is never changed."""
    config = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
    if source.model_type != "bart" or "normalize_before" in config:
        yield source.path
        return
    with tempfile.TemporaryDirectory(prefix="queryserve-bart-") as tmp:
        folder = Path(tmp)
        for item in source.path.iterdir():
            if item.name != "config.json":
                (folder / item.name).symlink_to(item.resolve())
        (folder / "config.json").write_text(json.dumps({**config, "normalize_before": False}),
                                            encoding="utf-8")
        yield folder


def thread_choices() -> tuple[int, ...]:
    """One intra-op thread, and every core this process may use."""
    return tuple(sorted({1, len(os.sched_getaffinity(0))}))


def translator(path: Path, compute_type: str = "default", threads: int = 1) -> Any:
    import ctranslate2

    return ctranslate2.Translator(str(path), device=device(), compute_type=compute_type,
                                  inter_threads=1, intra_threads=threads)


def generations(model: Any, tokenizer: Tokenizer, texts: Sequence[str], batch_size: int,
                decoding: Decoding, max_input_length: int) -> list[str]:
    outputs: list[str] = []
    for i in range(0, len(texts), batch_size):
        tokens = source_tokens(tokenizer, texts[i:i + batch_size])
        outputs += decode_tokens(tokenizer, generate(model, tokens, decoding.beam_size,
                                                     decoding.max_output_length,
                                                     max_input_length))
    return outputs


def parity(model: Any, tokenizer: Tokenizer, texts: Sequence[str], reference: Sequence[str],
           precision: Precision, decoding: Decoding, max_input_length: int,
           ) -> tuple[Parity, tuple[tuple[str, str, str], ...]]:
    """Exact match against the original, worst over the batch sizes, and examples of misses."""
    rates = []
    differences: dict[str, tuple[str, str, str]] = {}
    for batch_size in PARITY_BATCH_SIZES:
        outputs = generations(model, tokenizer, texts, batch_size, decoding, max_input_length)
        same = [a == b for a, b in zip(outputs, reference, strict=True)]
        rates.append(sum(same) / len(same))
        for text, original, output, equal in zip(texts, reference, outputs, same, strict=True):
            if not equal and len(differences) < MAX_DIFFERENCES:
                differences.setdefault(text, (text, original, output))
    rate = min(rates)
    draft = Parity(precision, "exact", rate, rate, 1.0 - rate, PARITY_BATCH_SIZES, True)
    checked = Parity(precision, "exact", rate, rate, 1.0 - rate, PARITY_BATCH_SIZES,
                     bounds_met(draft))
    return checked, tuple(differences.values())


# -- timing ----------------------------------------------------------------------------------


def time_in_fresh_process(layouts: Mapping[str, tuple[Path, int]], tokenizer_path: Path,
                          max_length: int, texts: Sequence[str], decoding: Decoding,
                          seconds: float, rounds: int,
                          ) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    """Each (model folder, intra-op threads) layout timed alone in a spawned process that
    never imports PyTorch, as a server process runs one variant. Sharing a process skews the
    figures: after PyTorch had run, a 2-thread float32 translator took 36 ms per query at
    batch 1 instead of 11, and beside int8 translators 37 ms instead of 10 (this 2-core VM,
    the section 7 model)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rates: dict[str, dict[int, float]] = {}
    load_s: dict[str, float] = {}
    spawn = multiprocessing.get_context("spawn")
    for name, layout in layouts.items():
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            one_rates, one_load = pool.submit(_time_layouts, {name: layout}, tokenizer_path,
                                              max_length, list(texts), decoding, seconds,
                                              rounds).result()
        rates.update(one_rates)
        load_s.update(one_load)
    return rates, load_s


def _time_layouts(layouts: dict[str, tuple[Path, int]], tokenizer_path: Path, max_length: int,
                  texts: list[str], decoding: Decoding, seconds: float, rounds: int,
                  ) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    """Queries/s of each (model folder, intra-op threads) layout, and its load time."""
    tokenizer = open_tokenizer(tokenizer_path, max_length)
    runners, load_s = {}, {}
    for name, (path, threads) in layouts.items():
        started = time.perf_counter()
        model = translator(path, threads=threads)
        load_s[name] = time.perf_counter() - started
        runners[name] = at_every_batch_size(_runner(model, tokenizer, decoding, max_length))
    return time_runners(runners, texts, seconds, rounds), load_s


def _runner(model: Any, tokenizer: Tokenizer, decoding: Decoding,
            max_input_length: int) -> Runner:
    def run(texts: Sequence[str]) -> list[str]:
        return generations(model, tokenizer, texts, len(texts), decoding, max_input_length)

    return run


def _folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


# -- the whole run ---------------------------------------------------------------------------


def optimize_seq2seq(plan: Plan, model_dir: Path, decoding: Decoding = Decoding(), *,
                     progress: Progress | bool = True,
                     report_name: str = "prepare.json") -> PrepareReport:
    """Convert, gate, time and write `model_dir/ctranslate2/` (variants that passed under
    `variants/`), with `tokenizer.json`, the report and, if planned, `model.yaml`.

    Raises ExportError if the float32 conversion fails its gate, or if no planned precision
    passes (unless `plan.force`, which writes the closest one and says so)."""
    import ctranslate2

    started = time.perf_counter()
    source = plan.source
    texts = [str(item) for item in plan.parity_items]
    if not texts:
        raise ExportError("the accuracy gate needs real inputs; none were given")
    offered = ctranslate2.get_supported_compute_types(device())
    wanted = [t for p in plan.precisions for t in COMPUTE_TYPES[p] if t != "float32"]
    precision_of = {t: p for p, types in COMPUTE_TYPES.items() for t in types}
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=model_dir.parent, prefix=f".{model_dir.name}-") as tmp, \
            progress_display(progress) as display:
        work = Path(tmp)
        steps = Steps(display, 3 + 2 * len(wanted) + 1, f"optimizing {source.name}")
        tokenizer_src = tokenizer_file(source, work)
        tokenizer = open_tokenizer(tokenizer_src, source.max_length)
        steps.next("generating with the original (Hugging Face generate, PyTorch)")
        original = Original(source, tokenizer, decoding)
        reference = original_generations(original, texts)
        steps.next("converting to CTranslate2 float32")
        paths = {"float32": work / "float32"}
        convert(source, paths["float32"], "float32")
        steps.next("parity of float32")
        results, differences = {}, {}
        results["float32"], differences["float32"] = parity(
            translator(paths["float32"]), tokenizer, texts, reference, "fp32", decoding,
            source.max_length)
        if not results["float32"].passed:
            raise ExportError(f"the float32 CTranslate2 conversion fails its accuracy gate: "
                              f"{results['float32'].shortfall()} "
                              f"({results['float32'].describe()})")
        errors: dict[str, str] = {}
        for compute_type in wanted:
            steps.next(f"converting to {compute_type}")
            if compute_type not in offered:
                errors[compute_type] = (f"CTranslate2 {ctranslate2.__version__} on {device()} "
                                        f"runs {', '.join(sorted(offered))}")
                steps.next(f"parity of {compute_type}")
                continue
            paths[compute_type] = work / compute_type
            convert(source, paths[compute_type], compute_type)
            steps.next(f"parity of {compute_type}")
            results[compute_type], differences[compute_type] = parity(
                translator(paths[compute_type]), tokenizer, texts, reference,
                precision_of[compute_type], decoding, source.max_length)
        outcome = gate_outcome(plan, results, errors)
        candidates = outcome.candidates
        timed = texts[:TIMING_ITEMS]
        shape = {"mean_input_tokens": _mean_tokens(tokenizer, timed),
                 "mean_output_tokens": _mean_tokens(tokenizer, reference[:TIMING_ITEMS])}
        # Every built candidate is timed, the ones that miss too: the report then shows what
        # the gate cost (a few variants at most, so this is cheap next to the parity runs).
        # Each at one thread and at all cores; a variant's figures are its better setting's.
        layouts = [(name, threads) for name in candidates for threads in thread_choices()]
        steps.grow(1 + (1 if plan.measure_original else 0))
        steps.next("timing the CTranslate2 variants (each in a fresh process, as served)")
        by_layout, load_s = time_in_fresh_process(
            {_timed_name(n, t): (paths[n], t) for n, t in layouts}, tokenizer_src,
            source.max_length, timed, decoding, plan.timing_seconds, plan.timing_rounds)
        load_s = {n: load_s[_timed_name(n, 1)] for n in candidates}
        best_threads = {name: _faster_threads(by_layout, name) for name in candidates}
        speeds = {n: by_layout[_timed_name(n, t)] for n, t in best_threads.items()}
        chosen, reason = choose_fastest({n: speeds[n] for n in outcome.passed}, results)
        reason = outcome.reason(plan, chosen, reason + f"; timed at {best_threads[chosen]} "
                                "intra-op thread(s), its faster setting", results)
        before = None
        if plan.measure_original:
            steps.next("timing the original in PyTorch")
            rates = time_runners({"original": at_every_batch_size(original.generate)}, timed,
                                 plan.timing_seconds, plan.timing_rounds)["original"]
            before = Speed.timed(source.weights_mb, original.load_s, rates)
        after = Speed.timed(_folder_mb(paths[chosen]), load_s[chosen], speeds[chosen])
        steps.next("writing the model folder")
        config = (None if plan.model_config is None else
                  with_threads(plan.model_config, best_threads[chosen]))
        files = install(work, model_dir, paths, outcome.kept, chosen, tokenizer_src, config,
                        served="ctranslate2", suffix="")
        variants = tuple(
            VariantReport(name, result.precision, f"CTranslate2 {ctranslate2.__version__}, "
                          f"compute type {name}", result.passed, result, speeds.get(name, {}),
                          files.get(name), None, differences.get(name, ()))
            for name, result in results.items()
        ) + tuple(VariantReport(name, precision_of[name], f"CTranslate2 compute type {name}",
                                False, None, {}, None, error)
                  for name, error in errors.items())
        report = PrepareReport(chosen, reason, variants, model_dir / "ctranslate2",
                               model_dir / report_name, time.perf_counter() - started,
                               outcome.forced, before, after, engine="CTranslate2")
        thread_timing = {name: {threads: {f"batch_{b}": round(q, 1) for b, q in
                                          by_layout[_timed_name(name, threads)].items()}
                                for threads in thread_choices()} for name in candidates}
        _write_report(report, plan, decoding, {**shape, "by_intra_threads": thread_timing,
                                               "chosen_intra_threads": best_threads[chosen]})
        steps.finish()
    return report


def _timed_name(name: str, threads: int) -> str:
    return f"{name} ({threads} thread{'s' if threads > 1 else ''})"


def _faster_threads(by_layout: Mapping[str, Mapping[int, float]], name: str) -> int:
    """The thread count with the better geometric mean over the timed batch sizes."""
    return max(thread_choices(),
               key=lambda threads: geometric_mean(by_layout[_timed_name(name, threads)]))


def with_threads(model_config: str, threads: int) -> str:
    """The model.yaml with the timed thread count per instance, and as many instances as the
    cores hold (comment lines at the top are kept)."""
    import yaml

    header = "".join(line for line in model_config.splitlines(keepends=True)
                     if line.startswith("#"))
    config = yaml.safe_load(model_config)
    config.setdefault("parameters", {})["intra_threads"] = threads
    config["instance_group"] = {"count": max(1, len(os.sched_getaffinity(0)) // threads)}
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=None)


def _mean_tokens(tokenizer: Tokenizer, texts: Sequence[str]) -> float:
    """Mean tokens per text, end token included (what the encoder reads, or the decoder
    steps a generation takes)."""
    return statistics.fmean(len(e.ids) for e in tokenizer.encode_batch(list(texts)))


def _write_report(report: PrepareReport, plan: Plan, decoding: Decoding,
                  shape: Mapping[str, object]) -> None:
    import ctranslate2

    write_report(report, plan, {
        "gate": {"exact_match_min": SEQ2SEQ_MIN_EXACT},
        "decoding": asdict(decoding),
        "parity_queries": len(plan.parity_items),
        "timing": {"batch_sizes": list(TIMING_BATCH_SIZES), "queries": TIMING_ITEMS, **shape,
                   "seconds_per_round": plan.timing_seconds, "rounds": plan.timing_rounds,
                   "statistic": "median", "tokenization_included": True,
                   "torch_threads": TORCH_THREADS},
        "ctranslate2": ctranslate2.__version__,
        "device": device(),
    })
