"""Runs of identical adapter steps, handed to the worker as columns instead of objects.

A plain loop logs the same boundaries in the same order every step (fetch a batch,
forward, backward, optimizer step), each a constant from ``recorder.boundary()``. The
first time a run of boundaries takes an idle recorder through exactly one step and back
to idle, the run is replayed on a scratch recorder with each entry's position standing in
for its time. What comes out is the step's shape, a :class:`Template`: which entries
open and close the step, each phase's entries with its seq and parent, and where the
batch's counts land. It is a function of the boundaries alone (the state machine reads
nothing else on this path), so any later run of the same boundary objects, from the same
thread, from an idle recorder, gives the same shape with other times.

The worker then takes k such steps as one :class:`StepBlock`: their times and counts in
lists, with no ``Step`` or phase tuple built per step. Metrics,
throughput, efficiency figures, the console and the trace sampler read the columns; only
the steps chosen for traces are built as ``Step`` objects
(:meth:`StepBlock.step`). Anything else in the log (an explicit phase, scalars, an
exception, another thread's boundary, the end of an epoch) goes through the ordinary
replay, and the recognition starts again at the next idle point.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple

MAX_TEMPLATE = 64  # entries a step may log to be recognised
MAX_TEMPLATES = 8  # shapes kept per first boundary
KIND = itemgetter(2)
STACK = itemgetter(0)


class Run(NamedTuple):
    """``k`` consecutive steps of one shape as the log held them: the ``k * m`` entries
    from the step of index ``first`` on (the consumer side makes its block of them)."""

    template: Template
    entries: list[tuple[Any, ...]]
    first: int

    @property
    def k(self) -> int:
        """The steps in the run."""
        return self.template.steps_in(len(self.entries))


class Template:
    """One step's shape, in entry positions (0 .. ``m`` - 1) of its run of boundaries."""

    # (weakly referable: the consumer side keeps its view of a shape in a weak cache)
    __slots__ = ("__weakref__", "_repeated", "counts", "end", "kinds", "loose", "m", "mode",
                 "rows", "scalars", "start")  # fmt: skip

    def __init__(
        self,
        kinds: list[Any],
        start: int,
        end: int,
        rows: list[tuple[int, int, str, int, int]],
        counts: tuple[int, ...],
        mode: int,
        scalars: tuple[int, ...] = (),
        loose: tuple[int, ...] = (),
    ) -> None:
        self.kinds = kinds  # the boundary objects, in order
        self._repeated = kinds  # kinds repeated, for comparing many steps at once
        self.m = len(kinds)
        self.start, self.end = start, end  # the entries that open and close the step
        self.rows = rows  # (seq, parent, name, entering entry, leaving entry), by seq
        self.counts = counts  # entries whose (samples, tokens) go to the step
        self.mode = mode
        # User scalars recorded inside the step, and after it (``record()`` after the
        # optimizer step: they belong to no step)
        self.scalars, self.loose = scalars, loose

    def steps_in(self, entries: int) -> int:
        """How many whole steps ``entries`` entries of this shape hold."""
        return entries // self.m

    def match(self, kinds: list[Any], stacks: list[Any], i: int, stack: list[Any]) -> int:
        """How many whole steps of this shape the log holds from entry ``i`` (0 if none):
        ``kinds`` and ``stacks`` are the log entries' kinds and thread stacks."""
        m = self.m
        k = (len(kinds) - i) // m
        if not k or kinds[i : i + m] != self.kinds:
            return 0
        if len(self._repeated) < k * m:
            self._repeated = self.kinds * k
        rep = self._repeated
        if kinds[i : i + k * m] != rep[: k * m]:
            ok, bad = 1, k  # the longest run of whole steps, by bisection (C compares)
            while bad - ok > 1:
                mid = (ok + bad) // 2
                if kinds[i : i + mid * m] == rep[: mid * m]:
                    ok = mid
                else:
                    bad = mid
            k = ok
        run = stacks[i : i + k * m]
        if run.count(stack) != len(run):  # (PhaseStack compares by identity)
            k = next(j for j, s in enumerate(run) if s is not stack) // m
        return k
