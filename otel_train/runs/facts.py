"""What a run record says about the run's set-up, for telling two runs' apart: its
resource (world size, host, service, SDK version) and what its figures show (the
device, the matmul dtype MFU is for, samples and tokens per step, where the FLOPs came
from, the phases). The record carries no torch version, no torch.compile flag and no
otel-train settings: those are not compared."""

from __future__ import annotations

import statistics
from typing import Any

from .. import contract as c
from . import figures as f
from .record_data import Run

_RESOURCE = {
    "world size": c.RESOURCE_WORLD_SIZE.key,
    "service": "service.name",
    "host": "host.name",
    "OpenTelemetry SDK": "telemetry.sdk.version",
}


def _first(run: Run, key: str) -> Any:
    return next((r.resource[key] for r in run.ranks if key in r.resource), None)


def _step_attr(run: Run, key: str) -> Any:
    """The median of a step span attribute over the traced steps (None if untraced)."""
    steps = [s["attributes"] for r in run.ranks for s in r.spans if s["name"] == c.STEP_SPAN.name]
    values = [a[key] for a in steps if a.get(key) is not None]
    if not values:
        return None
    if isinstance(values[0], str):
        return max(set(values), key=values.count)
    return statistics.median(values)


def _per_step(run: Run, counter: str) -> float | None:
    steps = sum(sum(f.last_values(r, c.STEPS.name).values()) for r in run.ranks)
    total = sum(sum(f.last_values(r, counter).values()) for r in run.ranks)
    return round(total / steps, 1) if steps and total else None


def _device(run: Run) -> str:
    ids = sorted({str(dict(k).get(c.A_HW_ID)) for r in run.ranks
                  for k in f.last_values(r, c.DEVICE_MEMORY_LIMIT.name)})  # fmt: skip
    clocks = {str(dict(k).get(c.A_CLOCK)) for r in run.ranks
              for k in f.last_values(r, c.PHASE_DURATION.name)}  # fmt: skip
    if ids or "device" in clocks:
        return "cuda" + (f" ({len(ids)} device(s))" if ids else "")
    return "cpu"


def _dtype(run: Run) -> str | None:
    found = {str(dict(k).get(c.A_DTYPE)) for r in run.ranks for k in f.last_values(r, c.MFU.name)}
    return ", ".join(sorted(found)) or None


def facts(run: Run) -> dict[str, Any]:
    """The run's set-up, by name (None where the record does not say)."""
    out: dict[str, Any] = {name: _first(run, key) for name, key in _RESOURCE.items()}
    out["ranks recorded"] = len(run.ranks)
    out["device"] = _device(run)
    out["MFU dtype"] = _dtype(run)
    out["samples per step"] = _per_step(run, c.SAMPLES.name)
    out["tokens per step"] = _per_step(run, c.TOKENS.name)
    out["FLOPs source"] = _step_attr(run, c.STEP_FLOPS_SOURCE.key)
    every = _step_attr(run, c.STEP_SAMPLED_BECAUSE.key) == "all"
    out["traced steps"] = "all" if every else "sampled"
    phases = {str(dict(k).get(c.A_PHASE)) for r in run.ranks
              for k in f.last_values(r, c.PHASE_DURATION.name)}  # fmt: skip
    out["phases"] = ", ".join(sorted(phases))
    return out


def differences(a: Run, b: Run) -> list[dict[str, Any]]:
    """The set-up facts that differ: [{name, a, b}]."""
    fa, fb = facts(a), facts(b)
    return [{"name": k, "a": fa[k], "b": fb[k]} for k in fa if fa[k] != fb[k]]
