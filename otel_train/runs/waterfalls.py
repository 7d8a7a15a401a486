"""Traced steps as waterfalls: each step span with its phase spans (and those other
processes of the run ran under it), offsets from the step's start, host and device
durations, and the attributes shown on hover."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import contract as c
from .record_data import RankRecord

MAX_WATERFALLS = 60  # errors first, then the slowest; shown in step order
Children = dict[str, list[tuple[dict[str, Any], str]]]  # parent id: (span, " [role]" or "")


def _ns(span: dict[str, Any], key: str) -> int:
    return int(span.get(key, 0))


def slow_steps(ranks: list[RankRecord]) -> list[tuple[float, float]]:
    """(end time, host seconds) of each step traced as a slow one."""
    out = []
    for rank in ranks:
        for s in rank.spans:
            because = str(s["attributes"].get(c.STEP_SAMPLED_BECAUSE.key, ""))
            if s["name"] == c.STEP_SPAN.name and "slow" in because:
                seconds = s["attributes"].get(c.STEP_HOST_DURATION.key)
                if seconds is not None:
                    out.append((_ns(s, "endTimeUnixNano") / 1e9, float(seconds)))
    return out


def waterfalls(ranks: list[RankRecord], others: Sequence[RankRecord] = ()) -> list[dict[str, Any]]:
    """The traced steps, with the phases other processes (generators) ran under them, as
    rows ``name [role]``."""
    remote: Children = {}
    for other in others:
        for s in other.spans:
            remote.setdefault(s.get("parentSpanId", ""), []).append((s, f" [{other.role}]"))
    found = []
    for rank in ranks:
        children: Children = {}
        for s in rank.spans:
            children.setdefault(s.get("parentSpanId", ""), []).append((s, ""))
        for s in rank.spans:
            if s["name"] == c.STEP_SPAN.name:
                found.append(_waterfall(rank.rank, s, children, remote))
    found.sort(key=lambda w: (not w["error"], -w["duration_s"]))
    kept = found[:MAX_WATERFALLS]
    kept.sort(key=lambda w: (w["index"], w["rank"]))
    return kept


def _waterfall(rank: int, step: dict[str, Any], children: Children,
               remote: Children) -> dict[str, Any]:  # fmt: skip
    t0 = _ns(step, "startTimeUnixNano")
    rows: list[dict[str, Any]] = []

    def visit(span: dict[str, Any], depth: int) -> None:
        kids = children.get(span["spanId"], []) + remote.get(span["spanId"], [])
        for child, role in sorted(kids, key=lambda k: _ns(k[0], "startTimeUnixNano")):
            a = child["attributes"]
            rows.append({
                "name": child["name"] + role,
                "depth": depth,
                "start_ms": (_ns(child, "startTimeUnixNano") - t0) / 1e6,
                "host_ms": (_ns(child, "endTimeUnixNano") - _ns(child, "startTimeUnixNano")) / 1e6,
                "device_ms": _ms(a.get(c.PHASE_DEVICE_DURATION.key)),
                "attributes": {k: str(v) for k, v in a.items()},
            })  # fmt: skip
            if depth < 16:
                visit(child, depth + 1)

    visit(step, 0)
    a = step["attributes"]
    return {
        "rank": rank,
        "trace_id": step.get("traceId", ""),
        "index": int(a.get(c.STEP_INDEX.key, -1)),
        "because": str(a.get(c.STEP_SAMPLED_BECAUSE.key, "")),
        "duration_s": (_ns(step, "endTimeUnixNano") - t0) / 1e9,
        "device_ms": _ms(a.get(c.STEP_DEVICE_DURATION.key)),
        "error": bool(step.get("status", {}).get("code") == 2),
        "attributes": {k: str(v) for k, v in a.items()},
        "phases": rows,
    }


def _ms(seconds: Any) -> float | None:
    return float(seconds) * 1e3 if seconds is not None else None
