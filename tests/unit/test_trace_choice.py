"""Which steps become traces, end to end on a real loop: the FLOP-counting step is no
"slowest" step, each instrumentation's first step and each new step shape are traced."""

from __future__ import annotations

from typing import Any

import torch
from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

# One window for the whole run, by count and by time: only the rules under test trace.
ONE_WINDOW = {"trace_window": 1000, "trace_window_seconds": 3600.0, "console": "off"}


def _traced(tel: InMemoryTelemetry) -> dict[int, str]:
    """Step index -> why it was traced."""
    return {
        s.attributes[c.STEP_INDEX.key]: s.attributes[c.STEP_SAMPLED_BECAUSE.key]
        for s in tel.spans()
        if s.name == c.STEP_SPAN.name
    }


def test_the_flop_counting_step_is_never_the_slowest_of_its_window() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=96, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, flops="count", trace_window=10,
        trace_window_seconds=3600.0, trace_slowest=1, console="off", sidecar="off",
        **providers(tel),
    )  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    for _ in range(3):
        train_epoch(model, opt, loader)
    otel_train.shutdown()
    counted = [r.index for r in session.efficiency.count_results]
    assert counted, "the FLOP count ran"
    traced = _traced(tel)
    slowest = sorted(i for i, why in traced.items() if why == "slowest")
    assert counted[0] not in slowest
    # (its window still has a slowest step: another one)
    assert any(i < 10 for i in slowest), traced
    counted_spans = [s for s in tel.spans() if s.attributes.get(c.STEP_FLOPS_COUNTED.key) is True]
    assert all(s.attributes[c.STEP_SAMPLED_BECAUSE.key] != "slowest" for s in counted_spans)


def test_each_instrumentations_first_step_is_traced() -> None:
    """A second instrumentation in the same session (a second model and loop) gets its
    first step traced at once, not when the window closes."""
    tel = InMemoryTelemetry()
    kw: dict[str, Any] = {**ONE_WINDOW, "flops": "off", **providers(tel)}
    model, opt = tiny_model()
    loader = tiny_loader(n=40, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **kw)
    train_epoch(model, opt, loader)
    model2, opt2 = tiny_model()
    loader2 = tiny_loader(n=40, batch_size=8)
    inst2 = otel_train.instrument(model2, optimizer=opt2, dataloader=loader2, **kw)
    train_epoch(model2, opt2, loader2)
    inst2.uninstrument()  # the same loop instrumented again resumes it: no new first step
    otel_train.instrument(model2, optimizer=opt2, dataloader=loader2, **kw)
    train_epoch(model2, opt2, loader2)
    assert otel_train.flush(10.0)
    traced = _traced(tel)
    otel_train.shutdown()
    assert traced.get(0) == "first"
    assert traced.get(5) == "first", traced  # the second loop's first step (5 per epoch)
    assert 10 not in traced, traced


def test_the_first_step_of_a_new_step_shape_is_traced() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=80, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, flops="off", **ONE_WINDOW, **providers(tel)
    )
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if i in (6, 7):  # a phase the other steps do not have
            with otel_train.phase("clip"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    assert otel_train.flush(10.0)
    traced = _traced(tel)
    otel_train.shutdown()
    assert traced.get(0) == "first"
    assert traced.get(6) == "shape", traced
    assert 7 not in traced  # the same shape again
    assert 3 not in traced  # the plain shape was the first step's
