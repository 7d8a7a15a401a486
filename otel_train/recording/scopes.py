"""What adapters and users hand the recorder: step modes, boundaries, limits and scopes.

These are the recorder's vocabulary, kept apart from its machinery so that an adapter
reading them (a hook site building its :func:`boundary` once) needs none of the state
machine's code, and so that the limits every module enforces are named in one place.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from .links import Parent

# How an open step is closed.
EXPLICIT = 0  # by the end of ``with step()`` or the adapter's step method
CYCLE = 1  # opened by a bare phase(): closed when a top-level phase name repeats
ADAPTER = 2  # opened and closed by a trainer adapter (data fetch ... optimizer step)
# Not steps: what holds a background thread's phases until they join one (phases.py),
# and a remote phase's tree, a span in another process's trace (links.py).
BACKGROUND = 3
REMOTE = 4

# Phases that run on the host by nature: timed with the host clock, no CUDA events.
HOST_PHASES = frozenset({"data"})
MAX_NAME = 128
MAX_MESSAGE = 1024
MAX_STACK = 8192
MAX_SCALAR_NAMES = 256
MAX_ORPHANS = 64  # background phase trees waiting for a step to end
MAX_LOG = 4096  # deferred boundaries held before the training thread applies them
SETTLE_SLICE = 64  # boundaries applied per hold of the lock by settle()
NEAR_WINDOW = 8  # steps before a debugging window from which nothing is deferred
INT64_MAX = 2**63 - 1

# The settings a recorder reads once, when it is built (machine.py, the carrier gate of
# links.py, the debugging hooks of debug_hooks.py); others it reads where it uses them.
# tests/unit/test_early_calls.py checks this list against the recording code.
BUILT_WITH = (
    "device_timing",
    "max_pending_steps",
    "memory",
    "reset_peak_memory",
    "trace_steps",
    "trace_window_seconds",
    "profile_steps",
    "debug_dir",
    "memory_snapshot",
)

# A boundary's fields, by position: (close, open, begin, end, counted).
B_CLOSE, B_OPEN, B_BEGIN, B_END, B_COUNTED = range(5)
Boundary = tuple[str | tuple[str, ...] | None, str | None, int, int, bool]


def boundary(
    close: str | tuple[str, ...] | None,
    open_: str | None,
    begin: int = 0,
    end: int = 0,
    counted: bool = False,
) -> Boundary:
    """An adapter hook's boundary for ``Recorder.transition``, made once per hook site.

    Exit ``close`` if it is the innermost open phase (a tuple of names: exit innermost
    phases while they are among them, the adapter's own, never a phase the user opened
    around them); end the step if ``end`` (a mode) may
    end it; open a step of mode ``begin`` if none is open; enter ``open_`` if a step is
    (then) open. ``counted``: the entry carries the batch's (samples, tokens). Hooks log
    the same objects every step, so the worker recognises a repeating step by identity
    (recording/templates.py).
    """
    return (close, open_, begin, end, counted)


# A loader's fetch ended: exit its ``data`` phase and count the batch.
DATA_FETCHED = boundary("data", None, counted=True)


class RecorderEntries(Protocol):
    """The entry methods the scopes call: recorder.py's Recorder, which is built on this
    module, so the scopes name them here rather than import it."""

    def enter(self, name: str) -> None: ...

    def exit(self, exc_type: Any = None, exc: Any = None, name: str | None = None) -> None: ...

    def enter_remote(self, name: str, parent: Parent | None, span: int) -> None: ...

    def produced(
        self, name: str, parent: Parent | None, span: int, policy_version: Any = None
    ) -> dict[str, str]: ...

    def step_begin(self, samples: int | None = None, tokens: int | None = None) -> None: ...

    def step_end(self) -> None: ...

    def join(self, parent: Parent) -> None: ...


class PhaseScope:
    """``with recorder.phase(name):``; cached per name, re-entrant (state lives on a stack)."""

    __slots__ = ("_name", "_rec")

    def __init__(self, rec: RecorderEntries, name: str) -> None:
        self._rec = rec
        self._name = name

    def __enter__(self) -> PhaseScope:
        self._rec.enter(self._name)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        self._rec.exit(et, ev, self._name)
        return False


class RemotePhaseScope:
    """``with recorder.phase(name, parent=carrier) as rollout:`` a phase of another
    process's step; ``rollout.produced()`` afterwards: its token (tokens.py)."""

    __slots__ = ("_name", "_parent", "_rec", "_span")

    def __init__(self, rec: RecorderEntries, name: str, parent: Parent | None) -> None:
        self._rec = rec
        self._name = name
        self._parent = parent  # None: a bad carrier, timed here all the same
        self._span = 0  # its span's id, chosen when entered (export/ids.py)

    def __enter__(self) -> RemotePhaseScope:
        self._span = int.from_bytes(os.urandom(8), "big") or 1
        self._rec.enter_remote(self._name, self._parent, self._span)
        return self

    def produced(self, policy_version: int | None = None) -> dict[str, str]:
        """What the consuming step's ``otel_train.consumed()`` takes: this phase's span
        (when its carrier was sampled) and, once it has ended, its figures. The policy
        version is the carrier's unless given here (the weights this process used)."""
        return self._rec.produced(self._name, self._parent, self._span, policy_version)

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        self._rec.exit(et, ev, self._name)
        return False


class StepScope:
    __slots__ = ("_parent", "_rec", "_samples", "_tokens")

    def __init__(
        self,
        rec: RecorderEntries,
        samples: int | None,
        tokens: int | None,
        parent: Parent | None = None,
    ) -> None:
        self._rec = rec
        self._samples = samples
        self._tokens = tokens
        self._parent = parent  # the step joins that trace (links.py)

    def __enter__(self) -> StepScope:
        self._rec.step_begin(self._samples, self._tokens)
        if self._parent is not None:  # (a nested step's joins the outer one, if unlinked)
            self._rec.join(self._parent)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        # A nested step opened nothing (the outer one stands): it does not end the outer one.
        self._rec.step_end()
        return False
