"""What an onnxruntime-gpu build that cannot start CUDA costs on the CPU, and what the backend's
fallback gets back.

Where CUDA's libraries or the device are missing, onnxruntime-gpu logs an error and runs a
session asked for [CUDA, CPU] on the CPU, with the graph fused as for CUDA
(SkipLayerNormalization). `backends/onnxruntime.py` then makes the session again for the CPU
(`CPU_DISABLED_OPTIMIZERS`). This times both, batch 1 on one thread without spinning (a server
instance), tokenization excluded, over the first 300 MASSIVE test queries, in alternating
rounds; it runs whichever onnxruntime PYTHONPATH finds first:

    pip install --no-deps --target /tmp/ort-gpu onnxruntime-gpu==1.31.1
    PYTHONPATH=/tmp/ort-gpu .venv/bin/python benchmarks/cuda_fallback.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "model_repository" / "embed"
QUERIES = ROOT / "data" / "massive-en" / "test.jsonl"


def session(as_fallback: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if as_fallback:
        return ort.InferenceSession(str(MODEL / "model.onnx"), options,
                                    providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    return ort.InferenceSession(str(MODEL / "model.onnx"), options,
                                providers=["CPUExecutionProvider"],
                                disabled_optimizers=["SkipLayerNormFusion"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ort.set_default_logger_severity(3)  # the expected CUDA error, once per session
    sessions = {"as the fallback left it (fused as for CUDA)": session(True),
                "made again for the CPU (the backend now)": session(False)}
    names = [i.name for i in next(iter(sessions.values())).get_inputs()]
    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    feeds = []
    for line in QUERIES.read_text().splitlines()[:300]:
        ids = np.array([tokenizer.encode(json.loads(line)["text"]).ids], dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                  "token_type_ids": np.zeros_like(ids)}
        feeds.append({name: inputs[name] for name in names})
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(args.rounds):
        for name, each in sessions.items():
            started = time.perf_counter()
            for feed in feeds:
                each.run(None, feed)
            times[name].append((time.perf_counter() - started) / len(feeds) * 1000)
    print(f"onnxruntime {ort.__version__}, providers available: {ort.get_available_providers()}")
    for name, each in sessions.items():
        print(f"{name}: {statistics.median(times[name]):.3f} ms a query (rounds "
              f"{', '.join(f'{t:.3f}' for t in times[name])}), running on {each.get_providers()}")


if __name__ == "__main__":
    main()
