"""The recording core's CUDA paths on a machine without a GPU, against a stand-in runtime
(tests/unit/cuda_standin.py) that behaves as the real one does where the GPU review found
defects: queries without a device guard, events bound to one device, captures in the
"global" mode, events that complete late. Each test here failed before its fix."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from typing import Any

import cuda_standin
import pytest
import torch
from cuda_standin import cuda_scalar, pinned_on_cpu
from otel_helpers import providers, step_spans, value

import otel_train
from otel_train import contract as c
from otel_train.recording.device import DeviceClock
from otel_train.testing import InMemoryTelemetry

MiB = 1 << 20


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[cuda_standin.Runtime]:
    with cuda_standin.installed(monkeypatch) as runtime:
        yield runtime


def _healthy(session: Any) -> None:
    """Nothing inside telemetry failed (recording and the worker still on): checked before
    shutdown, which switches recording off."""
    assert session.recorder.enabled, "recording switched itself off"
    assert not session.worker.failed, "the worker switched itself off"


def _end(session: Any) -> None:
    otel_train.flush()
    _healthy(session)
    otel_train.shutdown()


def _start(tel: InMemoryTelemetry, **settings: Any) -> Any:
    settings.setdefault("trace_steps", "all")
    settings.setdefault("sidecar", "off")  # (its worker in this process: read below)
    otel_train.configure(console="off", **settings, **providers(tel))
    session = otel_train.session.current()
    assert session is not None and session.worker is not None
    return session


def _steps(n: int, phases: tuple[str, ...] = ("forward", "backward")) -> None:
    for _ in range(n):
        with otel_train.step(samples=1):
            for name in phases:
                with otel_train.phase(name):
                    pass


def _no_event_twice(session: Any) -> None:
    """Every event is in one place: the pool's free list, an open record or the anchor."""
    free = list(session.recorder.events.free)
    assert len({id(e) for e in free}) == len(free), "an event is in the free list twice"
    held = []
    for step in session.recorder._pending:
        held += [step.ev0, step.ev1] + [e for p in step.phases for e in p[5:7]]
    held = [e for e in held if e is not None]
    # One boundary's event serves the phase that ends and what begins there (stamps.py):
    # records may share an event only as holders the pool counts.
    holders = session.recorder.events._holders
    shared = collections.Counter(id(e) for e in held)
    assert all(n - 1 <= holders.get(k, 0) for k, n in shared.items()), (
        "two open records share an event the pool does not count"
    )
    assert not {id(e) for e in held} & {id(e) for e in free}, "a held event is also free"


def test_readers_query_on_the_recorders_device_and_make_no_context_elsewhere(
    rt: cuda_standin.Runtime,
) -> None:
    """Item 3: the worker's queries run on the training device, not on device 0."""
    torch.cuda.set_device(1)  # the training thread's device (a rank whose device is 1)
    tel = InMemoryTelemetry()
    session = _start(tel)
    _steps(4)
    session.worker.process()  # the worker thread's own work, from another thread:
    reader = threading.Thread(target=session.worker.process, name="reader")
    _steps(2)
    reader.start()
    reader.join()
    otel_train.shutdown()
    assert rt.touched["reader"] == {1}, "a reading thread made a CUDA context on another device"
    assert rt.contexts == {1}
    assert session.recorder.device == 1
    assert len(step_spans(tel.spans())) == 6


