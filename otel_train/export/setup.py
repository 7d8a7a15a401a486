"""SDK setup: the only module that builds providers; with its siblings ``exporters.py``
(the OTLP exporters) and ``endpoint.py`` (/metrics), the only place that builds exporters.

Decision order (first match wins):

1. Providers passed to ``instrument()``/``configure()``: used as they are.
2. SDK providers the application installed globally: used as they are.
3. Otherwise otel-train builds its own (not installed globally): a ``TracerProvider``
   with a batch processor and OTLP exporter when an endpoint is configured, and a
   ``MeterProvider`` with the Prometheus reader behind ``/metrics`` (unless
   ``prometheus=False``) plus a periodic OTLP reader when an endpoint is configured.
   Its spans and metrics also go to the run record (record.py) unless ``run_dir='off'``.

Histogram forms: the OTLP reader gets the duration histograms as base-2 exponential
histograms (Prometheus's OTLP receiver stores each as one native-histogram series);
``/metrics`` serves classic explicit buckets (``_bucket``/``_sum``/``_count``), the one
histogram form of the Prometheus text format that prometheus_client writes and that any
Prometheus scrapes without native-histogram settings (see
``exporters.otlp_histogram_aggregation``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from ..settings import Settings
from .bridge import (
    BRIDGE_WORKS,
    BridgedInMemoryReader,
    BridgedPeriodicReader,
    BridgedPrometheusReader,
    HistogramBridge,
)
from .endpoint import address, bind_metrics_socket, serve_metrics
from .exporters import (
    METRIC_ENV,
    TRACE_ENV,
    metric_exporter,
    otlp_histogram_aggregation,
    otlp_wanted,
    span_exporter,
)
from .logs import application_logger_provider, own_logger_provider
from .pipeline import ExportHealth, GuardedMetricExporter, GuardedSpanExporter, SpanBatcher
from .record import (
    RECORD_INTERVAL_S,
    RecordFile,
    RecordMetricExporter,
    RecordPlan,
    RecordSpanExporter,
    record_files,
)
from .resource import build_resource, metrics_port

_log = logging.getLogger("otel_train")

# Meter providers whose readers carry our histogram bridge.
_BRIDGES: WeakKeyDictionary[Any, HistogramBridge] = WeakKeyDictionary()

OUTAGE_SHUTDOWN_S = 1.0  # shutdown's flush budget while an export outage is known


@dataclass
class Telemetry:
    tracer_provider: Any | None
    meter_provider: Any | None
    bridge: HistogramBridge | None
    owned: bool = False
    health: ExportHealth | None = None
    exporters: list[GuardedSpanExporter | GuardedMetricExporter] = field(default_factory=list)
    prometheus_server: Any | None = None
    prometheus_address: tuple[str, int] | None = None
    record: RecordPlan | None = None  # where the run record goes, if it is written
    record_files: list[RecordFile] = field(default_factory=list)
    record_health: ExportHealth | None = None  # its span queue's drops
    logger_provider: Any | None = None  # where log records (hang events) go (logs.py)
    _closers: list[Any] = field(default_factory=list)

    def drop_counts(self) -> dict[str, int]:
        """What the exporters and the run record dropped so far, by reason."""
        counts = self.health.counts() if self.health is not None else {}
        if self.record is not None:
            queue = self.record_health.span_queue_full if self.record_health else 0
            counts["run_record"] = queue + sum(f.dropped for f in self.record_files)
        return counts

    def flush(self, deadline: float) -> bool:
        """Its providers' own flush by ``deadline`` (monotonic seconds); True if done."""
        return flush_providers(
            (self.tracer_provider, self.meter_provider, self.logger_provider), deadline
        )

    def shutdown(self, timeout_s: float) -> bool:
        """Flush and close what otel-train built, within ``timeout_s``; True if in time."""
        if self.prometheus_server is not None:
            server, self.prometheus_server = self.prometheus_server, None
            server.shutdown()
            server.server_close()
        if not self.owned:
            return True
        if self.health is not None and self.health.outage():
            # Exports are failing now: a flush would spend the whole budget on retries
            # that fail too. Try for at most OUTAGE_SHUTDOWN_S, drop (and count) the rest.
            timeout_s = min(timeout_s, OUTAGE_SHUTDOWN_S)
        done = threading.Event()

        def close() -> None:
            deadline = time.monotonic() + timeout_s
            for provider in (self.logger_provider, self.meter_provider, self.tracer_provider):
                if provider is None:
                    continue
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                try:
                    if isinstance(provider, MeterProvider):
                        provider.shutdown(timeout_millis=left_ms)
                    else:
                        provider.shutdown()
                except Exception:
                    _log.warning("otel-train: shutting down %s failed", type(provider).__name__)
            done.set()

        # The SDK's flush can outlive its timeout (collector down, retries): run it on a
        # daemon thread; at the deadline interrupt the exporters' retries, so nothing
        # keeps sending or logging once shutdown() has returned.
        threading.Thread(target=close, name="otel-train-shutdown", daemon=True).start()
        margin = min(0.25, timeout_s / 4)  # kept to stop the exporters within the deadline
        in_time = done.wait(timeout_s - margin)
        if not in_time:
            for exporter in self.exporters:
                exporter.abandon()
            done.wait(margin)  # the close thread now finishes at once
        if in_time and self.health is not None:
            self.health.detach()  # else it keeps the abandoned exporters' last words quiet
        return in_time


