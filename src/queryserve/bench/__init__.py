"""Benchmark tooling: an open-loop HTTP load generator and its helpers.

Entry points live in :mod:`queryserve.bench.loadgen` (``run_open_loop``,
``find_max_rate``, ``serve_instant``); nothing is imported here so that
``python -m queryserve.bench.loadgen`` runs without a double import.
"""
