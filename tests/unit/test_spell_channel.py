"""The noisy-channel corrector on a small catalog: what it changes, what it must leave alone,
and that its saved tables correct exactly as the learned ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from queryserve.backends.noisy_channel.channel import NoisyChannel
from queryserve.backends.noisy_channel.noise import NoiseModel
from queryserve.backends.noisy_channel.tables import ChannelTables

CATALOG = ["taylor swift", "shake it off taylor swift", "play some jazz", "play some coffee",
           "blank space taylor swift", "passion pit", "sleepyhead passion pit",
           "play sleepyhead by passion pit", "set an alarm", "iphone 13 case"]
TYPOS = [("swfit", "swift"), ("recieve", "receive"), ("jaz", "jazz"), ("alrm", "alarm"),
         ("pasion", "passion"), ("plae", "play"), ("teh", "the"), ("acess", "access")]


@pytest.fixture(scope="module")
def channel() -> NoisyChannel:
    return NoisyChannel(ChannelTables.learn(CATALOG, ["music", "coffees"],
                                            NoiseModel.learn(TYPOS)))


def test_typos_are_corrected_in_context(channel: NoisyChannel) -> None:
    corrections = channel.correct(["Taylor Swfit", "plae sleepyhead by pasion pit",
                                   "set an alrm"])
    assert [c.corrected for c in corrections] == [
        "taylor swift", "play sleepyhead by passion pit", "set an alarm"]
    assert all(c.changed and 0.5 < c.score <= 1.0 for c in corrections)


def test_words_too_far_for_the_channel_come_from_the_context(
        channel: NoisyChannel, monkeypatch: pytest.MonkeyPatch) -> None:
    # "p" is three edits from "play": beyond the two the channel searches for a short word,
    # but "play" is what the catalog types first, so the context proposes it.
    assert channel.correct(["p some jazz"])[0].corrected == "play some jazz"
    monkeypatch.setattr("queryserve.backends.noisy_channel.channel.CONTEXT_KEEP", 0)
    assert channel.correct(["p some jazz"])[0].corrected != "play some jazz"


def test_right_queries_unknown_names_and_model_numbers_are_left_alone(
        channel: NoisyChannel) -> None:
    queries = ["taylor swift", "play some coffees", "zyxwvut", "iphone 13 case", "kids'"]
    for c in channel.correct(queries):
        assert c.corrected == c.query and not c.changed, c
        assert 0.0 < c.score <= 1.0


def test_stray_underscores_and_hyphens_are_typos_but_inner_hyphens_are_words(
        channel: NoisyChannel) -> None:
    # Real misspellings carry a slipped space as "_" and a stray "-"; "x-men" stays unknown.
    fixed = channel.correct(["passi_on pit", "taylor swift-", "x-men"])
    assert [c.corrected for c in fixed] == ["passion pit", "taylor swift", "x-men"]


def test_a_hyphenated_word_is_corrected_part_by_part() -> None:
    # Words typed with a hyphen between them were typed apart on purpose: "usb-c" had become
    # "usb" (two deletions from a common word), "e-mail" "email" and "a-ha" "a-yo" (a known
    # part, "ha", replaced whole), while a typo inside a part is a typo ("wi-fu" is "wi-fi"),
    # and so is a hyphen inside a word ("wea-ther") or at its end ("cable-").
    catalog = [*CATALOG, "usb cable", "usb cable", "usb hub", "wi-fi router", "email",
               "a-yo lady gaga", "a-yo", "ha ha ha", "take on me a-ha", "mail order",
               "vitamin e", "c batteries", "weather"]
    channel = NoisyChannel(ChannelTables.learn(catalog, [], NoiseModel.learn(TYPOS)))
    fixed = channel.correct(["usb-c cable", "e-mail", "a-ha", "wi-fu router", "usb cable-",
                             "wea-ther"])
    assert [c.corrected for c in fixed] == ["usb-c cable", "e-mail", "a-ha", "wi-fi router",
                                            "usb cable", "weather"]


def test_saved_tables_correct_as_the_learned_ones(channel: NoisyChannel, tmp_path: Path) -> None:
    channel.tables.save(tmp_path)
    loaded = NoisyChannel.load(tmp_path)
    queries = ["taylor swfit", "plae some jaz", "blank spase", "music"]
    assert loaded.correct(queries) == channel.correct(queries)
    assert loaded.parameters == channel.parameters


def test_words_of_web_text_stay_as_typed_but_known_typos_do_not(
        channel: NoisyChannel, tmp_path: Path) -> None:
    web = {"jazzy": 3.6, "passive": 4.3, "space": 5.0, "swfit": 2.0, "plae": 1.5}
    tables = ChannelTables.learn(CATALOG, ["music", "coffees"], NoiseModel.learn(TYPOS),
                                 web=web, typos=[typed for typed, _ in TYPOS])
    assert sorted(tables.web) == ["jazzy", "passive"]  # not the catalog's words, nor typos
    queries = ["play some jazzy", "passive pit", "taylor swfit", "plae some jazz"]
    assert [c.corrected for c in channel.correct(queries)] == [
        "play some jazz", "passion pit", "taylor swift", "play some jazz"]
    with_web = NoisyChannel(tables)
    assert [c.corrected for c in with_web.correct(queries)] == [
        "play some jazzy", "passive pit", "taylor swift", "play some jazz"]
    tables.save(tmp_path)
    assert NoisyChannel.load(tmp_path).correct(queries) == with_web.correct(queries)


def test_the_deletion_index_finds_exactly_the_words_a_full_scan_finds() -> None:
    from rapidfuzz.distance import OSA

    from queryserve.backends.noisy_channel.deletions import DeletionIndex, deletions

    words = sorted({w for text in CATALOG for w in text.split()} | {
        "a", "an", "at", "ox", "to", "top", "pot", "opt", "stop", "spot", "post", "posts",
        "jazz", "jazzy", "swift", "swifts", "shift", "sift", "thrift", "passion", "pension"})
    index = DeletionIndex(words, depth=2)
    typed_words = ["", "a", "o", "ot", "tpo", "stpo", "psot", "jaz", "jzaz", "swfit", "siwft",
                   "shfit", "pasion", "pssion", "passoin", "xyz", "zzzzzz", "taylr", "13"]
    for typed in typed_words:
        for reach in (1, 2):
            scanned = {(w, OSA.distance(typed, w)) for w in words
                       if OSA.distance(typed, w) <= reach}
            assert set(index.near(typed, reach)) == scanned, (typed, reach)
    # A transposition and a substitution each cost one deletion on both sides.
    assert deletions("stop", 1) & deletions("stpo", 1) and deletions("jazz", 1) & \
        deletions("jaxz", 1)
    with pytest.raises(ValueError, match="deeper than the index"):
        index.near("swift", 3)


def test_a_query_typed_without_a_space_is_split_into_known_words(channel: NoisyChannel) -> None:
    fixed = channel.correct(["taylorswift", "shake itoff taylor swift", "play somejazz"])
    assert [c.corrected for c in fixed] == [
        "taylor swift", "shake it off taylor swift", "play some jazz"]
    assert all(c.changed and 0.5 < c.score <= 1.0 for c in fixed)


def test_a_word_typed_with_a_space_inside_is_joined(channel: NoisyChannel) -> None:
    fixed = channel.correct(["tay lor swift", "sleepy head passion pit", "play some ja zz"])
    assert [c.corrected for c in fixed] == [
        "taylor swift", "sleepyhead passion pit", "play some jazz"]


def test_two_known_words_are_not_joined_nor_a_known_word_split(channel: NoisyChannel) -> None:
    # "play some" is not "playsome", and "sleepyhead" stays one word though "sleepy" and
    # "head" were both known: only unknown typed words are split.
    tables = ChannelTables.learn([*CATALOG, "sleepy head", "some jazz"], ["music", "coffees"],
                                 NoiseModel.learn(TYPOS))
    with_parts = NoisyChannel(tables)
    for c in with_parts.correct(["play some jazz", "sleepyhead passion pit", "sleepy head"]):
        assert c.corrected == c.query and not c.changed, c
    assert with_parts.splits("sleepyhead") == ()
    assert with_parts.splits("sleepyheadjaz") == ()  # "jaz" is no word: no near-word parts


def test_splits_and_joins_stay_few_and_cheap(channel: NoisyChannel) -> None:
    # Not timed: what bounds the work is that a word yields at most MAX_SPLITS splits, each
    # into two known words, and a join only where the two typed words make a known word.
    from queryserve.backends.noisy_channel.channel import MAX_SPLITS

    assert [pair for pair, _ in channel.splits("passionpit")] == [("passion", "pit")]
    assert channel.splits("play" * 20) == ()  # only two-way splits: a bounded search
    for typed in ("taylorswift", "someplay", "blankspace"):
        splits = channel.splits(typed)
        assert 0 < len(splits) <= MAX_SPLITS
        assert all(a + b == typed and a in channel.unigrams and b in channel.unigrams
                   for (a, b), _ in splits)
    assert channel.splits("13") == () and channel.splits("kids'") == ()
    assert channel._join("tay", "lor") is not None and channel._join("taylor", "swift") is None
    assert channel._join("v", "2.0") is None
    query = " ".join(["taylorswift tay lor"] * 20)
    assert channel.correct([query])[0].corrected == " ".join(["taylor swift taylor"] * 20)


def test_tables_saved_before_the_space_parameter_load_with_its_default(
        channel: NoisyChannel, tmp_path: Path) -> None:
    import json

    from queryserve.backends.noisy_channel.tables import FILE, ChannelParameters

    path = channel.tables.save(tmp_path)
    raw = json.loads(path.read_text())
    del raw["parameters"]["p_space"]
    path.write_text(json.dumps(raw))
    loaded = NoisyChannel.load(tmp_path)
    assert loaded.parameters.p_space == ChannelParameters().p_space
    assert loaded.correct(["taylorswift"]) == channel.correct(["taylorswift"])
    assert path.name == FILE


def test_k_best_lists_distinct_queries_best_first_with_their_posteriors(
        channel: NoisyChannel) -> None:
    """What a re-ranker chooses among: the lattice's k likeliest whole queries."""
    for query in ["plae sleepyhead by pasion pit", "taylorswift", "tay lor swift", "set an alrm"]:
        words = query.split()
        hypotheses = channel.k_best(words, 5)
        texts = [text for text, _ in hypotheses]
        posteriors = [p for _, p in hypotheses]
        assert 1 < len(hypotheses) <= 5 and len(set(texts)) == len(texts), hypotheses
        assert posteriors == sorted(posteriors, reverse=True) and 0 < sum(posteriors) <= 1.0001
        # Its first is the one-best the corrector serves, with the same probability.
        assert hypotheses[0] == channel.correct_words(words)
        # A longer list starts with the shorter one (the k best paths are kept exactly).
        assert channel.k_best(words, 3) == hypotheses[:3]
    # The query as typed is among the hypotheses (a re-ranker can keep it), and so are the
    # partly corrected ones.
    texts = [text for text, _ in channel.k_best(["plae", "sleepyhead", "by", "pasion", "pit"], 5)]
    assert texts[:3] == ["play sleepyhead by passion pit", "plae sleepyhead by passion pit",
                         "play sleepyhead by pasion pit"]
    assert [t for t, _ in channel.k_best(["taylorswift"], 5)] == ["taylor swift", "taylorswift"]
    assert channel.k_best([], 3) == [("", 1.0)]


def test_k_best_also_scores_queries_outside_the_list_in_the_same_model(
        channel: NoisyChannel) -> None:
    """The re-ranker's other candidates (the words as typed, the seq2seq's answer) get their
    posterior from the same lattice model: word for word, or zero where no alignment is."""
    words = ["plae", "sleepyhead", "by", "pasion", "pit"]
    top, *_ = channel.k_best(words, 1)
    hypotheses = channel.k_best(words, 1, also=["plae sleepyhead by pasion pit", top[0],
                                                "play sleepy head by passion pit"])
    assert hypotheses[0] == top and len(hypotheses) == 3  # the best is not listed twice
    (typed, p_typed), (split, p_split) = hypotheses[1:]
    assert typed == "plae sleepyhead by pasion pit" and 0 < p_typed < top[1]
    assert split == "play sleepy head by passion pit" and p_split == 0.0
    # A query the lattice does hold gets the same posterior either way.
    second, p_second = channel.k_best(words, 2)[1]
    again, p_again = channel.k_best(words, 1, also=[second])[1]
    assert again == second and p_again == pytest.approx(p_second, rel=1e-9)
