"""Benchmark tooling: the load generator and what is built on it.

- :mod:`queryserve.bench.loadgen`: open- and closed-loop HTTP load (``run_open_loop``,
  ``run_closed_loop``) and an answer-at-once server (``serve_instant``);
- :mod:`queryserve.bench.search`: the max-rate search, sweeps and stop conditions;
- :mod:`queryserve.bench.payloads`: request bodies from real queries, per protocol;
- :mod:`queryserve.bench.server_stats`: the server's own queue/compute figures;
- :mod:`queryserve.bench.bench`: ``queryserve bench``; :mod:`queryserve.bench.recommend`:
  ``queryserve recommend``, over :mod:`queryserve.bench.recommend_plan` (the points and stages
  of a sweep) and :mod:`queryserve.bench.server_process` (a served point to measure);
  :mod:`queryserve.bench.report`: JSON, CSV, HTML and PNG output.

Nothing is imported here so that ``python -m queryserve.bench.loadgen`` runs without a double
import.
"""
