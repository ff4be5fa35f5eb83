"""Section 8, the spelling correctors: training examples/s (fp32 at batch 32 against bf16 and
a large batch), `queryserve eval spell` against symspellpy on both sets (with each corrector's
accuracy at equal false corrections and the curve, `--curves`), and the served `spell-hybrid`,
`spell` (the noisy channel) and `spell-seq2seq` over HTTP (p50 / p99 at 100 req/s, max rate at
p99 <= 50 ms)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from typing import Any

from queryserve.bench.server_process import peak_rss_mb, serving
from sections.common import OUT, QUERYSERVE, ROOT, _ms, _rate, bench, log, one_model_repository
from sections.seq2seq import spell_parity_file

SPELL_MODELS = ("spell-hybrid", "spell", "spell-seq2seq")  # hybrid, noisy channel, seq2seq
MIN_SCORES = ("0.5", "0.7", "0.82", "0.9")
HYBRID_MIN_SCORE = 0.82  # its auto-correct threshold: 0.8% false corrections on development
P99_MS = 50  # issue 43's bar: >= 300 req/s at p99 <= 50 ms
FIGURE = ROOT / "benchmarks" / "figures" / "spell-curves.png"  # linked from BENCHMARKS.md


def measure() -> dict[str, Any]:
    """Training speed, accuracy against SymSpell, and each served corrector, one after
    another."""
    log("  training speed: fp32 at batch 32 against bf16 autocast and batch 256")
    done = subprocess.run([QUERYSERVE, "train", "spell", str(OUT / "spell" / "unused"),
                           "--measure-speed"], capture_output=True, text=True, check=True)
    speed = json.loads(done.stdout)
    log("  queryserve eval spell: the hybrid, the channel, the seq2seq, symspellpy")
    scores_file, curves = OUT / "spell" / "eval.json", OUT / "spell" / "curves.png"
    done = subprocess.run(
        [QUERYSERVE, "eval", "spell", *[str(ROOT / "model_repository" / m) for m in SPELL_MODELS],
         *[a for m in MIN_SCORES for a in ("--min-score", m)], "--json", str(scores_file),
         "--curves", str(curves)], capture_output=True, text=True, check=True)
    (OUT / "spell" / "eval.txt").write_text(done.stdout)
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(curves, FIGURE)
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
            log(f"  served {model}: max rate at p99 <= {P99_MS} ms")
            at_max = bench(url, *common, "--find-max", "--p99-ms", str(P99_MS),
                           name=f"{model}-max-p99-{P99_MS}ms")
            served[model] = {"at_100": at_100, "max": at_max, "rss_mb": peak_rss_mb(proc.pid)}
    lines = queries.read_text().splitlines()
    return {"speed": speed, "scores": json.loads(scores_file.read_text()),
            "curves": json.loads(curves.with_suffix(".json").read_text()),
            "eval_table": done.stdout, "served": served,
            "mean_chars": statistics.mean(len(q) for q in lines),
            "mean_words": statistics.mean(len(q.split()) for q in lines)}


def render(report: dict[str, Any]) -> list[str]:
    speed = {(r["precision"], r["batch_size"]): r["examples_per_second"]
             for r in report["speed"]}
    base = speed[("fp32", 32)]
    scores = {s["corrector"]: s for s in report["scores"]}
    served_name = f"hybrid, score >= {HYBRID_MIN_SCORE:g}"
    hybrid, channel, sym = scores[served_name], scores["channel, score >= 0.5"], \
        scores["symspellpy"]
    served = report["served"]

    def share(rate: dict[str, Any]) -> str:
        return f"{rate['share']:.1%} ({rate['low']:.1%}-{rate['high']:.1%})"

    lines = [
        "## 8. The spelling correctors: training, accuracy against symspellpy, serving", "",
        "Three correctors, all learned here from the same data: `spell-hybrid` (the noisy "
        "channel's 3 likeliest queries and the words as typed, scored by the seq2seq and chosen "
        "by a small network fitted on development queries, "
        "`src/queryserve/backends/noisy_channel/rerank.py`, `queryserve train spell-hybrid`); "
        "`spell`, the noisy channel (`queryserve train spell-channel`: catalog word bigrams, web "
        "text's word frequencies, the typo model learned from real misspellings); and "
        "`spell-seq2seq`, the character-level BART of `queryserve train spell` "
        "(`models/spell/TRAINING.json`).", "",
        "Training speed of the seq2seq model, `queryserve train spell OUT --measure-speed`: the "
        "same model and example stream, 12 timed steps each after 2 untimed, PyTorch on 2 "
        "threads.", "",
        "| precision | batch | examples/s | vs fp32 at batch 32 |", "|---|---:|---:|---:|",
        *[f"| {r['precision']} | {r['batch_size']} | {r['examples_per_second']:.0f} | "
          f"{r['examples_per_second'] / base:.2f}x |" for r in report["speed"]], "",
        "Accuracy, `queryserve eval spell model_repository/spell-hybrid model_repository/spell "
        "model_repository/spell-seq2seq " + " ".join(f"--min-score {m}" for m in MIN_SCORES)
        + "`: all held-out queries x 3 noise seeds on both sets (`src/queryserve/spell/"
        "evaluate.py`: \"hard\", typos from the project's own noise model; \"realistic\", "
        "keyboard typos from a generator no corrector uses and real misspellings placed in "
        "queries), each share with its 95% interval; symspellpy's `lookup_compound` over the "
        "same dictionary. A row `score >= x` is the corrector as an auto-correct that changes "
        "a query only when its score reaches x; the search pipeline's `min_score` (0.5) is the "
        f"channel's, {HYBRID_MIN_SCORE:g} the hybrid's:", "",
        "| corrector | hard set | realistic set | false corrections (clean) | word accuracy "
        "(real misspellings alone) | queries/s in eval |", "|---|---:|---:|---:|---:|---:|",
        *[f"| {s['corrector']} | {share(s['hard']['query_accuracy'])} | "
          f"{share(s['realistic']['query_accuracy'])} | {share(s['clean'])} | "
          f"{share(s['words'])} | {s['queries_per_second']:.0f} |" for s in report["scores"]],
        "",
        "The same answers at equal false corrections (`--curves`: each corrector's threshold "
        "swept from 0 to 1, the best accuracy at or under each rate, interpolated; - where it "
        "never gets that low), hard / realistic / words:", "",
        "| corrector | " + " | ".join(f"at {r:.1%}" for r in report["curves"]["rates"])
        + " |", "|---|" + "---|" * len(report["curves"]["rates"]),
        *[f"| {c['corrector']} | " + " | ".join(
            " / ".join("-" if v is None else f"{v:.1%}" for v in at.values())
            for at in c["at"].values()) + " |" for c in report["curves"]["correctors"]], "",
        f"![accuracy against false corrections](benchmarks/figures/{FIGURE.name})", "",
        "Serving, `queryserve serve` with one model alone (its model.yaml as `queryserve "
        "prepare` wrote it) and `queryserve bench` on the same 2 cores, one held-out query per "
        f"request ({report['mean_chars']:.1f} characters, {report['mean_words']:.1f} words on "
        "average; half misspelled):", "",
        "| model | p50 at 100 req/s (ms) | p99 at 100 req/s (ms) | highest rate at p99 <= "
        f"{P99_MS} ms (req/s) | server peak RSS (MB) |", "|---|---:|---:|---:|---:|",
        *[f"| `{m}` | {_ms(f['at_100']['steps'][0]['latency_ms']['p50'])} | "
          f"{_ms(f['at_100']['steps'][0]['latency_ms']['p99'])} | "
          f"{_rate(f['max']['search']['max_rate'])} | {f['rss_mb']:.0f} |"
          for m, f in served.items()], "",
        "Commands: " + "; ".join(f"`{f['at_100']['command_shown']}`, "
                                 f"`{f['max']['command_shown']}`" for f in served.values())
        + ".", "",
        f"Issue 43's targets: realistic set >= 65% and hard set >= 63% at <= 1.0% false "
        f"corrections (the hybrid at {HYBRID_MIN_SCORE:g}: "
        f"{hybrid['realistic']['query_accuracy']['share']:.1%} and "
        f"{hybrid['hard']['query_accuracy']['share']:.1%} at {hybrid['clean']['share']:.1%}; the "
        "channel at the search pipeline's 0.5: "
        f"{channel['realistic']['query_accuracy']['share']:.1%} and "
        f"{channel['hard']['query_accuracy']['share']:.1%} at {channel['clean']['share']:.1%}); "
        f"word accuracy not under 43.1% (the hybrid {hybrid['words']['share']:.1%}, the channel "
        f"{channel['words']['share']:.1%}; symspellpy {sym['words']['share']:.1%}); p99 <= 15 ms "
        f"at 100 req/s; >= 300 req/s at p99 <= {P99_MS} ms.",
    ]
    return lines
