"""How the noisy channel's parameters were chosen: figures on development splits of the
*training* data, never on the held-out ones `queryserve eval spell` reports.

- Queries: `spell.data.development_catalog`, catalog items held out of the training side the
  way the held-out split is made (unseen names included); 1,000 of its queries are drawn
  (seed 7), each misspelled once by the noise model (accuracy) and kept as is (false
  corrections).
- Words: the training misspellings of the words in the next 10% of hashes after the
  held-out ones; the typo model and the list of known typos learn from the other training
  words. 1,000 misspellings that are not dictionary words are corrected alone (word
  accuracy).

Each row relearns the tables without the development data. Run:
`python benchmarks/spell_dev.py` (about two minutes on 2 cores).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from queryserve.api import normalized  # noqa: E402
from queryserve.backends.noisy_channel import channel  # noqa: E402
from queryserve.backends.noisy_channel.noise import NoiseModel  # noqa: E402
from queryserve.spell.data import (  # noqa: E402
    development_catalog,
    development_misspellings,
    load_web_words,
    load_words,
)

DEFAULT = channel.ChannelParameters()
VARIANTS = [  # (name, channel constants, parameters)
    ("24 candidates, lattice 8, no web words, no context words",
     {"MAX_CANDIDATES": 24, "MAX_LATTICE": 8, "CONTEXT_KEEP": 0},
     dataclasses.replace(DEFAULT, web_weight=0, edit_weight=0.7)),
    ("64 candidates, lattice 16, no web words, no context words", {"CONTEXT_KEEP": 0},
     dataclasses.replace(DEFAULT, web_weight=0, edit_weight=0.7)),
    ("web words at weight 1, no context words, edit weight 0.7", {"CONTEXT_KEEP": 0},
     dataclasses.replace(DEFAULT, edit_weight=0.7)),
    ("web words at weight 10, no context words, edit weight 0.7", {"CONTEXT_KEEP": 0},
     dataclasses.replace(DEFAULT, web_weight=10, edit_weight=0.7)),
    ("web words at weight 1, context words, edit weight 0.7", {},
     dataclasses.replace(DEFAULT, edit_weight=0.7)),
    ("web words at weight 1, context words, edit weight 0.75 (shipped)", {}, DEFAULT),
]


def main() -> None:
    data = ROOT / "data"
    catalog, misspellings = development_catalog(data), development_misspellings(data)
    rng = random.Random(7)
    clean = rng.sample(catalog.held_out, 1000)
    learned = misspellings.train
    noise = NoiseModel.learn(learned)
    misspelled = [(typed, q) for q in clean
                  if (typed := noise.corrupt_query(q, rng, replay=False)) != q]
    dictionary = misspellings.lexicon + load_words(data)
    known = set(dictionary)
    words = rng.sample([(t, w) for t, w in misspellings.held_out
                        if t not in known and t.isalpha()], 1000)
    web = load_web_words(DEFAULT.web_min_zipf)
    print("| variant | query accuracy (misspelled) | false corrections (clean) "
          "| word accuracy | queries/s |")
    print("|---|---:|---:|---:|---:|")
    shipped = {name: getattr(channel, name)
               for name in ("MAX_CANDIDATES", "MAX_LATTICE", "CONTEXT_KEEP")}
    for name, constants, parameters in VARIANTS:
        for constant, value in {**shipped, **constants}.items():
            setattr(channel, constant, value)
        tables = channel.ChannelTables.learn(catalog.train, dictionary, noise, parameters,
                                             web=web, typos={t for t, _ in learned})
        corrector = channel.NoisyChannel(tables)
        started = time.perf_counter()
        fixed = corrector.correct([typed for typed, _ in misspelled])
        kept = corrector.correct(clean)
        rate = (len(fixed) + len(kept)) / (time.perf_counter() - started)
        alone = corrector.correct([typed for typed, _ in words])
        right = sum(c.corrected == normalized(q) for c, (_, q) in zip(fixed, misspelled,
                                                                      strict=True))
        changed = sum(c.changed for c in kept)
        fixed_words = sum(c.corrected == w for c, (_, w) in zip(alone, words, strict=True))
        print(f"| {name} | {right / len(misspelled):.1%} | {changed / len(clean):.1%} | "
              f"{fixed_words / len(words):.1%} | {rate:.0f} |", flush=True)


if __name__ == "__main__":
    main()
