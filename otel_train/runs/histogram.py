"""A cumulative histogram as the report reads it: count, sum and per-bucket counts under
upper bounds (explicit buckets, or an exponential histogram's written out).

An exponential histogram's buckets change as it fills: its offset and length grow with
the range of the values, and its scale drops (two buckets merge into one) when they
would be too many. Two snapshots of one histogram therefore rarely have the same bounds;
their difference and their sum re-bin one onto the other's bounds first: each bucket's
count goes to the bucket holding its upper bound, which at a coarser scale of the same
base is the bucket that holds the whole of it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

_REL = 1e-9  # bounds equal within float noise (base ** i computed two ways)


@dataclass
class Histogram:
    """Cumulative counts: ``bounds`` upper bounds (explicit or exponential buckets)."""

    count: float
    total: float
    bounds: list[float]
    counts: list[float]  # per bucket; one more than bounds (the +Inf bucket)

    def rebinned(self, bounds: list[float]) -> list[float]:
        """The counts on ``bounds`` (sorted), each bucket's to the bucket of its upper
        bound (an exponential histogram's zero bucket: to that of its first bound)."""
        if bounds == self.bounds:
            return list(self.counts)
        out = [0.0] * (len(bounds) + 1)
        for i, n in enumerate(self.counts):
            if not n:
                continue
            upper = self.bounds[i] if i < len(self.bounds) else math.inf
            out[bisect.bisect_left(bounds, upper * (1 - _REL))] += n
        return out

    def minus(self, older: Histogram | None) -> Histogram:
        """What was added since ``older`` (an earlier snapshot of the same histogram)."""
        if older is None:
            return self
        old = older.rebinned(self.bounds)
        counts = [max(0.0, a - b) for a, b in zip(self.counts, old, strict=True)]
        return Histogram(self.count - older.count, self.total - older.total, self.bounds, counts)

    def plus(self, other: Histogram) -> Histogram:
        bounds = self.bounds if other.bounds == self.bounds else _union(self.bounds, other.bounds)
        a, b = self.rebinned(bounds), other.rebinned(bounds)
        counts = [x + y for x, y in zip(a, b, strict=True)]
        return Histogram(self.count + other.count, self.total + other.total, bounds, counts)

    def quantile(self, q: float) -> float | None:
        """Linear within the bucket, as Prometheus's histogram_quantile."""
        if self.count <= 0:
            return None
        rank, seen, lower = q * self.count, 0.0, 0.0
        for i, n in enumerate(self.counts):
            upper = self.bounds[i] if i < len(self.bounds) else math.inf
            if n > 0 and seen + n >= rank:
                if math.isinf(upper):
                    return lower
                return lower + (upper - lower) * (rank - seen) / n
            seen += n
            lower = upper if not math.isinf(upper) else lower
        return lower


def _union(a: list[float], b: list[float]) -> list[float]:
    """Both bound lists merged, bounds equal within float noise kept once."""
    out: list[float] = []
    for x in sorted([*a, *b]):
        if not out or x > out[-1] * (1 + _REL):
            out.append(x)
    return out
