"""A typo model learned from real misspellings: which edits people make, how many, and where.

Each (misspelling, word) pair is aligned by optimal string alignment (Levenshtein plus adjacent
swaps); the edits are counted by kind (substitute, insert, delete, swap), by the characters
involved and by where in the word they fall (five relative positions: people rarely get the
first letter wrong). `corrupt` samples the same way: a number of edits from the observed
distribution, each edit of an observed kind at an observed place with observed characters. So
"recieve" and "definately" come out as often as they do in real text, and "xqz" noise does not.

With `replay`, a word that has real misspellings in the training split is, half the time,
replaced by one of them as they were written.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

BUCKETS = 5
MAX_EDITS = 3
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def length_bucket(word: str) -> int:
    return min(len(word), 12) // 3  # 0-2, 3-5, 6-8, 9-11, 12+ letters


def position_bucket(position: int, length: int) -> int:
    return min(BUCKETS - 1, position * BUCKETS // max(1, length))


def align(word: str, typo: str) -> list[tuple[str, int, str, str]]:
    """The edits that turn `word` into `typo`: (kind, position in word, from, to)."""
    n, m = len(word), len(typo)
    d = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        d[i][0] = i
    for j in range(m + 1):
        d[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (word[i - 1] != typo[j - 1]))
            if (i > 1 and j > 1 and word[i - 1] == typo[j - 2]
                    and word[i - 2] == typo[j - 1]):
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    edits: list[tuple[str, int, str, str]] = []
    i, j = n, m
    while i > 0 or j > 0:
        if (i > 1 and j > 1 and word[i - 1] == typo[j - 2] and word[i - 2] == typo[j - 1]
                and d[i][j] == d[i - 2][j - 2] + 1 and word[i - 1] != word[i - 2]):
            edits.append(("swap", i - 2, word[i - 2:i], typo[j - 2:j]))
            i, j = i - 2, j - 2
        elif i > 0 and j > 0 and d[i][j] == d[i - 1][j - 1] + (word[i - 1] != typo[j - 1]):
            if word[i - 1] != typo[j - 1]:
                edits.append(("substitute", i - 1, word[i - 1], typo[j - 1]))
            i, j = i - 1, j - 1
        elif i > 0 and d[i][j] == d[i - 1][j] + 1:
            edits.append(("delete", i - 1, word[i - 1], ""))
            i -= 1
        else:
            edits.append(("insert", i, "", typo[j - 1]))
            j -= 1
    return edits[::-1]


@dataclass
class NoiseModel:
    # How many edits, by word length: a 4-letter word with three edits is another word.
    edit_counts: dict[int, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    kinds: Counter[tuple[str, int]] = field(default_factory=Counter)  # (kind, bucket)
    substitutes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    inserts: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    replay: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def learn(cls, pairs: Sequence[tuple[str, str]]) -> NoiseModel:
        model = cls()
        for typo, word in pairs:
            edits = align(word, typo)
            if not edits:
                continue
            model.replay[word].append(typo)
            model.edit_counts[length_bucket(word)][min(len(edits), MAX_EDITS)] += 1
            for kind, position, old, new in edits:
                model.kinds[(kind, position_bucket(position, len(word)))] += 1
                if kind == "substitute":
                    model.substitutes[old][new] += 1
                elif kind == "insert":
                    # What is typed extra depends most on the letter before (doubling).
                    model.inserts[word[position - 1] if position else "^"][new] += 1
        return model

    def corrupt_word(self, word: str, rng: random.Random, replay: bool = True) -> str:
        """One misspelling of `word` (never `word` itself, unless it is too short to edit)."""
        if replay and self.replay.get(word) and rng.random() < 0.5:
            return rng.choice(self.replay[word])
        for _ in range(8):
            typo = word
            for _ in range(_sample(self.edit_counts[length_bucket(word)] or Counter({1: 1}), rng)):
                typo = self._edit(typo, rng)
            if typo != word and typo.strip():
                return typo
        return word

    def _edit(self, word: str, rng: random.Random) -> str:
        kind, bucket = _sample(self.kinds, rng)
        if not word:
            return word
        low, high = bucket * len(word) // BUCKETS, max(1, (bucket + 1) * len(word) // BUCKETS)
        i = rng.randrange(low, min(high, len(word))) if low < min(high, len(word)) else 0
        if kind == "substitute":
            choices = self.substitutes.get(word[i])
            return word[:i] + (_sample(choices, rng) if choices else rng.choice(LETTERS)) \
                + word[i + 1:]
        if kind == "insert":
            choices = self.inserts.get(word[i - 1] if i else "^")
            return word[:i] + (_sample(choices, rng) if choices else rng.choice(LETTERS)) \
                + word[i:]
        if kind == "delete":
            return word[:i] + word[i + 1:]
        if i + 1 < len(word):  # swap
            return word[:i] + word[i + 1] + word[i] + word[i + 2:]
        return word

    def corrupt_query(self, query: str, rng: random.Random, replay: bool = True,
                      words: int = 1) -> str:
        """`query` with `words` of its words (of 3+ letters, when it has any) misspelled."""
        tokens = query.split(" ")
        editable = [i for i, t in enumerate(tokens) if len(t) >= 3 and t.isalpha()] or \
            [i for i, t in enumerate(tokens) if len(t) >= 2]
        for i in rng.sample(editable, min(words, len(editable))):
            tokens[i] = self.corrupt_word(tokens[i], rng, replay)
        return " ".join(tokens)


def _sample(counts: Counter[T], rng: random.Random) -> T:
    items = list(counts.items())
    return rng.choices([k for k, _ in items], weights=[w for _, w in items])[0]
