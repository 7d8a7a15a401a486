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
- ``(METRICS, payload)``: the sidecar's aggregator as it stands (its values and
  histograms, pickled once more: the training process unpickles them only when the
  application's meter reads them), every ``METRICS_S`` when it changed;
- ``(LOG, event, severity, attributes, ids)``: a hang record, for its logger provider.

This module is the sidecar's end; relay_in.py is the training process's, which hands
what arrives to the providers one span at a time. A frame the pipe cannot take here is
dropped, and its spans are counted (``otel_train.dropped{reason="span_queue"}``).

Usage (what the sidecar does)::

    out = RelayOut(write_fd)
    worker.emitter = RelayEmitter(out, offset_ns)
    send_metrics(out, worker.agg)             # every METRICS_S, and at a flush
"""

from __future__ import annotations

import errno
import os
import pickle
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber

from ..handover import wire
from ..handover.wire import LOG, METRICS, STEPS, TREES, spans_of
from ..processing.aggregate import MetricsAggregator
from ..recording.links import StepLink, new_ids

METRICS_S = 0.5  # how often the sidecar sends its aggregator (when it changed)
MAX_BUFFER = 8 << 20  # bytes waiting for the pipe in the sidecar before frames are dropped


class RelayOut:
    """The sidecar's end: frames to the training process, never blocking."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._buf = bytearray()
        self._frames = wire.FrameWriter()
        self.dropped_spans = 0  # in the frames the pipe could not take
        self.last_metrics = b""  # the aggregator as last sent (send_metrics)
        self.gone = False
        self._lock = threading.Lock()  # the worker's thread and the metrics' thread

    def send(self, message: tuple[Any, ...]) -> bool:
        """Queue ``message`` and write what the pipe takes now; False if it was dropped."""
        if self.gone:
            return False
        frame = self._frames.frame(message)
        with self._lock:
            if len(self._buf) > MAX_BUFFER:
                if message[0] in (STEPS, TREES):
                    self.dropped_spans += sum(spans_of(message[0], x) for x in message[1])
                return False
            self._buf += frame
        self.write()
        return True

    def drop_counts(self) -> dict[str, int]:
        """What this end dropped, by ``otel_train.dropped``'s reason (the worker's)."""
        return {"span_queue": self.dropped_spans} if self.dropped_spans else {}

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
    """The aggregator as it stands, for the training process's mirror (relay_in.py), if
    it changed since last sent."""
    with agg.lock:
        values = {name: dict(table) for name, table in agg.values.items()}
    histograms = [(name, attrs, h) for name, attrs, h in agg.snapshot_histograms()]
    payload = pickle.dumps((values, histograms), protocol=5)
    if payload != out.last_metrics and out.send((METRICS, payload)):
        out.last_metrics = payload
