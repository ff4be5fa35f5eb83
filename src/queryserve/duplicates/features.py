"""What a pair of product texts share, beyond their embeddings: a few string signals that an
encoder of 64 tokens blurs, chiefly model numbers ("dscw120p" against "dsc-w120/p").

Each is a number in [0, 1] (or 0.5 for "cannot tell"), cheap enough to compute for every
candidate pair of a batch job (tens of microseconds a pair) and the same at training and
serving time.
"""

from __future__ import annotations

import re

import numpy as np

from queryserve.types import Array

FEATURES = ("token_jaccard", "token_containment", "code_match", "code_inside", "number_jaccard")
_TOKEN = re.compile(r"[a-z0-9]+")
_CODE = re.compile(r"[a-z0-9][a-z0-9\-/.]*[a-z0-9]")


def model_codes(text: str) -> set[str]:
    """Model-number-like tokens: letters and digits together, 4 characters or more, with
    separators dropped so that spellings of one code compare equal."""
    codes = set()
    for token in _CODE.findall(text):
        code = re.sub(r"[\-/.]", "", token)
        if len(code) >= 4 and not code.isdigit() and not code.isalpha():
            codes.add(code)
    return codes


def pair_features(a: str, b: str) -> list[float]:
    a, b = a.lower(), b.lower()
    ta, tb = set(_TOKEN.findall(a)), set(_TOKEN.findall(b))
    shared = len(ta & tb)
    jaccard = shared / max(1, len(ta | tb))
    containment = shared / max(1, min(len(ta), len(tb)))
    ca, cb = model_codes(a), model_codes(b)
    code_match = 1.0 if ca & cb else 0.0 if ca and cb else 0.5
    squashed_a, squashed_b = "".join(_TOKEN.findall(a)), "".join(_TOKEN.findall(b))
    inside = any(c in squashed_b for c in ca) or any(c in squashed_a for c in cb)
    code_inside = 1.0 if inside else 0.0 if ca or cb else 0.5
    na, nb = {t for t in ta if t.isdigit()}, {t for t in tb if t.isdigit()}
    numbers = len(na & nb) / len(na | nb) if na | nb else 0.5
    return [jaccard, containment, code_match, code_inside, numbers]


def features_array(pairs: list[tuple[str, str]]) -> Array:
    return np.asarray([pair_features(a, b) for a, b in pairs], dtype=np.float32).reshape(
        len(pairs), len(FEATURES))
