"""The default `intent` model's calibration on the real ONNX graph, in process: the pipeline
serves the graph's probabilities at the fitted temperature, with the same argmax, and says
which labels are under the threshold; `queryserve prepare` calibrates a folder prepared
before calibrations existed (it keeps the graph and adds `calibration.json`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from queryserve.api import Classifications, Inputs
from queryserve.local import open_model
from queryserve.pipelines.calibration import FILE, load_calibration
from queryserve.prepare import prepare_intent
from tests.conftest import REPOSITORY, ROOT

INTENT = REPOSITORY / "intent"
QUERIES = ["wake me up at seven", "taylor swift shake it off", "play some jazz",
           "what's the weather in paris"]


def uncalibrated_copy(folder: Path) -> Path:
    """`folder`'s model without its calibration.json, as prepare left it before this change
    (the graph linked, not copied)."""
    folder.mkdir(parents=True)
    for name in ("model.onnx", "tokenizer.json"):
        (folder / name).symlink_to(INTENT / name)
    for name in ("model.yaml", "prepare.json"):
        shutil.copy(INTENT / name, folder / name)
    return folder


def test_the_served_probabilities_are_the_graphs_at_the_fitted_temperature(
        tmp_path: Path) -> None:
    calibration = load_calibration(INTENT)
    assert calibration is not None, "run `queryserve prepare`: it writes intent/calibration.json"
    assert calibration.temperature > 1  # fine-tuned with cross-entropy: over-confident
    with open_model(INTENT, Classifications) as served:
        calibrated = served.infer(Inputs(QUERIES, parameters={"top_k": 3}))
    with open_model(uncalibrated_copy(tmp_path / "intent"), Classifications) as graph:
        raw = graph.infer(Inputs(QUERIES, parameters={"top_k": 3}))
    assert np.allclose(calibrated.probabilities, calibration.apply(raw.probabilities), atol=1e-6)
    assert [[label.name for label in top] for top in calibrated.top] == \
        [[label.name for label in top] for top in raw.top]  # the same labels, in order
    # Without a calibration every label is confident, as before.
    assert all(label.confident for top in raw.top for label in top)
    for top in calibrated.top:
        assert [label.confident for label in top] == \
            [label.score >= calibration.threshold for label in top]
    alarm, song = calibrated.top[0][0], calibrated.top[1][0]
    assert (alarm.name, alarm.confident) == ("alarm_set", True)
    # Issue 43's search: the song's title read as a light switch, at 0.27 once calibrated.
    assert song.name == "iot_hue_lightoff" and not song.confident


def test_prepare_calibrates_a_folder_prepared_before_calibrations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # prepare.json names the trained model by its relative folder
    uncalibrated_copy(tmp_path / "intent")
    prepare_intent(tmp_path, ROOT / "data/massive-en", progress=False)
    fitted = json.loads((tmp_path / "intent" / FILE).read_text())
    assert (tmp_path / "intent" / "model.onnx").is_symlink()  # the graph kept, not rebuilt
    served = json.loads((INTENT / FILE).read_text())
    assert fitted["fit"]["split"] == "validation" and fitted["fit"]["examples"] == 2033
    assert fitted["fit"]["nll_after"] < fitted["fit"]["nll_before"]
    assert fitted["fit"]["accuracy_confident"] >= fitted["fit"]["target_precision"]
    # The same graph and split give the same fit as the served folder's.
    assert fitted["temperature"] == pytest.approx(served["temperature"], rel=1e-4)
    assert fitted["threshold"] == pytest.approx(served["threshold"], abs=1e-4)
