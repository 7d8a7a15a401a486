"""The FLOP count (processing/flops.py) never fails a step: a higher-order operator run
at the counted step is counted, and an error inside the counting modes ends the count
(logged once) while the step goes on."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.utils.flop_counter as flop_counter
from otel_helpers import providers, step_spans

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

MM = 2 * 2 * 4 * 4  # FLOPs of a (2, 4) @ (4, 4) matmul


def steps_with_cond(n: int) -> tuple[InMemoryTelemetry, list[torch.Tensor], torch.Tensor]:
    """``n`` steps counted from the first, each a ``torch.cond`` (eager) and a linear
    layer's forward and backward: the telemetry, the conditional's results and what they
    should be."""
    tel = InMemoryTelemetry()
    otel_train.configure(trace_steps="all", console="off", flops_count_step=0, **providers(tel))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    w = torch.randn(4, 4)
    x = torch.ones(2, 4)
    outs = []
    for _ in range(n):
        with otel_train.step(samples=2):
            outs.append(torch.cond(x.sum() > 0, lambda x: x @ w, lambda x: (x @ w).neg(), (x,)))
            model(x).sum().backward()
    otel_train.shutdown()
    return tel, outs, x @ w


def step_attributes(tel: InMemoryTelemetry) -> list[dict[str, Any]]:
    return [dict(s.attributes) for s in step_spans(tel.spans())]


def test_a_cond_at_the_counted_step_runs_and_is_counted() -> None:
    tel, outs, expected = steps_with_cond(3)
    assert all(torch.equal(out, expected) for out in outs)
    steps = step_attributes(tel)
    assert len(steps) == 3 and steps[0][c.STEP_FLOPS_COUNTED.key] is True
    # torch's counter takes the larger branch of a cond; the linear layer's forward and
    # weight gradient (its input needs none)
    assert [s[c.STEP_FLOPS.key] for s in steps[1:]] == [3 * MM, 3 * MM]


def test_an_error_inside_the_counting_modes_ends_the_count_not_the_step(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("no formula today")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.mm, broken)
    tel, outs, expected = steps_with_cond(3)
    assert all(torch.equal(out, expected) for out in outs)
    steps = step_attributes(tel)
    assert len(steps) == 3
    assert all(c.STEP_FLOPS.key not in s and c.STEP_DATA_STALL.key in s for s in steps)
    assert sum("counting FLOPs failed" in r.getMessage() for r in caplog.records) == 1
