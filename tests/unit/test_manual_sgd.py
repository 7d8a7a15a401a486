"""A loop with no torch.optim optimizer (word_language_model's manual SGD, issue 38 item
9): each training forward after a backward begins a step, in the plain-loop adapter and
under zero-code instrumentation, said once at run time and in the run summary."""

from __future__ import annotations

import pytest
import torch
from otel_helpers import providers, step_spans, tiny_model
from word_lm import RNNModel, batchify, train

import otel_train
from otel_train.instrumentor import OtelTrainInstrumentor
from otel_train.testing import InMemoryTelemetry

ITERATIONS = 6


def check(tel: InMemoryTelemetry, ran: int, caplog: pytest.LogCaptureFixture, out: str) -> None:
    steps = step_spans(tel.spans())
    assert ran == ITERATIONS
    assert len(steps) == ITERATIONS
    said = [r for r in caplog.records if "no torch.optim optimizer" in r.getMessage()]
    assert len(said) == 1
    assert "otel_train.step()" in said[0].getMessage()
    summary = out.split("run summary:")[1]
    assert "no torch.optim optimizer stepped" in summary


def test_manual_sgd_steps_in_the_plain_loop(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    tel = InMemoryTelemetry()
    model = RNNModel()
    otel_train.instrument(model, console="stdout", console_every=0, trace_steps="all",
                          **providers(tel))  # fmt: skip
    ran = train(model, batchify(ITERATIONS))
    otel_train.shutdown()
    check(tel, ran, caplog, capsys.readouterr().out)


def test_manual_sgd_steps_under_zero_code(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    tel = InMemoryTelemetry()
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    try:
        otel_train.configure(console="stdout", console_every=0, trace_steps="all",
                             **providers(tel))  # fmt: skip
        ran = train(RNNModel(), batchify(ITERATIONS))
        otel_train.shutdown()
    finally:
        inst.uninstrument()
    check(tel, ran, caplog, capsys.readouterr().out)


def test_an_optimizer_made_before_zero_code_still_ends_the_steps(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gradient accumulation (2 backwards a step) with an optimizer the process-wide hooks
    did not see made: from its first step on, its steps end the steps, and the summary
    says nothing of a loop without one (the run-time warning was said at the split)."""
    model, opt = tiny_model()
    tel = InMemoryTelemetry()
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    try:
        otel_train.configure(console="stdout", console_every=0, trace_steps="all",
                             **providers(tel))  # fmt: skip
        for _ in range(3):
            for _ in range(2):
                model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        otel_train.shutdown()
    finally:
        inst.uninstrument()
    steps = step_spans(tel.spans())
    # (the first step: its two micro-batches split before the optimizer was seen)
    assert len(steps) == 4
    assert "no torch.optim optimizer stepped" not in capsys.readouterr().out
