"""A stalled rank for benchmarks/loadgen.py (``--stall``), and what the stack makes of it.

Every simulated rank carries the progress gauges (otel_train.progress.age and .limit,
otel_train.collective.waiting): from the captured collection when the real loop exports
them, else added in the contract's form. One rank's training thread stops ``--stall-at``
seconds into the level: its age then rises with the wall clock while the others' stay
under a step. With ``--peers-wait`` the others reach the next all-reduce a step later and
wait there (age rising too, waiting 1), as in synchronous training.

A thread polls Prometheus meanwhile: when OtelTrainRankStalled (and, with peers waiting,
OtelTrainRankHoldsJob) first names the rank, the alert's activeAt, and each rule group's
evaluation time (its ``evaluationTime`` in /api/v1/rules) at every evaluation.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint

from otel_train import contract as c

GAUGES = (c.PROGRESS_AGE, c.PROGRESS_LIMIT, c.COLLECTIVE_WAITING)
GROUPS = ("otel-train-progress", "otel-train-stragglers")


def progress_shape(metrics: Any, hang_after: float) -> None:
    """Give the captured collection the three progress gauges (added when the loop did not
    export them) with the limit at ``hang_after``."""
    (scope,) = [sm for rm in metrics.resource_metrics for sm in rm.scope_metrics]
    have = {m.name for m in scope.metrics}
    now = time.time_ns()
    for spec in GAUGES:
        if spec.name not in have:
            point = NumberDataPoint(as_double=0.0, time_unix_nano=now)
            gauge = Gauge(data_points=[point])
            scope.metrics.append(
                Metric(name=spec.name, unit=spec.unit, description=spec.description, gauge=gauge)
            )
    points = progress_points(metrics)
    points[c.PROGRESS_LIMIT.name].as_double = hang_after
    points[c.PROGRESS_AGE.name].as_double = 0.05  # a healthy rank's: within its step
    points[c.COLLECTIVE_WAITING.name].as_double = 0.0


def progress_points(metrics: Any) -> dict[str, Any]:
    """The progress gauges' data points of a (simulated rank's) collection, by name."""
    names = {spec.name for spec in GAUGES}
    return {
        m.name: m.gauge.data_points[0]
        for rm in metrics.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name in names
    }


class Stall:
    """When the stalled rank stops, and what each rank's gauges read at a given time."""

    def __init__(self, rank: int, at: float, hang_after: float, peers_wait: bool, step: float):
        self.rank, self.hang_after, self.peers_wait, self.step = rank, hang_after, peers_wait, step
        self.start = time.time() + at  # wall clock: Prometheus's timestamps are wall times

    def reading(self, rank: int) -> Callable[[float], tuple[float, float]] | None:
        """(age, waiting) of ``rank`` at a wall time, or None where the captured healthy
        values stand (every rank but the stalled one, unless its peers wait)."""
        if rank == self.rank:
            return lambda now: (max(now - self.start, 0.05), 0.0)
        if not self.peers_wait:
            return None
        begin = self.start + self.step  # the peers block in the next step's all-reduce
        return lambda now: (max(now - begin, 0.05), float(now >= begin))


def prom(stack: dict[str, Any], path: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    url = f"http://127.0.0.1:{stack['ports']['PROMETHEUS']}{path}?{query}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]


class AlertWatch(threading.Thread):
    """Polls Prometheus every 0.25 s until stopped (see the module docstring)."""

    def __init__(self, stack: dict[str, Any], job: str, stall: Stall) -> None:
        super().__init__(daemon=True)
        self.stack, self.job, self.stall = stack, job, stall
        self.seen: dict[str, tuple[float, float, int]] = {}  # alert -> (seen, activeAt, n)
        self.evals: dict[str, dict[str, float]] = {g: {} for g in GROUPS}  # last eval -> s
        self.errors = 0
        self.exports: list[float] = []  # the stalled rank's export times (wall clock)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.25):
            try:
                self._poll()
            except OSError:
                self.errors += 1

    def _poll(self) -> None:
        now = time.time()
        counts: dict[str, int] = {}
        for a in prom(self.stack, "/api/v1/alerts")["alerts"]:
            labels = a["labels"]
            if labels.get("job") != self.job or a["state"] != "firing":
                continue
            name = labels["alertname"]
            counts[name] = counts.get(name, 0) + 1
            if labels.get("otel_train_rank") == str(self.stall.rank) and name not in self.seen:
                self.seen[name] = (now, _rfc3339(a["activeAt"]), 0)
        for name, (seen, active, n) in list(self.seen.items()):
            self.seen[name] = (seen, active, max(n, counts.get(name, 0)))
        for group in prom(self.stack, "/api/v1/rules")["groups"]:
            if group["name"] in self.evals:
                self.evals[group["name"]][group["lastEvaluation"]] = group["evaluationTime"]

    def report(self) -> dict[str, Any]:
        """Seconds from the limit's passing to each alert, and the groups' evaluation
        times (milliseconds: median, max, evaluations seen)."""
        self._stop_event.set()
        self.join(5)
        crossed = self.stall.start + self.stall.hang_after
        out: dict[str, Any] = {"hang_after_s": self.stall.hang_after, "poll_errors": self.errors}
        after = [e - crossed for e in self.exports if e > crossed]
        if after:  # the first export that carries an age past the limit
            out["export_after_limit_s"] = round(min(after), 2)
        for name, (seen, active, n) in list(self.seen.items()):
            out[name] = {
                "active_after_limit_s": round(active - crossed, 2),
                "seen_after_limit_s": round(seen - crossed, 2),
                "ranks_firing": n,
            }
        for group, evals in self.evals.items():
            ms = [1000 * v for v in evals.values()]
            if ms:
                out[f"eval_ms[{group}]"] = {
                    "median": round(statistics.median(ms), 2),
                    "max": round(max(ms), 2),
                    "evaluations": len(ms),
                }
        return out


def _rfc3339(text: str) -> float:
    """Prometheus's RFC 3339 time (nanosecond digits allowed) as epoch seconds."""
    head, _, frac = text.rstrip("Z").partition(".")
    base = dt.datetime.fromisoformat(head).replace(tzinfo=dt.timezone.utc).timestamp()
    digits = "".join(ch for ch in frac if ch.isdigit())
    return base + (float(f"0.{digits}") if digits else 0.0)
