"""Raw handover: the deferred log goes to the sidecar unapplied.

Applying the log (the step state machine, recognising step shapes) costs the training
thread ~70 us per pump on cold caches, whatever the number of steps in it. In raw mode
the pump takes the log's entries as they are (one C-level copy), and the sidecar's
replica recorder applies them. The training process's own state machine then lags;
:class:`RawHandover` keeps what was sent since the last point the sidecar found its
replica idle (no open step, no open phase), so that anything that needs the state
(an adapter asking for the open step, an exception, the FLOP probe, shutdown) has
the recorder catch up first: it replays those entries locally from that idle point,
drops the steps they finish (the sidecar has them) and continues with its own state,
handing on finished steps again (the parts mode). Raw mode starts again at the next
point where the local recorder is idle with nothing waiting.

Stream positions count the entries sent in one raw session; the sidecar reports
``(IDLE, session, position, next_index, step-stack token)`` and the kept entries
before ``position`` are let go, so at most about a report interval of entries is kept.
They are let go about a hundred at each take rather than all at the report: freeing a
report interval's entries (about a thousand tuples) at once took 50-100 us of the
training thread's CPU in one pump (``benchmarks/README.md``, "Pump lumps").
"""

from __future__ import annotations

import collections
from itertools import islice
from typing import Any

from ..recording.layouts import newest_time
from ..recording.recorder import Recorder
from . import wire

# Entries kept for a catch-up: past this many (the sidecar stopped acknowledging, or fell
# a pipe's worth behind) the recorder catches up here and hands on finished steps.
MAX_UNAPPLIED = 1 << 14
RELEASE_PER_TAKE = 96  # acknowledged entries let go per take (a plain loop's takes ~40)


class RawHandover:
    def __init__(self, recorder: Recorder, send: Any) -> None:
        self.rec = recorder
        self._send = send
        self.raw = False
        self.session = 0
        self._unapplied: collections.deque[tuple[Any, ...]] = collections.deque()
        self._base = 0  # stream position of _unapplied[0]
        self._acked = 0  # stream position the sidecar's replica was last idle at
        self._sent = 0  # stream position after the last entry sent
        self._idle: tuple[int, Any] = (0, None)  # (next step index, step stack) there
        self._stacks: dict[int, Any] = {}  # token -> this process's stack
        self.caught_up = 0  # entries replayed here to catch up (a figure for tests)
        self.left = 0  # raw sessions ended by a catch-up
        self._wait = 0  # try_enter calls to let pass before the next session
        self._backoff = 8

    def try_enter(self) -> None:
        """Start a raw session if the recorder is idle with nothing waiting (lock held)."""
        if self._wait > 0:
            self._wait -= 1  # (state asked for often: raw sessions would end at once)
            return
        rec = self.rec
        stack = rec.step_stack
        if (
            self.raw
            or not rec._defer
            or rec._current is not None
            or rec._pending
            or rec._scoped
            or rec.background_open
            or rec._orphans
            or stack
            or not rec.enabled
        ):
            return
        self.raw = True
        self.session += 1
        self._unapplied.clear()
        self._base = self._sent = self._acked = 0
        self._idle = (rec._next_index, stack)
        token = None
        if stack is not None:
            token = id(stack)
            self._stacks[token] = stack
        self._send((wire.RAW_BEGIN, self.session, rec._next_index, token))

    def take(self) -> tuple[int, list[tuple[Any, ...]]] | None:
        """The log's entries as they are, for the sidecar (lock held)."""
        log = self.rec._log
        n = len(log)
        if not n:
            return None
        if len(self._unapplied) + n > MAX_UNAPPLIED:  # the sidecar fell far behind
            self.leave_raw()  # (the log stays: the next pump applies it here)
            return None
        entries = list(islice(iter(log.popleft, None), n))
        self.rec.note_progress(newest_time(entries))  # (the hang watch's progress)
        self._unapplied.extend(entries)
        self._sent += n
        if self._acked > self._base:  # (at least as many as came in: the backlog shrinks)
            self._release(max(RELEASE_PER_TAKE, n))
        stack = self.rec.step_stack
        if stack is not None:  # the idle points the sidecar reports name this stack
            self._stacks[id(stack)] = stack
        return self.session, entries

    def on_idle(self, session: int, position: int, next_index: int, token: Any) -> None:
        """The sidecar's replica was idle at ``position`` (lock held)."""
        if session != self.session or not self.raw or position <= self._acked:
            return
        if token is not None and token not in self._stacks:
            return  # a stack this process did not name: keep the entries (catch up from before)
        self._acked = min(position, self._sent)  # let go by the next takes (_release)
        self._idle = (next_index, self._stacks.get(token) if token is not None else None)

    def _release(self, most: int) -> None:
        """Let go of up to ``most`` kept entries the sidecar acknowledged."""
        drop = min(self._acked - self._base, most)
        collections.deque(islice(iter(self._unapplied.popleft, None), drop), maxlen=0)
        self._base += drop

    def leave_raw(self) -> None:
        """Bring the local state machine up to what was sent (recorder lock held)."""
        if not self.raw:
            return
        self.raw = False
        self.left += 1
        self._wait = self._backoff
        self._backoff = min(4096, self._backoff * 2)
        self._release(self._acked - self._base)  # the replay starts at the idle point
        rec = self.rec
        rec._next_index, rec.step_stack = self._idle
        rec._current = None
        loose = len(rec.loose_scalars)
        # The sidecar's replica counts what these entries drop: do not count it twice.
        dropped = rec.dropped_steps, rec.dropped_phases
        replay = rec._replay
        for entry in self._unapplied:
            replay(entry)
        rec.dropped_steps, rec.dropped_phases = dropped
        self.caught_up += len(self._unapplied)
        self._unapplied.clear()
        while rec._pending:  # finished in the sidecar's replica from the same entries
            rec._release_step(rec._pending.popleft())
        while len(rec.loose_scalars) > loose:
            rec.loose_scalars.pop()
        self._send((wire.RAW_END, self.session))
