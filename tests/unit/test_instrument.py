"""instrument() / uninstrument(): what is supported, double instrumenting, exact restoration,
and CPU-only runs carrying no device attributes."""

from __future__ import annotations

import copy
import io
import logging
import types

import pytest
import torch
from otel_helpers import (
    attached,
    children_of,
    providers,
    step_spans,
    tiny_loader,
    tiny_model,
    train_epoch,
)

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

QUIET = {"console": "off", "trace_steps": "all"}


@pytest.mark.parametrize("target", [object(), 42, "model", [torch.nn.Linear(2, 2)], None])
def test_unsupported_target_raises_type_error_listing_what_is_supported(target: object) -> None:
    tel = InMemoryTelemetry()
    with pytest.raises(TypeError) as raised:
        otel_train.instrument(target, **providers(tel))
    message = str(raised.value)
    assert "does not support" in message
    assert type(target).__qualname__ in message
    assert "torch.nn.Module" in message
    assert "phases=" in message
    assert otel_train.session.current() is None  # nothing was started


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"optimizer": "sgd"}, "optimizer= must be a torch.optim.Optimizer"),
        ({"dataloader": [1, 2]}, "dataloader= must be a torch.utils.data.DataLoader"),
        ({"count_batch": 3}, "count_batch= must be callable"),
    ],
)
def test_bad_companions_raise_type_error_before_any_change(kwargs: dict, fragment: str) -> None:
    model = torch.nn.Linear(2, 2)
    backward = torch.autograd.backward
    with pytest.raises(TypeError, match=fragment):
        otel_train.instrument(model, **kwargs)
    assert not attached(model)
    assert torch.autograd.backward is backward


def test_step_without_phases_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="step= needs phases="):
        otel_train.instrument(object(), step="run")


def test_double_instrument_returns_the_same_handle_with_a_warning() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    first = otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    timed = model.forward
    with pytest.warns(RuntimeWarning, match="already instrumented"):
        second = otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    assert second is first
    assert model.forward == timed  # not wrapped twice (a bound method each look-up)
    loss = model(torch.randn(3, 8)).sum()
    loss.backward()
    opt.step()
    otel_train.shutdown()
    spans = tel.spans()
    (s,) = step_spans(spans)
    assert [k.name for k in children_of(spans, s)] == ["forward", "backward", "optimizer"]


def test_instrument_again_after_uninstrument_gives_a_new_handle() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    first = otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    first.uninstrument()
    assert not first.active
    second = otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    assert second is not first and second.active


def test_other_settings_on_a_live_session_are_a_config_error() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    with pytest.raises(otel_train.ConfigError, match="already configured"):
        otel_train.instrument(torch.nn.Linear(2, 2), console_every=7, **providers(tel))


def _hook_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {
        "forward_attr": vars(model).get("forward"),
        "forward_pre": dict(model._forward_pre_hooks),
        "forward_pre_kwargs": dict(model._forward_pre_hooks_with_kwargs),
        "forward": dict(model._forward_hooks),
        "backward": dict(model._backward_hooks),
        "opt_pre": dict(opt._optimizer_step_pre_hooks),
        "opt_post": dict(opt._optimizer_step_post_hooks),
    }


def test_uninstrument_restores_the_plain_loop_exactly() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    user_hook = model.register_forward_pre_hook(lambda m, a: None)  # must survive untouched
    loader = tiny_loader()
    before = _hook_state(model, opt)
    loader_cls = type(loader)
    backward = torch.autograd.backward
    loader_dict = dict(vars(loader))

    inst = otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    assert _hook_state(model, opt) != before  # it did change something
    assert torch.autograd.backward is not backward
    assert type(loader) is not loader_cls
    train_epoch(model, opt, loader)
    inst.uninstrument()

    assert _hook_state(model, opt) == before
    assert type(loader) is loader_cls
    assert torch.autograd.backward is backward
    assert dict(vars(loader)) == loader_dict
    assert not inst.active
    inst.uninstrument()  # idempotent
    user_hook.remove()

    # After uninstrumenting, training produces no telemetry at all: only the first epoch's
    # 4 steps (each a step span and 4 phases) arrive.
    train_epoch(model, opt, loader)
    otel_train.shutdown()
    assert len(tel.spans()) == 4 * 5
    assert len(step_spans(tel.spans())) == 4


def test_handle_is_a_context_manager() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    before = _hook_state(model, opt)
    backward = torch.autograd.backward
    with otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel)) as inst:
        assert inst.active
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    assert not inst.active
    assert _hook_state(model, opt) == before
    assert torch.autograd.backward is backward


def test_shutdown_uninstruments_everything() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader()
    before = _hook_state(model, opt)
    backward, loader_cls = torch.autograd.backward, type(loader)
    inst = otel_train.instrument(model, optimizer=opt, dataloader=loader, **QUIET, **providers(tel))
    assert otel_train.shutdown()
    assert not inst.active
    assert _hook_state(model, opt) == before
    assert torch.autograd.backward is backward
    assert type(loader) is loader_cls


class Loop:
    def generate(self) -> str:
        return "rollout"

    async def train_step(self) -> str:
        return "trained"

    def run_iteration(self) -> str:
        return self.generate()


