"""The application's own providers, served from the sidecar: the relay.

An application that set up OpenTelemetry passes its providers, and the spans and metrics
must reach those objects, which live in the training process. Doing the consumer side's
work there (a worker thread: aggregation, sampling, span building) competes with the
training thread for the GIL: its tail was that of a busy thread beside it (p99.9 21x
plain, worst step +16 ms: docs/rationale.md). So the sidecar does that work for these
providers too, and sends back only what must be handed to them, over a pipe of its own
(never the control pipe, which the training thread reads at its pumps):

- ``(STEPS, [Step])`` and ``(TREES, [Step])``: the steps the sampler
  chose, their span ids chosen in the sidecar (the exemplars there point at them), and
  remote phases' trees;
- ``(METRICS, values, histograms)``: the sidecar's aggregator as it stands, every
  ``METRICS_S``; here it replaces a mirror that the application's meter reads at its own
  collection times (observable instruments, and the histogram bridge on its SDK readers);
- ``(LOG, event, severity, attributes, ids)``: a hang record, for its logger provider.

Here, the feeder's thread takes what arrived in small pieces: at most ``STEPS_PER_TICK``
steps' spans per tick, each piece followed by a GIL release, so the training thread never
waits behind a batch of span building; steps past that are counted as dropped
(``span_queue``). A frame the pipe cannot take in the sidecar is dropped and counted too.

Usage (what the session and the sidecar do)::

    relay = RelayIn(read_fd, tracer_provider, meter_provider, logger_provider, ...)  # here
    relay.take()                               # the feeder's thread, every tick
    out = RelayOut(write_fd)                   # in the sidecar
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections import deque
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber

from .. import contract as c
from ..export.bridge import mirror_into
from ..export.ids import id_choice
from ..export.logs import logger_for
from ..export.setup import flush_providers
from ..processing.aggregate import MetricsAggregator
from ..processing.hangs import event_record
from ..processing.spans import SpanEmitter
from ..recording.links import StepLink, new_ids
from . import wire

_log = logging.getLogger("otel_train")
STEPS, TREES, METRICS, LOG = range(4)
METRICS_S = 0.5  # how often the sidecar sends its aggregator
MAX_BUFFER = 8 << 20  # bytes waiting for the pipe in the sidecar before frames are dropped
STEPS_PER_TICK = 8  # steps whose spans are built here per tick of the feeder's thread
MAX_WAITING = 256  # steps waiting here for their spans; past it, the oldest are dropped


class RelayOut:
    """The sidecar's end: frames to the training process, never blocking."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._buf = bytearray()
        self._frames = wire.FrameWriter()
        self.dropped = 0  # frames the pipe could not take
        self.gone = False
        self._lock = threading.Lock()  # the worker's thread and the metrics' thread

    def send(self, message: tuple[Any, ...]) -> None:
        if self.gone:
            return
        frame = self._frames.frame(message)
        with self._lock:
            if len(self._buf) > MAX_BUFFER:
                self.dropped += 1
                return
            self._buf += frame
        self.write()

    @property
    def pending(self) -> int:
        return len(self._buf)

    def write(self) -> None:
        with self._lock:
            while self._buf and not self.gone:
                try:
                    n = os.write(self._fd, self._buf)
                except BlockingIOError:
                    return
                except OSError as err:
                    if err.errno in (errno.EPIPE, errno.EBADF):
                        self.gone = True
                        return
                    raise
                del self._buf[:n]


class RelayEmitter:
    """The worker's span emitter in the sidecar (processing/spans.py's interface): a step
    chosen for a trace is sent back whole, its span ids chosen here."""

    def __init__(self, out: RelayOut, offset_ns: int) -> None:
        self._out = out
        self.offset_ns = offset_ns  # perf_counter_ns -> epoch ns (the exemplars' times)
        self.emitted = 0
        self.device_total: int | None = None
        self.ids = True  # ids are chosen here: carriers may name them

    def emit(self, step: Any) -> tuple[int, int] | None:
        link = step.link
        if link is None or not link.span_id:
            trace_id, span_id = new_ids(link.trace_id if link is not None else 0)
            if link is None:
                step.link = StepLink(trace_id, span_id, 0, False)
            else:
                step.link = link._replace(span_id=span_id)
        self._out.send((STEPS, [step]))
        self.emitted += 1 + len(step.phases)
        return step.link.trace_id, step.link.span_id

    def emit_remote(self, tree: Any) -> tuple[int, int] | None:
        link = tree.link
        if link is None or not link.sampled or not tree.phases:
            return None
        self._out.send((TREES, [tree]))
        self.emitted += len(tree.phases)
        return link.trace_id, link.span_id


