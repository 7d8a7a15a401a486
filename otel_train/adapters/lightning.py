"""Lightning ``Trainer`` (``lightning.pytorch`` or ``pytorch_lightning``): ``instrument(trainer)``.

Usage::

    trainer = lightning.Trainer(max_epochs=1)
    otel_train.instrument(trainer)
    trainer.fit(module, train_dataloaders=loader)

One ``otel_train.step`` span per optimizer step, built from Lightning's callback hooks:

- ``data``: the gap from one batch's ``on_train_batch_end`` (or the epoch start) to the
  next ``on_train_batch_start``: fetching the batch and moving it to the device.
- ``forward``: ``on_train_batch_start`` to ``on_before_backward``: ``training_step``
  with its loss (and, at the start of a step, ``zero_grad``).
- ``backward``: ``on_before_backward`` to ``on_after_backward``.
- ``optimizer``: ``on_before_optimizer_step`` to ``on_train_batch_end``: the parameter
  update and the step-interval LR schedulers.

Samples and tokens are counted from each batch at ``on_train_batch_start`` (the
``attention_mask`` sum when on the CPU, else the ``input_ids`` size, else the first
dimension of the first tensor for samples). With ``accumulate_grad_batches > 1`` each
micro-batch's forward and backward sit under a ``microstep`` phase, and the data gaps
between micro-batches are ``data`` phases of the same step. A data gap that ends in
validation or at the end of an epoch is dropped rather than recorded as a step.
``on_exception`` marks the open phases with the error. Validation during ``fit``
(``on_validation_start`` to ``on_validation_end``) is the goodput region
``evaluation``, and ``trainer.save_checkpoint`` the region ``checkpoint``.

What ``instrument()`` changes: one callback appended to ``trainer.callbacks`` and an
instance attribute ``save_checkpoint`` wrapping the class's method, which
``uninstrument()`` removes. ``lightning`` is imported only when a Trainer is instrumented.

Telemetry emitted: the ``otel_train.step`` trace and every metric in the contract, with
the scalars ``loss`` (what ``training_step`` returned; with gradient accumulation, the
last micro-batch's) and ``learning_rate`` (the first parameter group's at each optimizer
step), read without a device sync; a name the user records is left to the user
(Recorder.take_scalars).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..recording.recorder import ADAPTER, Recorder, boundary
from .base import Instrumentation, close_phases, guarded, mark_region, note_precision
from .batches import choose_counter

EXTRA_HINT = "pip install 'otel-train[lightning]'"
PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_PHASES = ("backward", "forward", "microstep", "optimizer", "data")
_BEFORE_OPTIMIZER = ("backward", "forward", "microstep")

# The hooks' boundaries, made once (the recorder recognises a repeating step by them):
# each closes what a skipped hook left open of the adapter's own phases.
_GAP = boundary(_PHASES, "data", begin=ADAPTER)  # in the open step, else a new one
_GAP_AFTER_STEP = boundary(_PHASES, "data", begin=ADAPTER, end=ADAPTER)
_CLOSE = boundary(_PHASES, None)
_END = boundary(None, None, end=ADAPTER)
_BATCH = boundary(_PHASES, "forward", begin=ADAPTER)
_BATCH_MICROSTEP = boundary(_PHASES, "microstep", begin=ADAPTER)
_MICROSTEP_FORWARD = boundary(None, "forward")
_BACKWARD = boundary("forward", "backward")  # outside a step: nothing
_BACKWARD_END = boundary(("backward", "microstep"), None)
_OPTIMIZER = boundary(_BEFORE_OPTIMIZER, "optimizer")


def package_of(trainer: Any) -> str:
    """``lightning.pytorch`` or ``pytorch_lightning``: where the trainer's class comes from."""
    for cls in type(trainer).__mro__:
        for package in PACKAGES:
            if cls.__module__ == package or cls.__module__.startswith(package + "."):
                return package
    return PACKAGES[0]


def require(package: str = PACKAGES[0]) -> Any:
    """Import ``<package>.callbacks``, or raise an ImportError naming the extra to install."""
    try:
        return importlib.import_module(package + ".callbacks")
    except ImportError as err:
        raise ImportError(
            f"otel_train: instrumenting a Lightning Trainer needs {package.split('.')[0]}; "
            f"install it with {EXTRA_HINT}"
        ) from err


def validate(trainer: Any, optimizer: Any, dataloader: Any) -> None:
    require(package_of(trainer))
    if optimizer is not None or dataloader is not None:
        raise TypeError(
            "otel_train.instrument(): a Lightning Trainer owns its optimizer and data; "
            "call instrument(trainer) without optimizer=/dataloader="
        )
    if not isinstance(getattr(trainer, "callbacks", None), list):
        raise TypeError("otel_train.instrument(): this Lightning Trainer has no callbacks list")


