"""Steps after their CUDA events resolved: plain numbers, ready for metrics, tables and spans."""

from __future__ import annotations

from typing import Any

# Phases that run on the host by nature: timed with the host clock, no CUDA events.
HOST_PHASES = frozenset({"data"})


class ResolvedPhase:
    __slots__ = (
        "depth",
        "dev_end",
        "dev_start",
        "error",
        "host_end",
        "host_start",
        "memory",
        "name",
        "parent",
        "seq",
    )

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

    @property
    def host_seconds(self) -> float:
        return max(0, self.host_end - self.host_start) / 1e9

    @property
    def device_seconds(self) -> float | None:
        if self.dev_start is None or self.dev_end is None:
            return None
        return max(0, self.dev_end - self.dev_start) / 1e9

    @property
    def seconds(self) -> float:
        """The best duration: device when measured, host otherwise."""
        dev = self.device_seconds
        return self.host_seconds if dev is None else dev

    @property
    def start(self) -> int:
        return self.host_start if self.dev_start is None else self.dev_start

    @property
    def end(self) -> int:
        return self.host_end if self.dev_end is None else max(self.dev_end, self.dev_start or 0)


class ResolvedStep:
    __slots__ = (
        "dev_end",
        "dev_start",
        "error",
        "host_end",
        "host_start",
        "index",
        "phases",
        "sampled_because",
        "samples",
        "scalars",
        "tokens",
    )

    def __init__(self, index: int, host_start: int, host_end: int) -> None:
        self.index = index
        self.host_start = host_start
        self.host_end = host_end
        self.dev_start: int | None = None
        self.dev_end: int | None = None
        self.samples: int | None = None
        self.tokens: int | None = None
        self.phases: list[ResolvedPhase] = []
        self.scalars: list[tuple[str, float]] = []
        self.error = False
        self.sampled_because = ""

    @property
    def host_seconds(self) -> float:
        return max(0, self.host_end - self.host_start) / 1e9

    @property
    def device_seconds(self) -> float | None:
        if self.dev_start is None or self.dev_end is None:
            return None
        return max(0, self.dev_end - self.dev_start) / 1e9

    @property
    def start(self) -> int:
        starts = [self.host_start] + [p.start for p in self.phases]
        return min(starts)

    @property
    def end(self) -> int:
        ends = [self.host_end] + [p.end for p in self.phases]
        if self.dev_end is not None:
            ends.append(self.dev_end)
        return max(ends)
