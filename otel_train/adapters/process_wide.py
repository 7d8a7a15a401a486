"""The training loop found process-wide, with no handle on the user's objects: the hooks
of the zero-code path (``opentelemetry-instrument python train.py``; the instrumentor in
otel_train/instrumentor.py installs them).

The plain-loop adapter's boundaries (torch_loop.py), taken from torch's process-wide
hooks instead of hooks on one model, optimizer and DataLoader:

- ``optimizer``: torch's global optimizer step hooks
  (``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``_post_hook``), so every
  ``Optimizer.step``; a step ends at each one. While no ``torch.optim`` optimizer was
  made (a loop that updates its parameters itself), the first training forward or
  batch after a backward ends the step instead (torch_loop.py).
- ``data``: every DataLoader iterator's ``__next__`` (``_BaseDataLoaderIter``) while grad
  is enabled: an evaluation loop under ``torch.no_grad()`` feeds no step.
- ``backward``: the process-wide ``torch.autograd.backward`` wrapper (backward.py).
- ``forward``: the first module call in training mode with grad enabled after a step
  began or a backward ended, through a global forward pre-hook that is registered at
  those boundaries and removed at that call, so every other module call keeps torch's
  fast path. The forward phase lasts until backward starts (the loss included). Module
  calls inside a DataLoader's fetch (a dataset transform that is an ``nn.Module``, as
  torchvision's ``Normalize``) or in a DataLoader worker are data, not a forward.

Nothing starts until a hook first fires in a training context: then ``start()`` (the
instrumentor's) hands over an Instrumentation of the live session, created then if
there is none. The hooks stand aside while that session has instrumentations of its own
(an explicit ``otel_train.instrument()``, or a Hugging Face or Lightning Trainer the
instrumentor instrumented when its training began): one instrumentation, never two.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optimizer
from torch.utils.data import dataloader as _dataloader
from torch.utils.data import get_worker_info

from .backward import hold_backward
from .base import Instrumentation
from .compiling import dynamo_compiling
from .scaler import hold_scaler
from .torch_loop import NO_OPTIMIZER_NOTE, TorchLoopAdapter, timed_next

_log = logging.getLogger("otel_train")


class ProcessWideAdapter(TorchLoopAdapter):
    """The plain-loop adapter fed by process-wide hooks. ``active`` while its hooks
    have not failed and its session is open and has no instrumentation of its own."""

    def __init__(self, inst: Instrumentation, arm: Callable[[], None]) -> None:
        self._ok = True
        super().__init__(inst, inst.session.recorder, None)
        self._arm = arm
        self.model_seen = False
        self.after_backward = self.backward_ended  # (always: it arms the next forward)

    @property
    def active(self) -> bool:
        session = self.inst.session
        return self._ok and not session.instrumentations and not session.closed

    @active.setter
    def active(self, value: bool) -> None:
        self._ok = value

    def optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.forward_ends_steps:  # (one made before the hooks were: its steps end steps)
            self.forward_ends_steps = self.new_step_due = False
            self.inst.session.notes.discard(NO_OPTIMIZER_NOTE)
        super().optimizer_post_hook(optimizer, args, kwargs)
        self._arm()  # the next step's forward

    def backward_ended(self) -> None:
        self.step_due()
        self._arm()  # the next micro-batch's forward (gradient accumulation)


class ProcessWideHooks:
    """torch's process-wide hooks, installed and removed as one; ``start()`` gives the
    Instrumentation the adapter records into (None: record nothing now)."""

    def __init__(self, start: Callable[[], Instrumentation | None]) -> None:
        self._start = start
        self.adapter: ProcessWideAdapter | None = None
        self._undo: list[Callable[[], None]] = []
        self._forward_handle: Any = None
        self._installed = False
        self._failed = False
        self.fetching = False  # inside a DataLoader fetch: module calls there are data
        # Whether a torch.optim optimizer was made: while none is, a backward's end is
        # the end of its step (torch_loop.py, forward_ends_steps)
        self.optimizer_made = False

    def install(self) -> None:
        self._installed = True
        self._undo.append(_optimizer.register_optimizer_step_pre_hook(self._pre_step).remove)
        self._undo.append(_optimizer.register_optimizer_step_post_hook(self._post_step).remove)
        self._undo.append(_patch_next(self))
        self._undo.append(wrap_entry(torch.optim.Optimizer, "__init__", self._optimizer_made))
        self.arm()

    def uninstall(self) -> None:
        self._installed = False
        self.disarm()
        while self._undo:
            self._undo.pop()()
        self._drop()

    def live(self) -> ProcessWideAdapter | None:
        """The adapter to record into now, started on first use; None while it stands aside."""
        adapter = self.adapter
        if adapter is not None and adapter.inst.session.closed:
            self._drop()
            adapter = None
        if adapter is None:
            adapter = self._begin()
        return adapter if adapter is not None and adapter.active else None

    def _begin(self) -> ProcessWideAdapter | None:
        if self._failed or not self._installed:
            return None
        try:
            inst = self._start()
            if inst is None:
                return None
            adapter = ProcessWideAdapter(inst, self.arm)
            adapter.forward_ends_steps = not self.optimizer_made
            inst.on_undo(hold_backward(adapter))
            inst.on_undo(hold_scaler(adapter))
        except Exception:  # telemetry never raises into training: off for good
            self._failed = True
            _log.exception("otel-train: starting the process-wide instrumentation failed")
            return None
        self.adapter = adapter
        return adapter

    def _drop(self) -> None:
        adapter, self.adapter = self.adapter, None
        if adapter is not None:
            adapter.active = False
            adapter.rec.exit_if_top("forward")
            adapter.inst.uninstrument()

    # the forward hook: registered at a boundary, removed at the call it times ----------

    def arm(self) -> None:
        if self._forward_handle is None and self._installed:
            self._forward_handle = _module.register_module_forward_pre_hook(self._forward)

    def disarm(self) -> None:
        handle, self._forward_handle = self._forward_handle, None
        if handle is not None:
            handle.remove()

    def _forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if dynamo_compiling():  # traced by torch.compile: backward opens the step
            if self.adapter is not None:
                self.adapter.compiled = True
            return
        if not module.training or not torch.is_grad_enabled() or self.fetching:
            return  # evaluation, or a dataset's transform: armed for the training forward
        if get_worker_info() is not None:
            self.disarm()  # a DataLoader worker's transform: data, and no training here
            return
        self.disarm()
        adapter = self.live()
        if adapter is None:
            return  # (armed again at the next optimizer step or backward)
        if not adapter.model_seen:
            adapter.model_seen = True
            adapter.inst.session.note_model(module)  # (the FLOP estimate, the dtype)
        adapter.forward_begins(args)

    # the optimizer's global step hooks ---------------------------------------------------

    def _optimizer_made(self, optimizer: Any) -> None:
        """A torch.optim optimizer was made: its steps end steps from now on."""
        self.optimizer_made = True
        if self.adapter is not None:
            self.adapter.forward_ends_steps = self.adapter.new_step_due = False

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        adapter = self.live()
        if adapter is not None:
            adapter.optimizer_pre_hook(optimizer, args, kwargs)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        adapter = self.live()
        if adapter is not None:
            adapter.optimizer_post_hook(optimizer, args, kwargs)


def _patch_next(hooks: ProcessWideHooks) -> Callable[[], None]:
    """Time every DataLoader iterator's ``__next__`` (while grad is enabled); the undo."""
    base = _dataloader._BaseDataLoaderIter
    original = base.__next__

    @functools.wraps(original)
    def __next__(it: Any) -> Any:
        adapter = hooks.live() if torch.is_grad_enabled() else None
        outer, hooks.fetching = hooks.fetching, True  # (a loader's fetch may fetch)
        try:
            if adapter is None:
                return original(it)
            adapter.has_loader = True  # batches are counted at the fetch, not at forward
            return timed_next(adapter, original, it)
        finally:
            hooks.fetching = outer

    base.__next__ = __next__  # type: ignore[method-assign, assignment]

    def undo() -> None:
        if base.__dict__.get("__next__") is __next__:  # (wrapped again since: stays, inert)
            base.__next__ = original  # type: ignore[method-assign]

    return undo


def wrap_entry(cls: type, name: str, before: Callable[[Any], None]) -> Callable[[], None]:
    """``cls.name`` (a method) calls ``before(self)`` first, whose errors are logged and
    never raised; returns the undo, which restores the class exactly."""
    own = name in cls.__dict__
    original = getattr(cls, name)

    @functools.wraps(original)
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            before(self)
        except Exception:
            _log.exception("otel-train: instrumenting %s.%s failed", cls.__name__, name)
        return original(self, *args, **kwargs)

    setattr(cls, name, entry)

    def undo() -> None:
        if cls.__dict__.get(name) is entry:
            if own:
                setattr(cls, name, original)
            else:
                delattr(cls, name)

    return undo
