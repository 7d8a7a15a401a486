"""Phases on a thread's stack: entering, exiting, and an adapter's boundary in one go.

A phase lives as a stack entry (a list, see layouts.S_NAME ...) while it is open and
becomes a row of its step (a tuple, layouts.P_SEQ ...) when it exits. Like the step
machine below it, every method applies an event at a time read earlier, with the lock
held or on an object nobody else sees. :meth:`PhaseMachine._transition_at` is the common
CPU case: it handles a whole adapter boundary without the general enter/exit path, so a
replayed plain-loop step costs a few list operations per boundary.
"""

from __future__ import annotations

from typing import Any

from .collectives import PREFIX as COLLECTIVE
from .layouts import (
    S_NAME,
    S_PEAK_ALLOCATED,
    S_PEAK_RESERVED,
    S_SEQ,
    S_STEP,
    MainPhaseStack,
    Step,
    describe_exception,
)
from .scopes import ADAPTER, BACKGROUND, CYCLE, HOST_PHASES, MAX_STACK, REMOTE
from .trees import TreeMachine

# Where a collective run with no step open goes: nowhere. It is no step (an evaluation's
# reductions, a loss reduced for logging after the optimizer's step), and opening one
# for it made the next training step start there and lose its counts. Its entry keeps
# the stack paired until it exits; the hang watch still names it (recorder.py).
OUTSIDE = Step(-1, 0, BACKGROUND, None, None)
OUTSIDE.closed = True


