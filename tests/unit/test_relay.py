"""The application's own SDK providers, served from the sidecar (sidecar/relay.py).

An application that set up OpenTelemetry passes plain SDK providers (otel-train's testing
helpers take the same way, their reader's own bridge reading the relay's mirror): the
sidecar does the consumer side's work and sends back what those providers need. The same
loop through otel-train's in-process worker (``sidecar="off"``) gives the reference."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import torch
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c
from otel_train.handover.raw import RAW_ROOM
from otel_train.handover.relay_in import MAX_WAITING
from otel_train.processing.worker import MAX_BLOCKS
from otel_train.recording.scopes import NEAR_WINDOW
from otel_train.testing import InMemoryTelemetry


class AppProviders:
    """What an application builds: SDK providers with in-memory exporters."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))

    def given(self) -> dict[str, Any]:
        return {"tracer_provider": self.tracer_provider, "meter_provider": self.meter_provider,
                "logger_provider": self.logger_provider}  # fmt: skip

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out


def _tree(spans: list[Any]) -> list[tuple[str, str]]:
    """(span name, parent's name) of every span, sorted: the shape of the traces."""
    by_id = {s.context.span_id: s for s in spans}
    return sorted(
        (s.name, by_id[s.parent.span_id].name if s.parent and s.parent.span_id in by_id else "")
        for s in spans
    )


def _run(**given: Any) -> Any:
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, trace_steps="all",
                          console="off", **given)  # fmt: skip
    session = otel_train.session.current()
    train_epoch(model, opt, loader)
    assert otel_train.flush(timeout=15)
    return session


def test_the_sidecar_serves_the_applications_providers_as_the_worker_would() -> None:
    app = AppProviders()
    session = _run(**app.given())
    assert session.feeder is not None and session.feeder.relay is not None
    assert session.worker is None  # (no consumer thread in this process)
    relayed = app.spans.get_finished_spans()
    metrics = app.metrics()
    otel_train.shutdown()

    tel = InMemoryTelemetry()  # the reference: otel-train's worker in this process
    reference_session = _run(sidecar="off", **providers(tel))
    assert reference_session.worker is not None
    reference = tel.spans()
    otel_train.shutdown()

    assert _tree(relayed) == _tree(reference)
    assert len([s for s in relayed if s.name == c.STEP_SPAN.name]) == 8
    steps = metrics[c.STEPS.name]
    assert [p.value for p in steps] == [8.0]
    (durations,) = metrics[c.STEP_DURATION.name]  # (through the bridge on its reader)
    assert durations.count == 8
    phases = {p.attributes[c.A_PHASE]: p.count for p in metrics[c.PHASE_DURATION.name]}
    assert phases == {"data": 8, "forward": 8, "backward": 8, "optimizer": 8}
    # Exemplars name the relayed step spans' ids: chosen in the sidecar, kept here.
    ids = {s.context.trace_id for s in relayed}
    exemplar_ids = {e.trace_id for e in durations.exemplars}
    assert exemplar_ids and exemplar_ids <= ids


@pytest.mark.parametrize("sidecar", ["auto", "off"])
def test_a_flush_right_after_steps_of_many_shapes_has_every_step(sidecar: str) -> None:
    """A new phase name each step makes each step a block of its own: a flush hands on
    every step waiting, more blocks than the worker takes at a time included."""
    app = AppProviders()
    otel_train.configure(console="off", sidecar=sidecar, **app.given())
    n = 3 * MAX_BLOCKS + 10
    for i in range(n):
        with otel_train.step(), otel_train.phase(f"phase_{i}"):
            pass
    assert otel_train.flush(timeout=15)
    (steps,) = app.metrics()[c.STEPS.name]
    otel_train.shutdown()
    assert steps.value == n


def test_a_flush_takes_the_steps_behind_a_large_deliverys_rest() -> None:
    """The worker left most of a large delivery for later (its thread's own pass, made
    here) and more steps finished since: a flush hands on both."""
    app = AppProviders()
    otel_train.configure(console="off", sidecar="off", **app.given())
    worker = otel_train.session.current().worker
    worker.poll_s = 3600.0  # (its thread's next wait: the passes are made here)
    time.sleep(0.2)
    for i in range(3 * MAX_BLOCKS):
        with otel_train.step(), otel_train.phase(f"phase_{i}"):
            pass
    assert worker.process() == MAX_BLOCKS
    for _ in range(10):
        with otel_train.step(), otel_train.phase("work"):
            pass
    assert otel_train.flush(timeout=15)
    (steps,) = app.metrics()[c.STEPS.name]
    otel_train.shutdown()
    assert steps.value == 3 * MAX_BLOCKS + 10


