"""The consumer side wired once: batches of finished steps in; metrics, console tables
and spans out.

The same wiring runs in one of two places (docs/exports.md, "Where the work runs"): the
sidecar process (otel_train/sidecar/) when otel-train configures the SDK itself, and
also for the application's own SDK providers, which the sidecar's relay serves
(sidecar/relay.py); or a thread of the training process for providers that are not the
SDK's, with ``sidecar="off"``, or when the sidecar cannot start. Every part is passed in
at construction.

A session sees either place through :class:`Consumer`, chosen once at its start
(``Session._start_consumer``): :class:`ThreadConsumer` here, or the sidecar's
(handover/consumer.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from . import contract as c
from .export.ids import id_choice
from .export.logs import logger_for
from .export.setup import Telemetry
from .identity import rank, world_size
from .processing.aggregate import MetricsAggregator
from .processing.console import ConsoleReporter
from .processing.efficiency import EfficiencyTracker
from .processing.hangs import HangWatch
from .processing.instruments import Publisher, publisher_for
from .processing.sampling import StepSampler
from .processing.source import StepSource
from .processing.spans import SpanEmitter
from .processing.worker import Worker
from .recording.device import now_offset_ns
from .settings import Settings
from .settings.verdicts import VerdictSettings

_log = logging.getLogger("otel_train")


class Consumer(Protocol):
    """Where a session's finished steps are consumed, as the session drives it; the same
    operations wherever it runs."""

    where: str  # "sidecar" or "thread": the otel_train.consumer resource attribute
    telemetry: Telemetry  # the providers, as seen from the training process
    prometheus_address: tuple[str, int] | None  # /metrics, where it is served

    @property
    def feeder(self) -> Any:
        """The sidecar's feeder, for tests and benchmarks to look into (None on a thread)."""

    @property
    def worker(self) -> Worker | None:
        """The thread's worker, for tests and benchmarks to look into (None in the sidecar)."""

    @property
    def exports_traces(self) -> bool:
        """Whether steps leave as spans."""

    @property
    def takes_carriers(self) -> bool:
        """Whether the step spans' ids are the ones carriers name (export/ids.py)."""

    def start(self) -> None:
        """Begin consuming (the sidecar has since it answered)."""

    def pump(self) -> None:
        """Hand on what finished, on the recording thread (a thread takes its own)."""

    def trace_first_from(self, index: int) -> None:
        """An instrumentation began: its first step (from ``index``) becomes a trace."""

    def note_model(self) -> None:
        """A model was added: its facts go with the next delivery."""

    def flush(self, timeout_s: float) -> bool:
        """Every step finished so far exported, within ``timeout_s``; True if in time."""

    def end(self, deadline: float, drain_until: float) -> bool:
        """Drain what resolves before ``drain_until``, then the summary and the exports'
        end by ``deadline`` (monotonic seconds); recording is off on return. False when
        it was late or dropped anything."""

    def export_drops(self) -> dict[str, int]:
        """What the exporters dropped so far, by reason."""

    def forget(self) -> None:
        """In a forked child: let go of the parent's consumer without touching it."""


@dataclass
class ConsumerParts:
    aggregator: MetricsAggregator
    publisher: Publisher | None
    worker: Worker


