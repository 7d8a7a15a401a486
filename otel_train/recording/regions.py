"""Evaluation and checkpoint regions: ``otel_train.region(kind)`` on the training thread.

The training thread appends each region's (kind, start, end) to a bounded log; the
efficiency tracker drains it into the goodput split (efficiency.py).
"""

from __future__ import annotations

import collections
from time import perf_counter_ns
from typing import Any, Literal

REGION_KINDS = ("evaluation", "checkpoint")


class RegionLog:
    """Evaluation / checkpoint regions, appended by the training thread (bounded)."""

    def __init__(self) -> None:
        self.done: collections.deque[tuple[str, int, int]] = collections.deque(maxlen=4096)

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
        self._t0 = perf_counter_ns()
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self._log.done.append((self._kind, self._t0, perf_counter_ns()))
        return False
