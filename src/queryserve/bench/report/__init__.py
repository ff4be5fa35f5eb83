"""Results writers for ``queryserve bench`` and ``queryserve recommend``.

Both writers take the plain, JSON-friendly results dict the commands build and
write machine-readable files (JSON, CSV), PNG plots and one self-contained HTML
page (plots embedded as base64 PNG, inline CSS, no JavaScript, no external
resources) into ``out_dir``. Every field may be missing or None (third-party
servers give no ``server`` block, a run without a price has no costs, a step
with no successful response has empty percentiles); the writers then leave the
cell empty, skip the plot, or say so on the page.

``cost_per_million`` is the cost of a million inferences (requests x items per
request) in the currency of ``--price-per-hour``. A bench result's
``search.step`` is the index into ``steps`` of the step that set the max rate.

Modules: :mod:`.values` (reading and formatting fields), :mod:`.files` (JSON,
CSV), :mod:`.plots` and :mod:`.pareto_plot` (matplotlib, imported lazily),
:mod:`.html` (page pieces), :mod:`.bench` and :mod:`.recommend` (the writers).
"""

from queryserve.bench.pareto import pareto_front
from queryserve.bench.report.bench import write_bench_report
from queryserve.bench.report.recommend import write_recommend_report

__all__ = ["pareto_front", "write_bench_report", "write_recommend_report"]
