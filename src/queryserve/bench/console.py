"""The terminal side of `queryserve bench` and `queryserve recommend`: a live bar per step, a
line per finished step, and a closing summary.

The bar is redrawn from the load generator's own event loop twice a second (no refresh
thread), so the display costs the measured run almost nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from queryserve.bench.bench import StepObserver

_REDRAW_S = 0.5


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def step_line(rec: dict[str, Any]) -> str:
    """One finished step in a line: what was offered, what came back, how fast, pass/fail."""
    lat = rec["latency_ms"]
    failures = {k: v for k, v in rec["by_status"].items() if not k.startswith("2")}
    if rec["errors"]:
        failures["errors"] = rec["errors"]
    if rec["timeouts"]:
        failures["timeouts"] = rec["timeouts"]
    verdict = {True: "[green]pass[/]", False: "[red]fail[/]", None: ""}[rec["passed"]]
    server = rec.get("server") or {}
    batch = f" batch {server['mean_batch']}" if server.get("mean_batch") else ""
    bad = " ".join(f"{k}:{v}" for k, v in failures.items())
    warn = "  [yellow]client CPU-bound[/]" if rec["client_bound"] else ""
    return (f"{rec['label']:>14}  {rec['throughput']:>9,.1f} req/s  "
            f"p50 {_ms(lat.get('p50')):>7}  p99 {_ms(lat.get('p99')):>7} ms"
            f"{batch}  {bad}  {verdict}{warn}")


class LiveSteps(StepObserver):
    """A progress bar for the running step; a summary line for each finished one."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(),
            console=self.console, auto_refresh=False, transient=True)
        self.task: Any = None
        self.handle: asyncio.TimerHandle | None = None
        self.t0 = 0.0

    def step_started(self, label: str, seconds: float) -> None:
        self.progress.start()
        self.t0 = time.monotonic()
        self.task = self.progress.add_task(f"measuring {label}", total=seconds)
        self._redraw()

    def _redraw(self) -> None:
        self.progress.update(self.task, completed=time.monotonic() - self.t0)
        self.progress.refresh()
        self.handle = asyncio.get_running_loop().call_later(_REDRAW_S, self._redraw)

    def step_finished(self, record: dict[str, Any]) -> None:
        if self.handle is not None:
            self.handle.cancel()
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.stop()
        self.console.print(step_line(record), highlight=False)


