"""The logs signal: where otel-train's log records (the hang events, contract.LOG_EVENTS)
go.

otel-train's own SDK gets a logger provider with an OTLP log exporter when an OTLP
endpoint is configured (``/v1/logs`` beside traces and metrics), behind a bounded batch
processor: a collector that is down costs dropped records, never a wait. An application
that passes its own providers gets its records through the logger provider it passes
(``configure(logger_provider=...)``), else the global one (a no-op until the
application sets one, then that one).

Usage::

    provider = own_logger_provider(settings, resource)   # None: no endpoint
    logger = logger_for(provider, version)                # None: records go nowhere
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import _logs

from ..contract import SCHEMA_URL, SCOPE_NAME
from ..settings import Settings
from .transport import otlp_session

LOG_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
MAX_QUEUE = 256  # log records waiting for export (hang records are few: bounded anyway)


def own_logger_provider(settings: Settings, resource: Any) -> Any | None:
    """otel-train's own logger provider, exporting over OTLP, or None without an endpoint."""
    if settings.otlp_endpoint is None and not any(os.environ.get(n) for n in LOG_ENV):
        return None
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    processor = BatchLogRecordProcessor(
        _exporter(settings),
        max_queue_size=MAX_QUEUE,
        max_export_batch_size=MAX_QUEUE,
        schedule_delay_millis=1000,
    )
    provider.add_log_record_processor(processor)
    return provider


def _exporter(settings: Settings) -> Any:
    base = settings.otlp_endpoint
    if settings.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        return OTLPLogExporter(endpoint=base) if base else OTLPLogExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )

    session = otlp_session("LOGS")
    if base:
        return HttpLogExporter(endpoint=base.rstrip("/") + "/v1/logs", session=session)
    return HttpLogExporter(session=session)


def application_logger_provider(given: Any | None) -> Any:
    """The application's logger provider: the one it passed, else the global one (the
    API's proxy forwards to whatever the application sets later)."""
    return given if given is not None else _logs.get_logger_provider()


def logger_for(provider: Any | None, version: str) -> Any | None:
    if provider is None:
        return None
    return provider.get_logger(SCOPE_NAME, version, schema_url=SCHEMA_URL)
