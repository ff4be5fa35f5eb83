"""The candidate sources from beyond the noisy channel's edit reach (issue 43): each finds its
textbook case, and none proposes the typed query itself or changes a right query without
evidence."""

from __future__ import annotations

from pathlib import Path

import pytest
from rapidfuzz.distance import OSA

from queryserve.backends.noisy_channel.sources import (
    CatalogPhrases,
    PhoneticIndex,
    Segmenter,
    Seq2SeqBeam,
    phonetic_key,
)

COUNTS = {"night": 900, "fever": 300, "nite": 4, "not": 5000, "phone": 400, "case": 500,
          "fine": 700, "shake": 200, "it": 9000, "off": 3000, "taylor": 800, "swift": 800,
          "walmart": 120, "wal": 2, "mart": 40, "play": 4000, "some": 3000, "jazz": 150, "i": 8000,
          "to": 9000, "of": 9000, "a": 9000, "queen": 300, "bohemian": 50, "rhapsody": 60}
PHRASES = ["shake it off", "taylor swift", "shake it off taylor swift", "bohemian rhapsody",
           "bohemian rhapsody queen", "night fever", "play some jazz", "blank space"]
RIGHT = ["taylor swift", "shake it off", "play some jazz", "night fever phone case"]
SEQ2SEQ = Path(__file__).resolve().parents[2] / "model_repository" / "spell-seq2seq"


def test_spellings_of_one_sound_share_a_key() -> None:
    assert phonetic_key("nite") == phonetic_key("night") == phonetic_key("knight")
    assert phonetic_key("fone") == phonetic_key("phone")
    assert phonetic_key("thru") == phonetic_key("through")
    assert phonetic_key("night") != phonetic_key("phone")


def test_phonetic_finds_night_for_nite_beyond_the_edit_reach() -> None:
    index = PhoneticIndex(COUNTS)
    assert OSA.distance("nite", "night") == 3  # a 4-letter word: the channel searches 2
    assert "night fever" in index.propose(["nite", "fever"], 3)
    assert index.propose(["fone", "case"], 1) == ["phone case"]


def test_catalog_title_with_one_typo_is_matched_as_a_phrase() -> None:
    phrases = CatalogPhrases(PHRASES)
    assert phrases.propose(["bohemian", "rhapsdy", "queen"], 1) == ["bohemian rhapsody queen"]
    # Spaces are characters of the phrase: a space left out is one edit.
    assert phrases.propose(["play", "taylorswift"], 1) == ["play taylor swift"]
    # A matched span is substituted into the channel's answer too (`onto`).
    assert "bohemian rhapsody queen" in phrases.propose(
        ["bohemian", "rhapsdy", "qeen"], 3, onto=["bohemian", "rhapsdy", "queen"])


def test_words_typed_together_are_segmented_and_a_split_word_is_joined() -> None:
    segmenter = Segmenter(COUNTS)
    assert segmenter.propose(["shakeitoff"], 1) == ["shake it off"]
    assert segmenter.propose(["shakeitoff", "taylor", "swift"], 1) == [
        "shake it off taylor swift"]
    assert segmenter.propose(["wal", "mart"], 1) == ["walmart"]
    assert segmenter.propose(["taylo", "rswift"], 1) == ["taylor swift"]


@pytest.mark.parametrize("query", RIGHT)
def test_a_right_query_is_left_alone(query: str) -> None:
    """Each source proposes alternatives, never the query itself, and none for a right query
    of known words (a phrase the catalog holds is as meant)."""
    words = query.split()
    for source in (PhoneticIndex(COUNTS), CatalogPhrases(PHRASES), Segmenter(COUNTS)):
        assert source.propose(words, 5) == [], source.name


@pytest.mark.skipif(not (SEQ2SEQ / "ctranslate2").is_dir(),
                    reason="model_repository/spell-seq2seq is made by `queryserve prepare`")
def test_seq2seq_beam_proposes_corrections_but_not_the_typed_query() -> None:
    beam = Seq2SeqBeam(SEQ2SEQ / "ctranslate2", SEQ2SEQ / "tokenizer.json")
    typed, right = ["nite", "fever"], ["taylor", "swift"]
    fixed, kept = beam.propose_many([typed, right], 3)
    assert "night fever" in fixed
    assert "nite fever" not in fixed and "taylor swift" not in kept
    assert len(fixed) <= 3 and len(kept) <= 3
