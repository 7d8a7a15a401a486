"""GradScaler's skipped optimizer steps end the step, as taken ones do.

``GradScaler.step(optimizer)`` (``torch.amp``; ``torch.cuda.amp``'s is a subclass) calls
``optimizer.step()`` only when the unscaled gradients are finite. At a skipped step no
optimizer hook runs, so the adapters' step stayed open and the next iteration ran in it
(an fp16 run's scale search: 4 skipped iterations made one 3.6 s step of nanoGPT's).
While an adapter holds it (:func:`hold_scaler`), ``GradScaler.step`` is wrapped
process-wide: when the holder's count of optimizer steps (``optimizer_steps``, counted
by its post-hook) did not move during the call, ``optimizer_skipped(optimizer)`` ends
the step, with no optimizer phase (it returns True when the optimizer was the holder's).
GradScaler read its overflow flags itself (its own sync); this reads none.

Usage (what the plain-loop adapters do)::

    release = hold_scaler(adapter)   # adapter.optimizer_steps, adapter.optimizer_skipped()
    ...
    release()
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from .collectives import hold
from .compiling import dynamo_compiling

_log = logging.getLogger("otel_train")
_ACTIVE: list[Any] = []  # holders
_ORIGINAL_STEP: Callable[..., Any] | None = None


def hold_scaler(owner: Any) -> Callable[[], None]:
    """Tell ``owner`` of GradScaler's skipped steps; returns the undo (idempotent)."""
    return hold(_ACTIVE, owner, _install, _remove)


def _scaler_step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
    original = _ORIGINAL_STEP
    assert original is not None
    if not _ACTIVE or dynamo_compiling():
        return original(self, optimizer, *args, **kwargs)
    counts = [(owner, owner.optimizer_steps) for owner in _ACTIVE]
    result = original(self, optimizer, *args, **kwargs)
    for owner, count in counts:
        if owner.optimizer_steps == count:
            try:  # telemetry never raises into training
                if owner.optimizer_skipped(optimizer):
                    _say_skipped()
            except Exception:
                _log.exception("otel-train: ending a step GradScaler skipped failed")
    return result


def _say_skipped() -> None:
    if not _skipped_said:
        _skipped_said.append(True)
        _log.warning(
            "otel-train: GradScaler skipped an optimizer step (inf or NaN gradients, as in "
            "its scale search): each such iteration is a step of its own, with no "
            "optimizer phase (said once)"
        )


_skipped_said: list[bool] = []  # (a process says it once)


def _install() -> None:
    global _ORIGINAL_STEP
    cls = torch.amp.GradScaler
    if _ORIGINAL_STEP is None:
        _ORIGINAL_STEP = cls.step
        cls.step = _scaler_step  # type: ignore[method-assign]


def _remove() -> None:
    global _ORIGINAL_STEP
    cls = torch.amp.GradScaler
    # Wrapped again since: the chain stays, and ours passes straight through.
    if _ORIGINAL_STEP is not None and cls.__dict__.get("step") is _scaler_step:
        cls.step = _ORIGINAL_STEP  # type: ignore[method-assign]
        _ORIGINAL_STEP = None
