"""What crosses the pipe between the training process and its sidecar: framed messages
of plain tuples, lists and numbers (pickle protocol 5), and resolved steps as their
fields (below).

Training process -> sidecar (its stdin), one frame each:

- ``(HELLO, settings, version, offset_ns, parent_pid, record plan or None)`` first;
- ``(TEMPLATE, key, template)`` before the first block of a step shape;
- ``(DELIVERY, parts, scalars, counters, regions, counts, probe_state, facts)``:
  finished steps (``parts``) with what goes beside them;
- ``(RING, session, position, news, sides)``: the shared-memory ring (recording/ring.py)
  is written up to ``position``; ``news``: the boundaries, phase names and stacks its
  slots may name that were not sent yet, ``sides``: ``(position, entry)`` of its side
  entries (most messages of a plain loop: raw.py);
- ``(RAW_BEGIN, session, next_index, step_stack_token, position, news)``,
  ``(RAW_END, session)``;
- ``(FLUSH, seq, timeout_s)``: answer with ``(FLUSHED, seq, stats, ok)`` once every
  earlier delivery is in the metrics and its spans are exported (or at the timeout);
- ``(END, budget_s)``: drain, print the run summary, flush, exit within the budget;
- ``(FIRST, index)``: an instrumentation began; trace the first step from ``index``;
- ``(PROGRESS, progress)``: the training thread's latest boundary (processing/hangs.py's
  Progress), about every second from the feeder's thread;
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

A frame is a 4-byte little-endian length and the pickled message. A thread's phase stack
in a log entry crosses as a token (``copyreg``, below): the sidecar's replica keeps one
stack per token, so entries of one thread name one stack there too. A resolved step
crosses as its fields (``copyreg`` too), and is the same step on the other side.
"""

from __future__ import annotations

import copyreg
import pickle
import struct
from typing import Any

from ..processing.blocks import StepBlock
from ..processing.resolved import finished_step, settle
from ..processing.source import Counters, Delivery, Part
from ..recording.layouts import MainPhaseStack, PhaseStack, Step
from ..recording.links import StepLink
from ..recording.templates import Template
from ..recording.tokens import Consumed

HELLO, TEMPLATE, DELIVERY, FLUSH, END, ARM, FLUSHED, RAW_BEGIN, RAW_END, IDLE, RING = range(11)
READY, FAILED = range(11, 13)
FIRST = 13
CONSOLE_TO, CONSOLE = 14, 15
PROGRESS, HANG_PROBE, HANG_DETAILS = range(16, 19)
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


def frame(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=5)
    return _LEN.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream into messages (fed whatever ``read()`` returned)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        buf = self._buf
        buf += data
        out = []
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > MAX_FRAME:
                raise ValueError(f"otel-train sidecar: frame of {n} bytes: broken stream")
            if len(buf) - pos - 4 < n:
                break
            out.append(pickle.loads(bytes(buf[pos + 4 : pos + 4 + n])))
            pos += 4 + n
        del buf[:pos]
        return out


# -- parts ------------------------------------------------------------------------------

_STEPS, _BLOCK = 0, 1


def encode_parts(parts: list[Part], template_key: Any) -> list[tuple[Any, ...]]:
    """Parts as tuples; ``template_key(template)`` names a block's shape (sent apart).
    Resolved steps go as they are (their reducer is below)."""
    out: list[tuple[Any, ...]] = []
    for part in parts:
        if isinstance(part, StepBlock):
            times, samples, tokens, padded, scalars = part.take_raw()
            out.append((_BLOCK, template_key(part.template), part.first, times, samples,
                        tokens, padded, scalars))  # fmt: skip
        else:
            out.append((_STEPS, part))
    return out


def decode_parts(encoded: list[tuple[Any, ...]], templates: dict[Any, Template]) -> list[Part]:
    out: list[Part] = []
    for item in encoded:
        if item[0] == _BLOCK:
            _, key, first, times, samples, tokens, padded, scalars = item
            counts = (samples, tokens, padded)
            out.append(StepBlock.from_raw(templates[key], first, times, counts, scalars))
        else:
            out.append(item[1])
    return out


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


def encode_counters(c: Counters, dropped_handover: int) -> dict[str, Any]:
    """The recorder's counters by name, with the feeder's own drops."""
    out = {name: getattr(c, name) for name in Counters.__dataclass_fields__}
    out["dropped_handover"] = dropped_handover
    return out


def decode_delivery(message: tuple[Any, ...], templates: dict[Any, Template]) -> Delivery:
    _, parts, scalars, counters, *_ = message
    return Delivery(decode_parts(parts or [], templates), scalars, Counters(**counters))
