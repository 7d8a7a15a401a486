"""The recorder's entry methods for traces across processes (links.py, tokens.py): a
step's carrier, a step that joins another process's trace, a remote phase's tree and the
tokens of what it produced and what a step consumed.

A layer of the recorder between the deferred log (deferred.py, drain.py) and the entry
methods the hooks call (recorder.py): the same guard in each method (off: nothing; an
error inside: recording off, never raised). Also what a hang record reads of the open
step (:meth:`TraceEntries.hang_view`).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any, NamedTuple

from ..identity import run_id
from .drain import BlockDrain
from .layouts import ENTER_REMOTE, LINK, S_NAME
from .links import Parent, StepLink, carrier_dict, parse_carrier, warn_bad_parent
from .tokens import MAX_CONSUMED, parse_token, produced_token, warn_bad_token
from .values import clean_count


class HangView(NamedTuple):
    """What a hang record names of the training thread's state (processing/hangs.py)."""

    step_index: int | None  # the open step's index; None: no step open
    link: StepLink | None  # the open step's link, traced whatever the sampler says
    phases: list[str]  # the names on the step stack, outermost first
    thread: int | None  # the ident of the thread the step stack is of, if any is open


class TraceEntries(BlockDrain):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warned_parent = False  # a bad carrier is warned about once
        self._warned_token = False  # and a bad token (tokens.py)
        self._run = run_id()  # this run's id, if known: carriers name it (links.py)

    def carrier(self, policy_version: int | None = None) -> dict[str, str]:
        """The open step's carrier, its span's ids chosen now if they were not; empty
        when no step is open (links.py)."""
        if not self.enabled:
            return {}
        try:
            t = perf_counter_ns()
            with self._lock:
                self._settle()
                link = self._own_link(t)
                index = self._current.index if self._current is not None else -1
            if link is None:
                return {}
            return carrier_dict(link, index, self._run, clean_count(policy_version))
        except Exception:
            self._fail()
            return {}

    def join(self, parent: Parent) -> None:
        """The open step becomes a child of the span ``parent`` names (logged)."""
        if not self.enabled:
            self._disabled()
            return
        try:
            self._record((None, 0, LINK, tuple(parent)), self._defer)
        except Exception:
            self._fail()

    def enter_remote(self, name: str, parent: Parent | None, span: int) -> None:
        """Enter a remote phase (its own tree, in no step here: links.py) whose outermost
        span gets the id ``span``."""
        if not self.enabled:
            self._disabled()
            return
        try:
            item = (self._tls_stack(), perf_counter_ns(), ENTER_REMOTE, name,
                    tuple(parent) if parent is not None else None, span)  # fmt: skip
            self._record(item, self._defer)
        except Exception:
            self._fail()

    def produced(
        self, name: str, parent: Parent | None, span: int, policy_version: Any = None
    ) -> dict[str, str]:
        """The token of the remote phase whose span is ``span`` (tokens.py): figures
        once it has ended (the log applied first), else only its span."""
        if not self.enabled or not span:
            return {}
        try:
            with self._lock:
                self._settle()
                figures = self.produced_figures.pop(span, None)
            version = clean_count(policy_version)
            if parent is not None and version is not None:
                parent = parent._replace(policy_version=version)
            mem = self.memory
            total = mem.total_bytes if mem is not None else None
            role = self.settings.role
            return produced_token(name, parent, span, self._run, role, figures, total)
        except Exception:
            self._fail()
            return {}

    def consumed(self, token: Any, policy_version: Any = None) -> None:
        """The open step consumed what ``token`` names (tokens.py): a span link to it,
        its staleness, its figures in the console; a bad token warns once."""
        if not self.enabled:
            return
        try:
            try:
                got, why = parse_token(token, self._run, clean_count(policy_version))
            except Exception:
                got, why = None, "a token that could not be read"
            with self._lock:
                self._settle()
                step = self._current
                if got is not None and step is None:
                    got, why = None, "a token outside any step"
                if got is not None and step is not None:
                    if step.consumed is None:
                        step.consumed = []
                    if len(step.consumed) < MAX_CONSUMED:
                        step.consumed.append(got)
            if got is None and not self._warned_token:
                self._warned_token = True
                warn_bad_token(why)
        except Exception:
            self._fail()

    def hang_view(self, timeout: float) -> HangView | None:
        """The open step and the step stack for a hang record, the log applied first
        (the open step is then traced, its span's ids chosen now); None if the lock was
        not free within ``timeout`` seconds (the hang watch waits on no stuck thread)."""
        if not self._lock.acquire(timeout=timeout):
            return None
        try:
            self._settle()
            step, stack = self._current, self.step_stack
            link = self._hang_link(perf_counter_ns()) if step is not None else None
            return HangView(
                step.index if step is not None else None,
                link,
                [e[S_NAME] for e in stack] if stack else [],
                getattr(stack, "thread", None) if stack else None,
            )
        finally:
            self._lock.release()

    def _parent_of(self, carrier: Any, where: str) -> Parent | None:
        """What ``carrier`` names, or None with one warning per session (links.py)."""
        try:
            parent, why = parse_carrier(carrier, self._run)
        except Exception:
            parent, why = None, "a carrier that could not be read"
        if parent is None and not self._warned_parent:
            self._warned_parent = True
            warn_bad_parent(why, where)
        return parent
