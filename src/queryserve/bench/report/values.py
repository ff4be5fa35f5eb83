"""Reading the loosely typed results dict: coercions, number formatting, the search outcome.

Every field may be missing, None or of the wrong type; these helpers turn that
into a safe default (None, 0, {}, []) and format a missing number as a dash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from queryserve.bench.pareto import finite_number

DASH = "\u2014"  # shown for a missing value
PERCENTILES = ("p50", "p90", "p95", "p99", "p99.9", "max")

num = finite_number  # a finite float, or None (missing, bool, non-numeric, NaN, inf)


def as_int(value: Any) -> int:
    number = num(value)
    return int(number) if number is not None else 0


def as_dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []


def text(value: Any) -> str:
    return "" if value is None else str(value)


def dicts(value: Any) -> list[dict[str, Any]]:
    """A list of dicts (``steps``, ``points``, ``timeline``); non-dict entries become {}."""
    return [as_dict(item) for item in as_list(value)]


def fmt(value: Any, digits: int = 1) -> str:
    number = num(value)
    return DASH if number is None else f"{number:,.{digits}f}"


def fmt_ms(value: Any) -> str:
    """Latency with about three significant digits."""
    number = num(value)
    if number is None:
        return DASH
    digits = 3 if number < 1 else 2 if number < 10 else 1 if number < 100 else 0
    return f"{number:,.{digits}f}"


def fmt_rate(value: Any) -> str:
    number = num(value)
    if number is None:
        return DASH
    return f"{number:,.1f}" if abs(number) < 100 else f"{number:,.0f}"


def fmt_cost(value: Any) -> str:
    number = num(value)
    return DASH if number is None else f"{number:.4g}"


def is_2xx(code: Any) -> bool:
    try:
        return 200 <= int(code) < 300
    except (TypeError, ValueError):
        return False


def status_counts(step: Mapping[str, Any]) -> tuple[int, int]:
    """(2xx responses, other responses) from ``by_status``."""
    ok = rejected = 0
    for code, count in as_dict(step.get("by_status")).items():
        if is_2xx(code):
            ok += as_int(count)
        else:
            rejected += as_int(count)
    return ok, rejected


def search_info(results: Mapping[str, Any]) -> tuple[str, float | None, float | None]:
    """(percentile, threshold_ms, max_rate) of the max-rate search; ("p99", None, None) if none."""
    search = as_dict(results.get("search"))
    percentile = text(search.get("percentile")) or "p99"
    return percentile, num(search.get("threshold_ms")), num(search.get("max_rate"))


def winning_step(results: Mapping[str, Any]) -> int | None:
    """Index into ``steps`` of the step that set the search's max rate, or None.

    Results that carry ``search.step`` are taken at their word (None or an
    index out of range: no step). Older results without it: the last passed
    step whose target rate is the max rate, failing that the passed step with
    the highest target rate (or throughput).
    """
    search = as_dict(results.get("search"))
    steps = dicts(results.get("steps"))
    if "step" in search:
        index = search["step"]
        valid = isinstance(index, int) and not isinstance(index, bool)
        return index if valid and 0 <= index < len(steps) else None
    max_rate = num(search.get("max_rate"))
    passed = [i for i, step in enumerate(steps) if step.get("passed") is True]
    if max_rate is None or max_rate <= 0 or not passed:
        return None

    def rate(i: int) -> float:
        return num(steps[i].get("target_rate")) or num(steps[i].get("throughput")) or 0.0

    for i in reversed(passed):
        target = num(steps[i].get("target_rate"))
        if target is not None and math.isclose(target, max_rate, rel_tol=1e-6, abs_tol=1e-9):
            return i
    return max(passed, key=rate)
