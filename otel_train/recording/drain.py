"""The worker's way through the deferred log: runs of recognised steps taken whole.

A layer of the recorder over the deferred log (deferred.py): :meth:`BlockDrain.drain_blocks`
applies the log like ``settle()`` does, except that runs of steps whose boundaries repeat
a shape learned in shapes.py leave it as runs (templates.py), with no step replayed.
It also holds what a replica (the sidecar's) needs to apply a log written elsewhere: the
entries logged from outside, and the state taken from where the training process was.
"""

from __future__ import annotations

from typing import Any

from .deferred import DeferredLog
from .layouts import L_KIND, L_SCALARS, L_STACK, Step, newest_time
from .scopes import CYCLE
from .shapes import StepShapes
from .stamps import StampedLog
from .templates import KIND, STACK, Run, Template


class BlockDrain(DeferredLog):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shapes = StepShapes(self.settings)
        self.blocks = True  # whether drain_blocks() may take blocks (tests compare both ways)

    @property
    def _templates(self) -> dict[Any, Any]:
        """The step shapes learned so far (for tests: StepShapes.templates)."""
        return self._shapes.templates

    def drain_blocks(self, keep_partial: bool = False) -> list[tuple[list[Step], Run]]:
        """Apply the log, taking runs of recognised steps whole (recording/templates.py).

        Returns ``(steps finished before the run, run)`` pairs in order; steps
        finished after the last block stay in ``pending``. Normally the worker's call.
        ``keep_partial``: a log that ends inside a step of a known shape keeps that
        step's entries for the next call (the sidecar's feeder drains every few steps:
        replaying the partial step, or learning from it, would cost more than the rest).
        """
        out: list[tuple[list[Step], Run]] = []
        if not self._log or not self._defer or not self.blocks or self.stamping:
            return out  # (stamped steps are replayed one by one: _settle)
        with self._lock:
            self._catch_up()
            log = self._log
            # Entries the training thread appends meanwhile wait for the next call. (Those
            # taken here are applied before the lock is released: current_step waits.)
            entries = self.take_log()
            self.note_progress(newest_time(entries))
            try:
                self._drain_entries(entries, keep_partial, out)
            except Exception:
                log.clear()
                self._fail()
            if self._debug is not None:
                self._decide_deferral()
        return out

    def _drain_entries(
        self, entries: list[tuple[Any, ...]], keep_partial: bool, out: list[tuple[list[Step], Run]]
    ) -> None:
        """drain_blocks' part with the lock held: ``entries`` applied, runs taken whole."""
        n = len(entries)
        kinds: list[Any] = []
        stacks: list[Any] = []
        shapes = self._shapes
        marks, self.idle_mark = self.marks_idle, None
        i = 0
        while i < n:
            if marks and self._is_idle():
                self.idle_mark = (i, self._next_index, self.step_stack)
            item = entries[i]
            if item[L_KIND].__class__ is tuple:  # an adapter boundary: a step may begin
                stack = item[L_STACK]
                if (
                    self._current is None
                    and not stack
                    and self.enabled
                    and not self._orphans  # (they join the next step replayed)
                ):
                    if not kinds:
                        kinds = list(map(KIND, entries))
                        stacks = list(map(STACK, entries))
                    if keep_partial and shapes.partial_at(kinds, stacks, i):
                        self._log.extendleft(reversed(entries[i:]))
                        n = i  # (the rest waits in the log)
                        break
                    k, tpl = shapes.block_at(entries, kinds, stacks, i)
                    if k:
                        assert tpl is not None
                        i += self._take_block(entries, i, k, tpl, stack, out)
                        continue
            self._replay(item)
            i += 1
        if marks and self._is_idle():
            self.idle_mark = (n, self._next_index, self.step_stack)
        if self.idle_mark is not None:  # (as entries applied after that point)
            self.idle_mark = (n - self.idle_mark[0], *self.idle_mark[1:])

    def _take_block(
        self,
        entries: list[tuple[Any, ...]],
        i: int,
        k: int,
        tpl: Template,
        stack: list[Any],
        out: list[tuple[list[Step], Run]],
    ) -> int:
        """Take ``k`` steps of shape ``tpl`` from entry ``i`` as one run, as if they had
        been replayed: the step indices and the step stack move on. Returns the entries
        taken."""
        run = entries[i : i + k * tpl.m]
        out.append((list(self._pending), Run(tpl, run, self._next_index)))
        for p in tpl.loose:  # scalars recorded between steps
            for e in run[p :: tpl.m]:
                self.loose_scalars.extend(e[L_SCALARS])
        self._pending.clear()
        self._next_index += k
        if tpl.mode != CYCLE:
            self.step_stack = stack
        return k * tpl.m

    # -- a replica's (the sidecar's: sidecar/replica.py): the log from elsewhere ----------

    def time_resolved(self, device: int) -> None:
        """(A replica: the sidecar's.) The entries logged from now on carry stamps whose
        events were resolved in the training process (device.ResolvedEvent), whose device
        is ``device``: steps and phases are timed on it as they are there."""
        if self._replay_only and not self._cuda:
            self.device = device
            self._cuda = True
            self._log = StampedLog(None, self._log)

    def log_entries(self, entries: list[tuple[Any, ...]]) -> None:
        """Log entries decoded elsewhere (a replica's: the training process's ring), to
        be applied as the hooks' own are."""
        self._log.extend(entries)

    def idle_at(self, next_index: int, stack: Any) -> None:
        """Go on from where the one that applied the log elsewhere was idle: no step
        open, ``next_index`` the next step's index, ``stack`` the step stack (the lock
        is held)."""
        self._next_index, self.step_stack = next_index, stack
        self._current = None

    def drop_open(self) -> None:
        """Forget the open step, the open scoped steps and the background trees, none
        of them finished: a replica's, when the training process takes its state back
        and goes on with them (sidecar/replica.py)."""
        self._current = None
        self._scoped.clear()
        self.reset_background()
