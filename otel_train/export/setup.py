"""SDK and exporter setup: the only module that builds providers, exporters and /metrics.

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
Prometheus scrapes without native-histogram settings (see ``otlp_histogram_aggregation``).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from ..contract import DURATION_MAX_SCALE, DURATION_MAX_SIZE
from ..settings import ConfigError, Settings
from .bridge import (
    BridgedInMemoryReader,
    BridgedPeriodicReader,
    BridgedPrometheusReader,
    HistogramBridge,
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
from .transport import otlp_session

_log = logging.getLogger("otel_train")

# Meter providers whose readers carry our histogram bridge.
_BRIDGES: WeakKeyDictionary[Any, HistogramBridge] = WeakKeyDictionary()

OUTAGE_SHUTDOWN_S = 1.0  # shutdown's flush budget while an export outage is known
_TRACE_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_METRIC_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
HISTOGRAM_AGGREGATION_ENV = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"


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
            _BRIDGES.get(meter_provider) if meter_provider else None,
            logger_provider=logs,
        )
    gtp, gmp = trace.get_tracer_provider(), metrics.get_meter_provider()
    if _is_sdk_tracer_provider(gtp) or _is_sdk_meter_provider(gmp):
        return Telemetry(
            gtp if _is_sdk_tracer_provider(gtp) else None,
            gmp if _is_sdk_meter_provider(gmp) else None,
            _BRIDGES.get(gmp),
            logger_provider=logs,
        )
    return build_own(settings, version, record=record)


def relayed_providers(
    tracer_provider: Any | None, meter_provider: Any | None
) -> tuple[Any, Any] | None:
    """The application's providers when the sidecar can serve them (sidecar/relay.py): an
    SDK meter provider (given, else the global one) whose readers do not carry otel-train's
    bridge already (otel-train's own and its testing helpers' do: those get the worker
    here), and an SDK tracer provider or none; else None."""
    if tracer_provider is None and meter_provider is None:
        gtp, gmp = trace.get_tracer_provider(), metrics.get_meter_provider()
        tracer_provider = gtp if _is_sdk_tracer_provider(gtp) else None
        meter_provider = gmp if _is_sdk_meter_provider(gmp) else None
    if not isinstance(meter_provider, MeterProvider) or meter_provider in _BRIDGES:
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


def exports_traces(settings: Settings) -> bool:
    """Whether otel-train's own SDK exports spans over OTLP (an endpoint is configured)."""
    return _otlp_wanted(settings, _TRACE_ENV)


def check_exporters(settings: Settings) -> None:
    """Raise the ConfigError that building the exporters would raise (the sidecar builds
    them in its own process: a bad setting must still fail at configure time)."""
    if settings.otlp_protocol == "grpc" and (
        _otlp_wanted(settings, _TRACE_ENV) or _otlp_wanted(settings, _METRIC_ENV)
    ):
        _import_grpc()


def _otlp_wanted(settings: Settings, env_names: tuple[str, ...]) -> bool:
    return settings.otlp_endpoint is not None or any(os.environ.get(n) for n in env_names)


def _span_exporter(settings: Settings) -> SpanExporter:
    base = settings.otlp_endpoint
    if settings.otlp_protocol == "grpc":
        mod = _import_grpc()
        return (  # type: ignore[no-any-return]
            mod.trace_exporter.OTLPSpanExporter(endpoint=base)
            if base
            else mod.trace_exporter.OTLPSpanExporter()
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    session = otlp_session("TRACES")
    if base:
        return OTLPSpanExporter(endpoint=base.rstrip("/") + "/v1/traces", session=session)
    return OTLPSpanExporter(session=session)


def otlp_histogram_aggregation() -> dict[type, Any]:
    """The OTLP reader's histogram aggregation: base-2 exponential buckets (Prometheus
    stores them as native histograms, one series each), at the scale the aggregator keeps
    (``processing/exponential.py``). Only when the standard
    ``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` is set does the SDK's
    reading of it decide instead (``explicit_bucket_histogram``: classic buckets)."""
    if os.environ.get(HISTOGRAM_AGGREGATION_ENV):
        return {}
    return {
        SdkHistogram: ExponentialBucketHistogramAggregation(
            max_size=DURATION_MAX_SIZE, max_scale=DURATION_MAX_SCALE
        )
    }


def _metric_exporter(settings: Settings) -> Any:
    base = settings.otlp_endpoint
    kw: dict[str, Any] = {"preferred_aggregation": otlp_histogram_aggregation()}
    if settings.otlp_protocol == "grpc":
        mod = _import_grpc()
        if base:
            kw["endpoint"] = base
        return mod.metric_exporter.OTLPMetricExporter(**kw)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    if base:
        kw["endpoint"] = base.rstrip("/") + "/v1/metrics"
    return OTLPMetricExporter(session=otlp_session("METRICS"), **kw)


def _import_grpc() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto import grpc
        from opentelemetry.exporter.otlp.proto.grpc import metric_exporter, trace_exporter  # noqa: F401
    except ImportError:
        raise ConfigError(
            "otel_train setting 'otlp_protocol' is 'grpc' but the gRPC exporter is not "
            "installed: pip install 'otel-train[grpc]' (accepted values: 'http/protobuf', 'grpc')"
        ) from None
    return grpc


def start_prometheus_server(
    registry: Any, host: str, port: int, policy: str = "offset"
) -> tuple[Any, tuple[str, int]]:
    sock = bind_metrics_socket(host, port, policy)
    return serve_metrics(registry, sock), _address(sock)


def bind_metrics_socket(host: str, port: int, policy: str = "offset") -> socket.socket:
    """The listening socket of /metrics (bound where the settings are checked, so that a
    taken port is a ConfigError at configure time even when the sidecar serves it)."""
    if port > 65535:
        raise ConfigError(
            f"otel_train setting 'prometheus_port': base port plus LOCAL_RANK is {port}, past "
            "65535; choose a lower prometheus_port or prometheus_ranks='first' "
            "(accepted: 'offset', 'first', 'all')"
        )
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(16)
        except BaseException:
            sock.close()
            raise
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"otel_train setting 'prometheus_port': port {port} on {host} is already in "
                f"use (prometheus_ranks={policy!r}); choose another with prometheus_port= or "
                "OTEL_TRAIN_PROMETHEUS_PORT (0 picks a free port), set prometheus_ranks to "
                "'offset' (port + LOCAL_RANK) or 'first' (local rank 0 only) when several "
                "ranks share a node, or turn /metrics off with prometheus=False"
            ) from None
        raise ConfigError(
            f"otel_train setting 'prometheus_host': cannot serve /metrics on {host}:{port}: {err}"
        ) from None
    return sock


