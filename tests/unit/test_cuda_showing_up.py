"""CUDA available but not in use: the hooks log their boundaries, as on a CPU-only machine,
until CUDA shows up (recording/recorder.py, ``watch_cuda``).

On the lent H200, the MLP of benchmarks/pump_cpu.py (trained on the CPU) cost the
training thread 38-44 us a step against 4.3 us with CUDA hidden: a CUDA host turned the
deferral and the raw hand-over off whether or not the job used CUDA. Against the
stand-in runtime (tests/unit/cuda_standin.py), with ``torch.cuda.is_initialized()``
saying what the test wants: boundaries are logged while CUDA is not in use, and once it
is, the thread that hands steps on (the worker's, the feeder's) ends the logging and the
steps after are timed on the device; a raw session to the sidecar ends with every step
counted once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import cuda_standin
import pytest
import torch
from otel_helpers import epochs_until_raw, providers, sidecar_loop, step_spans, train_epoch

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry


@pytest.fixture
def in_use(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """The stand-in runtime, CUDA not in use until the test sets ``in_use[0]``."""
    flag = [False]
    with cuda_standin.installed(monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: flag[0])
        yield flag


def _steps(n: int) -> None:
    for _ in range(n):
        with otel_train.step(samples=1), otel_train.phase("forward"):
            pass


def test_steps_are_timed_on_the_device_once_cuda_shows_up(in_use: list[bool]) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(
        console="off", trace_steps="all", flops_per_step=1.0e6, sidecar="off", **providers(tel)
    )  # fmt: skip  (given: no FLOP count is due; off: its worker is read below)
    session = otel_train.session.current()
    assert session is not None and session.worker is not None
    rec = session.recorder
    try:
        assert rec._defer  # CUDA available, not in use: the boundaries are logged
        _steps(3)
        in_use[0] = True  # (the model went to the GPU, say)
        deadline = time.monotonic() + 10
        while not rec.stamping and time.monotonic() < deadline:
            _steps(1)  # (steps go on as the worker, at its next wake, ends the log)
        assert rec.stamping  # (the first step after it binds the device, then stamps)
        _steps(3)
        assert otel_train.flush()
        assert rec.enabled and not session.worker.failed
    finally:
        otel_train.shutdown()
    clocks = [
        [p.attributes[c.PHASE_CLOCK.key] for p in tel.spans()
         if p.name == "forward" and p.parent.span_id == s.context.span_id]
        for s in step_spans(tel.spans())
    ]  # fmt: skip
    hosts = [cl for cl in clocks if cl == ["host"]]  # (those logged before it showed)
    assert len(hosts) >= 3
    assert clocks == hosts + [["device"]] * (len(clocks) - len(hosts))
    assert clocks[-3:] == [["device"]] * 3


def test_a_raw_session_ends_when_cuda_shows_up(
    in_use: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's path: the hooks write the ring while CUDA is not in use; once it is,
    the feeder's thread ends the session, and every step is counted once there."""
    model, opt, loader, session = sidecar_loop(monkeypatch)
    try:
        handover, rec = session.feeder.handover, session.recorder
        epochs = epochs_until_raw(model, opt, loader, handover)
        assert handover.raw and rec._defer
        in_use[0] = True
        deadline = time.monotonic() + 10
        while (not rec.stamping or handover.raw) and time.monotonic() < deadline:
            train_epoch(model, opt, loader)  # (training goes on as the feeder ends it)
            epochs += 1
        # The hooks log again, with stamps (recording/stamps.py), never to the ring.
        assert rec.stamping and not handover.raw
        for _ in range(3):
            train_epoch(model, opt, loader)
            epochs += 1
        assert not handover.raw and rec._cuda  # (no session again: the device is timed)
        assert otel_train.flush(10.0)
        assert session.feeder.stats["steps"] == epochs * len(loader)
    finally:
        otel_train.shutdown()
