"""The served int8 MiniLM with and without SkipLayerNormalization, timed side by side.

`queryserve prepare` leaves each residual add as Add + LayerNormalization and CPU sessions do
not fuse them (`CPU_DISABLED_OPTIMIZERS` in src/queryserve/backends/onnxruntime.py). This
script rebuilds the graph as it was before, with ONNX Runtime's default BERT fusions
(SkipLayerNormalization included) and the same SmoothQuant int8 recipe on the same calibration
text, and times it against the served `model.onnx`, interleaved in rounds, tokenization included,
on the 512 MASSIVE test queries: one thread without spinning (a server instance) and two
threads spinning (section 1's engine table).

    .venv/bin/python benchmarks/skip_layer_norm.py [--seconds 1.5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from queryserve.optimize import candidates  # noqa: E402
from queryserve.optimize.recipes import (  # noqa: E402
    CALIBRATION_BATCH,
    BuildInputs,
    quantize_int8_smoothed,
)
from queryserve.prepare import CALIBRATION_TEXTS, PARITY_QUERIES, read_utterances  # noqa: E402

MODEL = ROOT / "model_repository" / "embed"
DATA = ROOT / "data" / "massive-en"


def fused_with_skip_layer_norm(fp32: Path, out: Path) -> Path:
    """The int8 graph as prepare built it before: default fusions, then SmoothQuant int8."""
    from onnxruntime.transformers import optimizer

    fused = out.with_name("fused.onnx")
    optimizer.optimize_model(str(fp32), model_type="bert", num_heads=12, hidden_size=384,
                             opt_level=0, use_gpu=False).save_model_to_file(str(fused))
    tokenizer = candidates.load_tokenizer(MODEL / "tokenizer.json")
    texts = read_utterances(DATA / "train.jsonl", CALIBRATION_TEXTS)
    feeds = candidates.batches(tokenizer, texts, CALIBRATION_BATCH,  # as optimize_encoder does
                               ("input_ids", "attention_mask", "token_type_ids"))
    quantize_int8_smoothed(fused, out, BuildInputs(feeds))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    queries = read_utterances(DATA / "test.jsonl", PARITY_QUERIES)
    tokenizer = candidates.load_tokenizer(MODEL / "tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        before = fused_with_skip_layer_norm(MODEL / "variants" / "fp32.onnx",
                                            Path(tmp) / "before.onnx")
        print("| threads | batch | with SkipLayerNormalization (q/s) | served now (q/s) | ratio |")
        print("|---|---:|---:|---:|---:|")
        for threads, spinning in ((1, False), (2, True)):
            # optimize's own timing sessions for both: the old graph carries its
            # SkipLayerNormalization nodes in the file, so CPU_DISABLED_OPTIMIZERS cannot undo them.
            sessions = [candidates.open_session(path, threads, spinning)
                        for path in (before, MODEL / "model.onnx")]
            for batch in (1, 32):
                rates: list[list[float]] = [[], []]
                for _ in range(args.rounds):
                    for i, s in enumerate(sessions):
                        rates[i].append(candidates.measure(s, tokenizer, queries, batch,
                                                         args.seconds))
                old, new = (statistics.median(r) for r in rates)
                label = f"{threads}{', spinning' if spinning else ''}"
                print(f"| {label} | {batch} | {old:,.0f} | {new:,.0f} | {new / old:.2f}x |")


if __name__ == "__main__":
    main()
