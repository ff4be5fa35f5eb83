"""Section 6, `queryserve optimize` on all-MiniLM-L6-v2, fp32 / int8 / fp16 side by side,
before (PyTorch) and after, plus PyTorch bf16 (the one bf16 engine that runs on this CPU) with
its parity."""

from __future__ import annotations

import shutil
import statistics
import time
from typing import Any

from queryserve.optimize.candidates import TIMING_THREADS
from queryserve.optimize.source import minilm_folder
from sections.common import OUT, load_queries, run_optimize


def measure(seconds: float) -> dict[str, Any]:
    out = OUT / "optimize" / "minilm"
    shutil.rmtree(out, ignore_errors=True)
    report = run_optimize(minilm_folder(), out, "--task", "embed", "--precision",
                          "fp32,int8,fp16", "--timing-seconds", str(seconds))
    report["bf16"] = torch_bf16(load_queries(512), seconds)
    return report


def torch_bf16(queries: list[str], seconds: float) -> dict[str, Any]:
    """all-MiniLM-L6-v2 under torch.autocast(bfloat16) on the threads optimize times each
    batch size with: what bf16 gives on this CPU (avx512_bf16), since ONNX Runtime's CPU
    provider has no bf16 MatMul. Parity is the cosine to sentence-transformers fp32 over the
    same queries at batch 32."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(2)
    model = SentenceTransformer(str(minilm_folder()), device="cpu")
    reference = model.encode(queries, batch_size=32, normalize_embeddings=True)

    def encode(batch: list[str]) -> Any:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model.encode(batch, batch_size=len(batch), normalize_embeddings=True,
                                convert_to_numpy=False, convert_to_tensor=True)

    vectors = torch.cat([encode(queries[i:i + 32]) for i in range(0, len(queries), 32)])
    cosines = (vectors.float().numpy() * reference).sum(1)
    rates = {}
    for batch_size, threads in TIMING_THREADS.items():
        torch.set_num_threads(threads)
        batches = [queries[i:i + batch_size] for i in range(0, len(queries), batch_size)]
        encode(batches[0])
        samples = []
        for _ in range(3):
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for batch in batches:
                    encode(batch)
                done += len(queries)
            samples.append(done / (time.perf_counter() - start))
        rates[f"bs{batch_size}"] = statistics.median(samples)
    return {"mean": float(np.mean(cosines)), "min": float(np.min(cosines)), **rates}


def render(report: dict[str, Any]) -> list[str]:
    before, after = report["before"], report["after"]
    lines = [
        "## 6. `queryserve optimize` on all-MiniLM-L6-v2 (fp32, int8, fp16, bf16)", "",
        "`queryserve optimize $(minilm) --task embed --precision fp32,int8,fp16 --out "
        "OUT/optimize/minilm`: every variant gated against sentence-transformers on 512 MASSIVE",
        "test queries (at batch 1, 32 and 64), then timed with the PyTorch original in rounds",
        "that interleave them all (median queries/s, tokenization included, the same 512",
        "queries, ONNX Runtime's threads spinning as by its default). Batch 1 runs on one",
        "intra-op thread, as each of the server's instances runs it (two spinning threads swing",
        "between two speeds on this VM, section 1), batch 32 on two; PyTorch on the same",
        "threads. fp16 is for GPUs; it",
        "runs on this CPU only to be gated. ONNX Runtime's CPU provider has no bfloat16 MatMul",
        "(`--precision bf16` says so), so the bf16 row is sentence-transformers under",
        "`torch.autocast(bfloat16)`, parity at batch 32.", "",
        "| variant | precision | parity (cosine mean / min) | batch 1 | batch 32 |",
        "|---|---|---|---:|---:|",
        f"| PyTorch fp32 (the original, `before`) | fp32 | reference | "
        f"{1000 / before['batch_1_ms']:.0f} | {before['batch_32_per_s']:.0f} |",
    ]
    bf16 = report["bf16"]
    lines.append(f"| PyTorch bf16 (autocast) | bf16 | {bf16['mean']:.4f} / {bf16['min']:.4f} | "
                 f"{bf16['bs1']:.0f} | {bf16['bs32']:.0f} |")
    for variant in report["variants"]:
        parity, speed = variant["parity"], variant["queries_per_second"]
        if parity is None:
            lines.append(f"| {variant['name']} | {variant['precision']} | not built | | |")
            continue
        name = variant["name"] + (" **(chosen)**" if variant["name"] == report["chosen"] else "")
        lines.append(f"| ONNX {name} | {variant['precision']} | {parity['mean']:.4f} / "
                     f"{parity['min']:.4f} | {speed.get('batch_1', 0):.0f} | "
                     f"{speed.get('batch_32', 0):.0f} |")
    lines += ["", f"Chosen: {report['reason']}.", "",
              f"Before/after (the report's own figures): {before['size_mb']:.1f} MB -> "
              f"{after['size_mb']:.1f} MB; batch 1 {before['batch_1_ms']:.2f} -> "
              f"{after['batch_1_ms']:.2f} ms/query "
              f"({before['batch_1_ms'] / after['batch_1_ms']:.1f}x); batch 32 "
              f"{before['batch_32_per_s']:.0f} -> {after['batch_32_per_s']:.0f} queries/s "
              f"({after['batch_32_per_s'] / before['batch_32_per_s']:.1f}x). Issue 4's targets "
              "against sentence-transformers fp32 are 10x at batch 1 and 6x at batch 32; section",
              "1 measures them against sentence-transformers itself."]
    return lines
