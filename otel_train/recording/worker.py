"""The worker: takes batches of finished steps from a source and feeds metrics, tables
and spans.

It wakes every ``poll_s`` and works every ``batch_s`` or once a quarter of the
recorder's bounds waits (no per-step signalling from the training thread). Its source
is a :class:`~.source.StepSource` (the recorder in this process: a thread of the
training process, when the application passes its own providers) or the sidecar's
receiving end (otel_train/sidecar/: a process of its own, when otel-train configures
the SDK). It never synchronises with the device. Its own CPU time per step is
published as ``otel_train.overhead``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import contract as c
from .aggregate import Exemplar, HistogramState, MetricsAggregator
from .blocks import StepBlock
from .console import ConsoleReporter
from .efficiency import EfficiencyTracker
from .instruments import Publisher
from .resolved import ResolvedStep
from .sampling import StepSampler
from .source import Batch, Counters, StepSource
from .spans import SpanEmitter

_log = logging.getLogger("otel_train")
# Distinct (phase, clock) metric series; names past it are folded into OTHER_PHASE.
MAX_PHASE_SERIES = 256
OTHER_PHASE = "_other"

A_PHASE, A_CLOCK, A_KIND, A_NAME, A_REASON = (
    c.A_PHASE, c.A_CLOCK, c.A_KIND, c.A_NAME, c.A_REASON,
)  # fmt: skip


class Worker:
    def __init__(
        self,
        source: StepSource | Any,
        aggregator: MetricsAggregator,
        publisher: Publisher | None,
        emitter: SpanEmitter | None,
        sampler: StepSampler,
        console: ConsoleReporter,
        throughput_window: int,
        poll_s: float = 0.05,
        batch_s: float = 0.5,
        export_drops: Callable[[], dict[str, int]] | None = None,
        efficiency: EfficiencyTracker | None = None,
    ) -> None:
        self.efficiency = efficiency
        self._export_drops = export_drops
        self.source = source  # source.StepSource here, or the sidecar's in its process
        self.counters = Counters()
        self.agg = aggregator
        self.publisher = publisher
        self.emitter = emitter
        self.sampler = sampler
        self.console = console
        self.poll_s = poll_s
        self.batch_s = batch_s
        self._throughput: collections.deque[tuple[int, int, int]] = collections.deque(
            maxlen=throughput_window
        )
        self._tp_samples = 0
        self._tp_tokens = 0
        self._phase_hist: dict[tuple[str, bool], HistogramState] = {}  # (phase, device?)
        # Per clock (device?): phase name -> (histogram, attributes, series name); names
        # past MAX_PHASE_SERIES map to the "_other" series.
        self._series: dict[bool, dict[str, list[Any]]] = {
            False: {},
            True: {},
        }
        self._step_hist = aggregator.histogram(c.STEP_DURATION.name, ())
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one process() at a time (worker vs. shutdown drain)
        self._thread: threading.Thread | None = None
        self._cpu_ns = 0
        self._cpu_steps = 0
        self._device_total_set = False
        self.steps_processed = 0
        self.failed = False
        # Counters start at zero so their series exist (and rate() works) before any drop.
        dropped = aggregator.values.setdefault(c.DROPPED.name, {})
        dropped[((A_REASON, "queue_full"),)] = 0.0
        for reason in export_drops() if export_drops is not None else ():
            dropped[((A_REASON, reason),)] = 0.0

    # -- thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otel-train-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Wake often, work seldom: a batch of many steps costs far less per step than a
        # few (the worker's code and data are cold after the training thread ran), so it
        # processes every ``batch_s``, or sooner when the backlog grows.
        last = time.monotonic()
        source = self.source
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            if now - last >= self.batch_s or source.backlog_due():
                last = now
                self.process()

    def stop(self, deadline: float) -> None:
        """Drain what resolves before ``deadline`` (monotonic seconds), then stop."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        while True:
            self.process()
            if not self.source.has_work() or time.monotonic() >= deadline or self.failed:
                break
            time.sleep(0.005)
        if not self.failed:
            self._emit(self.sampler.close_window())
            if self.console.every:
                self.console.print_window()

    # -- processing --------------------------------------------------------------------

    def process(self) -> int:
        if self.failed:
            return 0
        with self._lock:
            t0 = time.thread_time_ns()
            try:
                parts = self._take().parts
                n = self._update_metrics(parts)
            except Exception:
                self.failed = True
                self.source.disable()
                _log.exception("otel-train: internal error in the worker; telemetry disabled")
                return 0
            try:
                for part in parts:
                    if isinstance(part, StepBlock):
                        self.console.add_block(part)
                    else:
                        self.console.add_many(part)
            except Exception:  # (a closed stdout, say): the tables stop, the rest goes on
                self.console = ConsoleReporter(0, "off")
                _log.exception("otel-train: printing the console table failed; it is off")
            sampler = self.sampler
            offer = sampler.offer
            for part in parts:
                if isinstance(part, StepBlock):
                    self._emit(sampler.offer_block(part))
                    continue
                for step in part:
                    self._emit(offer(step))
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

    def _take(self) -> Batch:
        """Finished steps in order (source.py); their loose scalars go out at once."""
        batch = self.source.take(self.sampler.takes_blocks())
        self.counters = batch.counters
        if batch.scalars:
            with self.agg.lock:
                for name, v in batch.scalars:
                    self.agg.set(c.SCALAR.name, ((A_NAME, name),), v)
            for name, v in batch.scalars:
                self.console.last_scalars[name] = v
        return batch

    def _update_metrics(self, parts: list[list[ResolvedStep] | StepBlock]) -> int:
        """Metrics of a batch's steps; returns how many steps it held. A block the
        efficiency tracker cannot take whole is replaced in ``parts`` by its steps."""
        counters = self.counters
        agg = self.agg
        api = self.publisher is not None and bool(self.publisher.histograms)
        records: list[tuple[str, Any, float]] = []
        host_series, dev_series = self._series[False], self._series[True]
        n = 0
        with agg.lock:
            agg.set(c.PENDING_STEPS.name, (), float(counters.pending))
            dropped = agg.values.setdefault(c.DROPPED.name, {})
            for reason, count in (
                ("queue_full", counters.dropped_steps),
                ("late_phase", counters.dropped_phases),
                ("scalar_names", counters.dropped_scalars),
                ("sidecar", counters.dropped_handover),
                *(self._export_drops().items() if self._export_drops is not None else ()),
            ):
                if count:
                    dropped[((A_REASON, reason),)] = float(count)
            if self.emitter is not None:
                agg.values.setdefault(c.SPANS_EMITTED.name, {})[()] = float(self.emitter.emitted)
            total_bytes = counters.memory_total or 0
            if total_bytes and not self._device_total_set:
                self._device_total_set = True
                total = total_bytes
                agg.set(c.DEVICE_MEMORY_LIMIT.name, (), float(total))
                self.console.device_total = total
                if self.emitter is not None:
                    self.emitter.device_total = total
            if self.efficiency is not None:
                self._observe_efficiency(None, "begin")  # regions first: they ended earlier
            # Per step, values are only collected; histograms take them once per batch
            # (observe_many), counters once per batch.
            step_values: list[float] = []
            touched: list[list[Any]] = []  # series entries whose buffer holds values
            samples_total = tokens_total = 0
            any_samples = any_tokens = False
            window = self._throughput
            maxlen = window.maxlen
            tp_samples, tp_tokens = self._tp_samples, self._tp_tokens
            last: ResolvedStep | None = None
            for idx, part in enumerate(parts):
                if isinstance(part, StepBlock):
                    block: StepBlock = part
                    if self.efficiency is not None and not self._observe_block(block):
                        part = parts[idx] = block.steps()  # observed one by one below
                    else:
                        n += block.k
                        step_values.extend(block.seconds)
                        if api:
                            records.extend((c.STEP_DURATION.name, (), v) for v in block.seconds)
                        self._block_phases(block, host_series, touched, records if api else None)
                        if block.scalars is not None:
                            for items in block.scalars:
                                for name, v in items:
                                    agg.set(c.SCALAR.name, ((A_NAME, name),), v)
                        s_known, s_sum, s_col = _counted(block.samples)
                        t_known, t_sum, t_col = _counted(block.tokens)
                        any_samples = any_samples or s_known
                        any_tokens = any_tokens or t_known
                        samples_total += s_sum
                        tokens_total += t_sum
                        # Throughput's running sums, recounted when steps leave the window.
                        full = maxlen is not None and len(window) + block.k > maxlen
                        window.extend(zip(block.ends, s_col, t_col, strict=True))
                        if full:
                            tp_samples = sum(w[1] for w in window)
                            tp_tokens = sum(w[2] for w in window)
                        else:
                            tp_samples += sum(s_col)
                            tp_tokens += sum(t_col)
                        last = None
                        continue
                n += len(part)
                for step in part:
                    host_s = step.host_seconds
                    step_values.append(host_s)
                    if api:
                        records.append((c.STEP_DURATION.name, (), host_s))
                    samples, tokens = step.samples, step.tokens
                    if samples is None:
                        samples = 0
                    else:
                        any_samples = True
                        samples_total += samples
                    if tokens is None:
                        tokens = 0
                    else:
                        any_tokens = True
                        tokens_total += tokens
                    for row in step.rows:
                        name, memory = row[2], row[7]
                        entry = (dev_series if row[5] is not None else host_series).get(name)
                        if entry is None:
                            entry = self._phase_series(name, row[5] is not None)
                        buf = entry[3]
                        if not buf:
                            touched.append(entry)
                        buf.append(row[9])
                        if api:
                            records.append((c.PHASE_DURATION.name, entry[1], row[9]))
                        if memory is not None:
                            name = entry[2]
                            agg.set(c.PHASE_MEMORY_PEAK.name, _mem_attrs(name, "allocated"),
                                    memory[0])  # fmt: skip
                            agg.set(c.PHASE_MEMORY_PEAK.name, _mem_attrs(name, "reserved"),
                                    memory[1])  # fmt: skip
                            if total_bytes:
                                agg.set(
                                    c.PHASE_MEMORY_UTILIZATION.name,
                                    ((A_PHASE, name),),
                                    memory[1] / total_bytes,
                                )
                    for name, v in step.scalars:
                        agg.set(c.SCALAR.name, ((A_NAME, name),), v)
                    # Throughput over the last ``throughput_window`` steps (running sums).
                    if len(window) == maxlen:
                        old = window[0]
                        tp_samples -= old[1]
                        tp_tokens -= old[2]
                    window.append((step.host_end, samples, tokens))
                    tp_samples += samples
                    tp_tokens += tokens
                    if self.efficiency is not None:
                        self._observe_efficiency(step)
                    last = step
            self._tp_samples, self._tp_tokens = tp_samples, tp_tokens
            self._step_hist.observe_many(step_values)
            for entry in touched:
                entry[0].observe_many(entry[3])
                entry[3].clear()
            self.steps_processed += n
            if n:
                agg.add(c.STEPS.name, (), n)
                if any_samples:
                    agg.add(c.SAMPLES.name, (), samples_total)
                if any_tokens:
                    agg.add(c.TOKENS.name, (), tokens_total)
                # Gauges are read at collection time: the batch's last value will do.
                if last is None:
                    block = parts[-1]  # type: ignore[assignment]
                    last = block.step(block.k - 1)
                self._publish_throughput(last)
                if self.efficiency is not None:
                    self._observe_efficiency(None, "end")  # goodput, once per batch
        if api:
            assert self.publisher is not None
            for name, attrs, value in records:
                self.publisher.record(name, attrs, value)
        return n

    def _block_phases(
        self,
        block: StepBlock,
        host_series: dict[str, list[Any]],
        touched: list[list[Any]],
        records: list[tuple[str, Any, float]] | None,
    ) -> None:
        """A block's phase durations into their series' buffers, in step order."""
        by_entry: dict[int, tuple[list[Any], list[list[float]]]] = {}
        for r, row in enumerate(block.template.rows):
            entry = host_series.get(row[2])
            if entry is None:
                entry = self._phase_series(row[2], False)
            by_entry.setdefault(id(entry), (entry, []))[1].append(block.phase_seconds[r])
        for entry, cols in by_entry.values():
            buf = entry[3]
            if not buf:
                touched.append(entry)
            if len(cols) == 1:
                buf.extend(cols[0])
            else:  # a name the step repeats (gradient accumulation): step by step
                buf.extend(v for vals in zip(*cols, strict=True) for v in vals)
            if records is not None:
                attrs = entry[1]
                records.extend(
                    (c.PHASE_DURATION.name, attrs, v) for v in buf[-block.k * len(cols) :]
                )

    def _observe_block(self, block: StepBlock) -> bool:
        """The efficiency tracker takes a whole block (False: observe its steps)."""
        assert self.efficiency is not None
        try:
            return self.efficiency.observe_block(block, self.agg)
        except Exception:
            self._efficiency_failed()
            return True

    def _phase_series(self, name: str, device: bool) -> list[Any]:
        """[histogram, attributes, series name, values waiting for the histogram]."""
        phase_hist = self._phase_hist
        series = name
        if (name, device) not in phase_hist and len(phase_hist) >= MAX_PHASE_SERIES:
            series = OTHER_PHASE  # bounded series: further phase names share "_other"
        attrs = _phase_attrs(series, device)
        h = phase_hist.get((series, device))
        if h is None:
            h = phase_hist[(series, device)] = self.agg.histogram(c.PHASE_DURATION.name, attrs)
        entry: list[Any] = [h, attrs, series, []]
        if len(self._series[device]) < 4 * MAX_PHASE_SERIES:  # the map stays bounded too
            self._series[device][name] = entry
        return entry

    def _observe_efficiency(self, step: ResolvedStep | None, when: str = "") -> None:
        """MFU, data stall and goodput (efficiency.py); a failure disables only them."""
        assert self.efficiency is not None
        try:
            if step is not None:
                step.efficiency = self.efficiency.observe(step, self.agg)
            elif when == "begin":
                self.efficiency.drain_regions(self.agg)
            else:
                self.efficiency.publish_goodput(self.agg)
        except Exception:
            self._efficiency_failed()

    def _efficiency_failed(self) -> None:
        """Called from an except block: the figures are disabled, the rest goes on."""
        self.efficiency = self.console.efficiency = None
        _log.exception("otel-train: computing efficiency figures failed; they are disabled")

    def _publish_throughput(self, step: ResolvedStep) -> None:
        """Samples and tokens per second over the last ``throughput_window`` steps.

        Rate over the window = what the steps after the oldest one processed, divided by
        the time from the oldest step's end to the newest step's end (running sums).
        """
        window = self._throughput
        if len(window) >= 2:
            span_s = (window[-1][0] - window[0][0]) / 1e9
            samples = self._tp_samples - window[0][1]
            tokens = self._tp_tokens - window[0][2]
        else:
            span_s = step.host_seconds
            samples, tokens = step.samples or 0, step.tokens or 0
        if span_s <= 0:
            return
        if step.samples is not None:
            self.agg.set(c.THROUGHPUT_SAMPLES.name, (), samples / span_s)
        if step.tokens is not None:
            self.agg.set(c.THROUGHPUT_TOKENS.name, (), tokens / span_s)

    # -- spans -------------------------------------------------------------------------

    def _emit(self, steps: list[ResolvedStep]) -> None:
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
            when = step.host_end + emitter.offset_ns
            with self.agg.lock:
                self._step_hist.attach_exemplar(
                    Exemplar(step.host_seconds, when, trace_id, span_id)
                )
                for row in step.rows:
                    entry = self._series[row[5] is not None].get(row[2])
                    if entry is not None:  # folded names map to the "_other" series
                        entry[0].attach_exemplar(Exemplar(row[9], when, trace_id, span_id))
        # Spans are emitted after the batch's metrics were updated: publish the count now,
        # or the last batch (and the shutdown drain) would never be counted.
        with self.agg.lock:
            self.agg.values.setdefault(c.SPANS_EMITTED.name, {})[()] = float(emitter.emitted)


def _counted(column: list[int | None]) -> tuple[bool, int, list[int]]:
    """A block's samples or tokens: (any known, their sum, the column with None as 0)."""
    known = [v for v in column if v is not None]
    if not known:
        return False, 0, [0] * len(column)
    return True, sum(known), [v or 0 for v in column]


def _phase_attrs(name: str, device: bool) -> tuple[tuple[str, str], ...]:
    return ((A_CLOCK, "device" if device else "host"), (A_PHASE, name))


def _mem_attrs(name: str, kind: str) -> tuple[tuple[str, str], ...]:
    return ((A_KIND, kind), (A_PHASE, name))
