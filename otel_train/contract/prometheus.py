"""Prometheus names of the contract's metrics: how Prometheus's OTLP receiver and the
in-process ``/metrics`` endpoint translate an OTel name and unit. The dashboards,
their checks and the generated reference use these."""

from __future__ import annotations

import re

from .specs import MetricSpec

# The series on which Prometheus's OTLP receiver keeps a resource's attributes that are not
# promoted to labels of every series (one per job and instance, its value 1).
TARGET_INFO = "target_info"

# --- Prometheus name translation ---------------------------------------------

_UNIT_WORDS = {
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "1": "",
    "%": "percent",
}
_PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour"}


def _unit_suffix(unit: str) -> str:
    unit = re.sub(r"\{[^}]*\}", "", unit)
    if "/" in unit:
        num, _, den = unit.partition("/")
        num_word = _UNIT_WORDS.get(num, num)
        den_word = _PER_UNIT_WORDS.get(den, den)
        return "_".join(p for p in (num_word, "per", den_word) if p) if den_word else num_word
    return _UNIT_WORDS.get(unit, unit)


def prometheus_base_name(spec: MetricSpec, source: str = "otlp") -> str:
    """The metric's Prometheus name (a native histogram's name; a classic histogram's
    before its _bucket/_sum/_count series suffixes).

    ``source="otlp"``: as Prometheus's OTLP receiver names it (translation strategy
    UnderscoreEscapingWithSuffixes; what the dashboards query). ``source="scrape"``: as
    the in-process ``/metrics`` endpoint names it. They differ only for gauges of unit
    ``1``, which get a ``_ratio`` suffix over OTLP and none from the Python exporter.
    """
    if source not in ("otlp", "scrape"):
        raise ValueError("source must be 'otlp' or 'scrape'")
    name = re.sub(r"[^a-zA-Z0-9:]", "_", spec.name)
    suffix = _unit_suffix(spec.unit)
    if spec.unit == "1" and spec.instrument == "gauge" and source == "otlp":
        suffix = "ratio"
    if suffix and not name.endswith("_" + suffix):
        name = f"{name}_{suffix}"
    if spec.instrument == "counter":
        name += "_total"
    return name


def prometheus_names(spec: MetricSpec, source: str = "otlp") -> tuple[str, ...]:
    """Every series name a query of this metric can use.

    Over OTLP a histogram is one native-histogram series under the base name (exponential
    buckets, or custom buckets when explicit ones are sent: ``convert_histograms_to_nhcb``
    in deploy/prometheus.yml); queries read its parts with ``histogram_quantile``,
    ``histogram_sum`` and ``histogram_count``. The ``/metrics`` endpoint writes classic
    ``_bucket``/``_sum``/``_count`` series (the text format has no other).
    """
    base = prometheus_base_name(spec, source)
    if spec.instrument == "histogram" and source == "scrape":
        return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
    return (base,)


def prometheus_label(key: str) -> str:
    """The Prometheus label an attribute key (a metric attribute, or a promoted resource
    attribute) becomes over OTLP: every character other than a letter, digit or ``_`` is
    an underscore (``otel_train.collective.op`` -> ``otel_train_collective_op``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)
