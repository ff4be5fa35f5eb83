"""`--workers auto`'s choice and the cores a worker count leaves idle (`server/workers/plan.py`)."""

from __future__ import annotations

from pathlib import Path

from queryserve.server.workers.peers import Seat
from queryserve.server.workers.plan import auto_workers, idle_cores
from tests.conftest import write_fake_model


def test_auto_starts_one_worker_per_four_cores_and_says_what_is_left(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "fast")  # one instance
    assert auto_workers(2, tmp_path)[0] == 1
    assert auto_workers(16, tmp_path) == (4, "16 cores, 4 per worker (one event loop feeds "
                                             "about 4 cores; the largest model has 1 instance(s))")
    workers, why = auto_workers(14, tmp_path)
    assert workers == 3 and why.endswith("; 2 left to no worker")


def test_a_worker_count_that_does_not_divide_the_cores_is_said_with_ones_that_do() -> None:
    assert idle_cores(14, 7) is None and idle_cores(2, 1) is None and idle_cores(2, 4) is None
    assert idle_cores(14, 10) == ("10 workers on 14 cores: 1 each, and 4 core(s) run no model "
                                  "instance; --workers 2 or 7 or 14 would use them all")


def test_a_worker_s_share_of_connections_counts_only_the_workers_that_serve(
        tmp_path: Path) -> None:
    """Regression (the workers walk): while a worker was replaced its share was counted as
    zero connections in the mean, and the survivor closed 75% of its connections after one
    answer, each client reconnecting to it alone."""
    seat = Seat(0, 2, tmp_path, serving=[1, 0], restarts=[0], connections=[8, 0], beats=[0.0, 0.0])
    assert not seat.over(8)  # the other is away: all of them are this worker's share
    seat.serving[1] = 1
    assert seat.over(8)  # both serve: 8 of 8 is past 4 and a tenth
