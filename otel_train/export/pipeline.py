"""The export pipeline otel-train builds: bounded, counted, quiet while the collector is down.

- ``SpanBatcher``: a span processor with a bounded queue. When the queue is full the
  new span is dropped and counted (the SDK's batch processor logs a warning per span).
  While its exports fail (the last one did) the bound is ``OUTAGE_QUEUE`` spans: what it
  held past that is dropped and counted too, so a collector that is down or hung costs
  a few spans of memory, not a full queue. It exports from its own thread and never from
  a forked child.
- ``GuardedSpanExporter`` / ``GuardedMetricExporter``: wrap the OTLP exporters; count
  what failed to export, send nothing from a forked child, and once ``abandon()``-ed
  (the shutdown deadline passed) interrupt the exporter's retries and drop quietly.
- ``ExportHealth``: the shared counts, read by the worker into ``otel_train.dropped``,
  and the outage state that keeps the exporters' retry warnings to one per outage.

Usage::

    health = ExportHealth()
    exporter = GuardedSpanExporter(OTLPSpanExporter(), health)
    provider.add_span_processor(SpanBatcher(exporter, health))
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_log = logging.getLogger("otel_train")

# The span queue's bound while its exports fail: a small batch to send when the collector
# answers again, not the 2,048 spans (~7 MiB in the sidecar) of the full queue.
OUTAGE_QUEUE = 64

# The loggers the OTLP exporters (and their HTTP client) write their retry messages to.
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)


class ExportHealth(logging.Filter):
    """Drop counts and outage state shared by the exporters otel-train built.

    Also a logging filter: the records the exporters log from inside our export calls
    (a warning per retry) are suppressed and counted; a failed export is logged once per
    outage, with the first of them since the last success as its cause, and the recovery
    once.
    """

    def __init__(self) -> None:
        super().__init__("otel_train.export")
        self.span_queue_full = 0
        self.spans_failed = 0
        self.metric_points_failed = 0
        self.suppressed = 0
        self.down = False
        self.first_message = ""  # the first exporter message since a success: the cause
        self._local = threading.local()
        self._lock = threading.Lock()

    def outage(self) -> bool:
        """Whether exports are failing now: one failed, or an export under way has logged
        a retry (the first export of an outage can retry for a minute before it fails)."""
        return self.down or bool(self.first_message)

    def counts(self) -> dict[str, int]:
        """Drops by ``otel_train.dropped`` reason."""
        return {
            "export": self.spans_failed,
            "span_queue": self.span_queue_full,
            "metric_export": self.metric_points_failed,
        }

    # -- exporter calls --------------------------------------------------------------

    def failed(self, what: str, n: int) -> None:
        """``n`` spans (``what`` = "span") or metric points ("metric") were not exported."""
        if what == "span":
            self.spans_failed += n
        else:
            self.metric_points_failed += n

    def exporting(self, on: bool) -> None:
        self._local.active = on

    def result(self, ok: bool, what: str) -> None:
        with self._lock:
            if ok:
                if self.down:
                    self.down = False
                    _log.warning(
                        "otel-train: OTLP %s export works again (%d exporter messages were "
                        "suppressed during the outage)",
                        what,
                        self.suppressed,
                    )
                self.suppressed = 0  # retries that ended in success are no news
                self.first_message = ""
            elif not self.down:
                self.down = True
                _log.warning(
                    "otel-train: OTLP %s export failed (%s); training continues, drops are "
                    "counted in otel_train.dropped and exporter messages are suppressed until "
                    "it recovers",
                    what,
                    self.first_message or "no detail from the exporter",
                )

    # -- logging.Filter ----------------------------------------------------------------

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self._local, "active", False):
            self.suppressed += 1
            if not self.first_message:
                try:
                    self.first_message = record.getMessage()[:300]
                except Exception:  # a record whose arguments do not format
                    self.first_message = str(record.msg)[:300]
            return False
        return True

    def attach(self) -> None:
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self)

    def detach(self) -> None:
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self)


class _Guard:
    """What both exporter wrappers share: fork check, abandon, quiet calls."""

    def __init__(self, inner: Any, health: ExportHealth) -> None:
        self.inner = inner
        self.health = health
        self.abandoned = False
        self._pid = os.getpid()
        self._inner_closed = False
        self._close_lock = threading.Lock()

    def _blocked(self) -> bool:
        return self.abandoned or self._pid != os.getpid()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.health.exporting(True)
        try:
            return fn(*args, **kwargs)
        except Exception:
            return None
        finally:
            self.health.exporting(False)

    def _close_inner(self, **kwargs: Any) -> None:
        with self._close_lock:
            if self._inner_closed:
                return
            self._inner_closed = True
        self._call(self.inner.shutdown, **kwargs)

    def abandon(self) -> None:
        """Stop now: interrupt retries in flight; later exports drop without a word."""
        self.abandoned = True
        if self._pid == os.getpid():
            self._close_inner()

    def _export(self, what: str, items: Callable[[], int], call: Callable[[], Any],
                success: Any) -> bool:  # fmt: skip
        """One export through the inner exporter. Its ``items`` count as failed when it
        is blocked after ``abandon()`` or does not return ``success``; an outage and the
        recovery are reported (``ExportHealth.result``) unless abandoned."""
        if self._blocked():
            if self.abandoned:
                self.health.failed(what, items())
            return False
        ok = bool(self._call(call) == success)
        if not ok:
            self.health.failed(what, items())
        if not self.abandoned:
            self.health.result(ok, what)
        return ok


class GuardedSpanExporter(_Guard, SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        ok = self._export("span", lambda: len(spans), lambda: self.inner.export(spans),
                          SpanExportResult.SUCCESS)  # fmt: skip
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        if not self._blocked():
            self._close_inner()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # nothing is buffered here


def _points(data: Any) -> int:
    n = 0
    for rm in getattr(data, "resource_metrics", ()):
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                n += len(getattr(m.data, "data_points", ()))
    return n


class GuardedMetricExporter(_Guard, MetricExporter):
    def __init__(self, inner: MetricExporter, health: ExportHealth) -> None:
        _Guard.__init__(self, inner, health)
        # The periodic reader takes its temporality and aggregation from the exporter.
        MetricExporter.__init__(
            self,
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )

    def export(
        self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        ok = self._export(
            "metric",
            lambda: _points(metrics_data),
            lambda: self.inner.export(metrics_data, timeout_millis=timeout_millis),
            MetricExportResult.SUCCESS,
        )
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if not self._blocked():
            self._close_inner()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        _log.warning("otel-train: ignoring %s=%r (not a positive integer)", name, raw)
        return default
    return value


class SpanBatcher(SpanProcessor):
    """Batches finished spans for export; a full queue drops the new span and counts it.

    Sizes follow the standard ``OTEL_BSP_MAX_QUEUE_SIZE`` (2048),
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (512) and ``OTEL_BSP_SCHEDULE_DELAY`` (5000 ms);
    an exporter that writes ``batch_spans`` at a time (the run record's) gets batches of
    that size: a larger one would only keep more spans alive while it is written.
    While its exports fail (the last one did not succeed) the queue and the batch are at
    most ``OUTAGE_QUEUE`` spans. Its own result, not ``health.outage()``: a collector that
    refuses metrics and takes spans must not cost spans.
    """

    def __init__(self, exporter: SpanExporter, health: ExportHealth) -> None:
        self.exporter = exporter
        self.health = health
        self.max_queue = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        batch = getattr(exporter, "batch_spans", None)
        batch = batch or _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
        self.batch = min(self.max_queue, batch)
        self.delay_s = _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.outage_queue = min(self.max_queue, OUTAGE_QUEUE)
        self.failing = False  # the last export did not succeed
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._stopped = False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="otel-train-spans", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopped or self._pid != os.getpid():
            return  # closed, or a forked child: the parent exports
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled:
            return
        queue = self._queue
        if len(queue) >= self.bound():
            self.health.span_queue_full += 1
            return
        queue.append(span)
        if len(queue) >= self.batch:
            self._wake.set()

    def bound(self) -> int:
        """The queue's bound now: smaller while exports fail."""
        return self.outage_queue if self.failing else self.max_queue

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._export_all()
        self._export_all()

    def _export_all(self) -> None:
        exporter, spans = self.exporter, self._queue
        with self._export_lock:
            while spans:
                bound = self.bound()
                self._trim(bound)
                batch = [spans.popleft() for _ in range(min(self.batch, bound, len(spans)))]
                try:
                    self.failing = exporter.export(batch) != SpanExportResult.SUCCESS
                except Exception:
                    self.health.spans_failed += len(batch)
                    self.failing = True

    def _trim(self, bound: int) -> None:
        """Drop (and count) the newest spans past ``bound``: those queued while the
        export that failed was under way, beyond what an outage keeps."""
        spans = self._queue
        while len(spans) > bound:
            spans.pop()
            self.health.span_queue_full += 1

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._pid != os.getpid():
            return True
        self._export_all()
        return True

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        if self._pid == os.getpid() and self._thread is not threading.current_thread():
            self._thread.join()
        self.exporter.shutdown()
