"""The worker's phase series: which histogram a phase name's durations go to, and the
memory gauges of its peaks.

A series is a (phase, clock) pair, or a collective's (op, group) pair (collectives.py);
at most ``MAX_PHASE_SERIES`` distinct ones, names past it share ``OTHER_PHASE``, so a
loop that names its phases by step number cannot grow the metric set without bound.
Durations wait in each series' buffer and reach its histogram once per delivery
(``observe_many``). Called by the worker under the aggregator's lock.
"""

from __future__ import annotations

from typing import Any

from .. import contract as c
from ..recording.collectives import parse as parse_collective
from ..recording.layouts import M_ALLOCATED, M_RESERVED
from .aggregate import HistogramState, MetricsAggregator
from .blocks import StepBlock

# Distinct (phase, clock) metric series; names past it are folded into OTHER_PHASE.
MAX_PHASE_SERIES = 256
OTHER_PHASE = "_other"

A_PHASE, A_CLOCK, A_KIND = c.A_PHASE, c.A_CLOCK, c.A_KIND


class Series:
    """Where one phase name's durations go: its histogram and attributes, the name of
    its memory gauges (None: a collective's, whose memory is in its phase's peak), the
    values waiting for the histogram's next observe_many, the metric's name."""

    __slots__ = ("attrs", "histogram", "memory_name", "metric", "values")

    def __init__(
        self, histogram: HistogramState, attrs: Any, memory_name: str | None, metric: str
    ) -> None:
        self.histogram, self.attrs, self.memory_name = histogram, attrs, memory_name
        self.metric = metric
        self.values: list[float] = []


class PhaseSeries:
    """Every phase name's series, by clock (device or host)."""

    def __init__(self, aggregator: MetricsAggregator) -> None:
        self.agg = aggregator
        self.histograms: dict[tuple[Any, ...], HistogramState] = {}  # by attributes
        # Per clock (device?): phase name -> its series; names past MAX_PHASE_SERIES map
        # to the "_other" series.
        self._by_name: dict[bool, dict[str, Series]] = {False: {}, True: {}}

    def get(self, name: str, device: bool) -> Series | None:
        """A name's series if it has one (a folded name's is the "_other" series)."""
        return self._by_name[device].get(name)

    def of(self, name: str, device: bool) -> Series:
        """A name's series, made at its first use."""
        entry = self._by_name[device].get(name)
        return entry if entry is not None else self._new(name, device)

    def _new(self, name: str, device: bool) -> Series:
        """The series a phase name's durations go to. A collective's phase
        (collectives.py) feeds otel_train.collective.duration by op and group instead."""
        histograms = self.histograms
        memory_name: str | None = name
        attrs: tuple[tuple[str, str], ...]
        collective = parse_collective(name)
        if collective is not None:
            metric = c.COLLECTIVE_DURATION.name
            attrs = ((c.A_COLLECTIVE_GROUP, collective[1]), (c.A_COLLECTIVE_OP, collective[0]))
            memory_name = None
        else:
            metric, attrs = c.PHASE_DURATION.name, _phase_attrs(name, device)
        if attrs not in histograms and len(histograms) >= MAX_PHASE_SERIES:
            # bounded series: further phase names (and collectives) share "_other"
            metric, attrs, memory_name = (
                c.PHASE_DURATION.name,
                _phase_attrs(OTHER_PHASE, device),
                OTHER_PHASE,
            )
        h = histograms.get(attrs)
        if h is None:
            h = histograms[attrs] = self.agg.histogram(metric, attrs)
        entry = Series(h, attrs, memory_name, metric)
        if len(self._by_name[device]) < 4 * MAX_PHASE_SERIES:  # the map stays bounded too
            self._by_name[device][name] = entry
        return entry

    def buffer_block(
        self,
        block: StepBlock,
        touched: list[Series],
        measurements: list[tuple[str, Any, float]] | None,
    ) -> list[Series]:
        """A block's phase durations into their series' buffers, in step order; returns
        each row's series entry."""
        by_entry: dict[int, tuple[Series, list[list[float]]]] = {}
        shape, rows = block.shape, []
        for r, (name, device) in enumerate(zip(shape.names, shape.devices, strict=True)):
            entry = self.of(name, device)
            rows.append(entry)
            by_entry.setdefault(id(entry), (entry, []))[1].append(block.phase_seconds[r])
        for entry, cols in by_entry.values():
            buf = entry.values
            if not buf:
                touched.append(entry)
            if len(cols) == 1:
                buf.extend(cols[0])
            else:  # a name the step repeats (gradient accumulation): step by step
                buf.extend(v for vals in zip(*cols, strict=True) for v in vals)
            if measurements is not None:
                metric, attrs = entry.metric, entry.attrs
                measurements.extend((metric, attrs, v) for v in buf[-block.k * len(cols) :])
        return rows

    def block_memory(self, block: StepBlock, memory_names: list[str | None]) -> None:
        """Each phase's peak memory gauges (by its series' name), step by step: the last
        value stays."""
        memory = block.memory
        assert memory is not None
        for i in range(block.k):
            for r, name in enumerate(memory_names):
                m = memory[r][i]
                if m is not None and name is not None:  # (a collective's: in its phase's)
                    self.set_memory_peaks(name, m)

    def set_memory_peaks(self, name: str, m: tuple[int, ...]) -> None:
        """A phase's peak memory gauges (allocated, reserved) under its series' name."""
        agg = self.agg
        agg.set(c.PHASE_MEMORY_PEAK.name, _mem_attrs(name, "allocated"), m[M_ALLOCATED])
        agg.set(c.PHASE_MEMORY_PEAK.name, _mem_attrs(name, "reserved"), m[M_RESERVED])


def _phase_attrs(name: str, device: bool) -> tuple[tuple[str, str], ...]:
    return ((A_CLOCK, "device" if device else "host"), (A_PHASE, name))


def _mem_attrs(name: str, kind: str) -> tuple[tuple[str, str], ...]:
    return ((A_KIND, kind), (A_PHASE, name))
