"""What a run record says about the run's set-up, for telling two runs' apart: its
resource (world size, host, service, SDK version), its run facts (torch version,
torch.compile, otel-train version and settings: export/run_facts.py) and what its
figures show (the device, the matmul dtype MFU is for, samples and tokens per step,
where the FLOPs came from, the phases). A fact the record does not hold reads None (a
live stack's jobs, a record of a run that never reached shutdown, an older record)."""

from __future__ import annotations

import re
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


_RUN_FACTS = {
    "torch": c.RUN_TORCH_VERSION.key,
    "torch.compile": c.RUN_TORCH_COMPILE.key,
    "otel-train": c.RUN_VERSION.key,
    "otel-train settings": c.RUN_SETTINGS.key,
}


def _first(run: Run, key: str) -> Any:
    return next((r.resource[key] for r in run.ranks if key in r.resource), None)


def _fact(run: Run, key: str) -> Any:
    """A run fact as the ranks give it: one value, or each rank's where they differ."""
    values = {r.rank: r.facts[key] for r in run.ranks if key in r.facts}
    found = set(map(str, values.values()))
    if len(found) > 1:
        return "; ".join(f"rank {k}: {v}" for k, v in sorted(values.items()))
    return next(iter(values.values()), None)


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
    out.update({name: _fact(run, key) for name, key in _RUN_FACTS.items()})
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


def _settings(text: Any) -> dict[str, str]:
    """``name=value, ...`` (run_facts.changed_settings) by name."""
    pairs = re.split(r", (?=[a-z_]+=)", text) if isinstance(text, str) and text else []
    return dict(p.partition("=")[::2] for p in pairs)


def differences(a: Run, b: Run) -> list[dict[str, Any]]:
    """The set-up facts that differ: [{name, a, b}]; the otel-train settings one a
    setting at a time (``setting NAME``, ``default`` where a run left it so)."""
    fa, fb = facts(a), facts(b)
    out = [{"name": k, "a": fa[k], "b": fb[k]} for k in fa if fa[k] != fb[k]]
    key = "otel-train settings"
    if None not in (fa[key], fb[key]) and fa[key] != fb[key]:
        sa, sb = _settings(fa[key]), _settings(fb[key])
        out = [d for d in out if d["name"] != key]
        out += [{"name": f"setting {n}", "a": sa.get(n, "default"), "b": sb.get(n, "default")}
                for n in sorted({*sa, *sb}) if sa.get(n) != sb.get(n)]  # fmt: skip
    return out
