"""The hybrid corrector's two questions: P(the candidate is the meant query) from the first
network, and P(the words as typed are misspelled) from the gate, on the typed words' row; a
correction's score is their product, and a reranker.json without a gate is served as before."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from queryserve.backends.noisy_channel.rerank import (
    FEATURES,
    Candidates,
    RerankerWeights,
    choose,
)

N = len(FEATURES)


def network(column: int, weight: float, bias: float) -> dict[str, Any]:
    """A network whose output is sigmoid(weight * features[column] + bias)."""
    hidden = np.zeros((N, 1))
    hidden[column, 0] = 1.0
    return {"mean": [0.0] * N, "scale": [1.0] * N, "hidden": hidden.tolist(),
            "hidden_bias": [0.0], "out": [weight], "out_bias": bias}


def sigmoid(z: float) -> float:
    return float(1.0 / (1.0 + np.exp(-z)))


# P(right) grows with the first column; P(misspelled) with the second (both >= 0 here, so the
# ReLU passes them).
FIRST = RerankerWeights(k=3, **network(0, 1.0, 0.0), compute_type="int8", channel_sure=0.99)
GATED = dataclasses.replace(FIRST, gate=network(1, 2.0, -1.0))


def asked(typed: str, texts: list[str], first: list[float], second: list[float]) -> Candidates:
    rows = np.zeros((len(texts), N))
    rows[:, 0], rows[:, 1] = first, second
    return Candidates(typed, texts, [0.5] * len(texts), rows)


def test_a_correction_is_scored_by_both_questions() -> None:
    c = asked("taylor swfit", ["taylor swift", "taylor swfit"], [2.0, 0.5], [0.0, 1.5])
    text, p = choose(FIRST, c)
    assert text == "taylor swift" and p == pytest.approx(sigmoid(2.0))
    # The gate reads the row of the words as typed (the second), not the correction's.
    text, p = choose(GATED, c)
    assert text == "taylor swift" and p == pytest.approx(sigmoid(2.0) * sigmoid(2.0 * 1.5 - 1.0))
    assert GATED.misspelled(c.features[1]) == pytest.approx(sigmoid(2.0))
    assert FIRST.misspelled(c.features[1]) == 1.0


def test_the_words_as_typed_keep_the_first_networks_score() -> None:
    c = asked("zedd", ["zed", "zedd"], [0.1, 3.0], [0.0, 0.0])
    text, p = choose(GATED, c)
    assert text == "zedd" and p == pytest.approx(sigmoid(3.0))


def test_where_the_channel_answers_alone_its_posterior_stands() -> None:
    alone = Candidates("taylor swfit", ["taylor swift", "taylor swfit"], [0.995, 0.005],
                       np.zeros((2, N)))
    assert choose(GATED, alone) == ("taylor swift", 0.995)
    unscored = Candidates("taylor swfit", ["taylor swift"], [0.6], np.empty((0, N)))
    assert choose(GATED, unscored) == ("taylor swift", 0.6)


def test_the_gate_is_saved_and_a_file_without_it_loads_as_before(tmp_path: Path) -> None:
    GATED.save(tmp_path)
    loaded = RerankerWeights.load(tmp_path / "reranker.json")
    assert loaded.gate == GATED.gate
    c = asked("taylor swfit", ["taylor swift", "taylor swfit"], [2.0, 0.5], [0.0, 1.5])
    assert choose(loaded, c) == choose(GATED, c)
    raw = json.loads((tmp_path / "reranker.json").read_text())
    del raw["gate"]
    (tmp_path / "reranker.json").write_text(json.dumps(raw))
    older = RerankerWeights.load(tmp_path / "reranker.json")
    assert older.gate is None and choose(older, c) == choose(FIRST, c)


def test_a_malformed_gate_is_refused_when_the_file_loads(tmp_path: Path) -> None:
    from queryserve.errors import ConfigError

    path = GATED.save(tmp_path)
    document = json.loads(path.read_text())
    del document["gate"]["out_bias"]
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="'gate' must hold"):
        RerankerWeights.load(path)
