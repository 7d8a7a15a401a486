"""Whether a difference between two runs stands out from their noise.

The figure compared is the ratio of medians, B over A. Its 95% interval comes from a
block bootstrap: each round resamples A's samples and B's samples (steps, or intervals
of steps) as runs of ``block_length`` consecutive samples, with replacement, and takes
the ratio of the two medians; the interval is the 2.5th and 97.5th percentile of
``ROUNDS`` such ratios. Resampling runs of neighbouring steps, not single steps, keeps
what neighbouring steps share (the machine's load of that moment) in the interval. The
random generator is seeded (``SEED`` unless told), so the same records give the same
interval.

The bootstrap sees the spread of the steps within each run, not the machine's state
from one run to the next. A run's own course stands for that: its steady samples cut
in thirds by time (:func:`thirds`), the change must hold over the whole of both runs,
every third of B beyond every third of A in the one direction. A run whose median moved
over its course by more than the change is no evidence of it.

The median alone can jump: steps on a busy machine often come in two kinds (a quick
one, and one that waited for the CPU), and a median near the boundary moves from one
kind to the other with a few steps. So the steps themselves must also tell the runs
apart: :func:`separation` is the chance that a step of B is larger than a step of A
(ties count half; Vargha and Delaney's A), 0.5 when the runs are alike, and a change
counts only when it is at least ``SEPARATED`` (0.71, their "large") or at most 1 less
that.

A difference counts as real only when its interval leaves out 1, the thirds are apart,
the steps are separated, and it is larger than the tolerance (``TOLERANCE``, 10%); else
it reads "within noise". docs/compare.md has the run-to-run spread
measured on a busy 2-core machine.
"""

from __future__ import annotations

import bisect
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

ROUNDS = 1000
SEED = 0
TOLERANCE = 0.10
LEVEL = 0.95
SEPARATED = 0.71


@dataclass(frozen=True)
class Ratio:
    """B's median over A's, with its bootstrap interval."""

    a: float  # A's median
    b: float  # B's median
    ratio: float
    low: float
    high: float
    a_thirds: list[float] | None  # the medians of A's thirds (None: under 9 samples)
    b_thirds: list[float] | None
    separation: float  # the chance that a sample of B is larger than one of A

    def thirds_apart(self) -> bool:
        """Every third of B beyond every third of A, one way (so when a run is too short
        to cut in thirds)."""
        if self.a_thirds is None or self.b_thirds is None:
            return True
        a, b = self.a_thirds, self.b_thirds
        return max(b) < min(a) or min(b) > max(a)

    def beyond_noise(self, tolerance: float = TOLERANCE) -> bool:
        outside = self.low > 1.0 or self.high < 1.0
        apart = not 1.0 - SEPARATED < self.separation < SEPARATED
        big = abs(self.ratio - 1.0) > tolerance
        return outside and apart and big and self.thirds_apart()


def spread(values: Sequence[float]) -> float:
    """The interquartile range: a spread that a few outlier steps do not dominate."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def thirds(values: Sequence[float]) -> list[float] | None:
    """The medians of a run's samples in thirds by time (None with under 3 a third)."""
    n = len(values)
    if n < 9:
        return None
    return [statistics.median(values[i * n // 3 : (i + 1) * n // 3]) for i in range(3)]


def separation(a: Sequence[float], b: Sequence[float]) -> float:
    """The chance that a sample of B is larger than one of A, ties counting half."""
    ordered = sorted(a)
    larger = 0.0
    for x in b:
        below, up_to = bisect.bisect_left(ordered, x), bisect.bisect_right(ordered, x)
        larger += below + 0.5 * (up_to - below)
    return larger / (len(a) * len(b))


def block_length(n: int) -> int:
    """Consecutive samples resampled together: the cube root of the count, the usual
    order for a block bootstrap of a median."""
    root: float = n ** (1.0 / 3.0)
    return max(1, round(root))


def _resample(values: Sequence[float], rng: random.Random) -> list[float]:
    n = len(values)
    size = block_length(n)
    out: list[float] = []
    while len(out) < n:
        start = rng.randrange(n - size + 1)
        out.extend(values[start : start + size])
    return out[:n]


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
        ra = statistics.median(_resample(a, rng))
        rb = statistics.median(_resample(b, rng))
        if ra > 0:
            ratios.append(rb / ra)
    ratios.sort()
    tail = (1.0 - LEVEL) / 2.0
    low = ratios[int(tail * (len(ratios) - 1))] if ratios else mb / ma
    high = ratios[int((1.0 - tail) * (len(ratios) - 1) + 0.5)] if ratios else mb / ma
    return Ratio(ma, mb, mb / ma, low, high, thirds(a), thirds(b), separation(a, b))
