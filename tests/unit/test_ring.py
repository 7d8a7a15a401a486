"""The shared-memory ring (recording/ring.py): slots give back the log entries they were
written from, the C writer writes what the Python one writes, and a write the ring
cannot take goes the log's way.

The log comes from real loops: a plain loop instrumented with a loader and optimizer (its
boundaries, with the batches' counts), and explicit steps and phases with a phase that
raises, user scalars and an exhausted loader's discard (side entries).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from otel_helpers import (
    epochs_until_raw,
    providers,
    sidecar_loop,
    tiny_loader,
    tiny_model,
    train_epoch,
)

import otel_train
from otel_train import session as session_mod
from otel_train.recording import ring as ring_mod
from otel_train.recording.recorder import ADAPTER, Recorder, boundary
from otel_train.recording.ring import HEADER, NONE, SIDE, SLOT, Ring, Writer, decode
from otel_train.settings import Settings
from otel_train.testing import InMemoryTelemetry

WRITERS = ["python", "c"]


def _native_or_skip(kind: str) -> bool:
    """Whether ``kind`` is the C writer; skips it where it was not built, unless
    OTEL_TRAIN_NATIVE_REQUIRED=1 (CI, which installs the package) makes that a failure."""
    if kind == "c" and ring_mod.NATIVE is None:
        if os.environ.get("OTEL_TRAIN_NATIVE_REQUIRED") == "1":
            pytest.fail("otel_train.recording._ring was not built (setup.py)")
        pytest.skip("the C writer was not built")
    return kind == "c"


def _logged() -> tuple[Settings, list[tuple[Any, ...]]]:
    """A real log, as the training thread wrote it (the worker stopped)."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=24, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          flops_per_step=1.0e6, sidecar="off", **providers(tel))  # fmt: skip
    sess = session_mod.current()
    assert sess is not None and sess.recorder._defer
    sess.worker._stop.set()
    sess.worker._thread.join(5)
    try:
        train_epoch(model, opt, loader, record=True)
        with otel_train.step(samples=3, tokens=None):
            with otel_train.phase("rollout"):
                pass
            with pytest.raises(ValueError), otel_train.phase("reward"):
                raise ValueError("bad reward")
            otel_train.record(reward=1.5)
        entries = list(sess.recorder._log)
        sess.recorder._log.clear()
        return sess.settings, entries
    finally:
        otel_train.shutdown()


def _native_decode_or_skip(kind: str) -> bool:
    """Whether ``kind`` is the C decoder (skipped, or failed in CI, as the C writer)."""
    if kind == "c" and ring_mod.NATIVE_DECODE is None:
        _native_or_skip("c")
        pytest.fail("_ring.KINDS does not number the kinds as ring.py does")
    return kind == "c"


@pytest.mark.parametrize("reader", ["python", "c"])
@pytest.mark.parametrize("writer", WRITERS)
def test_slots_decode_to_the_entries_they_were_written_from(writer: str, reader: str) -> None:
    settings, entries = _logged()
    kinds = {e[2] if e[2].__class__ is not tuple else "boundary" for e in entries}
    assert {"boundary", 0, 1, 2, 3, 4, 6} <= kinds, kinds  # (every kind a loop logs)
    ring = Ring(Recorder(settings), capacity=64, native=_native_or_skip(writer))
    native = _native_decode_or_skip(reader)
    try:
        ring.writer.open = 1
        out: list[tuple[Any, ...]] = []
        for start in range(0, len(entries), 40):  # (wrapping round the ring)
            for e in entries[start : start + 40]:
                assert ring.put_entry(e)
            got, upto = decode(ring.view, ring.capacity, start, ring.writer.pos, ring.tables,
                               ring.tables.stack_objects.get, ring.sides, native)  # fmt: skip
            assert upto == ring.writer.pos
            ring.writer.acked = upto
            out += got
        assert out == entries
        for a, b in zip(out, entries, strict=True):  # the same objects: recognised by identity
            assert a[0] is b[0] and (a[2] is b[2] or a[2].__class__ is not tuple)
        sides = [e for e in entries if e[2] in (1, 4, 6) and (e[2] != 1 or e[4] is not None)]
        assert len(sides) >= 3  # the raised phase's exit, the scalars, the discard
    finally:
        ring.close()


