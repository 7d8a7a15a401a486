"""A run record read back: per rank, its metric snapshots and its spans.

The OTLP/JSON lines (export/record.py) are flattened into plain values: a snapshot is
one metric export (every metric at one time), keyed by (metric name, attribute items);
a histogram's value is its :class:`Histogram`. Spans keep OTLP/JSON's fields, with
their attributes as a dict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import record_parts, requests

Key = tuple[str, tuple[tuple[str, Any], ...]]


@dataclass
class Histogram:
    """Cumulative counts: ``bounds`` upper bounds (explicit or exponential buckets)."""

    count: float
    total: float
    bounds: list[float]
    counts: list[float]  # per bucket; one more than bounds (the +Inf bucket)

    def minus(self, older: Histogram | None) -> Histogram:
        if older is None or older.bounds != self.bounds:
            return self
        return Histogram(
            self.count - older.count,
            self.total - older.total,
            self.bounds,
            [a - b for a, b in zip(self.counts, older.counts, strict=True)],
        )

    def quantile(self, q: float) -> float | None:
        """Linear within the bucket, as Prometheus's histogram_quantile."""
        if self.count <= 0:
            return None
        rank, seen, lower = q * self.count, 0.0, 0.0
        for i, n in enumerate(self.counts):
            upper = self.bounds[i] if i < len(self.bounds) else math.inf
            if n > 0 and seen + n >= rank:
                if math.isinf(upper):
                    return lower
                return lower + (upper - lower) * (rank - seen) / n
            seen += n
            lower = upper if not math.isinf(upper) else lower
        return lower


@dataclass
class Snapshot:
    t: float  # seconds since the epoch
    values: dict[Key, Any] = field(default_factory=dict)


@dataclass
class RankRecord:
    prefix: str
    resource: dict[str, Any] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return int(self.resource.get("otel_train.rank", 0))


def attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in items or ():
        value = a.get("value") or {}
        if not value:
            out[a["key"]] = None
            continue
        kind, raw = next(iter(value.items()))
        out[a["key"]] = int(raw) if kind == "intValue" else raw
    return out


def load(run_dir: str | Path) -> list[RankRecord]:
    """Every rank's record under ``run_dir``, by rank."""
    ranks: dict[str, RankRecord] = {}
    for part in record_parts(run_dir):
        rec = ranks.setdefault(part.prefix, RankRecord(part.prefix))
        for req in requests(part):
            if part.kind == "traces":
                _spans(rec, req)
            else:
                _snapshot(rec, req)
    out = sorted(ranks.values(), key=lambda r: r.rank)
    for rec in out:
        rec.snapshots.sort(key=lambda s: s.t)
    return out


def _spans(rec: RankRecord, req: dict[str, Any]) -> None:
    for rs in req.get("resourceSpans", []):
        rec.resource = rec.resource or attributes(rs.get("resource", {}).get("attributes"))
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                span["attributes"] = attributes(span.get("attributes"))
                rec.spans.append(span)


def _snapshot(rec: RankRecord, req: dict[str, Any]) -> None:
    snap = Snapshot(0.0)
    for rm in req.get("resourceMetrics", []):
        rec.resource = rec.resource or attributes(rm.get("resource", {}).get("attributes"))
        for sm in rm.get("scopeMetrics", []):
            for metric in sm.get("metrics", []):
                for kind, body in metric.items():
                    if isinstance(body, dict) and "dataPoints" in body:
                        for p in body["dataPoints"]:
                            _point(snap, metric["name"], kind, p)
    if snap.values:
        rec.snapshots.append(snap)


def _point(snap: Snapshot, name: str, kind: str, p: dict[str, Any]) -> None:
    key = (name, tuple(sorted(attributes(p.get("attributes")).items())))
    snap.t = max(snap.t, int(p.get("timeUnixNano", 0)) / 1e9)
    if kind == "histogram":
        counts = [float(c) for c in p.get("bucketCounts", [])]
        bounds = [float(b) for b in p.get("explicitBounds", [])]
        snap.values[key] = Histogram(float(p.get("count", 0)), float(p.get("sum", 0)),
                                     bounds, counts or [0.0] * (len(bounds) + 1))  # fmt: skip
    elif kind == "exponentialHistogram":
        snap.values[key] = _exponential(p)
    else:
        snap.values[key] = float(p.get("asDouble", p.get("asInt", 0)))


def _exponential(p: dict[str, Any]) -> Histogram:
    """An exponential histogram as explicit buckets: (base^i, base^(i+1)], positive side."""
    base = 2.0 ** (2.0 ** -int(p.get("scale", 0)))
    positive = p.get("positive") or {}
    offset = int(positive.get("offset", 0))
    counts = [float(c) for c in positive.get("bucketCounts", [])]
    # Bucket i holds (base^(offset+i), base^(offset+i+1)]; the zero bucket goes first.
    bounds = [base ** (offset + i) for i in range(len(counts) + 1)]
    zero = float(p.get("zeroCount", 0))
    return Histogram(float(p.get("count", 0)), float(p.get("sum", 0)),
                     bounds, [zero, *counts, 0.0])  # fmt: skip
