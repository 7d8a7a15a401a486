"""Test helpers: in-memory providers wired the way otel-train wires its own.

Usage::

    from otel_train.testing import InMemoryTelemetry

    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, tracer_provider=tel.tracer_provider,
                          meter_provider=tel.meter_provider, trace_steps="all")
    ...
    otel_train.shutdown()
    tel.spans()                       # finished spans
    tel.points("otel_train.phase.duration")
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from .export.setup import in_memory_meter_provider


class InMemoryTelemetry:
    """A tracer provider with an in-memory exporter and a meter provider with an in-memory
    reader that carries otel-train's histogram bridge (as its own providers do)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider, self.reader = in_memory_meter_provider()

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, Any]:
        """Metric name -> SDK Metric, from one collection."""
        data = self.reader.get_metrics_data()
        out: dict[str, Any] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = m
        return out

    def points(self, name: str) -> list[Any]:
        metric = self.metrics().get(name)
        return [] if metric is None else list(metric.data.data_points)
