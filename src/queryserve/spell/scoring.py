"""Scores of a corrector on `SpellSets`, each a share with its 95% Wilson interval.

A corrector answers every distinct text once (`answer`); a served threshold is applied to those
answers afterwards (`at_min_score`, the rule of `corrector.Confident`), so scoring a corrector
at several thresholds costs one run. The intervals pool the noise seeds: the same queries under
three draws of typos are not three independent samples, so they are a little narrower than the
truth for query accuracy (the clean set and the words are scored once, without that caveat).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from queryserve.api import Correction, normalized
from queryserve.spell.corrector import Confident, Corrector
from queryserve.spell.evaluate import SpellSets
from queryserve.spell.intervals import Rate
from queryserve.spell.typos import Typo

CHUNK = 256
"""Texts per call to a corrector, so that a progress display can move."""


@dataclass(frozen=True)
class Answers:
    """A corrector's answers to every text of the sets, and how fast it gave them."""
    corrector: str
    corrections: Mapping[str, Correction]
    queries_per_second: float


@dataclass(frozen=True)
class SetScore:
    """Query accuracy on one misspelled set, overall and by group: the number of edits in the
    typo ("1", "2", "3+"), and for the realistic set the real misspellings apart ("real")."""
    query_accuracy: Rate
    by_group: dict[str, Rate]


@dataclass(frozen=True)
class Score:
    corrector: str
    min_score: float | None  # the auto-correct threshold applied, if any
    word_accuracy: Rate
    false_corrections: Rate
    hard: SetScore
    realistic: SetScore
    queries_per_second: float

    def to_json(self) -> dict[str, Any]:
        """Everything, plus the hard set's shares under the keys the figures had before the
        realistic set (benchmark section 8 reads them)."""
        return {"corrector": self.corrector, "min_score": self.min_score,
                "word_accuracy": self.word_accuracy.share,
                "query_accuracy": self.hard.query_accuracy.share,
                "false_corrections": self.false_corrections.share,
                "query_accuracy_by_edits": {k: r.share for k, r in self.hard.by_group.items()},
                "queries_per_second": self.queries_per_second,
                "words": asdict(self.word_accuracy), "clean": asdict(self.false_corrections),
                "hard": asdict(self.hard), "realistic": asdict(self.realistic)}


def answer(corrector: Corrector, texts: Sequence[str],
           advance: Callable[[int], None] = lambda _: None) -> Answers:
    """`corrector`'s answer to each text, `CHUNK` at a time (`advance` is told how many)."""
    corrections: dict[str, Correction] = {}
    started = time.perf_counter()
    for start in range(0, len(texts), CHUNK):
        chunk = texts[start:start + CHUNK]
        corrections.update(zip(chunk, corrector.correct(chunk), strict=True))
        advance(len(chunk))
    seconds = time.perf_counter() - started
    return Answers(corrector.name, corrections, len(texts) / seconds if seconds else 0.0)


class _Answered:
    """Stored answers behind the `Corrector` interface, for `Confident` to threshold."""

    def __init__(self, answers: Answers) -> None:
        self.name, self.answers = answers.corrector, answers.corrections

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        return [self.answers[q] for q in queries]


def at_min_score(answers: Answers, min_score: float) -> Answers:
    """The answers of the corrector as an auto-correct that changes a query only at
    `min_score` or above."""
    confident = Confident(_Answered(answers), min_score)
    texts = list(answers.corrections)
    return Answers(confident.name, dict(zip(texts, confident.correct(texts), strict=True)),
                   answers.queries_per_second)


def score(answers: Answers, sets: SpellSets, min_score: float | None = None) -> Score:
    said = answers.corrections
    return Score(
        answers.corrector, min_score,
        word_accuracy=Rate.of(said[t].corrected == w for t, w in sets.words),
        false_corrections=Rate.of(said[q].changed for q in sets.clean),
        hard=_set_score(said, sets.hard), realistic=_set_score(said, sets.realistic),
        queries_per_second=answers.queries_per_second)


def _set_score(said: Mapping[str, Correction], typos: Sequence[Typo]) -> SetScore:
    right = [said[t.typed].corrected == normalized(t.meant) for t in typos]
    groups: dict[str, list[bool]] = {}
    for ok, typo in zip(right, typos, strict=True):
        groups.setdefault(typo.group, []).append(ok)
    order = {"1": 0, "2": 1, "3+": 2, "real": 3}
    return SetScore(Rate.of(right), {g: Rate.of(groups[g])
                                     for g in sorted(groups, key=lambda g: order.get(g, 9))})
