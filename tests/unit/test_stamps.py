"""A GPU job's boundaries are logged with their stamps (recording/stamps.py): the training
thread takes one CUDA event and one allocator sample per boundary, and the step machine
runs on the thread that takes the log (the worker, or the sidecar's feeder thread).

Against the stand-in runtime (tests/unit/cuda_standin.py), CUDA in use from the start.
Before stamps, every boundary of such a job ran the step machine on the training thread,
with two events and two allocator reads per phase."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import cuda_standin
import pytest
from otel_helpers import (
    epochs_until_raw,
    providers,
    sidecar_loop,
    step_spans,
    tiny_loader,
    tiny_model,
    train_epoch,
)

import otel_train
from otel_train import contract as c
from otel_train.recording.machine import StepMachine
from otel_train.testing import InMemoryTelemetry


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[cuda_standin.Runtime]:
    with cuda_standin.installed(monkeypatch) as runtime:
        yield runtime


@pytest.fixture
def opened_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that open steps (the step machine's ``_begin_at``)."""
    names: list[str] = []
    begin = StepMachine._begin_at

    def watched(self: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(threading.current_thread().name)
        return begin(self, *args, **kwargs)

    monkeypatch.setattr(StepMachine, "_begin_at", watched)
    return names


def _records(rt: cuda_standin.Runtime) -> int:
    return sum(ev.records for ev in rt.events)


def _loop(epochs: int) -> tuple[Any, Any, Any]:
    model, opt = tiny_model()
    loader = tiny_loader(n=64, batch_size=8)
    return model, opt, loader


def test_a_gpu_job_logs_one_event_and_one_memory_read_per_boundary(
    rt: cuda_standin.Runtime, opened_on: list[str]
) -> None:
    tel = InMemoryTelemetry()
    model, opt, loader = _loop(1)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", sidecar="off", **providers(tel))  # fmt: skip
    session = otel_train.session.current()
    assert session is not None and session.worker is not None
    rec = session.recorder
    train_epoch(model, opt, loader)  # (the first step applied at once binds the device)
    assert rec.stamping
    main = threading.current_thread().name
    before_opened = opened_on.count(main)
    records, resets, taken = _records(rt), rt.resets[0], rec.stamps_taken()
    epochs = 4
    for _ in range(epochs):
        train_epoch(model, opt, loader)
    steps = epochs * len(loader)
    per_step = (_records(rt) - records) / steps
    reads = (rt.resets[0] - resets) / steps
    boundaries = (rec.stamps_taken() - taken) / steps
    print(
        f"per step: boundaries {boundaries:.2f}, events recorded {per_step:.2f}, "
        f"allocator reads {reads:.2f}"
    )
    # One event and one allocator read a boundary (before: two of each per phase, and
    # an event at each step's begin and end: 10 and 8 for this loop's four phases).
    assert boundaries > 0
    assert per_step == boundaries
    assert reads == boundaries
    assert opened_on.count(main) == before_opened, "the training thread opened steps"
    assert otel_train.flush()
    assert rec.enabled and not session.worker.failed
    otel_train.shutdown()
    spans = tel.spans()
    assert len(step_spans(spans)) == steps + len(loader)
    for name in ("forward", "backward", "optimizer"):
        rows = [s for s in spans if s.name == name][-steps:]
        assert len(rows) == steps
        assert {s.attributes[c.PHASE_CLOCK.key] for s in rows} == {"device"}
    # Every event back in the pool but the clock's anchor: none lost, none twice.
    free = list(rec.events.free)
    assert len({id(e) for e in free}) == len(free)
    assert len(free) >= rec.events.created - 1


def test_a_gpu_job_with_the_sidecar_hands_its_stamped_boundaries_on_through_the_ring(
    rt: cuda_standin.Runtime, opened_on: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a raw session begins, no thread of the training process opens a step: the
    hooks write slots and stamps into the ring, the feeder's thread resolves the events,
    and the step machine runs in the sidecar's replica (handover/event_times.py)."""
    model, opt, loader, session = sidecar_loop(monkeypatch)
    rec = session.recorder
    handover = session.feeder.handover
    try:
        epochs = 1 + epochs_until_raw(model, opt, loader, handover)
        train_epoch(model, opt, loader)
        assert rec.stamping and handover.raw and handover.stamped
        before = len(opened_on)
        for _ in range(6):
            train_epoch(model, opt, loader)
            time.sleep(0.05)
        assert len(opened_on) == before, "a thread of the training process opened steps"
        assert handover.raw and handover.left == 0
        assert otel_train.flush(10.0)
        assert rec.enabled and not session.feeder.dead
        assert session.feeder.stats["steps"] == (epochs + 6) * len(loader)
        # Every event the ring took is back in the pool, or held by the resolver's chain
        # or a slot the sidecar has not acknowledged yet: none lost, none twice.
        free = rec.events.free
        assert len({id(e) for e in free}) == len(free)
    finally:
        otel_train.shutdown()
