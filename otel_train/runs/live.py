"""A job's run read from a live stack: its series from Prometheus's query API, its traces
from Jaeger's ``/api/v3``, as the same :class:`~.record_data.Run` a run record gives, so
``otel-train report --prometheus URL --jaeger URL --job JOB`` draws the same page.

Prometheus stores one sample per series and export, at the export's time: the samples of
a process (its service and ``instance``, the resource's service.instance.id) at one time
are one snapshot, as a line of its record is. A series' labels map back to the contract: its
name to the metric's (``prometheus_base_name``), the metric's attributes to theirs, the
promoted resource attributes (rank, run id, role, service) to the process's resource;
native histograms to :class:`~.histogram.Histogram`. A process's run facts (its record's
``run.json``) come from its ``target_info`` (the facts known at start, resource
attributes of otel-train's own SDK) and its last ``torch.compiled`` value. The run's
generators (role generator, the same ``otel_train_job``) are its other processes. Jaeger gives the
traces of the job's service with every span of them, a generator's too, each under its
process's resource.
"""

from __future__ import annotations

import bisect
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .. import contract as c
from .histogram import Histogram
from .record_data import RankRecord, Run, Snapshot, add_spans, attributes, is_other

MAX_TRACES = 1000
_NAMES = {c.prometheus_base_name(m): m for m in c.METRICS}
_RESOURCE = {"service_name": "service.name", "otel_train_rank": c.RESOURCE_RANK.key,
             "otel_train_job": c.RESOURCE_JOB.key, "otel_train_role": c.RESOURCE_ROLE.key,
             "instance": "service.instance.id"}  # fmt: skip


