"""The sidecar's replica acknowledges the idle points inside what it applied (raw.py).

In a raw session the training process keeps every slot of the ring written since the
last point where the sidecar found its replica idle. Explicit steps (``with step()``,
``phase()``, ``record()``) are replayed one by one there, and a piece of the ring told at
a pump ends inside a step about always; an acknowledgement only at the end of a piece
then came almost never, and what was kept grew with the run (benchmarks/README.md). Here
a real log is written into a real ring, told to the sidecar's real source in pieces cut
anywhere, and each piece must report the last idle point it passed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from otel_helpers import providers

import otel_train
from otel_train import session as session_mod
from otel_train.handover import wire
from otel_train.recording.layouts import L_KIND, SCALARS, STEP_END
from otel_train.recording.recorder import Recorder
from otel_train.recording.ring import Ring, read_ack
from otel_train.sidecar.replica import RemoteSource
from otel_train.testing import InMemoryTelemetry

STEPS = 12


def _explicit_log() -> tuple[Any, list[tuple[Any, ...]]]:
    """The log of STEPS explicit steps, a loss recorded after each; and the settings."""
    tel = InMemoryTelemetry()
    model = torch.nn.Linear(4, 1)
    otel_train.configure(console="off", flops_per_step=1.0e6, sidecar="off", **providers(tel))
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
    return settings, entries


@pytest.mark.parametrize("shared", [False, True], ids=["messages", "header"])
def test_each_piece_reports_the_last_idle_point_it_passed(shared: bool) -> None:
    """``shared``: the acknowledgements go in the ring's header (the C writer's sessions)
    rather than in messages."""
    settings, entries = _explicit_log()
    ring = Ring(Recorder(settings), capacity=256)
    try:
        _check_reports(settings, entries, ring, shared)
    finally:
        ring.close()


def _check_reports(settings: Any, entries: list[tuple[Any, ...]], ring: Ring, shared: bool) -> None:
    # Idle after a step's end, and after the loss recorded between steps.
    idle = {0} | {i + 1 for i, e in enumerate(entries) if e[L_KIND] in (STEP_END, SCALARS)}
    assert len(idle) == 2 * STEPS + 1, [e[L_KIND] for e in entries[:10]]
    sent: list[tuple[Any, ...]] = []
    source = RemoteSource(settings, sent.append, (ring.fd, ring.capacity))
    ring.writer.open = 1
    token = ring.tables.token_of(entries[0][0])
    told = (0, 1, 0)  # what of ring.tables the source has (boundaries, names, stacks)

    def news() -> tuple[list[Any], list[Any], list[Any]]:
        nonlocal told
        t = ring.tables
        out = (t.boundaries[told[0] :], t.names[told[1] :], t.stacks[told[2] :])
        told = (len(t.boundaries), len(t.names), len(t.stacks))
        return out

    source.raw_begin(1, 0, token, 0, news(), shared)

    def reports() -> list[tuple[Any, ...]]:
        """The acknowledgements since the last look: (session, position, index, token)."""
        if not shared:
            out = [m[1:] for m in sent if m[0] == wire.IDLE]
            sent.clear()
            return out
        ack = read_ack(ring.view)
        return [ack] if ack[1] > reported else []

    piece = 5  # (a step writes 6 slots and a loss 1: pieces end inside steps)
    reported = 0
    for start in range(0, len(entries), piece):
        end = min(start + piece, len(entries))
        for entry in entries[start:end]:
            assert ring.put_entry(entry)
        sides = [(p, e) for p, e in ring.sides.items() if start <= p < end]
        source.ring(1, end, news(), sides)
        source.take()
        got = reports()
        expected = max(i for i in idle if i <= end)
        if expected > reported:
            assert [r[1] for r in got] == [expected], end
            session_, _, next_index, named = got[0]
            assert session_ == 1 and named == token
            assert next_index == sum(1 for i in idle if 0 < i <= expected and
                                     entries[i - 1][L_KIND] == STEP_END)  # fmt: skip
            reported = expected
        else:
            assert got == [], end
    assert reported == len(entries)
