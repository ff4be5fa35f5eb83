"""How the noisy channel's search limits were chosen: accuracy on a development split of the
*training* queries, never on the held-out ones `queryserve eval spell` reports.

1,000 training queries are drawn (seed 123) and left out of the language model; each is
misspelled by the noise model learned from the training misspellings (one word, as in the
evaluation). Each row relearns the tables without them and corrects the misspelled queries
(accuracy) and the clean ones (false corrections). Run: `python benchmarks/spell_dev.py`.
"""

from __future__ import annotations

import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from queryserve.spell import channel  # noqa: E402
from queryserve.spell.corrector import normalized  # noqa: E402
from queryserve.spell.data import load_catalog, load_misspellings, load_words  # noqa: E402
from queryserve.spell.noise import NoiseModel  # noqa: E402

LETTERS_ONLY = re.compile(r"[a-z]+(?:'[a-z]+)*")  # the tokens searched before "_" and "-"
VARIANTS = [  # (name, MAX_CANDIDATES, MAX_LATTICE, token pattern)
    ("24 candidates, lattice 8, letters only", 24, 8, LETTERS_ONLY),
    ("24 candidates, lattice 8", 24, 8, channel._WORD),
    ("32 candidates, lattice 12", 32, 12, channel._WORD),
    ("64 candidates, lattice 16 (shipped)", 64, 16, channel._WORD),
]


def main() -> None:
    data = ROOT / "data"
    catalog, misspellings = load_catalog(data), load_misspellings(data)
    rng = random.Random(123)
    development = rng.sample(catalog.train, 1000)
    left_out = set(development)
    rest = [q for q in catalog.train if q not in left_out]
    noise = NoiseModel.learn(misspellings.train)
    misspelled = [(typed, q) for q in development
                  if (typed := noise.corrupt_query(q, rng, replay=False)) != q]
    tables = channel.ChannelTables.learn(rest, misspellings.lexicon + load_words(data), noise)
    print("| variant | accuracy (misspelled) | false corrections (clean) | queries/s |")
    print("|---|---:|---:|---:|")
    for name, candidates, lattice, pattern in VARIANTS:
        channel.MAX_CANDIDATES, channel.MAX_LATTICE, channel._WORD = candidates, lattice, pattern
        corrector = channel.NoisyChannel(tables)
        started = time.perf_counter()
        fixed = corrector.correct([typed for typed, _ in misspelled])
        clean = corrector.correct(development)
        rate = (len(fixed) + len(clean)) / (time.perf_counter() - started)
        right = sum(c.corrected == normalized(q) for c, (_, q) in zip(fixed, misspelled,
                                                                      strict=True))
        changed = sum(c.changed for c in clean)
        print(f"| {name} | {right / len(misspelled):.1%} | {changed / len(clean):.1%} | "
              f"{rate:.0f} |")


if __name__ == "__main__":
    main()
