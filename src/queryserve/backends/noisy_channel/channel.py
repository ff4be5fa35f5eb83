"""The noisy-channel corrector: the most likely query the user meant, given what they typed.

For a typed query t it picks the words w that maximise P(w) * P(t | w):

- P(w), the *language model*: word bigrams of the catalog's queries (interpolated with
  absolute discounting), so "taylor swfit" leans to "swift" because "taylor swift" is
  searched; a word the catalog never saw costs its frequency in English web text (the
  `wordfreq` package's list, times `web_weight`), so "errands" and "costco" stay as typed,
  and a word unknown to both costs `p_unknown`;
- P(t | w), the *channel*: the typo model learned from real misspellings (`spell.noise`):
  how likely these edits are, how many for a word this long, where in the word, with which
  letters. A word typed as meant costs log(1 - `p_typo`).

Every typed word keeps itself as a candidate (an unseen name is left alone unless a known
word explains it much better) and gets the catalog words within a few edits (rapidfuzz's
optimal string alignment distance; longer words allow more edits) and the words the catalog
most often types after the candidates before it. A space typo is one edit too: an unknown
typed word may be two known words typed together ("taylorswift"), two typed words one known
word with a space inside ("tay lor"), each at `p_space`. A Viterbi pass over the bigram lattice
finds the best query, and the forward pass gives its posterior, the score.

Why not only the trained seq2seq model: on this 2-core machine an hour of training teaches a
small model to copy but not the catalog's vocabulary (BENCHMARKS.md section 8), while these
counts are learned from the same data in seconds and correct most typos of one or
two edits. The parameters were chosen on development splits of the training data
(`benchmarks/spell_dev.py` prints their figures for the search limits and the web weight).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from queryserve.api import Correction, correction, normalized
from queryserve.backends.noisy_channel.deletions import DeletionIndex
from queryserve.backends.noisy_channel.noise import (
    BUCKETS,
    MAX_EDITS,
    align,
    length_bucket,
    position_bucket,
)
from queryserve.backends.noisy_channel.tables import (
    END,
    FILE,
    START,
    WORD,
    ChannelTables,
)

DISCOUNT = 0.75
MAX_CANDIDATES = 64  # per typed word scored by the channel: nearest and most frequent first
MAX_LATTICE = 16  # of those, the likeliest alone (P(typed | word) P(word)) go into the lattice
# Typed words searched up to 2 edits deep find their candidates in a deletion index of the
# words up to 8 letters (a 6-letter word's reach); longer searches scan the vocabulary, which
# took 1.3 ms per typed word of up to 6 letters where the index takes 0.2 ms.
INDEX_DEPTH, INDEX_LONGEST = 2, 8
# The lattice also gets the words the catalog most often types after the candidates before
# ("in ___ living room" proposes "the" for "cee"), up to 3 edits away however short the typed
# word: the channel alone searches fewer edits, or the lattice would fill with noise. Of each
# previous word's 64 likeliest next words, the 4 likeliest given the context (P(typed | word)
# times the bigram share) join the lattice. On the development splits (benchmarks/spell_dev.py)
# this took query accuracy from 61.3% to 64.9%, and with `edit_weight` 0.75 to 65.0% with
# false corrections down from 4.1% to 3.8%. A typed word the catalog uses more than 100 times
# gets none: the same accuracy there, at 660 queries/s instead of 512.
CONTEXT_NEXT, CONTEXT_REACH, CONTEXT_KEEP, CONTEXT_COMMON = 64, 3, 4, 100
# A typed word the catalog does not know may be two known words with the space left out
# ("taylorswift"); two typed words may be one known word with a space typed inside
# ("tay lor"). Splits are tried at every place where both parts are known words (of 2+
# letters, or "a" and "i"), the likeliest `MAX_SPLITS` of them by their unigrams kept;
# joins only where the two typed words together are exactly a known word.
MAX_SPLITS, SHORT_WORDS = 4, frozenset({"a", "i"})


class NoisyChannel:
    """Corrects queries with `ChannelTables`; safe to call from several threads."""

    name = "channel"

    def __init__(self, tables: ChannelTables) -> None:
        self.tables = tables
        p = tables.parameters
        self.parameters = p
        self.unigrams = tables.unigrams
        # P(word) = (count + 0.1) / (all counts + 0.1 per word): the denominator, once.
        self.unigram_total = sum(self.unigrams.values()) + 0.1 * len(self.unigrams)
        # Each context word's followers, how often it is followed, and the back-off weight of
        # the unigram in P(word | it) (`language_after`).
        self.context = {a: (c, sum(c.values()), DISCOUNT * len(c) / sum(c.values()))
                        for a, c in tables.bigrams.items()}
        self.letters = "".join(sorted({c for word in self.unigrams for c in word}))
        self.by_length: dict[int, list[str]] = defaultdict(list)
        for word in sorted(self.unigrams):
            self.by_length[len(word)].append(word)
        self.deletions = DeletionIndex(
            [w for length in range(INDEX_LONGEST + 1) for w in self.by_length.get(length, ())],
            INDEX_DEPTH)
        self.substitute_totals = {a: sum(c.values()) for a, c in tables.substitutes.items()}
        self.insert_totals = {a: sum(c.values()) for a, c in tables.inserts.items()}
        self.keep = math.log(1 - p.p_typo)
        # Candidates depend on the typed word only: head words repeat across queries.
        self.candidates = lru_cache(maxsize=1 << 16)(self._candidates)
        self.splits = lru_cache(maxsize=1 << 16)(self._splits)
        # So do the words the context proposes for a typed word, each scored by an alignment.
        self.channel = lru_cache(maxsize=1 << 17)(self._channel)
        self.space = math.log(p.p_space)
        # Each word's likeliest next words, with their share of what follows it.
        self.next_words = {a: tuple((w, c[w] / self.context[a][1])
                                    for w in heapq.nlargest(CONTEXT_NEXT, c, key=c.__getitem__)
                                    if w != END)
                           for a, c in tables.bigrams.items()}

    @classmethod
    def load(cls, folder: Path) -> NoisyChannel:
        return cls(ChannelTables.load(folder / FILE))

    # -- the two models ----------------------------------------------------------------------

    def unigram(self, word: str) -> float:
        count = self.unigrams.get(word)
        if count is not None:
            return (count + 0.1) / self.unigram_total
        zipf = self.tables.web.get(word)
        if zipf is None:
            return self.parameters.p_unknown
        return max(self.parameters.web_weight * 10 ** (zipf - 9), self.parameters.p_unknown)

    def language(self, previous: str, word: str) -> float:
        """log P(word | previous word), bigrams interpolated with unigrams."""
        return self.language_after((previous,), word)[previous]

    def language_after(self, previous: Iterable[str], word: str) -> dict[str, float]:
        """log P(word | p) for each previous word p: the lattice asks for every state of a
        column at once, and the word's unigram is the same for all of them."""
        unigram = self.unigram(word) if word != END else 0.1
        alone = math.log(unigram)
        scores: dict[str, float] = {}
        for p in previous:
            seen = self.context.get(p)
            if seen is None:
                scores[p] = alone
                continue
            followers, total, backoff = seen
            count = followers.get(word)
            scores[p] = math.log((count - DISCOUNT) / total + backoff * unigram) \
                if count else math.log(backoff * unigram)
        return scores

    def _channel(self, typed: str, word: str) -> float:
        """log P(typed | word): the typo model's probability of these edits."""
        if typed == word:
            return self.keep
        edits = align(word, typed)
        counts = self.tables.edit_counts.get(length_bucket(word), {})
        logp = math.log(counts.get(min(len(edits), MAX_EDITS), 0.0) + 1e-4)
        width = max(1, len(word) // BUCKETS)
        for kind, position, old, new in edits:
            where = f"{kind} {position_bucket(position, len(word))}"
            logp += math.log(self.tables.kinds.get(where, 1e-5) / width)
            if kind == "substitute":
                table, totals, key = self.tables.substitutes, self.substitute_totals, old
            elif kind == "insert":
                table, totals, key = self.tables.inserts, self.insert_totals, \
                    word[position - 1] if position else "^"
            else:
                continue
            logp += math.log((table.get(key, {}).get(new, 0) + 0.5) / (totals.get(key, 0) + 13))
        return math.log(self.parameters.p_typo) + self.parameters.edit_weight * logp

    def _candidates(self, typed: str) -> tuple[tuple[str, float], ...]:
        """(word, log P(typed | word)) for the words `typed` may stand for, itself included."""
        from rapidfuzz import process
        from rapidfuzz.distance import OSA

        if not WORD.fullmatch(typed):
            # Model numbers, years, "(live" and "kids'" are typed as meant: their digits and
            # punctuation are not typos, and the catalog spells them every which way.
            return ((typed, 0.0),)
        reach = self._reach(typed)
        if reach == 1:  # a few hundred lookups beat a scan of the vocabulary
            near_words = [(w, 1) for w in _one_edit(typed, self.letters) if w in self.unigrams]
        elif reach <= INDEX_DEPTH and len(typed) + reach <= INDEX_LONGEST:
            near_words = self.deletions.near(typed, reach)
        else:
            near_words = [(word, int(distance))
                          for length in range(len(typed) - reach, len(typed) + reach + 1)
                          for word, distance, _ in process.extract(
                              typed, self.by_length.get(length, ()), scorer=OSA.distance,
                              score_cutoff=reach, limit=None)]
        found = sorted((distance, -self.unigrams[word], word) for word, distance in near_words
                       if self._may_mean(typed, word))
        prior = self._prior(typed)
        scored = {word: self.channel(typed, word) + prior
                  for _, _, word in found[:MAX_CANDIDATES]}
        # The lattice costs candidates squared per word: keep the ones that could win.
        kept = sorted(scored.items(),
                      key=lambda item: -(item[1] + math.log(self.unigram(item[0]))))
        return ((typed, self.keep), *kept[:MAX_LATTICE - 1])

    def _splits(self, typed: str) -> tuple[tuple[tuple[str, str], float], ...]:
        """((first, second), log P(typed | first second)) for the likeliest ways to read an
        unknown typed word as two known words typed without the space between them."""
        if typed in self.unigrams or not WORD.fullmatch(typed):
            return ()
        known = self.unigrams
        parts = [(typed[:i], typed[i:]) for i in range(1, len(typed))
                 if typed[:i] in known and typed[i:] in known
                 and (i > 1 or typed[:i] in SHORT_WORDS)
                 and (i < len(typed) - 1 or typed[i:] in SHORT_WORDS)]
        parts.sort(key=lambda pair: -known[pair[0]] * known[pair[1]])
        cost = math.log(self.parameters.p_typo) + self.space
        return tuple((pair, cost) for pair in parts[:MAX_SPLITS])

    def _join(self, first: str, second: str) -> tuple[str, float] | None:
        """(word, log P(first second | word)) when the two typed words together are a known
        word typed with a space inside it, else None."""
        word = first + second
        if word not in self.unigrams or not (WORD.fullmatch(first) and WORD.fullmatch(second)):
            return None
        both_known = first in self.unigrams and second in self.unigrams
        prior = self.parameters.p_real_word if both_known else self.parameters.p_typo
        return word, math.log(prior) + self.space

    def _may_mean(self, typed: str, word: str) -> bool:
        """Whether `word` may be what `typed` was meant to be: not the word itself or its
        plural or singular (`_same_word`), and, for words typed with a hyphen between them, a
        word of as many parts, each within its own reach. Such parts were typed apart on
        purpose: a typo inside one is corrected ("wi-fu", "wi-fi"), but the hyphen is no typo
        ("usb-c" became "usb", two deletions from a common word, and "e-mail" "email"), and
        a part that is a word is changed as a known word is, by one edit ("a-ha" became
        "a-yo")."""
        if _same_word(typed, word):
            return False
        if "-" not in typed:  # nearly every typed word: asked once per candidate
            return True
        typed_parts = typed.strip("-").split("-")  # one at either end is a slip: "swift-"
        if len(typed_parts) == 1 or not all(part in self.unigrams for part in typed_parts):
            return True  # no hyphen between words: one inside a word is a slip ("weathe-r")
        from rapidfuzz.distance import OSA

        parts = word.split("-")
        return len(parts) == len(typed_parts) and all(
            OSA.distance(t, p) <= self._reach(t)
            for t, p in zip(typed_parts, parts, strict=True) if t != p)

    def _reach(self, typed: str) -> int:
        """How many edits from `typed` its candidates may be: one for a word the catalog knows
        (a real word typed for another: "form" for "from"), more for longer unknown words."""
        if typed in self.unigrams:
            return 1
        near, medium, far = self.parameters.max_distance
        return near if len(typed) <= 3 else medium if len(typed) <= 6 else far

    def _prior(self, typed: str) -> float:
        """log of a known typed word's typo prior against an unknown one's (0 if unknown)."""
        return math.log(self.parameters.p_real_word / self.parameters.p_typo) \
            if typed in self.unigrams else 0.0

    def _from_context(self, typed: str, previous: Collection[str],
                      found: Collection[str]) -> list[tuple[str, float]]:
        """(word, log P(typed | word)) for the likeliest next words of the `previous` lattice
        words within `CONTEXT_REACH` edits of `typed`, other than those `found` already."""
        from rapidfuzz import process
        from rapidfuzz.distance import OSA

        if not WORD.fullmatch(typed) or self.unigrams.get(typed, 0) > CONTEXT_COMMON:
            return []
        share: dict[str, float] = {}  # each next word's largest share after the previous
        for p in previous:
            for word, fraction in self.next_words.get(p, ()):
                if fraction > share.get(word, 0.0):
                    share[word] = fraction
        hits = [(word, int(distance)) for word, distance, _ in process.extract(
            typed, [w for w in share if w not in found], scorer=OSA.distance,
            score_cutoff=CONTEXT_REACH, limit=None) if self._may_mean(typed, word)]
        # Channel scores (an alignment each) for the few that lead on distance and share.
        hits.sort(key=lambda hit: -share[hit[0]] * 0.1 ** hit[1])
        prior = self._prior(typed)
        scored = [(word, self.channel(typed, word) + prior)
                  for word, _ in hits[:3 * CONTEXT_KEEP]]
        scored.sort(key=lambda item: -(item[1] + math.log(share[item[0]])))
        return scored[:CONTEXT_KEEP]

    # -- decoding ----------------------------------------------------------------------------

    def correct_words(self, words: Sequence[str]) -> tuple[str, float]:
        """The best query for these typed words, and its posterior probability."""
        return self.k_best(words, 1)[0]

    def k_best(self, words: Sequence[str], k: int,
               also: Iterable[str] = ()) -> list[tuple[str, float]]:
        """The `k` likeliest queries for these typed words (fewer if the lattice holds fewer),
        best first, each with its posterior probability: what a re-ranker chooses among. Then
        each query of `also` not among them (the words as typed, another model's answer) with
        its posterior under the same model, scored word for word (`joint`).

        The lattice has a column per typed word, its states the last word meant (what the
        bigram model conditions on). A state is reached from the column before by a candidate
        for the typed word, or by two words the typed word splits into, and from the column
        two back by a word that joins the typed word and the one before it. Each state keeps
        its `k` best paths (Viterbi when k is 1) and the log of all paths' probability."""
        if not words:
            return [("", 1.0)]
        columns: list[_Column] = [_Column({START: [(0.0, ())]}, {START: 0.0})]
        for i, typed in enumerate(words):
            before = columns[-1]
            column = _Column({}, {})
            candidates = self.candidates(typed)
            for word, channel in (*candidates, *self._from_context(
                    typed, before.best, {word for word, _ in candidates})):
                self._extend(before, (word,), channel, column, k)
            for pair, channel in self.splits(typed):
                self._extend(before, pair, channel, column, k)
            if i and (joined := self._join(words[i - 1], typed)) is not None:
                self._extend(columns[-2], (joined[0],), joined[1], column, k)
            columns.append(column)
        best, forward = columns[-1].best, columns[-1].forward
        final = self.language_after(best, END)
        total = _logsumexp([forward[p] + s for p, s in final.items()])
        ended = [(" ".join(meant), score) for score, meant in
                 _top([(score + final[p], meant) for p, paths in best.items()
                       for score, meant in paths], k)]
        found = {text for text, _ in ended}
        ended += [(text, self.joint(words, text.split())) for text in dict.fromkeys(also)
                  if text not in found]
        return [(text, math.exp(score - total)) for text, score in ended]

    def joint(self, words: Sequence[str], meant: Sequence[str]) -> float:
        """log P(meant, typed words) for a query meant word for word as typed, whether or not
        the lattice holds it (-inf when the word counts differ: no split or join is scored)."""
        if len(meant) != len(words):
            return -math.inf
        score, previous = 0.0, START
        for typed, word in zip(words, meant, strict=True):
            channel = self.candidates(typed)[0][1] if word == typed else \
                self.channel(typed, word) + self._prior(typed)
            score += self.language(previous, word) + channel
            previous = word
        return score + self.language(previous, END)

    def _extend(self, before: _Column, meant: tuple[str, ...], channel: float,
                column: _Column, k: int) -> None:
        """Adds to `column` the paths from `before` through the words `meant`, typed as what
        `channel` scores: the `k` best to the state's kept paths, all of them to the forward
        sum."""
        inner = sum(self.language(a, b) for a, b in itertools.pairwise(meant)) + channel
        scores = {previous: score + inner
                  for previous, score in self.language_after(before.best, meant[0]).items()}
        last = meant[-1]
        if k == 1:  # the served path: one best path, no merging (a loop: the hot spot)
            score = -math.inf
            words: tuple[str, ...] = ()
            for previous, ((kept, kept_words),) in before.best.items():
                if kept + scores[previous] > score:
                    score, words = kept + scores[previous], kept_words
            held = column.best.get(last)
            if held is None or score > held[0][0]:
                column.best[last] = [(score, (*words, *meant))]
        else:
            reached_paths = [(score + scores[p], (*words, *meant))
                             for p, paths in before.best.items() for score, words in paths]
            column.best[last] = _top([*column.best.get(last, ()), *reached_paths], k)
        reached = [before.forward[p] + s for p, s in scores.items()]
        if last in column.forward:
            reached.append(column.forward[last])
        column.forward[last] = _logsumexp(reached)

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        return [correction(q, *self.correct_words(normalized(q).split())) for q in queries]


Hypothesis = tuple[float, tuple[str, ...]]  # a path's log-probability and its words


@dataclass
class _Column:
    """The lattice after some typed words: for each last word meant, its best paths, best
    first (one for Viterbi), and the log of all paths' probability (forward)."""
    best: dict[str, list[Hypothesis]]
    forward: dict[str, float]


def _top(paths: Iterable[Hypothesis], k: int) -> list[Hypothesis]:
    """The `k` best of `paths` with distinct words (a split and a join can mean the same)."""
    kept: dict[tuple[str, ...], float] = {}
    for score, words in paths:
        if score > kept.get(words, -math.inf):
            kept[words] = score
    return [(score, words) for words, score in
            heapq.nlargest(k, kept.items(), key=lambda item: item[1])]


def _same_word(typed: str, word: str) -> bool:
    """Whether `word` is `typed` or its plural or singular: a plural for a singular is not a
    typo, retrieval matches either."""
    return word in (typed, typed + "s") or word + "s" == typed


def _one_edit(word: str, letters: str) -> set[str]:
    """Every string one deletion, swap of neighbours, substitution or insertion away."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    return ({a + b[1:] for a, b in splits if b}
            | {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
            | {a + c + b[1:] for a, b in splits if b for c in letters}
            | {a + c + b for a, b in splits for c in letters})


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))
