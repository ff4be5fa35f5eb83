"""The dictionary baseline: the `symspellpy` library's SymSpell, whole queries through
`lookup_compound`, the version of SymSpell users know.

Its dictionary is what the noisy channel knows as correctly spelled (`data.dictionary_texts`:
the training catalog's queries, the misspelling corpus's lexicon and common English words),
each word counted as often as it occurs there; the catalog's adjacent word pairs are its
bigrams, which `lookup_compound` uses to choose how to split a run-together word ("taylorswift").
Edit distance 2 and a 7-letter prefix, SymSpell's defaults. Words with digits (model numbers,
years) are left as typed; a query is split at spaces only, so "x-men" and "kids'" stay whole.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from queryserve.api import Correction


class SymSpellPy:
    name = "symspellpy"

    def __init__(self, texts: Iterable[str], max_distance: int = 2, prefix: int = 7,
                 bigrams: bool = True) -> None:
        from symspellpy import SymSpell  # type: ignore[import-untyped]

        self.max_distance = max_distance
        self.spell: Any = SymSpell(max_dictionary_edit_distance=max_distance,
                                   prefix_length=prefix)
        words: Counter[str] = Counter()
        pairs: Counter[str] = Counter()
        for text in texts:
            tokens = text.split()
            words.update(tokens)
            pairs.update(f"{a} {b}" for a, b in pairwise(tokens))
        for word, count in words.items():
            self.spell.create_dictionary_entry(word, count)
        if bigrams and pairs:
            # The library reads bigrams from a file only ("first second count" lines).
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "bigrams.txt"
                path.write_text("".join(f"{pair} {count}\n" for pair, count in pairs.items()))
                self.spell.load_bigram_dictionary(path, 0, 2)

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        out = []
        for query in queries:
            typed = " ".join(query.lower().split())
            [best] = self.spell.lookup_compound(
                typed, self.max_distance, ignore_non_words=True, split_by_space=True,
                ignore_term_with_digits=True) if typed else [None]
            corrected = best.term if best is not None else typed
            out.append(Correction(query, corrected, corrected != typed, 1.0))
        return out
