"""`queryserve batch duplicates`: find the duplicate products within one table or across two.

The job never scores all n x m pairs. It runs in stages, each kept on disk in a work folder
beside the output (`OUTPUT.parts/`), so that a rerun after a crash or a kill resumes where the
last one stopped, without lost or duplicated rows:

1. embed: each product is encoded once by the bi-encoder (`duplicates-bi`, `blocking`,
   `embeddings-N.npy`);
2. block: candidate pairs are each product's `block_k` nearest neighbours in the other table
   (both ways; exact inner product with faiss), plus the pairs that share a rare model number
   (`candidates.npy`, sorted, so every run cuts the same parts);
3. score: the cross-encoder (`model`, the served `duplicates`), part by part
   (`part-NNNNN.parquet`, each written to a temporary file and renamed, so a part is whole or
   absent). Its candidates are only the pairs the bi-encoder's pair head gives at least
   `prefilter`: the head scores tens of thousands of pairs a second, the cross-encoder hundreds
   (on Walmart x Amazon the prefilter keeps 41 k of 225 k neighbour pairs, and 847 of their 851
   true matches). Given the bi-encoder as `model`, its head scores every neighbour pair
   instead;
4. join: the parts, in order, into OUTPUT (again written whole, then renamed); the work folder
   is removed. With `one_to_one` (two tables), a pair stays a duplicate only if each product
   is the other's likeliest match: two shops list a product once each, so a product's second
   match is a variant (another colour, a kit) far more often than a true duplicate.

`job.json` records what the work folder was made from (the inputs' sizes and times, the model,
the settings); a rerun with anything different is refused instead of mixing two jobs' rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress

from queryserve.duplicates.job import Job, blocking_probabilities, score_part
from queryserve.duplicates.products import DuplicatesError, column_name
from queryserve.duplicates.tables import WRITES, Products, read_pairs, read_products, write_pairs
from queryserve.pipelines.pairs.features import model_codes
from queryserve.pipelines.pairs.head import FILE as HEAD
from queryserve.pipelines.pairs.head import PairHead
from queryserve.progress import progress_bar
from queryserve.types import Array

ENGINES = ("local", "ray")
MAX_CODE_BLOCK = 20  # a model number shared by more products than this is not a model number
COLUMNS = ("left_id", "right_id", "probability", "duplicate")


@dataclass(frozen=True)
class BatchOptions:
    model: Path = Path("model_repository/duplicates")  # scores the candidates
    blocking: Path = Path("model_repository/duplicates-bi")  # a bi-encoder: blocks for `model`
    block_k: int = 10
    prefilter: float = 0.01  # a cross-encoder's candidates: the blocking model's probability
    threshold: float | None = None  # the `duplicate` decision; None: the model's threshold
    min_probability: float | None = None  # rows kept in the output; None: the threshold
    part_size: int = 2_000  # seconds of the cross-encoder on two cores; the head: a blink
    max_parts: int | None = None  # score at most this many parts in this run, then stop
    one_to_one: bool = False  # across two tables: a product is the duplicate of one at most
    # Columns left out of each product's text: those the model never read in training (a
    # description, where its training records had none) mislead it more than they inform.
    ignore_columns: tuple[str, ...] = ()
    engine: str = "local"
    ray_address: str | None = None
    progress: bool = True


def _save_array(path: Path, array: Array) -> None:
    temporary = path.with_name(f".{path.stem}.tmp.npy")
    np.save(temporary, array)
    os.replace(temporary, path)


def _save_json(path: Path, value: object) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value))
    os.replace(temporary, path)


def _fingerprint(inputs: Sequence[Path], options: BatchOptions) -> dict[str, object]:
    from queryserve.pipelines.search.index import encoder_fingerprint

    return {"inputs": [{"path": str(p.resolve()), "bytes": p.stat().st_size,
                        "modified_ns": p.stat().st_mtime_ns} for p in inputs],
            "model": encoder_fingerprint(options.model),
            "blocking": encoder_fingerprint(options.blocking),
            "head": hashlib.sha256((options.blocking / HEAD).read_bytes()).hexdigest()[:16],
            "block_k": options.block_k, "prefilter": options.prefilter,
            "part_size": options.part_size,
            "threshold": options.threshold, "min_probability": options.min_probability,
            "ignore_columns": sorted(column_name(c) for c in options.ignore_columns)}


def block(vectors: Sequence[Array], texts: Sequence[Sequence[str]], k: int) -> Array:
    """Candidate pairs [m, 2] (row in table 0, row in the other table; for one table, i < j),
    sorted: nearest neighbours both ways, and pairs sharing a rare model number."""
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its INFO lines are noise
    import faiss

    same = len(vectors) == 1
    left, right = vectors[0], vectors[-1]
    pairs: set[tuple[int, int]] = set()

    def add(i: int, j: int) -> None:
        """Within one table a pair is (lower, higher) and never a product with itself."""
        if not same:
            pairs.add((i, j))
        elif i != j:
            pairs.add((min(i, j), max(i, j)))

    def neighbours(queries: Array, base: Array) -> Array:
        index = faiss.IndexFlatIP(base.shape[1])
        index.add(base)
        _, found = index.search(queries, min(k + same, base.shape[0]))
        return found

    for i, row in enumerate(neighbours(left, right)):
        for j in row[row >= 0]:
            add(i, int(j))
    if not same:
        for j, row in enumerate(neighbours(right, left)):
            for i in row[row >= 0]:
                add(int(i), j)
    codes: dict[str, list[int]] = defaultdict(list)
    for j, text in enumerate(texts[-1]):
        for code in model_codes(text.lower()):
            codes[code].append(j)
    for i, text in enumerate(texts[0]):
        for code in model_codes(text.lower()):
            rows = codes.get(code, [])
            if len(rows) <= MAX_CODE_BLOCK:
                for j in rows:
                    add(i, j)
    return np.asarray(sorted(pairs), dtype=np.int32).reshape(-1, 2)


def scoring_model(model: Path) -> tuple[bool, float]:
    """Whether the scoring model is a cross-encoder, and its decision threshold."""
    from queryserve.config import load_model_config

    if not (model / "model.yaml").is_file():
        raise DuplicatesError(f"{_where(model)} is not a prepared duplicates model (no "
                              "model.yaml); run `queryserve prepare` in the checkout, or pass "
                              "--model")
    config = load_model_config(model / "model.yaml")
    if config.parameter("encoder", "bi") == "cross":
        return True, config.parameter("threshold", 0.5)
    if not (model / HEAD).is_file():
        raise DuplicatesError(f"{model} is neither a cross-encoder (`encoder: cross`) nor a "
                              "bi-encoder with its head.npz; run `queryserve prepare`")
    return False, PairHead.load(model).threshold


def _where(folder: Path) -> str:
    """A folder as a message names it: a relative one with where it was looked for (the
    defaults are relative, and a nightly job started in another folder was told to prepare
    models that were prepared)."""
    return str(folder) if folder.is_absolute() else f"{folder} (in {Path.cwd()})"


def one_to_one(pairs: dict[str, list[Any]]) -> list[bool]:
    """The `duplicate` column with each product kept in one duplicate pair at most: the pair
    that is both products' likeliest (the first such row on a tie)."""
    rows = list(zip(pairs["left_id"], pairs["right_id"], pairs["probability"],
                    pairs["duplicate"], strict=True))
    best_left: dict[Any, int] = {}
    best_right: dict[Any, int] = {}
    for i, (left, right, probability, duplicate) in enumerate(rows):
        if duplicate:
            if left not in best_left or probability > rows[best_left[left]][2]:
                best_left[left] = i
            if right not in best_right or probability > rows[best_right[right]][2]:
                best_right[right] = i
    return [bool(d) and best_left[a] == i and best_right[b] == i
            for i, (a, b, _, d) in enumerate(rows)]