def test_uninstrument_restores_the_method_map_instance_dict_exactly() -> None:
    tel = InMemoryTelemetry()
    loop = Loop()
    loop.generate = loop.generate  # an instance attribute that existed before: kept as is
    before = dict(vars(loop))
    inst = otel_train.instrument(
        loop,
        phases={"rollout": "generate", "train": "train_step"},
        step="run_iteration",
        **QUIET,
        **providers(tel),
    )
    assert set(vars(loop)) == {"generate", "train_step", "run_iteration"}
    assert vars(loop)["generate"] is not before["generate"]
    assert loop.run_iteration() == "rollout"
    import asyncio

    assert asyncio.run(loop.train_step()) == "trained"  # async methods stay async
    inst.uninstrument()
    assert vars(loop) == before
    assert vars(loop)["generate"] is before["generate"]
    assert type(loop).train_step is Loop.train_step


def test_two_handles_uninstrument_independently() -> None:
    tel = InMemoryTelemetry()
    model_a, opt_a = tiny_model()
    model_b, opt_b = tiny_model()
    backward = torch.autograd.backward
    a = otel_train.instrument(model_a, optimizer=opt_a, **QUIET, **providers(tel))
    b = otel_train.instrument(model_b, optimizer=opt_b, **QUIET, **providers(tel))
    a.uninstrument()
    assert not attached(model_a)
    assert attached(model_b)
    assert torch.autograd.backward is not backward  # b still needs the backward patch
    b.uninstrument()
    assert torch.autograd.backward is backward


DEVICE_KEYS = {
    c.PHASE_DEVICE_DURATION.key,
    c.PHASE_PEAK_ALLOCATED.key,
    c.PHASE_PEAK_RESERVED.key,
    c.PHASE_PEAK_UTILIZATION.key,
    c.PHASE_ALLOC_RETRIES.key,
    c.PHASE_OOMS.key,
    c.STEP_DEVICE_DURATION.key,
}
CUDA_ONLY_METRICS = {
    c.PHASE_MEMORY_PEAK.name,
    c.DEVICE_MEMORY_LIMIT.name,
}


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(
            {},
            marks=pytest.mark.skipif(
                torch.cuda.is_available(), reason="CPU-only machine behaviour"
            ),
        ),
        {"device_timing": "off"},
    ],
    ids=["cpu-only", "device-timing-off"],
)
def test_without_cuda_device_attributes_are_absent_not_zero(settings: dict) -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    loader = tiny_loader()
    otel_train.instrument(
        model, optimizer=opt, dataloader=loader, **QUIET, **settings, **providers(tel)
    )
    train_epoch(model, opt, loader)
    otel_train.shutdown()
    spans = tel.spans()
    assert len(spans) == 4 * 5
    for span in spans:
        assert not DEVICE_KEYS & set(span.attributes), span.name
        assert not [e for e in span.events if e.name == c.OOM_EVENT]
        if span.name != c.STEP_SPAN.name:
            assert span.attributes[c.PHASE_CLOCK.key] == "host"
    collected = tel.metrics()
    assert not CUDA_ONLY_METRICS & set(collected)
    for p in tel.points(c.PHASE_DURATION.name):
        assert p.attributes[c.A_CLOCK] == "host"


def test_copies_of_an_instrumented_model_work_and_are_not_instrumented() -> None:
    """deepcopy (an EMA model) and pickling (torch.save of a whole model) of an instrumented
    model and optimizer: the copies compute with their own weights and record nothing."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    ema = copy.deepcopy(model)
    opt_copy = copy.deepcopy(opt)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    x = torch.randn(3, 8)
    with torch.no_grad():  # (the original's forward opens no step without grad)
        for p in ema.parameters():
            p.add_(1.0)  # the copy's own weights, not the original's
        assert not torch.equal(ema(x), model(x))
        assert torch.equal(loaded(x), model(x))
    for m in (ema, loaded):
        m(x).sum().backward()
    opt_copy.step()
    otel_train.shutdown()
    assert step_spans(tel.spans()) == []


def test_a_forward_wrapped_before_instrument_stays_in_copies_and_after_uninstrument() -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()

    def doubled(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return type(self).forward(self, x) * 2

    model.forward = types.MethodType(doubled, model)  # a user's (or library's) wrapper
    inst = otel_train.instrument(model, optimizer=opt, **QUIET, **providers(tel))
    x = torch.randn(3, 8)
    with torch.no_grad():
        plain = torch.nn.Sequential.forward(model, x)
        ema = copy.deepcopy(model)
        assert torch.equal(model(x), plain * 2) and torch.equal(ema(x), plain * 2)
        for p in ema.parameters():
            p.add_(1.0)
        assert not torch.equal(ema(x), model(x))  # the wrapper runs on the copy's weights
    inst.uninstrument()
    assert vars(model)["forward"].__func__ is doubled
    otel_train.shutdown()


def test_equal_values_on_a_live_session_are_no_conflict() -> None:
    """configure() then instrument() with the same value of a setting: one session."""
    tel = InMemoryTelemetry()
    sess = otel_train.configure(
        service_name="gan", console_every=5, console="off", **providers(tel)
    )
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, console_every=5, **providers(tel))
    assert otel_train.session.current() is sess


def test_bare_calls_after_shutdown_start_nothing_and_warn_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, console="off", **providers(tel))
    otel_train.shutdown()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        otel_train.record(loss=1.0)
        with otel_train.step(samples=1), otel_train.phase("train"):
            pass
        with otel_train.region("evaluation"):
            pass
    assert otel_train.session.current() is None  # nothing started: no /metrics bound
    warned = [r for r in caplog.records if "after otel_train.shutdown()" in r.getMessage()]
    assert len(warned) == 1
    with pytest.raises(ValueError, match="kind must be one of"):
        otel_train.region("eval")  # a bad kind is still an error
    # An explicit start records again, and bare calls join it.
    otel_train.configure(console="off", **providers(tel))
    with otel_train.step(samples=2):
        pass
    assert otel_train.session.current() is not None
    assert otel_train.flush(5.0)
