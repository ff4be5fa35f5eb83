"""Realistic typos that no corrector here models: the "realistic" evaluation set's noise.

The noisy channel scores candidates with the typo tables it learned from the training split's
misspellings, and the seq2seq model trains on text corrupted by those same tables
(`backends.noisy_channel.noise`). Test typos drawn from them measure fit to that model. These
come from a different, deliberately plain account of how people mistype on a phone or keyboard:

- **neighbour**: a letter replaced by a QWERTY neighbour ("swift" -> "swigt");
- **omission**: a letter left out ("swift" -> "swft");
- **doubling**: a letter typed twice ("swift" -> "swiift");
- **transposition**: two adjacent letters swapped ("swift" -> "swfit");
- **merge**: the space between two words left out ("taylor swift" -> "taylorswift");
- **split**: a space typed inside a word ("taylor" -> "tay lor").

Every word of two or more letters can be hit (names and short words too: "ed sheeran" ->
"ed sheeean", "of" -> "og"), a word in proportion to its letters, as each keystroke is a
chance to slip; the first letter of a word a third as often, as people rarely get it wrong.
Most queries get one edit and the rest two (`TWO_EDIT_SHARE`); each typo's edit distance to the
query is exactly its number of edits. A query's typo depends only on the seed and the query, so
a sample of queries gets the same typos as the whole set.

`place_real_misspellings` is the second kind: real misspellings of the held-out words, as
people wrote them, put into the held-out queries that contain the word.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rapidfuzz.distance import OSA

KIND_WEIGHTS = {"neighbour": 0.35, "omission": 0.25, "doubling": 0.15, "transposition": 0.15,
                "merge": 0.05, "split": 0.05}
TWO_EDIT_SHARE = 0.12
FIRST_LETTER_WEIGHT = 1 / 3
REAL = "real misspelling"
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
_ROW_OFFSETS = (0.0, 0.25, 0.75)  # how far each row sits right of the one above, in keys


def _neighbours() -> dict[str, str]:
    """Each letter's QWERTY neighbours: left and right on its row, and the keys above and
    below whose centres are less than one key width away ("f": "dgrtcv")."""
    keys = {c: (r, i + _ROW_OFFSETS[r]) for r, row in enumerate(_ROWS) for i, c in enumerate(row)}
    return {c: "".join(o for o, (r2, x2) in keys.items() if o != c and (
        (r2 == r and abs(x2 - x) == 1) or (abs(r2 - r) == 1 and abs(x2 - x) < 1)))
        for c, (r, x) in keys.items()}


NEIGHBOURS = _neighbours()


@dataclass(frozen=True)
class Typo:
    """A query as typed, the query meant, and how it was corrupted: `kinds` names each edit
    (`REAL` for a real misspelling), `edits` is the edit distance between the two."""
    typed: str
    meant: str
    kinds: tuple[str, ...]
    edits: int

    @property
    def group(self) -> str:
        """The group `eval spell` reports it in: "real" for a real misspelling, else its
        number of edits ("1", "2", "3+")."""
        return "real" if REAL in self.kinds else "3+" if self.edits >= 3 else str(self.edits)


@dataclass(frozen=True)
class TypoGenerator:
    seed: int
    two_edit_share: float = TWO_EDIT_SHARE

    def corrupt(self, query: str) -> Typo | None:
        """`query` with one or two edits, or None when nothing in it can be edited ("a", "7")."""
        rng = random.Random(f"{self.seed}\x00{query}")
        wanted = 2 if rng.random() < self.two_edit_share else 1
        for edits in (wanted, 1):
            for _ in range(8):  # two edits can undo each other or coincide: draw again
                typed, kinds = query, []
                for _ in range(edits):
                    edited = _edit(typed, rng)
                    if edited is None:
                        return None
                    typed = edited[0]
                    kinds.append(edited[1])
                if OSA.distance(query, typed) == edits:
                    return Typo(typed, query, tuple(kinds), edits)
        return None


def _edit(text: str, rng: random.Random) -> tuple[str, str] | None:
    """One edit of a kind that applies to `text`, drawn by `KIND_WEIGHTS`, and its kind."""
    letters = _letter_positions(text)
    splits = [i for i in range(2, len(text) - 1) if _inside_word(text, i)]
    possible = {"neighbour": letters, "omission": letters, "doubling": letters,
                "transposition": [i for i in letters if i + 1 < len(text)
                                  and text[i + 1].isalpha() and text[i + 1] != text[i]],
                "merge": [i for i, c in enumerate(text) if c == " "], "split": splits}
    kinds = [k for k in KIND_WEIGHTS if possible[k]]
    if not kinds:
        return None
    kind = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0]
    places = possible[kind]
    if kind in ("neighbour", "omission", "doubling", "transposition"):
        weights = [FIRST_LETTER_WEIGHT if i == 0 or text[i - 1] == " " else 1.0 for i in places]
        i = rng.choices(places, weights=weights)[0]
    else:
        i = rng.choice(places)
    if kind == "neighbour":
        return text[:i] + rng.choice(NEIGHBOURS[text[i]]) + text[i + 1:], kind
    if kind == "omission":
        return text[:i] + text[i + 1:], kind
    if kind == "doubling":
        return text[:i + 1] + text[i:], kind
    if kind == "transposition":
        return text[:i] + text[i + 1] + text[i] + text[i + 2:], kind
    if kind == "merge":
        return text[:i] + text[i + 1:], kind
    return text[:i] + " " + text[i:], kind


def _letter_positions(text: str) -> list[int]:
    """Where the a-z letters of words of two or more letters are (digits and punctuation are
    left alone: a model number mistyped is another model)."""
    places: list[int] = []
    start = 0
    for word in text.split(" "):
        if sum(c.isalpha() for c in word) >= 2:
            places += [start + j for j, c in enumerate(word) if c in NEIGHBOURS]
        start += len(word) + 1
    return places


def _inside_word(text: str, i: int) -> bool:
    """Whether a space typed before `text[i]` splits a word into two parts of 2+ letters."""
    return text[i - 2:i].isalpha() and text[i:i + 2].isalpha()


def place_real_misspellings(queries: Sequence[str], pairs: Iterable[tuple[str, str]],
                            seed: int) -> list[Typo]:
    """Each (misspelling, word) pair whose word is a word of some query, placed into one of
    those queries (drawn by `seed`), replacing one occurrence of the word."""
    containing: dict[str, list[str]] = defaultdict(list)
    for query in queries:
        for word in dict.fromkeys(query.split(" ")):
            containing[word].append(query)
    typos = []
    for typo, word in pairs:
        if not containing.get(word):
            continue
        rng = random.Random(f"{seed}\x00{typo}\x00{word}")
        query = rng.choice(containing[word])
        tokens = query.split(" ")
        i = rng.choice([i for i, token in enumerate(tokens) if token == word])
        tokens[i] = typo
        typos.append(Typo(" ".join(tokens), query, (REAL,), OSA.distance(word, typo)))
    return typos
