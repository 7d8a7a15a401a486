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


def test_grouped_matmuls_are_counted() -> None:
    """Issue 38 item 16: ``aten._grouped_mm`` (mixture-of-experts layers) counted 0."""
    from otel_train.processing.flops import count_flops

    groups, rows, k, n = 2, 6, 8, 16
    a = torch.randn(rows, k, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(groups, k, n, dtype=torch.bfloat16, requires_grad=True)
    offsets = torch.tensor([2, rows], dtype=torch.int32)  # group 0: rows 0-1, group 1: 2-5

    def forward_backward() -> None:
        torch._grouped_mm(a, b, offsets).float().sum().backward()

    flops, dtype, _ = count_flops(forward_backward)
    # Each row meets one group's (k, n) matrix: forward, input gradient, weight gradient.
    assert flops == 3 * 2 * rows * k * n
    assert dtype == "bf16"


def test_attention_without_a_flop_formula_is_said_in_the_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38 item 16: the CPU's attention kernels had no FLOP formula in older torch (the
    count was 0.86x nanoGPT's own); attention that runs uncounted is said in the summary.
    Here the formulas are taken out of this torch's registry to be that torch."""
    aten = torch.ops.aten
    for op in (aten._scaled_dot_product_flash_attention_for_cpu,
               aten._scaled_dot_product_flash_attention_for_cpu_backward):  # fmt: skip
        monkeypatch.delitem(flop_counter.flop_registry, op)
    otel_train.configure(console="stderr", console_every=0, flops_count_step=0,
                         **providers(InMemoryTelemetry()))  # fmt: skip
    proj = torch.nn.Linear(8, 8)
    x = torch.randn(2, 4, 8)
    for _ in range(2):
        with otel_train.step(samples=2):
            q = proj(x).view(2, 1, 4, 8)
            torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    otel_train.shutdown()
    text = capsys.readouterr().err
    assert "attention ran uncounted (_scaled_dot_product_flash_attention_for_cpu" in text
