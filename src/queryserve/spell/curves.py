"""The auto-correct trade-off (`queryserve eval spell --curves PNG`): each corrector's query
accuracy against its false corrections as its threshold moves from 0 to 1, on both misspelled
sets, and the accuracy it reaches at a given false-correction rate.

One threshold per corrector compares little: the hybrid at 0.8 and the channel at 0.5 change
different shares of right queries. At equal false corrections they can be compared, and the
rate is what a search team sets ("at most 1 in 100 right queries changed"). A corrector
reaches a rate by the highest accuracy of any threshold at or under it, interpolated between
thresholds (the curve's upper envelope): none reaches a rate under its lowest one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from queryserve.spell.evaluate import SpellSets
from queryserve.spell.scoring import Answers, Score, at_min_score, score

THRESHOLDS = tuple(i / 100 for i in range(101))
RATES = (0.005, 0.01, 0.02)
"""The false-correction rates `print_rates` reads each curve at."""
SETS = ("hard", "realistic")
KEYS = (*SETS, "words")  # what a curve reads at a rate


@dataclass(frozen=True)
class Point:
    min_score: float
    false_corrections: float
    hard: float  # query accuracy on the hard set
    realistic: float
    words: float  # word accuracy on the real misspellings alone


@dataclass(frozen=True)
class Curve:
    corrector: str
    points: tuple[Point, ...]  # by threshold, lowest first

    def at(self, rate: float, key: str) -> float | None:
        """The accuracy (`key`: hard, realistic or words) at `rate` false corrections, on the
        upper envelope; None under the corrector's lowest rate."""
        envelope: list[tuple[float, float]] = []
        for fc, value in sorted((p.false_corrections, getattr(p, key)) for p in self.points):
            value = max(value, envelope[-1][1]) if envelope else value
            if envelope and fc == envelope[-1][0]:
                envelope[-1] = (fc, value)
            else:
                envelope.append((fc, value))
        if not envelope or rate < envelope[0][0]:
            return None
        for (x0, y0), (x1, y1) in itertools.pairwise(envelope):
            if x0 <= rate <= x1:
                return y0 + (y1 - y0) * (rate - x0) / (x1 - x0)
        return envelope[-1][1]  # past the rate of no threshold: what the corrector does

    def at_rates(self) -> dict[float, tuple[float | None, ...]]:
        """(hard, realistic, words) at each of `RATES`."""
        return {rate: tuple(self.at(rate, key) for key in KEYS) for rate in RATES}


def sweep(answers: Answers, sets: SpellSets, thresholds: Sequence[float] = THRESHOLDS) -> Curve:
    """The corrector's point at each threshold, from answers given once."""
    points = []
    for t in thresholds:
        s = score(at_min_score(answers, t), sets, t)
        points.append(Point(t, s.false_corrections.share, s.hard.query_accuracy.share,
                            s.realistic.query_accuracy.share, s.word_accuracy.share))
    return Curve(answers.corrector, tuple(points))


def to_json(curves: Sequence[Curve], fixed: Sequence[Score]) -> dict[str, Any]:
    """Every curve's points, and each corrector's accuracy at each of `RATES` (None: never
    that low), for `--curves`'s JSON beside the plot."""
    return {"rates": list(RATES), "correctors": [
        {"corrector": c.corrector, "points": [asdict(p) for p in c.points],
         "at": {f"{rate:g}": dict(zip(KEYS, values, strict=True))
                for rate, values in c.at_rates().items()}}
        for c in [*curves, *(point(s) for s in fixed)]]}


def print_rates(curves: Sequence[Curve], fixed: Sequence[Score]) -> None:
    """Each corrector's accuracy at each of `RATES`; a corrector without a score
    (`fixed`, symspellpy) has one rate of its own."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="at equal false corrections: hard / realistic query accuracy, "
                        "word accuracy (-: the corrector never gets that low)")
    table.add_column("corrector", justify="right", no_wrap=True)
    for rate in RATES:
        table.add_column(f"at {rate:.1%}", justify="right")
    rows = [(c.corrector, c) for c in curves] + [
        (f"{s.corrector} (no score: {s.false_corrections.share:.1%})", point(s)) for s in fixed]
    for name, curve in rows:
        table.add_row(name, *[" / ".join("-" if v is None else f"{v:.1%}" for v in values)
                              for values in curve.at_rates().values()])
    Console().print(table)


def point(s: Score) -> Curve:
    """A corrector without a score as a curve of its one point."""
    return Curve(s.corrector, (Point(0.0, s.false_corrections.share,
                                     s.hard.query_accuracy.share,
                                     s.realistic.query_accuracy.share, s.word_accuracy.share),))


def plot(curves: Sequence[Curve], fixed: Sequence[Score], marked: Sequence[float],
         path: Path) -> Path:
    """Query accuracy against false corrections, one panel per set: a line per corrector,
    dots at the `marked` thresholds, a cross per corrector without a score."""
    from queryserve.bench.report.plots import new_figure, save

    fig = new_figure(11, 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    right = 1.1 * 100 * max([p.false_corrections for c in curves for p in c.points]
                            + [s.false_corrections.share for s in fixed] + [0.02])
    for ax, name in zip(axes, SETS, strict=True):
        for i, curve in enumerate(curves):
            colour = f"C{i}"
            xs = [100 * p.false_corrections for p in curve.points]
            ax.plot(xs, [100 * getattr(p, name) for p in curve.points], color=colour,
                    label=curve.corrector)
            dots = [p for p in curve.points if any(abs(p.min_score - m) < 1e-9
                                                   for m in marked)]
            ax.scatter([100 * p.false_corrections for p in dots],
                       [100 * getattr(p, name) for p in dots], color=colour, s=18, zorder=3)
            for p in dots:
                ax.annotate(f"{p.min_score:g}", (100 * p.false_corrections,
                                                 100 * getattr(p, name)),
                            textcoords="offset points", xytext=(4, -10), fontsize=7,
                            color=colour)
        for j, s in enumerate(fixed):
            ax.scatter([100 * s.false_corrections.share],
                       [100 * getattr(s, name).query_accuracy.share], marker="x", s=40,
                       color=f"C{len(curves) + j}", label=s.corrector, zorder=3)
        ax.axvline(1.0, color="#9a9a9a", linestyle="--", linewidth=1)
        # Linear to 1% (where the choice is made), logarithmic past it (symspellpy's 10%+).
        ax.set_xscale("symlog", linthresh=1.0)
        ticks = [t for t in (0, 0.25, 0.5, 0.75, 1, 2, 5, 10, 20, 50) if t <= right]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlim(0, right)
        ax.set_xlabel("false corrections: right queries changed (%)")
        ax.set_title(f"{name} set")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("misspelled queries corrected (%)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("auto-correct: accuracy against false corrections as the threshold moves "
                 "(dots: thresholds asked for; dashed: 1%)", fontsize=10)
    return save(fig, path)
