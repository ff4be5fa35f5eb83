"""The fault scenarios of benchmarks/reliability.py, one module each (measure + render)."""
