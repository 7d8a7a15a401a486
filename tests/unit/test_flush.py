"""``otel_train.flush()``: every finished step reaches the providers at once, without
waiting for the worker's next batch (it works every 0.5 s)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider, MetricsTimeoutError
from opentelemetry.sdk.metrics.export import MetricReader
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


class _FailingReader(MetricReader):
    """An SDK metric reader whose flush times out, as a periodic reader's does when its
    export outlives the flush (the collector down): the SDK's meter provider then raises."""

    def _receive_metrics(self, metrics_data: Any, timeout_millis: float = 0, **kwargs: Any) -> None:
        pass

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        raise MetricsTimeoutError("Timed out while flushing metric readers")

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


@pytest.mark.parametrize("sidecar", ["auto", "off"])
def test_a_provider_whose_flush_fails_makes_flush_false_never_raise(sidecar: str) -> None:
    meter_provider = MeterProvider(metric_readers=[_FailingReader()])
    with pytest.raises(Exception, match="force_flush failed"):
        meter_provider.force_flush(1000)  # (what the SDK does with such a reader)
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader(n=16, batch_size=8)
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, console="off", sidecar=sidecar,
        tracer_provider=tel.tracer_provider, meter_provider=meter_provider,
    )  # fmt: skip
    try:
        train_epoch(model, opt, loader)
        assert otel_train.flush(timeout=2.0) is False
        assert [s.name for s in tel.spans()].count(c.STEP_SPAN.name) >= 1  # spans still went
    finally:
        otel_train.shutdown()
        meter_provider.shutdown()
