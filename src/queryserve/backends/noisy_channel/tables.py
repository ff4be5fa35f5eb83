"""What the noisy-channel corrector learns and saves (`channel.json`): the catalog's word counts
and bigrams, the typo model's tables, the web words it may leave alone, and the parameters
chosen on the development splits. `channel.py` decodes with them."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from queryserve.backends.noisy_channel.noise import NoiseModel

START, END = "<s>", "</s>"
FILE = "channel.json"
# Letters with inner apostrophes ("what's"), and the stray "_" and "-" that real misspellings
# carry ("insid_e", "eve-": the misspelling corpus writes a slipped space as "_").
WORD = re.compile(r"(?=.*[a-z])[a-z_]+(?:['-][a-z_]+)*-?")


@dataclass(frozen=True)
class ChannelParameters:
    p_typo: float = 0.05
    """Prior that a typed word the catalog does not know is misspelled."""
    p_real_word: float = 0.005
    """Prior that a known word was typed for another ("form" for "from"): rarer, and
    changing a right word is the worse mistake."""
    p_unknown: float = 1e-11
    """Language-model probability of a word neither the catalog nor web text knows."""
    web_weight: float = 1.0
    """A web word the catalog never saw has unigram probability `web_weight` times its web
    frequency. Higher leaves more unseen words alone, the misspellings web text is full of
    among them ("recieve"). On the development splits (benchmarks/spell_dev.py), weight 1
    cuts false corrections from 9.6% to 4.1% and costs 2.6 points of word accuracy."""
    web_min_zipf: float = 1.0
    """Web words rarer than this Zipf frequency (uses per billion words, log10) are unknown."""
    edit_weight: float = 0.75
    """How much the edits' log-probability counts against the language model's. 0.75 rather
    than 0.7 since the lattice takes words from the context too (`CONTEXT_KEEP`): on the
    development splits it cuts false corrections from 4.3% to 3.8% at the same accuracy."""
    lexicon_count: int = 5
    """Pseudo-count of a dictionary word the catalog never uses."""
    max_distance: tuple[int, int, int] = (2, 2, 3)
    """Edits searched for unknown words of up to 3 letters, 4-6 letters, and longer; known
    words search one edit (a real word typed for another: "form" for "from")."""
    p_space: float = 0.03
    """Probability, given a typo, that it is a space left out ("taylorswift" for "taylor
    swift") or typed inside a word ("tay lor" for "taylor"): the channel cost of splitting a
    typed word into two known words, or joining two typed words into one known word."""


@dataclass
class ChannelTables:
    """What the corrector learns and saves: counts, and the typo model's tables."""
    unigrams: dict[str, int]
    bigrams: dict[str, dict[str, int]]
    edit_counts: dict[int, dict[int, float]]  # word-length bucket -> P(edits)
    kinds: dict[str, float]  # "kind bucket" -> P
    substitutes: dict[str, dict[str, int]]
    inserts: dict[str, dict[str, int]]
    web: dict[str, float] = field(default_factory=dict)  # unseen word -> Zipf frequency
    parameters: ChannelParameters = field(default_factory=ChannelParameters)

    @classmethod
    def learn(cls, texts: Iterable[str], lexicon: Iterable[str], noise: NoiseModel,
              parameters: ChannelParameters | None = None,
              web: Mapping[str, float] | None = None,
              typos: Collection[str] = ()) -> ChannelTables:
        """`web`: words of web text and their Zipf frequency; those the catalog knows, and
        the known misspellings `typos` (web text has them too), are left out."""
        parameters = parameters or ChannelParameters()
        unigrams: Counter[str] = Counter()
        bigrams: dict[str, Counter[str]] = defaultdict(Counter)
        for text in texts:
            words = [START, *text.split(), END]
            unigrams.update(words[1:-1])
            for a, b in itertools.pairwise(words):
                bigrams[a][b] += 1
        for word in lexicon:
            if word not in unigrams:
                unigrams[word] = parameters.lexicon_count
        kinds_total = sum(noise.kinds.values())
        return cls(
            unigrams=dict(unigrams), bigrams={a: dict(c) for a, c in bigrams.items()},
            edit_counts={length: {k: n / sum(c.values()) for k, n in c.items()}
                         for length, c in noise.edit_counts.items()},
            kinds={f"{kind} {bucket}": n / kinds_total
                   for (kind, bucket), n in noise.kinds.items()},
            substitutes={a: dict(c) for a, c in noise.substitutes.items()},
            inserts={a: dict(c) for a, c in noise.inserts.items()},
            web={w: round(z, 2) for w, z in (web or {}).items()
                 if z >= parameters.web_min_zipf and w not in unigrams and w not in typos
                 and WORD.fullmatch(w)},
            parameters=parameters)

    def save(self, folder: Path) -> Path:
        path = folder / FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), separators=(",", ":")))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> ChannelTables:
        raw = json.loads(path.read_text())
        raw["parameters"] = ChannelParameters(**{
            **raw["parameters"], "max_distance": tuple(raw["parameters"]["max_distance"])})
        raw["edit_counts"] = {int(n): {int(k): p for k, p in c.items()}
                              for n, c in raw["edit_counts"].items()}
        return cls(**raw)
