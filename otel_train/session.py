"""One telemetry session per process: settings, recorder, consumer and exports wired together.

Created by the first ``instrument()``, ``configure()`` or bare ``step()``/``phase()``;
ended by ``shutdown()`` (also registered with ``atexit``). One a bare call starts holds
its exports back until the first ``instrument()``/``configure()`` gives it settings, or
until it has enough recorded to hand on (``get_or_create``).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import weakref
from typing import Any, Protocol

from . import session_end
from .export.exporters import check_exporters, exports_traces
from .export.record import RecordPlan
from .export.record import plan as record_plan
from .export.resource import rank, service_name
from .export.run_facts import record_run_facts
from .export.setup import Telemetry, build_telemetry, builds_own, relayed_providers
from .handover.consumer import SidecarConsumer
from .handover.feeder import PUMP_ENTRIES, PUMP_STEPS, SidecarUnavailable
from .processing.efficiency import EfficiencyTracker
from .processing.hang_details import LocalHangs, hang_label
from .processing.source import StepSource
from .recording.debug_hooks import build_debug_hooks
from .recording.notes import SummaryNotes
from .recording.recorder import BUILT_WITH, Recorder
from .recording.regions import RegionLog
from .settings import ConfigError, Settings
from .settings.verdicts import VerdictSettings
from .signals import SigtermFlush
from .wiring import Consumer, ThreadConsumer, prints_console

__version__ = "0.2.0"
_log = logging.getLogger("otel_train")


class Instrumented(Protocol):
    """adapters/base.py's Instrumentation as the session uses it (neither imports the other)."""

    active: bool
    target: Any

    def uninstrument(self) -> None: ...


