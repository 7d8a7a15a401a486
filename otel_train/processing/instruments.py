"""OTel API instruments, created once, fed from the aggregator.

Counters and gauges are observable instruments: the SDK calls back at collection
time, so they cost nothing per step. Histograms have no observable form in the API:
with a meter provider otel-train built, the export bridge adds them from the
aggregator's snapshot; with a provider the application built, :class:`Publisher`
records them through ``Histogram.record`` on the worker thread (about 5 us each).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import resource
import sys
from collections.abc import Callable, Iterable
from math import isfinite
from typing import Any
from weakref import WeakKeyDictionary

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from .. import contract as c
from .aggregate import Attrs, MetricsAggregator

_log = logging.getLogger("otel_train")
_PUBLISHERS: WeakKeyDictionary[Any, Publisher] = WeakKeyDictionary()

_PAGE = 4096
with contextlib.suppress(ValueError, OSError, AttributeError):
    _PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int | None:
    """This process's resident set size (Linux /proc), None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _host_total_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * _PAGE
    except (ValueError, OSError, AttributeError):
        return None


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessMemory:
    """A process's resident set size and its peak, in bytes (None: unknown)."""

    rss_bytes: int | None = None
    peak_rss_bytes: int | None = None


def own_memory() -> ProcessMemory:
    """This process's memory figures (a read of /proc and a getrusage: about 10 us).
    The kernel's peak can trail the current size by a few pages: it is at least that."""
    rss = rss_bytes()
    return ProcessMemory(rss, max(_peak_rss_bytes(), rss or 0))


class Publisher:
    def __init__(
        self, meter: metrics.Meter, aggregator: MetricsAggregator, histograms_via_api: bool
    ) -> None:
        self._meter = meter
        self._failed: set[str] = set()
        # Whose memory the process metrics report: the training process's. In the
        # sidecar, another process, its figures as the training process last sent them.
        self.memory: Callable[[], ProcessMemory] = own_memory
        self.histograms: dict[str, Any] = {}
        self.attach(aggregator, histograms_via_api)
        for spec in c.METRICS:
            if spec.instrument != "histogram":
                create = {
                    "counter": meter.create_observable_counter,
                    "updowncounter": meter.create_observable_up_down_counter,
                    "gauge": meter.create_observable_gauge,
                }[spec.instrument]
                create(
                    spec.name, [self._callback_for(spec)], unit=spec.unit,
                    description=spec.description,
                )  # fmt: skip
        for old, new in c.DEPRECATED_METRICS:  # (one release: contract/schema.py)
            meter.create_observable_gauge(
                old.name, [_without_attributes(self._callback_for(new))], unit=old.unit,
                description=old.description,
            )  # fmt: skip

    def _callback_for(
        self, spec: c.MetricSpec
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        if spec is c.PROCESS_MEMORY_RSS:
            return self._guard(spec.name, lambda: _known(self.memory().rss_bytes))
        if spec is c.HOST_MEMORY_TOTAL:
            return self._guard(spec.name, lambda: _known(_host_total_bytes()))
        if spec is c.PROCESS_MEMORY_PEAK_RSS:
            return self._guard(spec.name, lambda: _known(self.memory().peak_rss_bytes))
        return self._reader(spec.name)

    def attach(self, aggregator: MetricsAggregator, histograms_via_api: bool) -> None:
        """Read ``aggregator`` from now on (the session that now owns the provider), its
        histograms recorded through the metrics API or not (the bridge adds them)."""
        self._agg = aggregator
        self.histograms = {
            spec.name: _histogram(self._meter, spec)
            for spec in c.METRICS
            if spec.instrument == "histogram" and histograms_via_api
        }

    def _reader(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        # The SDK drops non-finite values with a warning at every collection (a NaN loss
        # would log forever): leave them out here; the console table still shows them.
        return self._guard(
            name,
            lambda: [Observation(v, dict(a)) for a, v in self._agg.read(name) if isfinite(v)],
        )

    def _guard(
        self, name: str, produce: Callable[[], list[Observation]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            try:
                return produce()
            except Exception:
                if name not in self._failed:
                    self._failed.add(name)
                    _log.exception("otel-train: collecting %s failed", name)
                return []

        return callback

    def record(self, name: str, attrs: Attrs, value: float, context: Any = None) -> None:
        hist = self.histograms.get(name)
        if hist is not None:
            hist.record(value, dict(attrs), context=context)


def publisher_for(
    meter_provider: Any, aggregator: MetricsAggregator, version: str, histograms_via_api: bool
) -> Publisher:
    """The one publisher of ``meter_provider``, reading ``aggregator`` from now on. A
    provider can serve several sessions in turn (a notebook, a test suite), and its
    instruments cannot be made twice: the SDK hands back the first ones, with the first
    session's callbacks. So each session attaches its aggregator to the same publisher."""
    publisher = _PUBLISHERS.get(meter_provider)
    if publisher is None:
        meter = meter_provider.get_meter(c.SCOPE_NAME, version, schema_url=c.SCHEMA_URL)
        publisher = _PUBLISHERS[meter_provider] = Publisher(meter, aggregator, histograms_via_api)
    publisher.attach(aggregator, histograms_via_api)
    return publisher


def _known(value: int | None) -> list[Observation]:
    return [] if value is None else [Observation(value)]


def _without_attributes(
    callback: Callable[[CallbackOptions], Iterable[Observation]],
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """A deprecated alias's callback: its replacement's values, attributes dropped."""
    return lambda options: [Observation(o.value) for o in callback(options)]


def _histogram(meter: metrics.Meter, spec: c.MetricSpec) -> Any:
    try:
        return meter.create_histogram(
            spec.name,
            unit=spec.unit,
            description=spec.description,
            explicit_bucket_boundaries_advisory=list(spec.buckets or c.DURATION_BUCKETS),
        )
    except TypeError:  # pragma: no cover - API older than 1.23 has no bucket advice
        return meter.create_histogram(spec.name, unit=spec.unit, description=spec.description)
