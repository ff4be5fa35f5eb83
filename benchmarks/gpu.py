"""GPU figures for queryserve's CUDA paths, through queryserve's own backends.

1. `embed` (all-MiniLM-L6-v2) through `OnnxRuntimeBackend`, which puts CUDAExecutionProvider
   first when the installed onnxruntime has it: for each variant, the providers the session
   really got, batch-1 latency (median, p99) and batch-32 throughput, tokenization and padding
   included as the server does them, and parity (cosine, mean and min) against the CPU
   provider's fp32-fused embeddings (batch 1) of the same real queries. The CPU provider is
   timed alongside, on the same machine, for comparison. fp16-fused is made from fp32-fused
   with queryserve's own recipe (`convert_fp16`) when it is missing.
2. `spell-seq2seq` through `CTranslate2Backend` on the same queries, when ctranslate2 is
   installed: the device the backend settled on, and its speed there.

Nothing here needs a GPU to be importable: on a machine without a CUDA onnxruntime or without
ctranslate2 it says what it skipped and why, and exits 0.

    PYTHONPATH=src python benchmarks/gpu.py [--out bench-out/gpu/gpu.json]

Results: a markdown table on stdout and the JSON file (BENCHMARKS.md quotes one run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from queryserve.backends import Backend
from queryserve.backends.onnxruntime import CPU_DISABLED_OPTIMIZERS, OnnxRuntimeBackend
from queryserve.config import ModelConfig, load_model_config
from queryserve.pipelines.base import load_tokenizer
from queryserve.pipelines.text_embedding import pad_token_ids
from queryserve.types import Array

ROOT = Path(__file__).resolve().parent.parent
EMBED = ROOT / "model_repository" / "embed"
SPELL = ROOT / "model_repository" / "spell-seq2seq"
QUERIES = ROOT / "data" / "massive-en" / "test.jsonl"
CUDA = "CUDAExecutionProvider"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def read_queries(limit: int) -> list[str]:
    lines = QUERIES.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines[:limit]]


def gpu_line() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no nvidia-smi"


def cpu_line() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                    "cpu")
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


# -- timing -----------------------------------------------------------------------------------


def timed(run: Callable[[Sequence[str]], Any], queries: Sequence[str], batch: int,
          runs: int) -> list[float]:
    """Seconds per call over `runs` consecutive batches of real queries, cycling through them."""
    times = []
    for i in range(runs):
        start = (i * batch) % len(queries)
        texts = [queries[(start + j) % len(queries)] for j in range(batch)]
        began = time.perf_counter()
        run(texts)
        times.append(time.perf_counter() - began)
    return times


def speed(run: Callable[[Sequence[str]], Any], queries: Sequence[str], runs: int,
          batch: int) -> dict[str, float]:
    # One pass over every query first: CUDA kernels and ORT's per-shape state are built on
    # first sight of each sequence length, and that cost is not serving's steady state.
    for i in range(0, len(queries), batch):
        run(queries[i:i + batch])
    one = timed(run, queries, 1, runs)
    many = timed(run, queries, batch, max(runs // 5, 20))
    return {"b1_p50_ms": statistics.median(one) * 1e3,
            "b1_p99_ms": float(np.percentile(one, 99)) * 1e3,
            f"b{batch}_per_s": batch * len(many) / sum(many)}


# -- 1. ONNX Runtime --------------------------------------------------------------------------


def embedder(backend: Backend, config: ModelConfig) -> Callable[[Sequence[str]], Array]:
    """Texts -> embeddings as the server computes them (pipelines/text_embedding.py)."""
    tokenizer = load_tokenizer(config)

    def run(texts: Sequence[str]) -> Array:
        rows = ([tokenizer.encode(texts[0])] if len(texts) == 1
                else tokenizer.encode_batch(list(texts)))
        return backend.run(pad_token_ids([r.ids for r in rows]))["embedding"]
    return run


def embed_all(run: Callable[[Sequence[str]], Array], queries: Sequence[str],
              batch: int) -> Array:
    return np.concatenate([run(queries[i:i + batch]) for i in range(0, len(queries), batch)])


def cosine(a: Array, b: Array) -> Array:
    a, b = a.astype(np.float64), b.astype(np.float64)
    sims: Array = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return sims


def on_cpu(backend: OnnxRuntimeBackend, path: Path) -> OnnxRuntimeBackend:
    """The same backend and session options on the CPU provider alone: the backend always
    takes CUDA when the build has it, and the comparison needs both on one machine."""
    options = backend.session.get_session_options()
    backend.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                           disabled_optimizers=CPU_DISABLED_OPTIMIZERS)
    backend.providers = tuple(backend.session.get_providers())
    return backend


def onnx_rows(args: argparse.Namespace, queries: list[str]) -> list[dict[str, Any]]:
    base = load_model_config(EMBED / "model.yaml")
    fp32, fp16 = EMBED / "variants" / "fp32-fused.onnx", EMBED / "variants" / "fp16-fused.onnx"
    if fp32.is_file() and not fp16.is_file():
        from queryserve.optimize.recipes import convert_fp16

        log(f"building {fp16.name} with queryserve's convert_fp16")
        convert_fp16(fp32, fp16)

    def backend(path: Path, threads: int, cpu: bool = False) -> OnnxRuntimeBackend:
        config = dataclasses.replace(base, parameters={
            **base.parameters, "model_file": str(path.relative_to(EMBED))})
        made = OnnxRuntimeBackend(config, threads)
        return on_cpu(made, path) if cpu else made

    reference_backend = backend(fp32, os.cpu_count() or 1, cpu=True)
    reference = embed_all(embedder(reference_backend, base), queries, 1)
    engines: list[tuple[str, Path, int, bool]] = [
        (f"CPU fp32-fused, {t} thread{'s' if t > 1 else ''}", fp32, t, True)
        for t in args.cpu_threads]
    engines += [(f"CUDA {p.stem}", p, 1, False) for p in (fp32, fp16)]
    rows = []
    for label, path, threads, cpu in engines:
        row: dict[str, Any] = {"engine": label, "file": path.name}
        try:
            made = backend(path, threads, cpu)
            row["providers"] = list(made.providers)
            if not cpu and made.providers[0] != CUDA:
                row["note"] = "fell back to the CPU provider"
            run = embedder(made, base)
            for batch in (1, args.batch):
                sims = cosine(embed_all(run, queries, batch), reference)
                row[f"parity_b{batch}"] = {"mean": float(sims.mean()), "min": float(sims.min())}
            row.update(speed(run, queries, args.runs, args.batch))
        except Exception as exc:  # a graph that fails on a provider is a finding, not a crash
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            traceback.print_exc()
        log(json.dumps(row))
        rows.append(row)
    return rows


# -- 2. CTranslate2 ---------------------------------------------------------------------------


def ctranslate2_rows(args: argparse.Namespace, queries: list[str]) -> list[dict[str, Any]]:
    try:
        import ctranslate2
    except ImportError:
        return [{"engine": "CTranslate2 spell-seq2seq", "skipped": "ctranslate2 not installed"}]
    from queryserve.backends.ctranslate2 import OUTPUT_TOKENS, SOURCE_TOKENS, CTranslate2Backend
    from queryserve.pipelines.text2text import source_tokens

    row: dict[str, Any] = {"engine": "CTranslate2 spell-seq2seq",
                           "ctranslate2": ctranslate2.__version__,
                           "cuda_devices": ctranslate2.get_cuda_device_count()}
    try:
        config = load_model_config(SPELL / "model.yaml")
        made = CTranslate2Backend(config, 1)
        tokenizer = load_tokenizer(config)
        row["device"] = made.device

        def run(texts: Sequence[str]) -> Any:
            sources = np.empty(len(texts), dtype=object)
            sources[:] = source_tokens(tokenizer, texts)
            return made.run({SOURCE_TOKENS: sources})[OUTPUT_TOKENS]
        run(queries[:2])  # CUDA libraries (cuBLAS) load on the first batch, not at construction
        row.update(speed(run, queries, args.runs, args.batch))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        traceback.print_exc()
    log(json.dumps(row))
    return [row]


# -- report -----------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], batch: int) -> str:
    def parity(row: dict[str, Any], b: int) -> str:
        p = row.get(f"parity_b{b}")
        return f"{p['mean']:.7f} / {p['min']:.7f}" if p else ""

    def num(row: dict[str, Any], key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else ""

    lines = [f"| engine | providers | parity b1 (mean / min) | parity b{batch} (mean / min) "
             f"| b1 p50 ms | b1 p99 ms | b{batch} texts/s |",
             "|---|---|---|---|---:|---:|---:|"]
    for row in rows:
        providers = ", ".join(p.removesuffix("ExecutionProvider") for p in row.get("providers", ()))
        providers = providers or row.get("device", "")
        problem = row.get("error") or row.get("skipped") or row.get("note")
        if problem:
            providers = f"{providers} **{problem}**".strip()
        lines.append(f"| {row['engine']} | {providers} | {parity(row, 1)} | {parity(row, batch)} "
                     f"| {num(row, 'b1_p50_ms', '.2f')} | {num(row, 'b1_p99_ms', '.2f')} "
                     f"| {num(row, f'b{batch}_per_s', ',.0f')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "gpu" / "gpu.json")
    parser.add_argument("--queries", type=int, default=512, help="real MASSIVE test queries")
    parser.add_argument("--runs", type=int, default=500, help="batch-1 calls timed per engine")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cpu-threads", type=int, nargs="*",
                        default=sorted({1, os.cpu_count() or 1}))
    args = parser.parse_args()

    queries = read_queries(args.queries)
    machine = {"gpu": gpu_line(), "cpu": cpu_line(), "onnxruntime": ort.__version__,
               "onnxruntime_providers": ort.get_available_providers()}
    log(json.dumps(machine))
    rows: list[dict[str, Any]] = []
    if CUDA in ort.get_available_providers():
        rows += onnx_rows(args, queries)
    else:
        rows.append({"engine": "ONNX Runtime CUDA", "skipped": f"onnxruntime {ort.__version__} "
                     "has no CUDAExecutionProvider (install onnxruntime-gpu)"})
    rows += ctranslate2_rows(args, queries)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "queries": len(queries),
                                    "runs": args.runs, "rows": rows}, indent=2))
    print(f"\n{machine['gpu']}; {machine['cpu']}; onnxruntime {machine['onnxruntime']}\n")
    print(table(rows, args.batch))


if __name__ == "__main__":
    main()
