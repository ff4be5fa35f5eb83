"""How the dynamic batcher cuts a queue of mixed-length queries, timed side by side.

The batcher sorts a window of queued queries by length and cuts it into batches. With
`batch_overhead_tokens` unset it makes as few batches as `max_batch_size` and
`max_batch_tokens` allow; with it set (the shipped `embed`: 4) it makes the batches of least
cost, each batch's padded tokens plus that overhead. This script measures both, and one padded
batch per window (section 1's engine table), on the served int8 MiniLM:

1. in process, one intra-op thread without spinning (a server instance): windows of k MASSIVE
   test queries, each queued in a real `DynamicBatcher` and cut until empty, every batch run;
   tokenization and cutting included; queries/s, the median of interleaved rounds;
2. served over HTTP (`queryserve serve`, the shipped `embed` config but for the overhead):
   requests of 32 queries, 4 clients in a closed loop (`queryserve bench --items-per-request
   32 --phase 4:10`), the load generator on the same cores; the servers take turns.

    .venv/bin/python benchmarks/batch_partition.py [--seconds 1.5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from queryserve.bench.server_process import build_repository, serving  # noqa: E402
from queryserve.config import DynamicBatching, load_model_config  # noqa: E402
from queryserve.optimize import candidates  # noqa: E402
from queryserve.optimize.plan import rate_of  # noqa: E402
from queryserve.prepare import read_utterances  # noqa: E402
from queryserve.scheduling.batcher import DynamicBatcher, QueuedItem  # noqa: E402

MODEL = ROOT / "model_repository" / "embed"
QUERIES = ROOT / "data" / "massive-en" / "test.jsonl"
WINDOWS = (2, 4, 8, 16, 32)
SHIPPED = load_model_config(MODEL / "model.yaml").dynamic_batching
OVERHEAD = SHIPPED.batch_overhead_tokens
FEWEST, LEAST_COST = "fewest batches (overhead unset)", f"least cost (overhead {OVERHEAD}, shipped)"
QUERYSERVE = str(Path(sys.executable).parent / "queryserve")


class Waiting:
    """A queued item's ticket that never completes: every item runs."""

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False


def rules() -> dict[str, DynamicBatching | None]:
    return {"one padded batch": None,
            FEWEST: replace(SHIPPED, batch_overhead_tokens=None),
            LEAST_COST: SHIPPED}


def runner(batching: DynamicBatching | None) -> Callable[[Sequence[str]], object]:
    """Each call queues one window of queries and runs every batch the rule cuts from it."""
    session = candidates.open_session(MODEL / "model.onnx", threads=1, spinning=False)
    tokenizer = candidates.load_tokenizer(MODEL / "tokenizer.json")
    names = candidates.input_names(session)
    output = [session.get_outputs()[0].name]

    def run(window: Sequence[str]) -> object:
        rows = candidates.encode(tokenizer, window)
        if batching is None:
            return session.run(output, candidates.feeds(rows, names))
        batcher: DynamicBatcher[tuple[list[int], list[int]]] = DynamicBatcher(batching, 64)
        batcher.add([QueuedItem(row, len(row[0]), 0.0, float("inf"), Waiting())
                     for row in rows])
        while len(batcher):
            batch = [item.payload for item in batcher.cut(0.0).batch]
            session.run(output, candidates.feeds(batch, names))
        return None

    return run


def in_process(queries: list[str], seconds: float, rounds: int) -> dict[str, dict[int, float]]:
    runners = {name: runner(batching) for name, batching in rules().items()}
    rng = random.Random(7)
    windows = {k: [q for _ in range(max(4, 128 // k)) for q in rng.sample(queries, k)]
               for k in WINDOWS}  # the same windows for every rule
    samples: dict[tuple[str, int], list[float]] = {}
    for run in runners.values():  # warm up
        rate_of(run, windows[8][:16], 8, 0.2)
    for round_ in range(rounds):
        for k in WINDOWS:
            for name, run in runners.items():
                samples.setdefault((name, k), []).append(
                    rate_of(run, windows[k], k, seconds))
        print(f"  in process, round {round_ + 1}/{rounds}", file=sys.stderr, flush=True)
    return {name: {k: statistics.median(samples[(name, k)]) for k in WINDOWS}
            for name in runners}


def repository(folder: Path, overhead: int | None) -> Path:
    """A one-model repository: the prepared `embed` files, the shipped config with `overhead`."""
    config = yaml.safe_load((MODEL / "model.yaml").read_text())
    config["dynamic_batching"]["batch_overhead_tokens"] = overhead
    return build_repository(folder, "embed", MODEL, config)


def served(rounds: int, out: Path) -> dict[str, list[float]]:
    cores = os.cpu_count() or 2
    variants = {FEWEST: None, LEAST_COST: OVERHEAD}
    repositories = {name: repository(out / f"repository-{i}", overhead)
                    for i, (name, overhead) in enumerate(variants.items())}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for i, (name, folder) in enumerate(repositories.items()):
            with serving(folder, cores, cores, out / f"server-{i}.log") as (url, _):
                result = out / f"bench-{i}-{round_}"
                subprocess.run([QUERYSERVE, "bench", url, "--items-per-request", "32",
                                "--phase", "4:10", "--warmup", "1", "--no-progress",
                                "--out", str(result)], check=True, capture_output=True)
                step = json.loads((result / "results.json").read_text())["steps"][0]
                rates[name].append(step["inferences_per_s"])
        print(f"  served, round {round_ + 1}/{rounds}", file=sys.stderr, flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per in-process round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    queries = read_utterances(QUERIES)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    table = in_process(queries, args.seconds, args.rounds)
    print("| rule | " + " | ".join(f"{k} queries" for k in WINDOWS) + " |")
    print("|---|" + "---:|" * len(WINDOWS))
    base = table["one padded batch"]
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:,.0f} ({row[k] / base[k]:.2f}x)"
                                          for k in WINDOWS) + " |")
    out = Path(tempfile.mkdtemp(prefix="batch-partition-"))
    try:
        rates = served(args.rounds, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("\n| served, requests of 32 queries | queries/s (median) | rounds |")
    print("|---|---:|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} | "
              + ", ".join(f"{v:,.0f}" for v in values) + " |")


if __name__ == "__main__":
    main()