def _to_stderr(line: str) -> None:
    """What the job says as it goes: stdout is its summary, for a script to read."""
    print(line, file=sys.stderr, flush=True)


def run_batch(inputs: Sequence[Path], output: Path, options: BatchOptions = BatchOptions(),
              log: Callable[[str], None] = _to_stderr) -> dict[str, Any]:
    """Run (or resume) the job; returns its summary. Raises DuplicatesError on bad input."""
    if not 1 <= len(inputs) <= 2:
        raise DuplicatesError("give one product table (duplicates within it) or two "
                              "(duplicates across them)")
    if output.suffix.lower() not in WRITES:
        raise DuplicatesError(f"{output}: the output must be {' or '.join(WRITES)}")
    if options.engine not in ENGINES:
        raise DuplicatesError(f"engine {options.engine!r} is not one of {', '.join(ENGINES)}")
    if options.one_to_one and len(inputs) != 2:
        raise DuplicatesError("--one-to-one matches across two tables; give two inputs")
    if options.block_k < 1 or options.part_size < 1:
        raise DuplicatesError("--block-k and --part-size must be positive")
    if options.max_parts is not None and options.max_parts < 0:
        raise DuplicatesError(f"--max-parts must be 0 or more, got {options.max_parts}")
    for name, value in (("--threshold", options.threshold),
                        ("--min-probability", options.min_probability),
                        ("--prefilter", options.prefilter)):
        if value is not None and not 0 <= value <= 1:
            raise DuplicatesError(f"{name} must be a probability from 0 to 1, got {value}")
    work = output.with_name(output.name + ".parts")
    done = output.with_name(output.name + ".parts.done")
    if done.exists():  # a finished job's work folder, its removal cut short
        shutil.rmtree(done)
    if output.exists() and not work.exists():
        raise DuplicatesError(f"{output} already exists; remove it or choose another output")
    # Bad tables are refused before any work, and before the models: what the user typed first.
    tables = [read_products(p, options.ignore_columns) for p in inputs]
    columns = frozenset().union(*(products.columns for products in tables))
    for name in options.ignore_columns:  # misspelt, it left the column in, without a word
        if column_name(name) not in columns:
            raise DuplicatesError(f"--ignore-column {name!r}: no input has that column (they "
                                  f"have {', '.join(sorted(columns))})")
    for products in tables:
        if left_out := products.without_text:
            log(f"{products.path}: {len(left_out):,} row(s) with no title or other text left "
                f"out (ids {', '.join(left_out[:5])}{', ...' if len(left_out) > 5 else ''})")
    cross, model_threshold = scoring_model(options.model)
    if not cross:  # a bi-encoder blocks for itself and scores every neighbour pair (cheaply)
        options = replace(options, blocking=options.model, prefilter=0.0)
    if not (options.blocking / HEAD).is_file() or not (options.blocking / "model.yaml").is_file():
        raise DuplicatesError(f"{_where(options.blocking)} is not a prepared blocking model "
                              "(model.yaml and head.npz); run `queryserve prepare` in the "
                              "checkout, or pass --blocking")
    threshold = model_threshold if options.threshold is None else options.threshold
    minimum = threshold if options.min_probability is None else options.min_probability
    job = Job(work, options.model, options.blocking, cross, len(inputs), options.part_size,
              threshold, minimum)
    fingerprint = _fingerprint(inputs, options)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    work.mkdir(parents=True, exist_ok=True)
    recorded = work / "job.json"
    if recorded.is_file() and json.loads(recorded.read_text()) != fingerprint:
        raise DuplicatesError(f"{work} holds the parts of a different job (other inputs, model "
                              "or settings); remove it to start again, or rerun the same job")
    _save_json(recorded, fingerprint)
    resumed = any(work.glob("part-*.parquet")) or any(work.glob("embeddings-*.npy"))
    with progress_bar(options.progress) as display:
        t = time.perf_counter()
        vectors = [_embed(job, n, products, display) for n, products in enumerate(tables)]
        timings["embed_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if not job.candidates.is_file():
            task = display.add_task("blocking", total=None, status="")
            candidates = block(vectors, [p.texts for p in tables], options.block_k)
            _save_json(work / "blocked.json", {"neighbour_pairs": len(candidates)})
            if cross:  # the cross-encoder scores only what the bi-encoder finds likely
                candidates = candidates[blocking_probabilities(job, candidates)
                                        >= options.prefilter]
            _save_array(job.candidates, candidates)  # last: it means "blocked"
            display.update(task, total=1, completed=1)
        timings["block_s"] = time.perf_counter() - t
        count = int(np.load(job.candidates, mmap_mode="r").shape[0])
        blocked = json.loads((work / "blocked.json").read_text())["neighbour_pairs"]
        parts = -(-count // options.part_size)
        todo = [n for n in range(parts) if not job.part(n).is_file()]
        if options.max_parts is not None:
            todo = todo[:options.max_parts]
        t = time.perf_counter()
        scored = _score(job, todo, parts, options, display)
        timings["score_s"] = time.perf_counter() - t
    summary: dict[str, Any] = {
        "products": [len(p.ids) for p in tables],
        "left_out_without_text": [len(p.without_text) for p in tables],
        "neighbour_pairs": blocked,
        "candidate_pairs": count, "parts": parts,
        "parts_scored_now": len(todo), "resumed": resumed,
        "pairs_per_second": round(scored / timings["score_s"], 1) if scored else None}
    if any(not job.part(n).is_file() for n in range(parts)):
        log(f"stopped after {len(todo)} part(s); run the same command again to go on")
        return {**summary, "complete": False, **_rounded(timings)}
    t = time.perf_counter()
    joined: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for n in range(parts):
        for column, values in read_pairs(job.part(n)).items():
            joined[column].extend(values)
    if options.one_to_one:
        joined["duplicate"] = one_to_one(joined)
        if options.min_probability is None:  # the duplicates only, as without --one-to-one
            joined = {c: [v for v, d in zip(values, joined["duplicate"], strict=True) if d]
                      for c, values in joined.items()}
    write_pairs(output, joined)
    # Renamed first: removed in place and cut short, it held the output's parts without
    # blocked.json, and every rerun failed reading it.
    os.replace(work, done)
    shutil.rmtree(done)
    timings["join_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - started
    duplicates = sum(bool(d) for d in joined["duplicate"])
    log(f"{output}: {len(joined['left_id']):,} pairs with probability >= {minimum:.2f} "
        f"({duplicates:,} duplicates at {threshold:.2f}) from {count:,} candidates")
    return {**summary, "complete": True, "rows": len(joined["left_id"]),
            "duplicates": duplicates, **_rounded(timings)}


def _rounded(timings: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in timings.items()}


def _embed(job: Job, table: int, products: Products, display: Progress) -> Array:
    from queryserve.local import embed

    path = job.embeddings(table)
    if not path.is_file():
        task = display.add_task(f"embedding {products.path.name}", total=len(products.texts),
                                status="")
        vectors = embed(job.blocking, products.texts,
                        on_rows=lambda n: display.advance(task, n))
        _save_json(job.work / f"texts-{table}.json", products.texts)
        _save_json(job.work / f"ids-{table}.json", products.ids)
        _save_array(path, vectors)  # last: its presence means the table is done
    return np.load(path)  # type: ignore[no-any-return]


def _score(job: Job, todo: list[int], parts: int, options: BatchOptions,
           display: Progress) -> int:
    task = display.add_task("scoring pairs", total=parts, completed=parts - len(todo),
                            status=f"{options.engine} engine")
    if options.engine == "ray":
        from queryserve.duplicates.ray_engine import score_parts  # Ray loads only when asked

        return score_parts(job, todo, options.ray_address,
                           lambda: display.advance(task))
    scored = 0
    threads = len(os.sched_getaffinity(0))
    for number in todo:
        scored += score_part(job, number, threads)
        display.advance(task)
    return scored
