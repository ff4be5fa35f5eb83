"""The hybrid corrector: the noisy channel proposes, a seq2seq Transformer and a small network
choose, and the choice comes with the probability that it is what the user meant.

For typed words t the candidates are the channel's `k` likeliest queries and the words as
typed. The seq2seq scores each candidate c as log P(c | t) (one teacher-forced pass for all of
them: CTranslate2's `score_batch`), the channel gives each its posterior, and `features` turns
both into 15 numbers per candidate, most of them relative to the other candidates and to the
words as typed. Two networks of one hidden layer (`RerankerWeights`, fitted by `queryserve
train spell-hybrid` on development queries that neither model saw) ask two questions: is the
candidate the meant query (P(right), for each candidate), and are the words as typed
misspelled at all (the `gate`, on the typed words' row). The likeliest candidate is the
answer; its score is P(right), times P(misspelled) for a correction. Below an auto-correct
threshold the query stands (a search pipeline's `min_score`), the answer a "did you mean" at
most. The gate was chosen on the development split (issue 43; fitted on half, scored on the
other, at 0.97% false corrections: 61.3% of the misspelled queries and 28.2% of the words
right, against 60.1% and 21.6% without it). Its scores run lower than the first network's
alone, so a threshold changes fewer queries than before: 0.8 gave 0.97% false corrections on
the development split where it gave 1.58%, and about 0.82 gives 0.8%.
Features of how common the typed words are (catalog, dictionary and web counts, words nothing
knows, catalog words a candidate brings in) were tried with it and not kept: on the
development split they helped at 1.0-1.5% false corrections and not at 0.8% or below. Nor
were, on 2026-11-28: the seq2seq's beam of 4 and phonetic mates (`sources`) as candidates,
features of what a candidate changes (only a space or punctuation; typed words the catalog
knows), or a third network on the proposed correction; on `eval spell`'s sets none moved the
accuracy at <= 1% false corrections by more than the fit's seed alone does (1-3 points;
BENCHMARKS.md, "measured separately").

Where the channel is sure the words are right as typed (posterior >= `SURE`), the seq2seq is
not run and the channel's posterior is the score: most correctly typed queries take that path,
at the channel's speed. Where it is as sure of a correction (posterior >= the fit's
`channel_sure`, 0.99: `spell.hybrid.CHANNEL_SURE` says how it was chosen), the seq2seq is not
run either and the channel's answer and posterior stand: there the network was no more often
right. Scoring is the expensive step (each candidate encodes the query again), so a candidate
the channel all but rules out (`UNLIKELY`) is not scored, `k` is 3 (on `eval spell`'s sets 3
did as well as 8, and the seq2seq's own greedy answer as one more candidate, 4 ms a query,
gained 0.7 to 1.6 points), and the seq2seq scores in int8 on one thread (`compute_type`, the
type the network was fitted on): 2.2x less CPU a query than float32 on one thread, and
CTranslate2's int8 on two threads was 3x slower than on one on these two cores (BENCHMARKS.md,
"measured separately"). Encoding the query once in ONNX Runtime was no faster than that.

Why both models: the channel knows the catalog's words and how people mistype them; the
seq2seq reads the whole query at once, and the network learns where each is right.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from queryserve.api import Correction, correction, normalized
from queryserve.backends.noisy_channel.channel import NoisyChannel
from queryserve.errors import ConfigError
from queryserve.types import Array

RERANKER_FILE = "reranker.json"
SEQ2SEQ_FOLDER = "seq2seq"  # the scoring model: CTranslate2's folder and its tokenizer
SURE = 0.999  # a channel posterior for the words as typed that needs no second opinion
# A candidate the channel gives less than this is not scored (the words as typed always are):
# on 1,000 hard-set and 1,000 clean queries, 30% fewer pairs were scored for the same accuracy
# and false corrections (BENCHMARKS.md, "measured separately"). 0.1 scored 23% fewer again at
# the same accuracy on eval's sets, but the development split put its words 3 points lower.
UNLIKELY = 0.01
# CTranslate2 sorts a larger batch by length and scores it in chunks of this many pairs: the
# pairs of 32 queries in one padded batch cost 1.9-2.1 ms a pair, in chunks of 8 0.93, one
# query's pairs alone 1.0-1.1 (int8, one thread; BENCHMARKS.md, "measured separately").
SCORE_BATCH = 8
FEATURES = (
    "channel log posterior", "seq2seq log probability", "seq2seq log probability per token",
    "as typed", "words changed", "outside the channel's reach",
    "channel rank", "channel log posterior - best", "seq2seq log probability - best",
    "as typed: channel log posterior", "as typed: seq2seq log probability",
    "as typed: seq2seq log probability per token", "typed words",
    "channel log posterior - as typed", "seq2seq log probability - as typed")
GATE_FIELDS = ("mean", "scale", "hidden", "hidden_bias", "out", "out_bias")
"""A `gate`'s fields in reranker.json: the second network, as `RerankerWeights` holds the
first."""
_FLOOR = math.log(1e-30)  # the log posterior of a candidate the channel cannot align
MAX_TOKENS = 128
"""The seq2seq's positions (`max_position_embeddings` of models/spell): a longer query, or
candidate, is the channel's alone."""


