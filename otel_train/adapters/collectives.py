"""Blocking collectives timed where the training thread waits in them.

While at least one adapter holds it (:func:`hold_collectives`), the collectives of
``torch.distributed`` are wrapped process-wide: each blocking call (``async_op`` false)
becomes a collective's phase of the open step (recording/collectives.py), inside the
phase it ran in, with the op as torch names it, the process group's name and the group's
sequence number (for hang records: ranks stuck at different numbers did not call the
same collective). Asynchronous calls pass straight through (nothing waits in them here),
and so do calls Dynamo traces (torch.compile): the compiled graph holds torch's own
collective, as without otel-train (its time falls in the phase around the compiled call).
The last release puts the originals back, unless someone wrapped them since.

Calls that reach the originals another way (``from torch.distributed import all_reduce``
before ``instrument()``, or C++ such as DDP's reducer) are not seen here; DDP's gradient
all-reduce is attributed by the plain-loop adapter at the end of backward (ddp.py).

Usage (what adapters do)::

    release = hold_collectives(adapter)   # adapter.rec: the session's Recorder
    ...
    release()
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..recording.collectives import group_name, sequence_number
from .compiling import dynamo_compiling

_log = logging.getLogger("otel_train")
# What torch.distributed calls them; each blocks the caller unless async_op=True.
OPS = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "all_to_all", "all_to_all_single", "reduce", "gather",
    "scatter",
)  # fmt: skip
_ACTIVE: list[Any] = []  # holders (anything with a ``rec``)
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_failed = False


def hold_collectives(owner: Any) -> Callable[[], None]:
    """Time torch.distributed's blocking collectives for ``owner.rec``; returns the undo."""
    return hold(_ACTIVE, owner, _install, _remove)


def hold(
    active: list[Any], owner: Any, install: Callable[[], None], remove: Callable[[], None]
) -> Callable[[], None]:
    """A process-wide wrapper held by ``owner``: in ``active``, installed; returns the undo
    (idempotent), which removes the wrapper when the last holder lets go."""
    active.append(owner)
    install()

    def release() -> None:
        if owner in active:
            active.remove(owner)
        if not active:
            remove()

    return release


def _recorder() -> Any:
    for owner in _ACTIVE:
        rec = owner.rec
        if rec.enabled:
            return rec
    return None


def _wrap(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    params = list(inspect.signature(original).parameters)
    at_group = params.index("group") if "group" in params else None
    at_async = params.index("async_op") if "async_op" in params else None

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if dynamo_compiling():  # (traced: torch's own collective goes into the graph)
            return original(*args, **kwargs)
        rec = _recorder() if not _failed else None
        if rec is None:
            return original(*args, **kwargs)
        try:
            if kwargs.get("async_op") or (at_async is not None and _arg(args, at_async)):
                return original(*args, **kwargs)  # (not waited for here)
            group = kwargs["group"] if "group" in kwargs else _arg(args, at_group)
            name = group_name(group)
            seq = sequence_number(group)
            rec.collective_enter(op, name, None if seq is None else seq + 1)
        except Exception:  # telemetry never raises into training
            _fail()
            return original(*args, **kwargs)
        try:
            result = original(*args, **kwargs)
        except BaseException as err:
            rec.collective_exit(op, name, type(err), err)
            raise
        rec.collective_exit(op, name)
        return result

    collective.__otel_train_original__ = original  # type: ignore[attr-defined]
    return collective


def _arg(args: tuple[Any, ...], at: int | None) -> Any:
    return args[at] if at is not None and at < len(args) else None


def _fail() -> None:
    global _failed
    if not _failed:
        _failed = True
        _log.exception("otel-train: timing a collective failed; collectives are not timed")


def _install() -> None:
    try:
        import torch.distributed as dist
    except Exception:  # pragma: no cover - a torch without distributed
        return
    if not dist.is_available():
        return
    for op in OPS:
        current = getattr(dist, op, None)
        if current is None or op in _ORIGINALS:
            continue
        _ORIGINALS[op] = current
        setattr(dist, op, _wrap(op, current))


def _remove() -> None:
    import torch.distributed as dist

    for op, original in list(_ORIGINALS.items()):
        current = getattr(dist, op, None)
        if getattr(current, "__otel_train_original__", None) is original:
            setattr(dist, op, original)  # (wrapped again since: the chain stays intact)
        del _ORIGINALS[op]
