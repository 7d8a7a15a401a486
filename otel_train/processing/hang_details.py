"""What a hang record says that only the training process knows (hangs.py asks).

Read on a thread of the training process other than the training thread (the worker,
or the sidecar feeder's thread): the training thread is stuck, usually in a C call that
released the GIL (a collective, a sleep, a lock), so its Python stack is readable with
``sys._current_frames()``. Nothing here touches the device or the process group beyond
reading counters; the Flight Recorder is dumped only when it is on
(``TORCH_FR_BUFFER_SIZE``, or the older ``TORCH_NCCL_TRACE_BUFFER_SIZE``, set above 0),
into the run record's directory.

Usage::

    progress_now(recorder, regions)                     # hangs.Progress
    details(recorder, regions, directory, label, age, limit)   # attributes for the record
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from .. import contract as c
from ..identity import rank, world_size
from ..recording.collectives import DDP_OP, label, parse, phase_name, sequence_number
from .hangs import Progress

_log = logging.getLogger("otel_train")
MAX_STACKS = 64 * 1024  # characters of stacks in one record
LOCK_S = 0.5  # how long the details wait for the recorder's lock


def progress_now(rec: Any, regions: Any) -> Progress:
    """The training thread's latest boundary (a region's begin or end included), the
    region open now, and whether it waits in a collective."""
    region = regions.open[-1][0] if regions.open else None
    return Progress(max(rec.progress_ns(), regions.last_ns), region, rec.collective_now is not None)


def details(
    rec: Any, regions: Any, directory: str | None, label_: str, age: float, limit: float
) -> dict[str, Any]:
    """The hang record's attributes (contract keys), the open step's ``trace_id`` and
    ``span_id`` (that step is then traced), and the console line, printed here."""
    out: dict[str, Any] = {}
    thread = threading.main_thread().ident
    view = rec.hang_view(LOCK_S)  # (None: the lock busy; one stuck in a collective holds none)
    if view is not None:
        if view.step_index is not None:
            out[c.STEP_INDEX.key] = view.step_index
        if view.link is not None:
            out["trace_id"], out["span_id"] = view.link.trace_id, view.link.span_id
        if view.thread is not None:
            thread = view.thread
        names = [name for name in view.phases if parse(name) is None]
        if names:
            out[c.PHASE_NAME.key] = names[-1]
    if regions.open:
        out[c.HANG_REGION.key] = regions.open[-1][0]
    _collective(rec, out)
    out[c.HANG_STACKTRACE.key] = stacks(thread)
    path = flight_recorder(directory)
    if path is not None:
        out[c.HANG_FLIGHT_RECORDER.key] = path
    _print_line(out, label_, age, limit)
    return out


def _collective(rec: Any, out: dict[str, Any]) -> None:
    now = rec.collective_now
    if now is None:
        return
    op, group, seq, _ = now
    if seq is None and op == DDP_OP:
        seq = sequence_number(None)  # (DDP's buckets: the group's count now)
    out[c.COLLECTIVE_OP.key], out[c.COLLECTIVE_GROUP.key] = op, group
    if seq is not None:
        out[c.COLLECTIVE_SEQ.key] = seq


def stacks(first: int | None) -> str:
    """Every thread's Python stack, the thread ``first`` (the training thread) first."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    order = sorted(frames, key=lambda ident: (ident != first, ident))
    parts = []
    for ident in order:
        head = f"Thread {names.get(ident, '?')} ({ident})"
        if ident == first:
            head += " [training thread]"
        parts.append(head + ":\n" + "".join(traceback.format_stack(frames[ident])))
    del frames
    text = "\n".join(parts)
    return text if len(text) <= MAX_STACKS else text[:MAX_STACKS] + "\n... (cut)"


def flight_recorder_on() -> bool:
    """Whether the user turned PyTorch's Flight Recorder on: its buffer size, from the
    first of ``TORCH_FR_BUFFER_SIZE`` and ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (the older
    name) that is set, as torch reads them, is above 0."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name, "").strip()
        if value:
            return value.lstrip("+").isdigit() and int(value) > 0
    return False


def flight_recorder(directory: str | None) -> str | None:
    """PyTorch's Flight Recorder dump into ``directory`` when it is on; its path."""
    if not directory or not flight_recorder_on():
        return None
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        from torch._C._distributed_c10d import _dump_fr_trace

        data = _dump_fr_trace(True, True, False)
        rank = dist.get_rank()
        path = Path(directory) / f"flight-recorder.rank{rank}.pid{os.getpid()}.pickle"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return str(path.resolve())
    except Exception:
        _log.warning("otel-train: dumping the Flight Recorder at a hang failed", exc_info=True)
        return None


def _print_line(out: dict[str, Any], label_: str, age: float, limit: float) -> None:
    """One line on this rank's console, whatever console_ranks says."""
    where = []
    if c.STEP_INDEX.key in out:
        where.append(f"step {out[c.STEP_INDEX.key]}")
    if c.PHASE_NAME.key in out:
        where.append(f"phase {out[c.PHASE_NAME.key]}")
    if c.COLLECTIVE_OP.key in out:
        seq = out.get(c.COLLECTIVE_SEQ.key)
        name = label(phase_name(out[c.COLLECTIVE_OP.key], out[c.COLLECTIVE_GROUP.key]))
        where.append(name + (f" (#{seq})" if seq is not None else ""))
    elif c.HANG_REGION.key in out:
        where.append(f"in {out[c.HANG_REGION.key]}")
    head = f"otel-train [{label_}]" if label_ else "otel-train"
    text = f"{head}: no progress for {age:.1f} s (limit {limit:g} s)"
    text += (": " + ", ".join(where)) if where else ""
    with contextlib.suppress(Exception):  # (a closed stderr)
        print(text + "; every thread's stack is in the otel_train.hang record",
              file=sys.stderr, flush=True)  # fmt: skip


class LocalHangs:
    """The hang watch's view of this process (the worker runs in it): progress and
    details read here, at once."""

    def __init__(self, rec: Any, regions: Any, directory: str | None, label_: str) -> None:
        self.rec, self.regions, self.directory, self.label = rec, regions, directory, label_
        self.watch: Any = None  # the HangWatch, set by wiring.build_consumer

    def progress(self) -> Progress:
        return progress_now(self.rec, self.regions)

    def collect(self, age: float, limit: float) -> dict[str, Any]:
        return details(self.rec, self.regions, self.directory, self.label, age, limit)

    def ask(self, age: float, limit: float) -> None:
        self.watch.report(self.collect(age, limit))


def hang_label() -> str:
    """What names this rank on its hang line (``rank 3`` when there are several)."""
    return f"rank {rank()}" if (world_size() or 1) > 1 else ""
