"""The ring: each boundary written at the hook as one fixed slot in shared memory.

While the sidecar takes the log raw (otel_train/handover/raw.py), the hooks write here
instead of appending tuples to the deferred log: one 48-byte slot per boundary (SLOT,
below), in a ring the sidecar maps and reads itself. Nothing is copied or pickled on the
training thread, and an adapter's boundary is one call into C (``_ring.c``; the
:class:`Writer` below is the same writer in Python, used where that does not build).
What a slot cannot hold (a phase that ended with an error, scalars, a remote phase) is a
*side entry*: its slot says SIDE, and the entry itself, a log tuple, goes beside the
ring, keyed by the slot's position. A GPU job's boundary also has a stamp (its pooled
CUDA event and allocator sample: stamps.py), which the writer takes after the clock and
keeps in :attr:`Ring.stamps`, a table indexed by the slot's position modulo the capacity
(:meth:`Ring.stamp_with`): events cross no process, so the training process resolves
them before the sidecar reads the slot (handover/event_times.py).

A slot, by field: ``kind`` (a log kind of layouts.py, SIDE, or a boundary's code from
FIRST_CODE on), ``name`` (a phase name's code), ``t`` (host ns), ``stack`` (the
thread's stack token: ``id()`` of its phase stack), and ``a``, ``b``, ``c`` (a batch's
samples, tokens and padded tokens; NONE for None). Codes and tokens are this process's:
:class:`Tables` lists what each means, and :func:`decode` turns slots back into the log
entries the state machine applies (deferred.py).

Usage::

    ring = Ring(recorder, capacity)          # recorder: whose hooks write here
    ring.open_at(pos)                         # writes taken from here on
    entries, upto = decode(ring.view, ring.capacity, start, ring.pos, ring.tables, ...)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import tempfile
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Protocol

from .layouts import COUNTS, ENTER, EXIT, L_KIND, STEP_BEGIN, STEP_END, MainPhaseStack
from .scopes import B_COUNTED

SLOT = struct.Struct("<IIqQqqq")  # kind, name, t, stack, a, b, c
# The header before the slots: what the writer published (position, newest time) and
# the reader's acknowledgement (a seqlock's sequence, then session, position, next step
# index and step stack token of its last idle point). The slots start at HEADER.
HEAD = struct.Struct("<qqqqqqQq")
(H_POS, H_LAST_T, H_ACK_SEQ, H_ACK_SESSION, H_ACK_POS, H_ACK_NEXT, H_ACK_TOKEN,
 H_DRAIN_BY) = range(8)  # fmt: skip
HEADER = HEAD.size
SIDE = 15  # the entry is beside the ring (Ring.sides), keyed by the slot's position
FIRST_CODE = 16  # boundary codes: FIRST_CODE + their index in Tables.boundaries
NONE = -(1 << 63)  # a count that is None
CAPACITY = 1 << 15  # slots (1.5 MiB): about 4,000 steps of a plain loop
try:
    from . import _ring  # type: ignore[attr-defined]

    NATIVE: Any = _ring.Ring
    # The C decoder, where it reads the kinds as this module numbers them.
    NATIVE_DECODE: Any = (
        _ring.decode
        if _ring.KINDS == (ENTER, EXIT, STEP_BEGIN, STEP_END, COUNTS, SIDE, FIRST_CODE)
        else None
    )
except ImportError:  # (not built: the Python writer and decoder below, the same slots)
    NATIVE = NATIVE_DECODE = None


class Unapplied(Protocol):
    """Whoever takes entries off the log to send them on unapplied (the sidecar's raw
    hand-over, handover/raw.py): while ``raw`` is true this recorder's state lags those
    entries, and ``leave_raw()`` (the lock held) applies them here first. A session
    ends (the ring's writer reports, :meth:`Recorder.ring_due`) at ring position
    ``ends_at``, before a debugging window's first step could be written."""

    raw: bool
    ends_at: int

    def leave_raw(self) -> None: ...


class Tables:
    """What this process's codes and tokens mean: boundaries by code, phase names by code
    (0: None), stacks by token with whether each is the main thread's. Lists only grow:
    whoever hands them on keeps how many it has sent."""

    def __init__(self) -> None:
        self.boundaries: list[Any] = []
        self.names: list[str | None] = [None]
        self.stacks: list[tuple[int, bool]] = []
        self._codes: dict[int, int] = {}  # id(boundary) -> code (the list keeps it alive)
        self._name_codes: dict[str | None, int] = {None: 0}
        self.stack_objects: dict[int, Any] = {}  # token -> this process's stack

    def code_of(self, b: Any) -> int:
        code = self._codes.get(id(b))
        if code is None:
            code = self._codes[id(b)] = FIRST_CODE + len(self.boundaries)
            self.boundaries.append(b)
        return code

    def name_code(self, name: str | None) -> int:
        code = self._name_codes.get(name)
        if code is None:
            code = self._name_codes[name] = len(self.names)
            self.names.append(name)
        return code

    def token_of(self, stack: Any) -> int:
        token = id(stack)
        if token not in self.stack_objects:
            self.stack_objects[token] = stack
            self.stacks.append((token, isinstance(stack, MainPhaseStack)))
        return token


def _value(v: int | None) -> int:
    return NONE if v is None else v


def _count(v: int) -> int | None:
    return None if v == NONE else v


class Writer:
    """The writer in Python: ``_ring.Ring``'s interface and behaviour, slot for slot."""

    def __init__(
        self,
        buffer: Any,
        capacity: int,
        flags: dict[str, Any],
        stack_of: Callable[[], int],
        code_of: Callable[[Any], int],
        refused: Callable[..., None],
        on_due: Callable[[], None],
    ) -> None:
        self._view = memoryview(buffer)
        self.capacity = capacity
        self._flags = flags
        self._stack_of, self._code_of = stack_of, code_of
        self._refused, self._on_due = refused, on_due
        self.pos = self.acked = self.last_t = 0
        self.due = 1 << 62
        self.open = 0
        self._stamper: Callable[[], Any] | None = None
        self._stamps: list[Any] = []

    def stamp_with(self, stamper: Callable[[], Any] | None, stamps: list[Any] | None) -> None:
        self._stamper, self._stamps = stamper, stamps if stamps is not None else []

    def _write(self, kind: int, name: int, stack: int, t: int, a: int, b: int, c: int) -> int:
        at = self.pos
        offset = HEADER + (at % self.capacity) * SLOT.size
        SLOT.pack_into(self._view, offset, kind, name, t, stack, a, b, c)
        self.pos = at + 1
        self.last_t = max(self.last_t, t)
        _POS.pack_into(self._view, 0, self.pos, self.last_t)
        if self.pos >= self.due:
            self.due = 1 << 62
            with contextlib.suppress(Exception):  # (as the C writer: never into training)
                self._on_due()
        return at

    def _takes(self) -> bool:
        acked = max(self.acked, _ACK_POS.unpack_from(self._view, H_ACK_POS * 8)[0])
        return bool(self.open) and self.pos - acked < self.capacity

    def transition(self, b: Any) -> None:
        self.counted(b, None, None, None, 0)

    def counted(self, b: Any, samples: Any, tokens: Any, padded: Any, t: int = 0) -> None:
        if (
            self._takes()
            and self._flags.get("enabled") is True
            and _small(samples)
            and _small(tokens)
            and _small(padded)
            and t.__class__ is int
        ):
            try:
                code, stack = self._code_of(b), self._stack_of()
                counts = (_value(samples), _value(tokens), _value(padded))
                t = t or perf_counter_ns()
                if self._stamper is not None:  # (the stamp after the clock, as the C one)
                    self._stamps[self.pos % self.capacity] = self._stamper()
                self._write(code, 0, stack, t, *counts)
                return
            except Exception:
                pass
        self._refused(b, samples, tokens, padded, t)

    def put(self, kind: int, name: int, stack: int, t: int, a: int, b: int, c: int) -> int:
        if not self._takes():
            return -1
        return self._write(kind, name, stack, t, a, b, c)

    def forget_thread(self) -> None:
        pass

    def release(self) -> None:
        self.open = 0
        self._view.release()


class Ring:
    """The shared memory, its writer and tables, and the side entries of one recorder.

    The memory (``fd``, passed to the sidecar at its start) is mapped here and
    prefaulted, so its pages count in both processes from the first slot on."""

    def __init__(self, recorder: Any, capacity: int = CAPACITY, native: bool = True) -> None:
        self.capacity = capacity
        size = HEADER + capacity * SLOT.size
        self.fd = _shared_fd(size)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self.view = mmap.mmap(self.fd, size, flags=flags)
        self.tables = Tables()
        self.sides: dict[int, tuple[Any, ...]] = {}  # position -> side entry
        # A GPU job's stamps (stamps.py) by slot index, while stamp_with() is on: each
        # written slot with a time gets its boundary's, None the others.
        self.stamps: list[Any] | None = None
        self._stamper: Callable[[], Any] | None = None
        self._thread_stack = recorder.stack_getter
        kind = NATIVE if native and NATIVE is not None else Writer
        self.writer = kind(
            self.view, capacity, recorder.__dict__, self._stack_of, self.tables.code_of,
            recorder.refused_write, recorder.ring_due,
        )  # fmt: skip

    def full(self) -> bool:
        """Whether a write is refused for room: the reader has not let go of a ring."""
        w = self.writer
        acked = max(w.acked, read_ack(self.view)[1])
        return bool(w.open) and w.pos - acked >= w.capacity

    def stamp_with(self, stamper: Callable[[], Any] | None) -> None:
        """Every boundary written from now on takes its stamp with ``stamper`` (the
        recorder's, stamps.py) into :attr:`stamps` at its slot's index; None: no more."""
        if stamper is not None and self.stamps is None:
            self.stamps = [None] * self.capacity
        self._stamper = stamper
        self.writer.stamp_with(stamper, self.stamps if stamper is not None else None)

    def stamp_at(self, position: int) -> Any:
        """The stamp of the slot at ``position`` (None: none taken)."""
        stamps = self.stamps
        return None if stamps is None else stamps[position % self.capacity]

    def take_stamp_at(self, position: int) -> Any:
        """The stamp of the slot at ``position``, no longer the table's."""
        stamps = self.stamps
        if stamps is None:
            return None
        i = position % self.capacity
        stamp, stamps[i] = stamps[i], None
        return stamp

    @property
    def native(self) -> bool:
        return not isinstance(self.writer, Writer)

    def _stack_of(self) -> int:
        return self.tables.token_of(self._thread_stack())

    def time_at(self, position: int) -> int | None:
        """The time of the entry at ``position``: its slot's, or its side entry's (None
        while that has not arrived); 0 for one with no time (counts)."""
        kind, _, t = SLOT.unpack_from(self.view, HEADER + (position % self.capacity) * SLOT.size)[
            :3
        ]
        if kind == SIDE:
            side = self.sides.get(position)
            return None if side is None else int(side[1])
        return int(t)

    def put_entry(self, item: tuple[Any, ...], stamp: Any = None) -> bool:
        """A log entry as a slot (a side entry if no slot holds it); False if refused.
        While stamps are taken, an entry with a time gets ``stamp``, or one taken now
        (set after the slot: a reader that finds the slot without it waits for it)."""
        stamper = self._stamper
        if stamper is None or not item[1]:
            return self._put(item) >= 0
        if stamp is None:
            stamp = stamper()
        at = self._put(item)
        if at < 0:
            return False  # (its event, recorded for nothing, is let go of with the stamp)
        assert self.stamps is not None
        self.stamps[at % self.capacity] = stamp
        return True

    def put_stamped(self, item: tuple[Any, ...]) -> bool:
        """An entry of a stamped log (its stamp its last element) as a slot."""
        return self.put_entry(item[:-1], item[-1] if item[1] else None)

    def _put(self, item: tuple[Any, ...]) -> int:
        """``item`` written: its slot's position, or -1 if refused."""
        w, tables = self.writer, self.tables
        kind = item[L_KIND]
        stack = item[0]
        token = tables.token_of(stack) if stack is not None else 0
        if kind.__class__ is tuple:  # an adapter boundary (counted: with the batch's)
            code = tables.code_of(kind)
            if kind[B_COUNTED]:
                counts = (_value(item[3]), _value(item[4]), _value(item[5]))
                return w.put(code, 0, token, item[1], *counts)
            return w.put(code, 0, token, item[1], NONE, NONE, NONE)
        if kind == ENTER and item[3].__class__ is str:
            return w.put(ENTER, tables.name_code(item[3]), token, item[1], NONE, NONE, NONE)
        if kind == EXIT and item[4] is None and (item[3] is None or item[3].__class__ is str):
            return w.put(EXIT, tables.name_code(item[3]), token, item[1], NONE, NONE, NONE)
        if kind == STEP_BEGIN and _small(item[3]) and _small(item[4]):
            return w.put(STEP_BEGIN, 0, token, item[1], _value(item[3]), _value(item[4]), NONE)
        if kind == STEP_END:
            return w.put(STEP_END, 0, token, item[1], NONE, NONE, NONE)
        if kind == COUNTS and all(_small(v) for v in item[3:6]):
            counts = (_value(item[3]), _value(item[4]), _value(item[5]))
            return w.put(COUNTS, 0, 0, 0, *counts)
        at = w.put(SIDE, 0, token, 0, NONE, NONE, NONE)
        if at >= 0:
            self.sides[at] = item
        return at

    def close(self) -> None:
        """For good: no more writes; the memory is let go of."""
        self.writer.release()
        self.view.close()
        os.close(self.fd)


def _shared_fd(size: int) -> int:
    """A descriptor of ``size`` bytes of memory to share: anonymous shared memory where
    there is some (Linux's memfd), else an unlinked temporary file. A file on disk would
    do too, but its pages are written back, and the first write to a page written back
    faults again (tens of microseconds, in a hook)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("otel-train-ring", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd
    with tempfile.TemporaryFile(prefix="otel-train-ring-", dir=_shm_dir()) as f:
        f.truncate(size)
        return os.dup(f.fileno())


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


_POS = struct.Struct("<qq")  # the header's position and newest time
_ACK_POS = struct.Struct("<q")
_ACK = struct.Struct("<qqqQ")  # session, position, next step index, token


def written(view: Any) -> tuple[int, int]:
    """The position and newest slot time the writer published in ``view``'s header."""
    if NATIVE is not None:
        return _ring.written(view)  # type: ignore[no-any-return]
    pos, last_t = _POS.unpack_from(view, 0)
    return pos, last_t


def publish_ack(view: Any, session: int, pos: int, next_index: int, token: int) -> None:
    """The reader's last idle point, into ``view``'s header (a seqlock's write)."""
    if NATIVE is not None:
        _ring.publish_ack(view, session, pos, next_index, token)
        return
    (seq,) = _ACK_POS.unpack_from(view, H_ACK_SEQ * 8)
    _ACK_POS.pack_into(view, H_ACK_SEQ * 8, seq + 1)
    _ACK.pack_into(view, H_ACK_SESSION * 8, session, pos, next_index, token)
    _ACK_POS.pack_into(view, H_ACK_SEQ * 8, seq + 2)


def publish_drain_by(view: Any, t_ns: int) -> None:
    """The training process is ending: what the reader has not applied by ``t_ns``
    (monotonic, the same clock in both processes) it counts as dropped, not applies."""
    _ACK_POS.pack_into(view, H_DRAIN_BY * 8, t_ns)


def read_drain_by(view: Any) -> int:
    """The time ``publish_drain_by`` set, or 0 while the training process runs on."""
    (t_ns,) = _ACK_POS.unpack_from(view, H_DRAIN_BY * 8)
    return int(t_ns)


def read_ack(view: Any) -> tuple[int, int, int, int]:
    """``(session, position, next step index, step stack token)`` of the reader's last
    idle point as the header has it (a seqlock's read)."""
    if NATIVE is not None:
        return _ring.read_ack(view)  # type: ignore[no-any-return]
    while True:
        (s1,) = _ACK_POS.unpack_from(view, H_ACK_SEQ * 8)
        ack = _ACK.unpack_from(view, H_ACK_SESSION * 8)
        (s2,) = _ACK_POS.unpack_from(view, H_ACK_SEQ * 8)
        if s1 == s2 and not s1 & 1:
            session, pos, next_index, token = ack
            return session, pos, next_index, token


def _small(v: Any) -> bool:
    """Whether ``v`` fits a count field: None or an int that is not NONE."""
    return v is None or (v.__class__ is int and NONE < v < (1 << 63))


def with_stamps(
    entries: list[tuple[Any, ...]], start: int, stamp_of: Callable[[int], Any]
) -> list[tuple[Any, ...]]:
    """Decoded entries (one a slot, from ring position ``start``) each with its slot's
    stamp last, as a stamped log's entries are (``stamp_of(position)``)."""
    return [(*e, stamp_of(p)) for p, e in enumerate(entries, start)]


def decode(
    view: Any,
    capacity: int,
    start: int,
    end: int,
    tables: Any,
    stack_for: Callable[[int], Any],
    sides: dict[int, tuple[Any, ...]],
    native: bool = True,
) -> tuple[list[tuple[Any, ...]], int]:
    """The log entries of slots ``start`` to ``end`` (stream positions), and the position
    decoding stopped at: ``end``, or the first slot whose side entry or code is not
    known yet (it arrives with a later hand-over). ``tables``: boundaries and names by
    code (lists); ``stack_for(token)``: the stack a token names here. ``native``: in C
    (``_ring.decode``, the same entries) where it was built; this is its reference."""
    boundaries, names = tables.boundaries, tables.names
    counted = [bd[B_COUNTED] for bd in boundaries]
    if native and NATIVE_DECODE is not None:
        return NATIVE_DECODE(  # type: ignore[no-any-return]
            view, capacity, start, end, boundaries, counted, names, stack_for, sides
        )
    out: list[tuple[Any, ...]] = []
    append = out.append
    stacks: dict[int, Any] = {}
    last_token, stack = 0, None
    size = SLOT.size
    pos = start
    while pos < end:  # (in at most two runs of slots: the ring wraps once)
        first = pos % capacity
        n = min(end - pos, capacity - first)
        run = view[HEADER + first * size : HEADER + (first + n) * size]  # (a copy: bytes)
        for kind, name, t, token, a, b, c in SLOT.iter_unpack(run):
            if kind == SIDE:
                side = sides.pop(pos, None)
                if side is None:
                    return out, pos
                append(side)
                pos += 1
                continue
            if token != last_token:
                last_token = token
                stack = stacks.get(token)
                if stack is None and token:
                    stack = stacks[token] = stack_for(token)
                elif not token:
                    stack = None
            entry = _slot_entry(kind, name, t, stack, a, b, c, tables, counted)
            if entry is None:
                return out, pos
            append(entry)
            pos += 1
    return out, end


def _slot_entry(
    kind: int, name: int, t: int, stack: Any, a: int, b: int, c: int, tables: Any,
    counted: list[bool],
) -> tuple[Any, ...] | None:  # fmt: skip
    """The log entry of one slot that is not a side entry (decode's reference); None when
    its code or name is not known yet."""
    if kind >= FIRST_CODE:
        i = kind - FIRST_CODE
        if i >= len(tables.boundaries):
            return None
        if counted[i]:
            return (stack, t, tables.boundaries[i], None if a == NONE else a,
                    None if b == NONE else b, None if c == NONE else c)  # fmt: skip
        return (stack, t, tables.boundaries[i])
    if kind in (ENTER, EXIT):
        if name >= len(tables.names):
            return None
        if kind == ENTER:
            return (stack, t, ENTER, tables.names[name])
        return (stack, t, EXIT, tables.names[name], None)
    if kind == STEP_BEGIN:
        return (stack, t, STEP_BEGIN, _count(a), _count(b))
    if kind == STEP_END:
        return (stack, t, STEP_END)
    return (None, 0, COUNTS, _count(a), _count(b), _count(c))  # COUNTS