@pytest.mark.parametrize("reader", ["python", "c"])
def test_decoding_stops_at_a_slot_whose_meaning_has_not_arrived(reader: str) -> None:
    """A side entry, a boundary code or a phase name the reader's tables do not hold yet
    (a later hand-over brings it): decoding stops at that slot, and goes on from it."""
    native = _native_decode_or_skip(reader)
    settings, entries = _logged()
    ring = Ring(Recorder(settings), capacity=256, native=False)
    try:
        ring.writer.open = 1
        for e in entries[:120]:
            assert ring.put_entry(e)
        end = ring.writer.pos
        full, sides = ring.tables, dict(ring.sides)
        side = min(sides)
        partial = ring_mod.Tables()
        partial.boundaries = full.boundaries[:1]
        partial.names = full.names
        args = (ring.view, ring.capacity)
        got, upto = decode(*args, 0, end, partial, full.stack_objects.get, {}, native)
        first_other = next(i for i, e in enumerate(entries) if e[2].__class__ is tuple
                           and e[2] is not full.boundaries[0])  # fmt: skip
        assert upto == first_other < side and got == entries[:upto]
        partial.boundaries, partial.names = full.boundaries, full.names[:1]
        got, upto = decode(*args, 0, end, partial, full.stack_objects.get, dict(sides), native)
        first_named = next(i for i, e in enumerate(entries)  # (an ENTER or EXIT slot)
                           if e[2] in (0, 1) and i not in sides)  # fmt: skip
        assert side < upto == first_named and got == entries[:upto]
        got, upto = decode(*args, 0, end, full, full.stack_objects.get, {}, native)
        assert upto == side and got == entries[:side]  # (its side entry not here yet)
        got, upto = decode(*args, side, end, full, full.stack_objects.get, sides, native)
        assert upto == end and got == entries[side:end] and not sides
    finally:
        ring.close()


class _Calls:
    """What a writer calls back: the recorder's flags, stack and code lookups, and the
    refused writes and due calls it made."""

    def __init__(self) -> None:
        self.flags: dict[str, Any] = {"enabled": True}
        self.refused: list[tuple[Any, ...]] = []
        self.due = 0

    def writer(self, kind: type, buffer: Any, capacity: int) -> Any:
        codes: dict[int, int] = {}

        def code_of(b: Any) -> int:
            return codes.setdefault(id(b), 16 + len(codes))

        return kind(buffer, capacity, self.flags, lambda: 4242, code_of,
                    lambda *a: self.refused.append(a), self._due)  # fmt: skip

    def _due(self) -> None:
        self.due += 1


def test_the_c_writer_writes_what_the_python_writer_writes() -> None:
    _native_or_skip("c")
    b1 = boundary("data", None, counted=True)
    b2 = boundary("forward", "backward", begin=ADAPTER)
    slots = []
    for kind in (Writer, ring_mod.NATIVE):
        calls = _Calls()
        buf = bytearray(HEADER + SLOT.size * 8)
        w = calls.writer(kind, buf, 8)
        w.open = 1
        w.due = 3
        w.counted(b1, 32, None, 7, 1000)
        w.counted(b1, None, 2**40, None, 2000)
        w.put(SIDE, 0, 4242, 0, NONE, NONE, NONE)
        w.transition(b2)
        w.counted(b1, True, 1, 1, 5)  # (a bool is no count: refused)
        w.counted(b1, 1 << 63, 1, 1, 5)  # (past int64: refused)
        assert w.pos == 4 and calls.due == 1
        assert [r[1] for r in calls.refused] == [True, 1 << 63]
        raw = [SLOT.unpack_from(buf, HEADER + i * SLOT.size) for i in range(4)]
        assert ring_mod.written(buf)[0] == 4  # (published in the header)
        assert raw[3][2] > 0  # (transition reads the clock)
        slots.append([(*r[:2], 0, *r[3:]) if i == 3 else r for i, r in enumerate(raw)])
        if kind is not Writer:
            w.release()
    assert slots[0] == slots[1]
    assert slots[0][0] == (16, 0, 1000, 4242, 32, NONE, 7)


