"""The consumer side wired once: batches of finished steps in; metrics, console tables
and spans out.

The same wiring runs in one of two places (docs/exports.md, "Where the work runs"): the
sidecar process (otel_train/sidecar/) when otel-train configures the SDK itself, and
also for the application's own SDK providers, which the sidecar's relay serves
(sidecar/relay.py); or a thread of the training process for providers that are not the
SDK's, with ``sidecar="off"``, or when the sidecar cannot start. Every part is passed in
at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from . import contract as c
from .export.ids import id_choice
from .export.logs import logger_for
from .export.setup import Telemetry
from .identity import world_size
from .processing.aggregate import MetricsAggregator
from .processing.console import ConsoleReporter
from .processing.efficiency import EfficiencyTracker
from .processing.hangs import HangWatch
from .processing.instruments import Publisher
from .processing.sampling import StepSampler
from .processing.spans import SpanEmitter
from .processing.worker import Worker
from .settings import Settings
from .settings.verdicts import VerdictSettings

_PUBLISHERS: WeakKeyDictionary[Any, Publisher] = WeakKeyDictionary()


@dataclass
class Consumer:
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
) -> Consumer:
    """``source``: where batches come from (processing/source.py's interface); ``hangs``:
    the hang watch's view of the training process (hang_details.LocalHangs, or the
    sidecar's), None for no watch."""
    t = telemetry
    aggregator = MetricsAggregator()
    publisher: Publisher | None = None
    if t.meter_provider is not None:
        if t.bridge is not None:
            t.bridge.attach(aggregator)
        meter = t.meter_provider.get_meter(c.SCOPE_NAME, version, schema_url=c.SCHEMA_URL)
        publisher = Publisher(meter, aggregator, histograms_via_api=t.bridge is None)
        # Instruments cannot be removed from a provider: a finished session's keep
        # reporting their final values until a new session on that provider starts.
        previous = _PUBLISHERS.get(t.meter_provider)
        if previous is not None:
            previous.closed = True
        _PUBLISHERS[t.meter_provider] = publisher
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
    return Consumer(aggregator, publisher, worker)


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
