"""How far any re-ranker of the noisy channel's hypotheses could go: the share of `eval spell`'s
misspelled queries whose meant query is among the channel's k likeliest (`NoisyChannel.k_best`),
by set and by group (`Typo.group`, as `eval spell` reports them).

A re-ranker, however good, answers with one of its candidates, so this share at a k is its
ceiling with those candidates and no auto-correct threshold; a threshold that keeps false
corrections down only lowers it. Run: `python benchmarks/spell_ceiling.py
model_repository/spell` (all 5,447 held-out queries x 3 noise seeds, about 5 minutes on 2
cores; `--size 1000` for a sample).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from queryserve.api import normalized  # noqa: E402
from queryserve.backends.noisy_channel.channel import NoisyChannel  # noqa: E402
from queryserve.spell.data import DATA  # noqa: E402
from queryserve.spell.evaluate import SpellSets  # noqa: E402
from queryserve.spell.typos import Typo  # noqa: E402

KS = (1, 3, 10, 30)


def ceiling(channel: NoisyChannel, typos: list[Typo]) -> dict[str, Counter[int | str]]:
    """For each group and "all": how many typos (key "n") and how many have their meant query
    among the channel's k best, for each k of `KS`."""
    found: dict[str, Counter[int | str]] = {}
    for typo in typos:
        best = [text for text, _ in channel.k_best(normalized(typo.typed).split(), max(KS))]
        meant = normalized(typo.meant)
        for key in ("all", typo.group):
            counts = found.setdefault(key, Counter())
            counts["n"] += 1
            for k in KS:
                counts[k] += meant in best[:k]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a noisy-channel folder (channel.json)")
    parser.add_argument("--size", type=int, default=None, help="a sample of held-out queries")
    parser.add_argument("--data", type=Path, default=DATA, help="the repository's data folder")
    args = parser.parse_args()
    channel = NoisyChannel.load(args.model)
    sets = SpellSets.build(args.data, size=args.size)
    print("| set | group | queries | " + " | ".join(f"k = {k}" for k in KS) + " |")
    print("|---|---|---:|" + "---:|" * len(KS))
    for name, typos in (("hard", sets.hard), ("realistic", sets.realistic)):
        for group, counts in sorted(ceiling(channel, typos).items(),
                                    key=lambda item: item[0] != "all"):
            shares = " | ".join(f"{counts[k] / counts['n']:.1%}" for k in KS)
            print(f"| {name} | {group} | {counts['n']:,} | {shares} |", flush=True)


if __name__ == "__main__":
    main()
