"""A run record read back: per rank, its metric snapshots and its spans.

The OTLP/JSON lines (export/record.py) are flattened into plain values: a snapshot is
one metric export (every metric at one time), keyed by (metric name, attribute items);
a histogram's value is its :class:`~.histogram.Histogram`. Spans keep OTLP/JSON's
fields, with their attributes as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import contract as c
from ..export.record import directory_name
from .files import record_parts, requests
from .histogram import Histogram

Key = tuple[str, tuple[tuple[str, Any], ...]]


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
        return int(self.resource.get(c.RESOURCE_RANK.key, 0))

    @property
    def role(self) -> str:
        return str(self.resource.get(c.RESOURCE_ROLE.key) or "")


@dataclass
class Run:
    """A run's records: its ranks, and the other processes of the run (a role other than
    trainer: generators) that recorded beside them, in the same directory or in one of
    their own next to it (the same run id: ``<service>-<run id>``)."""

    ranks: list[RankRecord]
    others: list[RankRecord] = field(default_factory=list)


def is_other(record: RankRecord) -> bool:
    """Whether the record is of another process of the run than its ranks (a role other
    than trainer)."""
    return record.role not in ("", "trainer")


def load_run(run_dir: str | Path) -> Run:
    """The run of the record in ``run_dir``, with its other processes."""
    root = Path(run_dir)
    records = load(root)
    run = Run([r for r in records if not is_other(r)], [r for r in records if is_other(r)])
    if not run.ranks:  # a generator's own record: its page
        return Run(records)
    job = next((r.resource.get(c.RESOURCE_JOB.key) for r in run.ranks), None)
    if not job:
        return run
    suffix = directory_name("", str(job))  # "-<run id>"
    for sibling in sorted(root.resolve().parent.glob(f"*{suffix}")):
        if not sibling.is_dir() or sibling == root.resolve():
            continue
        try:
            found = load(sibling)
        except OSError:  # no record in it
            continue
        run.others += [
            r for r in found if is_other(r) and r.resource.get(c.RESOURCE_JOB.key) == job
        ]
    return run


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
        add_spans(rec, rs)


def add_spans(rec: RankRecord, rs: dict[str, Any]) -> None:
    """The spans of one OTLP/JSON ``resourceSpans`` item, into ``rec``."""
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
