"""Why a second intra-op thread makes small models slower on this VM: waking a thread on the
other core is expensive here.

1. A Python thread ping-pong through two queues (each hop wakes the other thread), both
   threads free to run on either core, then both pinned to one core.
2. CTranslate2 on the committed spelling corrector (`model_repository/spell-seq2seq`), greedy,
   batch 1 over 64 MASSIVE utterances, with one and two intra-op threads, with libgomp's
   default wait policy and with `OMP_WAIT_POLICY=ACTIVE` (threads spin instead of sleeping);
   each in a fresh process (libgomp reads the variable once), with that process's context
   switches.

    .venv/bin/python benchmarks/thread_wakeup.py
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "model_repository" / "spell-seq2seq"


def ping_pong(hops: int = 5000, rounds: int = 3) -> float:
    """Median round trip in microseconds between this thread and an echo thread."""
    there: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        while (item := there.get()) is not None:
            back.put(item)

    thread = threading.Thread(target=echo)
    thread.start()
    trips = []
    for _ in range(rounds):
        started = time.perf_counter()
        for i in range(hops):
            there.put(i)
            back.get()
        trips.append((time.perf_counter() - started) / hops * 1e6)
    there.put(None)
    thread.join()
    return statistics.median(trips)


def ctranslate2_batch1(threads: int) -> dict[str, float]:
    """Runs in a child process: ms per query at batch 1, and context switches per query."""
    import ctranslate2
    import yaml
    from tokenizers import Tokenizer

    from queryserve.backends.ctranslate2 import generate
    from queryserve.pipelines.text2text import source_tokens
    from queryserve.prepare import read_utterances

    params = yaml.safe_load((MODEL / "model.yaml").read_text())["parameters"]
    translator = ctranslate2.Translator(str(MODEL / params["model_dir"]), device="cpu",
                                        compute_type="int8", inter_threads=1,
                                        intra_threads=threads)
    tokenizer = Tokenizer.from_file(str(MODEL / params["tokenizer_file"]))
    texts = read_utterances(ROOT / "data" / "massive-en" / "test.jsonl", 64)
    sources = source_tokens(tokenizer, texts)
    for source in sources[:8]:
        generate(translator, [source], 1, params["max_output_length"])
    switches = _context_switches()
    started = time.perf_counter()
    for source in sources:
        generate(translator, [source], 1, params["max_output_length"])
    seconds = time.perf_counter() - started
    return {"ms_per_query": seconds / len(sources) * 1e3,
            "context_switches_per_query": (_context_switches() - switches) / len(sources)}


def _context_switches() -> int:
    """This process's voluntary + involuntary context switches, all threads."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                total += int(line.split()[1])
    return total


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(ctranslate2_batch1(int(sys.argv[2]))))
        return 0
    cores = sorted(os.sched_getaffinity(0))
    print(f"thread round trip, free to use cores {cores}: {ping_pong():.1f} us")
    os.sched_setaffinity(0, {cores[0]})
    print(f"thread round trip, both threads on core {cores[0]}: {ping_pong():.1f} us")
    os.sched_setaffinity(0, set(cores))
    print("\nCTranslate2 int8, spell-seq2seq, batch 1 (ms per query, context switches per query)")
    for policy in (None, "ACTIVE"):
        for threads in (1, 2):
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            done = subprocess.run([sys.executable, __file__, "--child", str(threads)], env=env,
                                  capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.splitlines()[-1])
            print(f"  {threads} thread(s), OMP_WAIT_POLICY={policy or 'default'}: "
                  f"{result['ms_per_query']:.2f} ms, "
                  f"{result['context_switches_per_query']:.0f} switches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
