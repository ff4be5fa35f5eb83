"""The model API's vocabulary: what a served model takes and what it answers.

Every served model, the search ensemble included, has one awaitable entry point,
`Model.infer(Inputs) -> result`, and each kind of model answers with one of the typed results
below. The meaning of a model's output (the likeliest labels, a correction and whether it
changed the query, a pair's decision at its threshold) is computed by the model, so every front
end (KServe v2, OpenAI, the task routes) only encodes it.

A leaf module: the backends, the pipelines, the front ends and the tools all import it.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real

from queryserve.errors import InvalidInput
from queryserve.types import Array


@dataclass(frozen=True, slots=True)
class Inputs:
    """One request's decoded inputs: validated, non-empty texts, one row each (or rows of
    token ids, `token_ids`)."""

    texts: Sequence[str]
    pairs: Sequence[str] | None = None
    """The second text of each row, for a model that takes pairs (same length as `texts`)."""
    parameters: Mapping[str, object] = field(default_factory=dict)
    """Options of the model's kind, by name (`top_k`, `threshold`, `k`, `catalog`, `spell`);
    a model ignores the ones it does not take, as KServe's request parameters are ignored."""
    timeout_s: float | None = None
    """How long the items may wait in the queue; None: the model's default."""
    token_ids: Sequence[Sequence[int]] | None = None
    """Rows already tokenized, in place of `texts` (then empty): non-empty lists of ids of the
    model's own tokenizer, special tokens included, as OpenAI's and TEI's `input` may send
    them. The model checks them against its vocabulary and truncates them as it does text."""


# -- the typed results ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Embeddings:
    vectors: Array
    """[n, width] FP32, one unit vector per text."""
    tokens: int
    """Tokens the texts hold after truncation (OpenAI's `usage`)."""


@dataclass(frozen=True, slots=True)
class Label:
    name: str
    score: float
    """The label's probability (calibrated where the model has a calibration)."""
    confident: bool = True
    """Whether `score` reaches the model's confidence threshold (`calibration.json`, fitted on
    held-out data); a model without a calibration has no threshold, and says True."""


@dataclass(frozen=True, slots=True)
class Classifications:
    probabilities: Array
    """[n, classes] FP32."""
    top: list[list[Label]]
    """Each text's `top_k` likeliest labels, likeliest first."""
    tokens: int


@dataclass(frozen=True, slots=True)
class Correction:
    query: str
    corrected: str
    changed: bool
    """Whether `corrected` differs from the query as typed, ignoring case and extra spaces."""
    score: float
    """The corrector's confidence in `corrected`, 0 to 1 (the seq2seq model: the geometric mean
    of its token probabilities; the noisy channel: the posterior; a dictionary: 1)."""


@dataclass(frozen=True, slots=True)
class Corrections:
    corrections: list[Correction]
    generated: list[str]
    """The model's own text for each query, as generated (empty when it generated nothing,
    where the correction keeps the query): what KServe's output tensor carries."""
    tokens: int


@dataclass(frozen=True, slots=True)
class PairScores:
    probabilities: Array
    """[n] FP32: the probability that each pair names one product."""
    threshold: float
    duplicates: list[bool]
    """Each pair's decision: probability >= threshold."""
    tokens: int


@dataclass(frozen=True, slots=True)
class Hit:
    id: str
    title: str
    performer_or_brand: str
    score: float


@dataclass(frozen=True, slots=True)
class SearchAnswer:
    query: str
    corrected: str
    changed: bool
    spell_score: float | None  # None: the spell step did not run (off, or skipped)
    searched: str
    """What was searched: the correction when sure enough, else the query as typed."""
    intent: Label | None
    """None without an intent step, or when that step could not answer in time (overloaded,
    unloaded): the search answers without it."""
    catalog: str
    results: list[Hit]
    timings_ms: dict[str, float]
    skipped: list[str] = field(default_factory=list)
    """Optional steps (spell, intent) that could not answer now, by model name."""


@dataclass(frozen=True, slots=True)
class Searches:
    answers: list[SearchAnswer]
    tokens: int = 0


Result = Embeddings | Classifications | Corrections | PairScores | Searches


# -- what every text model shares ----------------------------------------------------------


def normalized(query: str) -> str:
    """How queries are compared: correctors lower-case, and spacing is not a spelling."""
    return " ".join(query.lower().split())


def correction(query: str, corrected: str, score: float) -> Correction:
    """An empty generation corrects nothing: the query stands, as typed but normalized."""
    corrected = corrected or normalized(query)
    return Correction(query, corrected, corrected != normalized(query), score)


def decode_texts(raw: Sequence[object], where: str) -> list[str]:
    """Each item as text, checked before it is batched: UTF-8, not blank. Errors name the
    item."""
    texts = []
    for i, item in enumerate(raw):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(f"{where}[{i}] is not valid UTF-8 text") from None
        if not isinstance(item, str):
            raise InvalidInput(f"{where}[{i}] must be a string, got {type(item).__name__}")
        if is_blank(item):
            raise InvalidInput(f"{where}[{i}] is empty; send non-empty text")
        texts.append(item)
    return texts


def is_blank(text: str) -> bool:
    """Nothing a model could read: empty, spaces, or only controls and format characters."""
    return not text.strip() or (not text.isprintable() and not _visible(text))


def _visible(text: str) -> bool:
    """Whether a text holds a character that is not a space, a control or a format character
    (NUL, zero-width space, BOM...): a text of only those is empty to every tokenizer here,
    and was answered with the vector of no text (or a seq2seq's invented "correction")."""
    return any(unicodedata.category(c)[0] not in "CZ" for c in text)


def as_json(value: object, limit: int = 80) -> str:
    """A client's value as they wrote it, in JSON (`null`, `true`, `"3"`), cut at `limit`
    characters: an error quoting it in Python (`None`, `True`, `'3'`) spoke another language
    than the request's."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def integer_parameter(inputs: Inputs, name: str, default: int, low: int, high: int) -> int:
    value = inputs.parameters.get(name, default)
    # Integral: numpy's integers too (a library caller's np.int64 `top_k` was refused, as "3")
    if isinstance(value, bool) or not isinstance(value, Integral) \
            or not low <= int(value) <= high:
        raise InvalidInput(f"'{name}' must be an integer from {low} to {high}, got "
                           f"{as_json(value)}")
    return int(value)


def number_parameter(inputs: Inputs, name: str, default: float, low: float,
                     high: float) -> float:
    value = inputs.parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, Real) \
            or not low <= float(value) <= high:
        raise InvalidInput(f"'{name}' must be a number from {low:g} to {high:g}, got "
                           f"{as_json(value)}")
    return float(value)


def flag_parameter(inputs: Inputs, name: str, default: bool) -> bool:
    value = inputs.parameters.get(name, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"'{name}' must be true or false, got {as_json(value)}")
    return value
