"""Argument types shared by the command lines: each turns a bad value into argparse's one-line
usage error (exit 2) that names the flag, instead of a traceback later on."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def number(value: str, *, above: float, allow_equal: bool = False,
           at_most: float = math.inf) -> float:
    """A finite float > `above` (>= with `allow_equal`) and <= `at_most`: inf would make an
    endless schedule, and nan compares false with every bound."""
    try:
        parsed = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    low_ok = parsed > above or (allow_equal and parsed == above)
    if not math.isfinite(parsed) or not low_ok or parsed > at_most:
        bound = f"{'>=' if allow_equal else '>'} {above:g}" + (
            f" and <= {at_most:g}" if at_most < math.inf else "")
        raise argparse.ArgumentTypeError(f"{value!r} must be a finite number {bound}")
    return parsed


def positive(value: str) -> float:
    return number(value, above=0)


def non_negative(value: str) -> float:
    return number(value, above=0, allow_equal=True)


def probability(value: str) -> float:
    return number(value, above=0, allow_equal=True, at_most=1)


def folder_to_write(value: str) -> Path:
    """A folder a command writes into: made if missing, refused at once (rather than after
    minutes of work, at the first write) if a file is there, or if the nearest folder that
    exists above it is a file or cannot be written (a traceback after the run, its
    figures lost)."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a file; give a folder to write into")
    above = path.absolute()
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        raise argparse.ArgumentTypeError(f"{value} cannot be made: {above} is a file")
    if not path.exists() and not os.access(above, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{value} cannot be made: {above} is not writable")
    return path


def count(value: str) -> int:
    """A whole number >= 1: a count of things, a size, a limit."""
    try:
        parsed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if parsed < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be >= 1")
    return parsed
