"""The ``queryserve recommend`` report: recommend.json/.csv, pareto.png and recommend.html."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from queryserve.bench.pareto import pareto_axes, pareto_front
from queryserve.bench.report.files import (
    extra_percentile,
    param_names,
    recommend_rows,
    write_csv,
    write_json,
)
from queryserve.bench.report.html import Headers, esc, figure, table, write_page
from queryserve.bench.report.pareto_plot import pareto_plot
from queryserve.bench.report.values import (
    DASH,
    as_dict,
    dicts,
    fmt,
    fmt_cost,
    fmt_ms,
    fmt_rate,
    num,
    text,
)


def _front(results: dict[str, Any], points: list[dict[str, Any]]) -> set[str]:
    """Ids on the Pareto front: each point's own ``"pareto"`` flag, as the producer set it;
    for a point without one, whether it is on the front along :func:`pareto_axes`."""
    computed = set(pareto_front(points, *pareto_axes(results)))
    return {
        text(point.get("id"))
        for point in points
        if (point["pareto"] if isinstance(point.get("pareto"), bool)
            else text(point.get("id")) in computed)
    }


def _headline(
    results: dict[str, Any], points: list[dict[str, Any]], percentile: str, bound: str
) -> tuple[str, str]:
    """(headline, sub-line), both escaped: the best point, and how it compares to the default
    configuration (the model.yaml as given) and to the untuned one.

    ``bound`` is the threshold as escaped text, ``percentile`` its percentile key."""
    by_id = {text(point.get("id")): point for point in points}
    best = by_id.get(text(results["best"])) if results.get("best") is not None else None
    if best is None:
        return f"No configuration met {bound}.", ""
    head = (f"Best for {esc(results.get('objective') or 'throughput')}: "
            f"<strong>{esc(best.get('id'))}</strong> \u2014 {fmt_rate(best.get('max_rate'))} "
            f"req/s with {bound} ({esc(percentile)} "
            f"{fmt_ms(as_dict(best.get('latency_ms')).get(percentile))} ms at that rate)")
    if num(best.get("cost_per_million")) is not None:
        head += f", cost {fmt_cost(best.get('cost_per_million'))} per million inferences"
    best_rate = num(best.get("max_rate"))
    sub = []
    # The config as given, and every tuned knob at queryserve's built-in default.
    for key, name in (("default", "default"), ("untuned", "untuned")):
        ref = by_id.get(text(results[key])) if results.get(key) is not None else None
        if ref is None or best_rate is None:
            continue
        if ref is best:
            sub.append(f"The {name} configuration is the best.")
            continue
        ref_rate = num(ref.get("max_rate"))
        if not ref_rate:
            sub.append(f"The {name} configuration {esc(ref.get('id'))} met no tested rate "
                       f"under {bound}.")
        else:
            sub.append(f"{best_rate / ref_rate:.2f}\u00d7 the max rate of the {name} "
                       f"configuration {esc(ref.get('id'))} ({fmt_rate(ref_rate)} req/s).")
    return head, " ".join(sub)


def _points_table(
    results: dict[str, Any], points: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> str:
    """One row per point: its parameters, measurements, Pareto star and error."""
    params = param_names(points)
    extra = extra_percentile(results)
    textual = {name for point in points for name, value in as_dict(point.get("params")).items()
               if value is not None and num(value) is None}
    headers: Headers = [("id", True), *((esc(name), name in textual) for name in params),
                        ("max rate req/s", False), ("p50 ms", False), ("p99 ms", False),
                        *([(f"{esc(extra)} ms", False)] if extra else []),
                        ("cost / 1M inferences", False), ("RSS MB", False), ("Pareto", True),
                        ("error", True)]
    table_rows = []
    for point, row in zip(points, rows, strict=True):
        values = as_dict(point.get("params"))
        tags = "".join(f'<span class="tag">{tag}</span>' for tag in ("best", "default", "untuned")
                       if row[tag] is True)
        cells = [f"{esc(point.get('id'))}{tags}",
                 *(DASH if values.get(name) is None else esc(values[name]) for name in params),
                 *(fmt_rate(row["max_rate"]), fmt_ms(row["p50_ms"]), fmt_ms(row["p99_ms"])),
                 *([fmt_ms(row[f"{extra}_ms"])] if extra else []),
                 fmt_cost(row["cost_per_million"]), fmt(row["rss_mb"], 0),
                 "\u2605 Pareto" if row["pareto"] else "", esc(point.get("error") or "")]
        row_class = "best" if row["best"] is True else "err" if point.get("error") else ""
        table_rows.append((row_class, cells))
    return table(headers, table_rows)


def write_recommend_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write the ``queryserve recommend`` results into ``out_dir``; return the paths written.

    Files: ``recommend.json``, ``recommend.csv`` (one row per point), ``pareto.png``
    (skipped when no point has a plottable value) and ``recommend.html``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    points = dicts(results.get("points"))
    front = _front(results, points)
    columns, rows = recommend_rows(results, points, front)
    json_path = write_json(results, out_dir / "recommend.json")
    csv_path = write_csv(rows, columns, out_dir / "recommend.csv")
    plot = pareto_plot(results, front, out_dir / "pareto.png")

    threshold = as_dict(results.get("threshold"))
    percentile = text(threshold.get("percentile")) or "p99"
    bound = f"{percentile} \u2264 {fmt_ms(threshold.get('ms'))} ms"
    failed = sum(1 for point in points if point.get("error"))
    meta = [("model", results.get("model")), ("objective", results.get("objective")),
            ("threshold", bound),
            ("points", f"{len(points)} ({failed} failed)" if failed else len(points))]
    yaml_text = results.get("best_model_yaml")
    priced = any(num(point.get("cost_per_million")) is not None for point in points)
    cost = " Cost: per million inferences, in the currency of the price per hour." if priced else ""
    body = (
        "<h2>Configurations</h2>\n"
        + _points_table(results, points, rows)
        + '<p class="sub">Max rate: the highest tested rate whose '
        f"{esc(percentile)} latency stayed within the threshold. \u2605: on the Pareto front. "
        f"Bold: the recommended configuration.{cost}</p>\n"
        + (f"<h2>Recommended model.yaml</h2>\n<pre>{esc(yaml_text)}</pre>\n" if yaml_text else "")
        + "<h2>Plot</h2>\n"
        + figure(plot, "Pareto plot", "Max rate vs latency or cost; Pareto front highlighted")
    )
    page = write_page(out_dir / "recommend.html", "recommend", results, meta,
                      _headline(results, points, percentile, esc(bound)), body)
    return [json_path, csv_path, *([plot] if plot else []), page]
