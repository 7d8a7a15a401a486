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
from .files import RecordPart, Skipped, read_facts, record_parts, requests
from .histogram import Histogram
from .trace_sample import TraceChoice, choose

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
    sample: TraceChoice = field(default_factory=TraceChoice)  # which traces were kept
    facts: dict[str, Any] = field(default_factory=dict)  # its run facts (contract.RUN_FACTS)

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
    skipped: Skipped = field(default_factory=Skipped)  # bad lines left out

    def notes(self) -> list[str]:
        """What the run's page or timeline leaves out: bad lines, traces not drawn."""
        out = [self.skipped.message()] if self.skipped.counts else []
        for r in [*self.ranks, *self.others]:
            name = f"{r.prefix} [{r.role}]" if is_other(r) else r.prefix
            if r.sample.steps_seen and r.sample.sampled:
                kept = sum(1 for s in r.spans if s["name"] == c.STEP_SPAN.name)
                out.append(f"{name}: {kept:,} of {r.sample.steps_seen:,} traced steps drawn, "
                           "a sample (a large record; the charts use every snapshot)")  # fmt: skip
            elif r.sample.sampled:
                out.append(f"{name}: its phases under the drawn steps only")
        return out


def is_other(record: RankRecord) -> bool:
    """Whether the record is of another process of the run than its ranks (a role other
    than trainer)."""
    return record.role not in ("", "trainer")


def load_run(run_dir: str | Path, max_traces: int | None = None) -> Run:
    """The run of the record in ``run_dir``, with its other processes; ``max_traces``:
    at most about this many traced steps per process of a large record (trace_sample.py;
    None: all). Bad lines are left out and counted in ``Run.skipped``."""
    root = Path(run_dir)
    skipped = Skipped()
    records = load(root, skipped, max_traces)
    run = Run([r for r in records if not is_other(r)], [r for r in records if is_other(r)],
              skipped)  # fmt: skip
    if not run.ranks:  # a generator's own record: its page
        return Run(records, skipped=skipped)
    share = min(r.sample.fraction for r in run.ranks)  # (their phases under kept steps)
    job = next((r.resource.get(c.RESOURCE_JOB.key) for r in run.ranks), None)
    if not job:
        return run
    suffix = directory_name("", str(job))  # "-<run id>"
    for sibling in sorted(root.resolve().parent.glob(f"*{suffix}")):
        if not sibling.is_dir() or sibling == root.resolve():
            continue
        try:
            found = load(sibling, skipped, max_traces, share)
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


def load(run_dir: str | Path, skipped: Skipped | None = None, max_traces: int | None = None,
         share: float = 1.0) -> list[RankRecord]:  # fmt: skip
    """Every rank's record under ``run_dir``, by rank (``skipped``: where bad lines are
    counted; ``max_traces``, ``share``: trace_sample.choose)."""
    skipped = skipped if skipped is not None else Skipped()
    by_prefix: dict[str, list[RecordPart]] = {}
    for part in record_parts(run_dir):
        by_prefix.setdefault(part.prefix, []).append(part)
    out = []
    for prefix, parts in by_prefix.items():
        traces = [p for p in parts if p.kind == "traces"]
        rec = RankRecord(prefix, sample=choose(traces, max_traces, share),
                         facts=read_facts(parts[0]))  # fmt: skip
        for part in parts:
            for line in requests(part, skipped):
                try:
                    if part.kind == "traces":
                        _spans(rec, line.request)
                    else:
                        _snapshot(rec, line.request)
                except (AttributeError, KeyError, TypeError, ValueError):
                    skipped.add("of the wrong shape", part.path)
        rec.snapshots.sort(key=lambda s: s.t)
        out.append(rec)
    return sorted(out, key=lambda r: r.rank)


def _spans(rec: RankRecord, req: dict[str, Any]) -> None:
    for rs in req["resourceSpans"]:
        add_spans(rec, rs)


def add_spans(rec: RankRecord, rs: dict[str, Any]) -> None:
    """The spans of one OTLP/JSON ``resourceSpans`` item, into ``rec``: those of the
    traces it keeps (``rec.sample``), all or none (one of the wrong shape raises)."""
    resource = rec.resource or attributes(rs.get("resource", {}).get("attributes"))
    kept = []
    for ss in rs.get("scopeSpans", []):
        for span in ss.get("spans", []):
            _check_span(span)
            if rec.sample.keeps(span["traceId"]):
                kept.append(dict(span, attributes=attributes(span.get("attributes"))))
    rec.resource = resource
    rec.spans += kept


def _check_span(span: dict[str, Any]) -> None:
    """What the readers of a span rely on; ValueError/TypeError where it is not so."""
    for key in ("name", "traceId", "spanId"):
        if not isinstance(span[key], str):
            raise TypeError(f"span {key} is no string")
    int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])


def _snapshot(rec: RankRecord, req: dict[str, Any]) -> None:
    snap, resource = Snapshot(0.0), rec.resource
    for rm in req["resourceMetrics"]:
        resource = resource or attributes(rm.get("resource", {}).get("attributes"))
        for sm in rm.get("scopeMetrics", []):
            for metric in sm.get("metrics", []):
                for kind, body in metric.items():
                    if isinstance(body, dict) and "dataPoints" in body:
                        for p in body["dataPoints"]:
                            _point(snap, metric["name"], kind, p)
    rec.resource = resource
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
