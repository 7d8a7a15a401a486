"""Side entries reach the sidecar whenever they land beside the ring (handover/raw.py).

The training thread writes a side entry's slot first and puts the entry into
``Ring.sides`` after, in its own bytecode: the feeder's thread can hand over between the
two. The hand-over then tells a position past a side it does not have yet; the entry
must still go with a later one (else the sidecar's replica waits at that slot for good),
and the dict growing while the feeder reads it must not break the hand-over.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from test_raw_acks import _explicit_log

from otel_train.handover import wire
from otel_train.handover.raw import RawHandover
from otel_train.recording.layouts import L_KIND, SCALARS
from otel_train.recording.recorder import Recorder
from otel_train.recording.ring import NONE, SIDE, Ring


def _raw_handover(
    native: bool, capacity: int = 256
) -> tuple[RawHandover, list[tuple[Any, ...]], Any]:
    """A raw session over a real recorder and ring; what it sends, and a side entry."""
    settings, entries = _explicit_log()
    side = next(e for e in entries if e[L_KIND] == SCALARS)  # (a recorded loss)
    rec = Recorder(settings)
    ring = Ring(rec, capacity=capacity, native=native)
    sent: list[tuple[Any, ...]] = []
    handover = RawHandover(rec, sent.append, ring, lambda: False)
    handover.try_enter()
    assert handover.raw and sent[-1][0] == wire.RAW_BEGIN
    return handover, sent, side


def _told_sides(handover: RawHandover) -> list[tuple[int, Any]]:
    """The side entries one hand-over tells (a shared ring's pump, or a message's)."""
    told = handover.take()
    return [] if told is None else list(told[3])


@pytest.mark.parametrize("native", [False, True], ids=["python", "c"])
def test_a_side_entry_put_after_its_position_was_told_is_told_next(native: bool) -> None:
    handover, _, side = _raw_handover(native)
    ring = handover.ring
    try:
        at = ring.writer.put(SIDE, 0, 0, 0, NONE, NONE, NONE)  # the slot: written
        assert at >= 0
        ring.tables.name_code("reward")  # (news: a hand-over is due, a shared ring's too)
        assert _told_sides(handover) == []  # told past it: the entry is not there yet
        ring.sides[at] = side  # (the training thread goes on)
        assert _told_sides(handover) == [(at, side)]
        assert _told_sides(handover) == []  # (once)
        handover.leave_raw()
    finally:
        ring.close()


def test_the_sides_growing_while_a_hand_over_reads_them_is_no_error() -> None:
    """A thread writes side entries as fast as it can while hand-overs read them; every
    entry is told exactly once."""
    n, kept = 20_000, 2_000
    handover, _, side = _raw_handover(native=False, capacity=1 << 15)
    ring = handover.ring
    told: list[int] = []
    done = threading.Event()

    written: list[bool] = []

    def training() -> None:
        try:
            written.extend(ring.put_entry(side) for _ in range(n))
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (switch threads as often as the interpreter can)
    try:
        for _ in range(kept):  # (entries not let go of yet: each read takes a while)
            assert ring.put_entry(side)
        told += [p for p, _ in _told_sides(handover)]
        thread = threading.Thread(target=training)
        thread.start()
        while not done.is_set():
            told += [p for p, _ in _told_sides(handover)]
        thread.join()
        told += [p for p, _ in _told_sides(handover)]
    finally:
        sys.setswitchinterval(interval)
        ring.close()
    assert len(written) == n and all(written)
    assert sorted(told) == list(range(kept + n))
