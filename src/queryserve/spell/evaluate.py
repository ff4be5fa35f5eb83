"""`queryserve eval spell`: the trained corrector against SymSpell on held-out text.

Three sets, all from the held-out splits (`spell.data`), drawn with a fixed seed:

- **words**: real misspellings of the held-out words, typed alone (the misspellings that are
  themselves dictionary words, "there" for "their", are left out: no corrector can tell them
  from a correct word without context, and the count left out is reported; the dictionary is
  the misspelling corpus's lexicon and the common English words of `data/english-words`);
- **misspelled queries**: held-out catalog queries with one word misspelled by the noise model
  (learned from the training split's misspellings only);
- **clean queries**: the same held-out queries as they are; any change is a false correction.
  Unseen performer and product names are among them, so this also says whether odd names are
  left alone.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from queryserve.api import normalized
from queryserve.backends.noisy_channel.noise import NoiseModel, align
from queryserve.spell.corrector import Corrector
from queryserve.spell.data import DATA, load_catalog, load_misspellings, load_words


@dataclass(frozen=True)
class EvalSets:
    words: list[tuple[str, str]]  # (typed, meant)
    misspelled: list[tuple[str, str]]
    clean: list[str]
    real_word_errors_left_out: int

    @classmethod
    def build(cls, data: Path = DATA, size: int = 1000, seed: int = 0) -> EvalSets:
        rng = random.Random(seed)
        catalog, misspellings = load_catalog(data), load_misspellings(data)
        lexicon = set(misspellings.lexicon) | set(load_words(data))
        words = [(t, w) for t, w in misspellings.held_out if t not in lexicon and t.isalpha()]
        left_out = len(misspellings.held_out) - len(words)
        noise = NoiseModel.learn(misspellings.train)
        clean = rng.sample(catalog.held_out, min(size, len(catalog.held_out)))
        misspelled = [(typed, q) for q in clean
                      if (typed := noise.corrupt_query(q, rng, replay=False)) != q]
        return cls(rng.sample(words, min(size, len(words))), misspelled, clean, left_out)

    def queries(self) -> list[str]:
        """Every held-out query as typed, misspelled then clean: the optimizer's gate inputs."""
        return [typed for typed, _ in self.misspelled] + self.clean


@dataclass(frozen=True)
class Score:
    corrector: str
    word_accuracy: float
    query_accuracy: float
    false_corrections: float
    query_accuracy_by_edits: dict[str, float]
    queries_per_second: float


def score(corrector: Corrector, sets: EvalSets) -> Score:
    started = time.perf_counter()
    words = corrector.correct([t for t, _ in sets.words])
    misspelled = corrector.correct([t for t, _ in sets.misspelled])
    clean = corrector.correct(sets.clean)
    seconds = time.perf_counter() - started
    right = [c.corrected == normalized(meant)
             for c, (_, meant) in zip(misspelled, sets.misspelled, strict=True)]
    by_edits: dict[str, list[bool]] = {}
    for ok, (typed, meant) in zip(right, sets.misspelled, strict=True):
        edits = len(align(meant, typed))
        by_edits.setdefault("1" if edits == 1 else "2" if edits == 2 else "3+", []).append(ok)
    count = len(words) + len(misspelled) + len(clean)
    return Score(
        corrector.name,
        word_accuracy=_share([c.corrected == w for c, (_, w) in zip(words, sets.words,
                                                                     strict=True)]),
        query_accuracy=_share(right),
        false_corrections=_share([c.changed for c in clean]),
        query_accuracy_by_edits={k: _share(v) for k, v in sorted(by_edits.items())},
        queries_per_second=count / seconds)


def _share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def print_table(scores: Sequence[Score], sets: EvalSets) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="queryserve eval spell (held-out splits)")
    for column in ("corrector", f"word accuracy\n({len(sets.words)} real misspellings)",
                   f"query accuracy\n({len(sets.misspelled)} misspelled)",
                   "query accuracy by edits\n(1 / 2 / 3+)",
                   f"false corrections\n({len(sets.clean)} clean)", "queries/s"):
        table.add_column(column, justify="right")
    for s in scores:
        table.add_row(s.corrector, f"{s.word_accuracy:.1%}", f"{s.query_accuracy:.1%}",
                      " / ".join(f"{v:.0%}" for v in s.query_accuracy_by_edits.values()),
                      f"{s.false_corrections:.1%}", f"{s.queries_per_second:.0f}")
    Console().print(table)
    print(f"left out: {sets.real_word_errors_left_out} held-out misspellings that are "
          "themselves dictionary words (or not alphabetic)")