class Session:
    def __init__(
        self,
        settings: Settings,
        tracer_provider: Any | None = None,
        meter_provider: Any | None = None,
        exports: bool = True,
        logger_provider: Any | None = None,
    ) -> None:
        """``exports=False``: a session started by a bare call, its exports held back
        until :meth:`start_exports` (see :func:`get_or_create`); ``logger_provider``:
        where log records go when the application passes its own providers."""
        self.settings = settings
        self.given_providers = (tracer_provider, meter_provider)
        self.logger_provider = logger_provider
        self.origin = "otel_train.configure()"  # what started it (get_or_create sets it)
        self.configured = exports  # an instrument() or configure() gave its settings
        self.regions = RegionLog()
        self.notes = SummaryNotes()  # the run summary's lines from the adapters
        self._build_recording(settings)
        self.consumer: Consumer | None = None  # where the steps are consumed (chosen once)
        self.record: RecordPlan | None = None
        self.sigterm: SigtermFlush | None = None
        self.instrumentations: dict[int, Instrumented] = {}
        self._instrumented_targets: weakref.WeakSet[Any] = weakref.WeakSet()
        self.closed = False
        self.exporting = False
        if exports:
            self.start_exports(strict=True)
        else:
            check_exporters(settings)  # a bad exporter setting fails at once all the same
            # Held back, until a configuration or a backlog (see _start_on_backlog).
            self.recorder.on_backlog(self._start_on_backlog, PUMP_ENTRIES, PUMP_STEPS)

    def _build_recording(self, settings: Settings) -> None:
        """The recording side: recorder, debugging hooks, efficiency tracker."""
        self.recorder = Recorder(settings, debug=build_debug_hooks(settings))
        self.efficiency = EfficiencyTracker(
            settings, self.recorder, self.regions, settings.throughput_window
        )

    def start_exports(self, strict: bool = False) -> None:
        """Build the export side (the consumer, in the sidecar or on a thread) and start
        it; once. ``strict``: for a configuration, what fails is raised; otherwise (a bare-call
        session's start, on the recording thread or at exit) it is logged and the
        session records nothing more."""
        if self.exporting or self.closed:
            return
        with _lock:
            if self.exporting or self.closed:
                return
            self.exporting = True
            try:
                self._build_exports()
            except Exception:
                if strict:
                    raise
                self.recorder.enabled = False
                _log.exception("otel-train: starting the exports failed; telemetry is off")

    def _build_exports(self) -> None:
        settings, (tracer_provider, meter_provider) = self.settings, self.given_providers
        own = builds_own(tracer_provider, meter_provider)
        self.record = record_plan(settings, service_name(settings)) if own else None
        self.consumer = self._start_consumer(own)
        self._announce_record()
        # Carriers name step spans whose ids the tracer takes (export/ids.py).
        self.recorder.carriers = self.consumer.takes_carriers
        self.consumer.start()
        if settings.flush_on_sigterm:
            self.sigterm = SigtermFlush(shutdown)
            self.sigterm.install()

    def _start_consumer(self, own: bool) -> Consumer:
        """Where the steps are consumed, chosen here alone and said once: the sidecar
        (with otel-train's own SDK there, or relaying to the application's SDK providers),
        else a thread of this process: ``sidecar="off"``, providers the relay does not
        serve, or a sidecar that could not start (then the line is a warning)."""
        settings, (tracer_provider, meter_provider) = self.settings, self.given_providers
        source = StepSource(self.recorder, self.notes)
        relay = None if own else relayed_providers(tracer_provider, meter_provider)
        level, why = logging.INFO, "the default"
        if settings.sidecar == "off":
            why = "sidecar='off'"
        elif not own and relay is None:
            why = "providers the sidecar's relay does not serve"
        else:
            try:
                return self._said(SidecarConsumer(settings, source, self.efficiency,
                                                  self.regions, __version__, self.record, relay,
                                                  self.logger_provider), why, own)  # fmt: skip
            except SidecarUnavailable as err:
                level, why = logging.WARNING, f"the sidecar process could not start: {err}"
                self.recorder.handover = None
        telemetry = build_telemetry(settings, tracer_provider, meter_provider, __version__,
                                    self.record, self.logger_provider)  # fmt: skip
        hangs = LocalHangs(self.recorder, self.regions, self.hang_dir, hang_label())
        consumer = ThreadConsumer(settings, telemetry, source, self.efficiency, __version__, hangs)
        return self._said(consumer, why, own, level)

    @staticmethod
    def _said(consumer: Consumer, why: str, own: bool, level: int = logging.INFO) -> Consumer:
        by = "otel-train's SDK" if own else "the application's providers"
        _log.log(level, "otel-train: steps are consumed on %s (%s), exported by %s",
                 consumer.where, why, by)  # fmt: skip
        return consumer

    def _start_on_backlog(self) -> None:
        """A bare-call session's recorder holds enough to hand on: its exports start at
        the settings it has (on the recording thread, as a sidecar's pump would run)."""
        self.start_exports()
        if self.consumer is not None:
            self.consumer.pump()

    def take_settings(self, settings: Settings, tracer_provider: Any, meter_provider: Any) -> None:
        """The first configure()/instrument() of a session bare calls started, before its
        exports did: its settings and providers apply. What the recorder holds stays,
        unless a setting the recorder was built with changes (then it is dropped, with a
        warning: it was measured another way)."""
        old, rec = self.settings, self.recorder
        self.settings = settings
        self.given_providers = (tracer_provider, meter_provider)
        self.configured = True
        changed = [n for n in BUILT_WITH if getattr(old, n) != getattr(settings, n)]
        held = rec.holds_anything()
        if changed or not held:
            if changed and held:
                _log.warning(
                    "otel-train: what was recorded before the first instrument() or "
                    "configure() is dropped: it was recorded with other %s",
                    ", ".join(f"'{n}'" for n in changed),
                )
            rec.enabled = False
            self._build_recording(settings)
            self.recorder.on_backlog(self._start_on_backlog, PUMP_ENTRIES, PUMP_STEPS)
            return
        rec.settings = settings  # (read where it is used, as `role` is)
        rec.flop_probe = None  # the tracker of these settings arms its own
        self.efficiency = EfficiencyTracker(settings, rec, self.regions, settings.throughput_window)

    def _announce_record(self) -> None:
        if self.record is not None and prints_console(self.settings, rank()):
            out = sys.stdout if self.settings.console == "stdout" else sys.stderr
            print(f"otel-train: run record in {self.record.directory}", file=out, flush=True)

    def write_run_facts(self) -> None:
        """At shutdown: the run facts beside the record (export/run_facts.py)."""
        if self.record is not None:
            compiled = self.efficiency.runs_compiled
            record_run_facts(self.record, self.settings, __version__, compiled)

    @property
    def hang_dir(self) -> str:
        """Where a hang's Flight Recorder dump goes: the run record's directory, else
        debug_dir."""
        return self.record.directory if self.record is not None else self.settings.debug_dir

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        return self.consumer.prometheus_address if self.consumer is not None else None

    @property
    def telemetry(self) -> Telemetry | None:
        """The providers, as seen from this process (None before the exports start)."""
        return self.consumer.telemetry if self.consumer is not None else None

    @property
    def feeder(self) -> Any:
        """The sidecar's feeder, for tests and benchmarks (None on a thread)."""
        return self.consumer.feeder if self.consumer is not None else None

    @property
    def worker(self) -> Any:
        """The consumer thread's worker, for tests and benchmarks (None in the sidecar)."""
        return self.consumer.worker if self.consumer is not None else None

    @property
    def exports_traces(self) -> bool:
        """Whether steps leave as spans."""
        return self.consumer is not None and self.consumer.exports_traces

    @property
    def exports_otlp(self) -> bool:
        """Whether otel-train's own SDK sends spans over OTLP (an endpoint is set)."""
        owned = self.telemetry is not None and self.telemetry.owned
        return owned and exports_traces(self.settings)

    def instrumented(self, target: Any) -> None:
        """An instrumentation of a target not instrumented before in this session
        attached: the first step it records becomes a trace. (Instrumenting the same
        loop again resumes it: no new trace.)"""
        try:
            seen = self._instrumented_targets
            try:
                if target in seen:
                    return
                seen.add(target)
            except TypeError:  # (no weak reference to it: traced each time)
                pass
            rec = self.recorder
            rec.settle()  # (steps logged before it get their indices first)
            if self.consumer is not None:
                self.consumer.trace_first_from(rec.next_index)
        except Exception:  # telemetry's own error: that trace is lost, nothing else
            _log.exception("otel-train: marking an instrumentation's first step failed")

    def note_model(self, target: Any) -> None:
        """A model instrument() saw (the FLOP estimate and peak dtype need it)."""
        self.efficiency.note_model(target)
        if self.consumer is not None:
            self.consumer.note_model()

    def matches(self, settings: Settings | None, tracer_provider: Any, meter_provider: Any) -> bool:
        """Whether a later configure()/instrument() asks for this same session."""
        given = self.given_providers
        return (settings is None or settings == self.settings) and (
            (tracer_provider is None or tracer_provider is given[0])
            and (meter_provider is None or meter_provider is given[1])
        )

    def flush(self, timeout_s: float) -> bool:
        """Every step finished so far reaches the providers: metrics current, spans
        exported (bounded by ``timeout_s``); True if all of it was done in time."""
        return session_end.flush(self, timeout_s)

    def export_drops(self) -> dict[str, int]:
        """What the exporters dropped so far, by reason (the sidecar's, after a flush)."""
        return self.consumer.export_drops() if self.consumer is not None else {}

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Uninstrument everything, drain, print the summary, flush exports; bounded."""
        return session_end.shutdown(self, timeout_s)


_lock = threading.RLock()
_current: Session | None = None
forked_child = False  # set in children of fork: they never record or export
# After otel_train.shutdown(), a bare step()/phase()/record()/region() starts nothing
# (one warning) until configure() or instrument() starts a session again.
_stopped = False
_warned_stopped = False


def current() -> Session | None:
    return _current


BARE_CALL = "a step(), phase(), record() or region() call before any instrument()"


def get_or_create(
    overrides: dict[str, Any] | None = None,
    tracer_provider: Any | None = None,
    meter_provider: Any | None = None,
    origin: str = BARE_CALL,
    logger_provider: Any | None = None,
) -> Session:
    """The live session, or a new one; ``origin`` names the call, for the error a later
    call with other settings gets.

    A session a bare call (``origin`` BARE_CALL) starts holds its exports back until
    the first configure()/instrument(), whose settings then apply to it and to what it
    recorded; or until it has enough to hand on (then they start at its settings, and
    a later configuration with others restarts it, with one warning)."""
    global _current, _stopped
    with _lock:
        settings = Settings.resolve(overrides or {})
        VerdictSettings.resolve()  # its OTEL_TRAIN_VERDICT_* variables, checked now
        session = _current
        explicit = origin != BARE_CALL
        if session is not None and not session.closed:
            if explicit and not session.configured:
                if logger_provider is not None:
                    session.logger_provider = logger_provider
                return _configure(session, overrides or {}, settings, tracer_provider,
                                  meter_provider, origin)  # fmt: skip
            conflicts = _conflicts(session, overrides or {}, settings)
            if conflicts or not session.matches(None, tracer_provider, meter_provider):
                what = "; ".join(conflicts) or "other tracer or meter providers"
                raise ConfigError(
                    "otel-train is already configured in this process (started by "
                    f"{session.origin}) with other settings or providers: {what}; call "
                    "otel_train.shutdown() "
                    "before configuring it again, or pass the same values"
                )
            return session
        _current = Session(settings, tracer_provider, meter_provider, exports=explicit,
                           logger_provider=logger_provider)  # fmt: skip
        _current.origin = origin
        _stopped = False
        return _current


def _configure(session: Session, overrides: dict[str, Any], settings: Settings,
               tracer_provider: Any, meter_provider: Any, origin: str) -> Session:  # fmt: skip
    """The first configure()/instrument() of a session that bare calls started: its
    settings and providers apply (the lock is held)."""
    global _current
    session.origin = origin
    if not session.exporting:  # nothing left it yet: it takes them, and keeps its records
        check_exporters(settings)
        session.take_settings(settings, tracer_provider, meter_provider)
        try:
            session.start_exports(strict=True)
        except BaseException:
            _current = None  # (a configuration that fails leaves no session behind)
            session.closed = True
            session.recorder.enabled = False
            raise
        return session
    conflicts = _conflicts(session, overrides, settings)
    if not conflicts and session.matches(None, tracer_provider, meter_provider):
        session.configured = True
        return session
    what = "; ".join(conflicts) or "other tracer or meter providers"
    _log.warning("otel-train: %s gives other settings than those %s started it with (%s), "
                 "after its exports began: it starts again with them; what was recorded "
                 "before went out with the earlier settings", origin, BARE_CALL, what)  # fmt: skip
    _current = None
    session.shutdown()
    _current = Session(settings, tracer_provider, meter_provider,
                       logger_provider=session.logger_provider)  # fmt: skip
    _current.origin = origin
    return _current


def stopped() -> bool:
    """Whether ``shutdown()`` ended the last session: bare calls start none until
    configure() or instrument() does."""
    return _stopped


def implicit() -> Session | None:
    """The live session for a bare step()/phase()/record()/region() call: a new one at
    defaults when none was started yet; None after shutdown() (logged once)."""
    global _warned_stopped
    session = _current
    if session is not None and not session.closed:
        return session
    if _stopped:
        if not _warned_stopped:
            _warned_stopped = True
            _log.warning(
                "otel-train: a step(), phase(), record() or region() call after "
                "otel_train.shutdown() records nothing; call otel_train.configure() or "
                "otel_train.instrument() to start again"
            )
        return None
    return get_or_create()


def reset() -> None:
    """shutdown(), then forget it: the next bare call starts a session again (tests)."""
    global _stopped, _warned_stopped
    shutdown()
    with _lock:
        _stopped = _warned_stopped = False


def _conflicts(session: Session, overrides: dict[str, Any], settings: Settings) -> list[str]:
    """The settings given now whose values differ from the live session's."""
    out = []
    for name in overrides:
        now, then = getattr(settings, name), getattr(session.settings, name)
        if now != then:
            out.append(f"setting '{name}' is {then!r} there, {now!r} here")
    return out


def shutdown(timeout_s: float | None = None) -> bool:
    global _current, _stopped
    with _lock:
        session, _current = _current, None
        _stopped = True
    if session is None:
        return True
    return session.shutdown(timeout_s)


def _after_fork_in_child() -> None:
    # DataLoader workers and other forks must not record or export: the parent does.
    global _current, forked_child
    forked_child = True
    session = _current
    if session is not None:
        session.recorder.enabled = False
        session.closed = True
        if session.consumer is not None:
            session.consumer.forget()  # the parent's: this child never touches it
        _current = None


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(shutdown)
