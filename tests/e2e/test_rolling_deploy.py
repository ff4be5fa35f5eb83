"""One round of a rolling deploy behind a real HAProxy: under light load through the balancer,
a replica of `queryserve serve` is replaced by a new one (the new one in once ready, the old
one out of HAProxy, a pause, SIGTERM) and no request fails; the old one exits 0.

The scenario's own code (benchmarks/faults/rolling.py and haproxy.py) runs it; RELIABILITY.md
section 9 is the full run (several rounds, and a 1 -> 3 -> 1 scale). HAProxy is Debian's, as
`make setup` installs it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPOSITORY, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the fault scenarios import each other as faults.*

from faults.client import Background
from faults.common import one_model_repository
from faults.haproxy import balancing, haproxy_binary
from faults.records import summarize
from faults.rolling import Fleet, load


def test_a_replica_replaced_behind_haproxy_under_load_loses_no_request(tmp_path: Path) -> None:
    if not (REPOSITORY / "embed" / "model.onnx").is_file():
        pytest.fail("the default model is not prepared: run `make prepare` (make test does)")
    try:
        haproxy_binary()
    except RuntimeError as missing:
        pytest.fail(str(missing))
    repository = one_model_repository("embed", tmp_path / "repository")
    with balancing(tmp_path / "haproxy", slots=2) as balancer:
        fleet = Fleet(balancer, repository, tmp_path / "logs")
        try:
            old, _, _ = fleet.add()
            with Background(balancer.url, load(rate=50.0), max_s=60, drain_s=10) as running:
                time.sleep(1.0)
                replaced = fleet.replace(old)
                time.sleep(1.0)  # the new replica alone answers now
                (records,) = running.stop()
            (new,) = fleet.replicas
            answered_by_new = new.server.metric("queryserve_requests_total", "embed",
                                                outcome="success")
        finally:
            fleet.close()
        haproxy_log = balancer.log.read_text(errors="replace")
    whole = summarize(records)
    assert replaced["exit_code"] == 0, old.server.log_text()[-2000:]
    assert whole["requests"] >= 100, whole
    assert whole["non_200"] == 0, (whole, haproxy_log[-2000:])
    assert answered_by_new is not None and answered_by_new >= 25, answered_by_new
