"""What a pair of product texts share, beyond their embeddings: a few string signals that an
encoder of 64 tokens blurs, chiefly model numbers ("dscw120p" against "dsc-w120/p") and the
quantities that tell siblings apart (a 4 GB card from the 16 GB one of the same line).

Each is a number in [0, 1] (or 0.5 for "cannot tell"), the same at training and serving time.
What they read of a text (`TextSignals`) is worked out once per text of a call; the batch job,
which pairs each product with many others, also keeps it across calls (`features_array`'s
`read`), so comparing a pair costs about 15 microseconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rapidfuzz.distance import Levenshtein

from queryserve.types import Array

FEATURES = ("token_jaccard", "token_containment", "code_match", "code_inside", "number_jaccard",
            "code_sibling", "quantity_conflict")
_TOKEN = re.compile(r"[a-z0-9]+")
_CODE = re.compile(r"[a-z0-9][a-z0-9\-/.]*[a-z0-9]")
# Units whose number is a specification, not a model: "16gb", "1333mhz", "350w", "6.5-inch".
_UNIT = {"gb": "gb", "tb": "tb", "mb": "mb", "mhz": "mhz", "ghz": "ghz", "mp": "mp",
         "megapixel": "mp", "megapixels": "mp", "w": "w", "watt": "w", "watts": "w", "v": "v",
         "volt": "v", "volts": "v", "mah": "mah", "in": "in", "inch": "in", "inches": "in",
         "ft": "ft", "feet": "ft", "mm": "mm", "cm": "cm", "m": "m", "oz": "oz", "lb": "lb",
         "lbs": "lb", "pk": "pk", "pack": "pk", "pcs": "pk", "x": "x", "ml": "ml", "l": "l",
         "hz": "hz", "rpm": "rpm", "ppm": "ppm", "page": "page", "pages": "page",
         "port": "port", "ports": "port", "ch": "ch", "channel": "ch", "cup": "cup",
         "cups": "cup", "qt": "qt", "gal": "gal", "ohm": "ohm", "db": "db", "bit": "bit",
         "sheets": "sheet", "sheet": "sheet"}
_UNITS = "|".join(sorted(_UNIT, key=len, reverse=True))
_QUANTITY = re.compile(rf"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s*-?\s*({_UNITS})(?![a-z0-9])")
_UNIT_NUMBER = re.compile(rf"^\d+(?:\.\d+)?(?:{_UNITS})$")


def model_codes(text: str) -> set[str]:
    """Model-number-like tokens, with separators dropped so that spellings of one code compare
    equal: letters and digits together (4 characters or more, 2 digits or more unless longer
    than 5: "ddr3" is a kind, not a model), or 5 digits or more; never a quantity ("16gb")."""
    codes = set()
    for token in _CODE.findall(text):
        code = re.sub(r"[\-/.]", "", token)
        if code.isalpha() or len(code) < 4 or _UNIT_NUMBER.match(code):
            continue
        if code.isdigit() and len(code) < 5:
            continue
        if sum(c.isdigit() for c in code) < 2 and len(code) < 6:
            continue
        codes.add(code)
    return codes


def quantities(text: str) -> dict[str, set[float]]:
    """Numbers with a unit, by unit: "4 gb sdhc, class 6" -> {"gb": {4.0}}."""
    found: dict[str, set[float]] = {}
    for number, unit in _QUANTITY.findall(text):
        found.setdefault(_UNIT[unit], set()).add(float(number))
    return found


@dataclass(frozen=True, slots=True)
class TextSignals:
    """What the features read of one text."""
    tokens: frozenset[str]
    numbers: frozenset[str]
    codes: frozenset[str]
    squashed: str  # letters and digits only: a code spelled with separators still matches
    quantities: dict[str, set[float]]


def text_signals(text: str) -> TextSignals:
    text = text.lower()
    tokens = _TOKEN.findall(text)
    return TextSignals(frozenset(tokens), frozenset(t for t in tokens if t.isdigit()),
                       frozenset(model_codes(text)), "".join(tokens), quantities(text))


def pair_features(a: str, b: str) -> list[float]:
    return _compare(text_signals(a), text_signals(b))


def _compare(sa: TextSignals, sb: TextSignals) -> list[float]:
    ta, tb = sa.tokens, sb.tokens
    shared = len(ta & tb)
    jaccard = shared / max(1, len(ta | tb))
    containment = shared / max(1, min(len(ta), len(tb)))
    ca, cb = sa.codes, sb.codes
    code_match = 1.0 if ca & cb else 0.0 if ca and cb else 0.5
    inside = any(c in sb.squashed for c in ca) or any(c in sa.squashed for c in cb)
    code_inside = 1.0 if inside else 0.0 if ca or cb else 0.5
    na, nb = sa.numbers, sb.numbers
    numbers = len(na & nb) / len(na | nb) if na | nb else 0.5
    # Siblings: codes one edit apart or one extending the other (ts-a1683r, ts-a1684r), the
    # likeliest false match of a product line.
    sibling = 0.5
    if ca and cb and not inside:
        sibling = 1.0 if any(Levenshtein.distance(x, y, score_cutoff=1) == 1
                             or x.startswith(y) or y.startswith(x)
                             for x in ca for y in cb) else 0.0
    qa, qb = sa.quantities, sb.quantities
    units = qa.keys() & qb.keys()
    conflict = (1.0 if any(not qa[u] & qb[u] for u in units) else 0.0) if units else 0.5
    return [jaccard, containment, code_match, code_inside, numbers, sibling, conflict]


def features_array(pairs: list[tuple[str, str]],
                   read: Callable[[str], TextSignals] = text_signals) -> Array:
    """[n, FEATURES] for the pairs; each distinct text is read once (by `read`: a caching
    one where the same texts come back call after call)."""
    signals = {text: read(text) for text in {t for pair in pairs for t in pair}}
    return np.asarray([_compare(signals[a], signals[b]) for a, b in pairs],
                      dtype=np.float32).reshape(len(pairs), len(FEATURES))


def pair_hint(a: str, b: str, read: Callable[[str], TextSignals] = text_signals) -> str:
    """What the model numbers and quantities of two product texts say, in words a cross-encoder
    reads before the pair ("same model", "sibling model", "different model"; "same size",
    "different size"; empty when neither tells): Ditto's injected domain knowledge. A
    Transformer compares "dsc-w120/p" with "dscw120p" poorly through its word pieces; these
    rules compare them exactly."""
    _, _, code_match, code_inside, _, sibling, conflict = _compare(read(a), read(b))
    words = []
    if code_inside == 1.0:
        words.append("same model")
    elif sibling == 1.0:
        words.append("sibling model")
    elif code_match == 0.0:
        words.append("different model")
    if conflict == 1.0:
        words.append("different size")
    elif conflict == 0.0:
        words.append("same size")
    return " ".join(words)


def hinted(pairs: list[tuple[str, str]],
           read: Callable[[str], TextSignals] = text_signals) -> list[tuple[str, str]]:
    """The pairs as a cross-encoder trained with hints reads them: the hint, then the first
    text, as its first segment."""
    out = []
    for a, b in pairs:
        hint = pair_hint(a, b, read)
        out.append((f"{hint} | {a}" if hint else a, b))
    return out
