"""The report's reading of histograms: quantiles as Prometheus's histogram_quantile
computes them, from explicit and from exponential OTLP buckets."""

from __future__ import annotations

import pytest

from otel_train.runs.record_data import Histogram, _exponential


def test_explicit_bucket_quantiles_interpolate_within_the_bucket() -> None:
    h = Histogram(count=10, total=0.0, bounds=[1.0, 2.0, 4.0], counts=[2, 6, 2, 0])
    assert h.quantile(0.5) == pytest.approx(1.0 + (5 - 2) / 6)  # in (1, 2]
    assert h.quantile(0.95) == pytest.approx(2.0 + 2.0 * (9.5 - 8) / 2)  # in (2, 4]
    assert Histogram(0, 0.0, [1.0], [0, 0]).quantile(0.5) is None


def test_deltas_subtract_bucket_by_bucket() -> None:
    old = Histogram(count=4, total=2.0, bounds=[1.0], counts=[3, 1])
    new = Histogram(count=10, total=7.0, bounds=[1.0], counts=[5, 5])
    d = new.minus(old)
    assert (d.count, d.total, d.counts) == (6, 5.0, [2, 4])


def test_exponential_buckets_read_as_their_bounds() -> None:
    # scale 0: base 2; offset 1: buckets (2, 4], (4, 8]
    h = _exponential({"scale": 0, "count": 4, "sum": 20.0, "zeroCount": 0,
                      "positive": {"offset": 1, "bucketCounts": ["2", "2"]}})  # fmt: skip
    assert h.bounds[:3] == [2.0, 4.0, 8.0]
    assert h.quantile(0.5) == pytest.approx(4.0)  # the end of (2, 4]
    assert h.quantile(0.75) == pytest.approx(6.0)  # halfway through (4, 8]
