"""Section 11, product duplicates: the cross-encoder and the bi-encoder side by side (F1 per
dataset, training time), both served (F1 over HTTP; the latency at 100 req/s, one pair per
request, and the highest rate at p99 <= 20 ms), and `queryserve batch duplicates`
on the three datasets' full tables (blocking's recall, precision and recall against their
ground truth, pairs/s)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from queryserve.bench.server_process import serving
from sections.common import OUT, QUERYSERVE, ROOT, _ms, _rate, bench, log, one_model_repository

BATCH_TABLES = {  # dataset -> the two tables the batch job matches across
    "abt-buy": ("abt.csv", "buy.csv", "|"),
    "amazon-google": ("amazon.csv", "gp.csv", "#"),
    "walmart-amazon": ("walmart.csv", "amazon.csv", "|"),
}


def served_f1(url: str, model: str, dataset_thresholds: dict[str, float]) -> dict[str, Any]:
    """F1 per DeepMatcher test split of a served pair model over HTTP, 32 pairs per request:
    at its own threshold, and at each dataset's (chosen on its valid split)."""
    import httpx

    from queryserve.duplicates.products import DATASETS, load_split
    from queryserve.duplicates.train import f1

    figures: dict[str, Any] = {"model": {}, "dataset": {}}
    for dataset in DATASETS:
        pairs = load_split(dataset, "test", ROOT / "data" / "product-matching")
        labels = [p.label for p in pairs]
        decided: list[bool] = []
        probabilities: list[float] = []
        for start in range(0, len(pairs), 32):
            chunk = pairs[start:start + 32]
            answer = httpx.post(f"{url}/v1/duplicates", timeout=60, json={
                "model": model, "pairs": [[p.left, p.right] for p in chunk]})
            answer.raise_for_status()
            decided += [r["duplicate"] for r in answer.json()["results"]]
            probabilities += [r["probability"] for r in answer.json()["results"]]
        figures["model"][dataset] = round(100 * f1(decided, labels), 1)
        own = dataset_thresholds[dataset]
        figures["dataset"][dataset] = round(100 * f1([p >= own for p in probabilities],
                                                     labels), 1)
    return figures


