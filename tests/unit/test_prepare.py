"""`queryserve prepare`'s bookkeeping: a prepared model is rebuilt when the committed model it
was made from changes or when its gate held other hard inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryserve.duplicates.hard_pairs import HARD_PAIRS
from queryserve.optimize.gate import HardItem, Parity
from queryserve.optimize.plan import VariantReport
from queryserve.optimize.recipes import RECIPES_VERSION
from queryserve.prepare import _already_prepared, _say_flips, _trained


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where no models/variants.json commits a variant (tests/unit/test_committed.py
    covers that rule)."""
    monkeypatch.chdir(tmp_path)


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


def test_a_duplicates_folder_gated_without_the_hard_pairs_is_prepared_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An older release's gate held no hard pair and may serve a variant that flips one (the
    AMD EPYC's int8-smoothquant-fused called the ipod nano and touch one product)."""
    source = tmp_path / "models" / "duplicates"
    source.mkdir(parents=True)
    (source / "TRAINING.json").write_text('{"threshold": 0.2}')
    names = [p.name for p in HARD_PAIRS]
    old = tmp_path / "old" / "duplicates"
    _prepared(old, **_trained(source), gate={"reduced": {"top1_agreement_min": 0.99}})
    assert not _already_prepared(old, "model.onnx", False, source=source, hard_items=names)
    assert "its gate held other hard inputs than this release's 2; rebuilding it" \
        in capsys.readouterr().out
    assert (old / "model.onnx").is_file()  # replaced by the rebuild, not removed beforehand
    new = tmp_path / "new" / "duplicates"
    _prepared(new, **_trained(source), gate={"hard_items": names})
    assert _already_prepared(new, "model.onnx", False, source=source, hard_items=names)
    # Another list (a pair added) is another gate; the encoders without hard inputs stay.
    assert not _already_prepared(new, "model.onnx", False, source=source,
                                 hard_items=[*names, "'a' / 'b'"])
    assert _already_prepared(old, "model.onnx", False, source=source)


def test_prepare_names_each_variant_refused_for_a_hard_pair(
        capsys: pytest.CaptureFixture[str]) -> None:
    name = HARD_PAIRS[0].name
    flipped = HardItem(name, 0.12, (0.284, 0.284), True)
    held = HardItem(HARD_PAIRS[1].name, 0.93, (0.91, 0.91), False)
    refused = Parity("int8", "top1", 0.9922, 0.9922, 0.18, (1, 32), False, 0.2, (flipped, held))
    kept = Parity("int8", "top1", 0.996, 0.996, 0.1, (1, 32), True, 0.2, (held, held))
    _say_flips("duplicates", [
        VariantReport("int8-smoothquant-fused", "int8", "fused", False, refused, {}, None),
        VariantReport("int8-smoothquant", "int8", "plain", True, kept, {}, "model.onnx"),
        VariantReport("fp16-fused", "fp16", "fp16", False, None, {}, None, error="no GPU")])
    assert capsys.readouterr().out.splitlines() == [
        f"duplicates: the gate refused int8-smoothquant-fused: the hard input {name} is decided "
        "otherwise than by the original at 0.2: P 0.120 in the original, 0.284/0.284 in this "
        "variant at batch sizes 1/32"]
