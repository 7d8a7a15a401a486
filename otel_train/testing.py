"""Test helpers: in-memory providers wired the way otel-train wires its own.

Usage::

    from otel_train.testing import InMemoryTelemetry

    tel = InMemoryTelemetry()
    otel_train.instrument(model, optimizer=opt, tracer_provider=tel.tracer_provider,
                          meter_provider=tel.meter_provider, trace_steps="all")
    ...
    tel.spans()                       # finished spans (every finished step: flushed)
    tel.points("otel_train.phase.duration")
    otel_train.shutdown()

    # at the end of each test (a pytest fixture):
    otel_train.testing.reset()        # shutdown(), and the next test's bare calls start anew
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from . import session
from .export.setup import in_memory_meter_provider


def reset() -> None:
    """``otel_train.shutdown()``, then forget it, so that the next bare ``step()``,
    ``phase()``, ``record()`` or ``region()`` starts a session again (after a plain
    shutdown they record nothing): for the end of each test."""
    session.reset()


class InMemoryTelemetry:
    """A tracer provider with an in-memory exporter and a meter provider with an in-memory
    reader that carries otel-train's histogram bridge (as its own providers do).

    A session given these is served from the sidecar through its relay, as one given an
    application's own SDK providers is (docs/rationale.md, "Where the work runs"): what a
    test reads here arrives by ``flush()``. A test that reads the in-process consumer
    (``session.worker``, ``session.efficiency``'s figures) asks for it with
    ``sidecar="off"``."""

    def __init__(self, otlp_histograms: bool = False) -> None:
        """``otlp_histograms``: the duration histograms in the form otel-train's OTLP reader
        exports them (base-2 exponential buckets) instead of explicit buckets."""
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider, self.reader = in_memory_meter_provider(otlp_histograms=otlp_histograms)

    def flush(self, timeout: float = 5.0) -> bool:
        """``otel_train.flush()`` when the live session records into these providers:
        every finished step's spans and metrics are here afterwards."""
        current = session.current()
        if current is None or current.closed:
            return True
        if self.tracer_provider not in current.given_providers and (
            self.meter_provider not in current.given_providers
        ):
            return True
        return current.flush(timeout)

    def spans(self) -> list[Any]:
        """Finished spans, every step finished so far included (flushed first)."""
        self.flush()
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, Any]:
        """Metric name -> SDK Metric, from one collection (flushed first)."""
        self.flush()
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
