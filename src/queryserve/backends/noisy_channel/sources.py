"""Candidate queries from beyond the noisy channel's edit reach (issue 43): each source proposes
whole queries for the typed words, and `benchmarks/spell_ceiling.py` measures how far each
would raise the ceiling of the channel's k best on the development split before any is wired in.

- `PhoneticIndex`: lexicon words that sound like a typed word ("nite" -> "night", "fone" ->
  "phone": three and two edits, past the channel's reach for short words);
- `CatalogPhrases`: catalog queries (titles, performers, product heads) matched fuzzily as one
  unit against a span of typed words, spaces included, so a merge or split costs one edit;
- `Segmenter`: a span of one to three typed words with its spaces taken out, re-cut into
  lexicon words ("shakeitoff" -> "shake it off", "wal mart" -> "walmart", "taylo rswift");
- `Seq2SeqBeam`: the seq2seq corrector's n best (beam 4), which reads the whole query at once.

None is served: given to the hybrid's network as more candidates, the beam and the phonetic
mates raised neither the share it gets right with no threshold nor that at <= 1.5% false
corrections, on the development split (BENCHMARKS.md, "measured separately", 2026-11-28).

Every source proposes alternatives only, never the words as typed: whatever re-ranks the union
keeps the typed query as a candidate anyway. The word sources substitute into the words given,
and, where `onto` has as many words (the channel's best answer), into those too, so that a
query with a second typo the channel fixed can still be reached.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rapidfuzz import process
from rapidfuzz.distance import OSA

from queryserve.backends.noisy_channel.tables import WORD


class CandidateSource(Protocol):
    """Alternatives to the typed words, best first, at most `limit`, as space-joined queries."""

    name: str

    def propose(self, words: Sequence[str], limit: int,
                onto: Sequence[str] | None = None) -> list[str]: ...


def _queries(words: Sequence[str], onto: Sequence[str] | None,
             edits: Iterable[tuple[int, int, Sequence[str]]], limit: int) -> list[str]:
    """The queries the span edits (start, end, new words), best first, make of `onto` (when it
    has as many words) then of `words`, without the typed query or repeats."""
    typed = " ".join(words)
    bases = [b for b in (onto, words) if b is not None and len(b) == len(words)]
    found: dict[str, None] = {}
    for start, end, span in edits:
        for base in dict.fromkeys(tuple(b) for b in bases):
            query = " ".join([*base[:start], *span, *base[end:]])
            if query != typed:
                found[query] = None
        if len(found) >= limit:
            break
    return list(found)[:limit]


# -- phonetic keys ---------------------------------------------------------------------------

# A compact Metaphone: spellings of one sound become one letter, silent letters go, vowels after
# the first letter go. Coarser than Double Metaphone (no second key, few exceptions), which is
# fine for proposing: the channel and a re-ranker judge, the key only has to hold the word.
_RULES = tuple((re.compile(p), r) for p, r in (
    (r"^(kn|gn|pn|ps|wr)", lambda m: m.group()[1]), (r"^x", "s"), (r"^wh", "w"), (r"mb$", "m"),
    (r"tch", "ch"), (r"sch", "sk"), (r"ph", "f"), (r"ck", "k"), (r"q", "k"), (r"x", "ks"),
    (r"dg(?=[eiy])", "j"), (r"(?<=.)gh", ""), (r"c(?=[eiy])", "s"), (r"(sh|ch)", "X"),
    (r"c", "k"), (r"th", "0"), (r"z", "s"), (r"(?<=[^aeiou])h|h(?![aeiou])", ""),
    (r"[wy](?![aeiou])", ""),
))


def spoken(word: str) -> str:
    """The word respelled by `_RULES`, vowels kept, doubled letters once: "phone" and "fone"
    are both "fone", "night" is "nit"."""
    text = "".join(c for c in word.lower() if "a" <= c <= "z")
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return "".join(c for i, c in enumerate(text) if i == 0 or c != text[i - 1])


def phonetic_key(word: str) -> str:
    """The word's sound, roughly: `spoken` without the vowels after the first letter;
    "night", "nite" and "knight" are all "nt"."""
    text = spoken(word)
    if not text:
        return ""
    head = "a" if text[0] in "aeiouy" else text[0]
    letters = [head, *(c for c in text[1:] if c not in "aeiouy")]
    return "".join(c for i, c in enumerate(letters) if i == 0 or c != letters[i - 1])


class PhoneticIndex:
    """Lexicon words by `phonetic_key`; a typed word gets the words that share its key, ranked
    by count and closeness: log(count) - `DISTANCE_WEIGHT` per edit between the two as
    `spoken` (a word ten times as common may be one edit further; "phone" is no edit from
    "fone", "fine" one). A typed word the lexicon knows gets only mates at least
    `KNOWN_RATIO` times as common: "nite" is a word the catalog has seen, "night" far more
    often, while "not" for "net" is the channel's business (it has the context). On the
    development sample (1,000 queries) known words getting none cost 0.1 point at k = 30, and
    weights of ln 3 to ln 100 or a ratio of 3 moved the gains by 0.2 point at most."""

    name = "phonetic"
    DISTANCE_WEIGHT = math.log(10)
    KNOWN_RATIO = 10
    MIN_KEY = 2  # a one-letter key ("a", "e") would propose half the short words

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts
        self.by_key: dict[str, list[tuple[str, str]]] = defaultdict(list)  # (word, spoken)
        for word in counts:
            if WORD.fullmatch(word) and len(key := phonetic_key(word)) >= self.MIN_KEY:
                self.by_key[key].append((word, spoken(word)))

    def scored(self, typed: str, limit: int) -> list[tuple[float, str]]:
        """(score, word) for the `limit` likeliest lexicon words that sound like `typed`, best
        first; the score is relative to the typed word's own (its count, no edit)."""
        if not WORD.fullmatch(typed):
            return []
        floor = self.KNOWN_RATIO * self.counts.get(typed, 0)
        own = math.log(self.counts.get(typed, 0) + 1)
        sound = spoken(typed)
        return heapq.nlargest(limit, (
            (math.log(self.counts[w] + 1) - self.DISTANCE_WEIGHT * OSA.distance(sound, s) - own,
             w) for w, s in self.by_key.get(phonetic_key(typed), ())
            if w != typed and self.counts[w] >= floor))

    def propose(self, words: Sequence[str], limit: int,
                onto: Sequence[str] | None = None) -> list[str]:
        # Across positions, the likeliest change first: an unknown word's mates before a known
        # word's (its own count weighs against them).
        edits = sorted((-score, i, w) for i, typed in enumerate(words)
                       for score, w in self.scored(typed, limit))
        return _queries(words, onto, ((i, i + 1, [w]) for _, i, w in edits), limit)


