"""The dictionary baseline: SymSpell (Wolf Garbe's symmetric delete algorithm), word by word.

Every dictionary word's deletions (up to `max_distance` characters, within its first
`prefix` characters) index the words they come from; a typed word's own deletions find its
candidates in a few dictionary probes, and the nearest by Damerau distance wins, the most
frequent among equals (then the first in alphabetical order). A word already in the
dictionary, or with digits or no letters (model numbers, years), is kept as typed. The
dictionary is the same text the model trains on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from queryserve.api import Correction
from queryserve.backends.noisy_channel.deletions import deletions
from queryserve.backends.noisy_channel.noise import align


class SymSpell:
    name = "symspell"

    def __init__(self, texts: Iterable[str], max_distance: int = 2, prefix: int = 7) -> None:
        self.max_distance, self.prefix = max_distance, prefix
        self.counts: Counter[str] = Counter(w for text in texts for w in text.split())
        self.index: dict[str, list[str]] = defaultdict(list)
        for word in self.counts:
            for key in deletions(word[:prefix], max_distance, shortest=1):
                self.index[key].append(word)

    def word(self, typed: str) -> str:
        if typed in self.counts or not any(c.isalpha() for c in typed) or \
                any(c.isdigit() for c in typed):
            return typed
        candidates = {w for key in deletions(typed[:self.prefix], self.max_distance, shortest=1)
                      for w in self.index.get(key, ())}
        # Ties go to the alphabetically first word, so that a run does not depend on the set
        # order that string hashing gives each process.
        best, best_key = typed, (self.max_distance + 1, 0, "")
        for candidate in candidates:
            if abs(len(candidate) - len(typed)) > self.max_distance:
                continue
            distance = len(align(candidate, typed))
            key = (distance, -self.counts[candidate], candidate)
            if distance <= self.max_distance and key < best_key:
                best, best_key = candidate, key
        return best

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        out = []
        for query in queries:
            typed = " ".join(query.lower().split())
            corrected = " ".join(self.word(w) for w in typed.split())
            out.append(Correction(query, corrected, corrected != typed, 1.0))
        return out
