"""The realistic typo generator and the Wilson interval behind `eval spell`'s figures."""

from __future__ import annotations

from collections import Counter

import pytest
from rapidfuzz.distance import OSA

from queryserve.spell.intervals import wilson
from queryserve.spell.typos import (
    KIND_WEIGHTS,
    NEIGHBOURS,
    REAL,
    TypoGenerator,
    place_real_misspellings,
)

QUERIES = ["taylor swift", "play some jazz", "ed sheeran perfect", "set an alarm for 7 am",
           "sony turntable", "blank space", "shake it off", "olly play the beatles",
           "wake me up at five", "bad bunny", "oats", "iphone 13 case", "zombie bad wolf"]
MANY = [f"{q} {w}" for q in QUERIES for w in ("now", "please", "tonight", "kendrick lamar",
                                              "in the car", "up", "today")] + QUERIES


def test_typos_are_deterministic_per_seed_and_query() -> None:
    first = [TypoGenerator(3).corrupt(q) for q in MANY]
    assert first == [TypoGenerator(3).corrupt(q) for q in MANY]
    # A query's typo does not depend on which other queries are drawn (a --size sample).
    assert [TypoGenerator(3).corrupt(q) for q in MANY[::-1]] == first[::-1]
    assert first != [TypoGenerator(4).corrupt(q) for q in MANY]


def test_most_typos_are_one_edit_and_edits_are_exact() -> None:
    typos = [t for seed in range(3) for q in MANY if (t := TypoGenerator(seed).corrupt(q))]
    assert len(typos) == 3 * len(MANY)
    edits = Counter(t.edits for t in typos)
    assert set(edits) == {1, 2}
    assert edits[1] / len(typos) >= 0.8
    for t in typos:
        assert t.typed != t.meant and OSA.distance(t.typed, t.meant) == t.edits
        assert len(t.kinds) == t.edits


def test_every_kind_of_edit_appears_and_does_what_it_says() -> None:
    typos = [t for seed in range(20) for q in MANY
             if (t := TypoGenerator(seed).corrupt(q)) and t.edits == 1]
    by_kind = {t.kinds[0]: t for t in typos}
    assert set(by_kind) == set(KIND_WEIGHTS)
    merge, split = by_kind["merge"], by_kind["split"]
    assert merge.typed.count(" ") == merge.meant.count(" ") - 1
    assert merge.typed.replace(" ", "") == merge.meant.replace(" ", "")
    assert split.typed.count(" ") == split.meant.count(" ") + 1
    neighbour = by_kind["neighbour"]
    [(old, new)] = [(a, b) for a, b in zip(neighbour.meant, neighbour.typed, strict=True)
                    if a != b]
    assert new in NEIGHBOURS[old]
    doubling = by_kind["doubling"]
    assert len(doubling.typed) == len(doubling.meant) + 1
    assert NEIGHBOURS["f"] == "rtdgcv" and NEIGHBOURS["q"] == "wa"


def test_short_words_and_names_get_typos_but_digits_and_single_letters_do_not() -> None:
    hit: Counter[str] = Counter()
    for seed in range(300):
        for query in ("ed sheeran", "set an alarm for 7 am", "bad bunny", "iphone 13 case"):
            typo = TypoGenerator(seed).corrupt(query)
            assert typo is not None
            typed = typo.typed.split(" ")
            if typo.kinds == ("neighbour",):  # one word changed in place: which one
                [word] = [m for m, t in zip(query.split(" "), typed, strict=True) if m != t]
                hit[word] += 1
            assert all(digits in typo.typed for digits in ("13", "7") if digits in query)
    assert hit["ed"] and hit["an"] and hit["am"]  # two-letter words
    assert hit["sheeran"] and hit["bunny"]  # names
    assert TypoGenerator(0).corrupt("a") is None and TypoGenerator(0).corrupt("13") is None


def test_real_misspellings_go_into_queries_that_contain_the_word() -> None:
    queries = ["play some jazz", "jazz for sleep", "set an alarm", "wake me up"]
    pairs = [("jaz", "jazz"), ("alrm", "alarm"), ("recieve", "receive")]
    placed = place_real_misspellings(queries, pairs, seed=0)
    assert [t.typed for t in placed if t.meant == "set an alarm"] == ["set an alrm"]
    [jazz] = [t for t in placed if "jaz " in t.typed + " "]
    assert jazz.meant in ("play some jazz", "jazz for sleep")
    assert jazz.typed == jazz.meant.replace("jazz", "jaz")
    assert len(placed) == 2 and all(t.kinds == (REAL,) and t.edits == 1 for t in placed)
    assert placed == place_real_misspellings(queries, pairs, seed=0)
    # The query is drawn per seed: over seeds both queries with "jazz" are used.
    assert {t.meant for s in range(20) for t in place_real_misspellings(queries, pairs, s)
            if "jaz " in t.typed + " "} == {"play some jazz", "jazz for sleep"}


def test_wilson_interval() -> None:
    # Reference values (Wilson 1927; e.g. statsmodels' proportion_confint method="wilson").
    rate = wilson(81, 263)
    assert rate.share == pytest.approx(0.30798, abs=1e-5)
    assert (rate.low, rate.high) == pytest.approx((0.25524, 0.36628), abs=1e-4)
    zero = wilson(0, 100)
    assert zero.low == 0.0 and zero.high == pytest.approx(0.03699, abs=1e-4)
    full = wilson(50, 50)
    assert full.high == pytest.approx(1.0) and full.low == pytest.approx(0.92865, abs=1e-4)
    assert wilson(0, 0).total == 0 and wilson(0, 0).shown() == "-"
    assert wilson(693, 1000).shown() == "69.3% (66.4-72.1)"
    with pytest.raises(ValueError, match="count 5 must be from 0 to total 4"):
        wilson(5, 4)
