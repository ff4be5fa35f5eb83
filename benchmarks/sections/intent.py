"""Section 9, query intent: the head on the frozen encoder against the fine-tuned encoder
(accuracy), and the served `intent` model (accuracy over HTTP, p50 / p99 at 100 req/s, max rate
at p99 <= 10 ms)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from queryserve.bench.server_process import peak_rss_mb, serving
from sections.common import (
    OUT,
    QUERIES,
    QUERYSERVE,
    ROOT,
    _ms,
    _rate,
    bench,
    log,
    one_model_repository,
)


def served_accuracy(url: str, texts: list[str], labels: list[str]) -> float:
    """Top-1 accuracy of the served `intent` model over HTTP, 64 queries per request."""
    import httpx

    right = 0
    for start in range(0, len(texts), 64):
        answer = httpx.post(f"{url}/v1/intent", json={"queries": texts[start:start + 64]},
                            timeout=60)
        answer.raise_for_status()
        right += sum(r["intents"][0]["intent"] == label for r, label in
                     zip(answer.json()["results"], labels[start:start + 64], strict=True))
    return right / len(texts)


def measure() -> dict[str, Any]:
    """The two training methods' accuracy, and the served int8 model over HTTP."""
    from queryserve.prepare import INTENT_MODEL

    head_out = OUT / "intent" / "head"
    shutil.rmtree(head_out, ignore_errors=True)
    log("  queryserve train intent OUT/intent/head --method head")
    subprocess.run([QUERYSERVE, "train", "intent", str(head_out), "--method", "head",
                    "--no-progress"], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in QUERIES.read_text().splitlines() if line]
    texts = [r["text"] for r in rows]
    queries = OUT / "intent" / "queries.txt"
    queries.write_text("\n".join(texts) + "\n")
    repository = one_model_repository("intent", OUT / "intent" / "repo")
    cores = os.cpu_count() or 2
    with serving(repository, cores, cores, OUT / "intent" / "server.log") as (url, proc):
        log("  served intent: accuracy on MASSIVE test over HTTP")
        accuracy = served_accuracy(url, texts, [r["label_text"] for r in rows])
        common = ("--model", "intent", "--queries", str(queries))
        log("  served intent: 100 req/s for 10 s")
        at_100 = bench(url, *common, "--rate", "100", "--duration", "10", name="intent-rate-100")
        log("  served intent: max rate at p99 <= 10 ms")
        at_max = bench(url, *common, "--find-max", "--p99-ms", "10", name="intent-max-p99-10ms")
        rss = peak_rss_mb(proc.pid)
    return {"finetune": json.loads((ROOT / INTENT_MODEL / "TRAINING.json").read_text()),
            "head": json.loads((head_out / "TRAINING.json").read_text()),
            "prepare": json.loads((ROOT / "model_repository" / "intent" / "prepare.json")
                                  .read_text()),
            "served_accuracy": accuracy, "test_queries": len(texts), "at_100": at_100,
            "max": at_max, "rss_mb": rss}


def render(report: dict[str, Any]) -> list[str]:
    finetune, head, prepare = report["finetune"], report["head"], report["prepare"]
    at_100 = report["at_100"]["steps"][0]["latency_ms"]
    chosen = next(v for v in prepare["variants"] if v["name"] == prepare["chosen"])
    return [
        "## 9. Query intent: MASSIVE en-US, 60 intents, on the MiniLM encoder", "",
        "Two methods on the same splits (train 11,514 / validation 2,033 / test 2,974 "
        "utterances; the validation split picks the epoch), `queryserve train intent`:", "",
        "| method | validation accuracy | test accuracy | training time on 2 cores |",
        "|---|---:|---:|---:|",
        f"| head: a linear softmax head on the frozen encoder's embeddings (`--method head`, "
        f"measured in this run) | {head['validation_accuracy']:.1%} | "
        f"{head['test_accuracy']:.1%} | {head['minutes']:.1f} min |",
        f"| finetune: the whole encoder with a classification head, {len(finetune['epochs'])} "
        f"epochs (`{finetune['command']}`, models/intent/TRAINING.json) | "
        f"{finetune['validation_accuracy']:.1%} | {finetune['test_accuracy']:.1%} | "
        f"{finetune['minutes']:.1f} min |", "",
        f"Served: `queryserve prepare` compiled the fine-tuned model with `queryserve optimize "
        f"--task classify` and chose **{prepare['chosen']}** (top-1 agreement with the "
        f"original {chosen['parity']['mean']:.2%} on 512 test utterances). Its accuracy over "
        f"HTTP (`/v1/intent`) on all {report['test_queries']:,} test utterances: "
        f"**{report['served_accuracy']:.1%}**.", "",
        "Latency, `queryserve serve` with the `intent` model alone (model.yaml as prepare "
        "wrote it) and `queryserve bench` on the same 2 cores, one MASSIVE test utterance per "
        "request (KServe v2 JSON):", "",
        f"- at 100 req/s for 10 s: p50 {_ms(at_100['p50'])}, p99 **{_ms(at_100['p99'])}** ms "
        f"(`{report['at_100']['command_shown']}`);",
        f"- highest rate with p99 <= 10 ms: **{_rate(report['max']['search']['max_rate'])} "
        f"req/s** (`{report['max']['command_shown']}`);",
        f"- server peak RSS {report['rss_mb']:.0f} MB.", "",
        "Issue 6's targets: accuracy >= 88% on MASSIVE en-US test; p99 <= 10 ms end to end at "
        ">= 800 queries/s with one query per request.",
    ]
