"""torchtitan-style trainers, recognised by shape: ``instrument(trainer)``.

Usage::

    trainer = Trainer(config)          # torchtitan's, or any object of the same shape
    otel_train.instrument(trainer)
    trainer.train()

The shape: callable ``train_step`` and ``forward_backward_step`` methods, plus
``next_batch`` (older torchtitan) or ``batch_generator`` (torchtitan 0.3) for data.
Built on the method-map timing (``base.time_methods``, as ``methods.py`` uses it):

- step: each ``train_step`` call (one optimizer step).
- ``data``: each ``next_batch`` call, or else each ``next()`` inside a step on the
  iterator that ``batch_generator`` returns. Samples and tokens are counted from the
  ``(inputs, labels)`` batches: the labels' first dimension and element count.
- ``forward_backward``: each ``forward_backward_step`` call (one micro-batch; under
  pipeline parallelism, one schedule), with ``backward`` nested inside it around
  ``torch.autograd.backward``; forward is the rest. It is not split further because
  pipeline schedules interleave forward and backward.
- ``optimizer``: ``trainer.optimizers.step()`` through step hooks, when ``optimizers``
  is a ``torch.optim.Optimizer`` (torchtitan's ``OptimizersContainer`` is one).

Gradient clipping and the LR schedulers lie inside the step but in no phase. Nothing
is imported from torchtitan. ``uninstrument()`` removes the instance attributes,
hooks and the shared backward wrapper it added.

Telemetry emitted: the ``otel_train.step`` trace and every metric in the contract.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..recording.recorder import Recorder
from .backward import hold_backward
from .base import Instrumentation, guarded, patch_attribute, time_methods
from .batches import count_batch

REQUIRED = ("train_step", "forward_backward_step")
DATA_METHODS = ("next_batch", "batch_generator")

Counter = Callable[[Any], tuple[int | None, int | None]]


def _has_method(target: Any, name: str) -> bool:
    # Looked up on the class, so that objects answering every attribute (mocks) don't match.
    return callable(getattr(type(target), name, None))


def matches(target: Any) -> bool:
    return all(_has_method(target, n) for n in REQUIRED) and any(
        _has_method(target, n) for n in DATA_METHODS
    )


def validate(trainer: Any, optimizer: Any, dataloader: Any) -> None:
    if optimizer is not None or dataloader is not None:
        raise TypeError(
            "otel_train.instrument(): a torchtitan-style trainer owns its optimizer and data; "
            "call instrument(trainer) without optimizer=/dataloader="
        )


def count_titan_batch(batch: Any) -> tuple[int | None, int | None]:
    """``(input_dict, labels)``: samples = labels' first dimension, tokens = their count."""
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], torch.Tensor):
        labels = batch[1]
        if labels.dim() > 0:
            return int(labels.shape[0]), int(labels.numel())
    return count_batch(batch)


class TitanAdapter:
    def __init__(self, inst: Instrumentation, counter: Counter) -> None:
        self.inst = inst
        self.rec: Recorder = inst.session.recorder  # read by the backward wrapper
        self.counter = counter
        self.active = True
        self.compiled = False  # (read by the backward wrapper: its forwards run eagerly)
        self.enter_data = guarded(inst, self._enter_data)
        self.exit_data = guarded(inst, self._exit_data)

    def _enter_data(self) -> bool:
        if not self.active or self.rec.current_step is None:
            return False
        self.rec.enter("data")
        return True

    def _exit_data(self, batch: Any, err: BaseException | None) -> None:
        rec = self.rec
        if rec.open_phase_names()[-1:] == ["data"]:
            rec.exit(type(err) if err is not None else None, err)
        if batch is not None:
            samples, tokens = self.counter(batch)
            rec.add_counts(samples, tokens, tokens)  # (labels: no padding to tell apart)

    def fetch(self, fetch: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fetch(*args)`` as a ``data`` phase of the open step, counting what it returns."""
        if not self.enter_data():
            return fetch(*args, **kwargs)
        try:
            batch = fetch(*args, **kwargs)
        except StopIteration:
            self.exit_data(None, None)  # an exhausted iterator is not an error
            raise
        except BaseException as err:
            self.exit_data(None, err)
            raise
        self.exit_data(batch, None)
        return batch

    def optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.active and self.rec.current_step is not None:
            self.rec.enter("optimizer")

    def optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.active:
            self.rec.exit_if_top("optimizer")


class _TimedBatches:
    """The iterator ``batch_generator`` returned; each ``next()`` in a step is a data phase."""

    __slots__ = ("_adapter", "_it")

    def __init__(self, it: Any, adapter: TitanAdapter) -> None:
        self._it = it
        self._adapter = adapter

    def __iter__(self) -> _TimedBatches:
        return self

    def __next__(self) -> Any:
        return self._adapter.fetch(next, self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


def attach(inst: Instrumentation, trainer: Any, counter: Counter | None) -> None:
    adapter = TitanAdapter(inst, counter or count_titan_batch)
    time_methods(inst, trainer, {"forward_backward": ("forward_backward_step",)}, "train_step")
    if _has_method(trainer, "next_batch"):
        original = trainer.next_batch
        wrapper = functools.wraps(original)(functools.partial(adapter.fetch, original))
        patch_attribute(inst, trainer, "next_batch", wrapper)
    else:
        make_batches = trainer.batch_generator

        @functools.wraps(make_batches)
        def batch_generator(*args: Any, **kwargs: Any) -> Any:
            it = make_batches(*args, **kwargs)
            return _TimedBatches(it, adapter) if adapter.active else it

        patch_attribute(inst, trainer, "batch_generator", batch_generator)
    optimizers = getattr(trainer, "optimizers", None)
    if isinstance(optimizers, torch.optim.Optimizer):
        pre = optimizers.register_step_pre_hook(guarded(inst, adapter.optimizer_pre_hook))
        post = optimizers.register_step_post_hook(guarded(inst, adapter.optimizer_post_hook))
        inst.on_undo(post.remove)
        inst.on_undo(pre.remove)
    inst.on_undo(hold_backward(adapter))

    def deactivate() -> None:
        adapter.active = False

    inst.on_undo(deactivate)
