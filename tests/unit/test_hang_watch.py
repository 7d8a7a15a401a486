"""The hang watch in this process (the application's own providers): records, limits,
gauges and goodput, with the SDK's in-memory log exporter (tests/faults/test_hangs.py runs
real ranks under torchrun into a real Collector)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from otel_helpers import providers, step_spans, value

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry


def _start(**settings: Any) -> tuple[InMemoryTelemetry, InMemoryLogRecordExporter]:
    logs = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="sampled", logger_provider=provider,
                         **settings, **providers(tel))  # fmt: skip
    return tel, logs


def _records(logs: InMemoryLogRecordExporter, event: str) -> list[Any]:
    out = []
    for item in logs.get_finished_logs():
        record = getattr(item, "log_record", item)
        if record.event_name == event:
            out.append(record)
    return out


def test_a_stall_sends_at_most_three_records_then_a_resolved_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tel, logs = _start(hang_after=1)
    for i in range(4):
        with otel_train.step(), otel_train.phase("forward"):
            if i == 1:
                time.sleep(8.5)  # records at 1, 2 and 4 s; no fourth at 8 s
    otel_train.shutdown()
    hangs = _records(logs, c.HANG_EVENT)
    assert [round(float(r.attributes[c.HANG_SECONDS.key])) for r in hangs] == [1, 2, 4]
    first = hangs[0]
    assert first.attributes[c.STEP_INDEX.key] == 1
    assert first.attributes[c.PHASE_NAME.key] == "forward"
    assert first.attributes[c.HANG_AFTER.key] == 1.0
    stack = first.attributes[c.HANG_STACKTRACE.key]
    assert stack.startswith("Thread MainThread") and "time.sleep(8.5)" in stack
    assert c.COLLECTIVE_OP.key not in first.attributes
    # The open step was traced for it, with the ids the record carries.
    (step,) = [s for s in step_spans(tel.spans()) if s.attributes[c.STEP_INDEX.key] == 1]
    assert step.attributes[c.STEP_SAMPLED_BECAUSE.key] == "hang"
    assert (first.trace_id, first.span_id) == (step.context.trace_id, step.context.span_id)
    (resolved,) = _records(logs, c.HANG_RESOLVED_EVENT)
    assert float(resolved.attributes[c.HANG_SECONDS.key]) == pytest.approx(8.5, abs=0.5)
    # Goodput: the stall is a category of its own.
    hang = value(tel, c.RUN_TIME.name, category="hang")
    assert hang == pytest.approx(8.5, abs=0.5)
    assert "no progress for" in capsys.readouterr().err  # (the console line, console off)


def test_the_gauges_rise_while_the_training_thread_is_stuck() -> None:
    tel, _ = _start(hang_after=30)
    with otel_train.step(), otel_train.phase("forward"):
        time.sleep(1.2)
        ages = []
        for _ in range(3):
            tel.flush()
            ages.append(value(tel, c.PROGRESS_AGE.name))
            time.sleep(0.3)
    otel_train.shutdown()
    assert all(a is not None for a in ages) and ages == sorted(ages) and ages[0] >= 1.0
    assert value(tel, c.PROGRESS_LIMIT.name) == 30.0


def test_an_open_checkpoint_region_has_ten_times_the_limit() -> None:
    tel, logs = _start(hang_after=1)
    with otel_train.step():
        pass
    with otel_train.region("checkpoint"):
        time.sleep(3.0)  # past hang_after, inside the region's budget (10 s)
        tel.flush()
        limit = value(tel, c.PROGRESS_LIMIT.name)
    with otel_train.step():
        pass
    otel_train.shutdown()
    assert limit == 10.0
    assert not _records(logs, c.HANG_EVENT)


def test_hang_after_off_watches_nothing() -> None:
    tel, logs = _start(hang_after="off")
    with otel_train.step():
        time.sleep(1.5)
    otel_train.shutdown()
    assert not logs.get_finished_logs()
    assert value(tel, c.PROGRESS_AGE.name) is None
