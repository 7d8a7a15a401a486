"""The histogram bridge: aggregated duration histograms into SDK metric readers.

The recording core aggregates durations itself (see ``processing/aggregate.py``).
Readers that otel-train builds are these subclasses: each collection merges the
aggregator's histograms, with exemplars pointing at sampled step traces, into the
``otel_train`` scope of the collected data, in the temporality and the form the reader
asked for: exponential buckets for a reader whose histogram aggregation is
``ExponentialBucketHistogramAggregation`` (otel-train's OTLP reader by default, see
``exporters.py``), explicit buckets otherwise (the ``/metrics`` endpoint, in-memory readers).

The bridge reads and replaces private names of the SDK (``SDK_INTERNALS``). They are
checked once, at import: where one is missing (an SDK release that moved it), the bridge
is off with one warning, and the histograms go through the metrics API instead.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from weakref import WeakKeyDictionary

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Exemplar, MeterProvider
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import contract as c
from ..processing.aggregate import HistogramState, MetricsAggregator

_SPECS = {m.name: m for m in c.METRICS if m.instrument == "histogram"}
_log = logging.getLogger("otel_train")
_APP_BRIDGES: WeakKeyDictionary[Any, HistogramBridge] = WeakKeyDictionary()  # (mirror_into)

# The SDK's private names the bridge uses, on what has them: the reader class (the method
# each collection passes through, which the bridge replaces), a reader and a meter
# provider (both set theirs in __init__: a fresh one of each is looked at).
SDK_INTERNALS = {
    "MetricReader": ("_receive_metrics",),
    "a MetricReader": ("_instrument_class_temporality", "_instrument_class_aggregation"),
    "a MeterProvider": ("_metric_readers", "_sdk_config"),
}


def missing_sdk_internals() -> list[str]:
    """``owner: name`` of each of ``SDK_INTERNALS`` this SDK lacks."""
    probes = {
        "MetricReader": MetricReader,
        "a MetricReader": InMemoryMetricReader(),
        "a MeterProvider": MeterProvider(shutdown_on_exit=False),
    }
    return [
        f"{owner}: {name}"
        for owner, names in SDK_INTERNALS.items()
        for name in names
        if not hasattr(probes[owner], name)
    ]


def _check_sdk() -> bool:
    missing = missing_sdk_internals()
    if missing:
        _log.warning(
            "otel-train: this OpenTelemetry SDK lacks %s: the histogram bridge is off, "
            "duration histograms go through the metrics API (no exemplars, explicit "
            "buckets); otel-train is tested with the versions its package requires",
            ", ".join(missing),
        )
    return not missing


BRIDGE_WORKS = _check_sdk()


class HistogramBridge:
    """Turns aggregator snapshots into SDK ``Metric`` objects."""

    def __init__(self, resource: Resource, version: str) -> None:
        # A provider (and its bridge) can outlive a session: each session attaches its own.
        self.aggregator: MetricsAggregator | None = None
        self.resource = resource
        self.scope = InstrumentationScope(c.SCOPE_NAME, version, c.SCHEMA_URL)
        self._last: dict[int, dict[tuple[str, Any], tuple[HistogramState, int]]] = {}
        self._lock = threading.Lock()

    def attach(self, aggregator: MetricsAggregator) -> None:
        """Read this aggregator from now on: the one of the session that now owns the
        provider (a provider passed to several sessions in turn, as tests do). What
        delta readers were last given was the previous one's: forgotten."""
        with self._lock:
            self.aggregator = aggregator
            self._last.clear()

    def metrics(self, reader_id: int, delta: bool, exponential: bool = False) -> list[Metric]:
        """One collection of every histogram, in the reader's temporality and form."""
        agg = self.aggregator
        if agg is None:
            return []
        now = time.time_ns()
        by_name: dict[str, list[Any]] = {}
        point = _exponential_point if exponential else _explicit_point
        with self._lock:
            last = self._last.setdefault(reader_id, {})
            for name, attrs, h in agg.snapshot_histograms():
                if h.count == 0:
                    continue
                start, before = h.start_unix_nano, None
                if delta:
                    prev = last.get((name, attrs))
                    last[(name, attrs)] = (h, now)
                    if prev is not None:
                        before, start = prev
                        if h.count == before.count:
                            continue
                by_name.setdefault(name, []).append(point(h, before, attrs, start, now))
        temporality = AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE
        kind = ExponentialHistogram if exponential else Histogram
        return [
            Metric(
                name=name,
                description=_SPECS[name].description,
                unit=_SPECS[name].unit,
                data=kind(data_points=points, aggregation_temporality=temporality),
            )
            for name, points in by_name.items()
        ]

    def merge(self, reader: Any, data: MetricsData | None) -> MetricsData | None:
        # The reader keys temporality and aggregation by the SDK's private subclass
        # (_Histogram), not by the public Histogram: look them up by subclass, or delta
        # readers would get cumulative and exponential ones explicit buckets.
        delta = any(
            issubclass(kind, SdkHistogram) and temporality == AggregationTemporality.DELTA
            for kind, temporality in reader._instrument_class_temporality.items()
        )
        exponential = any(
            issubclass(kind, SdkHistogram)
            and isinstance(aggregation, ExponentialBucketHistogramAggregation)
            for kind, aggregation in reader._instrument_class_aggregation.items()
        )
        extra = self.metrics(id(reader), delta, exponential)
        if not extra:
            return data
        if data is None or not data.resource_metrics:
            return MetricsData(
                [
                    ResourceMetrics(
                        self.resource, [ScopeMetrics(self.scope, extra, c.SCHEMA_URL)], ""
                    )
                ]
            )
        first, *rest = data.resource_metrics
        scopes = list(first.scope_metrics)
        for i, sm in enumerate(scopes):
            if sm.scope.name == c.SCOPE_NAME:
                scopes[i] = ScopeMetrics(sm.scope, list(sm.metrics) + extra, sm.schema_url)
                break
        else:
            scopes.append(ScopeMetrics(self.scope, extra, c.SCHEMA_URL))
        return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


