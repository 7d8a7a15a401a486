"""What crosses the pipe between the training process and its sidecar: framed messages
of plain tuples, lists and numbers (pickle protocol 5), and resolved steps as their
fields (below).

Training process -> sidecar (its stdin), one frame each:

- ``(HELLO, settings, version, offset_ns, parent_pid, record plan or None)`` first;
- ``(DELIVERY, parts, scalars, counters, regions, counts, probe_state, facts)``:
  finished steps (``parts``) with what goes beside them;
- ``(RING, session, position, news, sides, stamps)``: the shared-memory ring
  (recording/ring.py) is written up to ``position``; ``news``: the boundaries, phase
  names and stacks its slots may name that were not sent yet, ``sides``: ``(position,
  entry)`` of its side entries (most messages of a plain loop: raw.py); ``stamps``: a
  stamped session's resolved stamps, one per slot from the position told before
  (handover/event_times.py), else empty;
- ``(RAW_BEGIN, session, next_index, step_stack_token, position, news, shared, device)``
  (``device``: a stamped session's CUDA device, else None), ``(RAW_END, session)``;
- ``(FLUSH, seq, timeout_s)``: answer with ``(FLUSHED, seq, stats, ok)`` once every
  earlier delivery is in the metrics and its spans are exported (or at the timeout);
- ``(END, budget_s)``: drain, print the run summary, flush, exit within the budget;
- ``(FIRST, index)``: an instrumentation began; trace the first step from ``index``;
- ``(PROGRESS, progress)``: the training thread's latest boundary (processing/hangs.py's
  Progress) from the feeder's thread: every second, and a change within a tenth of
  ``hang_after`` when that is sooner;
- ``(HANG_DETAILS, details)``: the details a ``HANG_PROBE`` asked for (hang_details.py);
- ``(CONSOLE_TO, forward)``: print the console tables and the run summary here (False),
  or hand them back as ``CONSOLE`` (True: the training process's ``sys.stderr`` or
  ``sys.stdout`` is not its own descriptor, say under ``redirect_stderr`` or Jupyter).

Sidecar -> training process (its stdout): ``(READY,)`` or ``(FAILED, kind, message)``
once its SDK is built (the training process waits for one: errors stay configure-time
errors), ``(ARM, at_index)`` (count the FLOPs of a
new batch shape), ``(FLUSHED, seq)``, ``(IDLE, session, position, next_index,
step_stack_token)`` (raw.py), ``(CONSOLE, text)`` (a table or the summary, to print),
``(HANG_PROBE, age, limit)`` (a hang record is due: send its details).

A frame is a 4-byte little-endian length and the pickled message (:class:`FrameWriter`,
:class:`FrameReader`, one of each per pipe end). What the core's types become on the way
(each crosses as itself and is the same object's equal on the other side):

- a thread's phase stack in a log entry: a token (``copyreg``): the sidecar's replica
  keeps one stack per token, so entries of one thread name one stack there too;
- a resolved step (``Step``): its fields (``copyreg``);
- a block of recognised steps (``StepBlock``): its template, first index and raw
  columns, the log entries let go (``copyreg``);
- a step shape (``Template``): whole the first time a writer sends it, by its key after;
  the reader keeps the shapes its writer sent (a pipe's own state, so not ``copyreg``).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
import threading
from typing import Any

from ..processing.blocks import StepBlock
from ..processing.instruments import ProcessMemory
from ..processing.resolved import finished_step, settle
from ..processing.source import Counters, Delivery
from ..recording.layouts import MainPhaseStack, PhaseStack, Step
from ..recording.links import StepLink
from ..recording.templates import Template
from ..recording.tokens import Consumed

HELLO, DELIVERY, FLUSH, END, ARM, FLUSHED, RAW_BEGIN, RAW_END, IDLE, RING = range(10)
READY, FAILED = range(10, 12)
FIRST = 12
CONSOLE_TO, CONSOLE = 13, 14
PROGRESS, HANG_PROBE, HANG_DETAILS = range(15, 18)
# The position of the acknowledgement the sidecar publishes in the ring's header once it
# has applied a raw session's RAW_END: the next session may begin (handover/raw.py).
SESSION_APPLIED = -1
_LEN = struct.Struct("<I")
_REPLICA_STACKS: dict[int, PhaseStack] = {}  # the sidecar's: token -> replica stack
MAX_FRAME = 64 << 20  # a frame larger than this is a broken stream


def stack_of(token: int, main: bool = False) -> PhaseStack:
    """The sidecar replica's stack for a training-process stack's token."""
    stack = _REPLICA_STACKS.get(token)
    if stack is None:
        stack = _REPLICA_STACKS[token] = MainPhaseStack() if main else PhaseStack()
        stack.thread = 0  # (another process's thread)
    return stack


def replica_stacks() -> dict[int, PhaseStack]:
    return _REPLICA_STACKS


def _stack_token(stack: PhaseStack) -> tuple[Any, ...]:
    return (stack_of, (id(stack), isinstance(stack, MainPhaseStack)))


copyreg.pickle(PhaseStack, _stack_token)
copyreg.pickle(MainPhaseStack, _stack_token)


class FrameWriter:
    """Frames for one pipe (any thread): each step shape is sent whole once, then by its
    key."""

    def __init__(self) -> None:
        self._keys: dict[int, int] = {}  # id(template) -> key
        self._sent: list[Template] = []  # (kept alive: their ids stay theirs)
        self._body = io.BytesIO()
        self._pickler = _Pickler(self._body, self)
        self._lock = threading.Lock()

    def frame(self, message: tuple[Any, ...]) -> bytes:
        with self._lock:
            body = self._body
            body.seek(0)
            body.truncate()
            self._pickler.clear_memo()
            sent = len(self._sent)
            try:
                self._pickler.dump(message)
            except BaseException:  # (no frame: the shapes it would have sent were not)
                for tpl in self._sent[sent:]:
                    del self._keys[id(tpl)]
                del self._sent[sent:]
                raise
            return _LEN.pack(body.tell()) + body.getvalue()

    def template(self, tpl: Template) -> tuple[Any, tuple[Any, ...]]:
        key = self._keys.get(id(tpl))
        if key is not None:
            return _template, (key,)
        key = self._keys[id(tpl)] = len(self._sent)
        self._sent.append(tpl)
        return _template, (key, tpl.kinds, tpl.start, tpl.end, tpl.rows, tpl.counts,
                           tpl.mode, tpl.scalars, tpl.loose)  # fmt: skip


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, writer: FrameWriter) -> None:
        super().__init__(file, protocol=5)
        self._writer = writer

    def reducer_override(self, obj: Any) -> Any:  # (not called for lists, tuples, numbers)
        if obj.__class__ is Template:
            return self._writer.template(obj)
        return NotImplemented


def _template(key: int, *fields: Any) -> Template:
    """A step shape by key, with its fields the first time (FrameReader reads it)."""
    raise pickle.UnpicklingError("a step shape by key: a FrameReader reads it")


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, templates: dict[int, Template]) -> None:
        super().__init__(file)
        self._templates = templates

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_template":
            return self._template
        return super().find_class(module, name)

    def _template(self, key: int, *fields: Any) -> Template:
        if fields:  # (the first time: whole)
            self._templates[key] = Template(*fields)
        return self._templates[key]


class FrameReader:
    """Splits a byte stream into messages (fed whatever ``read()`` returned), one at a
    time if asked; keeps the step shapes its writer sent."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # where the next frame starts in ``_buf``
        self.templates: dict[int, Template] = {}

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        """Every message complete now, ``data`` appended."""
        self.append(data)
        out = []
        while (message := self.next_message()) is not None:
            out.append(message)
        return out

    def append(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_message(self) -> tuple[Any, ...] | None:
        """The next complete message, or None."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (n,) = _LEN.unpack_from(buf, pos)
        if n > MAX_FRAME:
            raise ValueError(f"otel-train sidecar: frame of {n} bytes: broken stream")
        if len(buf) - pos - 4 < n:
            return None
        self._pos = pos + 4 + n
        message: tuple[Any, ...] = _Unpickler(
            io.BytesIO(buf[pos + 4 : self._pos]), self.templates
        ).load()
        return message

    @property
    def unread(self) -> int:
        """Bytes not taken as messages yet."""
        return len(self._buf) - self._pos


# -- steps and blocks -------------------------------------------------------------------


def _block_fields(block: StepBlock) -> tuple[Any, tuple[Any, ...]]:
    """A block of recognised steps as what its columns derive from (StepBlock.take_raw)."""
    times, samples, tokens, padded, scalars = block.take_raw()
    return _block_of, (block.recognised, block.first, times, samples, tokens, padded, scalars)


def _block_of(template: Template, first: int, times: list[int], samples: Any, tokens: Any,
              padded: Any, scalars: Any) -> StepBlock:  # fmt: skip
    return StepBlock.from_raw(template, first, times, (samples, tokens, padded), scalars)


copyreg.pickle(StepBlock, _block_fields)


def _step_fields(s: Step) -> tuple[Any, tuple[Any, ...]]:
    """A resolved step (no CUDA event left in it: resolved.py) as its fields, both ways
    across the pipe: finished steps to the sidecar, traced ones back to the relay."""
    link = tuple(s.link) if s.link is not None else None
    consumed = [tuple(x) for x in s.consumed] if s.consumed else None
    device = (s.dev_start, s.dev_end) if s.dev_start is not None else None
    return _step_of, (s.index, s.t0, s.t1, s.samples, s.tokens, s.padded, s.phases,
                      s.scalars, s.error, device, link, consumed, s.events, s.efficiency,
                      s.sampled_because)  # fmt: skip


def _step_of(index: int, t0: int, t1: int, samples: int | None, tokens: int | None,
             padded: int | None, phases: list[tuple[Any, ...]], scalars: Any, error: bool,
             device: tuple[int, int] | None, link: Any, consumed: Any, events: Any,
             efficiency: Any, because: str) -> Step:  # fmt: skip
    step = finished_step(index, t0, t1)
    step.samples, step.tokens, step.padded = samples, tokens, padded
    step.phases, step.scalars, step.error, step.events = phases, scalars, error, events
    step.link = StepLink(*link) if link is not None else None
    step.consumed = [Consumed(*x) for x in consumed] if consumed else None
    if device is not None:
        settle(step, device)  # (host times: finished_step settled them)
    step.efficiency, step.sampled_because = efficiency, because
    return step


copyreg.pickle(Step, _step_fields)


def encode_counters(c: Counters, dropped_handover: int, memory: ProcessMemory) -> dict[str, Any]:
    """The recorder's counters by name, with the feeder's own drops and the training
    process's memory."""
    out = {name: getattr(c, name) for name in Counters.__dataclass_fields__}
    out["dropped_handover"] = dropped_handover
    out["rss_bytes"] = memory.rss_bytes
    out["peak_rss_bytes"] = memory.peak_rss_bytes
    return out


def decode_delivery(message: tuple[Any, ...]) -> Delivery:
    _, parts, scalars, counters, *_ = message
    return Delivery(parts or [], scalars, Counters(**counters))


# The relay's messages, sidecar -> training process (sidecar/relay.py sends them,
# handover/relay_in.py hands them to the application's providers).
STEPS, TREES, METRICS, LOG = range(4)


def spans_of(kind: int, step: Any) -> int:
    """The spans a relayed step (a root and its phases) or tree (phases) makes: what a
    drop of it loses."""
    return len(step.phases) + (1 if kind == STEPS else 0)
