"""Section 8, the spelling correctors: training examples/s (fp32 at batch 32 against bf16 and
a large batch), `queryserve eval spell` against SymSpell, and the served `spell` (noisy
channel) and `spell-seq2seq` models over HTTP (p50 / p99 at 100 req/s, max rate at p99 <= 25
ms)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from typing import Any

from queryserve.bench.server_process import peak_rss_mb, serving
from sections.common import OUT, QUERYSERVE, ROOT, _ms, _rate, bench, log, one_model_repository
from sections.seq2seq import spell_parity_file

SPELL_MODELS = ("spell", "spell-seq2seq")  # the noisy channel, the trained seq2seq model
MIN_SCORES = ("0.5", "0.9")


def measure() -> dict[str, Any]:
    """Training speed, accuracy against SymSpell, and each served corrector, one after
    another."""
    log("  training speed: fp32 at batch 32 against bf16 autocast and batch 256")
    done = subprocess.run([QUERYSERVE, "train", "spell", str(OUT / "spell" / "unused"),
                           "--measure-speed"], capture_output=True, text=True, check=True)
    speed = json.loads(done.stdout)
    log("  queryserve eval spell model_repository/spell model_repository/spell-seq2seq")
    scores_file = OUT / "spell" / "eval.json"
    done = subprocess.run(
        [QUERYSERVE, "eval", "spell", *[str(ROOT / "model_repository" / m) for m in SPELL_MODELS],
         *[a for m in MIN_SCORES for a in ("--min-score", m)], "--json", str(scores_file)],
        capture_output=True, text=True, check=True)
    (OUT / "spell" / "eval.txt").write_text(done.stdout)
    queries = spell_parity_file()
    cores = os.cpu_count() or 2
    served: dict[str, Any] = {}
    for model in SPELL_MODELS:
        # The server holds this model alone, so no other model's instances take cores.
        repository = one_model_repository(model, OUT / "spell" / "repo")
        with serving(repository, cores, cores, OUT / "spell" / f"{model}.log") as (url, proc):
            common = ("--model", model, "--queries", str(queries))
            log(f"  served {model}: 100 req/s for 10 s")
            at_100 = bench(url, *common, "--rate", "100", "--duration", "10",
                           name=f"{model}-rate-100")
            log(f"  served {model}: max rate at p99 <= 25 ms")
            at_max = bench(url, *common, "--find-max", "--p99-ms", "25",
                           name=f"{model}-max-p99-25ms")
            served[model] = {"at_100": at_100, "max": at_max, "rss_mb": peak_rss_mb(proc.pid)}
    lines = queries.read_text().splitlines()
    return {"speed": speed, "scores": json.loads(scores_file.read_text()),
            "eval_table": done.stdout, "served": served,
            "mean_chars": statistics.mean(len(q) for q in lines),
            "mean_words": statistics.mean(len(q.split()) for q in lines)}


def render(report: dict[str, Any]) -> list[str]:
    speed = {(r["precision"], r["batch_size"]): r["examples_per_second"]
             for r in report["speed"]}
    base = speed[("fp32", 32)]
    scores = {s["corrector"]: s for s in report["scores"]}
    channel, seq2seq, sym = scores["channel"], scores["seq2seq"], scores["symspellpy"]
    served = report["served"]
    lines = [
        "## 8. The spelling correctors: training, accuracy against SymSpell, serving", "",
        "Two correctors, both learned here from the same data: `spell`, the noisy channel "
        "(`queryserve train spell-channel`: catalog word bigrams, web text's word frequencies "
        "for the words the catalog never saw, and the typo model learned from real "
        "misspellings, `src/queryserve/backends/noisy_channel/channel.py`), and `spell-seq2seq`, "
        "the "
        "character-level BART `queryserve train spell` trained for 40 minutes (section 7).", "",
        "Training speed of the seq2seq model, `queryserve train spell OUT --measure-speed`: the "
        "same model and example stream, 12 timed steps each after 2 untimed, PyTorch on 2 "
        "threads.", "",
        "| precision | batch | examples/s | vs fp32 at batch 32 |", "|---|---:|---:|---:|",
        *[f"| {r['precision']} | {r['batch_size']} | {r['examples_per_second']:.0f} | "
          f"{r['examples_per_second'] / base:.2f}x |" for r in report["speed"]], "",
        "Accuracy, `queryserve eval spell model_repository/spell model_repository/spell-seq2seq "
        + " ".join(f"--min-score {m}" for m in MIN_SCORES) + "` (held-out splits, see "
        "`src/queryserve/spell/evaluate.py`; symspellpy's `lookup_compound` over the same "
        "dictionary; a row `score "
        ">= x` is the corrector as an auto-correct that changes a query only when its score "
        "reaches x):", "",
        "| corrector | word accuracy (real misspellings) | query accuracy (misspelled) | "
        "by edits in the typo (1 / 2 / 3+) | false corrections (clean) | queries/s in eval |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {s['corrector']} | {s['word_accuracy']:.1%} | {s['query_accuracy']:.1%} | "
          + " / ".join(f"{v:.0%}" for v in s["query_accuracy_by_edits"].values())
          + f" | {s['false_corrections']:.1%} | {s['queries_per_second']:.0f} |"
          for s in report["scores"]], "",
        "Serving, `queryserve serve` with one model alone (its model.yaml as `queryserve "
        "prepare` wrote it) and `queryserve bench` on the same 2 cores, one held-out query per "
        f"request ({report['mean_chars']:.1f} characters, {report['mean_words']:.1f} words on "
        "average; half misspelled):", "",
        "| model | p50 at 100 req/s (ms) | p99 at 100 req/s (ms) | highest rate at p99 <= 25 "
        "ms (req/s) | server peak RSS (MB) |", "|---|---:|---:|---:|---:|",
        *[f"| `{m}` | {_ms(f['at_100']['steps'][0]['latency_ms']['p50'])} | "
          f"{_ms(f['at_100']['steps'][0]['latency_ms']['p99'])} | "
          f"{_rate(f['max']['search']['max_rate'])} | {f['rss_mb']:.0f} |"
          for m, f in served.items()], "",
        "Commands: " + "; ".join(f"`{f['at_100']['command_shown']}`, "
                                 f"`{f['max']['command_shown']}`" for f in served.values())
        + ".", "",
        f"Issue 5's targets: query accuracy >= 90% and false corrections <= 1%, both better "
        f"than SymSpell (channel {channel['query_accuracy']:.1%} / "
        f"{channel['false_corrections']:.1%}, seq2seq {seq2seq['query_accuracy']:.1%} / "
        f"{seq2seq['false_corrections']:.1%}, SymSpell {sym['query_accuracy']:.1%} / "
        f"{sym['false_corrections']:.1%}); word accuracy better than SymSpell's (channel "
        f"{channel['word_accuracy']:.1%}, seq2seq {seq2seq['word_accuracy']:.1%}, SymSpell "
        f"{sym['word_accuracy']:.1%}); p99 <= 15 ms at 100 req/s; >= 300 queries/s at p99 <= "
        f"25 ms; bf16 + large batch >= 3x fp32 at batch 32 (here "
        f"{speed[('bf16 autocast', 256)] / base:.2f}x at batch 256, "
        f"{speed[('bf16 autocast', 32)] / base:.2f}x at batch 32).",
    ]
    return lines