def _get(url: str, timeout_s: float = 30.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError:
        raise
    except urllib.error.URLError as err:
        raise OSError(f"cannot read {url.split('?')[0]}: {err.reason}") from None


def _query(prometheus: str, query: str, end: float) -> list[dict[str, Any]]:
    url = f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode(
        {"query": query, "time": f"{end:.3f}"}
    )
    body = json.loads(_get(url))
    if body.get("status") != "success":
        raise ValueError(f"{prometheus}: {body.get('error', body)}")
    return list(body["data"]["result"])


def _series(prometheus: str, selector: str, end: float, seconds: float) -> list[dict[str, Any]]:
    """Every contract series matching ``selector`` with its raw samples over the range."""
    names = "|".join(sorted(_NAMES))
    query = f'{{__name__=~"{names}", otel_train_source="", {selector}}}[{int(seconds)}s]'
    return _query(prometheus, query, end)


def _target_info(
    prometheus: str, selector: str, end: float, seconds: float
) -> list[dict[str, Any]]:
    """The job's ``target_info`` series as last seen in the range (their labels)."""
    query = f'last_over_time({c.TARGET_INFO}{{otel_train_source="", {selector}}}[{int(seconds)}s])'
    return _query(prometheus, query, end)


def start_facts(labels: dict[str, str]) -> dict[str, Any]:
    """The run facts known at start from a ``target_info``'s labels; none when its
    process's SDK was not otel-train's own (no version). Prometheus keeps no empty label:
    the settings absent read as none changed."""
    if _label(c.RUN_VERSION.key) not in labels:
        return {}
    out = {spec.key: labels.get(_label(spec.key)) for spec in c.START_FACTS}
    out[c.RUN_SETTINGS.key] = out[c.RUN_SETTINGS.key] or ""
    return {k: v for k, v in out.items() if v is not None}


def add_facts(ranks: list[RankRecord], infos: list[dict[str, Any]]) -> None:
    """Each process's run facts: those known at start from its ``target_info`` (by
    instance), whether it ran compiled from its last ``torch.compiled`` value."""
    by_instance = {s["metric"].get("instance"): start_facts(s["metric"]) for s in infos}
    compiled = (c.TORCH_COMPILED.name, ())
    for rec in ranks:
        rec.facts.update(by_instance.get(rec.resource.get("service.instance.id")) or {})
        values = [snap.values[compiled] for snap in rec.snapshots if compiled in snap.values]
        if values:
            rec.facts[c.RUN_TORCH_COMPILE.key] = bool(values[-1])


def _histogram(h: dict[str, Any]) -> Histogram:
    """A Prometheus native histogram ([rule, lower, upper, count] buckets) written out."""
    buckets = sorted((float(lo), float(hi), float(n)) for _, lo, hi, n in h.get("buckets", []))
    bounds = sorted({x for lo, hi, _ in buckets for x in (lo, hi)})
    counts = [0.0] * (len(bounds) + 1)
    for _, hi, n in buckets:
        counts[bisect.bisect_left(bounds, hi)] += n
    return Histogram(float(h.get("count", 0)), float(h.get("sum", 0)), bounds, counts)


def records(series: list[dict[str, Any]]) -> list[RankRecord]:
    """One record a process (instance), a snapshot per sample time."""
    out: dict[str, RankRecord] = {}
    snaps: dict[tuple[str, float], Snapshot] = {}
    for s in series:
        labels = s["metric"]
        spec = _NAMES.get(labels.get("__name__", ""))
        if spec is None:
            continue
        process = _process(labels.get("service_name"), labels.get("instance"))
        rec = out.setdefault(process, RankRecord(process, _resource(labels)))
        attrs = tuple(
            sorted((k, labels[_label(k)]) for k in spec.attributes if _label(k) in labels)
        )
        points: list[tuple[float, Any]] = [(float(t), float(v)) for t, v in s.get("values", [])]
        points += [(float(t), _histogram(h)) for t, h in s.get("histograms", [])]
        for t, value in points:
            snap = snaps.get((process, t))
            if snap is None:
                snap = snaps[(process, t)] = Snapshot(t)
                rec.snapshots.append(snap)
            snap.values[(spec.name, attrs)] = value
    for rec in out.values():
        rec.snapshots.sort(key=lambda x: x.t)
    return sorted(out.values(), key=lambda r: (r.rank, r.prefix))


def _process(service: Any, instance: Any) -> str:
    """A process's key: its service and instance (a run's processes of one rank, trainer
    and generators, share the instance id: export/resource.py)."""
    return f"{service or ''}/{instance or ''}"


def _label(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _resource(labels: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {key: labels[name] for name, key in _RESOURCE.items() if name in labels}
    if c.RESOURCE_RANK.key in out:
        out[c.RESOURCE_RANK.key] = int(out[c.RESOURCE_RANK.key])
    return out


def _traces(jaeger: str, service: str, start: float, end: float) -> list[dict[str, Any]]:
    """The resourceSpans of the service's traces (the HTTP gateway may stream several
    ``{"result": ...}`` bodies back to back)."""

    def rfc3339(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"

    params = {
        "query.service_name": service,
        "query.start_time_min": rfc3339(start),
        "query.start_time_max": rfc3339(end),
        "query.num_traces": str(MAX_TRACES),
    }
    try:
        text = _get(f"{jaeger.rstrip('/')}/api/v3/traces?" + urllib.parse.urlencode(params))
    except urllib.error.HTTPError as err:
        if err.code == 404:  # no trace in the range
            return []
        raise
    decoder, pos, out = json.JSONDecoder(), 0, []
    while pos < len(text.rstrip()):
        body, pos = decoder.raw_decode(text, pos)
        pos += len(text[pos:]) - len(text[pos:].lstrip())
        out += body.get("result", {}).get("resourceSpans", [])
    return out


def fetch_run(prometheus: str, jaeger: str | None, job: str, seconds: float,
              end: float | None = None) -> Run:  # fmt: skip
    """The run of ``job`` over the ``seconds`` before ``end`` (default now)."""
    end = time.time() if end is None else end
    ranks = records(_series(prometheus, f'job="{job}"', end, seconds))
    if not ranks:
        raise ValueError(f"{prometheus}: no series of job {job!r} in the last {seconds:g} s")
    add_facts(ranks, _target_info(prometheus, f'job="{job}"', end, seconds))
    runs = sorted({str(r.resource[c.RESOURCE_JOB.key]) for r in ranks
                   if r.resource.get(c.RESOURCE_JOB.key)})  # fmt: skip
    run = Run([r for r in ranks if not is_other(r)], [r for r in ranks if is_other(r)])
    if runs:
        # A PromQL string (json.dumps doubles the backslashes re.escape wrote).
        chosen = json.dumps("|".join(re.escape(x) for x in runs))
        selector = f'otel_train_role="generator", otel_train_job=~{chosen}'
        known = {r.prefix for r in run.others}
        run.others += [r for r in records(_series(prometheus, selector, end, seconds))
                       if r.prefix not in known]  # fmt: skip
    if jaeger:
        by_process = {r.prefix: r for r in [*run.ranks, *run.others]}
        for rs in _traces(jaeger, job.rsplit("/", 1)[-1], end - seconds, end):
            resource = attributes(rs.get("resource", {}).get("attributes"))
            process = (
                f"{resource.get('service.name', '')}/{resource.get('service.instance.id', '')}"
            )
            rec = by_process.get(process)
            if rec is not None:
                add_spans(rec, rs)
    return run