def _exemplars(h: HistogramState) -> list[Exemplar]:
    return [
        Exemplar({}, e.value, e.time_unix_nano, e.span_id, e.trace_id)
        for e in h.exemplars
        if e is not None
    ]


def _explicit_point(
    h: HistogramState, before: HistogramState | None, attrs: Any, start: int, now: int
) -> HistogramDataPoint:
    counts, total, count = h.counts, h.sum, h.count
    if before is not None:
        counts = [a - b for a, b in zip(h.counts, before.counts, strict=True)]
        total, count = h.sum - before.sum, h.count - before.count
    return HistogramDataPoint(
        attributes=dict(attrs),
        start_time_unix_nano=start,
        time_unix_nano=now,
        count=count,
        sum=total,
        bucket_counts=list(counts),
        explicit_bounds=list(h.bounds),
        min=h.min,
        max=h.max,
        exemplars=_exemplars(h),
    )


def _exponential_point(
    h: HistogramState, before: HistogramState | None, attrs: Any, start: int, now: int
) -> ExponentialHistogramDataPoint:
    exp, total, count = h.exp, h.sum, h.count
    if before is not None:
        exp = h.exp.minus(before.exp)
        total, count = h.sum - before.sum, h.count - before.count
    offset, counts = exp.dense()
    return ExponentialHistogramDataPoint(
        attributes=dict(attrs),
        start_time_unix_nano=start,
        time_unix_nano=now,
        count=count,
        sum=total,
        scale=exp.scale,
        zero_count=exp.zero_count,
        positive=Buckets(offset, counts),
        negative=Buckets(0, []),
        flags=0,
        min=h.min,
        max=h.max,
        exemplars=_exemplars(h),
    )