class RelayLoggerProvider:
    """The sidecar's logger provider when the application's is in the training process."""

    def __init__(self, out: RelayOut) -> None:
        self._out = out

    def get_logger(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def emit(self, record: Any) -> None:
        span = trace.get_current_span(record.context).get_span_context()
        ids = {"trace_id": span.trace_id, "span_id": span.span_id} if span.is_valid else {}
        severity = record.severity_number or SeverityNumber.INFO
        self._out.send((LOG, record.event_name, int(severity.value),
                        dict(record.attributes or {}), ids))  # fmt: skip


def send_metrics(out: RelayOut, agg: MetricsAggregator) -> None:
    """The aggregator as it stands, for the training process's mirror."""
    with agg.lock:
        values = {name: dict(table) for name, table in agg.values.items()}
    histograms = [(name, attrs, h) for name, attrs, h in agg.snapshot_histograms()]
    out.send((METRICS, values, histograms))


class RelayIn:
    """The training process's end: what the sidecar sends back, handed to the
    application's providers in small pieces on the feeder's thread (see the module doc)."""

    def __init__(self, fd: int, providers: tuple[Any, Any, Any], rank: int, offset_ns: int,
                 version: str) -> None:  # fmt: skip
        """``providers``: the application's tracer, meter and logger providers (each may
        be None)."""
        tracer_provider, meter_provider, logger_provider = providers
        self._fd = fd
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._frames = wire.FrameReader()
        self.emitter: SpanEmitter | None = None
        if tracer_provider is not None:
            tracer = tracer_provider.get_tracer(c.SCOPE_NAME, version, schema_url=c.SCHEMA_URL)
            self.emitter = SpanEmitter(tracer, rank, offset_ns, ids=id_choice(tracer))
        self.mirror = MetricsAggregator()
        self.publisher = mirror_into(meter_provider, self.mirror, version)
        self._logger = logger_for(logger_provider, version)
        self._waiting: deque[tuple[int, Any]] = deque()
        self.dropped = 0  # steps whose spans were not built here (more than MAX_WAITING)
        self._providers = providers
        self._lock = threading.Lock()  # the feeder's thread and a flush, one at a time

    def take(self, pieces: int = STEPS_PER_TICK) -> None:
        """What arrived, and up to ``pieces`` steps' spans, each piece a GIL release apart
        (nothing when a flush takes it now)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._take(pieces)
        finally:
            self._lock.release()

    def _take(self, pieces: int) -> None:
        self._read()
        emitter = self.emitter
        for _ in range(pieces):
            if not self._waiting:
                return
            kind, item = self._waiting.popleft()
            if emitter is not None:
                if kind == STEPS:
                    emitter.emit(item)
                else:
                    emitter.emit_remote(item)
            time.sleep(0)  # (the training thread takes the GIL back between pieces)

    def drain(self, deadline: float) -> None:
        """Everything that arrived, spans included, by ``deadline`` (monotonic): a flush,
        or the end (the sidecar has answered, so its frames are in the pipe)."""
        with self._lock:
            while time.monotonic() < deadline:
                before = len(self._waiting)
                self._take(MAX_WAITING)
                if not self._waiting and before == 0 and not self._read():
                    return

    def flush(self, deadline: float) -> bool:
        """drain(), then the providers' own flush within what is left of ``deadline``."""
        self.drain(deadline)
        return flush_providers(self._providers, deadline)

    def _read(self) -> int:
        """Apply the frames in the pipe now; the number read."""
        try:
            data = os.read(self._fd, 1 << 20)
        except (BlockingIOError, OSError):
            return 0
        messages = self._frames.feed(data) if data else []
        for message in messages:
            self._apply(message)
        return len(messages)

    def _apply(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == METRICS:
            _, values, histograms = message
            mirror = self.mirror
            with mirror.lock:
                mirror.values = values
                mirror.histograms = {(name, attrs): h for name, attrs, h in histograms}
        elif kind == LOG:
            _, event, severity, attrs, ids = message
            if self._logger is not None:
                self._logger.emit(event_record(event, SeverityNumber(severity), attrs, ids))
        else:
            for item in message[1]:
                if len(self._waiting) >= MAX_WAITING:
                    self._waiting.popleft()
                    self.dropped += 1
                self._waiting.append((kind, item))
