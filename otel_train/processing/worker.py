"""The worker: takes deliveries of finished steps from a source and feeds metrics, tables
and spans.

It wakes every ``poll_s`` and works every ``period_s`` or once a quarter of the
recorder's bounds waits (no per-step signalling from the training thread); the hang
watch ticks every ``HANG_TICK_S`` (each wake runs on cold caches: ~25 us of CPU for the
backlog's look, ~40 more with the watch, measured in the sidecar). Its source
is the sidecar's receiving end (otel_train/sidecar/: a process of its own, when
otel-train configures the SDK and when the application's own SDK providers are served
by its relay) or a :class:`~.source.StepSource` (the recorder in this process: a thread
of the training process, for providers that are not the SDK's, ``sidecar="off"``, or a
sidecar that could not start). It never synchronises with the device. Its own CPU time per step is
published as ``otel_train.overhead``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import contract as c
from ..recording.layouts import P_EV0, P_MEMORY, P_NAME, P_SECONDS, P_T1, Step
from ..recording.tokens import observe_staleness
from .aggregate import Exemplar, MetricsAggregator
from .blocks import StepBlock
from .console import ConsoleReporter
from .efficiency import EfficiencyTracker
from .instruments import Publisher
from .phase_series import PhaseSeries, Series
from .sampling import StepSampler
from .source import Counters, Delivery, StepSource
from .spans import SpanEmitter

_log = logging.getLogger("otel_train")
HANG_TICK_S = 0.25  # the hang watch's tick: its record's latency, its gauges' age
MAX_BLOCKS = 64  # blocks processed at a time (a block: steps of one shape)
SHED_S = 0.25  # past the drain deadline: how long taking and counting what is left may go on
A_NAME, A_REASON = c.A_NAME, c.A_REASON


class Worker:
    def __init__(
        self,
        source: StepSource | Any,
        aggregator: MetricsAggregator,
        publisher: Publisher | None,
        emitter: SpanEmitter | None,
        sampler: StepSampler,
        console: ConsoleReporter,
        poll_s: float = 0.05,
        period_s: float = 0.5,
        export_drops: Callable[[], dict[str, int]] | None = None,
        efficiency: EfficiencyTracker | None = None,
    ) -> None:
        self.efficiency = efficiency
        self.export_drops = export_drops
        self.source = source  # source.StepSource here, or the sidecar's in its process
        self.counters = Counters()
        self.agg = aggregator
        self.publisher = publisher
        self.emitter = emitter
        self.sampler = sampler
        self.console = console
        self.poll_s = poll_s
        self.period_s = period_s
        self.phases = PhaseSeries(aggregator)  # each phase name's histogram and gauges
        self._step_hist = aggregator.histogram(c.STEP_DURATION.name, ())
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one process() at a time (worker vs. shutdown drain)
        self._thread: threading.Thread | None = None
        self._cpu_ns = 0
        self._cpu_steps = 0
        self._device_total = 0  # bytes, once the recorder knows the device's memory
        self.steps_processed = 0
        # Set at the end once the time to drain has passed: steps taken are only counted
        # (dropped{reason="shutdown"}), so that the summary and the flush meet the deadline.
        self.shedding = False
        self.shed_at = float("inf")  # (monotonic seconds: stop() sets it, the thread reads it)
        self.shed_steps = 0
        self._rest: list[Any] = []  # a large delivery's blocks not processed yet
        self.failed = False
        self.hangs: Any = None  # the hang watch (hangs.HangWatch), ticked every wake
        # Called every wake: in the training process, the recorder's CUDA watch
        # (Recorder.watch_cuda: the hooks stop logging once CUDA is in use).
        self.on_wake: Callable[[], None] | None = None
        # A drop reason's counter series starts with its first drop (fewer series per
        # rank: docs/scale.md); a run that drops nothing sends none.

    # -- thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otel-train-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Wake often, work seldom: a delivery of many steps costs far less per step than a
        # few (the worker's code and data are cold after the training thread ran), so it
        # processes every ``period_s``, or sooner when the backlog grows.
        last = watched = time.monotonic()
        source = self.source
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            if self.on_wake is not None:
                self.on_wake()
            if now - last >= self.period_s or source.backlog_due() or self._rest:
                last = now
                self.process()
            if self.hangs is not None and now - watched >= HANG_TICK_S:
                watched = now
                self._watch_hangs()

    def _watch_hangs(self) -> None:
        """The hang watch's tick (hangs.py) and its gauges: they are read at each export,
        so they keep rising while the training thread is stuck."""
        watch = self.hangs
        try:
            watch.tick(time.perf_counter_ns(), self.steps_processed > 0)
            with self.agg.lock:
                self.agg.set(c.PROGRESS_AGE.name, (), watch.age)
                self.agg.set(c.PROGRESS_LIMIT.name, (), watch.limit)
                self.agg.set(c.COLLECTIVE_WAITING.name, (), 1.0 if watch.waiting else 0.0)
        except Exception:
            self.hangs = None
            _log.exception("otel-train: the hang watch failed; it is off")

    def stop(self, deadline: float, shed_until: float | None = None) -> None:
        """Drain what resolves before ``deadline`` (monotonic seconds), then count what
        is left as dropped until ``shed_until`` (default SHED_S later), then stop."""
        self._stop.set()
        self.shed_at = deadline  # (a delivery the thread is on now: counted past it)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if self.hangs is not None:
            self._watch_hangs()  # (a stall that just ended: its resolved record, its time)
        while True:
            self.process()
            if not self.has_work() or self.failed:
                break
            if time.monotonic() >= deadline:
                if self.shedding:
                    break  # (what is left after that: the source's own bound counts it)
                self.shedding = True  # the rest is counted as dropped, not processed
                deadline = time.monotonic() + SHED_S if shed_until is None else shed_until
            elif not self._rest:
                time.sleep(0.005)
        if not self.failed:
            self._emit(self.sampler.close_window())
            if self.console.every:
                self.console.print_window()
        self.console.drops = self.drops()  # (the summary says what its figures miss)

    # -- processing --------------------------------------------------------------------

    def process_waiting(self, deadline: float) -> None:
        """Every step waiting now, by ``deadline`` (monotonic seconds): a flush.
        process() takes at most MAX_BLOCKS blocks, and a delivery's rest before the
        source: this goes on until the rest is done and the source was taken once."""
        taken = False
        while not self.failed and time.monotonic() < deadline:
            if not self._rest:
                if taken:
                    return
                taken = True
            self.process()

    def process(self) -> int:
        if self.failed:
            return 0
        with self._lock:
            t0 = time.thread_time_ns()
            try:
                delivery = self._take()
                blocks: list[StepBlock] = delivery.parts
                n = self._update_metrics(blocks)
                observe_staleness(blocks, self.agg, self.publisher)  # (RL: tokens.py)
                if delivery.remote:
                    self._remote_metrics(delivery.remote)
            except Exception:
                self.failed = True
                self.source.disable()
                _log.exception("otel-train: internal error in the worker; telemetry disabled")
                return 0
            try:
                for block in blocks:
                    self.console.add(block)
            except Exception:  # (a closed stdout, say): the tables stop, the rest goes on
                self.console = ConsoleReporter(0, "off")
                _log.exception("otel-train: printing the console table failed; it is off")
            if delivery.scalars:
                self._loose_scalars(delivery.scalars)
            sampler = self.sampler
            for block in blocks:
                self._emit(sampler.offer(block))
            if delivery.remote:
                self._emit_remote(delivery.remote)
            if not n and sampler.mode == "sampled":
                self._emit(sampler.close_if_idle(time.perf_counter_ns()))
            spent = time.thread_time_ns() - t0
            if n:
                self._cpu_ns += spent
                self._cpu_steps += n
                per_step = self._cpu_ns / self._cpu_steps / 1e9
                with self.agg.lock:
                    self.agg.set(c.OVERHEAD.name, (), per_step)
            return n

    def _take(self) -> Delivery:
        """Finished steps in order (source.py), and the scalars recorded outside them,
        at most MAX_BLOCKS blocks at a time (the rest waits here for the next call: a
        backlog of steps of many shapes is one block each); past the drain time at the
        end (``shedding``), counted as dropped instead."""
        if self._rest:
            delivery = Delivery(parts=self._rest[:MAX_BLOCKS], counters=self.counters)
            del self._rest[:MAX_BLOCKS]
        else:
            delivery = self.source.take()
            self.counters = delivery.counters
            if len(delivery.parts) > MAX_BLOCKS:
                self._rest = delivery.parts[MAX_BLOCKS:]
                del delivery.parts[MAX_BLOCKS:]
        if self.shedding or time.monotonic() >= self.shed_at:
            self.shedding = True
            self.shed_steps += delivery.step_count()
            return Delivery(counters=delivery.counters)
        return delivery

    def has_work(self) -> bool:
        """Whether steps wait: here (a delivery's rest) or in the source."""
        return bool(self._rest) or self.source.has_work()

    def _loose_scalars(self, scalars: list[tuple[str, float]]) -> None:
        """Scalars recorded outside steps, set after the delivery's steps' own: a value the
        user records between steps (a trainer's logged loss, say) stands over a step's
        earlier one of the same name taken in the same delivery."""
        with self.agg.lock:
            for name, v in scalars:
                self.agg.set(c.SCALAR.name, ((A_NAME, name),), v)
        for name, v in scalars:
            self.console.last_scalars[name] = v

    def _update_metrics(self, blocks: list[StepBlock]) -> int:
        """Metrics of a delivery's steps; returns how many steps it held. Per step, values
        are only collected; histograms take them once per delivery (observe_many), counters
        once per delivery."""
        agg = self.agg
        api = self.publisher is not None and bool(self.publisher.histograms)
        measurements: list[tuple[str, Any, float]] | None = [] if api else None
        step_values: list[float] = []
        touched: list[Series] = []  # series whose buffer holds values
        n = 0
        with agg.lock:
            self._publish_counters()
            if self.efficiency is not None:
                self._observe_efficiency(None, "begin")  # regions first: they ended earlier
            counts = _Counts()
            for block in blocks:
                n += block.k
                if self.efficiency is not None:
                    self._observe_efficiency(block)
                step_values.extend(block.seconds)
                if measurements is not None:
                    measurements.extend((c.STEP_DURATION.name, (), v) for v in block.seconds)
                entries = self.phases.buffer_block(block, touched, measurements)
                if block.memory is not None:
                    self.phases.block_memory(block, [e.memory_name for e in entries])
                if block.scalars is not None:
                    for items in block.scalars:
                        for name, v in items:
                            agg.set(c.SCALAR.name, ((A_NAME, name),), v)
                self._block_counts(block, counts)
            self._step_hist.observe_many(step_values)
            for entry in touched:
                entry.histogram.observe_many(entry.values)
                entry.values.clear()
            self.steps_processed += n
            if n:
                agg.add(c.STEPS.name, (), n)
                if counts.any_samples:
                    agg.add(c.SAMPLES.name, (), counts.samples)
                if counts.any_tokens:
                    agg.add(c.TOKENS.name, (), counts.tokens)
                if self.efficiency is not None:
                    self._observe_efficiency(None, "end")  # goodput, once per delivery
        if measurements:
            assert self.publisher is not None
            for name, attrs, value in measurements:
                self.publisher.record(name, attrs, value)
        return n

    def drops(self) -> dict[str, int]:
        """What was dropped so far, by reason (contract A_REASON), the nonzero ones."""
        counters = self.counters
        reasons = (
            ("queue_full", counters.dropped_steps),
            ("late_phase", counters.dropped_phases),
            ("scalar_names", counters.dropped_scalars),
            ("sidecar", counters.dropped_handover),
            ("shutdown", self.shed_steps + self.source.shed_steps),
            *(self.export_drops().items() if self.export_drops is not None else ()),
        )
        return {reason: int(count) for reason, count in reasons if count}

    def _publish_counters(self) -> None:
        """The recorder's and the exporters' counters, the device's memory limit."""
        counters, agg = self.counters, self.agg
        agg.set(c.PENDING_STEPS.name, (), float(counters.pending))
        dropped = agg.values.setdefault(c.DROPPED.name, {})
        for reason, count in self.drops().items():
            dropped[((A_REASON, reason),)] = float(count)
        if self.emitter is not None:
            agg.values.setdefault(c.SPANS_EMITTED.name, {})[()] = float(self.emitter.emitted)
        total = counters.memory_total or 0
        if total and not self._device_total:
            self._device_total = total
            device = counters.device_id or "cuda"
            agg.set(c.DEVICE_MEMORY_LIMIT.name, ((c.A_HW_ID, device),), float(total))
            self.console.device_total = total
            if self.emitter is not None:
                self.emitter.device_total = total

    def _block_counts(self, block: StepBlock, counts: _Counts) -> None:
        """Samples and tokens: the delivery's totals (their rates are throughput, computed
        in PromQL: contract.DERIVED)."""
        s_known, s_sum = _counted(block.samples)
        t_known, t_sum = _counted(block.tokens)
        counts.any_samples = counts.any_samples or s_known
        counts.any_tokens = counts.any_tokens or t_known
        counts.samples += s_sum
        counts.tokens += t_sum

    def _observe_efficiency(self, block: StepBlock | None, when: str = "") -> None:
        """MFU, data stall and goodput (efficiency.py); a failure disables only them."""
        assert self.efficiency is not None
        try:
            if block is not None:
                self.efficiency.observe(block)
            elif when == "begin":
                self.efficiency.drain_regions(self.agg)
            else:
                self.efficiency.publish_goodput(self.agg)
        except Exception:
            self._efficiency_failed()

    def _efficiency_failed(self) -> None:
        """Called from an except block: the figures are disabled, the rest goes on."""
        if self.efficiency is not None:
            self.efficiency.disable()  # (the console reads the tracker too)
        self.efficiency = None
        _log.exception("otel-train: computing efficiency figures failed; they are disabled")

    def _remote_metrics(self, trees: list[Step]) -> None:
        """Remote phases (links.py) feed the phase metrics like any phase; they are in
        no step here, so no step figure sees them."""
        publisher = self.publisher
        api = publisher is not None and bool(publisher.histograms)
        with self.agg.lock:
            for tree in trees:
                for row in tree.phases:
                    device = row[P_EV0] is not None
                    entry = self.phases.of(row[P_NAME], device)
                    entry.histogram.observe(row[P_SECONDS])
                    if api:
                        assert publisher is not None
                        publisher.record(entry.metric, entry.attrs, row[P_SECONDS])
                    m, name = row[P_MEMORY], entry.memory_name
                    if m is not None and name is not None:
                        self.phases.set_memory_peaks(name, m)

    # -- spans -------------------------------------------------------------------------

    def _emit_remote(self, trees: list[Step]) -> None:
        """Remote phases' spans, for those whose carrier was sampled (links.py)."""
        emitter = self.emitter
        if emitter is None:
            return
        for tree in trees:
            try:
                ids = emitter.emit_remote(tree)
            except Exception:
                self.emitter = None
                _log.exception("otel-train: emitting spans failed; spans disabled")
                return
            if ids is not None:
                row = tree.phases[0]
                entry = self.phases.get(row[P_NAME], row[P_EV0] is not None)
                if entry is not None:
                    with self.agg.lock:
                        entry.histogram.attach_exemplar(
                            Exemplar(row[P_SECONDS], row[P_T1] + emitter.offset_ns, *ids)
                        )
        with self.agg.lock:
            self.agg.values.setdefault(c.SPANS_EMITTED.name, {})[()] = float(emitter.emitted)

    def _emit(self, steps: list[Step]) -> None:
        emitter = self.emitter
        if emitter is None or not steps:
            return
        for step in steps:
            try:
                ids = emitter.emit(step)
            except Exception:
                self.emitter = None
                _log.exception("otel-train: emitting spans failed; spans disabled")
                return
            if ids is None:
                continue
            trace_id, span_id = ids
            when = step.t1 + emitter.offset_ns
            with self.agg.lock:
                self._step_hist.attach_exemplar(
                    Exemplar(step.host_seconds, when, trace_id, span_id)
                )
                for row in step.phases:
                    entry = self.phases.get(row[P_NAME], row[P_EV0] is not None)
                    if entry is not None:  # folded names map to the "_other" series
                        entry.histogram.attach_exemplar(
                            Exemplar(row[P_SECONDS], when, trace_id, span_id)
                        )
        # Spans are emitted after the delivery's metrics were updated: publish the count now,
        # or the last delivery (and the shutdown drain) would never be counted.
        with self.agg.lock:
            self.agg.values.setdefault(c.SPANS_EMITTED.name, {})[()] = float(emitter.emitted)


class _Counts:
    """A delivery's samples and tokens: whether any step knew them, and their sums."""

    __slots__ = ("any_samples", "any_tokens", "samples", "tokens")

    def __init__(self) -> None:
        self.any_samples = self.any_tokens = False
        self.samples = self.tokens = 0


def _counted(column: list[int | None]) -> tuple[bool, int]:
    """A block's samples or tokens: (any known, their sum)."""
    known = [v for v in column if v is not None]
    return bool(known), sum(known)
