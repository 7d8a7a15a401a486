"""The sidecar's replica acknowledges the idle points inside what it applied (raw.py).

In a raw session the training process keeps every log entry it sent since the last point
where the sidecar found its replica idle. Explicit steps (``with step()``, ``phase()``,
``record()``) are replayed one by one there, and a piece of the log cut at a pump lands
inside a step about always; an acknowledgement only at the end of a piece then came
almost never, and the kept entries grew with the run (benchmarks/README.md). Here a real
log crosses the pipe's encoding into the sidecar's real source in pieces cut anywhere,
and each take must report the last idle point the piece passed.
"""

from __future__ import annotations

from typing import Any

import torch
from otel_helpers import providers

import otel_train
from otel_train import session as session_mod
from otel_train.recording.layouts import L_KIND, SCALARS, STEP_END
from otel_train.sidecar import wire
from otel_train.sidecar.agent import RemoteSource
from otel_train.testing import InMemoryTelemetry

STEPS = 12


def _explicit_log() -> tuple[Any, list[tuple[Any, ...]]]:
    """The log of STEPS explicit steps, a loss recorded after each, as the pipe carries
    it (each thread's stack a token); and the session's settings."""
    tel = InMemoryTelemetry()
    model = torch.nn.Linear(4, 1)
    otel_train.configure(console="off", flops_per_step=1.0e6, **providers(tel))
    sess = session_mod.current()
    assert sess is not None and sess.recorder._defer
    sess.worker._stop.set()  # the log stays as the training thread wrote it
    sess.worker._thread.join(5)
    x = torch.randn(2, 4)
    try:
        for _ in range(STEPS):
            with otel_train.step(samples=2):
                with otel_train.phase("forward"):
                    loss = model(x).sum()
                with otel_train.phase("backward"):
                    loss.backward()
            otel_train.record(loss=loss.item())
        entries = list(sess.recorder._log)
        settings = sess.settings
        sess.recorder._log.clear()
    finally:
        otel_train.shutdown()
    reader = wire.FrameReader()
    (message,) = reader.feed(wire.frame((wire.RAW, 1, entries)))
    return settings, message[2]


def test_each_take_reports_the_last_idle_point_its_piece_passed() -> None:
    settings, entries = _explicit_log()
    stack = entries[0][0]
    token = next(k for k, v in wire.replica_stacks().items() if v is stack)
    try:
        _check_reports(settings, entries, token)
    finally:
        wire.replica_stacks().pop(token, None)  # (the sidecar's global, made here by the frame)


def _check_reports(settings: Any, entries: list[tuple[Any, ...]], token: int) -> None:
    # Idle after a step's end, and after the loss recorded between steps.
    idle = {0} | {i + 1 for i, e in enumerate(entries) if e[L_KIND] in (STEP_END, SCALARS)}
    assert len(idle) == 2 * STEPS + 1, [e[L_KIND] for e in entries[:10]]
    sent: list[tuple[Any, ...]] = []
    source = RemoteSource(settings, sent.append)
    source.raw_begin(1, 0, token)
    piece = 5  # (a step logs 6 entries and a loss 1: pieces end inside steps)
    reported = 0
    for start in range(0, len(entries), piece):
        end = min(start + piece, len(entries))
        source.push_raw(1, entries[start:end])
        source.take()
        reports = [m for m in sent if m[0] == wire.IDLE]
        sent.clear()
        expected = max(i for i in idle if i <= end)
        if expected > reported:
            assert [m[2] for m in reports] == [expected], end
            session_, _, next_index, named = reports[0][1:]
            assert session_ == 1 and named == token
            assert next_index == sum(1 for i in idle if 0 < i <= expected and
                                     entries[i - 1][L_KIND] == STEP_END)  # fmt: skip
            reported = expected
        else:
            assert reports == [], end
    assert reported == len(entries)
