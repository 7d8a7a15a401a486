"""CUDA-graph captures in progress, process-wide, so telemetry stays out of them.

``torch.cuda.graph`` and ``make_graphed_callables`` capture in the "global" mode by
default: a potentially unsafe CUDA call from *any* thread while a capture is live (an
``Event.query()`` among them) invalidates the capture, and an event recorded into the
capture belongs to the graph (querying it later raises). PyTorch's own NCCL watchdog met
the first (pytorch#104487). So:

- every :class:`CUDAGraph` capture counts in :data:`active` from just before
  ``capture_begin`` until its ``capture_end_pre`` (``capture_end`` in older torch)
  returns: the methods are wrapped once, process-wide, when a recorder first uses CUDA;
- while ``active``, the pool records no event (device.EventPool.record returns None, and
  the phase falls back to host time) and CUDA scalars are not copied;
- a thread that queries events does so inside :func:`polling`: it waits for no one, and
  while a capture is live it does not query at all. ``capture_begin`` takes the same lock,
  so a capture never starts in the middle of a query burst (it waits for at most one
  step's queries).

Captures that bypass ``torch.cuda.CUDAGraph`` (a raw ``torch._C._CUDAGraph``) are not seen.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

active = 0  # CUDA-graph captures in progress in this process
_lock = threading.Lock()  # held by a poll burst, and while a capture begins or ends
_installed = False


@contextlib.contextmanager
def polling() -> Iterator[bool]:
    """``with polling() as ok``: ``ok`` says whether events may be queried now (no capture
    is live); a capture cannot begin until the block ends."""
    with _lock:
        yield not active


def _begin(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        global active
        with _lock:  # (waits for a query burst in progress to end)
            active += 1
        try:
            return original(self, *args, **kwargs)
        except BaseException:
            _ended()
            raise

    return capture_begin


def _end(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            _ended()

    return capture_end


def _ended() -> None:
    global active
    with _lock:
        active = max(0, active - 1)


def install() -> None:
    """Wrap ``torch.cuda.CUDAGraph``'s capture methods (once; idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    import torch.cuda.graphs as graphs

    cls = getattr(graphs, "CUDAGraph", None)
    if cls is None:  # pragma: no cover - a torch without CUDA graphs
        return
    ending = "capture_end_pre" if hasattr(cls, "capture_end_pre") else "capture_end"
    cls.capture_begin = _begin(cls.capture_begin)
    setattr(cls, ending, _end(getattr(cls, ending)))
