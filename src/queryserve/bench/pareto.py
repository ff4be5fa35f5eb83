"""Pareto front of sweep points (``queryserve recommend``), and which two fields it trades off.

A point is a plain dict with an ``"id"`` and numeric fields. A field name may
be a dotted path into nested dicts (``"latency_ms.p99"``, ``"latency_ms.p99.9"``):
an exact key always wins over splitting at a dot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["field_value", "finite_number", "pareto_axes", "pareto_front"]


def field_value(point: Mapping[str, Any], name: str) -> Any:
    """``point[name]``, or the nested value a dotted ``name`` points to; None if absent."""
    if name in point:
        return point[name]
    for i, char in enumerate(name):
        if char != ".":
            continue
        head = point.get(name[:i])
        if isinstance(head, Mapping):
            value = field_value(head, name[i + 1 :])
            if value is not None:
                return value
    return None


def finite_number(value: Any) -> float | None:
    """A finite float, or None for missing, non-numeric (bool included) or NaN/inf values."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _dominates(a: tuple[int, str, float, float], b: tuple[int, str, float, float]) -> bool:
    """(index, id, maximize, minimize) a is no worse than b on both and better on one."""
    return a[2] >= b[2] and a[3] <= b[3] and (a[2] > b[2] or a[3] < b[3])


def pareto_front(points: Sequence[Mapping[str, Any]], maximize: str, minimize: str) -> list[str]:
    """Ids of the non-dominated points, ordered by ``minimize`` ascending.

    Point A dominates B when A is at least as good on both fields and strictly
    better on one (higher ``maximize``, lower ``minimize``). So exact ties are
    all kept. A point whose ``maximize`` value is missing or <= 0 (nothing met
    the threshold, or the point failed) is never on the front. A missing
    ``minimize`` value (say ``cost_per_million`` when no price was given)
    counts as +inf: such a point is on the front only if no point with a known
    value reaches its ``maximize`` value.

    >>> pts = [{"id": "a", "max_rate": 100, "cost": 1.0},
    ...        {"id": "b", "max_rate": 200, "cost": 2.0},
    ...        {"id": "c", "max_rate": 150, "cost": 3.0}]
    >>> pareto_front(pts, "max_rate", "cost")
    ['a', 'b']
    """
    candidates: list[tuple[int, str, float, float]] = []
    for index, point in enumerate(points):
        up = finite_number(field_value(point, maximize))
        if up is None or up <= 0:
            continue
        down = finite_number(field_value(point, minimize))
        candidates.append((index, str(point["id"]), up, math.inf if down is None else down))
    front = [cand for cand in candidates if not any(_dominates(o, cand) for o in candidates)]
    front.sort(key=lambda cand: (cand[3], -cand[2], cand[0]))
    return [cand[1] for cand in front]


def pareto_axes(results: Mapping[str, Any]) -> tuple[str, str]:
    """(field to maximize, field to minimize) of the recommend results' Pareto front.

    Always the max rate against cost per million inferences when the objective
    is ``"cost"`` and some point has a cost; otherwise against the latency at
    the threshold's percentile (``"latency_ms.p99"`` by default). The producer
    (which sets each point's ``"pareto"`` flag) and the report's plot both use
    this, so the table and the plot agree.

    >>> pareto_axes({"objective": "cost", "points": [{"cost_per_million": 0.1}]})
    ('max_rate', 'cost_per_million')
    >>> pareto_axes({"objective": "cost", "threshold": {"percentile": "p95"}, "points": []})
    ('max_rate', 'latency_ms.p95')
    """
    points = results.get("points")
    if results.get("objective") == "cost" and isinstance(points, Sequence) and any(
        isinstance(point, Mapping) and finite_number(point.get("cost_per_million")) is not None
        for point in points
    ):
        return "max_rate", "cost_per_million"
    threshold = results.get("threshold")
    percentile = threshold.get("percentile") if isinstance(threshold, Mapping) else None
    return "max_rate", f"latency_ms.{percentile or 'p99'}"
