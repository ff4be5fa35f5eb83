"""`queryserve eval spell`'s tables: each figure as "share (95% interval)", in points."""

from __future__ import annotations

from collections.abc import Sequence

from queryserve.spell.evaluate import SpellSets
from queryserve.spell.scoring import Score, SetScore

GROUP_NAMES = {"1": "1 edit", "2": "2 edits", "3+": "3+ edits", "real": "real misspellings"}


def print_tables(scores: Sequence[Score], sets: SpellSets) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    seeds = ", ".join(str(s) for s in sets.seeds)
    common = Table(title=f"queryserve eval spell: held-out splits, noise seeds {seeds}; "
                         "95% Wilson intervals")
    common.add_column("corrector", justify="right", no_wrap=True)
    for column in (f"false corrections\n({len(sets.clean)} clean queries)",
                   f"word accuracy\n({len(sets.words)} real misspellings alone)", "queries/s"):
        common.add_column(column, justify="right")
    for s in scores:
        common.add_row(s.corrector, s.false_corrections.shown(), s.word_accuracy.shown(),
                       f"{s.queries_per_second:.0f}")
    console.print(common)
    for title, pick, typos in (
            ("hard set: one word misspelled by the project's noise model",
             _hard, sets.hard),
            ("realistic set: keyboard typos (1-2 edits) and real misspellings in queries",
             _realistic, sets.realistic)):
        groups = list(dict.fromkeys(g for s in scores for g in pick(s).by_group))
        table = Table(title=f"{title} ({len(typos)} queries)")
        table.add_column("corrector", justify="right", no_wrap=True)
        table.add_column("query accuracy", justify="right")
        for g in groups:
            count = next(pick(s).by_group[g].total for s in scores if g in pick(s).by_group)
            table.add_column(f"{GROUP_NAMES.get(g, g)}\n({count})", justify="right")
        for s in scores:
            table.add_row(s.corrector, pick(s).query_accuracy.shown(),
                          *[r.shown() if (r := pick(s).by_group.get(g)) else "-"
                            for g in groups])
        console.print(table)
    print(f"left out: {sets.real_word_errors_left_out} held-out misspellings that are "
          "themselves dictionary words (or not alphabetic)")


def _hard(score: Score) -> SetScore:
    return score.hard


def _realistic(score: Score) -> SetScore:
    return score.realistic
