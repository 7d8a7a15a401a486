"""Phase trees of other threads: a background thread's phases outside the training
thread's steps (they join the step open when they end, else the next one), and a remote
phase's tree (a phase of another process's step, named by its carrier: links.py).

The step machine's layer for them, between the machine (machine.py) and the phases
(phases.py, whose ``_enter_at`` opens a tree when a phase begins on a thread that is not
the one opening steps). The lock is held, as for the machine.
"""

from __future__ import annotations

import logging
from typing import Any

from .layouts import P_MEMORY, P_SECONDS, P_T1, Step
from .links import Parent, StepLink
from .machine import StepMachine
from .scopes import MAX_ORPHANS, REMOTE
from .tokens import MAX_PRODUCED

_log = logging.getLogger("otel_train")


class TreeMachine(StepMachine):
    """The step machine with background and remote phase trees."""

    def _tree_done(self, holder: Step) -> None:
        """A background thread's outermost phase ended: its tree joins the open step, or
        else waits (bounded) for the next step to end. A remote phase's tree goes to the
        worker on its own, like a step (its rows and events are resolved alike)."""
        self.background_open -= 1
        if holder.mode == REMOTE:
            holder.t1 = holder.phases[-1][P_T1]  # (the outermost phase: it ended last)
            self._end_events(holder)
            holder.closed = True
            self._queue(holder)
            self._keep_produced(holder)
            return
        step = self._current
        if step is not None:
            self._home(holder, step)
            return
        orphans = self._orphans
        if len(orphans) >= MAX_ORPHANS:
            self._drop_tree(orphans.popleft())
        orphans.append(holder)

    def _keep_produced(self, holder: Step) -> None:
        """A remote tree's figures (its outermost phase's host seconds and memory), for
        its scope's produced() (tokens.py): the last MAX_PRODUCED trees only."""
        produced, link = self.produced_figures, holder.link
        if link is None:
            return
        if len(produced) >= MAX_PRODUCED:
            del produced[next(iter(produced))]
        row = holder.phases[-1]
        produced[link.span_id] = (row[P_SECONDS], row[P_MEMORY])

    def _drop_tree(self, holder: Step) -> None:
        self.dropped_phases += len(holder.phases)
        self._release_step(holder)

    def _end_background(self) -> int:
        """The end of recording: background trees no step took are dropped (counted as
        late phases); if no step ever opened, say once why they formed none. Returns
        how many phases were dropped."""
        dropped = 0
        while self._orphans:
            holder = self._orphans.popleft()
            dropped += len(holder.phases)
            self._drop_tree(holder)
        if dropped and self._next_index == 0 and not self._background_warned:
            self._background_warned = True
            _log.warning(
                "otel-train: %d phases ran on a thread other than the main thread while "
                "no step was open, and no step ever opened: such phases join steps, they "
                "never start one. Open steps with otel_train.step() (or an instrumented "
                "trainer) on the training thread.",
                dropped,
            )
        return dropped

    def reset_background(self) -> None:
        """Forget background trees (a replay-only recorder's, when the training process
        takes its state back: it replays them itself)."""
        self._orphans.clear()
        self.background_open = 0

    def _remote_holder(self, t: int, parent: tuple[Any, ...] | None, span: int) -> Step:
        """The tree of a remote phase entered at ``t``: in no step here; a span in the
        trace ``parent`` names if sampled there, else metrics only (links.py); its
        outermost span's id is ``span`` (what its token names, tokens.py)."""
        if self._want_cuda and not self._cuda:
            self._refresh_cuda()
        device = self._thread_device()
        if device is not None:
            holder = Step(-1, t, REMOTE, self._boundary_event(), device)
        else:
            holder = Step(-1, t, REMOTE, None, None)
        if parent is not None:
            holder.link = StepLink.under(Parent(*parent))._replace(span_id=span)
        else:  # (a bad carrier: no trace, but produced() finds its figures by the id)
            holder.link = StepLink(0, span, 0, False)
        self.background_open += 1
        return holder
