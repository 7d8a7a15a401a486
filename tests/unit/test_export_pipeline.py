"""The export pipeline's own guarantees, with the SDK's in-memory exporters; the same
paths against the real Collector are in tests/faults."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_train.export.pipeline import (
    EXPORTER_LOGGERS,
    OUTAGE_QUEUE,
    ExportHealth,
    GuardedMetricExporter,
    GuardedSpanExporter,
    SpanBatcher,
)
from otel_train.signals import SigtermFlush


def _batched(exporter: SpanExporter) -> tuple[ExportHealth, SpanBatcher, TracerProvider]:
    """A provider whose spans go through a SpanBatcher to ``exporter``, guarded."""
    health = ExportHealth()
    batcher = SpanBatcher(GuardedSpanExporter(exporter, health), health)
    provider = TracerProvider()
    provider.add_span_processor(batcher)
    return health, batcher, provider


def test_a_full_span_queue_drops_the_new_span_and_counts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # only force_flush exports
    memory = InMemorySpanExporter()
    health, batcher, provider = _batched(memory)
    tracer = provider.get_tracer("t")
    for i in range(10):
        tracer.start_span(f"s{i}").end()
    assert health.counts()["span_queue"] == 6
    batcher.force_flush()
    assert [s.name for s in memory.get_finished_spans()] == ["s0", "s1", "s2", "s3"]
    provider.shutdown()


class _Keeping(InMemorySpanExporter):
    """Writes ``batch_spans`` at a time (as the run record's exporter does); notes sizes."""

    batch_spans = 10

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.sizes.append(len(spans))
        return super().export(spans)


def test_an_exporter_that_writes_a_few_spans_at_a_time_gets_batches_of_that_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(a batch of 512 for it kept 512 spans alive while it wrote 10 of them)"""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    keeping, health = _Keeping(), ExportHealth()
    batcher = SpanBatcher(keeping, health)  # (unguarded, as the run record's)
    provider = TracerProvider()
    provider.add_span_processor(batcher)
    tracer = provider.get_tracer("t")
    for _ in range(95):
        tracer.start_span("s").end()
    batcher.force_flush()
    assert len(keeping.get_finished_spans()) == 95 and max(keeping.sizes) == 10
    assert health.counts()["span_queue"] == 0
    provider.shutdown()


class _Unplugged(InMemorySpanExporter):
    """Keeps what it is sent, except while its collector is down: then every export fails,
    after ``meanwhile()`` (spans that end while an export waits on a hung collector)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.meanwhile = lambda: None

    def export(self, spans: Any) -> SpanExportResult:
        if not self.down:
            return super().export(spans)
        self.meanwhile()
        self.meanwhile = lambda: None
        return SpanExportResult.FAILURE


def test_while_exports_fail_the_span_queue_keeps_a_small_bound_and_counts_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # only force_flush exports
    collector = _Unplugged()
    health, batcher, provider = _batched(collector)
    tracer = provider.get_tracer("t")

    def spans(name: str, n: int) -> None:
        for _ in range(n):
            tracer.start_span(name).end()

    spans("before", 500)  # (under a batch: no export on the batcher's thread)
    collector.down = True
    collector.meanwhile = lambda: spans("meanwhile", 300)
    batcher.force_flush()
    # The first export failed (500); what ended meanwhile is kept up to the outage's
    # bound (and failed too), the rest dropped and counted.
    assert health.counts()["export"] == 500 + OUTAGE_QUEUE
    assert health.counts()["span_queue"] == 300 - OUTAGE_QUEUE
    spans("during", 1000)
    assert health.counts()["span_queue"] == 300 + 1000 - 2 * OUTAGE_QUEUE
    # Back: the full bound again once an export succeeds, and nothing more dropped.
    collector.down = False
    batcher.force_flush()
    dropped = health.counts()["span_queue"]
    spans("after", 1500)
    batcher.force_flush()
    assert health.counts()["span_queue"] == dropped
    names = [s.name for s in collector.get_finished_spans()]
    assert names.count("during") == OUTAGE_QUEUE and names.count("after") == 1500
    provider.shutdown()


class _Refusing(SpanExporter):
    """An exporter whose collector is gone: every export fails, logging as OTLP's does."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.calls += 1
        logging.getLogger(EXPORTER_LOGGERS[0]).warning("Transient error, retrying")
        return SpanExportResult.FAILURE


def test_failed_exports_are_counted_and_logged_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = ExportHealth()
    health.attach()
    try:
        inner = _Refusing()
        exporter = GuardedSpanExporter(inner, health)
        provider = TracerProvider()
        tracer = provider.get_tracer("t")
        spans = []
        for _ in range(3):
            span = tracer.start_span("s")
            span.end()
            spans.append(span)
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                assert exporter.export(spans) == SpanExportResult.FAILURE
        assert health.counts()["export"] == 15
        retries = [r for r in caplog.records if r.name == EXPORTER_LOGGERS[0]]
        notices = [r for r in caplog.records if "export failed" in r.getMessage()]
        assert len(retries) == 0 and len(notices) == 1
        assert "Transient error, retrying" in notices[0].getMessage()  # the cause, once
        assert health.suppressed == 5
        # Abandoned (the shutdown deadline passed): no more calls, still counted.
        exporter.abandon()
        assert exporter.export(spans) == SpanExportResult.FAILURE
        assert inner.calls == 5
        assert health.counts()["export"] == 18
    finally:
        health.detach()


def test_an_abandoned_metric_exporter_counts_points_and_sends_nothing() -> None:
    sent: list[Any] = []

    class Keeping(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any) -> Any:
            sent.append(metrics_data)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
            return None

    health = ExportHealth()
    exporter = GuardedMetricExporter(Keeping(), health)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=600_000)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    counter = provider.get_meter("m").create_counter("c")
    counter.add(1, {"k": "a"})
    counter.add(1, {"k": "b"})
    reader.collect()
    assert len(sent) == 1
    exporter.abandon()
    reader.collect()
    assert len(sent) == 1
    assert health.counts()["metric_export"] == 2
    provider.shutdown()


def test_sigterm_chains_to_the_handler_that_was_there() -> None:
    seen: list[int] = []
    flushed: list[bool] = []

    def users(signum: int, frame: Any) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, users)
    try:
        guard = SigtermFlush(lambda: flushed.append(True))
        assert guard.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
        assert flushed == []  # the user's handler decides; sys.exit() there flushes at exit
        guard.uninstall()
        assert signal.getsignal(signal.SIGTERM) is users
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_ignored_sigterm_stays_ignored() -> None:
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        assert not SigtermFlush(lambda: None).install()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
