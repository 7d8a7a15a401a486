"""``otel_train.flush()``: every finished step reaches the providers at once, without
waiting for the worker's next batch (it works every 0.5 s)."""

from __future__ import annotations

from otel_helpers import providers, tiny_loader, tiny_model, train_epoch

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry


def test_flush_makes_every_finished_step_visible() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=48, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, console="off", trace_steps="all", **providers(tel)
    )
    try:
        train_epoch(model, opt, loader)  # 6 steps; the worker has not taken them yet
        assert otel_train.flush(timeout=5.0) is True
        steps = tel.points(c.STEPS.name)
        assert steps and steps[0].value == 6
        traced = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
        assert len(traced) == 6
    finally:
        otel_train.shutdown()


def test_flush_without_a_session_is_a_no_op() -> None:
    assert otel_train.session.current() is None
    assert otel_train.flush(timeout=0.1) is True


def test_the_testing_helpers_read_every_finished_step() -> None:
    """``InMemoryTelemetry.spans()``/``metrics()`` right after training hold every step,
    without a shutdown or a wait for the worker's next batch."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=40, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, trace_steps="all", console="off",
        **providers(tel),
    )  # fmt: skip
    train_epoch(model, opt, loader)
    steps = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    counted = sum(p.value for p in tel.points(c.STEPS.name))
    assert len(steps) == 5 and counted == 5