@dataclass(frozen=True)
class RerankerWeights:
    """The fitted network: features standardised (`mean`, `scale`), one ReLU layer, a sigmoid;
    and how it is asked: the seq2seq's CTranslate2 `compute_type` its features came from, and
    the channel posterior of a correction at which the channel answers alone (`channel_sure`;
    None: never). Both default to what a reranker.json written before them meant. `gate`
    asks the second question (`misspelled`); None: the first alone, as before it."""
    k: int  # the channel's candidates per query
    mean: list[float]
    scale: list[float]
    hidden: list[list[float]]  # features x units
    hidden_bias: list[float]
    out: list[float]
    out_bias: float
    compute_type: str = "float32"
    channel_sure: float | None = None
    gate: dict[str, Any] | None = None  # the same fields, `mean` to `out_bias`

    def channel_alone(self, typed: str, best: tuple[str, float]) -> bool:
        """Whether the channel's best hypothesis stands without the seq2seq: the words as
        typed, or a correction, that the channel is sure of."""
        text, posterior = best
        return posterior >= SURE if text == typed else \
            self.channel_sure is not None and posterior >= self.channel_sure

    @cached_property
    def _arrays(self) -> tuple[Array, Array, Array, Array, Array]:
        return (np.asarray(self.mean), np.asarray(self.scale), np.asarray(self.hidden),
                np.asarray(self.hidden_bias), np.asarray(self.out))

    def probabilities(self, features: Array) -> Array:
        """P(right) for each row of `features`."""
        mean, scale, hidden, hidden_bias, out = self._arrays
        h = np.maximum((features - mean) / scale @ hidden + hidden_bias, 0.0)
        z = np.clip(h @ out + self.out_bias, -60.0, 60.0)  # exp() never overflows
        p: Array = 1.0 / (1.0 + np.exp(-z))
        return p

    @cached_property
    def _gate(self) -> RerankerWeights | None:
        return None if self.gate is None else RerankerWeights(self.k, **self.gate)

    def misspelled(self, typed_row: Array) -> float:
        """P(the words as typed are not what the user meant) from their row of `FEATURES`:
        the second question, 1.0 where the fit has no `gate`."""
        gate = self._gate
        return 1.0 if gate is None else float(gate.probabilities(typed_row[None, :])[0])

    def save(self, folder: Path) -> Path:
        path = folder / RERANKER_FILE
        path.write_text(json.dumps({"features": FEATURES, **asdict(self)}) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> RerankerWeights:
        raw = json.loads(path.read_text())
        if tuple(raw.pop("features")) != FEATURES:
            raise ConfigError(f"{path} was fitted on other features than this version "
                              "computes; fit it again with `queryserve train spell-hybrid`")
        gate = raw.get("gate")
        if gate is not None and (not isinstance(gate, dict) or set(gate) != set(GATE_FIELDS)):
            raise ConfigError(f"{path}: 'gate' must hold {', '.join(GATE_FIELDS)}; "
                              "fit it again with `queryserve train spell-hybrid`")
        return cls(**raw)


def features(typed: str, candidates: Sequence[str], posteriors: Sequence[float],
             log_probs: Sequence[float], tokens: Sequence[int], k: int) -> Array:
    """A row of `FEATURES` per candidate (the words as typed among them): the channel's
    posteriors and the seq2seq's log-probabilities (summed over `tokens` tokens)."""
    channel = np.array([math.log(p) if p > 0 else _FLOOR for p in posteriors])
    seq2seq = np.asarray(log_probs, dtype=np.float64)
    per_token = seq2seq / np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)
    i = candidates.index(typed)
    words = typed.split()
    rows = []
    for j, candidate in enumerate(candidates):
        meant = candidate.split()
        changed = sum(a != b for a, b in zip(meant, words, strict=True)) \
            if len(meant) == len(words) else abs(len(meant) - len(words)) + 1
        rows.append([channel[j], seq2seq[j], per_token[j], j == i, changed,
                     posteriors[j] == 0, min(j, k), channel[j] - channel.max(),
                     seq2seq[j] - seq2seq.max(), channel[i], seq2seq[i], per_token[i],
                     len(words), channel[j] - channel[i], seq2seq[j] - seq2seq[i]])
    return np.asarray(rows, dtype=np.float64)


