"""Building the self-contained HTML pages: inline CSS, no JavaScript, plots as base64 PNG.

Every value from the results is escaped with :func:`esc`; functions taking
"escaped" text insert it as is.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from queryserve.bench.report.values import DASH, as_dict, num, text

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
 color:#1d1d1f;max-width:1180px;margin:1.5rem auto;padding:0 1rem;line-height:1.4}
h1{font-size:1.45rem;margin-bottom:.3rem}h2{font-size:1.15rem;margin-top:1.8rem}
table{border-collapse:collapse;font-size:.84rem;font-variant-numeric:tabular-nums}
table.meta td{padding:.1rem 1rem .1rem 0;vertical-align:top}
table.meta td:first-child{color:#666}
table.data th,table.data td{border-bottom:1px solid #ddd;padding:.25rem .45rem;text-align:right;
 white-space:nowrap}
table.data th{background:#f3f4f6;position:sticky;top:0}
table.data td.l,table.data th.l{text-align:left}
tr.fail td{background:#fdecea}tr.win td{background:#e3f4e8;font-weight:600}
tr.best td{font-weight:700;background:#e3f4e8}tr.err td{color:#888}
.wrap{overflow-x:auto}
.headline{font-size:1.2rem;padding:.7rem 1rem;background:#eef3fb;border-left:5px solid #1f77b4}
.sub{color:#555;font-size:.95rem}
.warn{background:#fff6dd;border-left:5px solid #e6a100;padding:.4rem 1rem}
.warn li{margin:.2rem 0}
.tag{font-size:.72rem;padding:0 .35rem;border-radius:.3rem;background:#ddd;margin-left:.3rem}
figure{margin:1rem 0}figcaption{color:#555;font-size:.85rem}
img{max-width:100%;height:auto;border:1px solid #e5e5e5}
pre{background:#f6f8fa;padding: .8rem 1rem;overflow:auto;font-size:.85rem}
code{font-size:.9em}
"""

Headers = list[tuple[str, bool]]  # (escaped text, left-aligned)


def esc(value: Any) -> str:
    """HTML-escaped text of a value from the results."""
    return html.escape(text(value), quote=True)


def machine_text(machine: Any) -> str:
    """"CPU, N cores, Python X, other: value" from the ``machine`` block."""
    info = as_dict(machine)
    parts = [text(info["cpu"])] if info.get("cpu") is not None else []
    if info.get("cores") is not None:
        parts.append(f"{text(info['cores'])} cores")
    if info.get("python") is not None:
        parts.append(f"Python {text(info['python'])}")
    parts += [f"{key}: {text(value)}" for key, value in info.items()
              if key not in ("cpu", "cores", "python") and value is not None]
    return ", ".join(parts) if parts else (text(machine) or DASH)


def _meta_table(results: dict[str, Any], rows: list[tuple[str, Any]]) -> str:
    """The run's facts: command, date and machine, then ``rows``, then the price."""
    price = num(results.get("price_per_hour"))
    rows = [("command", results.get("command")), ("date", results.get("started_at")),
            ("machine", machine_text(results.get("machine"))), *rows,
            ("price per hour", f"{price:g}" if price is not None else "not given (no costs)")]
    cells = "".join(f"<tr><td>{esc(name)}</td><td>{esc(value) if text(value) else DASH}</td></tr>\n"
                    for name, value in rows)
    return f'<table class="meta">\n{cells}</table>\n'


def figure(path: Path | None, alt: str, caption: str) -> str:
    """The PNG at ``path`` embedded with a caption, or a line saying there was nothing to plot."""
    if path is None:
        return f'<p class="sub">{esc(caption)}: no data to plot.</p>\n'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(caption)} ({esc(path.name)})</figcaption></figure>\n")


def table(headers: Headers, rows: list[tuple[str, list[str]]]) -> str:
    """A data table; rows are (tr class or "", escaped cells)."""

    def cell(tag: str, left: bool, content: str) -> str:
        return f'<{tag} class="l">{content}</{tag}>' if left else f"<{tag}>{content}</{tag}>"

    head = "".join(cell("th", left, content) for content, left in headers)
    body = "\n".join(
        (f'<tr class="{row_class}">' if row_class else "<tr>")
        + "".join(cell("td", left, c) for (_, left), c in zip(headers, cells, strict=True))
        + "</tr>"
        for row_class, cells in rows
    )
    return (f'<div class="wrap"><table class="data">\n<thead><tr>{head}</tr></thead>\n'
            f"<tbody>\n{body}\n</tbody></table></div>\n")


def write_page(
    path: Path,
    command: str,
    results: dict[str, Any],
    meta: list[tuple[str, Any]],
    headline: tuple[str, str],
    body: str,
) -> Path:
    """Write the page of ``queryserve <command>``: heading, facts (common ones plus ``meta``),
    the (headline, sub-line) box, both escaped, then ``body``."""
    title = f"queryserve {command} {text(results.get('model'))}"
    sub = f'<br><span class="sub">{headline[1]}</span>' if headline[1] else ""
    path.write_text(
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>queryserve {esc(command)} \u2014 {esc(results.get('model') or 'model')}</h1>\n"
        f'{_meta_table(results, meta)}<p class="headline">{headline[0]}{sub}</p>\n{body}\n'
        "</body>\n</html>\n",
        encoding="utf-8",
    )
    return path
