"""The PNG figures of the bench report (latency over time, latency vs throughput, batch sizes)
and the figure helpers :mod:`.pareto_plot` shares.

matplotlib is imported only inside functions, so importing the report stays
cheap. Figures are drawn on an explicit Agg canvas (no pyplot, no
display, no global backend switch). Each function returns None, and writes
nothing, when there is no data to plot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from queryserve.bench.report.values import (
    PERCENTILES,
    as_dict,
    as_int,
    dicts,
    fmt_ms,
    fmt_rate,
    num,
    search_info,
    text,
    winning_step,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
C_P50, C_P99, C_OTHER, C_ERR, C_WIN, C_GREY = (
    "tab:blue", "tab:orange", "tab:purple", "tab:red", "tab:green", "#9a9a9a"
)


def mpl_text(value: Any) -> str:
    """Text for a plot label: ``$`` escaped so matplotlib does not read it as mathtext."""
    return text(value).replace("$", r"\$")


def new_figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png", dpi=DPI, facecolor="white")
    return path


def corner_note(ax: Axes, note: str) -> None:
    """Small grey text in the lower right corner of the axes."""
    ax.text(0.99, 0.02, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
            color="#555555")


def threshold_line(ax: Axes, value: float, percentile: str, vertical: bool = False) -> Any:
    line = ax.axvline if vertical else ax.axhline
    label = f"{percentile} threshold {fmt_ms(value)} ms"
    return line(value, color=C_ERR, linestyle="--", linewidth=1.2, label=label)


def y_scale(ax: Axes, values: Sequence[float]) -> None:
    """Log scale when the positive values span 30x or more, else linear from 0."""
    positive = [v for v in values if v > 0 and not math.isnan(v)]
    if len(positive) >= 2 and max(positive) / min(positive) >= 30:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def unzip(pairs: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """([x, ...], [y, ...]) of (x, y) pairs."""
    pairs = list(pairs)
    return [x for x, _ in pairs], [y for _, y in pairs]


def nan_if_none(value: Any) -> float:
    number = num(value)
    return math.nan if number is None else number


def step_label(step: Mapping[str, Any], index: int) -> str:
    return mpl_text(step.get("label") or f"step {index + 1}")


def latency_over_time(results: Mapping[str, Any], path: Path) -> Path | None:
    """p50 and p99 per one-second window, steps laid end to end; errors per second."""
    steps = dicts(results.get("steps"))
    xs: list[float] = []
    p50s: list[float] = []
    p99s: list[float] = []
    errors: dict[float, float] = {}
    segments: list[tuple[float, float, str, Any]] = []  # start, end, label, passed
    offset = 0.0
    for index, step in enumerate(steps):
        timeline = dicts(step.get("timeline"))
        seconds = [num(entry.get("t_s")) for entry in timeline]
        last = max((s for s in seconds if s is not None), default=-1.0) + 1.0
        length = max(num(step.get("duration_s")) or 0.0, last)
        for position, (entry, second) in enumerate(zip(timeline, seconds, strict=True)):
            x = offset + (second if second is not None else float(position)) + 0.5
            xs.append(x)
            p50s.append(nan_if_none(entry.get("p50_ms")))
            p99s.append(nan_if_none(entry.get("p99_ms")))
            if as_int(entry.get("errors")) > 0:
                errors[x] = float(as_int(entry.get("errors")))
        # A NaN between steps so the lines do not join across a boundary.
        xs.append(offset + length)
        p50s.append(math.nan)
        p99s.append(math.nan)
        segments.append((offset, offset + length, step_label(step, index), step.get("passed")))
        offset += length
    if len(xs) == len(steps) or offset <= 0:  # no timeline entries at all
        return None

    fig = new_figure(11.0, 5.0)
    ax = fig.add_subplot()
    handles: list[Any] = []
    for start, end, _, passed in segments:
        if passed is False:
            ax.axvspan(start, end, color=C_ERR, alpha=0.07, linewidth=0)
    for start, _, _, _ in segments[1:]:
        ax.axvline(start, color="#555555", linestyle=":", linewidth=1)
    handles += ax.plot(xs, p99s, color=C_P99, marker=".", linewidth=1.5, label="p99 per second")
    handles += ax.plot(xs, p50s, color=C_P50, marker=".", linewidth=1.5, label="p50 per second")
    percentile, threshold, _ = search_info(results)
    if threshold is not None:
        handles.append(threshold_line(ax, threshold, percentile))
    y_scale(ax, p50s + p99s + ([threshold] if threshold is not None else []))
    ax.set_xlim(0, offset)
    ax.set_xlabel("time since start of run (s); steps laid end to end")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, alpha=0.3)

    # Step labels along the top edge, one tick per step at its middle.
    top = ax.secondary_xaxis("top")
    labels = [label for _, _, label, _ in segments]
    top.set_ticks([(start + end) / 2 for start, end, _, _ in segments], labels=labels)
    top.tick_params(axis="x", length=0, labelsize=8)
    # About 150 characters of 8 pt text fit across; rotate the labels when they would not.
    if sum(len(label) + 3 for label in labels) > 150:
        for tick_label in top.get_xticklabels():
            tick_label.set(rotation=35, rotation_mode="anchor", horizontalalignment="left")

    if errors:
        err_ax = ax.twinx()
        handles.append(err_ax.bar(list(errors), list(errors.values()), width=0.8, color=C_ERR,
                                  alpha=0.45, label="errors per second (right axis)"))
        err_ax.set_ylabel("errors / s", color=C_ERR)
        err_ax.tick_params(axis="y", colors=C_ERR)
        err_ax.set_ylim(bottom=0)
    if any(passed is False for _, _, _, passed in segments):
        from matplotlib.patches import Patch

        handles.append(Patch(color=C_ERR, alpha=0.15, label="step failed the threshold"))
    ax.set_title("Latency over time: p50 and p99 per one-second window"
                 + ("" if errors else " (no errors)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8,
               frameon=False)
    return save(fig, path)


def latency_vs_throughput(results: Mapping[str, Any], path: Path) -> Path | None:
    """One point per step and percentile; failed steps crossed, the max-rate step circled."""
    steps = dicts(results.get("steps"))
    percentile, threshold, max_rate = search_info(results)
    percentiles = ["p50", "p99"]
    if percentile not in percentiles and percentile in PERCENTILES:
        percentiles.append(percentile)
    key = percentile if percentile in percentiles else "p99"  # the one the search judged

    def point(step: Mapping[str, Any], pct: str) -> tuple[float, float] | None:
        x, y = num(step.get("throughput")), num(as_dict(step.get("latency_ms")).get(pct))
        return None if x is None or y is None else (x, y)

    # Open-loop steps first (the usual rate sweep), closed-loop steps after.
    modes = sorted({text(step.get("mode")) or "open" for step in steps},
                   key=lambda mode: (mode != "open", mode))
    fig = new_figure(10.0, 5.5)
    ax = fig.add_subplot()
    plotted: list[float] = []
    for pct in percentiles:
        colour, marker = {"p50": (C_P50, "o"), "p99": (C_P99, "s")}.get(pct, (C_OTHER, "^"))
        for mode in modes:
            xy = [point(step, pct) for step in steps if (text(step.get("mode")) or "open") == mode]
            # Sorted by throughput: a search visits rates out of order, and a line drawn in
            # step order zigzags back and forth.
            found = sorted(p for p in xy if p is not None)
            if not found:
                continue
            plotted += [y for _, y in found]
            closed = mode == "closed"
            ax.plot(*unzip(found), color=colour, marker=marker, markersize=6,
                    linestyle=":" if closed else "-", markerfacecolor="white" if closed else colour,
                    label=pct if len(modes) == 1 else f"{pct} ({mode} loop)")
    if not plotted:
        return None
    missing = [step_label(step, i) for i, step in enumerate(steps)
               if all(point(step, pct) is None for pct in percentiles)]
    if missing:
        corner_note(ax, "not shown (no successful responses): " + ", ".join(missing))
    failed = [p for step in steps if step.get("passed") is False and (p := point(step, key))]
    if failed:
        ax.scatter(*unzip(failed), marker="x", s=70, color=C_ERR, zorder=4,
                   label="step failed the threshold")
    if threshold is not None:
        threshold_line(ax, threshold, percentile)
        plotted.append(threshold)
    winner = winning_step(results)
    win = point(steps[winner], key) if winner is not None else None
    if winner is not None and win is not None:
        rate = f"{fmt_rate(max_rate)} req/s"
        ax.scatter(*win, s=320, facecolors="none", edgecolors=C_WIN, linewidths=2.5, zorder=5,
                   label=f"max rate: {rate}")
        label = mpl_text(steps[winner].get("label"))
        same = label == rate or (max_rate is not None and label == f"{max_rate:g} req/s")
        ax.annotate(f"max rate {rate}" + ("" if not label or same else f"\n(step {label})"), win,
                    xytext=(-12, 18), textcoords="offset points", ha="right", fontsize=9,
                    color=C_WIN, fontweight="bold", arrowprops={"arrowstyle": "-", "color": C_WIN})
    y_scale(ax, plotted)
    ax.set_xlim(left=0)
    ax.set_xlabel("achieved throughput (req/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency vs throughput (one point per step)")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    return save(fig, path)


def batch_sizes(results: Mapping[str, Any], path: Path) -> Path | None:
    """Server batch-size histogram (batch size -> executions) summed over the steps."""
    servers = [as_dict(as_dict(step.get("server")).get("batch_sizes"))
               for step in dicts(results.get("steps"))]
    total: dict[int, int] = {}
    for server in servers:
        for size, count in server.items():
            try:
                total[int(size)] = total.get(int(size), 0) + as_int(count)
            except (TypeError, ValueError):
                continue
    histogram = {size: total[size] for size in sorted(total) if total[size] > 0}
    if not histogram:
        return None
    executions = sum(histogram.values())
    mean = sum(size * count for size, count in histogram.items()) / executions

    fig = new_figure(10.0, 4.5)
    ax = fig.add_subplot()
    sizes = list(histogram)
    ax.bar(sizes, list(histogram.values()), width=0.8, color=C_P50)
    ax.set_xlabel("batch size (inferences per execution)")
    ax.set_ylabel("executions")
    ax.set_title(f"Server batch sizes, summed over {sum(map(bool, servers))} step(s): "
                 f"{executions:,} executions, mean {mean:.2f} inferences per execution")
    if len(sizes) <= 20:
        ax.set_xticks(sizes)
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(min(sizes) - 0.8, max(sizes) + 0.8)
    ax.grid(True, axis="y", alpha=0.3)
    return save(fig, path)
