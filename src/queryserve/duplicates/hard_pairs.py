"""Hand-written product pairs that one token or one word order decides, and what a person says
of each: the one list `prepare`'s gate holds the served `duplicates` model to (each reduced
precision must decide every pair exactly as the trained model does) and the end-to-end test
asks the served model about.

Why a list beside 512 test pairs: the gate's agreement of >= 99% allows a few flips, and where
they fall depends on the host that times the variants. On an AMD EPYC, int8-smoothquant-fused
agreed on 99.22% of the test pairs at the served threshold 0.2 and still called the first pair
below one product (P 0.284), so `/v1/duplicates` answered by the host's choice of variant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HardPair:
    left: str
    right: str
    duplicate: bool  # what a person says; the committed model says so too

    @property
    def name(self) -> str:
        """How the gate and prepare.json name the pair."""
        return f"{self.left!r} / {self.right!r}"


HARD_PAIRS = (
    # One token apart, another product.
    HardPair("apple ipod nano 8gb", "apple ipod touch 8gb", duplicate=False),
    # The same product, its words reordered and punctuated.
    HardPair("apple ipod nano 8gb silver", "apple 8gb ipod nano - silver", duplicate=True),
)
