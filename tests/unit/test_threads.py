"""Phases on several threads: the rule in docs/failures.md ("Threads"), deterministically.

The training thread is the one that opens steps (``step()``, an instrumented trainer; before
either, the main thread's bare phases). Another thread's phases are background phases:
they never open, end or cycle a step; each outermost one, with what nests in it, joins the
step open when it ends, or else the next step to end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry


def _on_thread(fn: Callable[[], None]) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def _rollout() -> None:
    with otel_train.phase("rollout"), otel_train.phase("generate"):
        pass


def _steps(tel: InMemoryTelemetry) -> dict[int, object]:
    return {s.attributes[c.STEP_INDEX.key]: s for s in tel.spans() if s.name == c.STEP_SPAN.name}


def _late(tel: InMemoryTelemetry) -> float:
    return sum(
        p.value for p in tel.points(c.DROPPED.name) if p.attributes[c.A_REASON] == "late_phase"
    )


def test_actor_phases_before_the_first_step_open_none_and_join_it() -> None:
    """Issue 13 item 1: three rollouts on an actor thread before the learner's first step,
    then two learner steps: two steps, indices from 0, and every rollout recorded."""
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))
    for _ in range(3):
        _on_thread(_rollout)
    for _ in range(2):
        with otel_train.step(samples=1), otel_train.phase("train"):
            pass
    otel_train.shutdown()
    steps = _steps(tel)
    assert sorted(steps) == [0, 1]
    rollouts = [s for s in tel.spans() if s.name == "rollout"]
    assert len(rollouts) == 3
    assert {r.parent.span_id for r in rollouts} == {steps[0].context.span_id}
    generates = [s for s in tel.spans() if s.name == "generate"]
    assert sorted(g.parent.span_id for g in generates) == sorted(
        r.context.span_id for r in rollouts
    )  # nesting kept: each generate under its own rollout
    (count,) = [
        p for p in tel.points(c.PHASE_DURATION.name) if p.attributes[c.A_PHASE] == "rollout"
    ]
    assert count.count == 3
    assert _late(tel) == 0


def test_a_rollout_spanning_steps_joins_the_step_open_when_it_ends() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))
    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def long_rollout() -> None:
        with otel_train.phase("rollout"):
            started.set()
            release.wait(10)
        done.set()

    with otel_train.step(samples=1), otel_train.phase("train"):
        actor = threading.Thread(target=long_rollout)
        actor.start()
        started.wait(10)
    with otel_train.step(samples=1), otel_train.phase("train"):
        pass
    with otel_train.step(samples=1), otel_train.phase("train"):
        release.set()
        done.wait(10)  # ends inside step 2
    actor.join()
    with otel_train.step(samples=1), otel_train.phase("train"):
        _on_thread(_rollout)  # inside step 3
    _on_thread(_rollout)  # between steps: joins the next step to end (4)
    with otel_train.step(samples=1), otel_train.phase("train"):
        pass
    otel_train.shutdown()
    steps = _steps(tel)
    assert sorted(steps) == [0, 1, 2, 3, 4]
    parents = sorted(
        next(i for i, st in steps.items() if st.context.span_id == s.parent.span_id)
        for s in tel.spans()
        if s.name == "rollout"
    )
    assert parents == [2, 3, 4]
    assert _late(tel) == 0


def test_a_hook_inside_a_background_phase_is_part_of_it() -> None:
    """A rollout calling the instrumented model: its forward is a phase of the rollout,
    not a step of the actor thread, and the learner's step count is unchanged."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=16, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, console="off", trace_steps="all", **providers(tel)
    )
    train_epoch(model, opt, loader)  # two learner steps: the training thread is known

    def rollout() -> None:
        with otel_train.phase("rollout"):
            for x, _ in loader:
                model(x)

    _on_thread(rollout)
    train_epoch(model, opt, loader)
    otel_train.shutdown()
    steps = _steps(tel)
    assert sorted(steps) == [0, 1, 2, 3]
    (rollout_span,) = [s for s in tel.spans() if s.name == "rollout"]
    forwards = [s for s in tel.spans() if s.name == "forward"]
    inside = [f for f in forwards if f.parent.span_id == rollout_span.context.span_id]
    assert len(inside) == 2  # the rollout's two forward passes
    assert len(forwards) == 4 + 2


def test_main_thread_bare_phases_still_form_steps() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))
    for _ in range(3):
        with otel_train.phase("forward"):
            pass
    otel_train.shutdown()
    assert len(_steps(tel)) == 3


def test_bare_phases_on_another_thread_alone_form_no_steps_and_say_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))

    def loop() -> None:
        for _ in range(3):
            with otel_train.phase("forward"):
                pass

    _on_thread(loop)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        otel_train.shutdown()
    assert _steps(tel) == {}
    assert _late(tel) == 3
    assert sum("never start one" in r.getMessage() for r in caplog.records) == 1


def test_a_thread_that_opens_steps_is_the_training_thread() -> None:
    """Training on a thread of its own (Ray Train runs the loop so): its steps are steps,
    and the main thread's phases while it trains are background phases."""
    tel = InMemoryTelemetry()
    otel_train.configure(console="off", trace_steps="all", **providers(tel))
    opened = threading.Event()

    def train() -> None:
        with otel_train.step(samples=1), otel_train.phase("forward"):
            opened.set()
        with otel_train.step(samples=1), otel_train.phase("forward"):
            pass

    trainer = threading.Thread(target=train)
    trainer.start()
    opened.wait(10)
    trainer.join()
    with otel_train.phase("evaluation"):  # the main thread, after: a background phase
        pass
    otel_train.shutdown()
    assert sorted(_steps(tel)) == [0, 1]
    assert _late(tel) == 1  # no step ended after it
