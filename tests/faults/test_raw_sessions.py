"""Steps accounted for across raw sessions while the sidecar is behind (handover/raw.py).

A raw session ends in the training process at once (a state request, a full ring), but
in the sidecar only when it reads that session's RAW_END, which a sidecar that is
descheduled (one core for both, ``taskset``) or stopped reads late. A session begun
before then wrote its slots into the ring the sidecar still read as the old session's,
over slots it had not read yet: those steps were lost uncounted, though the training
process had let go of them (the sidecar's replica "has them").

Here a real recorder, ring and hand-over write, and the sidecar's real source
(sidecar/replica.py) reads their messages only after the training process has gone on:
every step is handed on exactly once; and one that comes twice (from its replica and
from the training process) is counted once, processed or dropped.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import otel_train
from otel_train import session as session_mod
from otel_train.handover import wire
from otel_train.handover.raw import RawHandover
from otel_train.processing.blocks import StepBlock
from otel_train.processing.source import StepSource
from otel_train.recording.recorder import Recorder
from otel_train.recording.ring import Ring
from otel_train.sidecar.replica import MAX_HELD_STEPS, RemoteSource

STEPS = 12  # in one log
CAPACITY = 1 << 12  # slots: each stretch of training below writes ~60% of the ring


def _explicit_log() -> tuple[Any, list[tuple[Any, ...]]]:
    """The settings, and the log of STEPS explicit steps of three phases and a loss."""
    otel_train.configure(console="off", prometheus=False, sidecar="off", flops_per_step=1e6)
    sess = session_mod.current()
    assert sess is not None and sess.worker is not None
    sess.worker.stop(time.monotonic())  # (the log stays as the training thread writes it)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(2, 4)
    try:
        for _ in range(STEPS):  # (9 slots a step: the stretches' slots do not line up)
            with otel_train.step(samples=2):
                for name in ("data", "forward", "backward"):
                    with otel_train.phase(name):
                        loss = model(x).sum()
                otel_train.record(loss=loss.item())  # (an entry beside the ring)
        return sess.settings, sess.recorder.take_log()
    finally:
        otel_train.shutdown()


class TrainingProcess:
    """The training process's end: hooks that write the ring in a raw session and apply
    the log here otherwise, and the messages sent, in order."""

    def __init__(self, settings: Any, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.rec = Recorder(settings)
        self.ring = Ring(self.rec, capacity=CAPACITY, native=True)
        self.sent: list[tuple[Any, ...]] = []
        self.handover = RawHandover(self.rec, self.sent.append, self.ring, lambda: False)
        self.rec.handover = self.handover
        self.local = StepSource(self.rec)

    def train(self, logs: int) -> None:
        """Pumps until a session begins (or up to the back-off's longest wait), then
        ``logs`` logs' worth of steps, and a state request that ends the session."""
        for _ in range(20):  # (one thread here: the recorder's lock is not needed)
            self.handover.try_enter()
        for _ in range(logs):
            if self.handover.raw:
                assert all(self.ring.put_entry(e) for e in self.log)
            else:  # (the parts mode: applied here, finished steps to the pipe)
                self.rec.apply_entries(self.log)
                self.sent.append((wire.DELIVERY, self.local.take(derive=False)))
        self.handover.leave_raw()


def _indices(parts: list[Any]) -> list[int]:
    indices: list[int] = []
    for part in parts:
        if isinstance(part, StepBlock):
            indices += range(part.first, part.first + part.k)
        else:
            indices += [step.index for step in part]
    return indices


def _sidecar_reads(source: RemoteSource, sent: list[tuple[Any, ...]]) -> list[int]:
    """The sidecar applies the messages in order, its worker taking what each one
    finished: the step indices the worker gets."""
    indices: list[int] = []
    for message in sent:
        kind = message[0]
        if kind == wire.RAW_BEGIN:
            source.raw_begin(*message[1:])
        elif kind == wire.RING:
            source.ring(*message[1:])
        elif kind == wire.RAW_END:
            source.raw_end(message[1])
        elif kind == wire.DELIVERY:
            source.push(message[1])
        indices += _indices(source.take().parts)
    sent.clear()
    return indices


def test_a_session_does_not_begin_before_the_sidecar_applied_the_last_ones_end() -> None:
    settings, log = _explicit_log()
    logs = CAPACITY * 3 // (5 * len(log))  # logs run per stretch of training
    trainer = TrainingProcess(settings, log)
    source = RemoteSource(settings, lambda message: None, (trainer.ring.fd, CAPACITY))
    try:
        trainer.train(logs)  # a session, the sidecar descheduled throughout
        trainer.train(logs)  # a second stretch before it reads any of it
        handed = _sidecar_reads(source, trainer.sent)
        trainer.train(logs)  # it caught up: a session again
        handed += _sidecar_reads(source, trainer.sent)
    finally:
        trainer.ring.close()
    assert sorted(handed) == list(range(3 * logs * STEPS))
    assert trainer.handover.session == 2  # (the second stretch went as finished steps)


def test_a_step_dropped_for_the_held_bound_and_coming_again_is_counted_once() -> None:
    """Steps can reach the sidecar twice around a raw session's end (from its replica and
    from the training process); when the first copy was dropped for the bound on held
    steps (counted), the second was processed too: counted twice."""
    settings, log = _explicit_log()
    trainer = TrainingProcess(settings, log)
    source = RemoteSource(settings, lambda message: None, None)
    deliveries = []
    for _ in range(MAX_HELD_STEPS // STEPS + 8):  # (past the bound: the oldest dropped)
        trainer.rec.apply_entries(log)
        deliveries.append(trainer.local.take(derive=False))
    trainer.ring.close()
    for delivery in [*deliveries, deliveries[0]]:  # (the first again, as a repeat)
        source.push(delivery)
    handed = _indices(source.take().parts)
    assert source.dropped > 0 and len(set(handed)) == len(handed)
    assert len(handed) + source.dropped == len(deliveries) * STEPS
