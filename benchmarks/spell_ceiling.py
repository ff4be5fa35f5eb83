"""How far any re-ranker of the noisy channel's hypotheses could go: the share of `eval spell`'s
misspelled queries whose meant query is among the channel's k likeliest (`NoisyChannel.k_best`),
by set and by group (`Typo.group`, as `eval spell` reports them).

A re-ranker, however good, answers with one of its candidates, so this share at a k is its
ceiling with those candidates and no auto-correct threshold; a threshold that keeps false
corrections down only lowers it. Run: `python benchmarks/spell_ceiling.py
model_repository/spell` (all 5,447 held-out queries x 3 noise seeds, about 5 minutes on 2
cores; `--size 1000` for a sample).

The second table (issue 43) asks the same of candidates from beyond the channel's edit reach
(`backends.noisy_channel.sources`: phonetic keys, whole catalog phrases, word segmentation, the
seq2seq's beam of 4), each source's best `SOURCE_TOP` queries added to the channel's k best:
the points each adds to the ceiling, on the *development* split by default (a channel learned
without it, `spell.data.development_catalog` / `development_misspellings`, misspelled as
`SpellSets` misspells the held-out split, and the seq2seq trained without it,
`models/spell-development`), where a source is chosen; `--split eval` asks the held-out
split once the choice is made. Each source's cost is its time per misspelled query on one
core (the seq2seq's in batches of 64, int8; on the channel's row, its own `k_best` at
k = 30). `--sources-only` skips the first table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


from queryserve.api import normalized  # noqa: E402
from queryserve.backends.noisy_channel.channel import NoisyChannel  # noqa: E402
from queryserve.backends.noisy_channel.sources import (  # noqa: E402
    CandidateSource,
    CatalogPhrases,
    PhoneticIndex,
    Segmenter,
    Seq2SeqBeam,
)
from queryserve.spell.channel_model import learn_tables  # noqa: E402
from queryserve.spell.data import (  # noqa: E402
    DATA,
    development_catalog,
    development_misspellings,
    load_catalog,
)
from queryserve.spell.evaluate import SpellSets  # noqa: E402
from queryserve.spell.typos import Typo  # noqa: E402

KS = (1, 3, 10, 30)
SOURCE_TOP = 3  # each source's best queries added to the channel's k best
SEQ2SEQ_BATCH = 64
ALL = "all four"


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


@dataclass(frozen=True)
class Split:
    """What the second table runs on: a channel, the sources built from what it learned, and
    the misspelled queries it never saw."""
    name: str
    channel: NoisyChannel
    sources: list[CandidateSource]
    sets: dict[str, list[Typo]]


def development_sets(data: Path, size: int | None, seed: int = 0) -> dict[str, list[Typo]]:
    """The hard and realistic sets as `SpellSets.build` makes them, from the development split
    (its queries and words held out of the development channel)."""
    sets = SpellSets.build(data, size=size, seed=seed, development=True)
    return {"hard": sets.hard, "realistic": sets.realistic}


def load_split(name: str, args: argparse.Namespace, scratch: Path) -> Split:
    """The development split (its own channel and seq2seq) or the held-out one (the served
    channel and seq2seq), with the sources built from the same training side (the catalog
    phrases are its training queries, as the channel's bigrams are)."""
    if name == "development":
        catalog, misspellings = development_catalog(args.data), development_misspellings(args.data)
        channel = NoisyChannel(learn_tables(catalog, misspellings, args.data))
        sets = development_sets(args.data, args.size)
        seq2seq = args.development_seq2seq
    else:
        catalog = load_catalog(args.data)
        channel = NoisyChannel.load(args.model)
        held_out = SpellSets.build(args.data, size=args.size)
        sets = {"hard": held_out.hard, "realistic": held_out.realistic}
        seq2seq = args.seq2seq
    sources: list[CandidateSource] = [PhoneticIndex(channel.unigrams),
                                      CatalogPhrases(catalog.train), Segmenter(channel.unigrams)]
    if not args.no_seq2seq:
        sources.append(_beam(seq2seq, scratch))
    return Split(name, channel, sources, sets)


def _beam(folder: Path, scratch: Path) -> Seq2SeqBeam:
    """A served seq2seq folder (ctranslate2/ and tokenizer.json), or a trained Hugging Face
    folder converted here (as `queryserve optimize --task seq2seq --precision fp32` does)."""
    if (folder / "ctranslate2").is_dir():
        return Seq2SeqBeam(folder / "ctranslate2", folder / "tokenizer.json")
    from queryserve.optimize.seq2seq import convert
    from queryserve.optimize.source import inspect_source

    out = scratch / folder.name
    convert(inspect_source(folder, "seq2seq"), out, "float32")
    return Seq2SeqBeam(out, folder / "tokenizer.json")


def proposals(source: CandidateSource, typed: Sequence[list[str]],
              onto: Sequence[list[str]]) -> tuple[list[list[str]], float]:
    """Each query's `SOURCE_TOP` proposals from `source`, and its microseconds per query."""
    started = time.perf_counter()
    if isinstance(source, Seq2SeqBeam):
        found = [p for i in range(0, len(typed), SEQ2SEQ_BATCH)
                 for p in source.propose_many(typed[i:i + SEQ2SEQ_BATCH], SOURCE_TOP)]
    else:
        found = [source.propose(words, SOURCE_TOP, best)
                 for words, best in zip(typed, onto, strict=True)]
    return found, (time.perf_counter() - started) * 1e6 / max(len(typed), 1)


def source_gains(split: Split) -> None:
    """Prints each source's gain over the channel's k best, per set and group."""
    names = [source.name for source in split.sources]
    print(f"\n{split.name} split: the channel's k best plus each source's best {SOURCE_TOP}, "
          "gain over the channel alone in points (the channel's own share on its row)\n")
    print("| set | group | queries | candidates | " + " | ".join(f"k = {k}" for k in KS)
          + f" | source alone (top {SOURCE_TOP}) | us/query |")
    print("|---|---|---:|---|" + "---:|" * (len(KS) + 2))
    for set_name, typos in split.sets.items():
        typed = [normalized(t.typed).split() for t in typos]
        started = time.perf_counter()
        best = [[text for text, _ in split.channel.k_best(words, max(KS))] for words in typed]
        channel_us = (time.perf_counter() - started) * 1e6 / max(len(typed), 1)
        onto = [b[0].split() if b else [] for b in best]  # the channel's best answer
        found, cost = {}, {}
        for source in split.sources:
            found[source.name], cost[source.name] = proposals(source, typed, onto)
        found[ALL] = [[p for name in names for p in found[name][i]] for i in range(len(typos))]
        cost[ALL] = sum(cost.values())
        groups: dict[str, list[int]] = {}
        for i, typo in enumerate(typos):
            for key in ("all", typo.group):
                groups.setdefault(key, []).append(i)
        for group, rows in sorted(groups.items(), key=lambda item: item[0] != "all"):
            meant = {i: normalized(typos[i].meant) for i in rows}
            alone = {k: sum(meant[i] in best[i][:k] for i in rows) for k in KS}
            shares = " | ".join(f"{alone[k] / len(rows):.1%}" for k in KS)
            print(f"| {set_name} | {group} | {len(rows):,} | channel alone | {shares} | | "
                  f"{channel_us:,.0f} |")
            for name in [*names, ALL]:
                added = {i: meant[i] in found[name][i] for i in rows}
                union = {k: sum(added[i] or meant[i] in best[i][:k] for i in rows) for k in KS}
                gains = " | ".join(f"{100 * (union[k] - alone[k]) / len(rows):+.1f}" for k in KS)
                by_itself = sum(added.values()) / len(rows)
                print(f"| {set_name} | {group} | {len(rows):,} | + {name} | {gains} | "
                      f"{by_itself:.1%} | {cost[name]:,.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a noisy-channel folder (channel.json)")
    parser.add_argument("--size", type=int, default=None,
                        help="a sample of held-out (and development) queries")
    parser.add_argument("--data", type=Path, default=DATA, help="the repository's data folder")
    parser.add_argument("--split", choices=("development", "eval"), default="development",
                        help="the split of the second table (default: development)")
    parser.add_argument("--sources-only", action="store_true",
                        help="print only the second table (the sources' gains)")
    parser.add_argument("--development-seq2seq", type=Path,
                        default=ROOT / "models" / "spell-development",
                        help="the seq2seq trained without the development split (a Hugging "
                             "Face folder, converted here, or a served folder)")
    parser.add_argument("--seq2seq", type=Path, default=ROOT / "model_repository" /
                        "spell-seq2seq", help="the served seq2seq, for --split eval")
    parser.add_argument("--no-seq2seq", action="store_true", help="leave the beam source out")
    args = parser.parse_args()
    if not args.sources_only:
        channel = NoisyChannel.load(args.model)
        sets = SpellSets.build(args.data, size=args.size)
        print("| set | group | queries | " + " | ".join(f"k = {k}" for k in KS) + " |")
        print("|---|---|---:|" + "---:|" * len(KS))
        for name, typos in (("hard", sets.hard), ("realistic", sets.realistic)):
            for group, counts in sorted(ceiling(channel, typos).items(),
                                        key=lambda item: item[0] != "all"):
                shares = " | ".join(f"{counts[k] / counts['n']:.1%}" for k in KS)
                print(f"| {name} | {group} | {counts['n']:,} | {shares} |", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        source_gains(load_split(args.split, args, Path(scratch)))


if __name__ == "__main__":
    main()