def test_the_sidecar_feeders_idle_pump_makes_no_context_on_device_0(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 3, the default path: the feeder's own thread pumps while training is idle."""
    from test_sidecar import steps_total

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    torch.cuda.set_device(1)
    otel_train.configure(prometheus_port=0, console="off", flops_per_step=1e6)
    session = otel_train.session.current()
    assert session is not None and session.feeder is not None
    _steps(5)
    time.sleep(0.6)  # the feeder's thread pumps (IDLE_PUMP_S), querying the events
    assert steps_total(session.prometheus_address, 5) == 5
    assert rt.touched.get("otel-train-feeder"), "the feeder's thread queried nothing"
    assert rt.touched["otel-train-feeder"] == {1}
    assert rt.contexts == {1}
    otel_train.shutdown()


def test_events_go_to_the_bound_device_and_another_devices_thread_is_host_timed(
    rt: cuda_standin.Runtime,
) -> None:
    """Item 6: the model's device binds the recorder, whatever the current device; a
    background thread on device 0 neither poisons the pool nor switches recording off."""
    tel = InMemoryTelemetry()
    session = _start(tel)
    session.recorder.bind_device(1)  # what instrument() does for a model on cuda:1

    def rollout() -> None:
        with otel_train.phase("rollout"):  # this thread's current device is 0
            pass

    for _ in range(3):
        with otel_train.step(), otel_train.phase("forward"):
            thread = threading.Thread(target=rollout)
            thread.start()
            thread.join()
    _end(session)
    assert {ev.device for ev in rt.events} == {1}
    spans = tel.spans()
    rollouts = [s for s in spans if s.name == "rollout"]
    forwards = [s for s in spans if s.name == "forward"]
    assert len(rollouts) == 3 and len(forwards) == 3
    assert all(c.PHASE_DEVICE_DURATION.key in s.attributes for s in forwards)
    assert all(c.PHASE_DEVICE_DURATION.key not in s.attributes for s in rollouts)


def test_a_first_step_past_the_reanchor_interval_hands_out_no_event_twice(
    rt: cuda_standin.Runtime,
) -> None:
    """Item 5: the clock re-anchors inside the call that took its first anchor."""
    tel = InMemoryTelemetry()
    session = _start(tel)
    clock = DeviceClock(session.recorder.events, reanchor_ns=2_000_000)  # 2 ms, not 30 s
    session.worker.source.clock = clock
    with otel_train.step(), otel_train.phase("forward"):
        time.sleep(0.005)  # a long first step (compilation, autotuning)
    session.worker.process()
    _no_event_twice(session)
    _steps(20)
    session.worker.process()
    _no_event_twice(session)
    _end(session)
    assert len(step_spans(tel.spans())) == 21


def test_a_step_dropped_while_the_worker_checks_it_is_not_resolved_too(
    rt: cuda_standin.Runtime,
) -> None:
    """Item 8: drop-oldest on a full queue races the worker's check of the oldest step."""
    rt.auto_complete = False
    tel = InMemoryTelemetry()
    session = _start(tel, max_pending_steps=4)
    rec = session.recorder
    _steps(4)  # the queue is full; the GPU lags
    rt.complete()
    in_query = threading.Event()
    resume = threading.Event()
    original = cuda_standin.Event.query
    first = rec._pending[0].ev1

    def slow_query(ev: cuda_standin.Event) -> bool:
        if ev is first and not in_query.is_set():
            in_query.set()
            resume.wait(5)  # the training thread runs meanwhile
        return original(ev)

    cuda_standin.Event.query = slow_query  # type: ignore[method-assign,assignment]
    try:
        reader = threading.Thread(target=session.worker.process)
        reader.start()
        assert in_query.wait(5)
        _steps(2)  # drops the oldest steps of the full queue
        rt.complete()
        resume.set()
        reader.join()
    finally:
        cuda_standin.Event.query = original  # type: ignore[method-assign]
    session.worker.process()
    _no_event_twice(session)
    _end(session)
    indices = [s.attributes[c.STEP_INDEX.key] for s in step_spans(tel.spans())]
    assert len(indices) == len(set(indices)), "a step was emitted twice"
    assert len(indices) + rec.dropped_steps == 6


def test_no_query_and_no_event_while_a_graph_is_captured(rt: cuda_standin.Runtime) -> None:
    """Item 4: polling pauses during a capture; phases inside it are host-timed."""
    rt.auto_complete = False
    tel = InMemoryTelemetry()
    session = _start(tel)
    _steps(3)  # pending: their events have not completed
    graph = torch.cuda.graphs.CUDAGraph()
    graph.capture_begin()
    # (make_graphed_callables runs the instrumented forward here)
    with otel_train.step(), otel_train.phase("forward"):
        pass
    reader = threading.Thread(target=session.worker.process)
    reader.start()
    reader.join()
    graph.capture_end()
    assert rt.broken_captures == 0, "a query from another thread broke the capture"
    assert not any(ev.captured for ev in rt.events), "an event was recorded into the capture"
    rt.complete()
    _steps(2)
    rt.complete()
    _end(session)
    steps = step_spans(tel.spans())
    assert len(steps) == 6
    captured = next(s for s in steps if s.attributes[c.STEP_INDEX.key] == 3)
    assert c.STEP_DEVICE_DURATION.key not in captured.attributes  # host time only


def test_a_cuda_scalar_with_device_timing_off_is_read_only_once_copied(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 9 (thread path): the step waits for its scalar's copy event."""
    pinned_on_cpu(monkeypatch)
    rt.auto_complete = False
    tel = InMemoryTelemetry()
    session = _start(tel, device_timing="off")
    for v in (4.35, 2.5):
        with otel_train.step():
            otel_train.record(loss=cuda_scalar(v))
    session.worker.process()
    assert not step_spans(tel.spans()), "a step was taken before its scalar's copy landed"
    rt.complete()
    _end(session)
    assert len(step_spans(tel.spans())) == 2
    assert value(tel, c.SCALAR.name, name="loss") == pytest.approx(2.5)
    # The copies' events went back to the pool (values.raw_scalar's were never released).
    assert {id(e) for e in session.recorder.events.free} == {id(e) for e in rt.events}


def test_peaks_of_a_phase_survive_another_threads_boundary(rt: cuda_standin.Runtime) -> None:
    """Item 7: the peak reset is device-wide, so every open phase gets the peak."""
    tel = InMemoryTelemetry()
    _start(tel)

    def rollout() -> None:
        with otel_train.phase("rollout"):
            pass

    with otel_train.step(), otel_train.phase("forward"):
        rt.alloc(512 * MiB)  # a transient peak, gone before the other thread's boundary
        rt.free(512 * MiB)
        thread = threading.Thread(target=rollout)  # its boundaries reset the peak
        thread.start()
        thread.join()
    otel_train.shutdown()
    (forward,) = [s for s in tel.spans() if s.name == "forward"]
    assert forward.attributes[c.PHASE_PEAK_ALLOCATED.key] >= 512 * MiB


def test_a_cuda_scalar_reaches_the_sidecar_with_device_timing_off(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 9 (the default path): an adapter's CUDA scalar (the Hugging Face adapter records
    the loss every micro-step) went to the sidecar raw, pickled with its
    ``torch.cuda.Event`` (TypeError), which switched recording off; caught up locally it
    was read before its copy landed."""
    from test_sidecar import scrape, steps_total

    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    pinned_on_cpu(monkeypatch)
    otel_train.configure(device_timing="off", flops_per_step=1e6, prometheus_port=0,
                         console="off")  # fmt: skip
    session = otel_train.session.current()
    assert session is not None and session.feeder is not None  # the sidecar runs
    _steps(20)
    time.sleep(0.5)  # an idle pump finds the recorder idle: the log goes to the sidecar raw
    _steps(180)
    assert session.feeder.handover.raw
    rt.auto_complete = False  # the copies land later
    for v in (4.35, 2.5):
        with otel_train.step():
            session.recorder.record_scalars({"loss": cuda_scalar(v)})  # (as adapters do)
    otel_train.flush()
    assert session.recorder.enabled, "recording switched itself off"
    address = session.prometheus_address
    name = c.prometheus_names(c.SCALAR, source="scrape")[0]
    assert steps_total(address, 200) == 200
    assert (name, ()) not in scrape(address), "read before the copy landed"
    rt.complete()
    otel_train.flush()
    assert steps_total(address, 202) == 202
    assert scrape(address).get((name, ())) == pytest.approx(2.5)  # (the one scalar: loss)
    otel_train.shutdown()


def test_cuda_scalars_with_device_timing_off_bind_the_device_and_guard_captures(
    rt: cuda_standin.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38 item 15: with ``device_timing="off"`` a CUDA scalar (the Hugging Face and
    Lightning adapters record the loss every step) bound no device, so a reader queried
    its copy events on device 0 (a context of ~500 MiB there on every rank), and no
    CUDA-graph capture was guarded against those queries."""
    from otel_train.recording import capture

    pinned_on_cpu(monkeypatch)
    torch.cuda.set_device(1)  # the training thread's device (a rank whose device is 1)
    tel = InMemoryTelemetry()
    session = _start(tel, device_timing="off")
    for v in (4.35, 2.5):
        with otel_train.step():
            otel_train.record(loss=cuda_scalar(v))
    reader = threading.Thread(target=session.worker.process, name="reader")
    reader.start()
    reader.join()
    assert session.recorder.device == 1
    assert capture._installed, "captures are not guarded against the copy events' queries"
    _end(session)
    assert rt.touched["reader"] == {1}, "a reading thread made a CUDA context on device 0"
    assert rt.contexts == {1}
    assert len(step_spans(tel.spans())) == 2
    assert value(tel, c.SCALAR.name, name="loss") == pytest.approx(2.5)


def test_ddps_gradient_wait_is_timed_on_the_device_from_the_last_gradient(
    rt: cuda_standin.Runtime,
) -> None:
    """Issue 38 item 14: DDP's ``ddp_all_reduce`` phase took both its events at the end of
    backward, back to back: about 0 on a GPU, however long the all-reduce held the
    stream. Its start event is now the last gradient's (recorded by that hook on its
    thread's stream). A comm hook that holds the bucket 30 ms stands in for the wait."""
    from otel_helpers import single_rank_group

    with single_rank_group():
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))

        def slow_bucket(state, bucket):  # type: ignore[no-untyped-def]  # (DDP reads
            # annotations, which are strings under this module's __future__ import)
            time.sleep(0.03)
            fut: Any = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        model.register_comm_hook(None, slow_bucket)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        tel = InMemoryTelemetry()
        otel_train.instrument(model, optimizer=opt, console="off", trace_steps="all",
                              sidecar="off", **providers(tel))  # fmt: skip
        session = otel_train.session.current()
        for _ in range(4):
            loss = model(torch.randn(4, 8)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        _end(session)
    waits = [s for s in tel.spans() if s.name.startswith("ddp_all_reduce")]
    assert len(waits) == 4
    for span in waits:
        assert span.attributes[c.PHASE_CLOCK.key] == "device"
        assert span.attributes[c.PHASE_DEVICE_DURATION.key] >= 0.025
