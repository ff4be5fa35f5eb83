"""A share of successes with its 95% Wilson score interval.

Why Wilson and not "share ± 1.96 standard errors": the spelling figures sit near 0% (false
corrections) and near 100% (the targets), where the normal interval runs past the ends and is
too narrow; Wilson's stays inside [0, 1] and keeps its coverage with few events.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

Z_95 = 1.959964  # the standard normal quantile of 0.975


@dataclass(frozen=True)
class Rate:
    """`count` successes of `total` trials: the share and its 95% interval [low, high]."""
    count: int
    total: int
    share: float
    low: float
    high: float

    @classmethod
    def of(cls, flags: Iterable[bool]) -> Rate:
        values = list(flags)
        return wilson(sum(values), len(values))

    def shown(self) -> str:
        """"69.3% (68.1-70.5)": the share and its interval, in points."""
        if not self.total:
            return "-"
        return f"{self.share:.1%} ({100 * self.low:.1f}-{100 * self.high:.1f})"


def wilson(count: int, total: int, z: float = Z_95) -> Rate:
    """The Wilson score interval of `count` in `total` (an empty sample: share 0, [0, 1])."""
    if not 0 <= count <= total:
        raise ValueError(f"count {count} must be from 0 to total {total}")
    if total == 0:
        return Rate(0, 0, 0.0, 0.0, 1.0)
    p, n = count / total, total
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Rate(count, total, p, max(0.0, center - half), min(1.0, center + half))
