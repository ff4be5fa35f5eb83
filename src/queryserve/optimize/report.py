"""The terminal report of `queryserve optimize`: before and after, and every variant's gate."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from queryserve.optimize.plan import Plan, PrepareReport, Speed


def print_report(report: PrepareReport, plan: Plan, out: Path,
                 console: Console | None = None) -> None:
    # Piped output gets rich's 80 columns by default, too narrow for these tables.
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    speed = Table(title=f"{plan.source.name} -> {out} ({plan.source.task})", title_justify="left")
    for column in ("", "size (MB)", "load (s)", "batch 1 (ms/query)", "batch 32 (queries/s)"):
        speed.add_column(column, justify="left" if not column else "right")
    written = f"{report.engine} {report.chosen} (written)"
    rows: list[tuple[str, Speed | None]] = [("PyTorch fp32 (original)", report.before),
                                            (written, report.after)]
    for label, figures in rows:
        if figures is not None:
            speed.add_row(label, f"{figures.size_mb:.1f}", f"{figures.load_s:.2f}",
                          f"{figures.batch_1_ms:.2f}", f"{figures.batch_32_per_s:.0f}")
    if report.before and report.after:
        speed.add_row("speed-up", f"{report.before.size_mb / report.after.size_mb:.1f}x smaller",
                      "", f"{report.before.batch_1_ms / report.after.batch_1_ms:.1f}x",
                      f"{report.after.batch_32_per_s / report.before.batch_32_per_s:.1f}x")
    console.print(speed)
    gates = Table(title="accuracy gate against the original, on real inputs",
                  title_justify="left")
    for column in ("variant", "gate", "parity", "batch 1 / 32 (q/s)", "file"):
        gates.add_column(column)
    notes = []
    for variant in report.variants:
        parity = variant.parity
        verdict = ("[green]pass[/]" if variant.passed else
                   "[red]not built[/]" if parity is None else "[red]miss[/]")
        if parity is not None and not parity.passed:
            notes.append(f"{variant.name} misses its {variant.precision} gate by "
                         f"{parity.shortfall()}")
            for text, original, changed in variant.differences[:2]:
                notes.append(f"  e.g. {text!r}: original {original!r}, {variant.name} "
                             f"{changed!r}")
        if variant.error:
            notes.append(f"{variant.name} was not built: {variant.error.splitlines()[0][:300]}")
        rates = " / ".join(f"{q:.0f}" for q in variant.queries_per_second.values())
        gates.add_row(variant.name, verdict, parity.brief() if parity else "-", rates or "-",
                      variant.file or "-")
    console.print(gates)
    for note in notes:
        console.print(f"  {note}", soft_wrap=True)
    console.print(f"chose {report.chosen}: {report.reason}")
    if report.forced:
        console.print("[bold red]written with --force although it misses its gate[/]")
    console.print(f"wrote {out}/ ({report.model_path.name}, tokenizer.json, model.yaml, "
                  f"{report.report_path.name}) in {report.elapsed_s:.0f} s")