# -- whole catalog phrases -------------------------------------------------------------------

class CatalogPhrases:
    """Catalog queries matched as one unit against each span of up to `MAX_SPAN_WORDS` typed
    words (and the whole query), by optimal string alignment distance over the characters,
    spaces included. A span that is itself a catalog phrase proposes nothing: it is as meant.
    Matches are ranked by distance, then by span length (a longer match says more). Matching
    only spans with a word the lexicon does not know (and the whole query) took 40% off the
    cost but a third of the gain on the development sample (1,000 queries), so every span is."""

    name = "catalog phrase"
    MAX_SPAN_WORDS = 6
    MIN_CHARS = 5  # shorter spans match too many phrases at one edit

    def __init__(self, phrases: Iterable[str]) -> None:
        self.known = frozenset(phrases)
        by_length: dict[int, list[str]] = defaultdict(list)
        for phrase in sorted(self.known):
            by_length[len(phrase)].append(phrase)
        self.by_length = dict(by_length)

    @staticmethod
    def reach(chars: int) -> int:
        """Edits allowed for a span this long: the realistic set's one or two, three for long
        spans (a real misspelling inside a title)."""
        return 1 if chars <= 7 else 2 if chars <= 15 else 3

    def matches(self, text: str, limit: int) -> list[tuple[int, str]]:
        """(distance, phrase) for the `limit` nearest phrases within `reach`, nearest first."""
        reach = self.reach(len(text))
        found = [(int(d), p) for n in range(len(text) - reach, len(text) + reach + 1)
                 for p, d, _ in process.extract(text, self.by_length.get(n, ()),
                                                scorer=OSA.distance, score_cutoff=reach,
                                                limit=limit)]
        return heapq.nsmallest(limit, found)

    def propose(self, words: Sequence[str], limit: int,
                onto: Sequence[str] | None = None) -> list[str]:
        edits: list[tuple[int, int, int, int, list[str]]] = []
        for start in range(len(words)):
            for end in range(start + 1, min(len(words), start + self.MAX_SPAN_WORDS) + 1):
                text = " ".join(words[start:end])
                if len(text) < self.MIN_CHARS or text in self.known:
                    continue
                edits += [(d, start - end, start, end, p.split())
                          for d, p in self.matches(text, limit) if d]
        edits.sort(key=lambda e: e[:2])
        return _queries(words, onto, ((s, e, span) for _, _, s, e, span in edits), limit)


# -- word segmentation -----------------------------------------------------------------------

