"""The hang watch: a rank whose training thread makes no progress explains itself.

Progress is a phase boundary on the training thread (a region's begin or end too). The
watch runs where the consumer side runs (the sidecar process, or the worker thread when
the application passes its providers), on the worker's own timer: it reads the training
process's progress (:class:`Progress`, over the sidecar's pipe: within a tenth of the
limit of a change, at most a second, handover/feeder.py), and when
the age of the last boundary passes the limit (``hang_after``; an open evaluation or
checkpoint region's budget is ten times that) it asks for the details, which only the
training process can give (every thread's stack, the open step and phase, the collective
in flight, the Flight Recorder: hang_details.py), and sends an ``otel_train.hang`` log
record with them. At most three records per stall (at 1x, 2x and 4x the limit), then an
``otel_train.hang.resolved`` record when progress resumes; the stall goes into goodput
as its own category. ``progress.age`` and ``progress.limit`` are the gauges an alert
rule reads; they are set on every tick, so they keep rising while the rank is stuck.

Usage (what wiring.py does)::

    watch = HangWatch(8.0, logger, progress=lambda: ..., ask=lambda age, limit: ...)
    watch.tick(now_ns, stepped=True)       # the worker, every wake
    watch.report(details)                  # the details ask() asked for
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry._logs import Logger, LogRecord, SeverityNumber
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from .. import contract as c

_log = logging.getLogger("otel_train")
AUTO_S = 300.0  # hang_after="auto"
AUTO_FIRST_STEP_S = 1800.0  # ... until the first step ended (compilation, autotuning)
REGION_FACTOR = 10.0  # an evaluation or checkpoint region's budget, in limits
MAX_RECORDS = 3  # per stall
ANSWER_S = 3.0  # how long the sidecar waits for the training process's details


class Progress(NamedTuple):
    """What the training process says of its progress (perf_counter_ns, which is the
    same clock in every process of the host)."""

    ns: int  # its training thread's latest boundary
    region: str | None  # the region open now (evaluation, checkpoint), if any
    waiting: bool  # its training thread is inside a collective now


class _Stall:
    __slots__ = ("asked", "count", "due", "since")

    def __init__(self, since: int, due: float) -> None:
        self.since = since  # the last progress before it
        self.due = due  # the age at which the next record is due
        self.count = 0  # records sent
        self.asked = 0.0  # monotonic time details were asked for (0: not waiting)


class HangWatch:
    def __init__(
        self,
        after: float | str,
        logger: Logger | None,
        progress: Callable[[], Progress | None],
        ask: Callable[[float, float], None],
        stall: Callable[[int, int], None] | None = None,
    ) -> None:
        """``after``: the hang_after setting; ``progress``: the latest word from the
        training process (None: none yet);
        ``ask``: request the details for a record (they come back through report());
        ``stall``: where a resolved stall's extent goes (goodput)."""
        self.after = after
        self._logger = logger
        self._progress = progress
        self._ask = ask
        self._on_stall = stall
        self.stall: _Stall | None = None
        self.age = 0.0
        self.limit = AUTO_FIRST_STEP_S
        self.waiting = False
        self.sent = 0  # hang logs sent (a figure for tests and the summary)
        # The watch's start counts as progress: a process stuck (or frozen) before its
        # first boundary, or before the word of one reached here, is a hang too.
        self.start_ns = time.perf_counter_ns()
        self._lock = threading.RLock()  # tick (the worker) and report (the sidecar's reader)

    def limit_for(self, region: str | None, stepped: bool) -> float:
        after = self.after
        limit = (AUTO_S if stepped else AUTO_FIRST_STEP_S) if after == "auto" else float(after)
        return limit * REGION_FACTOR if region else limit

    def tick(self, now_ns: int, stepped: bool) -> None:
        """Compare the latest progress with its limit; ask for a record when one is due."""
        progress = self._progress()
        if progress is None:
            progress = Progress(self.start_ns, None, False)
        elif progress.ns < self.start_ns:
            progress = progress._replace(ns=self.start_ns)
        with self._lock:
            self._tick(progress, now_ns, stepped)

    def _tick(self, progress: Progress, now_ns: int, stepped: bool) -> None:
        self.age = max(0.0, (now_ns - progress.ns) / 1e9)
        self.limit = limit = self.limit_for(progress.region, stepped)
        self.waiting = progress.waiting
        st = self.stall
        if st is not None and progress.ns > st.since:
            self._resolved(st, progress.ns)
            st = self.stall = None
        if st is None:
            if self.age < limit:
                return
            st = self.stall = _Stall(progress.ns, limit)
        if st.asked:
            if time.monotonic() - st.asked >= ANSWER_S:  # no answer: what is known here
                self._report({c.HANG_STACKTRACE.key: "(the training process did not answer "
                              "in time: a thread holds its GIL, or it is stopped)"})  # fmt: skip
            return
        if st.count < MAX_RECORDS and self.age >= st.due:
            st.asked = time.monotonic()
            self._ask(self.age, limit)

    def report(self, details: dict[str, Any]) -> None:
        """Send the hang record the last ask() was for, with ``details`` (attributes by
        their contract keys; ``trace_id`` and ``span_id`` the open step's, when traced)."""
        with self._lock:
            self._report(details)

    def _report(self, details: dict[str, Any]) -> None:
        st = self.stall
        if st is None or not st.asked:
            return  # (resolved meanwhile)
        st.asked = 0.0
        st.count += 1
        st.due *= 2
        self.sent += 1
        attrs = {c.HANG_SECONDS.key: self.age, c.HANG_AFTER.key: self.limit}
        attrs.update((k, v) for k, v in details.items() if v is not None and k not in _IDS)
        self._emit(c.HANG_EVENT, SeverityNumber.WARN, attrs, details)

    def _resolved(self, st: _Stall, resumed: int) -> None:
        seconds = (resumed - st.since) / 1e9
        if st.count:
            self._emit(c.HANG_RESOLVED_EVENT, SeverityNumber.INFO,
                       {c.HANG_SECONDS.key: seconds}, {})  # fmt: skip
            if self._on_stall is not None:
                self._on_stall(st.since, resumed)

    def _emit(
        self, event: str, severity: SeverityNumber, attrs: dict[str, Any], ids: dict[str, Any]
    ) -> None:
        logger = self._logger
        if logger is None:
            return
        try:
            logger.emit(event_log(event, severity, attrs, ids))
        except Exception:
            self._logger = None
            _log.exception("otel-train: sending a hang record failed; hang records are off")


_IDS = ("trace_id", "span_id")


def event_log(
    event: str, severity: SeverityNumber, attrs: dict[str, Any], ids: dict[str, Any]
) -> LogRecord:
    """A log record of one of the contract's log events (contract.LOG_EVENTS), in the
    trace of the step ``ids`` names (if any)."""
    context = None
    trace_id, span_id = ids.get("trace_id"), ids.get("span_id")
    if trace_id and span_id:
        span = NonRecordingSpan(
            SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))
        )
        context = trace.set_span_in_context(span)
    now = time.time_ns()
    body = f"{event}: no progress for {attrs.get(c.HANG_SECONDS.key, 0):.1f} s"
    if event == c.HANG_RESOLVED_EVENT:
        body = f"{event}: progress resumed after {attrs.get(c.HANG_SECONDS.key, 0):.1f} s"
    return LogRecord(
        timestamp=now,
        observed_timestamp=now,
        context=context,
        severity_number=severity,
        severity_text=severity.name,
        body=body,
        attributes=attrs,
        event_name=event,
    )
