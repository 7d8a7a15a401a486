"""Whether a difference between two runs stands out from their noise.

The figure compared is the ratio of medians, B over A. Its 95% interval comes from a
percentile bootstrap: each round resamples A's samples and B's samples (steps, or
intervals of steps) with replacement and takes the ratio of the two medians; the
interval is the 2.5th and 97.5th percentile of ``ROUNDS`` such ratios. The random
generator is seeded (``SEED`` unless told), so the same records give the same interval.

The bootstrap sees only the spread of the steps within each run. Two runs of one
command also differ by the machine's state between them (other load, clocks, caches),
so a difference counts as real only when its interval leaves out 1 and its ratio is
beyond the tolerance as well (``TOLERANCE``, 10%); else it reads "within noise". On a
quiet machine with steady GPU steps a smaller tolerance (``--tolerance 2``) is sound;
docs/compare.md has the run-to-run spread measured on a busy 2-core machine.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

ROUNDS = 1000
SEED = 0
TOLERANCE = 0.10
LEVEL = 0.95


@dataclass(frozen=True)
class Ratio:
    """B's median over A's, with its bootstrap interval."""

    a: float  # A's median
    b: float  # B's median
    ratio: float
    low: float
    high: float

    def beyond_noise(self, tolerance: float = TOLERANCE) -> bool:
        outside = self.low > 1.0 or self.high < 1.0
        return outside and abs(self.ratio - 1.0) > tolerance


def spread(values: Sequence[float]) -> float:
    """The interquartile range: a spread that a few outlier steps do not dominate."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def ratio_of_medians(a: Sequence[float], b: Sequence[float], seed: int = SEED,
                     rounds: int = ROUNDS) -> Ratio | None:  # fmt: skip
    """B's median over A's and its interval; None when either is empty or A's median 0."""
    if not a or not b:
        return None
    ma, mb = statistics.median(a), statistics.median(b)
    if ma <= 0:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(rounds):
        ra = statistics.median(rng.choices(a, k=len(a)))
        rb = statistics.median(rng.choices(b, k=len(b)))
        if ra > 0:
            ratios.append(rb / ra)
    ratios.sort()
    tail = (1.0 - LEVEL) / 2.0
    low = ratios[int(tail * (len(ratios) - 1))] if ratios else mb / ma
    high = ratios[int((1.0 - tail) * (len(ratios) - 1) + 0.5)] if ratios else mb / ma
    return Ratio(ma, mb, mb / ma, low, high)
