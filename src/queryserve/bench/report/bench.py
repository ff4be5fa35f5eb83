"""The ``queryserve bench`` report: results.json/.csv, three plots and report.html."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from queryserve.bench.report import plots
from queryserve.bench.report.files import BENCH_COLUMNS, bench_rows, write_csv, write_json
from queryserve.bench.report.html import Headers, esc, figure, table, write_page
from queryserve.bench.report.values import (
    DASH,
    as_dict,
    as_int,
    dicts,
    fmt,
    fmt_cost,
    fmt_ms,
    fmt_rate,
    is_2xx,
    num,
    search_info,
    status_counts,
    text,
    winning_step,
)

Format = Callable[[Any], str]


def _count(value: Any) -> str:
    return f"{as_int(value):,}"


def _headline(results: dict[str, Any], steps: list[dict[str, Any]]) -> tuple[str, str]:
    """(headline, sub-line), both escaped: the max rate found, or the peak throughput."""
    percentile, threshold, max_rate = search_info(results)
    items = num(results.get("items_per_request")) or 1.0
    stop = text(results.get("stop_reason"))
    sub = f"Stopped: {esc(stop)}" if stop else ""
    if not steps:
        return "No load steps ran.", sub
    if results.get("search") is not None:
        bound = f"{esc(percentile)} \u2264 {fmt_ms(threshold)} ms"
        if max_rate is None or max_rate <= 0:
            return f"No tested rate met {bound}.", sub
        head = f"Max rate with {bound}: <strong>{fmt_rate(max_rate)} req/s</strong>"
        if as_dict(results.get("search")).get("capped"):
            head += " or more (the --max-rate ceiling)"
        if items != 1:
            head += f" ({fmt_rate(max_rate * items)} inferences/s)"
        return head, sub
    peak = max(steps, key=lambda step: num(step.get("throughput")) or 0.0)
    p99 = fmt_ms(as_dict(peak.get("latency_ms")).get("p99"))
    return (f"Peak throughput <strong>{fmt_rate(peak.get('throughput'))} req/s</strong> at "
            f"{esc(peak.get('label'))} (p99 {p99} ms)", sub)


def _warnings(steps: list[dict[str, Any]]) -> str:
    """The warnings box (client CPU-bound steps, steps with failures), or ""."""
    lines = []
    for index, step in enumerate(steps):
        label = esc(step.get("label") or f"step {index + 1}")
        if step.get("client_bound") is True:
            share = num(step.get("client_cpu_share"))
            used = (f"{share * 100:.0f}% of a core" if share is not None else
                    f"{fmt(step.get('client_cpu_us_per_request'))} \u00b5s of CPU per request")
            lines.append(f"client CPU-bound at step {label}: the load generator used {used} "
                         "\u2014 figures may understate the server")
        ok, rejected = status_counts(step)
        if ok == 0 and not as_dict(step.get("latency_ms")):
            lines.append(f"no successful responses at step {label}: "
                         "latency percentiles are unavailable")
        errors, timeouts = as_int(step.get("errors")), as_int(step.get("timeouts"))
        if errors or timeouts or rejected:
            statuses = ", ".join(f"HTTP {esc(code)}: {as_int(count):,}"
                                 for code, count in as_dict(step.get("by_status")).items()
                                 if not is_2xx(code))
            lines.append(f"step {label}: {errors:,} errors, {timeouts:,} timeouts, "
                         f"{rejected:,} non-2xx responses" + (f" ({statuses})" if statuses else ""))
    if not lines:
        return ""
    items = "".join(f"<li>{line}</li>\n" for line in lines)
    return f'<div class="warn"><strong>Warnings</strong><ul>\n{items}</ul></div>\n'


def _steps_section(results: dict[str, Any], steps: list[dict[str, Any]]) -> str:
    """One row per step (the step that set the max rate green, failed steps red), and a note."""
    winner = winning_step(results)
    has_cost = any(num(step.get("cost_per_million")) is not None for step in steps)
    has_server = any(step.get("server") for step in steps)
    columns: list[tuple[str, str, Format]] = [  # header, row key, formatter
        ("#", "step", str), ("step", "label", esc), ("mode", "mode", esc),
        ("target req/s", "target_rate", fmt_rate), ("users", "users", lambda v: fmt(v, 0)),
        ("duration s", "duration_s", fmt), ("throughput req/s", "throughput", fmt_rate),
        ("inferences/s", "inferences_per_s", fmt_rate),
        *((f"{key} ms", f"{key}_ms", fmt_ms) for key in ("p50", "p90", "p99", "p99.9", "max")),
        ("ok", "ok", _count), ("errors", "errors", _count), ("timeouts", "timeouts", _count),
        ("non-2xx", "rejections", _count),
        ("client CPU \u00b5s/req", "client_cpu_us_per_request", fmt),
        ("passed", "passed", lambda v: {True: "\u2713 yes", False: "\u2717 no"}.get(v, DASH)),
        *([("cost / 1M inferences", "cost_per_million", fmt_cost)] if has_cost else []),
        *([("mean batch", "server_mean_batch", lambda v: fmt(v, 2)),
           ("queue ms/req", "server_queue_ms_per_request", fmt_ms),
           ("compute ms/req", "server_compute_ms_per_request", fmt_ms)] if has_server else []),
    ]
    headers: Headers = [(esc(name), name in ("step", "mode", "passed")) for name, _, _ in columns]
    cpu = [key for _, key, _ in columns].index("client_cpu_us_per_request")  # marked when bound
    rows = []
    for index, row in enumerate(bench_rows(steps)):
        cells = [form(row[key]) for _, key, form in columns]
        if row["client_bound"] is True:
            cells[cpu] += " \u26a0"
        rows.append(("win" if index == winner else "fail" if row["passed"] is False else "", cells))
    cost = (" Cost: per million inferences (requests \u00d7 items per request), in the "
            "currency of the price per hour." if has_cost else "")
    return (
        "<h2>Steps</h2>\n" + table(headers, rows)
        + '<p class="sub">Latencies are client-side: open-loop steps from each request\'s '
        "scheduled send time, closed-loop steps from the actual send. Green row: the step "
        "that set the max rate; red rows failed the threshold. \u26a0 marks a client "
        f"CPU-bound step.{cost}</p>\n"
    )


def write_bench_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write the ``queryserve bench`` results into ``out_dir`` and return the paths written.

    Files: ``results.json``, ``results.csv`` (one row per step), ``latency_over_time.png``,
    ``latency_vs_throughput.png``, ``batch_sizes.png`` (only when some step has server
    batch data) and ``report.html`` (self-contained, plots embedded). A plot with no data
    at all (no steps, no successful response) is skipped and the page says so.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = dicts(results.get("steps"))
    json_path = write_json(results, out_dir / "results.json")
    csv_path = write_csv(bench_rows(steps), BENCH_COLUMNS, out_dir / "results.csv")
    over_time = plots.latency_over_time(results, out_dir / "latency_over_time.png")
    vs_rate = plots.latency_vs_throughput(results, out_dir / "latency_vs_throughput.png")
    batches = plots.batch_sizes(results, out_dir / "batch_sizes.png")
    body = (
        _warnings(steps)
        + _steps_section(results, steps)
        + "<h2>Plots</h2>\n"
        + figure(over_time, "latency over time", "Latency over time")
        + figure(vs_rate, "latency vs throughput", "Latency vs throughput")
        + (figure(batches, "server batch sizes", "Server batch sizes") if batches else "")
    )
    meta = [("URL", results.get("url")), ("model", results.get("model")),
            ("protocol", results.get("protocol")),
            ("items per request", results.get("items_per_request"))]
    page = write_page(out_dir / "report.html", "bench", results, meta,
                      _headline(results, steps), body)
    plotted = [path for path in (over_time, vs_rate, batches) if path is not None]
    return [json_path, csv_path, *plotted, page]
