"""Section 1, in-process engines at batch 1 (one thread, two threads, two one-thread replicas
side by side) / 8 / 32 (two threads, two replicas): sentence-transformers fp32 (PyTorch) and
every ONNX variant `queryserve prepare` kept, with its parity against sentence-transformers;
and the served model over HTTP with requests of 8 and 32 queries."""

from __future__ import annotations

import json
import os
import statistics
import threading
from collections.abc import Callable
from typing import Any

from queryserve.bench.server_process import serving
from queryserve.optimize.candidates import engine
from queryserve.optimize.plan import rate_of
from queryserve.optimize.source import minilm_folder
from sections.common import MODEL_DIR, OUT, bench, load_queries, log, one_model_repository

THREADS = (1, 2)
REPLICAS = 2
ENGINE_COLUMNS = {"bs1t1": (1, 1, 1), "bs1": (1, 2, 1), "bs1x2": (1, 1, REPLICAS),
                  "bs8": (8, 2, 1), "bs32": (32, 2, 1), "bs32x2": (32, 1, REPLICAS)}
"""Section 1's columns: (batch size, intra-op threads per replica, replicas). Two one-thread
replicas side by side is how the server uses the two cores (two instances of one thread);
two intra-op threads is how a single engine does."""
SERVED_BATCH_SIZES = (8, 32)


Runner = Callable[[list[str]], object]


def measure(seconds: float, repeats: int) -> dict[str, Any]:
    """Each engine's queries/s per column (`seconds` a round, the median of `repeats`), and
    the served model with requests of several queries."""
    return {"rows": engine_rows(load_queries(512), seconds, repeats), "served": served_batches()}


def st_engines() -> dict[int, list[Runner]]:
    """sentence-transformers on 1 and 2 PyTorch threads, a replica each (each its own model:
    a fast tokenizer is not safe to share between threads): each call encodes one batch,
    padded to its longest query (`batch_size` = the batch)."""
    import torch
    from sentence_transformers import SentenceTransformer

    def on(threads: int) -> Runner:
        model = SentenceTransformer(str(minilm_folder()), device="cpu")

        def run(batch: list[str]) -> object:
            # One process-wide setting, the same in every replica of a column.
            torch.set_num_threads(threads)
            with torch.inference_mode():
                return model.encode(batch, batch_size=len(batch), normalize_embeddings=True)
        return run

    return {t: [on(t) for _ in range(replicas_on(t))] for t in THREADS}


def replicas_on(threads: int) -> int:
    """How many replicas a column on `threads` intra-op threads can ask for."""
    return max(r for _, t, r in ENGINE_COLUMNS.values() if t == threads)


def replicas_rate(runners: list[Runner], queries: list[str], batch_size: int,
                  seconds: float) -> float:
    """Queries/s of `runners` side by side, one Python thread each over its share of the
    queries (both engines release the GIL in their kernels, as the server's instances do)."""
    if len(runners) == 1:
        return rate_of(runners[0], queries, batch_size, seconds)
    rates = [0.0] * len(runners)

    def work(i: int) -> None:
        rates[i] = rate_of(runners[i], queries[i::len(runners)], batch_size, seconds)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(runners))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(rates)


def engine_rows(queries: list[str], seconds: float, repeats: int) -> list[dict[str, Any]]:
    """Queries/s per engine and column, the median of `repeats` rounds; each round times every
    engine in turn, so a slow spell of the shared machine hits all engines alike."""
    report = json.loads((MODEL_DIR / "prepare.json").read_text())
    rows = [{"engine": "sentence-transformers fp32 (PyTorch)", "parity": "reference",
             "runners": st_engines()}]
    for variant in report["variants"]:
        if not variant.get("file"):
            continue
        parity = variant["parity"]
        label = f"ONNX Runtime {variant['name']}"
        if variant["name"] == report["chosen"]:
            label += " (served)"
        rows.append({
            "engine": label,
            "parity": f"mean {parity['mean']:.4f}, min {parity['min']:.4f}",
            "runners": {t: [engine(MODEL_DIR / variant["file"], MODEL_DIR / "tokenizer.json",
                                   threads=t) for _ in range(replicas_on(t))]
                        for t in THREADS}})
    samples: dict[tuple[int, str], list[float]] = {}
    # sentence-transformers tokenizes on the calling thread too, as queryserve's engines do
    # (optimize/candidates.py `encode`): the tokenizers' thread pool would contend for the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        for row in rows:
            for batch_size, threads, replicas in ENGINE_COLUMNS.values():
                replicas_rate(row["runners"][threads][:replicas], queries[:batch_size * 8],
                              batch_size, 0.2)
        for round_ in range(repeats):
            log(f"  round {round_ + 1}/{repeats}")
            for column, (batch_size, threads, replicas) in ENGINE_COLUMNS.items():
                for i, row in enumerate(rows):
                    rate = replicas_rate(row["runners"][threads][:replicas], queries,
                                         batch_size, seconds)
                    samples.setdefault((i, column), []).append(rate)
    finally:
        del os.environ["TOKENIZERS_PARALLELISM"]
    for i, row in enumerate(rows):
        del row["runners"]
        for column in ENGINE_COLUMNS:
            row[column] = statistics.median(samples[(i, column)])
            row[f"{column}_rounds"] = samples[(i, column)]
        log(f"  {row['engine']}: " + ", ".join(f"{c} {row[c]:.0f}/s" for c in ENGINE_COLUMNS))
    return rows


