"""`queryserve eval spell`'s test sets, all from the held-out splits (`spell.data`):

- **words**: real misspellings of the held-out words, typed alone (the misspellings that are
  themselves dictionary words, "there" for "their", are left out: no corrector can tell them
  from a correct word without context, and the count left out is reported; the dictionary is
  the misspelling corpus's lexicon and the common English words of `data/english-words`);
- **clean**: the held-out catalog queries as they are; any change is a false correction.
  Unseen performer and product names are among them, so this also says whether odd names are
  left alone;
- **hard**: each held-out query with one word misspelled by the project's noise model (learned
  from the training split's misspellings only), once per noise seed. The channel scores with
  those typo tables and the seq2seq trains on them, so this set measures fit to that model; it
  keeps its unrealistic corners (three edits in a four-letter word) and stays for comparison;
- **realistic**: each held-out query with one or two keyboard typos from `spell.typos` (a
  generator no corrector uses), once per noise seed, and the held-out words' real misspellings
  (those of the words set) placed into the held-out queries that contain the word.

`EvalSets` is the older, sampled form of the hard set: `optimize`'s parity gate and the
benchmarks take their queries from it, so it keeps drawing exactly what it drew.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from rapidfuzz.distance import OSA

from queryserve.backends.noisy_channel.noise import NoiseModel
from queryserve.spell.data import (
    DATA,
    Catalog,
    Misspellings,
    development_catalog,
    development_misspellings,
    load_catalog,
    load_misspellings,
    load_words,
)
from queryserve.spell.typos import Typo, TypoGenerator, place_real_misspellings

SEEDS = 3
NOISE_MODEL = "noise model"


@dataclass(frozen=True)
class EvalSets:
    """A sample of `size` held-out queries, misspelled by the noise model and clean."""
    words: list[tuple[str, str]]  # (typed, meant)
    misspelled: list[tuple[str, str]]
    clean: list[str]
    real_word_errors_left_out: int

    @classmethod
    def build(cls, data: Path = DATA, size: int = 1000, seed: int = 0) -> EvalSets:
        rng = random.Random(seed)
        catalog, misspellings, words, left_out = _held_out(data)
        noise = NoiseModel.learn(misspellings.train)
        clean = rng.sample(catalog.held_out, min(size, len(catalog.held_out)))
        misspelled = [(typed, q) for q in clean
                      if (typed := noise.corrupt_query(q, rng, replay=False)) != q]
        return cls(rng.sample(words, min(size, len(words))), misspelled, clean, left_out)

    def queries(self) -> list[str]:
        """Every held-out query as typed, misspelled then clean: the optimizer's gate inputs."""
        return [typed for typed, _ in self.misspelled] + self.clean


@dataclass(frozen=True)
class SpellSets:
    """Everything `eval spell` scores: words and clean queries once, the hard and realistic
    misspelled queries once per seed in `seeds` (concatenated)."""
    words: list[tuple[str, str]]  # (typed, meant)
    clean: list[str]
    hard: list[Typo]
    realistic: list[Typo]
    seeds: tuple[int, ...]
    real_word_errors_left_out: int

    @classmethod
    def build(cls, data: Path = DATA, size: int | None = None, seed: int = 0,
              seeds: int = SEEDS, development: bool = False) -> SpellSets:
        """All held-out queries and words, or a sample of `size` of each (drawn by `seed`);
        the noise seeds are `seed`, `seed + 1`, ... `development`: the same sets from the
        development split (what is held out of it), to choose on without touching eval's."""
        catalog, misspellings, words, left_out = _held_out(data, development)
        clean = list(catalog.held_out)
        if size is not None:
            rng = random.Random(seed)
            clean = rng.sample(clean, min(size, len(clean)))
            words = rng.sample(words, min(size, len(words)))
        noise = NoiseModel.learn(misspellings.train)
        noise_seeds = tuple(range(seed, seed + seeds))
        hard, realistic = [], []
        for s in noise_seeds:
            rng = random.Random(s)
            for query in clean:
                typed = noise.corrupt_query(query, rng, replay=False)
                if typed != query:
                    hard.append(Typo(typed, query, (NOISE_MODEL,), OSA.distance(query, typed)))
            generator = TypoGenerator(s)
            realistic += [t for q in clean if (t := generator.corrupt(q)) is not None]
            realistic += place_real_misspellings(clean, words, s)
        return cls(words, clean, hard, realistic, noise_seeds, left_out)

    def texts(self) -> list[str]:
        """Every distinct text a corrector is asked to correct, in a stable order."""
        return list(dict.fromkeys([*(t for t, _ in self.words), *self.clean,
                                   *(t.typed for t in self.hard),
                                   *(t.typed for t in self.realistic)]))


def _held_out(data: Path, development: bool = False,
              ) -> tuple[Catalog, Misspellings, list[tuple[str, str]], int]:
    """The catalog, the misspellings, the held-out (typed, meant) words that are no dictionary
    word (a real-word error cannot be told from a right word alone), and how many were left
    out for that; of the development split with `development`."""
    catalog, misspellings = ((development_catalog(data), development_misspellings(data))
                             if development else (load_catalog(data), load_misspellings(data)))
    lexicon = set(misspellings.lexicon) | set(load_words(data))
    words = [(t, w) for t, w in misspellings.held_out if t not in lexicon and t.isalpha()]
    return catalog, misspellings, words, len(misspellings.held_out) - len(words)
