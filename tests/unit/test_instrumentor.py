"""The opentelemetry_instrumentor entry point in-process: OtelTrainInstrumentor finds a
plain loop through torch's process-wide hooks, stands aside for an explicit
instrument(), and uninstrument() restores torch exactly. (tests/e2e/test_zero_code.py
runs the examples under the real `opentelemetry-instrument` into a real Collector.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest
import torch
from otel_helpers import step_spans, tiny_loader, tiny_model, train_epoch
from required import DISTRO_SWITCH, missing
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer
from torch.utils.data import dataloader as torch_dataloader

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

try:
    import opentelemetry.instrumentation  # noqa: F401  (opentelemetry-distro brings it)
except ImportError:
    missing(
        DISTRO_SWITCH, "opentelemetry-distro (pip install 'otel-train[auto]')", module_level=True
    )
from otel_train.instrumentor import ENTRY_POINT, OtelTrainInstrumentor


def torch_state() -> dict[str, Any]:
    """What the instrumentor may change in torch, as identities and sizes."""
    return {
        "next": torch_dataloader._BaseDataLoaderIter.__dict__["__next__"],
        "backward": torch.autograd.backward,
        "optimizer_init": torch.optim.Optimizer.__dict__["__init__"],
        "pre_step": dict(torch_optimizer._global_optimizer_pre_hooks),
        "post_step": dict(torch_optimizer._global_optimizer_post_hooks),
        "forward_pre": dict(torch_module._global_forward_pre_hooks),
    }


@pytest.fixture
def tel() -> Iterator[InMemoryTelemetry]:
    tel = InMemoryTelemetry()
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    try:
        yield tel
    finally:
        if inst.is_instrumented_by_opentelemetry:
            inst.uninstrument()


def settings(tel: InMemoryTelemetry) -> dict[str, Any]:
    return {"tracer_provider": tel.tracer_provider, "meter_provider": tel.meter_provider,
            "trace_steps": "all", "console": "off"}  # fmt: skip


def configure(tel: InMemoryTelemetry) -> None:
    otel_train.configure(**settings(tel))


def phase_counts(spans: list[Any]) -> Counter[str]:
    return Counter(s.name for s in spans if s.name != c.STEP_SPAN.name)


def test_the_entry_point_names_the_instrumentor() -> None:
    (ep,) = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == ENTRY_POINT]
    assert ep.load() is OtelTrainInstrumentor
    assert OtelTrainInstrumentor().instrumentation_dependencies() == ("torch >= 2.4",)


def test_a_plain_loop_is_found_without_a_handle_on_it(tel: InMemoryTelemetry) -> None:
    configure(tel)
    model, opt = tiny_model()
    train_epoch(model, opt, tiny_loader(n=32, batch_size=8))  # 4 batches
    spans = tel.spans()
    steps = step_spans(spans)
    assert len(steps) == 4
    assert [s.attributes[c.STEP_SAMPLES.key] for s in steps] == [8, 8, 8, 8]
    assert phase_counts(spans) == {"data": 4, "forward": 4, "backward": 4, "optimizer": 4}
    (steps_total,) = tel.points(c.STEPS.name)
    assert steps_total.value == 4


def test_evaluation_under_no_grad_is_not_a_step(tel: InMemoryTelemetry) -> None:
    configure(tel)
    model, opt = tiny_model()
    train_epoch(model, opt, tiny_loader(n=16, batch_size=8))
    model.eval()
    with torch.no_grad():
        for x, _ in tiny_loader(n=16, batch_size=8):
            model(x)
    model.train()
    train_epoch(model, opt, tiny_loader(n=16, batch_size=8))
    spans = tel.spans()
    assert len(step_spans(spans)) == 4
    assert phase_counts(spans) == {"data": 4, "forward": 4, "backward": 4, "optimizer": 4}


def test_gradient_accumulation_times_each_micro_batch(tel: InMemoryTelemetry) -> None:
    configure(tel)
    model, opt = tiny_model()
    for i, (x, y) in enumerate(tiny_loader(n=32, batch_size=8)):
        torch.nn.functional.mse_loss(model(x), y).backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
    spans = tel.spans()
    assert len(step_spans(spans)) == 2
    assert phase_counts(spans) == {"data": 4, "forward": 4, "backward": 4, "optimizer": 2}


def test_an_explicit_instrument_is_the_one_instrumentation(tel: InMemoryTelemetry) -> None:
    model, opt = tiny_model()
    loader = tiny_loader(n=32, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, **settings(tel))
    train_epoch(model, opt, loader)
    spans = tel.spans()
    assert len(step_spans(spans)) == 4
    assert phase_counts(spans) == {"data": 4, "forward": 4, "backward": 4, "optimizer": 4}


def test_after_shutdown_the_hooks_start_nothing(tel: InMemoryTelemetry) -> None:
    configure(tel)
    model, opt = tiny_model()
    train_epoch(model, opt, tiny_loader(n=16, batch_size=8))
    assert len(step_spans(tel.spans())) == 2
    otel_train.shutdown()
    train_epoch(model, opt, tiny_loader(n=16, batch_size=8))
    assert otel_train.session.current() is None
    assert len(step_spans(tel.spans())) == 2


def test_uninstrument_restores_torch_exactly() -> None:
    before = torch_state()
    tel = InMemoryTelemetry()
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    during = torch_state()
    assert during["next"] is not before["next"]
    assert len(during["pre_step"]) == len(before["pre_step"]) + 1
    assert len(during["post_step"]) == len(before["post_step"]) + 1
    assert len(during["forward_pre"]) == len(before["forward_pre"]) + 1  # armed
    configure(tel)
    model, opt = tiny_model()
    train_epoch(model, opt, tiny_loader(n=16, batch_size=8))  # backward wrapped meanwhile
    assert len(step_spans(tel.spans())) == 2
    inst.uninstrument()
    assert torch_state() == before
    train_epoch(model, opt, tiny_loader(n=16, batch_size=8))
    assert len(step_spans(tel.spans())) == 2  # nothing more recorded


def test_a_trainer_class_is_wrapped_and_restored() -> None:
    transformers = pytest.importorskip("transformers")
    trainer_cls = transformers.Trainer
    original = trainer_cls.__dict__["train"]
    inst = OtelTrainInstrumentor()
    inst.instrument()
    try:
        assert trainer_cls.__dict__["train"] is not original
        assert trainer_cls.__dict__["train"].__wrapped__ is original
    finally:
        inst.uninstrument()
    assert trainer_cls.__dict__["train"] is original