def batch_job(dataset: str, model: str, dataset_threshold: float) -> dict[str, Any]:
    """`queryserve batch duplicates --one-to-one` across the dataset's two tables, every
    candidate kept (--min-probability 0), so that blocking's recall of the true matches can be
    counted; precision and recall of the pairs at the model's threshold, at the dataset's own
    (what `--threshold` would call duplicates), and of those that --one-to-one keeps."""
    import csv

    from queryserve.duplicates.batch import scoring_model
    from queryserve.duplicates.tables import read_pairs

    left, right, separator = BATCH_TABLES[dataset]
    tables = ROOT / "data" / "product-matching" / dataset / "tables"
    out = OUT / "duplicates" / f"{dataset}-{model}.parquet"
    shutil.rmtree(out.with_name(out.name + ".parts"), ignore_errors=True)
    out.unlink(missing_ok=True)
    command = [QUERYSERVE, "batch", "duplicates", str(tables / left), str(tables / right),
               str(out), "--model", f"model_repository/{model}", "--min-probability", "0",
               "--one-to-one", "--no-progress"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    with (tables / "gt.csv").open(newline="") as f:
        truth = {(r["D1"], r["D2"]) for r in csv.DictReader(f, delimiter=separator)}
    rows = read_pairs(out)
    pairs = list(zip(rows["left_id"], rows["right_id"], strict=True))
    _, threshold = scoring_model(ROOT / "model_repository" / model)
    at_threshold = {pair for pair, p in zip(pairs, rows["probability"], strict=True)
                    if p >= threshold}
    at_own = {pair for pair, p in zip(pairs, rows["probability"], strict=True)
              if p >= dataset_threshold}
    one_to_one = {pair for pair, d in zip(pairs, rows["duplicate"], strict=True) if d}

    def quality(found: set[tuple[str, str]]) -> dict[str, float]:
        hits = len(found & truth)
        precision, recall = hits / max(1, len(found)), hits / len(truth)
        return {"precision": precision, "recall": recall,
                "f1": 2 * precision * recall / max(1e-9, precision + recall)}

    return {**summary, "seconds": round(seconds, 1), "matches": len(truth),
            "blocking_recall": len(set(pairs) & truth) / len(truth),
            "at_threshold": quality(at_threshold), "at_dataset_threshold": quality(at_own),
            "dataset_threshold": dataset_threshold, "one_to_one": quality(one_to_one),
            "command_shown": " ".join(["queryserve", *command[1:]]).replace(str(ROOT) + "/", "")}


def pairs_file() -> Path:
    """The DeepMatcher test pairs, TEXT<TAB>TEXT, in a fixed shuffled order: `queryserve bench
    --protocol duplicates`'s requests, one pair each."""
    import random

    from queryserve.duplicates.products import DATASETS, load_split

    pairs = [f"{p.left}\t{p.right}" for d in DATASETS
             for p in load_split(d, "test", ROOT / "data" / "product-matching")]
    random.Random(0).shuffle(pairs)
    path = OUT / "duplicates" / "test-pairs.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(pairs) + "\n")
    return path


def measure() -> dict[str, Any]:
    """The methods' F1, both served models' F1 over HTTP and serving latency, and the batch
    job on the three datasets' full tables."""
    from queryserve.prepare import BI_MODEL, DUPLICATES_MODEL

    head_out = OUT / "duplicates" / "head"
    shutil.rmtree(head_out, ignore_errors=True)
    log("  queryserve train duplicates OUT/duplicates/head --method head")
    subprocess.run([QUERYSERVE, "train", "duplicates", str(head_out), "--method", "head",
                    "--no-progress"], capture_output=True, text=True, check=True)
    cores = os.cpu_count() or 2
    cross = json.loads((ROOT / DUPLICATES_MODEL / "TRAINING.json").read_text())
    bi = json.loads((ROOT / BI_MODEL / "TRAINING.json").read_text())
    served, latency = {}, {}
    for model, trained in (("duplicates", cross), ("duplicates-bi", bi)):
        # Each model alone on the 2 cores, as section 8 serves the correctors.
        repository = one_model_repository(model, OUT / "duplicates" / "repo")
        with serving(repository, cores, cores, OUT / "duplicates" / f"{model}.log") as (url, _):
            log(f"  served {model}: F1 on the test splits over HTTP")
            served[model] = served_f1(url, model, trained["dataset_thresholds"])
            common = ("--protocol", "duplicates", "--model", model, "--queries",
                      str(pairs_file()))
            log(f"  served {model}: 100 req/s for 10 s, one pair per request")
            at_100 = bench(url, *common, "--rate", "100", "--duration", "10",
                           name=f"{model}-rate-100")
            log(f"  served {model}: max rate at p99 <= 20 ms")
            at_max = bench(url, *common, "--find-max", "--p99-ms", "20",
                           name=f"{model}-max-p99-20ms")
            latency[model] = {"at_100": at_100, "max": at_max}
    jobs: dict[str, dict[str, Any]] = {"duplicates": {}, "duplicates-bi": {}}
    for model, trained in (("duplicates", cross), ("duplicates-bi", bi)):
        for dataset in BATCH_TABLES:
            log(f"  queryserve batch duplicates: {dataset}, scored by {model}")
            jobs[model][dataset] = batch_job(dataset, model,
                                             trained["dataset_thresholds"][dataset])
    return {"cross": cross, "finetune": bi,
            "head": json.loads((head_out / "TRAINING.json").read_text()),
            "prepare": {m: json.loads((ROOT / "model_repository" / m / "prepare.json")
                                      .read_text()) for m in served},
            "served_f1": served, "latency": latency, "batch": jobs}


def render(report: dict[str, Any]) -> list[str]:
    cross, finetune, head = report["cross"], report["finetune"], report["head"]
    prepare, served = report["prepare"], report["served_f1"]
    names = ("abt-buy", "amazon-google", "walmart-amazon")

    def f1s(values: dict[str, float]) -> str:
        return " | ".join(f"{values[n]:.1f}" for n in names)

    def own(trained: dict[str, Any]) -> str:
        return " / ".join(f"{trained['dataset_thresholds'][n]:.2f}" for n in names)

    lines = [
        "## 11. Product duplicates: Abt-Buy, Amazon-Google, Walmart-Amazon", "",
        "One model for the three datasets, trained on the three DeepMatcher train splits "
        "together; the valid splits choose the epoch and the one decision threshold it is "
        "served with. The **cross-encoder** (served as `duplicates`, the default) reads both "
        "products at once, `[CLS] hint | left [SEP] right [SEP]`, 128 tokens, the hint saying "
        "in words what the model numbers and sizes say. The **bi-encoder** (served as "
        "`duplicates-bi`, and the batch job's blocking stage) embeds each product alone and a "
        "small head scores the pair from the two embeddings and string features such as model "
        "numbers. F1 on each test split at the model's threshold, `queryserve train "
        "duplicates`:",
        "",
        "| model | Abt-Buy | Amazon-Google | Walmart-Amazon | threshold | training |",
        "|---|---:|---:|---:|---:|---:|",
        f"| bi-encoder, the head alone on the frozen `embed` encoder (`--method head`, "
        f"measured in this run) | {f1s(head['test_f1'])} | {head['threshold']:.2f} | "
        f"{head['minutes']:.1f} min on 2 cores |",
        f"| bi-encoder, encoder and head together (`--method finetune`), "
        f"{len(finetune['epochs'])} epochs, the valid splits chose epoch "
        f"{finetune['best_epoch']} (models/duplicates-bi/TRAINING.json) | "
        f"{f1s(finetune['test_f1'])} | {finetune['threshold']:.2f} | "
        f"{finetune['minutes']:.1f} min on 2 cores, {finetune['pairs_per_second']:.0f} "
        "pairs/s |",
        f"| **cross-encoder** (`--method cross-encoder`), {len(cross['epochs'])} epochs, the "
        f"valid splits chose epoch {cross['best_epoch']} (`{cross['command']}`, "
        f"models/duplicates/TRAINING.json) | {f1s(cross['test_f1'])} | "
        f"{cross['threshold']:.2f} | {cross['minutes']:.1f} min "
        f"{'on a GPU' if cross.get('device') == 'cuda' else 'on 2 cores'}, "
        f"{cross['pairs_per_second']:.0f} pairs/s |",
    ]
    # The teachers the cross-encoder was distilled from, beside it: the gap distillation leaves.
    for name, teacher in (cross.get("teachers") or {}).items():
        recipe = teacher.get("recipe") or {}
        lines.append(
            f"| teacher `{name}` of the cross-encoder: {teacher.get('encoder')}, learning rate "
            f"{recipe.get('learning_rate', 0):g}, seed {recipe.get('seed')}, the valid splits "
            f"chose epoch {teacher.get('best_epoch')} (TRAINING.json `teachers`; not served) | "
            f"{f1s(teacher['test_f1'])} | {teacher['threshold']:.2f} | "
            f"{teacher['minutes']:.1f} min on a GPU, {teacher['pairs_per_second']:.0f} pairs/s |")
    if mean := cross.get("teachers_mean"):  # what the student learns: the teachers' mean
        lines.append(
            f"| the {len(cross['teachers'])} teachers' mean, judged as one model (what the "
            f"cross-encoder learnt; TRAINING.json `teachers_mean`; not served) | "
            f"{f1s(mean['test_f1'])} | {mean['threshold']:.2f} | |")
    for model, trained, what in (("duplicates", cross, "cross-encoder"),
                                 ("duplicates-bi", finetune, "bi-encoder")):
        lines += [
            f"| served {what} (`{model}`): `queryserve prepare` chose "
            f"**{prepare[model]['chosen']}**; `/v1/duplicates` over HTTP, all test pairs | "
            f"{f1s(served[model]['model'])} | {trained['threshold']:.2f} | |",
            f"| served {what}, at each dataset's own threshold (its valid split's best, "
            "TRAINING.json `dataset_thresholds`; `\"threshold\"` in the request) | "
            f"{f1s(served[model]['dataset'])} | {own(trained)} | |"]
    lines += [
        "",
        "Published on the same splits: DeepMatcher 62.8 / 69.3 / 67.6, Ditto 89.3 / 75.6 / "
        "86.8 (a RoBERTa-base cross-encoder, 125 M parameters, up to 40 epochs on a GPU; "
        "MiniLM-L6 has 22 M).", "",
        "Served alone on the 2 cores (`queryserve bench --protocol duplicates`, one DeepMatcher "
        "test pair per request, open loop):", "",
        "| model | p50 at 100 req/s (ms) | p99 at 100 req/s (ms) | highest rate at p99 <= 20 ms "
        "(req/s) |", "|---|---:|---:|---:|",
    ]
    for model in ("duplicates", "duplicates-bi"):
        figures = report["latency"][model]
        step = figures["at_100"]["steps"][0]
        lines.append(f"| {model} | {_ms(step['latency_ms']['p50'])} | "
                     f"{_ms(step['latency_ms']['p99'])} | "
                     f"{_rate(figures['max']['search']['max_rate'])} |")
    lines += [
        "", f"Command: `{report['latency']['duplicates']['at_100']['command_shown']}`.",
        "",
        "The batch job across each dataset's two full tables (`tables/`, the JedAI copies, "
        "with their own ground truth). The bi-encoder blocks: each product's 10 nearest "
        "neighbours both ways and the pairs sharing a rare model number. Scored by the "
        "cross-encoder (the default), the candidates are the neighbour pairs the bi-encoder "
        "gives >= 0.01 (`--prefilter`); scored by the bi-encoder (`--model "
        "model_repository/duplicates-bi`), every neighbour pair is. Every candidate is kept "
        "(`--min-probability 0`) so that blocking's recall can be counted. Precision / recall / "
        "F1 against the ground truth, of the pairs at the model's threshold, at the dataset's "
        "own threshold (`--threshold`) and of those `--one-to-one` keeps at the model's (each "
        "product in one pair at most, the likeliest for both sides):", "",
        "| tables | scored by | products | neighbour pairs | candidates | true matches among "
        "the candidates | embed | block | score | pairs/s scored | end to end | at the threshold "
        "| at the dataset's threshold | --one-to-one |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def quality(figures: dict[str, float]) -> str:
        return (f"{figures['precision']:.1%} / {figures['recall']:.1%} / "
                f"{100 * figures['f1']:.1f}")

    for name in names:
        for model in ("duplicates", "duplicates-bi"):
            job = report["batch"][model][name]
            lines.append(
                f"| {name} | {model} | {' x '.join(f'{n:,}' for n in job['products'])} | "
                f"{job['neighbour_pairs']:,} | {job['candidate_pairs']:,} | "
                f"{job['blocking_recall']:.1%} of {job['matches']:,} "
                f"| {job['embed_s']:.0f} s | {job['block_s']:.1f} s | {job['score_s']:.1f} s | "
                f"{job['pairs_per_second']:,.0f} | {job['seconds']:.0f} s | "
                f"{quality(job['at_threshold'])} | {job['dataset_threshold']:.2f}: "
                f"{quality(job['at_dataset_threshold'])} | {quality(job['one_to_one'])} |")
    shown = report["batch"]["duplicates"]["walmart-amazon"]["command_shown"]
    lines += ["", f"Command: `{shown}` (and the same for the other two, and with `--model "
              "model_repository/duplicates-bi` for the bi-encoder). The JedAI ground truth "
              "misses matches: in a random sample of 8 of Walmart-Amazon's pairs called "
              "duplicates at the threshold but not in it (the bi-encoder, 2026-11-22), 3 "
              "carried the same model number on both sides (Epson S041062, LifeWorks "
              "IHB931NR, Powermat PRL01-001-US)."]
    return lines