def _merged(bridge: HistogramBridge, reader: Any, metrics_data: Any) -> Any:
    """``metrics_data`` with otel-train's histograms merged in for ``reader`` (as it
    was when the merge fails or the bridge is off: never lose the SDK's own metrics
    because of ours)."""
    if not BRIDGE_WORKS:
        return metrics_data
    try:
        return bridge.merge(reader, metrics_data)
    except Exception:
        _log.exception("otel-train: histogram bridge failed")
        return metrics_data


class _Bridged:
    _otel_train_bridge: HistogramBridge

    def _receive_metrics(
        self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any
    ) -> None:
        metrics_data = _merged(self._otel_train_bridge, self, metrics_data)
        super()._receive_metrics(metrics_data, timeout_millis, **kw)  # type: ignore[misc]


class BridgedPeriodicReader(_Bridged, PeriodicExportingMetricReader):
    def __init__(self, bridge: HistogramBridge, *args: Any, **kwargs: Any) -> None:
        self._otel_train_bridge = bridge
        super().__init__(*args, **kwargs)


class BridgedPrometheusReader(_Bridged, PrometheusMetricReader):
    def __init__(self, bridge: HistogramBridge, *args: Any, **kwargs: Any) -> None:
        self._otel_train_bridge = bridge
        super().__init__(*args, **kwargs)


class BridgedInMemoryReader(_Bridged, InMemoryMetricReader):
    def __init__(self, bridge: HistogramBridge, *args: Any, **kwargs: Any) -> None:
        self._otel_train_bridge = bridge
        super().__init__(*args, **kwargs)


def bridge_readers(meter_provider: MeterProvider, bridge: HistogramBridge) -> None:
    """Put ``bridge`` on every reader of an application's SDK meter provider (each
    collection then merges otel-train's histograms in, as otel-train's own readers do).
    A provider with no reader (``OTEL_METRICS_EXPORTER=none``) is valid: nothing to do."""
    readers: list[Any] = list(meter_provider._metric_readers)
    for reader in readers:
        if isinstance(reader, _Bridged) or getattr(reader, "_otel_train_bridge", None):
            continue
        original = reader._receive_metrics

        def receive(data: Any, timeout_millis: float = 10_000, *, _reader: Any = reader,
                    _original: Any = original, **kw: Any) -> Any:  # fmt: skip
            return _original(_merged(bridge, _reader, data), timeout_millis, **kw)

        reader._receive_metrics = receive
        reader._otel_train_bridge = bridge


def mirror_into(
    meter_provider: MeterProvider | None, mirror: MetricsAggregator, version: str
) -> Any:
    """The application's SDK meter provider reads ``mirror`` at its own collection times:
    observable instruments for counters and gauges, the histogram bridge on its readers
    for histograms (the relay's: sidecar/relay.py, which needs ``BRIDGE_WORKS``). Returns
    the publisher (None without a meter provider)."""
    from ..processing.instruments import publisher_for

    if meter_provider is None:
        return None
    # A later session's mirror replaces this one's on the bridges, as on the publisher.
    for bridge in _bridges_on(meter_provider, version):
        bridge.attach(mirror)
    return publisher_for(meter_provider, mirror, version, histograms_via_api=False)


def _bridges_on(meter_provider: MeterProvider, version: str) -> list[HistogramBridge]:
    """The bridges on the readers of ``meter_provider``: the relay's, put on the readers
    without one the first time (one a provider: its readers keep it), and those a reader
    carries already (those otel-train builds: its testing helper's in-memory reader)."""
    if meter_provider not in _APP_BRIDGES:
        resource = meter_provider._sdk_config.resource
        bridge = HistogramBridge(resource or Resource.create({}), version)
        bridge_readers(meter_provider, bridge)
        _APP_BRIDGES[meter_provider] = bridge
    found = (getattr(r, "_otel_train_bridge", None) for r in meter_provider._metric_readers)
    return list({id(b): b for b in found if b is not None}.values())
