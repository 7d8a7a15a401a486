"""Hugging Face ``transformers.Trainer`` (and subclasses): ``instrument(trainer)``.

Usage::

    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    otel_train.instrument(trainer)
    trainer.train()

One ``otel_train.step`` span per optimizer step, with these phases:

- ``data``: ``Trainer.get_batch_samples``, which fetches every micro-batch of the step
  (and counts the loss items). Samples and tokens are counted from those batches:
  the ``attention_mask`` sum when it is on the CPU, else the ``input_ids`` size.
- ``forward``: from the model's forward pre-hook until backward starts (the loss
  computation belongs to forward).
- ``backward``: around ``torch.autograd.backward`` (where ``accelerator.backward`` ends).
- ``optimizer``: ``on_pre_optimizer_step`` to ``on_optimizer_step`` (``optimizer.step()``).

Gradient accumulation (``gradient_accumulation_steps > 1``) shows each micro-batch
as a ``microstep`` phase around one ``Trainer.training_step`` call, with its forward
and backward nested inside::

    otel_train.step ── data ── microstep ─┬─ forward
                               │          └─ backward
                               ├─ microstep ── forward, backward
                               └─ optimizer

Gradient clipping, the LR scheduler and ``zero_grad`` lie inside the step but in no
phase; logging, evaluation and checkpointing (after ``on_step_end``) lie between steps.
``Trainer.evaluate`` and ``Trainer._save_checkpoint`` are timed as the goodput
regions ``evaluation`` and ``checkpoint``.

What ``instrument()`` changes, all undone by ``uninstrument()``: one callback in
``trainer.callback_handler``, a forward pre-hook on ``trainer.model``, instance
attributes ``get_batch_samples``, ``training_step``, ``evaluate`` and ``_save_checkpoint``
wrapping the class's methods,
and the process-wide wrapper around ``torch.autograd.backward`` (``backward.py``)
shared with the plain-loop and torchtitan adapters. ``transformers`` is imported only
when a Trainer is instrumented.

Telemetry emitted: the ``otel_train.step`` trace and every metric in the contract, with
the scalars ``loss`` (what ``training_step`` returned; with gradient accumulation, the
last micro-batch's), ``learning_rate`` (the scheduler's at each optimizer step) and
``grad_norm`` (at logging steps, when the Trainer computed it), read without a device
sync; a name the user records (the logged loss from a callback, say) is left to the user
(Recorder.take_scalars).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch

from ..recording.recorder import ADAPTER, Recorder, boundary
from ..recording.values import add_count
from .backward import hold_backward
from .base import (
    Instrumentation,
    close_phases,
    guarded,
    mark_region,
    note_precision,
    patch_attribute,
)
from .batches import choose_counter
from .compiling import dynamo_compiling

EXTRA_HINT = "pip install 'otel-train[hf]'"
MIN_VERSION = "4.46"  # Trainer.get_batch_samples, on_pre_optimizer_step
_PHASES = ("backward", "forward", "microstep", "optimizer", "data")
_STEP_PHASES = ("backward", "forward", "microstep")

# The hooks' boundaries, made once (the recorder recognises a repeating step by them):
# each closes what a skipped hook left open of the adapter's own phases.
_FETCH = boundary(_PHASES, "data", begin=ADAPTER, end=ADAPTER)  # a step cut short ends
_FETCH_END = boundary("data", None)
_MICROSTEP = boundary(_STEP_PHASES, "microstep")
_MICROSTEP_END = boundary(_STEP_PHASES, None)  # (also the start without accumulation)
_FORWARD = boundary("forward", "forward")  # outside a step: nothing
_OPTIMIZER = boundary(_STEP_PHASES, "optimizer")
_OPTIMIZER_END = boundary("optimizer", None)
_STEP_END = boundary(_PHASES, None, end=ADAPTER)


def require() -> Any:
    """Import transformers, or raise an ImportError naming the extra to install."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "otel_train: instrumenting a Hugging Face Trainer needs transformers "
            f">={MIN_VERSION} and accelerate; install them with {EXTRA_HINT}"
        ) from err
    return transformers