@pytest.mark.parametrize("writer", WRITERS)
def test_a_write_the_ring_cannot_take_is_refused(writer: str) -> None:
    kind = ring_mod.NATIVE if _native_or_skip(writer) else Writer
    calls = _Calls()
    buf = bytearray(HEADER + SLOT.size * 2)
    w = calls.writer(kind, buf, 2)
    b = boundary("forward", "optimizer")
    w.transition(b)  # closed
    w.open = 1
    w.transition(b)
    w.transition(b)
    w.transition(b)  # full: two slots not let go of
    ring_mod.publish_ack(buf, 1, 1, 0, 0)  # (the reader let go of one: in the header)
    w.transition(b)
    calls.flags["enabled"] = False
    w.transition(b)  # recording off
    assert w.pos == 3
    assert [r[0] for r in calls.refused] == [b, b, b]
    assert w.put(2, 0, 1, 5, NONE, NONE, NONE) == -1  # (full again)
    w.acked = 2  # (or told so another way)
    assert w.put(2, 0, 1, 5, NONE, NONE, NONE) == 3
    if kind is not Writer:
        w.release()


@pytest.mark.parametrize("writer", WRITERS)
def test_a_plain_loop_hands_over_through_the_ring_and_counts_each_step_once(
    writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end with a real sidecar: the hooks write the ring, the sidecar's replica
    applies it, and counts every step once. With the C writer the ring's header carries
    the position and the acknowledgements; with the Python writer, messages do."""
    native = _native_or_skip(writer)
    if not native:
        monkeypatch.setattr(ring_mod, "NATIVE", None)
    model, opt, loader, sess = sidecar_loop(monkeypatch)
    try:
        handover = sess.feeder.handover
        epochs = epochs_until_raw(model, opt, loader, handover)
        assert handover.raw and handover.shared == native
        assert sess.recorder.transition == handover.ring.writer.transition
        assert isinstance(handover.ring.writer, Writer) != native
        for _ in range(10):
            train_epoch(model, opt, loader)
            epochs += 1
        assert handover.ring.writer.pos > 500
        assert not sess.recorder._log  # (nothing went the old way)
        time.sleep(1.0)  # (the sidecar acknowledges: the ring's slots are let go of)
        assert handover.acked() > 0
        assert otel_train.flush(10.0)
        assert sess.feeder.stats["steps"] == epochs * len(loader)
    finally:
        otel_train.shutdown()
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("writer", WRITERS)
def test_the_header_carries_the_readers_acknowledgement(
    writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the sidecar publishes (its last idle point) reads back whole, from the C
    helpers and the Python ones alike, and one reads what the other wrote."""
    native = _native_or_skip(writer)
    buf = bytearray(HEADER)
    if not native:
        monkeypatch.setattr(ring_mod, "NATIVE", None)
    ring_mod.publish_ack(buf, 3, 120, 17, 2**63 + 5)
    assert ring_mod.read_ack(buf) == (3, 120, 17, 2**63 + 5)
    ring_mod.publish_ack(buf, 3, 150, 21, 0)
    monkeypatch.setattr(ring_mod, "NATIVE", None)  # (the Python reader of what was written)
    assert ring_mod.read_ack(buf) == (3, 150, 21, 0)
    assert ring_mod.written(buf) == (0, 0)
