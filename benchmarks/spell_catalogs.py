"""What the search bar's rule on another catalog's words costs and saves: of the corrections
the channel applies (score >= `min_score`) to search queries, those that bring a word only the
other catalog uses, which the search ensemble only offers (`SearchPipeline._applies`).

Queries are catalog items' texts as the index holds them ("title performer", "brand title"; at
most 12 words), searched clean (any applied correction is a false one) and misspelled once by
`TypoGenerator` (1-2 keyboard edits: a correction is right when it gives back the item's text
exactly). Per catalog: the corrections applied, and of those the rule would stop, how many
were right. Run: `python benchmarks/spell_catalogs.py` (3,000 items per catalog, about a
minute on 2 cores; `--items N`).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from queryserve.api import normalized  # noqa: E402
from queryserve.backends.noisy_channel.channel import NoisyChannel  # noqa: E402
from queryserve.config import load_ensemble_config  # noqa: E402
from queryserve.pipelines.search.catalog import CATALOGS  # noqa: E402
from queryserve.pipelines.search.index import foreign_words, load_index  # noqa: E402
from queryserve.spell.typos import TypoGenerator  # noqa: E402

MAX_WORDS = 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--items", type=int, default=3000, help="items drawn per catalog")
    args = parser.parse_args()
    steps = load_ensemble_config(args.repository / "search" / "pipeline.yaml").ensemble
    assert steps is not None
    channel = NoisyChannel.load(args.repository / (steps.spell or "spell"))
    indexes = {catalog: load_index(steps.index, catalog) for catalog in CATALOGS}
    print("| catalog | queries | clean: applied (false) / of them stopped | misspelled: "
          "applied / right / stopped / stopped that were right |\n|---|---:|---:|---:|")
    foreign_of = foreign_words(indexes)
    for catalog, index in indexes.items():
        foreign = foreign_of[catalog]
        rng, typos = random.Random(0), TypoGenerator(1)
        texts = [t for item in rng.sample(index.items, min(args.items, len(index.items)))
                 if len((t := normalized(item.text)).split()) <= MAX_WORDS]
        false = false_stopped = applied = right = stopped = stopped_right = 0
        for text in texts:
            clean = channel.correct([text])[0]
            if clean.changed and clean.score >= steps.min_score:
                false += 1
                false_stopped += bool(set(clean.corrected.split()) - set(text.split()) & foreign)
            typo = typos.corrupt(text)
            if typo is None:
                continue
            fixed = channel.correct([typo.typed])[0]
            if fixed.changed and fixed.score >= steps.min_score:
                applied += 1
                is_right = fixed.corrected == typo.meant
                right += is_right
                if set(fixed.corrected.split()) - set(typo.typed.split()) & foreign:
                    stopped += 1
                    stopped_right += is_right
        print(f"| {catalog} | {len(texts):,} | {false} / {false_stopped} | {applied:,} / "
              f"{right:,} / {stopped} / {stopped_right} |")


if __name__ == "__main__":
    main()