def served_batches() -> dict[str, Any]:
    """The served `embed` over HTTP with requests of several queries: what the server does with
    a batch (the batcher cuts it by length where padding would cost more than another batch,
    `batch_overhead_tokens`, and spreads the pieces over the instances), with HTTP, JSON and
    the load generator on the same two cores."""
    repository = one_model_repository("embed", OUT / "repository-embed")
    with serving(repository, os.cpu_count() or 2, os.cpu_count() or 2,
                 OUT / "server-batches.log") as (url, _):
        return {str(n): bench(url, "--items-per-request", str(n), "--phase", "4:10",
                              "--warmup", "1", name=f"batch-{n}")
                for n in SERVED_BATCH_SIZES}


def render(engines: dict[str, Any], seconds: float) -> list[str]:
    rows, served = engines["rows"], engines["served"]
    lines = [
        "## 1. In-process engine: all-MiniLM-L6-v2, real MASSIVE queries",
        "",
        f"Queries/s (tokenization included), the median of rounds of >= {seconds:g} s, each round",
        "timing every engine and column in turn, over the",
        "first 512 MASSIVE en-US test utterances, in file order, each batch padded to its",
        "longest query. Threads: one intra-op thread (what each of the server's two instances",
        "gets); two; or \"2 x 1\": two replicas of the engine on one thread each, side by side",
        "in two Python threads that share the queries out, which is how the server uses the",
        "two cores. Parity: cosine to sentence-transformers over",
        "the same 512 queries at batch 1, 32 and 64 (from `model_repository/embed/prepare.json`;",
        "the gate is mean >= 0.9999 for fp32, mean >= 0.99 and min >= 0.97 for reduced",
        "precision). Each engine runs with its own thread defaults: PyTorch's, and ONNX",
        "Runtime's threads spinning between operators (the server turns spinning off, section",
        "3; `open_session` in src/queryserve/optimize/candidates.py). Both tokenize on the calling",
        "thread (`TOKENIZERS_PARALLELISM=false` for sentence-transformers).",
        "",
        "| engine | parity | batch 1, 1 thread | batch 1, 2 threads | batch 1, 2 x 1 "
        "| batch 8, 2 threads | batch 32, 2 threads | batch 32, 2 x 1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = rows[0]
    for row in rows:
        cells = [f"{row[k]:,.0f} ({row[k] / base[k]:.1f}x)" for k in ENGINE_COLUMNS]
        lines.append(f"| {row['engine']} | {row['parity']} | " + " | ".join(cells) + " |")
    ours = next(r for r in rows if r["engine"].endswith("(served)"))

    def best(row: dict[str, Any], batch: int) -> float:
        return max(row[k] for k, (size, _, _) in ENGINE_COLUMNS.items()
                   if size == batch)

    best_lines = [f"at batch {n}, sentence-transformers {best(base, n):,.0f} and the served "
                  f"int8 {best(ours, n):,.0f} queries/s ({best(ours, n) / best(base, n):.1f}x)"
                  for n in (1, 32)]
    served_rows = []
    for n, results in served.items():
        step = results["steps"][0]
        ratio = step["inferences_per_s"] / base[f"bs{n}"] if f"bs{n}" in base else None
        served_rows.append(f"| {n} | {step['inferences_per_s']:,.0f} | "
                           + (f"{ratio:.1f}x" if ratio else "n/a")
                           + f" | {step['errors']} | `{results['command_shown']}` |")
    lines += [
        "",
        "Each engine at its best way of running on this machine (the best of its columns): "
        + "; ".join(best_lines) + ".",
        "",
        "The same model served (`queryserve serve`, the shipped `embed` config: two instances",
        "of one thread, `max_batch_tokens` 256, `batch_overhead_tokens` 4), over HTTP with",
        "requests of several queries, 4 clients in a closed loop for 10 s; the load generator",
        "shares the two cores. The batcher sorts each request's queries by length, cuts them",
        "where padding would cost more than another batch and runs the pieces on both",
        "instances, so little compute goes to padding. The ratio is against",
        "sentence-transformers in process (no HTTP) at the same batch size, from the table above.",
        "",
        "| queries per request | queries/s | vs sentence-transformers | errors | command |",
        "|---:|---:|---:|---:|---|",
        *served_rows,
    ]
    return lines
