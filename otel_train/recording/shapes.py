"""Learning step shapes from the deferred log (templates.py), for the consumer side's
columns (processing/blocks.py).

A plain loop logs the same boundary objects in the same order every step. The first
time a run of them takes an idle recorder through exactly one step, :class:`StepShapes`
replays the run on a scratch state machine with entry positions for times, and keeps the
resulting :class:`~otel_train.recording.templates.Template`. Later runs of the same kinds
from the same thread are then taken as blocks without a replay. Learning is bounded
(8 shapes per first boundary, 64 failed attempts) so that a loop that never repeats
costs only the attempts.
"""

from __future__ import annotations

from typing import Any, Literal

from ..settings import Settings
from .layouts import P_NAME, P_PARENT, P_SEQ, P_T0, P_T1, SCALARS
from .phases import PhaseMachine
from .scopes import ADAPTER, Boundary
from .templates import MAX_TEMPLATE, MAX_TEMPLATES, Template

MAX_MISSES = 64  # runs that could not be learned before learning stops


class StepShapes:
    """The shapes recognised so far, by their first boundary, and how to find more."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings  # the scratch machine's (it must decide as the recorder does)
        self.templates: dict[Boundary, list[Template]] = {}
        self.misses = 0  # runs that could not be learned; learning stops at MAX_MISSES

    def partial_at(self, kinds: list[Any], stacks: list[Any], i: int) -> bool:
        """Whether entries ``i`` .. the end are the beginning of one step of a known shape."""
        rest = len(kinds) - i
        for tpl in self.templates.get(kinds[i]) or ():
            if rest < tpl.m and kinds[i:] == tpl.kinds[:rest]:
                run = stacks[i:]
                return run.count(stacks[i]) == rest
        return False

    def block_at(
        self, entries: list[tuple[Any, ...]], kinds: list[Any], stacks: list[Any], i: int
    ) -> tuple[int, Template | None]:
        """Whole recognised steps from entry ``i`` (the recorder is idle): (count, shape)."""
        stack = stacks[i]
        known = self.templates.get(kinds[i])
        best, best_tpl = 0, None
        for tpl in known or ():
            k = tpl.match(kinds, stacks, i, stack)
            if k * tpl.m > best * (best_tpl.m if best_tpl else 0):
                best, best_tpl = k, tpl
        if best > 1 or (best and i + best * best_tpl.m == len(kinds)):  # type: ignore[union-attr]
            return best, best_tpl
        # None, or one step and more after it: a longer shape may fit (scalars recorded
        # after each step, say). Learning is bounded: 8 shapes, 64 failed attempts.
        if self.misses >= MAX_MISSES or (known and len(known) >= MAX_TEMPLATES):
            return best, best_tpl
        learned = self._learn(entries, kinds, stacks, i)
        if learned is None:
            return best, best_tpl
        if any(t.kinds == learned.kinds for t in known or ()):
            self.misses += 1  # the shape is known: it just did not repeat here
            return best, best_tpl
        self.templates.setdefault(kinds[i], []).append(learned)
        k = learned.match(kinds, stacks, i, stack)
        if k * learned.m > best * (best_tpl.m if best_tpl else 0):
            return k, learned
        return best, best_tpl

    def _learn(
        self, entries: list[tuple[Any, ...]], kinds: list[Any], stacks: list[Any], i: int
    ) -> Template | None:
        """Replay entries from ``i`` on a scratch machine, positions for times, until it
        is idle again: the step's shape if exactly one step opened and closed."""
        stack = stacks[i]
        end = i
        limit = min(len(entries), i + MAX_TEMPLATE)
        while (
            end < limit
            and stacks[end] is stack
            and (kinds[end].__class__ is tuple or kinds[end] == SCALARS)
        ):
            end += 1  # the run of this thread's boundaries and scalars: a step must fit in it
        if end - i >= 2:
            learned = ScratchMachine(self.settings).first_step(entries, kinds, i, end)
            if learned is False:
                return None  # more may follow: try again next time
            if learned is not None:
                return learned
        if end == len(entries):
            return None  # the log ends inside the step: try again next time
        self.misses += 1
        return None


class ScratchMachine(PhaseMachine):
    """A state machine of its own for one run of a log's kinds, positions for times:
    what step it makes, if it makes exactly one."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, replay_only=True)

    def first_step(
        self, entries: list[tuple[Any, ...]], kinds: list[Any], i: int, end: int
    ) -> Template | Literal[False] | None:
        """Replay kinds ``i`` .. ``end`` until a step closes: its shape; False if more may
        follow (the log ends with the scalars after it); None if no single clean step
        came out."""
        scratch_stack: list[Any] = []
        counts: list[int] = []
        scalars: list[int] = []
        for j in range(i, end):
            kind, pos = kinds[j], j - i
            if kind.__class__ is not tuple:  # user scalars, inside the step
                scalars.append(pos)
                continue
            close, open_, begin, end_mode, counted = kind
            self._transition_at(scratch_stack, pos, close, open_, begin, end_mode)
            current = self._current
            if counted and current is not None and current.mode == ADAPTER:
                counts.append(pos)
            if self._pending:
                step = self._pending[0]
                if (
                    current is not None
                    or scratch_stack
                    or len(self._pending) != 1
                    or self.dropped_phases
                    or not self.enabled
                    or step.error
                    or (scalars and scalars[0] < step.t0)  # scalars before the step began
                ):
                    return None
                last = j + 1
                while last < end and kinds[last] == SCALARS:
                    last += 1  # recorded after the step: loose, like the replay's
                if last == len(entries):
                    return False  # more may follow: try again next time
                rows = sorted(
                    (p[P_SEQ], p[P_PARENT], p[P_NAME], p[P_T0], p[P_T1]) for p in step.phases
                )
                loose = tuple(range(j + 1 - i, last - i))
                return Template(kinds[i:last], step.t0, step.t1, rows, tuple(counts),
                                step.mode, tuple(scalars), loose)  # fmt: skip
        return None
