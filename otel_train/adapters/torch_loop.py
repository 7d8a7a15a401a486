"""Plain PyTorch loops: ``instrument(model, optimizer=opt, dataloader=loader)``.

Phases and where they are observed:

- ``data``: around each ``next()`` on the instrumented DataLoader's iterator (host clock).
  The batch's samples and tokens count in the step that consumes it: the step open at
  the fetch, or, for a batch fetched after a training forward of the step (nanoGPT
  fetches the next micro-batch between forward and backward), the step of the next
  training forward. So a batch fetched at the end of a step counts in the next one, and
  the last, never trained on, in none. (A model compiled after ``instrument()`` runs no
  timed forward: there every batch counts in the step open at its fetch.)
- ``forward``: from the start of the model's ``forward`` (training mode, grad enabled)
  until backward starts, so the loss computation belongs to forward. While instrumented
  the model's class is a subclass made for it whose ``forward`` is timed; it pickles
  and copies as the model's own class, so saves, copies and ``state_dict()`` are as
  without otel-train (an instance that has a ``forward`` of its own gets it wrapped).
- ``backward``: around ``torch.autograd.backward`` (what ``loss.backward()`` calls),
  while a step is open (the process-wide wrapper of ``backward.py``).
- ``optimizer``: from the optimizer's step pre-hook to its post-hook.

A step opens at the first data fetch (or forward, without a DataLoader) after the
previous optimizer step and closes at the optimizer's post-hook (a model compiled after
``instrument()`` runs no hook of ours in its forward: without a DataLoader its steps then
open where the previous one closed, with a ``forward`` phase up to backward), so gradient
accumulation shows repeated data/forward/backward phases inside one step. Without
``optimizer=``, each data fetch ends the step before it and opens the next (one batch,
one step); with neither ``optimizer=`` nor ``dataloader=`` (a loop that updates the
parameters itself, as ``p.data.add_(p.grad, alpha=-lr)``), the first training forward
after a backward ends the step before it and opens the next (said once at run time and
in the summary: mark the steps with ``otel_train.step()`` where that is not one
iteration). Samples and tokens are counted from the batches' shapes (see
adapters/batches.py).

Telemetry emitted: the ``otel_train.step`` trace and every metric in the contract.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch

from ..recording.precision import autocast_label
from ..recording.recorder import ADAPTER, DATA_FETCHED, Recorder, boundary
from ..recording.values import add_count
from .backward import hold_backward
from .base import Instrumentation, note_precision
from .batches import Counts, batch_counts, choose_counter, tensor_counts
from .compiling import dynamo_compiling
from .ddp import watch_ddp
from .own_class import time_forward
from .scaler import hold_scaler

_log = logging.getLogger("otel_train")
_grad_enabled = torch.is_grad_enabled

# The hooks' boundaries, made once: the recorder recognises a repeating step by them.
_DATA = boundary(None, "data", begin=ADAPTER)
_DATA_NEXT_STEP = boundary(None, "data", begin=ADAPTER, end=ADAPTER)  # no optimizer= given
_DATA_END = boundary("data", None)
_FORWARD = boundary("forward", "forward", begin=ADAPTER)
_FORWARD_COUNTED = boundary("forward", "forward", begin=ADAPTER, counted=True)  # a batch's
_OPTIMIZER = boundary("forward", "optimizer")
_OPTIMIZER_END = boundary("optimizer", None, end=ADAPTER)
# No optimizer: the first forward (or fetch) after a backward ends the step and opens one
_FORWARD_NEXT_STEP = boundary(None, "forward", begin=ADAPTER, end=ADAPTER)
_FORWARD_NEXT_STEP_COUNTED = boundary(None, "forward", begin=ADAPTER, end=ADAPTER, counted=True)
NO_OPTIMIZER_NOTE = (
    "steps: no torch.optim optimizer stepped, so each step began at the first training "
    "forward (or batch) after a backward; where one iteration has several backwards, "
    "mark the steps with otel_train.step()"
)
# A compiled forward (traced: no hook of ours runs) and no loader to open the next step:
# the next step, and its forward, open where this one ends (docs/rationale.md, MFU).
_OPTIMIZER_END_OPENS = boundary("optimizer", "forward", begin=ADAPTER, end=ADAPTER)
PRECISION_CHECKS = 8  # forwards whose autocast state is read (precision.autocast_label)


class _TimedIterator:
    """Wraps a DataLoader iterator; everything but ``__next__`` is delegated."""

    # One slot, (adapter, iterator): the delegating __getattr__ leaves each attribute
    # lookup on this type unspecialised (~250 instructions), so __next__ makes one
    __slots__ = ("_of",)

    def __init__(self, it: Any, adapter: TorchLoopAdapter) -> None:
        self._of = (adapter, it)

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        adapter, it = self._of
        if not adapter.active:
            return next(it)
        return timed_next(adapter, next, it)

    def __len__(self) -> int:
        return len(self._of[1])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._of[1], name)


def timed_next(adapter: TorchLoopAdapter, fetch: Callable[[Any], Any], source: Any) -> Any:
    """``fetch(source)`` (the next batch) timed as a ``data`` phase of ``adapter``'s
    recorder, its batch counted: the one data timing of the plain-loop adapter, for
    a wrapped DataLoader's iterator here and every iterator in process_wide.py."""
    rec = adapter.rec
    try:  # telemetry never raises into training
        if adapter.new_step_due:  # (no optimizer: a backward ran since the last step began)
            adapter.turn_step()
            rec.transition(_DATA_NEXT_STEP)
        else:
            rec.transition(adapter.data_boundary)
    except Exception:
        _log.exception("otel-train: timing a data fetch failed")
        return fetch(source)
    try:
        batch = fetch(source)
    except StopIteration:
        _exit_data(rec, None, discard=True)
        raise
    except BaseException as err:
        _exit_data(rec, err, discard=False)
        raise
    try:
        # (0: the fetch ends at the write, after the inline count, a few hundred ns)
        t = 0
        samples = tokens = padded = None
        if (
            adapter.counter is batch_counts
            and type(batch) in _SEQUENCES
            and batch
            and type(batch[0]) is _TENSOR
        ):
            head = batch[0]  # the common (x, y, ...) batch, counted inline
            if head.dtype.is_floating_point:
                shape = head.shape
                if shape:
                    samples = shape[0]
            else:  # token ids, maybe (batches.py)
                samples, tokens = tensor_counts(head)
                padded = tokens
        else:  # (a counter of the user's may take long: not the fetch's time)
            t = perf_counter_ns()
            samples, tokens, padded = adapter.counts_of(batch)
        if adapter.after_forward:  # (the next training forward consumes it)
            rec.transition(_DATA_END)
            adapter.hold(samples, tokens, padded)
        else:
            rec.counted_transition(DATA_FETCHED, samples, tokens, padded, t)  # (one call)
    except Exception:
        _log.exception("otel-train: timing a data fetch failed")
    return batch


