"""A candidate graph run as the server runs it: the server's tokenization and padding, an ONNX
Runtime session with the server's settings, its outputs against the original's (the gate's
parity, hard inputs included) and its speed (the timed runner).

`optimize/encoder.py` runs these over every variant it builds; benchmarks and tests call them
to time or check a graph that is not (yet) a served model folder. A served folder runs through
`queryserve.local.open_model` instead.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

from queryserve.backends.onnxruntime import CPU_DISABLED_OPTIMIZERS
from queryserve.errors import ExportError
from queryserve.optimize.gate import Decision, HardItem, Parity, bounds_met, compare, hard_items
from queryserve.optimize.plan import PARITY_BATCH_SIZES, Item, Runner, Speed, rate_of
from queryserve.optimize.recipes import Precision
from queryserve.pipelines.base import open_tokenizer
from queryserve.pipelines.text_embedding import pad_token_ids

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]
Feeds = dict[str, Ints]

MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)

THREADS = 2
TIMING_THREADS = {1: 1, 32: THREADS}
"""Intra-op threads each timed batch size runs on. A lone query runs on one, as each of the
server's one-thread instances runs it: on two threads spinning, ONNX Runtime swung between two
speeds from minute to minute on this VM (the int8 MiniLM at about 1,250 or 2,300 queries/s;
one thread held 1,780-1,850 in the same rounds, BENCHMARKS.md section 1). A batch runs on all
of THREADS. The PyTorch original is timed on the same threads."""


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


def open_session(model: Path | bytes, threads: int = THREADS,
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


def input_names(session: ort.InferenceSession) -> tuple[str, ...]:
    return tuple(i.name for i in session.get_inputs())


def check_contract(session: ort.InferenceSession, output: str, width: int) -> None:
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


def run_outputs(session: ort.InferenceSession, tokenizer: Tokenizer, items: Sequence[Item],
             batch_size: int) -> Floats:
    names = input_names(session)
    output = session.get_outputs()[0].name
    parts = [np.asarray(session.run([output], feed)[0], dtype=np.float32)
             for feed in batches(tokenizer, items, batch_size, names)]
    return np.concatenate(parts)


def embed(session: ort.InferenceSession, tokenizer: Tokenizer, queries: Sequence[str],
           batch_size: int) -> Floats:
    return run_outputs(session, tokenizer, queries, batch_size)


class Hard(NamedTuple):
    """The plan's hard inputs and what the original returns for them."""

    items: Mapping[str, Item]
    reference: Floats


def parity_of(session: ort.InferenceSession, tokenizer: Tokenizer, items: Sequence[Item],
            reference: Floats, precision: Precision, batch_sizes: Sequence[int], *,
            metric: str = "cosine", normalized: bool = True,
            decision: Decision | None = None, hard: Hard | None = None) -> Parity:
    output = session.get_outputs()[0].name
    check_contract(session, output, reference.shape[1])
    results = [compare(metric, run_outputs(session, tokenizer, items, b), reference, normalized,
                       decision) for b in batch_sizes]
    mean = min(r[0] for r in results)
    minimum = min(r[1] for r in results)
    error = max(r[2] for r in results)
    threshold = None if decision is None else decision.threshold
    draft = Parity(precision, metric, mean, minimum, error, tuple(batch_sizes), True, threshold,
                   decide_hard(session, tokenizer, hard, batch_sizes, decision))
    return replace(draft, passed=bounds_met(draft))


def decide_hard(session: ort.InferenceSession, tokenizer: Tokenizer, hard: Hard | None,
                batch_sizes: Sequence[int], decision: Decision | None) -> tuple[HardItem, ...]:
    """The hard inputs as the variant decides them at each batch size: alone at batch 1, all
    together at a larger size, as one request of them all is batched (int8's dynamic scales
    depend on the batch and its padding, so each is checked as it may be served)."""
    if hard is None:
        return ()
    items = list(hard.items.values())
    outputs = [run_outputs(session, tokenizer, items, b) for b in batch_sizes]
    return hard_items(list(hard.items), outputs, hard.reference, decision)


def parity(onnx_path: Path, tokenizer_path: Path, queries: Sequence[str], reference: Floats, *,
           precision: Precision = "fp32",
           batch_sizes: Sequence[int] = PARITY_BATCH_SIZES) -> Parity:
    """Cosine agreement of an embedding model with `reference`, worst case over batch sizes."""
    return parity_of(open_session(onnx_path), load_tokenizer(tokenizer_path), queries, reference,
                   precision, batch_sizes)


# -- timing ----------------------------------------------------------------------------------


def engine(onnx_path: Path, tokenizer_path: Path, *, threads: int = THREADS) -> Runner:
    """A model file as a timed engine: each call tokenizes, pads and runs one batch."""
    return batch_runner(open_session(onnx_path, threads=threads, spinning=True),
                   load_tokenizer(tokenizer_path))


def rates_side_by_side(onnx_path: Path, tokenizer_path: Path, texts: Sequence[str],
                       processes: int, seconds: float) -> list[float]:
    """Queries/s of each of `processes` spawned processes running the model side by side, one
    ONNX Runtime thread each, one text a call (tokenization included), all measuring at once:
    what the cores do in process, with no server (the ceiling served workers are judged by).
    The processes inherit this one's CPU affinity."""
    context = multiprocessing.get_context("spawn")
    start, rates = context.Barrier(processes), context.Queue()
    runs = [context.Process(target=_rate_in_process,
                            args=(onnx_path, tokenizer_path, list(texts), start, seconds, rates))
            for _ in range(processes)]
    for run in runs:
        run.start()
    each = [float(rates.get(timeout=300)) for _ in runs]
    for run in runs:
        run.join()
    return each


def _rate_in_process(onnx_path: Path, tokenizer_path: Path, texts: list[str], start: Any,
                     seconds: float, rates: Any) -> None:
    run = engine(onnx_path, tokenizer_path, threads=1)
    rate_of(run, texts[:64], 1, 0.5)  # warm-up
    start.wait()  # all processes measure at once
    rates.put(rate_of(run, texts, 1, seconds))


def batch_runner(session: ort.InferenceSession, tokenizer: Tokenizer) -> Runner:
    """One batch through the session as the server runs it: encode, pad, run."""
    names = input_names(session)
    output = [session.get_outputs()[0].name]

    def run(group: Sequence[Item]) -> object:
        return session.run(output, feeds(encode(tokenizer, group), names))

    return run


def measure(session: ort.InferenceSession, tokenizer: Tokenizer, queries: Sequence[Item],
             batch_size: int, seconds: float) -> float:
    return rate_of(batch_runner(session, tokenizer), queries, batch_size, seconds)


def onnx_speed(path: Path, speeds: Mapping[int, float]) -> Speed:
    started = time.perf_counter()
    open_session(path)
    load_s = time.perf_counter() - started
    return Speed.timed(path.stat().st_size / 1e6, load_s, speeds)
