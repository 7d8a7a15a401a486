"""Deferred adapter boundaries (CPU): hooks only log; the state machine replays the log.

The replay must give exactly what applying each boundary at once gives (the path
taken with CUDA), keep the order of boundaries against explicit phases, and never let
the log grow past its bound when the worker does not drain it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
from otel_helpers import (
    children_of,
    providers,
    step_spans,
    tiny_loader,
    tiny_model,
    train_epoch,
    value,
)

import otel_train
from otel_train import contract as c
from otel_train.recording.recorder import MAX_LOG
from otel_train.testing import InMemoryTelemetry

QUIET = {"console": "off", "trace_steps": "all"}


def _trees(defer: bool, epochs: int = 2) -> list[tuple[Any, ...]]:
    """Each step as (index, samples, [child phase names]) from a real instrumented loop."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=40, batch_size=8)
    # (no FLOP count: a count due switches the recorder to immediate boundaries itself)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, flops="off", **QUIET, **providers(tel)
    )
    session = otel_train.session.current()
    assert session is not None
    assert session.recorder._defer  # CPU, nothing that needs the boundary itself
    session.recorder._defer = defer
    for _ in range(epochs):
        train_epoch(model, opt, loader)
        # gradient accumulation and a backward outside any step (an evaluation's)
        with torch.no_grad():
            model(torch.randn(2, 8))
        loss = model(torch.randn(2, 8)).sum()
        loss.backward()
    otel_train.shutdown()
    spans = tel.spans()
    return [
        (
            s.attributes[c.STEP_INDEX.key],
            s.attributes.get(c.STEP_SAMPLES.key),
            [k.name for k in children_of(spans, s)],
        )
        for s in step_spans(spans)
    ]


def test_replayed_log_gives_the_same_steps_as_immediate_recording() -> None:
    deferred = _trees(defer=True)
    immediate = _trees(defer=False)
    assert deferred == immediate
    assert len(deferred) == 10 + 1  # 5 batches x 2 epochs, and the stray forward's step
    assert deferred[0][1] == 8
    assert deferred[0][2] == ["data", "forward", "backward", "optimizer"]


def test_explicit_phase_between_logged_boundaries_keeps_its_place() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=16, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        with otel_train.phase("clip"):  # applied at once: the log before it is settled first
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 2
    for s in steps:
        assert [k.name for k in children_of(spans, s)] == [
            "data", "forward", "backward", "clip", "optimizer"
        ]  # fmt: skip


def test_log_stays_bounded_when_the_worker_does_not_drain_it() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=8, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, sidecar="off",
                          **providers(tel))  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    worker, rec = session.worker, session.recorder
    # Stop the worker thread: only the training thread may settle the log now.
    worker._stop.set()
    assert worker._thread is not None
    worker._thread.join(5)
    assert not worker._thread.is_alive()
    longest = 0
    steps = MAX_LOG // 7 + 50  # seven boundaries and one count per step
    for _ in range(steps):
        train_epoch(model, opt, loader)
        longest = max(longest, len(rec._log))
    assert longest <= MAX_LOG + 1
    assert len(rec.pending) == min(steps, rec.max_pending)  # nothing lost to the bound
    otel_train.shutdown()


def test_boundaries_from_another_thread_replay_on_that_threads_stack() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=16, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            train_epoch(model, opt, loader)
        except BaseException as err:  # surfaced by the assertion below
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    train_epoch(model, opt, loader)  # the main thread's own stack starts empty
    otel_train.shutdown()
    assert not errors
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 4
    for s in steps:
        assert [k.name for k in children_of(spans, s)] == [
            "data", "forward", "backward", "optimizer"
        ]  # fmt: skip


class _Loop:
    """An RL-shaped loop whose methods are the phases and whose iteration is the step."""

    def rollout(self) -> int:
        with otel_train.phase("sample"):  # an explicit phase inside a mapped one
            return 3

    def train(self, n: int) -> int:
        if n == 2:
            raise ValueError("bad batch")
        return n

    def iteration(self, n: int) -> None:
        self.rollout()
        with contextlib.suppress(ValueError):
            self.train(n)
        with otel_train.step(samples=99):  # nested step: neither opens nor ends one
            pass


def _explicit_trees(defer: bool) -> list[tuple[Any, ...]]:
    """Explicit steps, nested phases, a nested step, an error, bare-phase cycles and a
    method map, recorded with the log deferred or applied at once."""
    tel = InMemoryTelemetry()
    otel_train.configure(flops="off", **QUIET, **providers(tel))
    session = otel_train.session.current()
    assert session is not None
    session.recorder._defer = defer
    for i in range(3):
        with otel_train.step(samples=4, tokens=16), otel_train.phase("a"):
            with otel_train.phase("b"):
                pass
            try:
                with otel_train.phase("c"):
                    raise KeyError(i)
            except KeyError:
                pass
    for _ in range(2):  # bare phases: a step per cycle
        with otel_train.phase("x"):
            pass
        with otel_train.phase("y"):
            pass
    loop = _Loop()
    otel_train.instrument(loop, phases={"rollout": "rollout", "train": "train"}, step="iteration")
    for n in range(4):
        loop.iteration(n)
    otel_train.shutdown()
    spans = tel.spans()

    def tree(span: Any) -> tuple[Any, ...]:
        return (
            span.name,
            span.status.status_code.name,
            [e.name for e in span.events],
            [tree(k) for k in children_of(spans, span)],
        )

    return [
        (s.attributes.get(c.STEP_SAMPLES.key), s.attributes.get(c.STEP_TOKENS.key), tree(s))
        for s in step_spans(spans)
    ]


def test_replayed_log_of_explicit_steps_and_phases_is_immediate_recording() -> None:
    deferred = _explicit_trees(defer=True)
    assert deferred == _explicit_trees(defer=False)
    assert len(deferred) == 3 + 2 + 4
    samples, tokens, (_, _, _, kids) = deferred[0]
    assert (samples, tokens) == (4, 16)
    a = kids[0]
    assert [k[0] for k in a[3]] == ["b", "c"] and a[3][1][1] == "ERROR"
    rl = deferred[-2]  # the iteration whose train phase raised
    assert [k[0] for k in rl[2][3]] == ["rollout", "train"]
    assert rl[2][3][1][1] == "ERROR" and rl[0] is None  # the nested step's counts: ignored


def test_scalars_logged_inside_steps_reach_the_gauge_in_order() -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(flops="off", **QUIET, **providers(tel))
    session = otel_train.session.current()
    assert session is not None and session.recorder._defer
    for i in range(5):
        with otel_train.step(samples=1), otel_train.phase("train"):
            otel_train.record(loss=float(i), reward=torch.tensor(10.0 + i))
    otel_train.shutdown()
    assert value(tel, c.SCALAR.name, **{c.A_NAME: "loss"}) == 4.0
    assert value(tel, c.SCALAR.name, **{c.A_NAME: "reward"}) == 14.0