def _address(sock: socket.socket) -> tuple[str, int]:
    bound = sock.getsockname()
    return str(bound[0]), int(bound[1])


def serve_metrics(registry: Any, sock: socket.socket) -> Any:
    """Serve ``registry`` on an already listening socket, from a daemon thread."""
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler, make_wsgi_app

    class Server(ThreadingWSGIServer):
        address_family = sock.family

    server = Server(sock.getsockname()[:2], _SilentHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    host, port = _address(sock)
    server.server_name, server.server_port = host, port
    server.setup_environ()
    server.set_app(make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, name="otel-train-metrics", daemon=True).start()
    return server


def build_own(
    settings: Settings,
    version: str,
    metrics_socket: socket.socket | None = None,
    record: RecordPlan | None = None,
) -> Telemetry:
    """Rule 3: otel-train's own providers (``metrics_socket``: /metrics already bound)."""
    resource = build_resource(settings)
    bridge = HistogramBridge(resource, version)
    readers: list[Any] = []
    processors: list[SpanBatcher] = []
    t = Telemetry(None, None, None, owned=True, record=record)
    _serve_prometheus(t, settings, bridge, metrics_socket, readers)
    _otlp_parts(t, settings, bridge, readers, processors)
    if record is not None:
        _record_parts(t, record, settings, bridge, readers, processors)
    if readers:
        t.meter_provider = MeterProvider(
            metric_readers=readers, resource=resource, shutdown_on_exit=False
        )
        _BRIDGES[t.meter_provider] = bridge
        t.bridge = bridge
    if processors:
        t.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in processors:
            t.tracer_provider.add_span_processor(processor)
    t.logger_provider = own_logger_provider(settings, resource)
    return t


def _serve_prometheus(
    t: Telemetry,
    settings: Settings,
    bridge: HistogramBridge,
    metrics_socket: socket.socket | None,
    readers: list[Any],
) -> None:
    from prometheus_client import CollectorRegistry

    port = metrics_port(settings) if settings.prometheus else None
    if metrics_socket is None and port is not None:
        metrics_socket = bind_metrics_socket(
            settings.prometheus_host, port, settings.prometheus_ranks
        )
    if metrics_socket is not None:
        registry = CollectorRegistry(auto_describe=True)
        readers.append(BridgedPrometheusReader(bridge, registry=registry))
        t.prometheus_server = serve_metrics(registry, metrics_socket)
        t.prometheus_address = _address(metrics_socket)


def _otlp_parts(
    t: Telemetry,
    settings: Settings,
    bridge: HistogramBridge,
    readers: list[Any],
    processors: list[SpanBatcher],
) -> None:
    """The OTLP exporters an endpoint asks for, guarded and counted by one health."""
    health = ExportHealth()
    if _otlp_wanted(settings, _METRIC_ENV):
        metric_exporter = GuardedMetricExporter(_metric_exporter(settings), health)
        t.exporters.append(metric_exporter)
        interval_ms = settings.metric_export_interval * 1000
        readers.append(
            BridgedPeriodicReader(bridge, metric_exporter, export_interval_millis=interval_ms)
        )
    if _otlp_wanted(settings, _TRACE_ENV):
        span_exporter = GuardedSpanExporter(_span_exporter(settings), health)
        t.exporters.append(span_exporter)
        processors.append(SpanBatcher(span_exporter, health))
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
