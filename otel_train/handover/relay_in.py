"""The relay's end in the training process: what the sidecar sends back (relay.py), handed
to the application's providers a small piece at a time.

Everything here holds the GIL the training thread needs after each of its calls into
torch, so nothing here is done in one go. A thread of its own (``otel-train-relay``)
waits on the pipe and does one piece at a time, ``PIECE_GAP_S`` apart:

- one frame unpickled and applied: a step or a tree queued for its spans, a hang record
  emitted to the logger provider, the metrics kept (below);
- one span started or ended in the application's SDK (processing/spans.py's
  ``SpanEmitter.pieces``): a step's trace takes twice its phases' count plus two.

The metrics are not taken apart when they arrive: the mirror keeps the sidecar's last
payload and unpickles it when the application's meter reads it, at that meter's own
collection times (``RelayMirror``). Measured on the 2-core VM (benchmarks/README.md): a
step's trace was one hold of 260-350 us of the feeder thread's CPU, and a frame's
unpickling 100-200 us; a piece now holds one span's or one frame's work.

At most ``MAX_WAITING`` steps wait here for their spans; past it, the oldest are
dropped and their spans counted (``otel_train.dropped{reason="span_queue"}``, added to
the sidecar's count in the mirror). A flush or the end takes everything now, on the
caller's thread (``drain``).

Usage (what the feeder does)::

    relay = RelayIn(read_fd, (tracer_provider, meter_provider, logger_provider), ...)
    relay.flush(deadline)                      # a flush: what arrived, then the providers
    relay.drain(deadline); relay.stop()        # the end
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import threading
import time
from collections import deque
from typing import Any

from opentelemetry._logs import SeverityNumber

from .. import contract as c
from ..export.bridge import mirror_into
from ..export.ids import id_choice
from ..export.logs import logger_for
from ..export.setup import flush_providers
from ..processing.aggregate import Attrs, HistogramState, MetricsAggregator
from ..processing.hangs import event_log
from ..processing.spans import Pieces, SpanEmitter
from . import wire
from .wire import LOG, METRICS, STEPS, spans_of

_log = logging.getLogger("otel_train")
PIECE_GAP_S = 0.001  # between two pieces: a training step of a millisecond meets one
IDLE_WAIT_S = 0.5  # the thread's wait for the pipe between looks at its stop flag
MAX_WAITING = 256  # steps waiting here for their spans; past it, the oldest are dropped
READ_BYTES = 64 << 10  # read from the pipe at a time (a pipe's capacity)
MAX_UNREAD = 1 << 20  # read bytes not unpickled yet past which the pipe is left to fill
_SPAN_QUEUE = ((c.A_REASON, "span_queue"),)


class RelayMirror(MetricsAggregator):
    """The sidecar's aggregator as last sent, unpickled when read (the application's
    collection times), not each time it arrives; the spans dropped here added."""

    def __init__(self) -> None:
        super().__init__()
        self._payload: bytes | None = None
        self.dropped_spans = 0  # here, before their spans were built
        self._sidecar_dropped = 0.0  # spans the sidecar's end dropped, as last sent

    def offer(self, payload: bytes) -> None:
        with self.lock:
            self._payload = payload

    def read(self, name: str) -> list[tuple[Attrs, float]]:
        self._settle()
        return super().read(name)

    def snapshot_histograms(self) -> list[tuple[str, Attrs, HistogramState]]:
        self._settle()
        return super().snapshot_histograms()

    def _settle(self) -> None:
        with self.lock:
            payload, self._payload = self._payload, None
            if payload is not None:
                values, histograms = pickle.loads(payload)
                self.values = values
                self.histograms = {(name, attrs): h for name, attrs, h in histograms}
                self._sidecar_dropped = values.get(c.DROPPED.name, {}).get(_SPAN_QUEUE, 0.0)
            if self.dropped_spans:
                dropped = self.values.setdefault(c.DROPPED.name, {})
                dropped[_SPAN_QUEUE] = self._sidecar_dropped + self.dropped_spans


class RelayIn:
    """The training process's end (see the module doc)."""

    def __init__(self, fd: int, providers: tuple[Any, Any, Any], rank: int, offset_ns: int,
                 version: str) -> None:  # fmt: skip
        """``providers``: the application's tracer, meter and logger providers (each may
        be None)."""
        tracer_provider, meter_provider, logger_provider = providers
        self._fd = fd
        self._rank = rank
        os.set_blocking(fd, False)
        self._frames = wire.FrameReader()
        self.emitter: SpanEmitter | None = None
        if tracer_provider is not None:
            tracer = tracer_provider.get_tracer(c.SCOPE_NAME, version, schema_url=c.SCHEMA_URL)
            self.emitter = SpanEmitter(tracer, rank, offset_ns, ids=id_choice(tracer))
        self.mirror = RelayMirror()
        self.publisher = mirror_into(meter_provider, self.mirror, version)
        self._logger = logger_for(logger_provider, version)
        self._waiting: deque[tuple[int, Any]] = deque()
        self._trace: Pieces | None = None  # the trace being handed over, a piece at a time
        self._providers = providers
        self._eof = False
        self.failed = False
        self._lock = threading.Lock()  # the relay's thread and a flush, one at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="otel-train-relay", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Spans not built here (more than MAX_WAITING steps waiting)."""
        return self.mirror.dropped_spans

    def dropped_line(self) -> str:
        """The console's word on ``dropped``, printed after the last drain: the sidecar's
        run summary, printed before it, cannot count them."""
        head = f"otel-train [rank {self._rank}]" if self._rank else "otel-train"
        return (f"{head}: telemetry dropped in the training process (not in the summary "
                f"above): {self.dropped:,} span_queue (reasons: docs/telemetry.md, "
                "otel_train.dropped)")  # fmt: skip

    def drain(self, deadline: float) -> None:
        """Everything that arrived, spans included, by ``deadline`` (monotonic): a flush,
        or the end (the sidecar has answered, so its frames are in the pipe)."""
        with self._lock:
            while time.monotonic() < deadline and self._guarded():
                pass

    def flush(self, deadline: float) -> bool:
        """drain(), then the providers' own flush within what is left of ``deadline``."""
        self.drain(deadline)
        return flush_providers(self._providers, deadline) and not self.failed

    def stop(self) -> None:
        """The thread ends (within IDLE_WAIT_S); what is left stays unhanded."""
        self._stop.set()

    def close(self) -> None:
        """stop(), and the pipe's end closed once the thread ended (a select in progress
        holds the pipe open): the sidecar's writes fail from now on."""
        self.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(2 * IDLE_WAIT_S)
        with self._lock:
            self._close_pipe()

    def _close_pipe(self) -> None:
        """(The lock held.) Nothing more is read; a sidecar still writing gets EPIPE,
        drops what it sends (counted there) and stops waiting for the pipe to take it."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
            self._eof = True

    def _serve(self) -> None:
        """The relay's thread: a piece, a gap, and so on; the pipe waited on when idle."""
        while not self._stop.is_set() and not self.failed:
            with self._lock:
                worked = self._guarded()
            if worked:
                time.sleep(PIECE_GAP_S)
            elif self._eof or self.failed:
                return
            else:
                fd = self._fd  # (close() may close it meanwhile: then the loop ends)
                try:
                    select.select([fd], [], [], IDLE_WAIT_S)
                except (OSError, ValueError):
                    return

    def _guarded(self) -> bool:
        """One piece (``_piece``); an error in it is logged once and ends the relay (what
        the application's providers raise never reaches training)."""
        if self.failed:
            return False
        try:
            return self._piece()
        except Exception:
            self.failed = True
            _log.exception("otel-train: handing telemetry to the providers failed; it is off")
            self._close_pipe()
            return False

    def _piece(self) -> bool:
        """One piece of work (the module doc), the pipe read first; False when there was
        nothing to do."""
        read = self._read() if self._frames.unread < MAX_UNREAD else False
        if self._trace is not None:
            try:
                next(self._trace)
            except StopIteration:
                self._trace = None
            return True
        message = self._frames.next_message()
        if message is not None:
            self._apply(message)
            return True
        if self._waiting:
            kind, item = self._waiting.popleft()
            if self.emitter is not None:
                emit = self.emitter.pieces if kind == STEPS else self.emitter.remote_pieces
                self._trace = emit(item)
            return True
        return read

    def _read(self) -> bool:
        """What the pipe holds now, appended to the frames; False when it held nothing."""
        if self._eof:
            return False
        try:
            data = os.read(self._fd, READ_BYTES)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._close_pipe()  # (the sidecar closed its end)
            return False
        self._frames.append(data)
        return True

    def _apply(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == METRICS:
            self.mirror.offer(message[1])
        elif kind == LOG:
            _, event, severity, attrs, ids = message
            if self._logger is not None:
                self._logger.emit(event_log(event, SeverityNumber(severity), attrs, ids))
        else:
            for item in message[1]:
                if len(self._waiting) >= MAX_WAITING:
                    self.mirror.dropped_spans += spans_of(*self._waiting.popleft())
                self._waiting.append((kind, item))
