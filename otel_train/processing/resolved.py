"""Steps after their CUDA events resolved: plain numbers, ready for metrics, tables and spans.

Every derived figure is computed once here; the worker reads them many times.
Times are ``perf_counter_ns`` values; durations are seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..recording.layouts import P_EV0, P_EV1, P_T0, P_T1

if TYPE_CHECKING:
    from ..recording.links import StepLink
    from ..recording.tokens import Consumed


class ResolvedPhase:
    __slots__ = ("depth", "dev_end", "dev_start", "device_seconds", "end", "error",
                 "host_end", "host_seconds", "host_start", "memory", "name", "parent",
                 "seconds", "seq", "start")  # fmt: skip

    def __init__(
        self,
        seq: int,
        parent: int,
        name: str,
        host_start: int,
        host_end: int,
        dev_start: int | None,
        dev_end: int | None,
        memory: tuple[int, int, int, int] | None,
        error: tuple[Any, ...] | None,
    ) -> None:
        self.seq = seq
        self.parent = parent
        self.name = name
        self.host_start = host_start
        self.host_end = host_end
        self.dev_start = dev_start
        self.dev_end = dev_end
        self.memory = memory
        self.error = error
        self.depth = 0
        self.host_seconds = max(0, host_end - host_start) / 1e9
        if dev_start is None or dev_end is None:
            self.device_seconds: float | None = None
            self.seconds = self.host_seconds  # the best duration: device when measured
            self.start, self.end = host_start, host_end
        else:
            self.device_seconds = max(0, dev_end - dev_start) / 1e9
            self.seconds = self.device_seconds
            self.start, self.end = dev_start, max(dev_end, dev_start)


class ResolvedStep:
    __slots__ = (
        "_phases",
        "consumed",
        "dev_end",
        "dev_start",
        "device_seconds",
        "efficiency",
        "end",
        "error",
        "events",
        "host_end",
        "host_seconds",
        "host_start",
        "index",
        "link",
        "padded",
        "rows",
        "sampled_because",
        "samples",
        "scalars",
        "start",
        "tokens",
    )  # fmt: skip

    def __init__(self, index: int, host_start: int, host_end: int) -> None:
        self.index = index
        self.host_start = host_start
        self.host_end = host_end
        self.host_seconds = max(0, host_end - host_start) / 1e9
        self.dev_start: int | None = None
        self.dev_end: int | None = None
        self.device_seconds: float | None = None
        self.start = host_start  # span extent: host and device times together
        self.end = host_end
        self.samples: int | None = None
        self.tokens: int | None = None
        self.padded: int | None = None  # tokens padding included (None: as tokens)
        # One tuple per phase, in entry order (the worker's hot loop reads these):
        # (seq, parent, name, host_start, host_end, dev_start, dev_end, memory, error, seconds)
        self.rows: list[tuple[Any, ...]] = []
        self._phases: list[ResolvedPhase] | None = None
        self.scalars: list[tuple[str, float]] = []
        self.error = False
        self.sampled_because = ""
        self.efficiency: Any = None  # efficiency.StepEfficiency, set by the worker
        self.link: StepLink | None = None  # when the step's trace crosses processes
        self.consumed: list[Consumed] | None = None  # rollouts it consumed (tokens.py)
        # Span events from the debugging components (layouts.OpenStep.events)
        self.events: list[tuple[str, dict[str, Any]]] | None = None

    @property
    def phases(self) -> list[ResolvedPhase]:
        """Phase objects with depth, built on first use (only sampled steps need them)."""
        if self._phases is None:
            depth: dict[int, int] = {}
            out = []
            for seq, parent, name, t0, t1, d0, d1, memory, error, _ in self.rows:
                p = ResolvedPhase(seq, parent, name, t0, t1, d0, d1, memory, error)
                p.depth = depth[seq] = depth.get(parent, -1) + 1 if parent >= 0 else 0
                out.append(p)
            self._phases = out
        return self._phases

    def finish(self) -> None:
        """Derive the span extent and device time once rows and device times are set."""
        if self.dev_start is None:
            return  # host times only: every phase lies inside the step's own extent
        start, end = self.host_start, self.host_end
        for row in self.rows:
            if row[P_EV0] is None:  # (host times; else the device's, placed on the host clock)
                p_start, p_end = row[P_T0], row[P_T1]
            else:
                p_start, p_end = row[P_EV0], max(row[P_EV1], row[P_EV0])
            if p_start < start:
                start = p_start
            if p_end > end:
                end = p_end
        if self.dev_start is not None and self.dev_end is not None:
            self.device_seconds = max(0, self.dev_end - self.dev_start) / 1e9
            end = max(end, self.dev_end)
        self.start, self.end = start, end


def scalar_value(raw: Any, events: Any = None) -> float | None:
    """A recorded scalar's value: a float, or ``(pinned host tensor, event)`` filled from
    the device once the event completed (the caller checks that); the event goes back to
    ``events`` (the pool it came from)."""
    if isinstance(raw, tuple):
        if events is not None:
            events.release(raw[1])
        return float(raw[0].item())
    return raw if isinstance(raw, float) else None
