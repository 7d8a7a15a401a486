"""The feeder's thread takes finished steps off the recorder's queue without the lock
while the training thread, ending a raw session (handover/raw.py), lets go of the steps
the sidecar's replica already has. A step must be popped before it is looked at on both
sides: checked on one and popped after, the other could take it in between (``IndexError:
pop from an empty deque``, and recording off for the rest of the run).

The interleaving is forced: the queue here gives its head to the "feeder" each time the
training thread asks whether it is empty, as the feeder's thread would just then.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from test_raw_acks import _explicit_log
from test_raw_sides import _raw_handover

from otel_train.recording.layouts import Step
from otel_train.recording.scopes import EXPLICIT


class RacingQueue(collections.deque):  # type: ignore[type-arg]
    """A deque that loses its head to another taker whenever it is asked if it is empty."""

    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self.taken_by_feeder: list[Any] = []

    def __bool__(self) -> bool:
        answer = len(self) > 0
        if answer:
            self.taken_by_feeder.append(self.popleft())  # (the feeder's thread, just then)
        return answer


@pytest.mark.parametrize("native", [False, True], ids=["python", "c"])
def test_leaving_a_raw_session_while_the_feeder_takes_steps(native: bool) -> None:
    handover, _, _ = _raw_handover(native, capacity=1 << 12)
    rec, ring = handover.rec, handover.ring
    for entry in _explicit_log()[1]:  # (slots the sidecar was not told of: a catch-up)
        assert ring.put_entry(entry)
    steps = [Step(i, 1_000 * i, EXPLICIT, None, None) for i in range(5)]
    racing = RacingQueue(steps)
    rec._pending = racing  # (the machine's queue of finished steps, the feeder's too)
    try:
        handover.leave_raw()  # IndexError before the change
    finally:
        ring.close()
    assert not handover.raw and rec.enabled
    assert len(racing) == 0  # each step: let go of here, or taken by the feeder
    assert len(racing.taken_by_feeder) < len(steps)
