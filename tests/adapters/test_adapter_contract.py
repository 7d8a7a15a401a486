"""The contract every adapter keeps, run over each of them with a real trainer.

- attach/detach is idempotent: a second uninstrument() is a no-op, the target comes
  back exactly as it was, and it can be instrumented again;
- a second instrument() of the same target returns the same handle (with a
  RuntimeWarning) and adds nothing;
- an exception inside otel-train's hooks never reaches training;
- after uninstrument() no hook, callback, wrapper or patch remains, and training
  records nothing more.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import pytest
import torch
from adapter_helpers import (
    TitanWithNextBatch,
    hf_trainer,
    lightning_loader,
    lightning_module,
    lightning_trainer,
    step_spans,
    total,
)

import otel_train
from otel_train import contract as c
from otel_train.recording.recorder import Recorder

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def _module_hooks(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(len(getattr(m, h)) for h in _HOOK_DICTS)
            for name, m in module.named_modules()}  # fmt: skip


def _optimizer_hooks(opt: Any) -> tuple[int, int]:
    return len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks)


def _ours(value: Any) -> bool:
    module = getattr(value, "__module__", None) or type(value).__module__
    return module.startswith("otel_train") or hasattr(value, "__wrapped__")


def _patched_names(obj: Any) -> list[str]:
    return sorted(k for k, v in vars(obj).items() if callable(v) and _ours(v))


def _globals() -> dict[str, Any]:
    return {
        "autograd.backward": torch.autograd.backward.__module__,
        "global module hooks": (len(torch.nn.modules.module._global_forward_pre_hooks),
                                len(torch.nn.modules.module._global_forward_hooks)),
    }  # fmt: skip


class Rig:
    """One adapter's target, instrument() keywords, and a training run of `steps` steps."""

    kind = ""
    steps = 0
    target: Any
    kwargs: dict[str, Any]

    def train(self) -> int:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError


