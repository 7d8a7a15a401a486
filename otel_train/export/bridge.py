"""The histogram bridge: aggregated duration histograms into SDK metric readers.

The recording core aggregates durations itself (see ``recording/aggregate.py``).
Readers that otel-train builds are these subclasses: each collection merges the
aggregator's histograms, with exemplars pointing at sampled step traces, into the
``otel_train`` scope of the collected data, in the temporality the reader asked for.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import contract as c
from ..recording.aggregate import HistogramState, MetricsAggregator

_SPECS = {m.name: m for m in c.METRICS if m.instrument == "histogram"}


class HistogramBridge:
    """Turns aggregator snapshots into SDK ``Metric`` objects."""

    def __init__(self, resource: Resource, version: str) -> None:
        # A provider (and its bridge) can outlive a session: each session attaches its own.
        self.aggregator: MetricsAggregator | None = None
        self.resource = resource
        self.scope = InstrumentationScope(c.SCOPE_NAME, version)
        self._last: dict[int, dict[tuple[str, Any], tuple[HistogramState, int]]] = {}
        self._lock = threading.Lock()

    def attach(self, aggregator: MetricsAggregator) -> None:
        """Read this aggregator from now on: the one of the session that now owns the
        provider (a provider passed to several sessions in turn, as tests do)."""
        self.aggregator = aggregator

    def metrics(self, reader_id: int, delta: bool) -> list[Metric]:
        agg = self.aggregator
        if agg is None:
            return []
        now = time.time_ns()
        by_name: dict[str, list[HistogramDataPoint]] = {}
        with self._lock:
            last = self._last.setdefault(reader_id, {})
            for name, attrs, h in agg.snapshot_histograms():
                if h.count == 0:
                    continue
                start = h.start_unix_nano
                counts, total, count = h.counts, h.sum, h.count
                lo, hi = h.min, h.max
                if delta:
                    prev = last.get((name, attrs))
                    last[(name, attrs)] = (h, now)
                    if prev is not None:
                        before, start = prev
                        counts = [a - b for a, b in zip(h.counts, before.counts, strict=True)]
                        total, count = h.sum - before.sum, h.count - before.count
                    if count == 0:
                        continue
                exemplars = [
                    Exemplar({}, e.value, e.time_unix_nano, e.span_id, e.trace_id)
                    for e in h.exemplars
                    if e is not None
                ]
                by_name.setdefault(name, []).append(
                    HistogramDataPoint(
                        attributes=dict(attrs),
                        start_time_unix_nano=start,
                        time_unix_nano=now,
                        count=count,
                        sum=total,
                        bucket_counts=list(counts),
                        explicit_bounds=list(h.bounds),
                        min=lo,
                        max=hi,
                        exemplars=exemplars,
                    )
                )
        temporality = AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE
        return [
            Metric(
                name=name,
                description=_SPECS[name].description,
                unit=_SPECS[name].unit,
                data=Histogram(data_points=points, aggregation_temporality=temporality),
            )
            for name, points in by_name.items()
        ]

    def merge(self, reader: Any, data: MetricsData | None) -> MetricsData | None:
        # The reader keys temporality by the SDK's private subclass (_Histogram), not by
        # the public Histogram: look it up by subclass, or delta readers would get cumulative.
        delta = any(
            issubclass(kind, SdkHistogram) and temporality == AggregationTemporality.DELTA
            for kind, temporality in reader._instrument_class_temporality.items()
        )
        extra = self.metrics(id(reader), delta)
        if not extra:
            return data
        if data is None or not data.resource_metrics:
            return MetricsData(
                [ResourceMetrics(self.resource, [ScopeMetrics(self.scope, extra, "")], "")]
            )
        first, *rest = data.resource_metrics
        scopes = list(first.scope_metrics)
        for i, sm in enumerate(scopes):
            if sm.scope.name == c.SCOPE_NAME:
                scopes[i] = ScopeMetrics(sm.scope, list(sm.metrics) + extra, sm.schema_url)
                break
        else:
            scopes.append(ScopeMetrics(self.scope, extra, ""))
        return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


class _Bridged:
    _otel_train_bridge: HistogramBridge

    def _receive_metrics(
        self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any
    ) -> None:
        try:
            metrics_data = self._otel_train_bridge.merge(self, metrics_data)
        except Exception:  # never lose the SDK's own metrics because of ours
            import logging

            logging.getLogger("otel_train").exception("otel-train: histogram bridge failed")
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
