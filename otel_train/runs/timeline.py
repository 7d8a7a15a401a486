"""``otel-train timeline RUN_DIR -o steps.json``: the traced steps in the Chrome trace
event format, which Perfetto UI and ``chrome://tracing`` open.

One process track per rank (pid rank + 1); on its ``steps`` thread each traced step is
a complete ("X") event with its phases nested inside it by time, their attributes as
args; where a phase has device time, the same phase on the ``device`` thread lasts its
device duration. A step covered by ``profile_steps`` names the profiler's trace file in
a span event; that file's events are merged in as a process of their own per rank,
below the rank's step tracks and moved onto the same clock (Kineto writes its timestamps
relative to its ``baseTimeNanoseconds``; ours are Unix microseconds). The run's other
processes (generators recorded beside it: record_data.Run) come last, a process track
each, their phases named as in the console: ``rollout [generator]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import contract as c
from .files import write_output
from .record_data import RankRecord, attributes, load_run

STEPS_TID, DEVICE_TID = 1, 2
PROFILER_PID_BASE = 1_000_000  # profiler processes: this + rank
OTHER_PID_BASE = 2_000_000  # the run's other processes (generators): this + their index
_PROFILE_PATH = c.PROFILE_EVENT_ATTRIBUTES[0].key  # the profiler trace's path
_META = "__metadata"  # the category Chrome gives its metadata events


def _us(ns: Any) -> float:
    return int(ns) / 1e3


def _meta(pid: int, name: str, sort: int, threads: dict[int, str]) -> list[dict[str, Any]]:
    out = [
        {"ph": "M", "cat": _META, "pid": pid, "tid": 0, "name": "process_name",
         "args": {"name": name}},
        {"ph": "M", "cat": _META, "pid": pid, "tid": 0, "name": "process_sort_index",
         "args": {"sort_index": sort}},
    ]  # fmt: skip
    for tid, label in threads.items():
        out.append({"ph": "M", "cat": _META, "pid": pid, "tid": tid, "name": "thread_name",
                    "args": {"name": label}})  # fmt: skip
    return out


def _rank_events(rank: RankRecord, pid: int, name: str,
                 sort: int) -> tuple[list[dict[str, Any]], set[str]]:  # fmt: skip
    """The rank's (or other process's) span events, and the profiler traces its steps
    name. Another process's phases read ``name [role]``, as in the console."""
    threads = {STEPS_TID: "steps (host)" if not rank.role or rank.role == "trainer"
               else f"phases [{rank.role}] (host)", DEVICE_TID: "device"}  # fmt: skip
    service = rank.resource.get("service.name", "")
    events = _meta(pid, f"{name} ({service})", sort, threads)
    suffix = f" [{rank.role}]" if threads[STEPS_TID].startswith("phases") else ""
    profiles: set[str] = set()
    for span in rank.spans:
        a = span["attributes"]
        start, end = _us(span["startTimeUnixNano"]), _us(span["endTimeUnixNano"])
        is_step = span["name"] == c.STEP_SPAN.name
        args = {k: str(v) for k, v in a.items()}
        events.append({"ph": "X", "pid": pid, "tid": STEPS_TID, "name": span["name"] + suffix,
                       "cat": "step" if is_step else "phase", "ts": start,
                       "dur": max(0.0, end - start), "args": args})  # fmt: skip
        device = a.get(c.STEP_DEVICE_DURATION.key if is_step else c.PHASE_DEVICE_DURATION.key)
        if device is not None:
            events.append({"ph": "X", "pid": pid, "tid": DEVICE_TID, "name": span["name"],
                           "cat": "device", "ts": start, "dur": float(device) * 1e6,
                           "args": args})  # fmt: skip
        for event in span.get("events", []):
            if event.get("name") == c.PROFILE_EVENT:
                path = attributes(event.get("attributes")).get(_PROFILE_PATH)
                if path:
                    profiles.add(str(path))
    return events, profiles


def _profiler_events(path: str, rank: int) -> list[dict[str, Any]]:
    """A torch.profiler trace's events, as process PROFILER_PID_BASE + rank on our clock."""
    try:
        trace = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    base_us = int(trace.get("baseTimeNanoseconds", 0)) / 1e3
    pid = PROFILER_PID_BASE + rank
    out = _meta(pid, f"rank {rank} profiler ({Path(path).name})", 2 * rank + 1, {})
    for event in trace.get("traceEvents", []):
        if not isinstance(event, dict) or event.get("ph") == "M":
            continue
        moved = dict(event, pid=pid)
        moved.setdefault("cat", "profiler")  # (optional in Kineto's events, not in every reader)
        if "ts" in moved:
            moved["ts"] = float(moved["ts"]) + base_us
        out.append(moved)
    return out


def timeline(run_dir: str | Path) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    merged = []
    run = load_run(run_dir)
    run.skipped.say("otel-train timeline")
    for i, other in enumerate(run.others):  # below the ranks and their profiler traces
        pid = OTHER_PID_BASE + i
        events += _rank_events(other, pid, f"{other.role} {i}", 2 * OTHER_PID_BASE + i)[0]
    for rank in run.ranks:
        # (pid 0 reads as "no process" to some readers)
        own, profiles = _rank_events(rank, rank.rank + 1, f"rank {rank.rank}", 2 * rank.rank)
        events += own
        for path in sorted(profiles):
            profiler = _profiler_events(path, rank.rank)
            if profiler:
                events += profiler
                merged.append(path)
    # Parents before children: a phase that starts with its step (the data fetch opens
    # it) would otherwise come first and not nest in it.
    events.sort(key=lambda e: (e["ph"] != "M", e["pid"], e.get("ts", 0.0), -e.get("dur", 0.0)))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run": Path(run_dir).name, "profiler_traces": merged}}  # fmt: skip


def write(run_dir: str | Path, out: str | Path | None = None) -> Path:
    target = Path(out) if out is not None else Path(run_dir) / "steps.json"
    return write_output(target, json.dumps(timeline(run_dir), separators=(",", ":")))
