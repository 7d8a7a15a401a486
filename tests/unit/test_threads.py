"""Phases on several threads: the rule in README "When things go wrong", deterministically.

A phase belongs to the step open when it starts, whichever thread runs it; between the
training thread's steps, another thread's phase belongs to no step and opens none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from otel_helpers import providers

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry


def _on_thread(fn: Callable[[], None]) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def _rollout() -> None:
    with otel_train.phase("rollout"):
        pass


def test_a_rollout_thread_phase_joins_the_open_step_and_opens_none_between() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))
    with otel_train.step(samples=2), otel_train.phase("forward"):
        _on_thread(_rollout)  # runs inside step 0
    _on_thread(_rollout)  # between steps: belongs to no step
    with otel_train.step(samples=2), otel_train.phase("forward"):
        pass
    otel_train.shutdown()
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    assert sorted(s.attributes[c.STEP_INDEX.key] for s in steps) == [0, 1]
    rollouts = [s for s in tel.spans() if s.name == "rollout"]
    assert len(rollouts) == 1
    first = next(s for s in steps if s.attributes[c.STEP_INDEX.key] == 0)
    assert rollouts[0].parent is not None
    assert rollouts[0].parent.span_id == first.context.span_id
    (late,) = [p for p in tel.points(c.DROPPED.name) if p.attributes[c.A_REASON] == "late_phase"]
    assert late.value == 1


def test_bare_phases_alone_still_form_steps_on_any_thread() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))

    def loop() -> None:
        for _ in range(3):
            with otel_train.phase("forward"):
                pass

    _on_thread(loop)  # no explicit steps anywhere: each repeat of "forward" is a step
    otel_train.shutdown()
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    assert len(steps) == 3
