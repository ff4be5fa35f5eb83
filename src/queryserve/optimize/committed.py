"""The variant each default model is served as, committed (`models/variants.json`), so that
every host serves the same one and a fresh clone does not sweep.

The sweep (every recipe built, gated and timed; the fastest that passes served) depends on the
host that times it: two int8 recipes a few percent apart swap places from one machine to the
next, and what users and tests got followed. `queryserve prepare --sweep` runs it and writes
its choices here; plain `queryserve prepare` builds each committed variant alone, re-checks its
gate on this host and serves it, untimed (timing was most of the run). A committed variant that
misses its gate here (int8 kernels round differently from one processor to the next) is said,
and this host sweeps instead; prepare.json records that, so the next run does not try again.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from queryserve.optimize.plan import ChoiceRefused

CHOICES = Path("models/variants.json")


def committed_choice(name: str, choices: Path = CHOICES) -> str | None:
    """The variant committed for model `name`, or None (none committed: sweep)."""
    if not choices.is_file():
        return None
    chosen: dict[str, str] = json.loads(choices.read_text())["chosen"]
    return chosen.get(name)


def build_committed(name: str, build: Callable[[str | None], Path], sweep: bool,
                    choices: Path = CHOICES) -> None:
    """`build(only)` writes model `name` and returns its prepare.json: first as the committed
    variant alone, unless `sweep` or none is committed; where that misses its gate on this
    host, again as a sweep, and the refusal goes into prepare.json (`committed`)."""
    choice = None if sweep else committed_choice(name, choices)
    if choice is None:
        build(None)
        return
    try:
        build(choice)
        return
    except ChoiceRefused as refused:
        print(f"{name}: {refused.message}; sweeping every variant instead")
        reason = refused.message
    report = build(None)
    document = json.loads(report.read_text())
    document["committed"] = {"choice": choice, "refused": reason}
    report.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def serves_another(name: str, stored: Mapping[str, Any], choices: Path = CHOICES) -> str | None:
    """The committed variant, when a prepared folder (its prepare.json `stored`) serves another
    one that this host has not refused; else None."""
    choice = committed_choice(name, choices)
    if choice is None or stored.get("chosen") == choice:
        return None
    refused = stored.get("committed") or {}
    return None if refused.get("choice") == choice else choice


def write_choices(chosen: Mapping[str, str], choices: Path = CHOICES) -> None:
    """What `prepare --sweep` chose for each model, and where, for the next commit."""
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) \
        if Path("/proc/cpuinfo").is_file() else platform.processor()
    document = {
        "about": "The variant `queryserve prepare` serves for each model, chosen by `queryserve "
                 "prepare --sweep` (the fastest that passes its gate, on the host below); "
                 "prepare builds it alone and re-checks its gate. See "
                 "src/queryserve/optimize/committed.py.",
        "swept_on": f"{cpu}, {os.cpu_count()} cores, "
                    f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}",
        "chosen": dict(sorted(chosen.items())),
    }
    choices.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
