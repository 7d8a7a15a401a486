"""The exponential buckets of the aggregator, and the bridge that exports them over OTLP."""

from __future__ import annotations

import math
import random

import pytest
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from otel_train import contract as c
from otel_train.export.bridge import BridgedInMemoryReader, HistogramBridge
from otel_train.export.exporters import otlp_histogram_aggregation
from otel_train.processing.aggregate import Exemplar, HistogramState, MetricsAggregator
from otel_train.processing.exponential import MAX_SCALE, MAX_SIZE, ExponentialBuckets


def _sdk_point(values: list[float]) -> ExponentialHistogramDataPoint:
    """What the SDK's own exponential aggregation makes of ``values``."""
    reader = InMemoryMetricReader()
    view = View(
        instrument_name="h",
        aggregation=ExponentialBucketHistogramAggregation(max_size=MAX_SIZE, max_scale=MAX_SCALE),
    )
    provider = MeterProvider(metric_readers=[reader], views=[view], shutdown_on_exit=False)
    hist = provider.get_meter("t").create_histogram("h")
    for v in values:
        hist.record(v)
    (metric,) = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
    (point,) = metric.data.data_points
    provider.shutdown()
    return point  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0.2, 0.3), (1e-4, 1.0), (1e-6, 1e3), (1e-9, 600.0)],  # the last two downscale
)
def test_buckets_match_the_sdk_exponential_histogram(lo: float, hi: float) -> None:
    rng = random.Random(f"{lo}-{hi}")
    values = [lo, hi] + [lo * (hi / lo) ** rng.random() for _ in range(500)]
    values += [0.0, 0.25, 0.5, 1.0, 2.0]  # zero, and powers of 2 (bucket upper bounds)
    values = [v for v in values if v == 0.0 or lo <= v <= hi]
    ours = ExponentialBuckets()
    ours.observe_many(values[:100])
    ours.observe_many(values[100:])
    sdk = _sdk_point(values)
    assert ours.scale == sdk.scale
    sdk_counts = list(sdk.positive.bucket_counts)
    while sdk_counts and sdk_counts[-1] == 0:  # the SDK's array can end in spare zeros
        sdk_counts.pop()
    assert ours.dense() == (sdk.positive.offset, sdk_counts)
    assert ours.zero_count == sdk.zero_count == values.count(0.0)


def test_downscale_keeps_the_range_within_max_size() -> None:
    b = ExponentialBuckets()
    b.observe_many([0.001])
    assert b.scale == MAX_SCALE
    b.observe_many([1e6])  # 2**30 wider: 240 buckets at scale 3, 120 at scale 2
    assert b.scale == MAX_SCALE - 1
    offset, counts = b.dense()
    assert len(counts) <= MAX_SIZE and sum(counts) == 2
    base = 2**2**-b.scale
    assert base**offset < 0.001 <= base ** (offset + 1)
    assert base ** (offset + len(counts) - 1) < 1e6 <= base ** (offset + len(counts))


def test_minus_is_what_came_since_across_a_downscale() -> None:
    b = ExponentialBuckets()
    b.observe_many([0.01, 0.011, 0.0])
    before = b.copy()
    b.observe_many([0.012, 1e5, 0.0])  # wide enough to downscale
    assert b.scale < before.scale
    since = b.minus(before)
    assert since.scale == b.scale and since.zero_count == 1
    fresh = ExponentialBuckets()
    fresh.observe_many([0.012, 1e5])
    fresh.downscale(b.scale)
    assert since.buckets == fresh.buckets
    assert before.minus(before).buckets == {}


def _bridge() -> tuple[HistogramBridge, MetricsAggregator]:
    bridge = HistogramBridge(Resource.create({"service.name": "t"}), "0.0")
    agg = MetricsAggregator()
    bridge.aggregator = agg
    return bridge, agg