def validate(trainer: Any, optimizer: Any, dataloader: Any) -> None:
    require()
    if optimizer is not None or dataloader is not None:
        raise TypeError(
            "otel_train.instrument(): a Hugging Face Trainer owns its optimizer and data; "
            "call instrument(trainer) without optimizer=/dataloader="
        )
    for name in ("get_batch_samples", "training_step", "add_callback"):
        if not callable(getattr(trainer, name, None)):
            raise TypeError(
                f"otel_train.instrument(): this Trainer has no {name}(); otel-train needs "
                f"transformers>={MIN_VERSION} ({EXTRA_HINT})"
            )


class HFTrainerAdapter:
    def __init__(
        self,
        inst: Instrumentation,
        trainer: Any,
        counter: Callable[[Any], tuple[int | None, int | None]] | None,
    ) -> None:
        self.inst = inst
        self.rec: Recorder = inst.session.recorder  # read by the backward wrapper
        self.trainer = trainer
        self.counter = choose_counter(inst, counter)
        self.active = True
        self.in_step = False
        self.compiled = False  # (read by the backward wrapper: its forwards run eagerly)
        self.accumulating = False
        self.hooked: Any = None
        self.hook_handle: Any = None

    # data -------------------------------------------------------------------------------

    def before_fetch(self) -> None:
        args = getattr(self.trainer, "args", None)
        self.accumulating = int(getattr(args, "gradient_accumulation_steps", 1) or 1) > 1
        self.rec.transition(_FETCH)  # (a step cut short, training stopped mid-accumulation)
        self.in_step = True

    def after_fetch(self, result: Any, err: BaseException | None) -> None:
        rec = self.rec
        if err is not None:
            close_phases(rec, ("data",), err)
            return
        batches = result[0] if isinstance(result, tuple) else result
        if not batches:
            rec.transition(_FETCH_END)
            rec.discard_step_if_only("data")
            self.in_step = False
            return
        samples: int | None = None
        tokens: int | None = None
        padded: int | None = None
        for batch in batches:  # (one per micro-batch of the optimizer step)
            try:
                s, t, p = self.counter(batch)
            except Exception:
                continue
            samples, tokens, padded = (
                add_count(samples, s),
                add_count(tokens, t),
                add_count(padded, p),
            )
        rec.data_fetched(perf_counter_ns(), samples, tokens, padded)

    # micro-steps, forward ----------------------------------------------------------------

    def before_microstep(self) -> None:
        self.rec.transition(_MICROSTEP if self.accumulating else _MICROSTEP_END)

    def after_microstep(self, result: Any, err: BaseException | None) -> None:
        if err is not None:
            close_phases(self.rec, _STEP_PHASES, err)
            return
        self.rec.transition(_MICROSTEP_END)
        if isinstance(result, (torch.Tensor, float)):
            # the loss training_step returned (read from the device without a sync)
            self.rec.take_scalars({"loss": result})

    def forward_pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        if dynamo_compiling():
            # A compiled forward traced this hook: a clock read would be a graph break (an
            # error under fullgraph=True). Dynamo replays the attribute write after each
            # compiled call, so backward ends the unmarked forward (backward.py).
            self.compiled = True
            return
        if not (self.active and self.in_step and module.training and torch.is_grad_enabled()):
            return
        self.rec.transition(_FORWARD)

    def hook_model(self, model: Any) -> None:
        if model is self.hooked or not isinstance(model, torch.nn.Module):
            return
        self.unhook_model()
        self.hook_handle = model.register_forward_pre_hook(
            guarded(self.inst, self.forward_pre_hook)
        )
        self.hooked = model

    def unhook_model(self) -> None:
        if self.hook_handle is not None:
            self.hook_handle.remove()
        self.hook_handle = None
        self.hooked = None

    # callback events ---------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.active:
            self.hook_model(kw.get("model"))  # model_init= builds the model in train()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.active and self.in_step:
            self.rec.transition(_OPTIMIZER)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.active and self.in_step:
            self.rec.transition(_OPTIMIZER_END)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.active and self.in_step:
            lr = _learning_rate(self.trainer)
            if lr is not None:
                self.rec.take_scalars({"learning_rate": lr})
            self.finish()

    def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        logs = kw.get("logs") or {}
        norm = logs.get("grad_norm")  # a float by now: the Trainer read it for its log
        if self.active and isinstance(norm, (int, float)):
            self.rec.take_scalars({"grad_norm": float(norm)})

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.active and self.in_step:
            self.finish()

    def finish(self) -> None:
        self.rec.transition(_STEP_END)
        self.in_step = False


