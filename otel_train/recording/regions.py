"""Evaluation and checkpoint regions: ``otel_train.region(kind)`` on the training thread.

The training thread appends each region's (kind, start, end) to a bounded log; the
efficiency tracker drains it into the goodput split (efficiency.py).
"""

from __future__ import annotations

import collections
import contextlib
from time import perf_counter_ns
from typing import Any, Literal

REGION_KINDS = ("evaluation", "checkpoint")


class RegionLog:
    """Evaluation / checkpoint regions, appended by the training thread (bounded)."""

    def __init__(self) -> None:
        self.done: collections.deque[tuple[str, int, int]] = collections.deque(maxlen=4096)
        # Regions open now, outermost first, and when one last began or ended: what the
        # hang watch reads (an open region has a budget of its own; entering one is
        # progress).
        self.open: list[tuple[str, int]] = []
        self.last_ns = 0

    def region(self, kind: str) -> Region:
        if kind not in REGION_KINDS:
            raise ValueError(
                f"otel_train.region(): kind must be one of {', '.join(REGION_KINDS)}; got {kind!r}"
            )
        return Region(self, kind)


class Region:
    __slots__ = ("_kind", "_log", "_t0")

    def __init__(self, log: RegionLog, kind: str) -> None:
        self._log = log
        self._kind = kind
        self._t0 = 0

    def __enter__(self) -> Region:
        log = self._log
        self._t0 = log.last_ns = perf_counter_ns()
        if len(log.open) < 64:  # (entered and never left: bounded)
            log.open.append((self._kind, self._t0))
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        log = self._log
        t1 = log.last_ns = perf_counter_ns()
        log.done.append((self._kind, self._t0, t1))
        with contextlib.suppress(ValueError):
            log.open.remove((self._kind, self._t0))
        return False