def test_bridge_exponential_points_cumulative_and_delta() -> None:
    bridge, agg = _bridge()
    h = agg.histogram(c.STEP_DURATION.name, ())
    h.observe_many([0.2, 0.21, 0.25])
    h.attach_exemplar(Exemplar(0.25, 123, trace_id=0xABC, span_id=0xDEF))
    (metric,) = bridge.metrics(1, delta=False, exponential=True)
    (point,) = metric.data.data_points
    assert isinstance(point, ExponentialHistogramDataPoint)
    assert metric.data.aggregation_temporality == AggregationTemporality.CUMULATIVE
    assert (point.count, point.scale, point.zero_count) == (3, MAX_SCALE, 0)
    assert sum(point.positive.bucket_counts) == 3 and point.negative.bucket_counts == []
    assert (point.min, point.max) == (0.2, 0.25) and point.sum == pytest.approx(0.66)
    (ex,) = point.exemplars  # the same exemplars as the explicit form: step traces
    assert (ex.trace_id, ex.span_id, ex.value) == (0xABC, 0xDEF, 0.25)

    first = bridge.metrics(2, delta=True, exponential=True)[0].data.data_points[0]
    h.observe(0.4)
    (metric,) = bridge.metrics(2, delta=True, exponential=True)
    (second,) = metric.data.data_points
    assert metric.data.aggregation_temporality == AggregationTemporality.DELTA
    assert second.count == 1 and sum(second.positive.bucket_counts) == 1
    assert second.start_time_unix_nano == first.time_unix_nano
    assert bridge.metrics(2, delta=True, exponential=True) == []


def test_the_reader_aggregation_picks_the_form() -> None:
    """A reader asking for exponential histograms (otel-train's OTLP reader) gets them;
    any other (the /metrics endpoint, in-memory readers by default) gets explicit buckets."""
    bridge, agg = _bridge()
    exponential = BridgedInMemoryReader(bridge, preferred_aggregation=otlp_histogram_aggregation())
    explicit = BridgedInMemoryReader(bridge)
    provider = MeterProvider(metric_readers=[exponential, explicit], shutdown_on_exit=False)
    provider.get_meter(c.SCOPE_NAME).create_counter("otel_train.sdk_counter").add(1)
    agg.histogram(c.STEP_DURATION.name, ()).observe(0.3)

    def point(reader: InMemoryMetricReader) -> object:
        data = reader.get_metrics_data()
        assert data is not None
        metrics = {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}
        return metrics[c.STEP_DURATION.name].data.data_points[0]

    assert isinstance(point(exponential), ExponentialHistogramDataPoint)
    explicit_point = point(explicit)
    assert list(explicit_point.explicit_bounds) == list(c.DURATION_BUCKETS)  # type: ignore[attr-defined]
    provider.shutdown()


def test_otlp_aggregation_yields_to_the_standard_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    aggregation = otlp_histogram_aggregation()[SdkHistogram]
    assert isinstance(aggregation, ExponentialBucketHistogramAggregation)
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", "explicit_bucket_histogram"
    )
    assert otlp_histogram_aggregation() == {}  # the SDK reads the variable then


def test_histogram_state_keeps_both_forms_in_step() -> None:
    h = HistogramState(c.DURATION_BUCKETS, 0)
    h.observe(0.3)
    h.observe_many([0.31, 0.0, 12.0])
    snap = h.copy()
    h.observe(1.0)
    assert sum(snap.counts) == snap.count == 4
    assert sum(snap.exp.buckets.values()) + snap.exp.zero_count == 4
    assert sum(h.exp.buckets.values()) + h.exp.zero_count == 5


def test_in_memory_telemetry_can_hold_the_otlp_form() -> None:
    import otel_train
    from otel_train.testing import InMemoryTelemetry, reset

    tel = InMemoryTelemetry(otlp_histograms=True)
    otel_train.configure(
        tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider, console="off"
    )
    try:
        for _ in range(3):
            with otel_train.step(samples=1), otel_train.phase("train"):
                pass
        (step,) = tel.points(c.STEP_DURATION.name)
        assert isinstance(step, ExponentialHistogramDataPoint) and step.count == 3
        assert all(isinstance(p, ExponentialHistogramDataPoint)
                   for p in tel.points(c.PHASE_DURATION.name))  # fmt: skip
    finally:
        reset()


def test_values_at_bucket_bounds_land_where_each_alone_would() -> None:
    """A batch (bisected by runs) puts each value in the bucket the definition gives it
    alone, ``ceil(log2(v) * 2**scale) - 1``, at and beside every computed bound too."""
    f = 2.0**MAX_SCALE
    bounds = [2.0 ** (k / f) for k in range(-40, 40)]
    values = [v for b in bounds for v in (math.nextafter(b, 0.0), b, math.nextafter(b, 9.0))]
    values += [0.0, -1.0, 0.0]
    random.Random(3).shuffle(values)
    batch = ExponentialBuckets()
    batch.observe_many(values)
    alone: dict[int, int] = {}
    for v in values:
        if v > 0:
            i = math.ceil(math.log2(v) * f) - 1
            alone[i] = alone.get(i, 0) + 1
    assert batch.scale == MAX_SCALE and batch.buckets == alone and batch.zero_count == 3