class Seq2SeqScorer:
    """A served seq2seq corrector's CTranslate2 model and tokenizer, as the re-ranker uses it:
    log P(candidate | query) for any candidates."""

    def __init__(self, folder: Path, compute_type: str = "float32", threads: int = 1) -> None:
        import ctranslate2
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # `threads`: the instance's share of the cores (the server's intra-op budget), for
        # float32; int8 takes one, as it was 3x slower on two. The CPU even beside a GPU, so
        # that the scores are those the network was fitted on (`compute_type` on a CPU)
        # wherever it is served; a GPU's were not measured.
        self.translator = ctranslate2.Translator(
            str(folder / "ctranslate2"), device="cpu", compute_type=compute_type,
            inter_threads=1, intra_threads=threads if compute_type == "float32" else 1)

    def _tokens(self, texts: Sequence[str]) -> list[list[str]]:
        return [e.tokens for e in self.tokenizer.encode_batch(list(texts))]

    def log_probs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, int] | None]:
        """(log P(candidate | query), tokens scored) for each (query, candidate); None where
        either is longer than the model's positions (`MAX_TOKENS`)."""
        sources = self._tokens([query for query, _ in pairs])
        # The target without its end token (CTranslate2 puts the decoder's start token first),
        # and it scores that end token too, one position past the target's: a target of
        # MAX_TOKENS tokens raised "no position encodings" (a 500 for a 125-character query).
        targets = [tokens[:-1] for tokens in self._tokens([c for _, c in pairs])]
        fits = [len(a) <= MAX_TOKENS and len(b) < MAX_TOKENS
                for a, b in zip(sources, targets, strict=True)]
        results = iter(self.translator.score_batch(
            [a for a, ok in zip(sources, fits, strict=True) if ok],
            [b for b, ok in zip(targets, fits, strict=True) if ok],
            max_batch_size=SCORE_BATCH) if any(fits) else [])
        scored: list[tuple[float, int] | None] = []
        for ok in fits:
            r = next(results) if ok else None
            scored.append(None if r is None else (float(sum(r.log_probs)), len(r.log_probs)))
        return scored


@dataclass(frozen=True)
class Candidates:
    """One query's candidates and the evidence on each. `features` is empty where the
    seq2seq was not asked (`RerankerWeights.channel_alone`, or the query is longer than the
    seq2seq reads); then the channel's answer stands."""
    typed: str
    texts: list[str]
    posteriors: list[float]
    features: Array


def candidates(channel: NoisyChannel, scorer: Seq2SeqScorer, queries: Sequence[list[str]],
               weights: RerankerWeights) -> list[Candidates]:
    """Every query's candidates, the seq2seq run once for the batch's unsure ones."""
    typed = [" ".join(words) for words in queries]
    proposed = [[(c, p) for c, p in channel.k_best(words, weights.k, also=[text])
                 if p >= UNLIKELY or c == text]
                for words, text in zip(queries, typed, strict=True)]
    unsure = [not weights.channel_alone(text, h[0]) for text, h in zip(typed, proposed,
                                                                        strict=True)]
    scores = iter(scorer.log_probs([(text, c) for text, hypotheses, ask
                                    in zip(typed, proposed, unsure, strict=True)
                                    if ask for c, _ in hypotheses]))
    out = []
    for text, hypotheses, ask in zip(typed, proposed, unsure, strict=True):
        texts, posteriors = [c for c, _ in hypotheses], [p for _, p in hypotheses]
        scored = [next(scores) for _ in texts] if ask else []
        if not ask or any(s is None for s in scored):
            out.append(Candidates(text, texts, posteriors, np.empty((0, len(FEATURES)))))
            continue
        pairs = [s for s in scored if s is not None]
        out.append(Candidates(text, texts, posteriors, features(
            text, texts, posteriors, [s for s, _ in pairs], [n for _, n in pairs], weights.k)))
    return out


def choose(weights: RerankerWeights, c: Candidates) -> tuple[str, float]:
    """The likeliest candidate and its score (the channel's posterior, where it alone
    answers). A correction's score answers two questions: P(it is the meant query), from the
    first network, times P(the words as typed are misspelled), from the `gate`."""
    if not len(c.features) or weights.channel_alone(c.typed, (c.texts[0], c.posteriors[0])):
        return c.texts[0], c.posteriors[0]
    p = weights.probabilities(c.features)
    best = int(p.argmax())
    if c.texts[best] == c.typed:
        return c.typed, float(p[best])
    return c.texts[best], float(p[best]) * weights.misspelled(
        c.features[c.texts.index(c.typed)])


class HybridCorrector:
    """The channel's candidates re-ranked: `correct_words` for the backend, `correct` for
    `queryserve eval spell`; one thread at a time per instance."""

    name = "hybrid"

    def __init__(self, channel: NoisyChannel, scorer: Seq2SeqScorer,
                 weights: RerankerWeights) -> None:
        self.channel, self.scorer, self.weights = channel, scorer, weights

    @classmethod
    def load(cls, folder: Path, threads: int = 2) -> HybridCorrector:
        weights = RerankerWeights.load(folder / RERANKER_FILE)
        return cls(NoisyChannel.load(folder), Seq2SeqScorer(
            folder / SEQ2SEQ_FOLDER, weights.compute_type, threads), weights)

    def correct_words(self, queries: Sequence[list[str]]) -> list[tuple[str, float]]:
        """The answer for each query's words, and its probability (an empty query is itself,
        for sure)."""
        worded = iter(candidates(self.channel, self.scorer, [w for w in queries if w],
                                 self.weights))
        return [choose(self.weights, next(worded)) if words else ("", 1.0) for words in queries]

    def correct(self, queries: Sequence[str]) -> list[Correction]:
        chosen = self.correct_words([normalized(q).split() for q in queries])
        return [correction(q, text, score)
                for q, (text, score) in zip(queries, chosen, strict=True)]
