"""GradScaler's skipped optimizer steps (adapters/scaler.py): an iteration whose
gradients overflow runs no optimizer step, and is a step of its own all the same, in the
plain-loop adapter and under zero-code instrumentation."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from otel_helpers import children_of, providers, step_spans, tiny_loader, tiny_model

import otel_train
from otel_train import contract as c
from otel_train.adapters import scaler
from otel_train.instrumentor import OtelTrainInstrumentor
from otel_train.testing import InMemoryTelemetry

ITERATIONS = 6
OVERFLOW = (1, 2, 4)  # iterations whose loss is inf: the scaler skips their step


@pytest.fixture(autouse=True)
def unsaid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The skip is said once a process: here once a test."""
    monkeypatch.setattr(scaler, "_skipped_said", [])


def scaled_loop(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: Any) -> list[float]:
    """A loop with a GradScaler (on the CPU): the scale after each iteration."""
    scaler = torch.amp.GradScaler("cpu")
    scales = []
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if i in OVERFLOW:
            loss = loss * float("inf")
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def check_steps(tel: InMemoryTelemetry, scales: list[float]) -> None:
    assert [b < a for a, b in zip([65536.0, *scales], scales, strict=False)] == [
        i in OVERFLOW for i in range(ITERATIONS)
    ]  # (the scaler did skip those, and only those)
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == ITERATIONS
    for i, step in enumerate(steps):
        assert step.attributes[c.STEP_SAMPLES.key] == 8
        names = [p.name for p in children_of(spans, step)]
        skipped = i in OVERFLOW
        assert names == ["data", "forward", "backward"] + ([] if skipped else ["optimizer"])


def test_skipped_optimizer_steps_are_steps_in_the_plain_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=8 * ITERATIONS)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", **providers(tel))  # fmt: skip
    scales = scaled_loop(model, opt, loader)
    otel_train.shutdown()
    check_steps(tel, scales)
    assert sum("GradScaler skipped" in r.getMessage() for r in caplog.records) == 1


def test_skipped_optimizer_steps_are_steps_under_zero_code() -> None:
    tel = InMemoryTelemetry()
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    try:
        otel_train.configure(console="off", trace_steps="all", **providers(tel))
        model, opt = tiny_model()
        scales = scaled_loop(model, opt, tiny_loader(n=8 * ITERATIONS))
        otel_train.shutdown()
    finally:
        inst.uninstrument()
    check_steps(tel, scales)


def test_a_step_of_another_optimizer_is_no_skip(caplog: pytest.LogCaptureFixture) -> None:
    """One scaler, two optimizers (a GAN's), the adapter watching one: the other's taken
    step neither ends a step nor is said to be skipped."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    critic = torch.nn.Linear(8, 1)
    critic_opt = torch.optim.SGD(critic.parameters(), lr=0.01)
    loader = tiny_loader(n=8 * ITERATIONS)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console="off",
                          trace_steps="all", **providers(tel))  # fmt: skip
    grad_scaler = torch.amp.GradScaler("cpu")
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y) + critic(x).mean()
        opt.zero_grad()
        critic_opt.zero_grad()
        grad_scaler.scale(loss).backward()
        grad_scaler.step(critic_opt)
        grad_scaler.step(opt)
        grad_scaler.update()
    otel_train.shutdown()
    assert len(step_spans(tel.spans())) == ITERATIONS
    assert not [r for r in caplog.records if "GradScaler skipped" in r.getMessage()]