def test_shutdown_says_false_when_the_relay_dropped_spans(capsys: Any) -> None:
    """A fast loop with every step traced outruns the relay (a span's start or end a
    millisecond apart): past MAX_WAITING steps the oldest are dropped here, counted, and
    shutdown() says so as for any other drop, and so does the console after the summary
    (which the sidecar printed before the relay's last steps were handed over here)."""
    app = AppProviders()
    otel_train.configure(trace_steps="all", console_every=10**6, **app.given())
    session = otel_train.session.current()
    assert session is not None and session.feeder is not None
    relay = session.feeder.relay
    for _ in range(8 * MAX_WAITING):
        with otel_train.step(), otel_train.phase("work"):
            pass
    shutdown = otel_train.shutdown()
    assert relay is not None and relay.dropped > 0
    assert shutdown is False
    console = capsys.readouterr().err
    after_summary = console.split("otel-train run summary", 1)[1]
    assert f"{relay.dropped:,} span_queue" in after_summary


def test_a_carrier_names_the_span_the_relay_builds() -> None:
    app = AppProviders()
    otel_train.configure(console="off", **app.given())
    with otel_train.step():
        carrier = otel_train.carrier()
    assert otel_train.flush(timeout=15)
    (step,) = [s for s in app.spans.get_finished_spans() if s.name == c.STEP_SPAN.name]
    otel_train.shutdown()
    _, trace_id, span_id, _ = carrier["traceparent"].split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (step.context.trace_id, step.context.span_id)


def _hangs(app: AppProviders) -> list[Any]:
    records = [getattr(r, "log_record", r) for r in app.logs.get_finished_logs()]
    return [r for r in records if r.event_name == c.HANG_EVENT]


def test_a_hang_record_reaches_the_applications_logger_provider() -> None:
    app = AppProviders()
    otel_train.configure(console="off", hang_after=1, **app.given())
    # Hung until the record is in (a fixed sleep raced the sidecar's ask and the
    # answer on a loaded machine), at most 30 s.
    with otel_train.step(), otel_train.phase("forward"):
        deadline = time.monotonic() + 30
        while not _hangs(app) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert otel_train.flush(timeout=15)
    otel_train.shutdown()
    found = _hangs(app)
    assert found and found[0].attributes[c.PHASE_NAME.key] == "forward"
    here = "test_a_hang_record_reaches_the_applications_logger_provider"
    assert here in found[0].attributes[c.HANG_STACKTRACE.key]


def test_the_sidecars_hang_records_say_the_ages_the_thread_would() -> None:
    """The stall's records at 1x and 2x the limit, as test_hang_watch.py's on the thread:
    the details the sidecar asks for come back at the feeder's next tick."""
    app = AppProviders()
    otel_train.configure(console="off", hang_after=1, **app.given())
    with otel_train.step(), otel_train.phase("forward"):
        time.sleep(3.0)  # records at 1 and 2 s
    otel_train.shutdown()
    assert [round(float(r.attributes[c.HANG_SECONDS.key])) for r in _hangs(app)] == [1, 2]


def test_phases_shorter_than_the_limit_are_no_hang_in_the_sidecar() -> None:
    """Each boundary reaches the sidecar's hang watch at the feeder's next tick: heard
    only once a second, a boundary 0.6 s old looked 1.6 s old there."""
    app = AppProviders()
    otel_train.configure(console="off", hang_after=1, **app.given())
    with otel_train.step():
        for name in ("forward", "backward", "optimizer", "forward", "backward"):
            with otel_train.phase(name):
                time.sleep(0.6)
    otel_train.shutdown()
    assert _hangs(app) == []


