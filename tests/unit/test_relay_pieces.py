"""The relay's end in the training process hands the application's SDK one small piece at
a time (handover/relay_in.py): a span's start or end, a frame, the metrics only when read."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_train
from otel_train import contract as c
from otel_train.handover import relay_in, wire
from otel_train.processing.aggregate import MetricsAggregator
from otel_train.processing.resolved import finished_step
from otel_train.processing.spans import SpanEmitter, finish
from otel_train.sidecar import relay

MS = 1_000_000


class Started(SpanProcessor):
    """A span processor that counts span starts (the exporter below sees the ends)."""

    def __init__(self) -> None:
        self.started = 0

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started += 1


def _step(index: int, phases: int = 4) -> Any:
    step = finished_step(index, 0, phases * MS)
    step.phases = [
        (seq, -1, f"phase{seq}", seq * MS, (seq + 1) * MS, None, None, None, None, 0.001)
        for seq in range(phases)
    ]
    step.sampled_because = "test"
    return step


def _sdk() -> tuple[TracerProvider, InMemorySpanExporter, Started]:
    spans = InMemorySpanExporter()
    started = Started()
    provider = TracerProvider()
    provider.add_span_processor(started)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider, spans, started


def test_a_steps_trace_goes_one_span_start_or_end_a_piece() -> None:
    provider, spans, started = _sdk()
    emitter = SpanEmitter(provider.get_tracer("t"), 0, 0)
    pieces = emitter.pieces(_step(7))
    changes = []
    before = (0, 0)
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            result = done.value
        else:
            result = None
        now = (started.started, len(spans.get_finished_spans()))
        changes.append((now[0] - before[0], now[1] - before[1]))
        before = now
        if result is not None:
            break
    # A root and four phases: five starts, five ends, each a piece of its own.
    assert sorted(changes) == [(0, 1)] * 5 + [(1, 0)] * 5
    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.name == c.STEP_SPAN.name]
    assert result == (root.context.trace_id, root.context.span_id)
    assert all(s.parent.span_id == root.context.span_id for s in finished if s is not root)
    # The same trace in one go (what the worker does) has the same spans.
    emitter.emit(_step(8))
    assert len(spans.get_finished_spans()) == 10
    assert finish(emitter.pieces(_step(9))) is not None


def test_the_mirror_unpickles_the_metrics_only_when_the_meter_reads_them() -> None:
    agg = MetricsAggregator()
    agg.add(c.STEPS.name, (), 3.0)
    agg.histogram(c.STEP_DURATION.name, ()).observe(0.25)
    sent: list[tuple[Any, ...]] = []
    out = relay.RelayOut(os.pipe()[1])
    out.send = lambda message: sent.append(message) is None  # type: ignore[method-assign]
    relay.send_metrics(out, agg)
    relay.send_metrics(out, agg)  # unchanged: not sent again
    assert len(sent) == 1
    mirror = relay_in.RelayMirror()
    mirror.offer(sent[0][1])
    assert mirror.values == {} and mirror.histograms == {}  # (nothing taken apart yet)
    assert mirror.read(c.STEPS.name) == [((), 3.0)]
    ((name, _, h),) = mirror.snapshot_histograms()
    assert (name, h.count, h.sum) == (c.STEP_DURATION.name, 1, 0.25)
    mirror.dropped_spans = 5
    assert mirror.read(c.DROPPED.name) == [(((c.A_REASON, "span_queue"),), 5.0)]


def _pipe_with(messages: list[tuple[Any, ...]]) -> int:
    r, w = os.pipe()
    frames = wire.FrameWriter()
    os.write(w, b"".join(frames.frame(m) for m in messages))
    os.close(w)
    return r


def test_the_relays_thread_hands_spans_over_without_a_flush() -> None:
    provider, spans, _ = _sdk()
    fd = _pipe_with([(wire.STEPS, [_step(i)]) for i in range(3)])
    rin = relay_in.RelayIn(fd, (provider, None, None), 0, 0, "test")
    deadline = time.monotonic() + 10
    while len(spans.get_finished_spans()) < 15 and time.monotonic() < deadline:
        time.sleep(0.01)
    rin.stop()
    assert len(spans.get_finished_spans()) == 15
    assert rin.dropped == 0


def test_steps_past_the_waiting_bound_are_dropped_and_counted() -> None:
    provider, spans, _ = _sdk()
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    n = relay_in.MAX_WAITING + 3
    fd = _pipe_with([(wire.STEPS, [_step(i) for i in range(n)])])
    rin = relay_in.RelayIn(fd, (provider, meters, None), 0, 0, "test")
    rin.stop()  # (its thread may have taken a piece or two: drain takes the rest here)
    rin.drain(time.monotonic() + 30)
    kept = len([s for s in spans.get_finished_spans() if s.name == c.STEP_SPAN.name])
    assert kept == relay_in.MAX_WAITING
    assert rin.dropped == 3 * 5
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == c.DROPPED.name for p in m.data.data_points]  # fmt: skip
    assert [(p.attributes[c.A_REASON], p.value) for p in points] == [("span_queue", 15)]


class Raising(SpanProcessor):
    """An application's span processor that raises."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("the application's processor failed")


def test_what_the_applications_sdk_raises_is_logged_once_and_never_reaches_training(
    caplog: Any,
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(Raising())
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otel_train.configure(console="off", trace_steps="all", tracer_provider=provider,
                         meter_provider=meters)  # fmt: skip
    feeder = otel_train.session.current().feeder
    assert feeder is not None and feeder.relay is not None
    with caplog.at_level(logging.ERROR, logger="otel_train"):
        for _ in range(3):
            with otel_train.step(), otel_train.phase("work"):
                pass
        assert otel_train.flush(timeout=15) is False
        with otel_train.step(), otel_train.phase("work"):
            pass
        otel_train.flush(timeout=15)
        otel_train.shutdown()
    failures = [r for r in caplog.records if "handing telemetry to the providers" in r.message]
    assert len(failures) == 1


def test_a_failed_relay_closes_its_pipe_so_the_sidecar_stops_writing() -> None:
    """After the application's SDK failed nothing reads the pipe: its end is closed, so
    the sidecar's writes fail at once (EPIPE: it drops and counts them) rather than
    filling the pipe and waiting on it until a flush's deadline."""
    provider = TracerProvider()
    provider.add_span_processor(Raising())
    r, w = os.pipe()
    os.write(w, wire.FrameWriter().frame((wire.STEPS, [_step(0)])))
    rin = relay_in.RelayIn(r, (provider, None, None), 0, 0, "test")
    out = relay.RelayOut(w)
    deadline = time.monotonic() + 10
    while not out.gone and time.monotonic() < deadline:
        out.send((wire.STEPS, [_step(1)]))
        time.sleep(0.01)
    assert rin.failed and out.gone
    assert not out.send((wire.STEPS, [_step(2)]))


def test_closing_the_relay_closes_its_pipe() -> None:
    r, w = os.pipe()
    rin = relay_in.RelayIn(r, (None, None, None), 0, 0, "test")
    rin.close()
    with pytest.raises(OSError):
        os.fstat(r)
    with pytest.raises(BrokenPipeError):
        os.write(w, b"x")
    os.close(w)
