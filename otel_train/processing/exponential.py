"""Base-2 exponential buckets: the form of a duration histogram that OTLP exports.

An OpenTelemetry exponential histogram (Prometheus stores it as a native histogram:
one series, however many buckets) has buckets ``(base**i, base**(i + 1)]`` with
``base = 2 ** 2 ** -scale``. The aggregator keeps them beside the explicit buckets
(which the in-process ``/metrics`` endpoint serves): it starts at ``MAX_SCALE`` and
halves the resolution (scale - 1, two buckets become one) whenever the populated range
would need more than ``MAX_SIZE`` buckets, as the SDK's
``ExponentialBucketHistogramAggregation`` does.

``MAX_SCALE`` 3 is a growth factor of 2 ** (1/8) = 1.09 per bucket, the default of
Prometheus's own client libraries (``NativeHistogramBucketFactor`` 1.1): quantiles to
within about 4.5%, against a factor of 2 to 2.5 for the explicit buckets, and a few
buckets per sample for a step time that varies by 10%.

Usage::

    b = ExponentialBuckets()
    b.observe_many([0.25, 0.26, 0.31])
    offset, counts = b.dense()
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from ..contract import DURATION_MAX_SCALE as MAX_SCALE
from ..contract import DURATION_MAX_SIZE as MAX_SIZE

MIN_SCALE = -4  # Prometheus's lowest native histogram schema


class ExponentialBuckets:
    """Positive buckets by index, a zero count, and the scale they are at."""

    __slots__ = ("buckets", "scale", "zero_count")

    def __init__(self, scale: int = MAX_SCALE) -> None:
        self.scale = scale
        self.zero_count = 0  # values <= 0 (a zero-length duration)
        self.buckets: dict[int, int] = {}

    def observe_many(self, values: Iterable[float]) -> None:
        self.observe_sorted(sorted(values))

    def observe_sorted(self, ordered: Sequence[float]) -> None:
        """``observe_many`` for values in ascending order: a run of values in one bucket
        is found by bisection (a batch of step times fills a few buckets), not value by
        value. Bucket i is (base**i, base**(i + 1)]: ``ceil(log_base(v)) - 1``, exact at
        powers of 2; each run's ends are checked by that formula, so every value lands
        where it alone would."""
        n = len(ordered)
        j = bisect.bisect_right(ordered, 0.0)
        self.zero_count += j  # (values <= 0)
        f = 2.0**self.scale
        b, ceil, log2 = self.buckets, math.ceil, math.log2
        while j < n:
            i = ceil(log2(ordered[j]) * f) - 1
            hi = bisect.bisect_right(ordered, 2.0 ** ((i + 1) / f), j)
            while hi > j + 1 and ceil(log2(ordered[hi - 1]) * f) - 1 != i:
                hi -= 1  # (the bound rounded above the bucket's last value)
            while hi < n and ceil(log2(ordered[hi]) * f) - 1 == i:
                hi += 1  # (or below it)
            b[i] = b.get(i, 0) + hi - j
            j = hi
        self._fit()

    def _fit(self) -> None:
        while self.buckets and self.scale > MIN_SCALE:
            b = self.buckets
            width = max(b) - min(b) + 1
            if width <= MAX_SIZE:
                return
            self.downscale(self.scale - 1)

    def downscale(self, scale: int) -> None:
        """Merge buckets down to ``scale`` (no higher than the current one)."""
        shift = self.scale - scale
        if shift <= 0:
            return
        merged: dict[int, int] = {}
        for i, n in self.buckets.items():
            j = i >> shift  # floor division: bucket i lies within bucket i >> 1 one scale down
            merged[j] = merged.get(j, 0) + n
        self.buckets, self.scale = merged, scale

    def at(self, scale: int) -> ExponentialBuckets:
        """A copy at ``scale`` (merged down when lower than this one's)."""
        out = ExponentialBuckets(self.scale)
        out.zero_count, out.buckets = self.zero_count, dict(self.buckets)
        out.downscale(scale)
        return out

    def copy(self) -> ExponentialBuckets:
        return self.at(self.scale)

    def minus(self, before: ExponentialBuckets) -> ExponentialBuckets:
        """What was observed since ``before`` (an earlier copy of these buckets)."""
        out = self.copy()
        old = before.at(out.scale)
        out.zero_count -= old.zero_count
        for i, n in old.buckets.items():
            left = out.buckets.get(i, 0) - n
            if left:
                out.buckets[i] = left
            else:
                out.buckets.pop(i, None)
        return out

    def dense(self) -> tuple[int, list[int]]:
        """(offset, counts): the populated range as OTLP sends it, gaps as zeros."""
        b = self.buckets
        if not b:
            return 0, []
        lo = min(b)
        return lo, [b.get(i, 0) for i in range(lo, max(b) + 1)]
