"""What users hand the recorder, made safe to keep: names, counts and scalar values.

Anything can arrive here (a tensor on any device, a huge int, an object whose ``str``
is a megabyte). Each function returns something bounded and cheap to hold, or None, and
never reads a value from the device synchronously: a recorder that stalled the training
loop to clean its input would defeat its purpose.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import capture
from .scopes import INT64_MAX, MAX_NAME

if TYPE_CHECKING:
    import torch  # (bound by import_torch())

    from .device import EventPool


def import_torch() -> None:
    """Import torch for :func:`clean_count` and :func:`raw_scalar`: a recorder of the
    training process does when it is built (machine.py); a replay-only one (the
    sidecar's), which never takes a value from the user, does not, and the sidecar never
    imports torch."""
    global torch
    import torch


def clean_name(name: Any) -> str:
    """A phase or scalar name: ``str(name)`` cut to MAX_NAME; "unnamed" when empty, or
    when ``str`` raises (said once: the loop goes on)."""
    try:
        text = name if isinstance(name, str) else str(name)
        text = text[:MAX_NAME]
    except Exception as err:
        _say_unnamed(name, err)
        return "unnamed"
    return text or "unnamed"


def _say_unnamed(name: Any, err: Exception) -> None:
    if _unnamed_said:
        return
    _unnamed_said.append(True)
    logging.getLogger("otel_train").warning(
        "otel-train: a %s given as a name: its str() raised %s: %s; it is named 'unnamed' "
        "(said once)",
        type(name).__name__,
        type(err).__name__,
        err,
    )


_unnamed_said: list[bool] = []  # (a process says it once)


def clean_count(value: Any) -> int | None:
    """A sample/token count, or None: never a device read, never beyond int64 (OTLP)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and (value.device.type != "cpu" or value.numel() != 1):
        return None  # int() of a CUDA tensor would synchronise; meta tensors hold no value
    try:
        number = int(value)
    except Exception:
        return None
    return number if 0 <= number <= INT64_MAX else None


def raw_scalar(value: Any, events: EventPool) -> Any:
    """A float, or ``(pinned CPU tensor, event)`` being filled from the device (no sync):
    what resolved.scalar_value() turns into a float once the event has completed (the
    step waits for it: source.py). None for what cannot be read without a sync."""
    if isinstance(value, bool):
        return float(value)
    if type(value) is float:
        return value
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and hasattr(value, "placements"):
            value = _replicated_local(value)  # a DTensor (tensor parallelism's loss)
            if value is None:
                return None
        if value.numel() != 1 or value.is_complex() or value.is_meta:
            return None
        t = value.detach()
        if t.is_cuda:
            if capture.active:  # a copy now would be captured into the user's CUDA graph
                return None
            host = torch.empty((), dtype=torch.float64, pin_memory=True)
            host.copy_(t.reshape(()), non_blocking=True)
            return (host, events.record())  # (the event goes back to the pool once read)
        if t.device.type != "cpu":
            return None  # other devices (mps, xla, ...) would be read synchronously
        value = t.item()
    try:
        return float(value)
    except Exception:  # complex, huge ints, strings: not a scalar we can chart
        return None


def _replicated_local(value: Any) -> Any:
    """A DTensor's local tensor where every rank holds the whole value (``Replicate``, as
    ``loss_parallel``'s loss), else None: a pending sum (``Partial``) or a shard is read
    only through a collective, which telemetry never starts (said once)."""
    try:
        if all(p.is_replicate() for p in value.placements):
            return value.to_local()
    except Exception:
        pass
    if not _across_said:
        _across_said.append(True)
        logging.getLogger("otel_train").warning(
            "otel-train: a DTensor scalar whose value lies across ranks (placements %s) is "
            "not recorded: reading it takes a collective; record loss.full_tensor() to "
            "record it (said once)",
            getattr(value, "placements", "?"),
        )
    return None


_across_said: list[bool] = []  # (a process says it once)


def add_count(total: int | None, more: int | None) -> int | None:
    """The recorder's count arithmetic: None until a count arrives, then the sum."""
    return total if more is None else (total or 0) + more
