"""The in-process aggregation and the bridge that hands its histograms to SDK readers."""

from __future__ import annotations

import math

import pytest
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.resources import Resource

from otel_train import contract as c
from otel_train.export.bridge import BridgedInMemoryReader, HistogramBridge
from otel_train.processing.aggregate import Exemplar, HistogramState, MetricsAggregator

BOUNDS = (1.0, 2.0, 5.0)
VALUES = [0.5, 1.0, 1.0000001, 1.5, 2.0, 4.999, 5.0, 5.0001, 100.0, 0.0, -1.0]


def test_bucket_bounds_are_upper_inclusive() -> None:
    h = HistogramState(BOUNDS, start_unix_nano=0)
    for v in VALUES:
        h.observe(v)
    # (-inf, 1], (1, 2], (2, 5], (5, +inf)
    assert h.counts == [4, 3, 2, 2]
    assert h.count == len(VALUES)
    assert h.sum == pytest.approx(sum(VALUES))
    assert (h.min, h.max) == (-1.0, 100.0)


def test_buckets_match_the_sdk_explicit_bucket_histogram() -> None:
    values = [v for v in VALUES if v >= 0]  # the SDK drops negative values; durations never are
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    sdk_hist = provider.get_meter("t").create_histogram(
        "h", explicit_bucket_boundaries_advisory=list(BOUNDS)
    )
    ours = HistogramState(BOUNDS, start_unix_nano=0)
    for v in values:
        sdk_hist.record(v)
        ours.observe(v)
    (metric,) = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
    (point,) = metric.data.data_points
    provider.shutdown()
    assert list(point.explicit_bounds) == list(BOUNDS)
    assert list(point.bucket_counts) == ours.counts
    assert point.sum == pytest.approx(ours.sum)
    assert (point.min, point.max) == (ours.min, ours.max)


def test_exemplars_land_in_the_bucket_of_their_value_last_one_wins() -> None:
    h = HistogramState(BOUNDS, start_unix_nano=0)
    h.attach_exemplar(Exemplar(2.0, 10, trace_id=1, span_id=2))
    h.attach_exemplar(Exemplar(7.0, 11, trace_id=3, span_id=4))
    h.attach_exemplar(Exemplar(6.0, 12, trace_id=5, span_id=6))
    assert h.exemplars[0] is None and h.exemplars[2] is None
    assert h.exemplars[1].trace_id == 1
    assert h.exemplars[3].trace_id == 5


def test_copy_is_independent() -> None:
    h = HistogramState(BOUNDS, start_unix_nano=7)
    h.observe(1.5)
    snap = h.copy()
    h.observe(1.5)
    h.attach_exemplar(Exemplar(1.5, 1, 1, 1))
    assert snap.counts == [0, 1, 0, 0] and snap.count == 1 and snap.exemplars[1] is None
    assert snap.start_unix_nano == 7


def test_observe_many_is_observe_one_by_one() -> None:
    # values on and beside the bounds, below the first and above the last, repeated
    values = [0.5, 1.0, 2.0, 1e-9, 7.25, 2.0000001, 0.1, 0.2, 0.3, 1e9, 0.0, 1.0, 0.5]
    values += [b * f for b in BOUNDS for f in (0.999, 1.0, 1.001)]
    one, many = HistogramState(BOUNDS, 0), HistogramState(BOUNDS, 0)
    for v in values:
        one.observe(v)
    many.observe_many(values[:4])
    many.observe_many([])
    many.observe_many(values[4:])
    assert many.counts == one.counts and many.count == one.count == len(values)
    assert math.isclose(many.sum, one.sum, rel_tol=1e-12)  # (3.12+ compensates sum())
    assert (many.min, many.max) == (one.min, one.max) == (0.0, 1e9)


def test_aggregator_keys_counters_gauges_and_snapshots() -> None:
    agg = MetricsAggregator()
    attrs = (("clock", "host"), ("phase", "forward"))
    h = agg.histogram(c.PHASE_DURATION.name, attrs)
    assert agg.histogram(c.PHASE_DURATION.name, attrs) is h
    assert agg.histogram(c.PHASE_DURATION.name, (("phase", "backward"),)) is not h
    assert h.bounds == c.DURATION_BUCKETS
    with agg.lock:
        h.observe(0.003)
        agg.add(c.STEPS.name, (), 1)
        agg.add(c.STEPS.name, (), 2)
        agg.set(c.THROUGHPUT_FLOPS.name, (), 10.0)
        agg.set(c.THROUGHPUT_FLOPS.name, (), 12.0)
    assert agg.read(c.STEPS.name) == [((), 3.0)]
    assert agg.read(c.THROUGHPUT_FLOPS.name) == [((), 12.0)]
    assert agg.read("nothing") == []
    snaps = {(n, a): s for n, a, s in agg.snapshot_histograms()}
    snap = snaps[(c.PHASE_DURATION.name, attrs)]
    h.observe(0.003)
    assert snap.count == 1 and h.count == 2


