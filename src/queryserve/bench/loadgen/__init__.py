"""Open- and closed-loop HTTP/1.1 load for loopback servers, and a server that answers at once.

- :mod:`.open_loop`: the default driver (wrk2 style): requests leave on a schedule fixed in
  advance and are timed from it, so a stalled server is charged for the wait;
- :mod:`.closed_loop`: users that send back to back (perf_analyzer's and Locust's model);
- :mod:`.connection`, :mod:`.requests`: the keep-alive connection protocol, loopback URLs and
  pre-encoded requests, shared by both drivers;
- :mod:`.recorder`: a run's counters, its HDR histograms and its :class:`LoadResult`;
- :mod:`.runner`: one run from start to drain (GC off, CPU clocked), and :func:`run_sync`;
- :mod:`.instant_server`: the "answer at once" server for the generator's own ceiling and the
  tests, run as ``python -m queryserve.bench.loadgen serve-instant``.
"""

from queryserve.bench.loadgen.closed_loop import run_closed_loop
from queryserve.bench.loadgen.instant_server import InstantServerOptions, serve_instant
from queryserve.bench.loadgen.open_loop import run_open_loop
from queryserve.bench.loadgen.recorder import LoadResult
from queryserve.bench.loadgen.requests import build_requests
from queryserve.bench.loadgen.runner import run_sync

__all__ = [
    "InstantServerOptions",
    "LoadResult",
    "build_requests",
    "run_closed_loop",
    "run_open_loop",
    "run_sync",
    "serve_instant",
]
