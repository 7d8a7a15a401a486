"""Lines for the run summary that only the training process knows: how the adapter took
its steps or counted its samples. The adapters add them; each delivery carries the
current ones (processing/source.py's Counters) to the consumer, whose summary prints
them (processing/console.py)."""

from __future__ import annotations


class SummaryNotes:
    """The session's notes, each said once. ``lines`` is replaced, never changed in place,
    so another thread reads a whole tuple without a lock."""

    def __init__(self) -> None:
        self.lines: tuple[str, ...] = ()

    def add(self, line: str) -> None:
        if line not in self.lines:
            self.lines = (*self.lines, line)

    def discard(self, line: str) -> None:
        if line in self.lines:
            self.lines = tuple(n for n in self.lines if n != line)