def _exit_data(rec: Recorder, err: BaseException | None, discard: bool) -> None:
    try:
        rec.exit(type(err) if err is not None else None, err, "data")
        if discard:
            rec.discard_step_if_only("data")
    except Exception:
        _log.exception("otel-train: timing a data fetch failed")


_LOADER_CLASSES: dict[type, type] = {}
_SEQUENCES = (tuple, list)
_TENSOR = torch.Tensor


def _timed_loader_class(cls: type) -> type:
    sub = _LOADER_CLASSES.get(cls)
    if sub is None:

        def __iter__(self: Any) -> Any:
            it = cls.__iter__(self)  # type: ignore[attr-defined]
            adapter = _LOADER_ADAPTERS.get(id(self))
            return _TimedIterator(it, adapter) if adapter is not None else it

        sub = type(
            cls.__name__,
            (cls,),
            {"__iter__": __iter__, "__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        _LOADER_CLASSES[cls] = sub
    return sub


_LOADER_ADAPTERS: dict[int, TorchLoopAdapter] = {}


class TorchLoopAdapter:
    def __init__(
        self,
        inst: Instrumentation,
        rec: Recorder,
        counter: Callable[[Any], tuple[int | None, int | None]] | None,
    ) -> None:
        self.inst = inst
        self.rec = rec
        self.counter = choose_counter(inst, counter)
        self.active = True
        self.has_loader = False
        self.data_boundary = _DATA  # a fetch's: _DATA_NEXT_STEP when nothing else ends steps
        self.compiled = False  # no hook of ours runs in the forward: compiled after
        # instrument() (hooks traced), or the forward replaced (see optimizer_post_hook)
        self.model: Any = None  # the model, and its forward with ours in place (attach)
        self.timed_forward: Any = None
        self.precision_checks = PRECISION_CHECKS
        self.ddp_group = ""  # a DDP model's process group (ddp.py), and when its last
        self.ddp_grad_ns = 0  # gradient of this backward was ready (0: not yet, or no DDP)
        self.ddp_grad_event: Any = None  # ... and its device event, on a timed device
        self.optimizer: Any = None  # whose steps end steps (None: any, the process-wide)
        self.optimizer_steps = 0  # taken, counted by the post-hook (scaler.py reads it)
        self.after_forward = False  # a training forward ran since the optimizer's step
        # No optimizer ends steps (none given; none made, process_wide.py): a backward makes
        # the next training forward or fetch end the step and open the next
        self.forward_ends_steps = False
        self.new_step_due = False
        self.held: Counts | None = None  # counts of batches fetched after it, till the next
        # What backward.py calls before backward's end: DDP's gradient wait, set by
        # watch_ddp for a DDP model (ddp.py); None: nothing (no call per backward)
        self.backward_ends: Callable[[], None] | None = None
        # ... and after it: step_due where no optimizer may end steps (attach,
        # process_wide.py); None: nothing (a call per backward costs ~500 instructions)
        self.after_backward: Callable[[], None] | None = None

    def counts_of(self, batch: Any) -> Counts:
        """The batch's (samples, tokens, padded tokens) by the counter; Nones if it fails."""
        try:
            return self.counter(batch)
        except Exception:
            return None, None, None

    def hold(self, samples: int | None, tokens: int | None, padded: int | None) -> None:
        """A fetched batch's counts, until the training forward that consumes it."""
        held = self.held
        if held is None:
            self.held = (samples, tokens, padded)
        else:
            self.held = (add_count(held[0], samples), add_count(held[1], tokens),
                         add_count(held[2], padded))  # fmt: skip

    def count(self, batch: Any) -> None:
        """Add the batch's counts to the adapter step open now (an explicit step carries
        the user's own counts: the recorder never adds to those)."""
        samples, tokens, padded = self.counts_of(batch)
        if samples is not None or tokens is not None:
            self.rec.log_counts(samples, tokens, padded)

    # hooks ------------------------------------------------------------------------------
    # Each hook guards itself (a try costs nothing until it catches): an error inside
    # telemetry is logged once and switches this adapter off; training goes on.

    def _failed(self) -> None:
        if self.active:
            self.active = False
            _log.exception("otel-train: a torch-loop hook failed; the adapter is now off")

    def forward_begins(self, args: tuple[Any, ...]) -> None:
        """A training forward begins (the caller checked: training mode, grad enabled)."""
        try:
            held = self.held
            turn = self.new_step_due
            if turn:
                self.turn_step()
            if held is not None:  # the batches fetched after the last forward: this one's
                self.held = None
                b = _FORWARD_NEXT_STEP_COUNTED if turn else _FORWARD_COUNTED
                self.rec.counted_transition(b, *held)
            else:
                self.rec.transition(_FORWARD_NEXT_STEP if turn else _FORWARD)
            self.after_forward = True
            if not self.has_loader:
                self.count(args)
            if self.precision_checks:
                self.precision_checks -= 1
                note_precision(self.rec, autocast_label())
        except Exception:
            self._failed()

    def step_due(self) -> None:
        """A backward ended (backward.py): without an optimizer, the next step is due."""
        if self.forward_ends_steps:
            self.new_step_due = True

    def turn_step(self) -> None:
        """The step a backward made due begins now; said once, at the first."""
        self.new_step_due = False
        self.after_forward = False
        notes = self.inst.session.notes
        if NO_OPTIMIZER_NOTE not in notes.lines:
            notes.add(NO_OPTIMIZER_NOTE)
            _log.warning(
                "otel-train: no torch.optim optimizer steps in this loop: each training "
                "forward (or DataLoader batch) after a backward now begins a new step. If "
                "one iteration runs several backwards (gradient accumulation), mark the "
                "steps with `with otel_train.step():` (or pass optimizer= to instrument())"
            )

    def forward_failed(self, err: BaseException) -> None:
        """The forward phase ends with the exception (an OOM included)."""
        try:
            self.rec.exit_if_top("forward", type(err), err)
        except Exception:
            self._failed()

    # A copy of the model (an EMA copy made with deepcopy, say) or a pickled one carries
    # hooks and the timed forward: there they are inert, and never copy the session.

    def __deepcopy__(self, memo: dict[int, Any]) -> TorchLoopAdapter:
        return _inert()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_inert, ())

    def optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        try:
            self.rec.transition(_OPTIMIZER)
        except Exception:
            self._failed()

    def optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1
        if not self.active:
            return
        try:
            if not self.after_forward and not self.compiled:
                self._check_forward()
            self.after_forward = False
            if self.compiled and not self.has_loader:
                self.rec.transition(_OPTIMIZER_END_OPENS)
                return
            self.rec.transition(_OPTIMIZER_END)
        except Exception:
            self._failed()

    def optimizer_skipped(self, optimizer: Any) -> bool:
        """GradScaler skipped the optimizer's step (its gradients overflowed): the step
        ends there all the same, with no optimizer phase (scaler.py). False: not ours."""
        if self.active and (self.optimizer is None or optimizer is self.optimizer):
            self.optimizer_post_hook(optimizer, (), {})
            return True
        return False

    def _check_forward(self) -> None:
        """No training forward of ours ran in this step: if the model's forward was
        replaced since instrument() (``torch.cuda.make_graphed_callables`` sets the
        graphed one as the instance's forward), steps open as a compiled model's do."""
        if self.model.forward != self.timed_forward:  # (a bound method is made per look-up)
            self.compiled = True
            _log.info(
                "otel-train: the model's forward was replaced after instrument() (as "
                "torch.cuda.make_graphed_callables does); no hook of ours runs in it, so "
                "each step now opens where the last one ended, as a compiled model's"
            )


def _inert() -> TorchLoopAdapter:
    adapter = TorchLoopAdapter.__new__(TorchLoopAdapter)
    adapter.active = False
    return adapter


def _timed_forward(adapter: TorchLoopAdapter, module: torch.nn.Module, wrapped: Any) -> Any:
    """The model's ``forward`` while instrumented, wrapping ``wrapped`` (the forward it
    had): a function of the module and the call's arguments, the ``forward`` of the
    model's own subclass, or called by the instance attribute that wraps an instance's
    own forward (own_class.py). A method found on the class costs no Python frame to
    look up (a ``__get__`` of ours did: ~500 instructions a step); a forward pre-hook
    would send every call through ``Module._call_impl``'s slow path (~1 us per step more
    in instructions) and would be pickled with the model."""
    # The module's own attributes, where ``training`` is one (not a compiled module's,
    # whose ``training`` is its original's): read there, not through Module's
    # __getattr__, which leaves every attribute lookup on a module unspecialised
    attrs = module.__dict__ if "training" in module.__dict__ else None
    own = getattr(wrapped, "__func__", wrapped)  # the class's forward: other instances'

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is not module:
            # Another instance of the subclass (a DataParallel replica, a copy a class of
            # the user's makes with type(self)): the class's own forward, untimed.
            return own(self, *args, **kwargs)
        if not adapter.active:
            return wrapped(*args, **kwargs)
        if dynamo_compiling():
            # torch.compile traced this call (the model was compiled after instrument()):
            # a clock read here would be a graph break. Dynamo replays this attribute write
            # after each compiled call, so backward knows to open the step instead.
            adapter.compiled = True
            return wrapped(*args, **kwargs)
        training = attrs["training"] if attrs is not None else module.training
        if training and _grad_enabled():
            adapter.forward_begins(args)
        try:
            return wrapped(*args, **kwargs)
        except BaseException as err:
            adapter.forward_failed(err)
            raise

    forward.__wrapped__ = own  # type: ignore[attr-defined]  # (inspect.signature follows it)
    return forward


def attach(
    inst: Instrumentation,
    model: torch.nn.Module,
    optimizer: Any | None,
    dataloader: Any | None,
    counter: Callable[[Any], tuple[int | None, int | None]] | None,
) -> None:
    adapter = TorchLoopAdapter(inst, inst.session.recorder, counter)
    inst.on_undo(time_forward(model, _timed_forward(adapter, model, model.forward)))
    adapter.model, adapter.timed_forward = model, model.forward
    if optimizer is None:
        adapter.data_boundary = _DATA_NEXT_STEP
        adapter.forward_ends_steps = dataloader is None  # (else each fetch ends the step)
        if adapter.forward_ends_steps:
            adapter.after_backward = adapter.step_due
    else:
        adapter.optimizer = optimizer
        pre = optimizer.register_step_pre_hook(adapter.optimizer_pre_hook)
        post = optimizer.register_step_post_hook(adapter.optimizer_post_hook)
        inst.on_undo(post.remove)
        inst.on_undo(pre.remove)
        inst.on_undo(hold_scaler(adapter))
    if dataloader is not None:
        adapter.has_loader = True
        original_cls = type(dataloader)
        dataloader.__class__ = _timed_loader_class(original_cls)
        _LOADER_ADAPTERS[id(dataloader)] = adapter

        def restore_loader() -> None:
            _LOADER_ADAPTERS.pop(id(dataloader), None)
            if type(dataloader) is _LOADER_CLASSES.get(original_cls):
                dataloader.__class__ = original_cls

        inst.on_undo(restore_loader)
    watch_ddp(inst, adapter, model)
    release_backward = hold_backward(adapter)

    def deactivate() -> None:
        adapter.active = False
        release_backward()
        rec = adapter.rec
        rec.exit_if_top("forward")

    inst.on_undo(deactivate)


def validate(model: Any, optimizer: Any | None, dataloader: Any | None) -> None:
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"otel_train.instrument(): optimizer= must be a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    if dataloader is not None and not isinstance(dataloader, torch.utils.data.DataLoader):
        raise TypeError(
            f"otel_train.instrument(): dataloader= must be a torch.utils.data.DataLoader, got "
            f"{type(dataloader).__name__}"
        )
