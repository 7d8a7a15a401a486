"""The shapes of the telemetry contract: what an attribute, a span and a metric declare,
and the instrumentation scope everything is emitted under. The other modules of
:mod:`otel_train.contract` hold the values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SCOPE_NAME = "otel_train"


@dataclass(frozen=True)
class AttributeSpec:
    key: str
    type: str  # "string" | "int" | "double" | "boolean"
    unit: str  # UCUM unit of the value, "" when it has none
    description: str


@dataclass(frozen=True)
class SpanSpec:
    name: str  # a literal name, or a pattern in angle brackets for phase spans
    description: str
    attributes: tuple[AttributeSpec, ...]
    links: tuple[AttributeSpec, ...] = ()  # the attributes of its span links, if any


@dataclass(frozen=True)
class MetricSpec:
    name: str
    instrument: str  # "histogram" | "counter" | "gauge" | "updowncounter"
    unit: str
    description: str
    attributes: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None  # histogram bounds (None: DURATION_BUCKETS)


@dataclass(frozen=True)
class DerivedSpec:
    """A figure no rank exports because Prometheus computes it from exported series
    (fewer series per rank: docs/scale.md). ``query(selector, by, window)`` is its PromQL:
    ``selector`` the label matchers every series is read with (``job="x"``), ``by`` the
    labels kept (``otel_train_rank``; "" for one value), ``window`` a range (``5m``)."""

    name: str
    unit: str
    description: str
    query: Callable[[str, str, str], str]
    over: str  # what it covers: "window" (the range given), "run" (so far) or "latest"
