"""`queryserve recommend`'s planning: the points it tries, the config it writes, the winner;
and the repository and server each point is served from."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml

from queryserve.bench.recommend_plan import (
    Knobs,
    Point,
    best_point,
    current_point,
    default_knobs,
    full_grid,
    point_yaml,
    stage_points,
    untuned_point,
)
from queryserve.bench.server_process import build_repository, wait_ready
from queryserve.config import load_model_config
from queryserve.errors import BenchError

ROOT = Path(__file__).resolve().parents[2]
FILES = {"fp32": "variants/fp32.onnx", "int8": "model.onnx"}
KNOBS = Knobs(("fp32", "int8"), ((1, 1), (1, 2), (2, 1)), (8, 64), (0, 2000))


def shipped_config() -> dict[str, object]:
    config: dict[str, object] = yaml.safe_load(
        (ROOT / "model_repository" / "embed" / "model.yaml").read_text())
    return config


def test_the_current_config_is_the_starting_point() -> None:
    start = current_point(shipped_config(), FILES, cores=2)
    assert start == Point("int8", 64, 0, 2, 1, batch_overhead_tokens=4)
    with pytest.raises(BenchError, match="not one of the prepared variants"):
        current_point(shipped_config(), {"fp32": "variants/fp32.onnx"}, cores=2)


def test_the_untuned_reference_keeps_the_model_and_resets_every_knob(tmp_path: Path) -> None:
    start = Point("int8", 64, 2000, 2, 1, spinning=True, batch_overhead_tokens=4)
    untuned = untuned_point(start, cores=2)
    assert untuned == Point("int8", 64, 0, 1, 2)
    assert untuned.id == "int8/b64/d0/1x2"
    # Written out, it is what the config reader makes of a model.yaml without those keys.
    config = point_yaml(shipped_config(), untuned, FILES)
    folder = tmp_path / "embed"
    folder.mkdir()
    (folder / "model.yaml").write_text(yaml.safe_dump(config))
    loaded = load_model_config(folder / "model.yaml")
    assert loaded.instance_group.count == 1
    assert loaded.dynamic_batching is not None
    assert loaded.dynamic_batching.max_queue_delay_microseconds == 0
    assert loaded.dynamic_batching.batch_overhead_tokens is None
    assert loaded.parameter("allow_spinning", True) is False


def test_default_knobs_fit_the_cores_and_keep_the_current_values() -> None:
    knobs = default_knobs(FILES, Point("int8", 32, 500, 2, 1), cores=2)
    assert knobs.layouts == ((1, 1), (1, 2), (2, 1))
    assert 32 in knobs.max_batch_sizes and 500 in knobs.delays_us
    assert knobs.precisions == ("fp32", "int8")


def test_stages_vary_one_knob_around_the_best() -> None:
    best = Point("int8", 64, 0, 2, 1)
    assert stage_points(0, best, KNOBS, 2) == [Point("fp32", 64, 0, 2, 1), best]
    assert {(p.instances, p.threads) for p in stage_points(1, best, KNOBS, 2)} == \
        set(KNOBS.layouts)
    assert [p.max_batch_size for p in stage_points(3, best, KNOBS, 2)] == [8, 64]
    assert [p.max_queue_delay_us for p in stage_points(5, best, KNOBS, 2)] == [0, 2000]
    assert len(full_grid(KNOBS, 2)) == 2 * 3 * 2 * 2
    cuts = replace(KNOBS, overheads=(None, 4))
    assert [p.batch_overhead_tokens for p in stage_points(4, best, cuts, 2)] == [None, 4]
    assert len(full_grid(cuts, 2)) == 2 * 3 * 2 * 2 * 2


def test_workers_are_a_knob_that_splits_the_cores() -> None:
    knobs = default_knobs(FILES, Point("int8", 64, 0, 2, 1), cores=16)
    assert knobs.workers == (1, 2, 4, 8, 16)
    best = Point("int8", 64, 0, 2, 1)
    # Each other worker count gets the cores split evenly; the best layout's two instances are
    # kept where a worker's share allows, and its share spread over them.
    assert [(p.workers, p.instances, p.threads) for p in stage_points(2, best, knobs, 16)] == \
        [(1, 2, 1), (2, 2, 4), (4, 2, 2), (8, 2, 1), (16, 1, 1)]
    assert all(p.cores <= 16 for p in stage_points(2, best, knobs, 16))
    two = Point("int8", 64, 0, 1, 1, workers=2)
    assert two.id == "int8/b64/d0/1x1/w2" and two.cores == 2
    assert Point.from_params({**asdict(two), "cores": 2}) == two
    # On 2 cores, the full grid keeps only the layouts that fit with each worker count.
    grid = full_grid(replace(KNOBS, workers=(1, 2)), 2)
    assert {(p.workers, p.instances, p.threads) for p in grid} == \
        {(1, 1, 1), (1, 1, 2), (1, 2, 1), (2, 1, 1)}


def test_the_batch_overhead_is_a_knob() -> None:
    knobs = default_knobs(FILES, Point("int8", 64, 0, 2, 1, batch_overhead_tokens=6), cores=2)
    assert knobs.overheads == (None, 1, 4, 6, 16)
    cut = Point("int8", 64, 0, 2, 1, batch_overhead_tokens=16)
    assert cut.id == "int8/b64/d0/2x1/o16"
    written = point_yaml(shipped_config(), cut, FILES)
    assert written["dynamic_batching"]["batch_overhead_tokens"] == 16
    assert current_point(written, FILES, cores=2) == cut
    # unset: the key goes, and the shipped config's overhead with it (fewest batches)
    fewest = point_yaml(shipped_config(), replace(cut, batch_overhead_tokens=None), FILES)
    assert "batch_overhead_tokens" not in fewest["dynamic_batching"]
    assert current_point(fewest, FILES, cores=2).id == "int8/b64/d0/2x1"


def test_a_record_names_its_point_with_every_knob() -> None:
    # regression: the winner's model.yaml was rebuilt from five of the knobs, so a winner
    # measured with spinning threads was written without them
    point = Point("int8", 16, 500, 1, 2, spinning=True, batch_overhead_tokens=4)
    assert Point.from_params({**asdict(point), "cores": 2}) == point
    # records from before the overhead knob have no such key: unset
    old = {k: v for k, v in asdict(point).items() if k != "batch_overhead_tokens"}
    assert Point.from_params(old) == replace(point, batch_overhead_tokens=None)


def test_point_yaml_is_a_valid_model_config(tmp_path: Path) -> None:
    point = Point("fp32", 8, 2000, 1, 2)
    folder = tmp_path / "embed"
    folder.mkdir()
    (folder / "model.yaml").write_text(yaml.safe_dump(point_yaml(shipped_config(), point, FILES)))
    config = load_model_config(folder / "model.yaml")
    assert config.max_batch_size == 8
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert config.instance_group.count == 1
    assert config.parameter("model_file", "") == "variants/fp32.onnx"
    # the shipped warmup has a batch of 16: capped to the point's max batch size
    assert max(s.batch_size for s in config.model_warmup) == 8


def test_spinning_is_tried_with_each_layout_that_has_threads_to_spin() -> None:
    knobs = default_knobs(FILES, Point("int8", 64, 0, 2, 1), cores=2)
    assert knobs.spinning == (False, True)
    layouts = {(p.instances, p.threads, p.spinning)
               for p in stage_points(1, Point("int8", 64, 0, 2, 1), knobs, 2)}
    assert layouts == {(1, 1, False), (1, 2, False), (1, 2, True), (2, 1, False)}
    spinning = Point("int8", 64, 0, 1, 2, spinning=True)
    assert spinning.id == "int8/b64/d0/1x2/spin"
    written = point_yaml(shipped_config(), spinning, FILES)
    assert written["parameters"]["allow_spinning"] is True
    assert current_point(written, FILES, cores=2) == spinning
    assert default_knobs(FILES, spinning, 2, backend="ctranslate2").spinning == (True,)


def test_a_seq2seq_point_names_its_ctranslate2_folder() -> None:
    config: dict[str, object] = {"backend": "ctranslate2", "max_batch_size": 32,
                                 "instance_group": {"count": 2},
                                 "parameters": {"model_dir": "ctranslate2"}}
    files = {"float32": "variants/float32", "int8": "ctranslate2"}
    assert current_point(config, files, cores=2) == Point("int8", 32, 0, 2, 1)
    written = point_yaml(config, Point("float32", 8, 0, 1, 2), files)
    assert written["parameters"] == {"model_dir": "variants/float32"}


def point(pid: str, rate: float, cost: float | None = None,
          p99: float = 5.0) -> dict[str, object]:
    return {"id": pid, "max_rate": rate, "cost_per_million": cost, "latency_ms": {"p99": p99}}


def test_best_point_by_throughput_or_cost() -> None:
    points = [point("a", 500, 0.02), point("b", 700, 0.03), point("c", 0)]
    assert best_point(points, "throughput") == points[1]
    assert best_point(points, "cost") == points[0]
    assert best_point([point("c", 0)], "throughput") is None


def test_a_tie_on_rate_goes_to_the_lower_latency() -> None:
    # regression: two points at 400 req/s, the default (p99 9.0 ms) was named best although
    # the other (p99 7.9 ms) dominates it and alone was on the Pareto front
    default, other = point("default", 400, p99=9.0), point("b16", 400, p99=7.9)
    assert best_point([default, other], "throughput") == other


def test_a_point_s_repository_links_the_current_model_s_files(tmp_path: Path) -> None:
    """Regression: links made by an earlier run were kept, so a point served another
    model's files under this one's model.yaml."""
    for name, text in (("first", "a"), ("second", "b")):
        (tmp_path / name / "embed").mkdir(parents=True)
        (tmp_path / name / "embed" / "model.onnx").write_text(text)
    (tmp_path / "first" / "embed" / "only-in-first.json").write_text("{}")
    root = tmp_path / "point"
    build_repository(root, "embed", tmp_path / "first" / "embed", {"backend": "fake"})
    build_repository(root, "embed", tmp_path / "second" / "embed", {"backend": "fake"})
    assert (root / "embed" / "model.onnx").read_text() == "b"
    assert sorted(p.name for p in (root / "embed").iterdir()) == ["model.onnx", "model.yaml"]


def test_waiting_for_a_server_whose_model_failed_stops_at_once(tmp_path: Path) -> None:
    """Regression: a server up but whose only model failed to load was polled for 180 s,
    then reported "not ready" without its reason."""
    log = tmp_path / "server.log"
    log.write_text("WARNING queryserve: not ready: embed failed to load; serving no models\n")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = time.monotonic()
        with pytest.raises(BenchError, match="failed to load"):
            wait_ready("http://127.0.0.1:9", sleeper, log, timeout_s=20)
        assert time.monotonic() - started < 5
    finally:
        sleeper.kill()
        sleeper.wait()
