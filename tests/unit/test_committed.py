"""The committed variant of each model (models/variants.json): built alone where it passes its
gate, swept where it does not (and remembered), swept on request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryserve.optimize.committed import (
    build_committed,
    committed_choice,
    serves_another,
    write_choices,
)
from queryserve.optimize.plan import ChoiceRefused


@pytest.fixture
def choices(tmp_path: Path) -> Path:
    path = tmp_path / "variants.json"
    write_choices({"embed": "int8-smoothquant-fused", "intent": "fp32"}, path)
    return path


def test_the_choices_file_names_each_models_variant_and_where_it_was_swept(
        choices: Path, tmp_path: Path) -> None:
    document = json.loads(choices.read_text())
    assert document["chosen"] == {"embed": "int8-smoothquant-fused", "intent": "fp32"}
    assert " cores, 20" in document["swept_on"]
    assert committed_choice("embed", choices) == "int8-smoothquant-fused"
    assert committed_choice("duplicates", choices) is None  # not committed: swept
    assert committed_choice("embed", tmp_path / "missing.json") is None


class Builds:
    """What prepare's build step was asked for; it refuses the variants in `refuse` as
    optimize_encoder does when one misses its gate, and writes a prepare.json."""

    def __init__(self, report: Path, refuse: tuple[str, ...] = ()) -> None:
        self.report, self.refuse = report, refuse
        self.asked: list[str | None] = []

    def __call__(self, only: str | None) -> Path:
        self.asked.append(only)
        if only in self.refuse:
            raise ChoiceRefused(f"the committed choice {only} misses its gate on this host: "
                                "agreement 98.4% < 99%")
        self.report.write_text(json.dumps({"chosen": only or "int8-smoothquant"}))
        return self.report


def test_the_committed_variant_is_built_alone(choices: Path, tmp_path: Path) -> None:
    build = Builds(tmp_path / "prepare.json")
    build_committed("embed", build, sweep=False, choices=choices)
    assert build.asked == ["int8-smoothquant-fused"]


def test_one_that_misses_its_gate_here_is_swept_said_and_remembered(
        choices: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build = Builds(tmp_path / "prepare.json", refuse=("int8-smoothquant-fused",))
    build_committed("embed", build, sweep=False, choices=choices)
    assert build.asked == ["int8-smoothquant-fused", None]
    assert "misses its gate on this host: agreement 98.4% < 99%; sweeping every variant " \
           "instead" in capsys.readouterr().out
    stored = json.loads(build.report.read_text())
    assert stored["committed"]["choice"] == "int8-smoothquant-fused"
    # The next prepare keeps the sweep's choice rather than trying the refused one again.
    assert serves_another("embed", stored, choices) is None


def test_a_sweep_or_no_committed_variant_sweeps(choices: Path, tmp_path: Path) -> None:
    build = Builds(tmp_path / "prepare.json")
    build_committed("embed", build, sweep=True, choices=choices)
    build_committed("duplicates", build, sweep=False, choices=choices)
    assert build.asked == [None, None]


def test_a_folder_serving_another_variant_is_named(choices: Path) -> None:
    assert serves_another("embed", {"chosen": "int8-smoothquant"}, choices) \
        == "int8-smoothquant-fused"
    assert serves_another("embed", {"chosen": "int8-smoothquant-fused"}, choices) is None
    assert serves_another("duplicates", {"chosen": "fp32"}, choices) is None


def test_a_committed_recipe_is_built_with_those_it_is_built_from() -> None:
    from queryserve.optimize.recipes import recipes_for, with_bases

    recipes = recipes_for(("int8",))
    assert [r.name for r in with_bases(recipes, "int8-smoothquant-fused")] \
        == ["fp32-fused", "int8-smoothquant-fused"]
    assert [r.name for r in with_bases(recipes, "int8-smoothquant")] == ["int8-smoothquant"]
    assert with_bases(recipes, "fp32") == ()