class TorchLoopRig(Rig):
    kind, steps = "torch-loop", 4

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.target = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 1))  # fmt: skip
        self.opt = torch.optim.SGD(self.target.parameters(), lr=0.01)
        data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
        self.loader = torch.utils.data.DataLoader(data, batch_size=8)
        self.kwargs = {"optimizer": self.opt, "dataloader": self.loader}

    def train(self) -> int:
        done = 0
        for x, y in self.loader:
            loss = torch.nn.functional.mse_loss(self.target(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            done += 1
        return done

    def state(self) -> dict[str, Any]:
        return {"model": _module_hooks(self.target), "optimizer": _optimizer_hooks(self.opt),
                "patched": _patched_names(self.target),
                "loader class": type(self.loader) is torch.utils.data.DataLoader,
                **_globals()}  # fmt: skip


class RLLoop:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.policy = torch.nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.policy.parameters(), lr=0.1)
        self.optimizer_steps = 0

    def generate(self) -> torch.Tensor:
        return torch.randn(8, 4)

    def train_step(self, obs: torch.Tensor) -> None:
        self.opt.zero_grad()
        self.policy(obs).pow(2).mean().backward()

    def optim_step(self) -> None:
        self.opt.step()
        self.optimizer_steps += 1

    def sync_weights(self) -> None:
        pass

    def run_iteration(self) -> None:
        self.train_step(self.generate())
        self.optim_step()
        self.sync_weights()


class MethodsRig(Rig):
    kind, steps = "methods", 3

    def __init__(self) -> None:
        self.target = RLLoop()
        self.kwargs = {"phases": {"rollout": "generate", "train": "train_step",
                                  "optimizer": "optim_step", "weight_sync": "sync_weights"},
                       "step": "run_iteration"}  # fmt: skip

    def train(self) -> int:
        start = self.target.optimizer_steps
        for _ in range(self.steps):
            self.target.run_iteration()
        return self.target.optimizer_steps - start

    def state(self) -> dict[str, Any]:
        return {"patched": _patched_names(self.target), "attrs": sorted(vars(self.target)),
                **_globals()}  # fmt: skip


class HFRig(Rig):
    kind, steps = "hf", 2

    def __init__(self) -> None:
        self.target = hf_trainer(grad_accum=2, max_steps=self.steps, batch_size=2)
        self.kwargs = {}  # the trainer owns its model, optimizer and data

    def train(self) -> int:
        return int(self.target.train().global_step)

    def state(self) -> dict[str, Any]:
        t = self.target
        return {"patched": _patched_names(t), "model": _module_hooks(t.model),
                "callbacks": [type(cb).__qualname__ for cb in t.callback_handler.callbacks],
                **_globals()}  # fmt: skip


class LightningRig(Rig):
    kind, steps = "lightning", 2

    def __init__(self) -> None:
        self.target = lightning_trainer()
        self.kwargs = {}  # the trainer owns its model, optimizer and data

    def train(self) -> int:
        before = self.target.global_step
        self.target.fit_loop.max_epochs = self.target.current_epoch + 1  # fit once more
        self.target.fit(lightning_module(), train_dataloaders=lightning_loader(n=8))
        return int(self.target.global_step - before)

    def state(self) -> dict[str, Any]:
        t = self.target
        return {
            "patched": _patched_names(t),
            "callbacks": [type(cb).__qualname__ for cb in t.callbacks],
            **_globals(),
        }


class TitanRig(Rig):
    kind, steps = "torchtitan", 2

    def __init__(self) -> None:
        self.target = TitanWithNextBatch(steps=self.steps, grad_accum=2)
        self.kwargs = {}  # the trainer owns its model, optimizer and data

    def train(self) -> int:
        self.target.step = 0
        self.target.train()
        return int(self.target.step)

    def state(self) -> dict[str, Any]:
        t = self.target
        return {"patched": _patched_names(t), "attrs": sorted(vars(t)),
                "model": _module_hooks(t.model_parts[0]),
                "optimizer": _optimizer_hooks(t.optimizers), **_globals()}  # fmt: skip


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


RIGS = [
    pytest.param(TorchLoopRig, id="torch-loop"),
    pytest.param(MethodsRig, id="methods"),
    pytest.param(HFRig, id="hf", marks=pytest.mark.skipif(
        not _available("transformers"), reason="needs the [hf] extra")),
    pytest.param(LightningRig, id="lightning", marks=pytest.mark.skipif(
        not _available("lightning"), reason="needs the [lightning] extra")),
    pytest.param(TitanRig, id="torchtitan-style"),
]  # fmt: skip


@pytest.fixture(params=RIGS)
def rig(request: pytest.FixtureRequest) -> Rig:
    return request.param()  # type: ignore[no-any-return]


def _recorded_steps(tel: Any) -> int:
    otel_train.shutdown()
    return len(step_spans(tel))


def test_attach_detach_is_idempotent(rig: Rig, tel, otel_kwargs) -> None:
    before = rig.state()
    inst = otel_train.instrument(rig.target, **rig.kwargs, **otel_kwargs)
    assert inst.kind == rig.kind
    attached = rig.state()
    assert attached != before
    inst.uninstrument()
    inst.uninstrument()  # a no-op
    assert rig.state() == before

    again = otel_train.instrument(rig.target, **rig.kwargs, **otel_kwargs)
    assert again is not inst
    assert rig.state() == attached
    assert rig.train() == rig.steps
    again.uninstrument()
    assert rig.state() == before
    assert _recorded_steps(tel) == rig.steps


def test_second_instrument_returns_the_same_handle(rig: Rig, otel_kwargs) -> None:
    first = otel_train.instrument(rig.target, **rig.kwargs, **otel_kwargs)
    attached = rig.state()
    with pytest.warns(RuntimeWarning, match="already instrumented"):
        second = otel_train.instrument(rig.target, **rig.kwargs, **otel_kwargs)
    assert second is first
    assert rig.state() == attached  # nothing attached twice


_RECORDER_METHODS = ("begin_step", "end_step", "enter", "exit", "exit_if_top", "add_counts",
                     "discard_step_if_only", "open_phase_names", "record_scalars",
                     "take_scalars")  # fmt: skip
_RECORDER_FIELDS = ("counted_transition",)  # (a recorder's own: see Recorder's docstring)


def test_an_exception_inside_a_hook_never_reaches_training(
    rig: Rig, otel_kwargs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    inst = otel_train.instrument(rig.target, **rig.kwargs, **otel_kwargs)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected telemetry failure")

    for name in _RECORDER_METHODS:
        monkeypatch.setattr(Recorder, name, broken)
    recorder = otel_train.session.current().recorder
    for name in _RECORDER_FIELDS:
        monkeypatch.setattr(recorder, name, broken)
    with caplog.at_level(logging.ERROR, logger="otel_train"):
        assert rig.train() == rig.steps  # training ran to the end, untouched
    assert any(
        "injected telemetry failure" in (r.exc_text or "")
        or (r.exc_info and "injected" in str(r.exc_info[1]))
        for r in caplog.records
    )
    monkeypatch.undo()
    inst.uninstrument()


def test_after_uninstrument_nothing_remains_and_nothing_is_recorded(
    rig: Rig, tel, otel_kwargs
) -> None:
    before = rig.state()
    inst = otel_train.instrument(rig.target, **rig.kwargs, **otel_kwargs)
    assert rig.train() == rig.steps
    inst.uninstrument()
    assert rig.state() == before
    assert rig.train() == rig.steps  # trains as before, unobserved
    assert _recorded_steps(tel) == rig.steps
    assert total(tel, c.STEPS.name) == rig.steps
