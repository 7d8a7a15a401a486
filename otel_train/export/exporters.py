"""The OTLP exporters otel-train's own SDK sends through (http/protobuf or gRPC), and the
histogram form they carry. Built where ``setup.py`` builds the providers: in the sidecar
normally, so ``check_exporters`` raises in the training process, at configure time, what
building them would raise there."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation
from opentelemetry.sdk.trace.export import SpanExporter

from ..contract import DURATION_MAX_SCALE, DURATION_MAX_SIZE
from ..settings import ConfigError, Settings
from .transport import otlp_session

TRACE_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
METRIC_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
HISTOGRAM_AGGREGATION_ENV = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"


def exports_traces(settings: Settings) -> bool:
    """Whether otel-train's own SDK exports spans over OTLP (an endpoint is configured)."""
    return otlp_wanted(settings, TRACE_ENV)


def check_exporters(settings: Settings) -> None:
    """Raise the ConfigError that building the exporters would raise (the sidecar builds
    them in its own process: a bad setting must still fail at configure time)."""
    if settings.otlp_protocol == "grpc" and (
        otlp_wanted(settings, TRACE_ENV) or otlp_wanted(settings, METRIC_ENV)
    ):
        _import_grpc()


def otlp_wanted(settings: Settings, env_names: tuple[str, ...]) -> bool:
    return settings.otlp_endpoint is not None or any(os.environ.get(n) for n in env_names)


def span_exporter(settings: Settings) -> SpanExporter:
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


def metric_exporter(settings: Settings) -> Any:
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
