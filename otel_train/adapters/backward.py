"""The process-wide ``torch.autograd.backward`` wrapper: a ``backward`` phase for adapters.

``loss.backward()`` (and ``accelerator.backward``, and torchtitan's schedules) end in
``torch.autograd.backward``; no hook on a model or optimizer sees it. While at least one
adapter holds it (:func:`hold_backward`), that function is replaced by a wrapper that
times each call as a ``backward`` phase of the open step: it closes an open ``forward``
and becomes a phase. Calls made while it times one (reentrant activation checkpointing
recomputes a layer and calls backward from inside backward, on CUDA from autograd's
device thread) pass straight through: they are part of that phase. The last release
puts the original back, unless someone wrapped it since (then the chain is left intact
and the wrapper passes straight through).

Adapter machinery over the recorder, shared by the plain-loop, Hugging Face and
torchtitan adapters; it imports no adapter module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..recording.recorder import ADAPTER, Recorder, boundary


class _Held(NamedTuple):
    """An adapter timing backward, and its calls at backward's end (looked up once)."""

    owner: Any
    ends: Callable[[], None] | None
    after: Callable[[], None] | None


_ACTIVE: list[_Held] = []  # adapters timing backward (see hold_backward)
_ORIGINAL_BACKWARD: Callable[..., Any] | None = None
# A backward being timed now. Reentrant activation checkpointing calls backward inside
# backward (on CUDA from autograd's device thread): those calls are part of it.
_timing = False
_log = logging.getLogger("otel_train")

# The wrapper's boundaries, made once: the recorder recognises a repeating step by them.
_BACKWARD = boundary("forward", "backward")
_BACKWARD_OPENS = boundary("forward", "backward", begin=ADAPTER)  # after a compiled forward
_BACKWARD_END = boundary("backward", None)


def _patched_backward(*args: Any, **kwargs: Any) -> Any:
    global _timing
    original = _ORIGINAL_BACKWARD
    assert original is not None
    if _timing:  # (inside a timed backward: reentrant checkpointing's recomputation)
        return original(*args, **kwargs)
    rec = owner = None
    try:
        # Adapters of the live session share its recorder (those of a session shut down
        # hold a disabled one); outside a step the boundary is a no-op, unless a compiled
        # forward opened no step (see torch_loop._timed_forward): then backward opens it.
        # An adapter switched off (or standing aside: process_wide.py) takes no part.
        b = _BACKWARD
        for held in _ACTIVE:
            adapter = held.owner
            if adapter.rec.enabled and adapter.active:
                rec, owner = adapter.rec, held
                if adapter.compiled:
                    b = _BACKWARD_OPENS
                    rec.compiled_seen = True  # (FLOP counting steps aside)
        if rec is not None:
            rec.transition(b)
    except Exception:  # telemetry never raises into training
        _log.exception("otel-train: timing backward failed")
        rec = None
    if rec is None:
        return original(*args, **kwargs)
    _timing = True
    try:
        result = original(*args, **kwargs)
    except BaseException as err:
        _exit_backward(rec, err)
        raise
    finally:
        _timing = False
    try:
        assert owner is not None
        if owner.ends is not None:
            owner.ends()  # (what the backward waited for at its end: DDP's all-reduce, ddp.py)
        rec.transition(_BACKWARD_END)
        if owner.after is not None:
            owner.after()  # (the process-wide adapter arms its forward hook again)
    except Exception:
        _log.exception("otel-train: timing backward failed")
    return result


def _exit_backward(rec: Recorder, err: BaseException) -> None:
    try:
        rec.exit_if_top("backward", type(err), err)
    except Exception:
        _log.exception("otel-train: timing backward failed")


def hold_backward(owner: Any) -> Callable[[], None]:
    """Time ``torch.autograd.backward`` as a ``backward`` phase for an adapter.

    ``owner`` needs a ``rec`` (the session's Recorder), ``active`` (False: it is off)
    and ``compiled`` (its model's forward ran under torch.compile, so backward opens
    the step), and may have ``backward_ends()`` (called before backward's end) and
    ``after_backward()`` (after it): while it has an open step, backward closes an open
    ``forward`` and becomes a phase. Returns the undo (idempotent).
    """
    ends, after = getattr(owner, "backward_ends", None), getattr(owner, "after_backward", None)
    held = _Held(owner, ends, after)
    _ACTIVE.append(held)
    _install_backward_patch()

    def release() -> None:
        if held in _ACTIVE:
            _ACTIVE.remove(held)
        _remove_backward_patch()

    return release


def _install_backward_patch() -> None:
    global _ORIGINAL_BACKWARD
    if _ORIGINAL_BACKWARD is None:
        _ORIGINAL_BACKWARD = torch.autograd.backward
        torch.autograd.backward = _patched_backward


def _remove_backward_patch() -> None:
    global _ORIGINAL_BACKWARD
    # If someone wrapped us since, leave the chain intact: we pass through when inactive.
    if (
        _ORIGINAL_BACKWARD is not None
        and not _ACTIVE
        and torch.autograd.backward is _patched_backward
    ):
        torch.autograd.backward = _ORIGINAL_BACKWARD
        _ORIGINAL_BACKWARD = None