_EVENTS = ("on_train_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end",
           "on_log", "on_train_end")  # fmt: skip


def _learning_rate(trainer: Any) -> float | None:
    """The learning rate the optimizer step used: the scheduler's, else the first
    parameter group's (host values, no device access)."""
    scheduler = getattr(trainer, "lr_scheduler", None)
    try:
        if scheduler is not None:
            return float(scheduler.get_last_lr()[0])
        return float(trainer.optimizer.param_groups[0]["lr"])
    except Exception:
        return None


@functools.cache
def _callback_class(transformers: Any) -> type:
    """A TrainerCallback subclass whose events forward to the adapter, each guarded."""

    def __init__(self: Any, adapter: HFTrainerAdapter) -> None:
        for event in _EVENTS:
            setattr(self, event, guarded(adapter.inst, getattr(adapter, event)))

    return type(
        "OtelTrainCallback",
        (transformers.TrainerCallback,),
        {
            "__init__": __init__,
            "__module__": __name__,
            "__doc__": "Forwards Trainer events to otel-train (added by instrument()).",
        },
    )


def _wrap(inst: Instrumentation, method: Any, before: Any, after: Any, live: Any) -> Any:
    """``method`` with guarded ``before()`` / ``after(result, err)`` around each call."""
    g_before = guarded(inst, before)
    g_after = guarded(inst, after)

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not live():
            return method(*args, **kwargs)
        g_before()
        try:
            result = method(*args, **kwargs)
        except BaseException as err:
            g_after(None, err)
            raise
        g_after(result, None)
        return result

    return wrapper


def attach(
    inst: Instrumentation,
    trainer: Any,
    counter: Callable[[Any], tuple[int | None, int | None]] | None,
) -> None:
    transformers = require()
    adapter = HFTrainerAdapter(inst, trainer, counter)
    # (the Trainer enters autocast inside the model's forward: its settings tell instead)
    args: Any = getattr(trainer, "args", None)
    if getattr(args, "bf16", False) or getattr(args, "fp16", False):
        note_precision(inst.session.recorder, "bf16" if args.bf16 else "fp16")
    handler = trainer.callback_handler
    callback = _callback_class(transformers)(adapter)
    handler.add_callback(callback)

    def remove_callback() -> None:
        if callback in handler.callbacks:
            handler.callbacks.remove(callback)

    inst.on_undo(remove_callback)
    adapter.hook_model(getattr(trainer, "model", None))
    inst.on_undo(adapter.unhook_model)

    def fetching() -> bool:
        return adapter.active

    def in_step() -> bool:
        return adapter.active and adapter.in_step

    patch_attribute(
        inst, trainer, "get_batch_samples",
        _wrap(inst, trainer.get_batch_samples, adapter.before_fetch, adapter.after_fetch, fetching),
    )  # fmt: skip
    patch_attribute(
        inst, trainer, "training_step",
        _wrap(inst, trainer.training_step, adapter.before_microstep, adapter.after_microstep,
              in_step),
    )  # fmt: skip
    inst.on_undo(hold_backward(adapter))
    # Goodput: evaluation and checkpoint saving, between optimizer steps.
    mark_region(inst, trainer, "evaluate", "evaluation")
    mark_region(inst, trainer, "_save_checkpoint", "checkpoint")

    def deactivate() -> None:
        adapter.active = False
        if adapter.in_step:
            adapter.finish()

    inst.on_undo(deactivate)
