"""Merging the workers' snapshots (`queryserve.server.snapshot`), as a `--workers N` server
does for every scrape and statistics read: the end-to-end tests use real workers."""

from __future__ import annotations

import pickle

from queryserve.server.snapshot import Snapshot, merged, process_families


def test_merging_again_and_again_keeps_one_process_series_per_worker() -> None:
    # Worker 1's snapshot comes pickled, as over the control socket; this process plays
    # worker 0. prometheus-client's `python_info` family is one cached object, which the merge
    # once extended in place: each read doubled it here (Fibonacci across two processes).
    for _ in range(5):
        sibling = pickle.loads(pickle.dumps(Snapshot(process=process_families(1))))
        whole = merged([Snapshot(process=process_families(0)), sibling])
        info = next(family for family in whole.process if family.name == "python_info")
        assert [sample.labels["worker"] for sample in info.samples] == ["0", "1"]
    alone = next(family for family in process_families(None) if family.name == "python_info")
    assert len(alone.samples) == 1 and "worker" not in alone.samples[0].labels