class PhaseMachine(TreeMachine):
    """The step machine with phases: what a boundary does to a thread's stack and step.

    The training thread is the one whose stack opened the last explicit or adapter step
    (``step_stack``); before any has, the main thread. Another thread's phases are
    *background* phases: they never open, end or cycle a step. Each outermost one
    collects the phases nested in it in a holder (an Step of mode BACKGROUND) and,
    when it ends, joins the step open then, or else the next step to end (machine.py).
    A remote phase (links.py) on any thread is held the same way (mode REMOTE) and goes
    to the worker on its own when it ends.
    """

    def _background(self, stack: list[list[Any]]) -> bool:
        """Whether ``stack`` is a background thread's (see the class docstring)."""
        owner = self.step_stack
        if owner is None:
            return stack.__class__ is not MainPhaseStack
        return stack is not owner

    def _enter_at(
        self, name: str, t: int, stack: list[list[Any]], holder: Step | None = None
    ) -> None:
        """Enter ``name`` on ``stack`` at ``t``: in the open step, the background or
        remote tree open on the stack, or ``holder`` (a remote tree it begins)."""
        if not self.enabled:
            return
        try:
            step = self._current
            if holder is not None:
                step = holder
            elif self.background_open and stack and stack[-1][S_STEP].mode == REMOTE:
                step = stack[-1][S_STEP]  # nested in a remote phase: part of its tree
            elif stack is not self.step_stack and self._background(stack):
                if stack:
                    step = stack[-1][S_STEP]
                else:
                    step = Step(-1, t, BACKGROUND, None, self._thread_device())
                    self.background_open += 1
            elif step is None and not stack and name.startswith(COLLECTIVE):
                stack.append([name, 0, -1, t, None, OUTSIDE, 0, 0, 0, 0])
                return
            elif step is None or (step.top is not None and not stack):
                step = self._enter_top(name, step, t, stack)
                if step is None:
                    return
            if self._cuda:
                # (a tree on a thread of another device: host time, see _thread_device)
                timed = step.device is not None and name not in HOST_PHASES
                ev = self._boundary_event() if timed else None
                r0 = o0 = 0
                sample = self._boundary_memory()
                if sample is not None:
                    pa, pr, r0, o0 = sample
                    self._peak_stacks.fold(stack, pa, pr)
            else:
                ev = None
                r0 = o0 = 0
            seq = step.seq
            step.seq = seq + 1
            if stack:
                if len(stack) >= MAX_STACK:
                    raise RuntimeError("phase nesting deeper than 8192: enter/exit mismatch?")
                top = stack[-1]
                parent = top[S_SEQ] if top[S_STEP] is step else -1
                stack.append([name, seq, parent, t, ev, step, 0, 0, r0, o0])
            else:
                stack.append([name, seq, -1, t, ev, step, 0, 0, r0, o0])
        except Exception:
            self._fail()

    def _enter_top(
        self, name: str, step: Step | None, t: int, stack: list[list[Any]]
    ) -> Step | None:
        """A top-level phase: open a cycle step if none, or start the next cycle."""
        if step is None:
            step = self._begin_at(CYCLE, t, stack=stack)
        elif step.top is not None and name in step.top:
            self._close(step, t)  # the name repeats: a new cycle begins here
            step = self._begin_at(CYCLE, t, stack=stack)
        if step is not None and step.top is not None:
            step.top.add(name)
        return step

    def _describe(self, exc_type: Any, exc: Any) -> tuple[Any, ...]:
        error = describe_exception(exc_type, exc)
        if self._debug is not None:
            error += (self._debug.phase_error(exc),)  # the OOM snapshot's path, if any
        return error

    def _exit_at(
        self,
        t: int,
        stack: list[list[Any]],
        error: tuple[Any, ...] | None = None,
        name: str | None = None,
    ) -> None:
        """Exit the innermost phase (or ``name`` and what an adapter opened inside it);
        ``error`` is the exception it ended with, already described."""
        if not self.enabled:
            return
        try:
            if not stack:
                return
            if (
                name is not None
                and stack[-1][S_NAME] != name
                and any(e[S_NAME] == name for e in stack)
            ):
                # Phases an adapter opened inside this one (the model's inferred forward)
                # end with it; popping the wrong entry would leak this one on the stack.
                while stack and stack[-1][S_NAME] != name and self.enabled:
                    self._exit_at(t, stack)
                if not stack or not self.enabled:
                    return
            entry = stack[-1]
            _, seq, parent, t0, ev0, step, _, _, r0, o0 = entry
            ev = None
            if ev0 is not None:
                ev = self._boundary_event()
                if ev is None:  # a CUDA-graph capture began inside the phase: host time
                    self.events.release(ev0)
                    ev0 = None
            memory = None
            sample = self._boundary_memory()
            if sample is not None:
                pa, pr, r, o = sample
                self._peak_stacks.fold(stack, pa, pr)
                memory = (entry[S_PEAK_ALLOCATED], entry[S_PEAK_RESERVED], r - r0, o - o0)
            stack.pop()
            if step.closed:
                # The step ended (another thread or an adapter) while this phase ran.
                self.dropped_phases += step is not OUTSIDE
                self.events.release(ev0)
                self.events.release(ev)
                return
            if error is not None:
                step.error = True
            # Host seconds; a phase with events gets its device seconds on the worker.
            seconds = (t - t0) / 1e9 if t > t0 else 0.0
            step.phases.append((seq, parent, entry[S_NAME], t0, t, ev0, ev, memory, error, seconds))
            if step.mode >= BACKGROUND and (not stack or stack[-1][S_STEP] is not step):
                self._tree_done(step)
        except Exception:
            self._fail()

    def _exit_top(self, t: int, stack: list[list[Any]]) -> None:
        """Exit the innermost open phase at ``t``: the general path with CUDA, else the
        host-only close inline."""
        if self._cuda:
            self._exit_at(t, stack)
            return
        name, seq, parent, t0, _, owner, _, _, _, _ = stack.pop()  # (see S_NAME)
        if owner.closed:
            self.dropped_phases += owner is not OUTSIDE
        else:
            seconds = (t - t0) / 1e9 if t > t0 else 0.0
            owner.phases.append((seq, parent, name, t0, t, None, None, None, None, seconds))
            if owner.mode >= BACKGROUND and (not stack or stack[-1][S_STEP] is not owner):
                self._tree_done(owner)

    def _transition_at(
        self,
        stack: list[list[Any]],
        t: int,
        close: str | tuple[str, ...] | None,
        open_: str | None,
        begin: int,
        end: int,
    ) -> None:
        """Boundary ``(close, open_, begin, end)`` at ``t`` (see scopes.boundary())."""
        if not self.enabled:
            return
        try:
            if stack and (stack is not self.step_stack or self.background_open):
                mode = stack[-1][S_STEP].mode  # (training thread: only while a tree is open)
                if mode == REMOTE or (mode == BACKGROUND and stack is not self.step_stack):
                    # A hook inside a background or remote phase (a rollout calling the
                    # instrumented model): a phase of that tree, never a step's boundary.
                    self._background_transition(stack, t, close, open_)
                    return
            if close is not None and stack:
                if type(close) is str:  # (the common case, inline)
                    if stack[-1][S_NAME] == close:
                        self._exit_top(t, stack)
                else:
                    while stack and stack[-1][S_NAME] in close:
                        self._exit_top(t, stack)
            step = self._current
            if (
                end
                and step is not None
                and (step.mode == end or (end == ADAPTER and step.mode == CYCLE))
            ):
                self._close(step, t)
                step = None
            if open_ is None:
                return
            if step is None:
                if not begin:
                    return  # a boundary outside any step (evaluation, a stray backward)
                step = self._begin_at(begin, t, stack=stack)
                if step is None:
                    return
            if self._cuda or (step.top is not None and not stack):
                self._enter_at(open_, t, stack)  # the general path: events, memory, cycles
                return
            seq = step.seq
            step.seq = seq + 1
            parent = stack[-1][S_SEQ] if stack and stack[-1][S_STEP] is step else -1
            stack.append([open_, seq, parent, t, None, step, 0, 0, 0, 0])
        except Exception:
            self._fail()

    def _background_transition(
        self,
        stack: list[list[Any]],
        t: int,
        close: str | tuple[str, ...] | None,
        open_: str | None,
    ) -> None:
        """A boundary inside a background or remote tree: its phases only (the same
        exits as _transition_at's, no step opened or ended)."""
        if close is not None and stack:
            if type(close) is str:
                if stack[-1][S_NAME] == close:
                    self._exit_at(t, stack)
            else:
                while stack and stack[-1][S_NAME] in close:
                    self._exit_at(t, stack)
        if open_ is not None:
            self._enter_at(open_, t, stack)
