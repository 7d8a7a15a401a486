"""Phases on a thread's stack (recording/phases.py): a blocking collective with no step
open (an evaluation's reductions, a logged ``all_reduce(loss)`` after the optimizer's
step) is no step and changes none; inside a step it is a phase of that step."""

from __future__ import annotations

from typing import Any

import torch
from otel_helpers import (
    children_of,
    providers,
    single_rank_group,
    step_spans,
    tiny_loader,
    tiny_model,
)

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

STEPS = 4
WAIT = "all_reduce"  # (a collective's span: the op as torch names it)
PHASES = ["data", "forward", "backward", "optimizer"]


def train_with_reductions(dist: Any, tel: InMemoryTelemetry) -> None:
    """A DDP-shaped loop: a reduction of the gradient inside each step, the loss reduced
    for logging after the optimizer's step, and an evaluation of 5 reductions at the end."""
    model, opt = tiny_model()
    loader = tiny_loader(n=8 * STEPS)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", **providers(tel))  # fmt: skip
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        dist.all_reduce(model[0].weight.grad)  # (inside the step: a phase of it)
        opt.step()
        dist.all_reduce(loss.detach())  # logged: after the step closed
    with torch.no_grad():
        for _ in range(5):
            dist.all_reduce(model(torch.ones(2, 8)))
    otel_train.shutdown()


def test_collectives_outside_steps_are_no_steps() -> None:
    tel = InMemoryTelemetry()
    with single_rank_group() as dist:
        train_with_reductions(dist, tel)
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == STEPS
    for step in steps:
        assert step.attributes[c.STEP_SAMPLES.key] == 8
        phases = children_of(spans, step)
        assert phases[0].name == "data" and phases[0].start_time == step.start_time
        # (a wait under 1 ms is its parent's attribute, not a span: processing/spans.py)
        assert [p.name for p in phases if p.name != WAIT] == PHASES
    # The reductions inside the steps are their phases; no other is timed.
    (waits,) = tel.points(c.COLLECTIVE_DURATION.name)
    assert waits.count == STEPS