def _bridge() -> tuple[HistogramBridge, MetricsAggregator]:
    bridge = HistogramBridge(Resource.create({"service.name": "t"}), "0.0")
    agg = MetricsAggregator()
    bridge.aggregator = agg
    return bridge, agg


def _point(metrics: list) -> HistogramDataPoint:
    (metric,) = metrics
    (point,) = metric.data.data_points
    return point


def test_bridge_cumulative_keeps_growing_from_the_start() -> None:
    bridge, agg = _bridge()
    assert bridge.metrics(1, delta=False) == []  # nothing observed: nothing exported
    h = agg.histogram(c.PHASE_DURATION.name, (("clock", "host"), ("phase", "fwd")))
    h.observe(0.001)
    h.observe(0.2)
    (metric,) = bridge.metrics(1, delta=False)
    assert metric.name == c.PHASE_DURATION.name and metric.unit == "s"
    assert metric.data.aggregation_temporality == AggregationTemporality.CUMULATIVE
    first = metric.data.data_points[0]
    assert dict(first.attributes) == {"clock": "host", "phase": "fwd"}
    assert first.count == 2 and sum(first.bucket_counts) == 2
    assert list(first.explicit_bounds) == list(c.DURATION_BUCKETS)
    h.observe(0.003)
    second = _point(bridge.metrics(1, delta=False))
    assert second.count == 3 and sum(second.bucket_counts) == 3
    assert second.sum == pytest.approx(0.204)
    assert first.start_time_unix_nano == second.start_time_unix_nano == agg.start_unix_nano


def test_bridge_delta_reports_only_what_is_new_per_reader() -> None:
    bridge, agg = _bridge()
    h = agg.histogram(c.STEP_DURATION.name, ())
    h.observe(0.001)
    h.observe(0.2)
    first = _point(bridge.metrics(7, delta=True))
    assert first.count == 2
    assert first.start_time_unix_nano == agg.start_unix_nano
    h.observe(0.003)
    second = _point(bridge.metrics(7, delta=True))
    assert second.count == 1
    assert second.sum == pytest.approx(0.003)
    i = c.DURATION_BUCKETS.index(0.005)  # 0.003 falls in (0.0025, 0.005]
    assert second.bucket_counts == [1 if k == i else 0 for k in range(len(second.bucket_counts))]
    assert second.start_time_unix_nano == first.time_unix_nano  # deltas tile time
    assert bridge.metrics(7, delta=True) == []  # nothing new: no point
    # Another reader has its own delta state; a cumulative reader is unaffected.
    assert _point(bridge.metrics(8, delta=True)).count == 3
    assert _point(bridge.metrics(9, delta=False)).count == 3


def test_bridge_exports_exemplars_with_trace_and_span_ids() -> None:
    bridge, agg = _bridge()
    h = agg.histogram(c.STEP_DURATION.name, ())
    h.observe(0.02)
    h.attach_exemplar(Exemplar(0.02, 123, trace_id=0xABC, span_id=0xDEF))
    (ex,) = _point(bridge.metrics(1, delta=False)).exemplars
    assert (ex.trace_id, ex.span_id, ex.value, ex.time_unix_nano) == (0xABC, 0xDEF, 0.02, 123)


@pytest.mark.parametrize(
    "temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA]
)
def test_bridged_reader_merges_into_the_otel_train_scope(
    temporality: AggregationTemporality,
) -> None:
    bridge, agg = _bridge()
    reader = BridgedInMemoryReader(bridge, preferred_temporality={SdkHistogram: temporality})
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    meter = provider.get_meter(c.SCOPE_NAME)
    meter.create_counter("otel_train.sdk_counter").add(1)
    provider.get_meter("someone.else").create_counter("other").add(1)
    h = agg.histogram(c.STEP_DURATION.name, ())
    h.observe(0.01)

    def collect() -> dict:
        data = reader.get_metrics_data()
        out = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                out[sm.scope.name] = {m.name: m for m in sm.metrics}
        return out

    scopes = collect()
    assert set(scopes[c.SCOPE_NAME]) == {"otel_train.sdk_counter", c.STEP_DURATION.name}
    assert set(scopes["someone.else"]) == {"other"}
    hist = scopes[c.SCOPE_NAME][c.STEP_DURATION.name].data
    assert hist.aggregation_temporality == temporality
    assert hist.data_points[0].count == 1
    h.observe(0.02)
    again = collect()[c.SCOPE_NAME][c.STEP_DURATION.name].data.data_points[0]
    assert again.count == (1 if temporality == AggregationTemporality.DELTA else 2)
    provider.shutdown()
