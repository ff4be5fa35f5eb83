"""`queryserve prepare`'s bookkeeping: a prepared model is rebuilt when the committed model it
was made from changes, and what an older release made from a model that is gone is removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryserve.optimize.recipes import RECIPES_VERSION
from queryserve.prepare import _already_prepared, _trained, retire_old_models


def _prepared(target: Path, **report: object) -> None:
    target.mkdir(parents=True)
    (target / "model.onnx").write_bytes(b"graph")
    (target / "head.npz").write_bytes(b"another model's head")
    (target / "prepare.json").write_text(json.dumps(
        {"chosen": "int8", "recipes_version": RECIPES_VERSION, **report}))


def test_a_changed_trained_model_is_prepared_again(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "models" / "duplicates"
    source.mkdir(parents=True)
    (source / "TRAINING.json").write_text('{"threshold": 0.2}')
    target = tmp_path / "repo" / "duplicates"
    _prepared(target, **_trained(source))
    assert _already_prepared(target, "model.onnx", False, source=source)
    assert "already prepared (int8)" in capsys.readouterr().out
    # Trained again: its TRAINING.json differs, so the folder is made again from nothing.
    (source / "TRAINING.json").write_text('{"threshold": 0.3}')
    assert not _already_prepared(target, "model.onnx", False, source=source)
    assert "prepared from another trained model" in capsys.readouterr().out
    assert not target.exists()
    # A folder prepared from another source (a renamed one) is not this model either.
    _prepared(target, **{**_trained(source), "source": "models/duplicates-cross"})
    assert not _already_prepared(target, "model.onnx", False, source=source)


def test_what_a_retired_model_left_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # models/duplicates-cross does not exist here
    _prepared(tmp_path / "repo" / "duplicates-cross", source="models/duplicates-cross")
    _prepared(tmp_path / "other" / "duplicates-cross", source="my/own/model")
    retire_old_models(tmp_path / "repo")
    retire_old_models(tmp_path / "other")
    assert not (tmp_path / "repo" / "duplicates-cross").exists()
    assert (tmp_path / "other" / "duplicates-cross" / "model.onnx").is_file()  # not prepare's
    assert "no longer has; removing it" in capsys.readouterr().out
    retire_old_models(tmp_path / "nothing-here")  # a fresh repository: nothing to do