class Segmenter:
    """Spans of one to `MAX_SPAN_WORDS` typed words with their spaces taken out, cut again into
    lexicon words, the cuts scored by their unigrams (log count / total, so more words cost
    more). Only spans with a word the lexicon does not know are re-cut, or spans that join
    into one known word: correct known words are left alone."""

    name = "segmentation"
    MAX_SPAN_WORDS = 3
    MAX_PARTS = 5
    SHORT = frozenset({"a", "i"})  # the one-letter words a cut may make
    MAX_CHARS = 40  # the cuts cost characters x longest word: a long span is no merge typo

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts
        self.total = sum(counts.values())
        self.longest = max((len(w) for w in counts), default=0)

    def _log_p(self, word: str) -> float | None:
        count = self.counts.get(word)
        if count is None or (len(word) == 1 and word not in self.SHORT) \
                or not WORD.fullmatch(word):
            return None
        return math.log(count / self.total)

    def cuts(self, text: str, limit: int) -> list[tuple[float, tuple[str, ...]]]:
        """The `limit` likeliest ways to read `text` as up to `MAX_PARTS` lexicon words, best
        first, each with its log probability (a k-best dynamic programme over the ends)."""
        if len(text) > self.MAX_CHARS:
            return []
        none: tuple[str, ...] = ()
        best: list[list[tuple[float, tuple[str, ...]]]] = [[(0.0, none)]] + [[] for _ in text]
        for end in range(1, len(text) + 1):
            reached = []
            for start in range(max(0, end - self.longest), end):
                logp = self._log_p(text[start:end])
                if logp is not None:
                    reached += [(score + logp, (*parts, text[start:end]))
                                for score, parts in best[start] if len(parts) < self.MAX_PARTS]
            best[end] = heapq.nlargest(limit, reached)
        return best[len(text)]

    def propose(self, words: Sequence[str], limit: int,
                onto: Sequence[str] | None = None) -> list[str]:
        edits: list[tuple[float, int, int, tuple[str, ...]]] = []
        for start in range(len(words)):
            for end in range(start + 1, min(len(words), start + self.MAX_SPAN_WORDS) + 1):
                span = words[start:end]
                joined = "".join(span)
                if all(w in self.counts for w in span) and (end - start == 1
                                                            or joined not in self.counts):
                    continue
                # Ranked by how much likelier the cut is than the span as typed (an unknown
                # word counts as once seen), so a cut of one word beats one of a long span.
                typed = sum(math.log(self.counts.get(w, 1) / self.total) for w in span)
                edits += [(typed - score, start, end, parts)
                          for score, parts in self.cuts(joined, limit)
                          if list(parts) != list(span)]
        edits.sort()
        return _queries(words, onto, ((s, e, parts) for _, s, e, parts in edits), limit)


# -- the seq2seq's n best --------------------------------------------------------------------

class Seq2SeqBeam:
    """A served seq2seq corrector's CTranslate2 model decoding with beam search, its `beam`
    hypotheses the candidates (int8 on one thread, as the hybrid corrector runs it). The text
    is decoded as the served `text2text` pipeline decodes it (special tokens dropped); this
    layer may not import the pipeline, so the few lines are repeated here."""

    name = "seq2seq beam 4"
    MAX_TOKENS = 128

    def __init__(self, model_dir: Path, tokenizer_file: Path, beam: int = 4,
                 compute_type: str = "int8", threads: int = 1) -> None:
        import ctranslate2
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.translator: Any = ctranslate2.Translator(
            str(model_dir), device="cpu", compute_type=compute_type, inter_threads=1,
            intra_threads=threads)
        self.beam = beam

    def propose_many(self, queries: Sequence[Sequence[str]], limit: int) -> list[list[str]]:
        """Each typed query's hypotheses other than itself, best first (one batch)."""
        if not queries:
            return []
        typed = [" ".join(words) for words in queries]
        sources = [e.tokens for e in self.tokenizer.encode_batch(typed)]
        results = self.translator.translate_batch(
            sources, max_batch_size=0, beam_size=self.beam, num_hypotheses=self.beam,
            max_decoding_length=self.MAX_TOKENS, max_input_length=self.MAX_TOKENS,
            min_decoding_length=0)
        unknown = self.tokenizer.token_to_id("<unk>") or 0
        proposed = []
        for text, result in zip(typed, results, strict=True):
            ids = [[i if (i := self.tokenizer.token_to_id(t)) is not None else unknown
                    for t in tokens] for tokens in result.hypotheses]
            texts = [" ".join(t.split()) for t in
                     self.tokenizer.decode_batch(ids, skip_special_tokens=True)]
            proposed.append([t for t in dict.fromkeys(texts) if t and t != text][:limit])
        return proposed

    def propose(self, words: Sequence[str], limit: int,
                onto: Sequence[str] | None = None) -> list[str]:
        return self.propose_many([words], limit)[0]
