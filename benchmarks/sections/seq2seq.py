"""Section 7, `queryserve optimize --task seq2seq` on the committed spelling corrector
(models/spell): CTranslate2 float32 and int8 against Hugging Face `generate`, exact match and
speed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sections.common import OUT, ROOT, run_optimize


def spell_parity_file() -> Path:
    """The corrector's gate inputs: held-out misspelled and clean queries (as prepare uses)."""
    from queryserve.prepare import SPELL_PARITY
    from queryserve.spell.evaluate import EvalSets

    sets = EvalSets.build(ROOT / "data", size=SPELL_PARITY)
    path = OUT / "spell" / "parity.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(sets.queries()) + "\n")
    return path


def measure(seconds: float) -> dict[str, Any]:
    from queryserve.prepare import SPELL_MAX_OUTPUT, SPELL_MODEL

    model = ROOT / SPELL_MODEL
    out = OUT / "seq2seq" / "repo" / "spell"
    shutil.rmtree(out, ignore_errors=True)
    report = run_optimize(model, out, "--task", "seq2seq", "--precision", "fp32,int8",
                          "--parity", str(spell_parity_file()), "--max-output-length",
                          str(SPELL_MAX_OUTPUT), "--timing-seconds", str(seconds))
    report["training"] = json.loads((model / "TRAINING.json").read_text())
    return report


def render(report: dict[str, Any]) -> list[str]:
    before, after, timing = report["before"], report["after"], report["timing"]
    training = report["training"]
    lines = [
        "## 7. `queryserve optimize --task seq2seq`: CTranslate2 against Hugging Face `generate`",
        "",
        "`queryserve optimize models/spell --task seq2seq --precision fp32,int8 --parity "
        "OUT/spell/parity.txt --max-output-length 80`. The model is the committed spelling "
        "corrector (section 8): a character-level "
        f"{training['shape']['architecture'].upper()} of {training['parameters'] / 1e6:.1f} M "
        f"parameters (d_model {training['shape']['d_model']}, "
        f"{training['shape']['encoder_layers']} + {training['shape']['decoder_layers']} layers), "
        f"trained by `queryserve train spell` for {training['minutes']:.0f} minutes "
        f"({training['steps']:,} steps). Each CTranslate2 compute type is gated on exact match "
        f"against `generate` (greedy, PyTorch fp32) over {report['parity_queries']} held-out "
        "queries (half misspelled, half clean) at batch 1 and 32, then timed on the first "
        f"{timing['queries']} of them: {timing['mean_input_tokens']:.1f} input tokens and "
        f"{timing['mean_output_tokens']:.1f} generated tokens on average, end token included "
        "(characters, word boundaries included). Median queries/s of "
        f"{timing['rounds']} rounds, tokenization and decoding included. Each CTranslate2 "
        "compute type is timed at 1 intra-op thread and at 2, each of these alone in a fresh "
        "process without PyTorch, as a server process runs it (optimize keeps the faster "
        "setting and writes it into model.yaml); PyTorch on 2 threads.", "",
        "| engine | exact match with `generate` | intra-op threads | batch 1 (ms/query) | "
        "batch 32 (queries/s) |",
        "|---|---|---:|---:|---:|",
        f"| Hugging Face `generate`, PyTorch fp32 (before) | reference | {timing['torch_threads']}"
        f" | {before['batch_1_ms']:.2f} | {before['batch_32_per_s']:.0f} |",
    ]
    for variant in report["variants"]:
        parity = variant["parity"]
        if parity is None:
            lines.append(f"| CTranslate2 {variant['name']} | not built: {variant['error']} | "
                         "| | |")
            continue
        for threads, speed in timing["by_intra_threads"][variant["name"]].items():
            chosen = (variant["name"] == report["chosen"]
                      and int(threads) == timing["chosen_intra_threads"])
            name = variant["name"] + (" **(chosen)**" if chosen else "")
            lines.append(f"| CTranslate2 {name} | {parity['mean']:.2%} | {threads} | "
                         f"{1000 / speed['batch_1']:.2f} | {speed['batch_32']:.0f} |")
    lines += ["", f"Chosen: {report['reason']}.", "",
              f"Before/after: {before['size_mb']:.1f} MB -> {after['size_mb']:.1f} MB; load "
              f"{before['load_s']:.2f} -> {after['load_s']:.2f} s; batch 1 "
              f"{before['batch_1_ms']:.2f} -> {after['batch_1_ms']:.2f} ms/query "
              f"(**{before['batch_1_ms'] / after['batch_1_ms']:.1f}x**); batch 32 "
              f"{before['batch_32_per_s']:.0f} -> {after['batch_32_per_s']:.0f} queries/s "
              f"({after['batch_32_per_s'] / before['batch_32_per_s']:.1f}x). Issue 4's target: "
              ">= 5x at batch 1 with identical outputs on >= 99% of inputs."]
    return lines
