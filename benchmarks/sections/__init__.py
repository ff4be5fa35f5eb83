"""The sections of `make bench` (benchmarks/run.py), one module each: `measure` takes the
figures, `render` writes them as BENCHMARKS.md lines; `common` holds what they share."""
