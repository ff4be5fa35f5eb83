"""The corrector's text tools: edit alignment, the learned typo model, the symspellpy baseline,
the splits."""

from __future__ import annotations

import random

from queryserve.backends.noisy_channel.noise import NoiseModel, align
from queryserve.spell.baseline import SymSpellPy
from queryserve.spell.data import held_out, load_catalog, load_misspellings
from tests.conftest import ROOT


def test_align_names_each_edit() -> None:
    assert align("receive", "recieve") == [("swap", 3, "ei", "ie")]
    assert align("cat", "cat") == []
    assert align("cat", "ct") == [("delete", 1, "a", "")]
    assert align("cat", "cart") == [("insert", 2, "", "r")]
    assert align("cat", "cut") == [("substitute", 1, "a", "u")]


def test_noise_model_learns_and_corrupts() -> None:
    pairs = [("recieve", "receive"), ("beleive", "believe"), ("adress", "address"),
             ("definately", "definitely"), ("wierd", "weird")]
    model = NoiseModel.learn(pairs)
    assert sum(count for (kind, _), count in model.kinds.items() if kind == "swap") == 3
    assert model.substitutes["i"]["a"] == 1
    rng = random.Random(0)
    for word in ("music", "playlist", "receive"):
        assert all(model.corrupt_word(word, rng) != word for _ in range(50))
    # Replay draws real misspellings of training words as written.
    assert {model.corrupt_word("receive", rng) for _ in range(200)} >= {"recieve"}
    query = model.corrupt_query("play the beatles", rng, replay=False)
    assert query != "play the beatles" and len(query.split()) == 3


def test_symspellpy_fixes_near_misses_joins_splits_and_keeps_known_words() -> None:
    spell = SymSpellPy(["the beatles", "taylor swift", "receive a call", "sony tv 4k",
                        "taylor swift", "x-men"])
    assert spell.spell.bigrams["taylor swift"] == 2  # the catalog's word pairs, counted
    fixed = spell.correct(["recieve a call", "Taylor  Swfit", "taylorswift", "sony tv 4k",
                           "The Beatles", "x-men", "zzzzzzzz"])
    assert [(c.corrected, c.changed) for c in fixed] == [
        ("receive a call", True), ("taylor swift", True), ("taylor swift", True),
        ("sony tv 4k", False), ("the beatles", False), ("x-men", False),
        ("zzzzzzzz", False)]  # nothing within two edits: kept
    assert [c.query for c in fixed][1] == "Taylor  Swfit"


def test_splits_are_disjoint_and_stable() -> None:
    catalog = load_catalog(ROOT / "data")
    assert not set(catalog.train) & set(catalog.held_out)
    assert 0.03 < len(catalog.held_out) / len(catalog.train) < 0.2
    misspellings = load_misspellings(ROOT / "data")
    assert not {w for _, w in misspellings.train} & {w for _, w in misspellings.held_out}
    assert held_out("necessary", 0.2) == held_out("necessary", 0.2)