def flush_providers(providers: Iterable[Any], deadline: float) -> bool:
    """Each provider's ``force_flush`` within what is left of ``deadline`` (monotonic
    seconds); True if every one said done. One that raises counts as not done: the SDK's
    meter provider raises when a reader timed out (the collector down), and a flush must
    not raise into the caller's loop or kill the thread it runs on."""
    ok = True
    for provider in providers:
        force = getattr(provider, "force_flush", None)
        if force is None:
            continue
        left_ms = int((deadline - time.monotonic()) * 1000)
        try:
            ok = left_ms > 0 and force(left_ms) is not False and ok
        except Exception:
            _log.debug("otel-train: flushing %s failed", type(provider).__name__, exc_info=True)
            ok = False
    return ok


def _is_sdk_tracer_provider(tp: Any) -> bool:
    return not isinstance(tp, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _is_sdk_meter_provider(mp: Any) -> bool:
    return not isinstance(mp, metrics.NoOpMeterProvider) and "Proxy" not in type(mp).__name__


def _bridge_of(meter_provider: Any) -> HistogramBridge | None:
    """The bridge on the readers of one of otel-train's meter providers; None for another
    provider, or where the SDK lacks what the bridge needs (histograms then go through the
    metrics API: bridge.BRIDGE_WORKS)."""
    return _BRIDGES.get(meter_provider) if meter_provider and BRIDGE_WORKS else None


def build_telemetry(
    settings: Settings,
    tracer_provider: Any | None = None,
    meter_provider: Any | None = None,
    version: str = "",
    record: RecordPlan | None = None,
    logger_provider: Any | None = None,
) -> Telemetry:
    """``record``: where otel-train's own SDK writes the run record (rule 3 only);
    ``logger_provider``: the application's, for log records (else the global one)."""
    logs = application_logger_provider(logger_provider)
    if tracer_provider is not None or meter_provider is not None:
        return Telemetry(
            tracer_provider,
            meter_provider,
            _bridge_of(meter_provider),
            logger_provider=logs,
        )
    gtp, gmp = trace.get_tracer_provider(), metrics.get_meter_provider()
    if _is_sdk_tracer_provider(gtp) or _is_sdk_meter_provider(gmp):
        return Telemetry(
            gtp if _is_sdk_tracer_provider(gtp) else None,
            gmp if _is_sdk_meter_provider(gmp) else None,
            _bridge_of(gmp),
            logger_provider=logs,
        )
    return build_own(settings, version, record=record)


def relayed_providers(
    tracer_provider: Any | None, meter_provider: Any | None
) -> tuple[Any, Any] | None:
    """The application's providers when the sidecar can serve them (sidecar/relay.py): an
    SDK meter provider (given, else the global one) and an SDK tracer provider or none;
    else None. Not with the histogram bridge off (``BRIDGE_WORKS``): the relay hands the
    histograms to the readers through it, where the thread records them through the API."""
    if tracer_provider is None and meter_provider is None:
        gtp, gmp = trace.get_tracer_provider(), metrics.get_meter_provider()
        tracer_provider = gtp if _is_sdk_tracer_provider(gtp) else None
        meter_provider = gmp if _is_sdk_meter_provider(gmp) else None
    if not isinstance(meter_provider, MeterProvider) or not BRIDGE_WORKS:
        return None
    if tracer_provider is not None and not isinstance(tracer_provider, TracerProvider):
        return None
    return tracer_provider, meter_provider


def builds_own(tracer_provider: Any | None, meter_provider: Any | None) -> bool:
    """Whether :func:`build_telemetry` would build otel-train's own SDK (rule 3)."""
    if tracer_provider is not None or meter_provider is not None:
        return False
    gtp, gmp = trace.get_tracer_provider(), metrics.get_meter_provider()
    return not (_is_sdk_tracer_provider(gtp) or _is_sdk_meter_provider(gmp))


def build_own(
    settings: Settings,
    version: str,
    metrics_socket: socket.socket | None = None,
    record: RecordPlan | None = None,
    consumer: str = "thread",
) -> Telemetry:
    """Rule 3: otel-train's own providers (``metrics_socket``: /metrics already bound;
    ``consumer``: where they run, "thread" or "sidecar", a resource attribute)."""
    resource = build_resource(settings, consumer, version)
    bridge = HistogramBridge(resource, version)
    readers: list[Any] = []
    processors: list[SpanBatcher] = []
    t = Telemetry(None, None, None, owned=True, record=record)
    serve = _prometheus_reader(settings, bridge, metrics_socket, readers)
    _otlp_parts(t, settings, bridge, readers, processors)
    if record is not None:
        _record_parts(t, record, settings, bridge, readers, processors)
    if readers:
        t.meter_provider = MeterProvider(
            metric_readers=readers, resource=resource, shutdown_on_exit=False
        )
        _BRIDGES[t.meter_provider] = bridge
        t.bridge = _bridge_of(t.meter_provider)
    if serve is not None:  # (only now: its reader is registered on the provider)
        t.prometheus_server = serve_metrics(*serve)
        t.prometheus_address = address(serve[1])
    if processors:
        t.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in processors:
            t.tracer_provider.add_span_processor(processor)
    t.logger_provider = own_logger_provider(settings, resource)
    return t


def _prometheus_reader(
    settings: Settings,
    bridge: HistogramBridge,
    metrics_socket: socket.socket | None,
    readers: list[Any],
) -> tuple[Any, socket.socket] | None:
    """The /metrics reader, into ``readers``; the registry and socket to serve once the
    meter provider holds it (endpoint.serve_metrics), or None without /metrics."""
    from prometheus_client import CollectorRegistry

    port = metrics_port(settings) if settings.prometheus else None
    if metrics_socket is None and port is not None:
        metrics_socket = bind_metrics_socket(
            settings.prometheus_host, port, settings.prometheus_ranks
        )
    if metrics_socket is None:
        return None
    registry = CollectorRegistry(auto_describe=True)
    readers.append(BridgedPrometheusReader(bridge, registry=registry))
    return registry, metrics_socket


def _otlp_parts(
    t: Telemetry,
    settings: Settings,
    bridge: HistogramBridge,
    readers: list[Any],
    processors: list[SpanBatcher],
) -> None:
    """The OTLP exporters an endpoint asks for, guarded and counted by one health."""
    health = ExportHealth()
    if otlp_wanted(settings, METRIC_ENV):
        metrics_out = GuardedMetricExporter(metric_exporter(settings), health)
        t.exporters.append(metrics_out)
        interval_ms = settings.metric_export_interval * 1000
        readers.append(
            BridgedPeriodicReader(bridge, metrics_out, export_interval_millis=interval_ms)
        )
    if otlp_wanted(settings, TRACE_ENV):
        spans_out = GuardedSpanExporter(span_exporter(settings), health)
        t.exporters.append(spans_out)
        processors.append(SpanBatcher(spans_out, health))
    if t.exporters:
        health.attach()
        t.health = health


def _record_parts(
    t: Telemetry,
    record: RecordPlan,
    settings: Settings,
    bridge: HistogramBridge,
    readers: list[Any],
    processors: list[SpanBatcher],
) -> None:
    """The run record's span processor and metric reader (record.py)."""
    traces, metrics_file = record_files(record)
    t.record_files = [traces, metrics_file]
    t.record_health = ExportHealth()  # (never attached: its counts only)
    interval_ms = min(settings.metric_export_interval, RECORD_INTERVAL_S) * 1000
    readers.append(
        BridgedPeriodicReader(
            bridge,
            RecordMetricExporter(metrics_file, otlp_histogram_aggregation()),
            export_interval_millis=interval_ms,
        )
    )
    processors.append(SpanBatcher(RecordSpanExporter(traces), t.record_health))


def in_memory_meter_provider(
    resource: Any = None, version: str = "", otlp_histograms: bool = False
) -> tuple[Any, Any]:
    """A meter provider with a bridged in-memory reader (for tests and ``otel_train.testing``):
    explicit-bucket histograms, or with ``otlp_histograms`` the form the OTLP reader sends."""
    from opentelemetry.sdk.resources import Resource

    resource = resource or Resource.create({"service.name": "otel-train-test"})
    bridge = HistogramBridge(resource, version)
    aggregation = otlp_histogram_aggregation() if otlp_histograms else None
    reader = BridgedInMemoryReader(bridge, preferred_aggregation=aggregation)
    provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    _BRIDGES[provider] = bridge
    return provider, reader