def build_consumer(
    settings: Settings,
    telemetry: Telemetry,
    source: Any,
    efficiency: EfficiencyTracker | None,
    version: str,
    rank: int,
    offset_ns: int,
    hangs: Any = None,
) -> ConsumerParts:
    """``source``: where batches come from (processing/source.py's interface); ``hangs``:
    the hang watch's view of the training process (hang_details.LocalHangs, or the
    sidecar's), None for no watch."""
    t = telemetry
    aggregator = MetricsAggregator()
    publisher: Publisher | None = None
    if t.meter_provider is not None:
        if t.bridge is not None:
            t.bridge.attach(aggregator)
        # (a finished session's values stay until a new session on that provider starts)
        publisher = publisher_for(t.meter_provider, aggregator, version, t.bridge is None)
    emitter = None
    if t.tracer_provider is not None and settings.trace_steps != "none":
        tracer = t.tracer_provider.get_tracer(c.SCOPE_NAME, version, schema_url=c.SCHEMA_URL)
        emitter = SpanEmitter(
            tracer,
            rank,
            offset_ns,
            ids=id_choice(tracer),
        )
    sampler = StepSampler(
        settings.trace_steps,
        settings.trace_window,
        settings.trace_window_seconds,
        settings.trace_slowest,
    )
    console = _console(settings, efficiency, rank, t.record.directory if t.record else None)
    worker = Worker(
        source,
        aggregator,
        publisher,
        emitter,
        sampler,
        console,
        export_drops=t.drop_counts if t.health is not None or t.record is not None else None,
        efficiency=efficiency,
    )
    console.notes = lambda: worker.counters.notes  # (as the last delivery said)
    if hangs is not None and settings.hang_after != "off":
        logger = logger_for(t.logger_provider, version)
        stall = efficiency.note_stall if efficiency is not None else None
        watch = HangWatch(settings.hang_after, logger, hangs.progress, hangs.ask, stall)
        worker.hangs = hangs.watch = watch
    return ConsumerParts(aggregator, publisher, worker)


class ThreadConsumer:
    """The consumer on a thread of the training process: the worker, over ``telemetry``
    (providers here); ``hangs``: the hang watch's view (hang_details.LocalHangs)."""

    where = "thread"
    feeder = None  # (no sidecar)

    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry,
        source: StepSource,
        efficiency: EfficiencyTracker,
        version: str,
        hangs: Any,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.recorder = source.recorder
        self.recorder.no_backlog_taker()  # (the worker drains it on its own)
        parts = build_consumer(settings, telemetry, source, efficiency, version, rank(),
                               now_offset_ns(), hangs=hangs)  # fmt: skip
        self.aggregator, self.publisher = parts.aggregator, parts.publisher
        self.worker: Worker = parts.worker
        self.worker.on_wake = self.recorder.watch_cuda
        self.prometheus_address = telemetry.prometheus_address

    @property
    def exports_traces(self) -> bool:
        return self.telemetry.tracer_provider is not None

    @property
    def takes_carriers(self) -> bool:
        emitter = self.worker.emitter
        return emitter is not None and emitter.ids is not None

    def start(self) -> None:
        self.worker.start()

    def pump(self) -> None:
        pass  # (the worker takes what finished on its own)

    def trace_first_from(self, index: int) -> None:
        self.worker.sampler.trace_first_from(index)

    def note_model(self) -> None:
        pass  # (the worker reads the efficiency tracker itself)

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        self.worker.process_waiting(deadline)
        return bool(self.telemetry.flush(deadline))

    def end(self, deadline: float, drain_until: float) -> bool:
        self.worker.stop(drain_until)
        self.recorder.enabled = False
        if self.settings.console != "off":
            try:
                self.worker.console.print_summary()
            except Exception:
                _log.exception("otel-train: printing the run summary failed")
        exported = self.telemetry.shutdown(max(0.0, deadline - time.monotonic()))
        return bool(exported) and not self.worker.drops()  # (False whenever it dropped)

    def export_drops(self) -> dict[str, int]:
        return self.telemetry.drop_counts()

    def forget(self) -> None:
        pass  # (a forked child has no worker thread)


def _console(
    settings: Settings, efficiency: Any, rank: int, record_dir: str | None
) -> ConsoleReporter:
    """Tables from global rank 0 alone, or from every rank with its rank in each one."""
    if not prints_console(settings, rank):
        return ConsoleReporter(settings.console_every, "off")
    several = (world_size() or 1) > 1 or rank != 0
    label = f"rank {rank}" if settings.console_ranks == "all" and several else ""
    limits = VerdictSettings.resolve()  # (checked at configure time: session.py)
    return ConsoleReporter(settings.console_every, settings.console, efficiency, label,
                           record_dir, limits)  # fmt: skip


def prints_console(settings: Settings, rank: int) -> bool:
    """Whether this rank prints tables and the summary (console_ranks)."""
    return settings.console != "off" and (settings.console_ranks == "all" or rank == 0)
