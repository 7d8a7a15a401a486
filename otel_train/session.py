"""One telemetry session per process: settings, recorder, worker and exports wired together.

Created by the first ``instrument()``, ``configure()`` or bare ``step()``/``phase()``;
ended by ``shutdown()`` (also registered with ``atexit``).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from . import contract as c
from .export.resource import rank
from .export.setup import Telemetry, build_telemetry
from .recording.aggregate import MetricsAggregator
from .recording.console import ConsoleReporter
from .recording.debug_hooks import build_debug_hooks
from .recording.device import now_offset_ns
from .recording.efficiency import EfficiencyTracker, RegionLog
from .recording.instruments import Publisher
from .recording.recorder import Recorder
from .recording.sampling import StepSampler
from .recording.source import StepSource
from .recording.spans import SpanEmitter
from .recording.worker import Worker
from .settings import ConfigError, Settings
from .signals import SigtermFlush

if TYPE_CHECKING:
    from .adapters.base import Instrumentation

__version__ = "0.1.0"
_PUBLISHERS: WeakKeyDictionary[Any, Publisher] = WeakKeyDictionary()
_log = logging.getLogger("otel_train")


class Session:
    def __init__(
        self,
        settings: Settings,
        tracer_provider: Any | None = None,
        meter_provider: Any | None = None,
    ) -> None:
        self.settings = settings
        self.given_providers = (tracer_provider, meter_provider)
        self.recorder = Recorder(settings)
        self.recorder.debug = debug = build_debug_hooks(settings)
        self.telemetry: Telemetry = build_telemetry(
            settings, tracer_provider, meter_provider, __version__
        )
        t = self.telemetry
        self.aggregator = MetricsAggregator()
        publisher: Publisher | None = None
        if t.meter_provider is not None:
            if t.bridge is not None:
                t.bridge.aggregator = self.aggregator
            meter = t.meter_provider.get_meter(c.SCOPE_NAME, __version__)
            publisher = Publisher(meter, self.aggregator, histograms_via_api=t.bridge is None)
            # Instruments cannot be removed from a provider: a finished session's keep
            # reporting their final values until a new session on that provider starts.
            previous = _PUBLISHERS.get(t.meter_provider)
            if previous is not None:
                previous.closed = True
            _PUBLISHERS[t.meter_provider] = publisher
        self.publisher = publisher
        emitter = None
        if t.tracer_provider is not None and settings.trace_steps != "none":
            tracer = t.tracer_provider.get_tracer(c.SCOPE_NAME, __version__)
            emitter = SpanEmitter(tracer, rank(), now_offset_ns())
            if debug is not None:
                emitter.step_events = debug.step_events
        sampler = StepSampler(
            settings.trace_steps,
            settings.trace_window,
            settings.trace_window_seconds,
            settings.trace_slowest,
        )
        if debug is not None:
            sampler.always = debug.wants_trace
        console = ConsoleReporter(settings.console_every, settings.console)
        self.regions = RegionLog()
        self.efficiency = EfficiencyTracker(
            settings, self.recorder, self.regions, settings.throughput_window
        )
        console.efficiency = self.efficiency
        self.worker = Worker(
            StepSource(self.recorder),
            self.aggregator,
            publisher,
            emitter,
            sampler,
            console,
            settings.throughput_window,
            export_drops=t.health.counts if t.health is not None else None,
            efficiency=self.efficiency,
        )
        self.instrumentations: dict[int, Instrumentation] = {}
        self.closed = False
        self.worker.start()
        self.sigterm = SigtermFlush(shutdown) if settings.flush_on_sigterm else None
        if self.sigterm is not None:
            self.sigterm.install()

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        return self.telemetry.prometheus_address

    def matches(self, settings: Settings | None, tracer_provider: Any, meter_provider: Any) -> bool:
        """Whether a later configure()/instrument() asks for this same session."""
        given = self.given_providers
        return (settings is None or settings == self.settings) and (
            (tracer_provider is None or tracer_provider is given[0])
            and (meter_provider is None or meter_provider is given[1])
        )

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Uninstrument everything, drain, print the summary, flush exports; bounded."""
        if self.closed:
            return True
        self.closed = True
        if self.sigterm is not None:
            self.sigterm.uninstall()
        budget = self.settings.shutdown_timeout if timeout_s is None else max(0.0, timeout_s)
        deadline = time.monotonic() + budget
        for inst in list(self.instrumentations.values()):
            inst.uninstrument()
        rec = self.recorder
        if rec.current_step is not None and rec.enabled:
            rec.end_step(rec.current_step.mode)
        if self.efficiency.probe is not None:
            self.efficiency.probe.abort()  # a count still running (a step never ended)
        if rec.debug is not None:
            rec.debug.close()  # a profiler window cut short still writes its trace
        # Half the budget for resolving and emitting, the rest for the exporters.
        self.worker.stop(time.monotonic() + budget / 2)
        rec.enabled = False
        if self.settings.console != "off":
            try:
                self.worker.console.print_summary()
            except Exception:
                _log.exception("otel-train: printing the run summary failed")
        return self.telemetry.shutdown(max(0.0, deadline - time.monotonic()))


_lock = threading.RLock()
_current: Session | None = None
forked_child = False  # set in children of fork: they never record or export


def current() -> Session | None:
    return _current


def get_or_create(
    overrides: dict[str, Any] | None = None,
    tracer_provider: Any | None = None,
    meter_provider: Any | None = None,
) -> Session:
    global _current
    with _lock:
        settings = Settings.resolve(overrides or {})
        session = _current
        if session is not None and not session.closed:
            if not session.matches(
                settings if overrides else None, tracer_provider, meter_provider
            ):
                raise ConfigError(
                    "otel-train is already configured in this process with other settings or "
                    "providers; call otel_train.shutdown() before configuring it again"
                )
            return session
        _current = Session(settings, tracer_provider, meter_provider)
        return _current


def shutdown(timeout_s: float | None = None) -> bool:
    global _current
    with _lock:
        session, _current = _current, None
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
        _current = None


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(shutdown)
