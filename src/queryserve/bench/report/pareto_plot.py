"""The PNG figure of the recommend report: max rate against cost or latency, front highlighted.

The axes are :func:`queryserve.bench.pareto.pareto_axes`, the same choice the
producer made when it flagged each point ``"pareto"``, so plot and table agree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from queryserve.bench.pareto import field_value, pareto_axes
from queryserve.bench.report.plots import (
    C_GREY,
    C_P99,
    C_WIN,
    corner_note,
    mpl_text,
    new_figure,
    save,
    threshold_line,
    unzip,
)
from queryserve.bench.report.values import as_dict, dicts, fmt_ms, fmt_rate, num, text


def axis_names(minimize: str) -> tuple[str, str]:
    """(axis label, short name) of the minimized field."""
    if minimize == "cost_per_million":
        return "cost per million inferences", "cost"
    percentile = minimize.removeprefix("latency_ms.")
    return f"{percentile} latency at the max rate (ms)", f"{percentile} latency"


def pareto_plot(results: Mapping[str, Any], front: Collection[str], path: Path) -> Path | None:
    """Every point with a value on both axes; ``front`` (ids) joined by a line."""
    points = dicts(results.get("points"))
    maximize, minimize = pareto_axes(results)
    x_label, x_name = axis_names(minimize)
    coords: dict[str, tuple[float, float]] = {}
    for point in points:
        x = num(field_value(point, minimize))
        if x is not None:
            coords[text(point.get("id"))] = (x, num(point.get(maximize)) or 0.0)
    if not coords:
        return None
    on_front = sorted((pid for pid in coords if pid in front),
                      key=lambda pid: (coords[pid][0], -coords[pid][1]))
    best, default = text(results.get("best")), text(results.get("default"))
    untuned = text(results.get("untuned"))
    threshold = as_dict(results.get("threshold"))
    threshold_ms = num(threshold.get("ms"))
    percentile = text(threshold.get("percentile")) or "p99"
    line_at = threshold_ms if minimize.startswith("latency_ms.") else None  # threshold on x
    x_max = max([x for x, _ in coords.values()] + ([line_at] if line_at is not None else []))
    y_max = max(y for _, y in coords.values())

    def place(x: float) -> tuple[float, str]:
        """Label offset and alignment: away from the right edge."""
        return (-8.0, "right") if x > 0.6 * x_max else (8.0, "left")

    fig = new_figure(10.0, 6.5)
    ax = fig.add_subplot()
    ax.scatter(*unzip(coords.values()), s=36, color=C_GREY, alpha=0.8,
               label="configuration", zorder=2)
    if on_front:
        ax.plot(*unzip(coords[pid] for pid in on_front), color=C_P99, marker="o",
                markersize=8, linewidth=1.8, zorder=3,
                label=f"Pareto front (max rate vs {x_name})")
    # Name the Pareto points, and every point when there are few.
    for pid, (x, y) in coords.items():
        if pid in (best, default, untuned) or (pid not in front and len(coords) > 12):
            continue
        dx, ha = place(x)
        ax.annotate(mpl_text(pid), (x, y), xytext=(dx, -11), textcoords="offset points", ha=ha,
                    fontsize=7, color="#8a4a00" if pid in front else "#666666")
    if line_at is not None:
        threshold_line(ax, line_at, percentile, vertical=True)
    for role, pid, colour, marker, dy in (("best", best, C_WIN, "*", 14.0),
                                          ("default", default, "black", "D", -26.0),
                                          ("untuned", untuned, "#666666", "s", -26.0)):
        if pid not in coords or (role == "untuned" and pid in (best, default)):
            continue
        x, y = coords[pid]
        ax.scatter(x, y, s=260 if marker == "*" else 80, marker=marker, color=colour, zorder=5,
                   edgecolors="white", linewidths=0.8, label=f"{role}: {mpl_text(pid)}")
        dx, ha = place(x)
        ax.annotate(f"{role}: {mpl_text(pid)}\n{fmt_rate(y)} req/s", (x, y), xytext=(dx, dy),
                    textcoords="offset points", ha=ha, fontsize=8, color=colour,
                    fontweight="bold",
                    arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.8})
    if len(points) > len(coords):
        corner_note(ax, f"not plotted: {len(points) - len(coords)} point(s) with no {x_name} "
                        "(failed or nothing passed)")
    if x_name == "cost":
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:.3g}"))
    ax.set_xlabel(x_label)
    ax.set_ylabel("max rate under the threshold (req/s)" if threshold_ms is None
                  else f"max rate with {percentile} \u2264 {fmt_ms(threshold_ms)} ms (req/s)")
    ax.set_ylim(0, max(y_max, 1.0) * 1.18)  # headroom for the labels above the top point
    ax.set_xlim(0, x_max * 1.08 if x_max > 0 else 1.0)
    ax.set_title(f"Configurations: max rate vs {x_name} (up and to the left is better)")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return save(fig, path)