def test_a_meter_provider_with_no_reader_still_gets_the_steps_traced() -> None:
    """``OTEL_METRICS_EXPORTER=none`` gives an SDK meter provider with no reader: a valid
    setup (issue 38), so the spans still arrive and nothing is raised."""
    app = AppProviders()
    app.meter_provider = MeterProvider()  # (no reader)
    session = _run(**app.given())
    assert session.feeder is not None and session.feeder.relay is not None
    steps = [s for s in app.spans.get_finished_spans() if s.name == c.STEP_SPAN.name]
    otel_train.shutdown()
    assert len(steps) == 8


def test_training_goes_on_when_the_sidecar_dies() -> None:
    app = AppProviders()
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          **app.given())  # fmt: skip
    session = otel_train.session.current()
    assert session.feeder is not None
    session.feeder.proc.kill()
    for _ in range(3):
        train_epoch(model, opt, loader)
    otel_train.shutdown()  # (no exception, training went on)


def test_a_profiled_run_keeps_the_sidecar_and_its_steps_link_the_trace(tmp_path: Any) -> None:
    """profile_steps no longer puts the consumer side on a thread here: the profiler
    runs on the training thread and its event travels with the step to the sidecar."""
    app = AppProviders()
    otel_train.configure(console="off", profile_steps="2-3", debug_dir=str(tmp_path),
                         **app.given())  # fmt: skip
    session = otel_train.session.current()
    for _ in range(6):
        with otel_train.step(samples=4), otel_train.phase("work"):
            time.sleep(0.001)
    assert otel_train.flush(timeout=15)
    assert session.feeder is not None and session.worker is None
    steps = {s.attributes[c.STEP_INDEX.key]: s for s in app.spans.get_finished_spans()
             if s.name == c.STEP_SPAN.name}  # fmt: skip
    otel_train.shutdown()
    (trace_file,) = tmp_path.iterdir()
    for index in (2, 3):  # traced for the profiler although the sampler would skip them
        (event,) = [e for e in steps[index].events if e.name == c.PROFILE_EVENT]
        assert event.attributes[c.PROFILE_EVENT_ATTRIBUTES[0].key] == str(trace_file)
        assert steps[index].attributes[c.STEP_SAMPLED_BECAUSE.key] in ("debug", "first")
    assert not [e for i, s in steps.items() if i not in (2, 3) for e in s.events]


@pytest.mark.parametrize("first", [45, RAW_ROOM + 300])
def test_a_profiled_loop_hands_its_log_over_until_the_window(tmp_path: Any, first: int) -> None:
    """An instrumented loop's hooks log (the sidecar takes the log) far from the window,
    through the shared-memory ring (a raw session) when it is farther than RAW_ROOM, and
    the steps inside it are profiled, exactly those: one marker per step."""
    app = AppProviders()
    model, opt = tiny_model()
    n = first + 15
    loader = tiny_loader(n=8 * n)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", profile_steps=f"{first}-{first + 1}",
                          debug_dir=str(tmp_path), **app.given())  # fmt: skip
    session = otel_train.session.current()
    assert session is not None and session.feeder is not None
    handover, deferred, raw = session.feeder.handover, [], []
    for i, (x, y) in enumerate(loader):
        with torch.profiler.record_function(f"marker_{i}"):
            deferred.append(session.recorder._defer)
            raw.append(handover.raw)
            loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert otel_train.flush(timeout=15)
    assert session.worker is None
    steps = {s.attributes[c.STEP_INDEX.key]: s for s in app.spans.get_finished_spans()
             if s.name == c.STEP_SPAN.name}  # fmt: skip
    otel_train.shutdown()
    assert all(deferred[5:30]) and all(deferred[first + 3 :])  # (the first steps count FLOPs)
    assert not any(deferred[first - NEAR_WINDOW // 2 : first + 2])
    assert any(raw[:first]) == (first > RAW_ROOM) and not any(raw[first - NEAR_WINDOW : first + 2])
    (trace_file,) = tmp_path.iterdir()
    names = {e.get("name") for e in json.loads(trace_file.read_text())["traceEvents"]}
    assert {f"marker_{i}" for i in range(n)} & names == {f"marker_{first}", f"marker_{first + 1}"}
    # (past MAX_WAITING steps waiting for the application's SDK the oldest are dropped)
    assert sorted(steps) == list(range(n)) if n <= MAX_WAITING else {first, first + 1} <= set(steps)
    assert [i for i, s in sorted(steps.items()) if s.events] == [first, first + 1]