class LightningAdapter:
    def __init__(
        self,
        inst: Instrumentation,
        counter: Callable[[Any], tuple[int | None, int | None]] | None,
    ) -> None:
        self.inst = inst
        self.rec: Recorder = inst.session.recorder
        self.counter = choose_counter(inst, counter)
        self.active = True
        self.stepped = False  # the optimizer stepped in this batch: the step ends with it
        self.accumulating = False
        self.resume_after_validation = False
        self.validation: Any = None  # the open goodput region of a validation run

    def open_gap(self) -> None:
        """A data gap starts: in the open step while accumulating, else in a new one."""
        self.rec.transition(_GAP)

    def drop_gap(self) -> None:
        """End of the loop (validation, epoch end): a step holding only data is dropped."""
        rec = self.rec
        rec.transition(_CLOSE)
        rec.discard_step_if_only("data")
        rec.transition(_END)
        self.stepped = False

    # callback hooks --------------------------------------------------------------------------

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.active:
            self.open_gap()

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.active:
            return
        rec = self.rec
        self.accumulating = int(getattr(trainer, "accumulate_grad_batches", 1) or 1) > 1
        if self.accumulating:
            rec.transition(_BATCH_MICROSTEP)
            rec.transition(_MICROSTEP_FORWARD)
        else:
            rec.transition(_BATCH)
        try:
            samples, tokens, padded = self.counter(batch)
        except Exception:
            samples = tokens = padded = None
        rec.log_counts(samples, tokens, padded)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.active:
            self.rec.transition(_BACKWARD)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.active:
            self.rec.transition(_BACKWARD_END)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.active:
            try:  # the learning rate this optimizer step uses (a host value)
                lr = float(optimizer.param_groups[0]["lr"])
                self.rec.take_scalars({"learning_rate": lr})
            except Exception:
                pass
            self.rec.transition(_OPTIMIZER)
            self.stepped = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.active:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):  # what training_step returned, read without a sync
            self.rec.take_scalars({"loss": loss.detach()})
        # The step ends with its optimizer step; the data gap to the next batch opens.
        self.rec.transition(_GAP_AFTER_STEP if self.stepped else _GAP)
        self.stepped = False

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.active:
            self.drop_gap()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.active and not getattr(trainer, "sanity_checking", False):
            self.resume_after_validation = self.rec.current_step is not None
            self.drop_gap()
            if self.validation is None:  # goodput: time in validation
                self.validation = self.inst.session.regions.region("evaluation")
                self.validation.__enter__()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.validation is not None:
            self.validation.__exit__(None, None, None)
            self.validation = None
        if self.active and self.resume_after_validation:
            self.resume_after_validation = False
            self.open_gap()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.active:
            self.drop_gap()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.active:
            close_phases(self.rec, _PHASES, exception)
            self.rec.end_step(ADAPTER)


_HOOKS = (
    "on_train_epoch_start", "on_train_batch_start", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_train_batch_end", "on_train_epoch_end",
    "on_validation_start", "on_validation_end", "on_train_end", "on_exception",
)  # fmt: skip
_CALLBACK_CLASSES: dict[str, type] = {}


def _callback_class(package: str) -> type:
    """A Callback subclass of the trainer's own package whose hooks forward to the adapter."""
    cls = _CALLBACK_CLASSES.get(package)
    if cls is None:

        def __init__(self: Any, adapter: LightningAdapter) -> None:
            for hook in _HOOKS:
                setattr(self, hook, guarded(adapter.inst, getattr(adapter, hook)))

        cls = type(
            "OtelTrainCallback",
            (require(package).Callback,),
            {"__init__": __init__, "__module__": __name__,
             "__doc__": "Forwards Lightning hooks to otel-train (added by instrument())."},
        )  # fmt: skip
        _CALLBACK_CLASSES[package] = cls
    return cls


# Lightning's mixed-precision settings and the dtype their autocast runs matmuls in (the
# "-true" ones cast the parameters: their dtype tells).
_MIXED_PRECISION = {"bf16-mixed": "bf16", "16-mixed": "fp16", "bf16": "bf16", "16": "fp16"}


def attach(
    inst: Instrumentation,
    trainer: Any,
    counter: Callable[[Any], tuple[int | None, int | None]] | None,
) -> None:
    adapter = LightningAdapter(inst, counter)
    mixed = _MIXED_PRECISION.get(str(getattr(trainer, "precision", "")))
    note_precision(inst.session.recorder, mixed)
    callback = _callback_class(package_of(trainer))(adapter)
    trainer.callbacks.append(callback)

    def remove_callback() -> None:
        # Lightning may reorder (rebuild) the list during fit: remove from the current one.
        callbacks = getattr(trainer, "callbacks", None)
        if isinstance(callbacks, list) and callback in callbacks:
            callbacks.remove(callback)

    inst.on_undo(remove_callback)
    mark_region(inst, trainer, "save_checkpoint", "checkpoint")

    def deactivate() -> None:
        adapter.active = False
        if adapter.validation is not None:
            adapter.on_validation_end(trainer, None)
        close_phases(adapter.rec, _PHASES)
        adapter.rec.discard_step_if_only("data")
        adapter.rec.end_step(ADAPTER)

    inst.on_undo(deactivate)