class PlainSteps(StepObserver):
    """`--no-progress`: one plain line per finished step (logs, CI, scripts)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, no_color=True, highlight=False)

    def step_finished(self, record: dict[str, Any]) -> None:
        self.console.print(step_line(record), markup=True, highlight=False)


def print_summary(results: dict[str, Any], written: list[str], console: Console) -> None:
    """The headline, the steps as a table, warnings and where the files went."""
    steps = results["steps"]
    priced = results.get("price_per_hour") is not None
    judged = any(rec["passed"] is not None for rec in steps)
    table = Table(title=f"queryserve bench: {results['url']}", title_justify="left")
    columns = ["step", "req/s", "p50", "p99", "p99.9", "fail", "batch", "queue", "compute"]
    columns += ["cost/M"] * priced + ["pass"] * judged
    for name in columns:
        table.add_column(name, justify="left" if name == "step" else "right", no_wrap=True)
    for rec in steps:
        lat = rec["latency_ms"]
        server = rec.get("server") or {}
        bad = sum(v for k, v in rec["by_status"].items() if not k.startswith("2"))
        cost = rec["cost_per_million"]
        row = [rec["label"], f"{rec['throughput']:,.1f}", _ms(lat.get("p50")),
               _ms(lat.get("p99")), _ms(lat.get("p99.9")),
               str(bad + rec["errors"] + rec["timeouts"]), str(server.get("mean_batch") or "-"),
               _ms(server.get("queue_ms_per_request")),
               _ms(server.get("compute_ms_per_request"))]
        row += ["-" if cost is None else f"{cost:.4f}"] * priced
        row += [{True: "yes", False: "no", None: ""}[rec["passed"]]] * judged
        table.add_row(*row)
    table.caption = ("latency in ms (p50/p99/p99.9 at the client; queue and compute per request "
                     "at the server); fail = non-2xx + errors + timeouts" +
                     ("; cost/M = cost per million inferences, in the currency of "
                      "--price-per-hour" if priced else ""))
    console.print(table)
    search = results.get("search")
    if search:
        capped = " or more: the --max-rate ceiling, raise it" if search.get("capped") else ""
        console.print(f"[bold]max rate with {search['percentile']} <= "
                      f"{search['threshold_ms']:g} ms: {search['max_rate']:,.0f} req/s{capped}[/]")
    if results.get("stop_reason"):
        console.print(f"stopped: {results['stop_reason']}")
    bound = [rec["label"] for rec in results["steps"] if rec["client_bound"]]
    if bound:
        console.print(f"[yellow]warning: the load generator was CPU-bound at {', '.join(bound)}; "
                      "those figures understate the server[/]")
    for path in written:
        console.print(f"wrote {path}", highlight=False)


def point_tags(point: dict[str, Any]) -> str:
    """" (default)", " (untuned)" or both: which reference configs a recommend point is."""
    tags = [tag for tag in ("default", "untuned") if point.get(tag)]
    return f" ({', '.join(tags)})" if tags else ""


def gains(results: dict[str, Any]) -> list[str]:
    """The best point against the two references: the config as given (`default`) and every
    tuned knob at its built-in default (`untuned`), e.g. "1.60x the untuned config (500
    req/s)"."""
    points = {p["id"]: p for p in results["points"]}
    best = points.get(results.get("best") or "")
    out = []
    for key, name in (("default", "current"), ("untuned", "untuned")):
        ref = points.get(results.get(key) or "")
        if best is None or ref is None:
            continue
        if ref is best:
            out.append(f"it is the {name} config")
        elif ref.get("max_rate"):
            out.append(f"{best['max_rate'] / ref['max_rate']:.2f}x the {name} config "
                       f"({ref['max_rate']:,.0f} req/s)")
        else:
            out.append(f"the {name} config met no tested rate")
    return out


def print_recommendation(results: dict[str, Any], written: list[str], console: Console) -> None:
    """The points as a table (Pareto front starred, the winner in bold), then the verdict."""
    threshold = results["threshold"]
    pct = threshold["percentile"]
    priced = results.get("price_per_hour") is not None
    table = Table(title=f"queryserve recommend: {results['model']}, {pct} <= "
                        f"{threshold['ms']:g} ms", title_justify="left")
    columns = ["point", "req/s", "p50", pct, "RSS MB"] + ["cost/M"] * priced + ["pareto"]
    for name in columns:
        table.add_column(name, justify="left" if name == "point" else "right", no_wrap=True)
    for p in sorted(results["points"], key=lambda p: -(p.get("max_rate") or 0)):
        lat = p.get("latency_ms") or {}
        name = p["id"] + point_tags(p)
        rate = ((">= " if p.get("capped") else "") + f"{p['max_rate']:,.0f}"
                if not p.get("error") else "error")
        row = [name, rate, _ms(lat.get("p50")), _ms(lat.get(pct)),
               "-" if p.get("rss_mb") is None else f"{p['rss_mb']:.0f}"]
        cost = p.get("cost_per_million")
        row += ["-" if cost is None else f"{cost:.4f}"] * priced
        row += ["*" if p.get("pareto") else ""]
        table.add_row(*row, style="bold" if p.get("best") else None)
    table.caption = (f"req/s: highest rate with {pct} <= {threshold['ms']:g} ms and no errors; "
                     f"latency in ms there; * = Pareto front; bold = best "
                     f"({results['objective']})")
    console.print(table)
    points = {p["id"]: p for p in results["points"]}
    best = points.get(results.get("best") or "")
    if best is None:
        console.print("[red]no configuration met the bar[/]")
    else:
        console.print(f"[bold]best: {best['id']}[/], {best['max_rate']:,.0f} req/s"
                      + "".join(f"; {gain}" for gain in gains(results)))
        if best.get("capped"):
            console.print("[yellow]its rate is the --max-rate ceiling: points that reach it "
                          "are told apart by latency alone; raise --max-rate to compare "
                          "their throughput[/]")
    for path in written:
        console.print(f"wrote {path}", highlight=False)
