"""Which traces of a large record the report draws: its memory stays bounded however
long the run traced.

A first pass over a process's traces files reads only its step spans: how many steps
were traced, and which are drawn whatever happens (errors first, then the slowest: the
waterfalls' choice). When more than ``max_traces`` were traced, the second pass keeps the
spans of a uniform sample of about ``max_traces`` traces, chosen by a hash of the trace
id (so a generator's phases under a kept step are kept too), plus those. Metric
snapshots are never sampled: every chart is drawn from all of them.
"""

from __future__ import annotations

import heapq
import zlib
from dataclasses import dataclass, field
from typing import Any

from .. import contract as c
from .files import RecordPart, Skipped, requests

SAMPLE_FROM_BYTES = 16 * 1024 * 1024  # smaller traces are drawn whole, in one pass
MAX_TRACES = 500  # traced steps a process's page draws at most (besides the always drawn)
_HASH_RANGE = 2**32


@dataclass
class TraceChoice:
    """The traces kept: a ``fraction`` of them by hash, and ``always`` whatever theirs."""

    fraction: float = 1.0
    always: set[str] = field(default_factory=set)
    steps_seen: int = 0  # step spans in the record (0: not counted, drawn whole)

    def keeps(self, trace_id: str) -> bool:
        return (
            self.fraction >= 1.0
            or trace_id in self.always
            or zlib.crc32(trace_id.encode()) < self.fraction * _HASH_RANGE
        )

    @property
    def sampled(self) -> bool:
        return self.fraction < 1.0


def choose(parts: list[RecordPart], max_traces: int | None, fraction: float = 1.0) -> TraceChoice:
    """The traces of one process's ``parts`` (its traces files) to keep; ``fraction``: at
    most this share (the run's ranks' share, for a generator's record beside them)."""
    if max_traces is None or sum(p.path.stat().st_size for p in parts) < SAMPLE_FROM_BYTES:
        return TraceChoice(fraction)
    from .waterfalls import MAX_WATERFALLS

    worst: list[tuple[bool, float, str]] = []  # (error, seconds, trace id): a min-heap
    seen = 0
    for part in parts:
        for line in requests(part, Skipped(), "scanning"):  # (pass 2 counts bad lines)
            for span in _step_spans(line.request):
                seen += 1
                heapq.heappush(worst, _badness(span))
                if len(worst) > MAX_WATERFALLS:
                    heapq.heappop(worst)
    share = min(fraction, max_traces / seen) if seen else fraction
    return TraceChoice(share, {trace for _, _, trace in worst}, seen)


def _step_spans(request: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        return [s for rs in request["resourceSpans"] for ss in rs.get("scopeSpans", [])
                for s in ss.get("spans", []) if s.get("name") == c.STEP_SPAN.name]  # fmt: skip
    except (AttributeError, TypeError):
        return []  # (a line of the wrong shape: pass 2 counts it)


def _badness(span: dict[str, Any]) -> tuple[bool, float, str]:
    try:
        seconds = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9
        error = span.get("status", {}).get("code") == 2
        return bool(error), seconds, str(span["traceId"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return False, 0.0, ""
