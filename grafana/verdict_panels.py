"""The training overview's verdicts panel: the figures behind the verdicts the live stack
can compute (processing/verdicts.py), each red from its threshold's default
(settings/verdicts.py) on, and described in the verdict lines' own words (ADVICE)."""

from __future__ import annotations

from typing import Any

from widgets import RATE, F, n, panel, target

from otel_train import contract as c
from otel_train.processing.verdicts import ADVICE
from otel_train.settings.verdicts import VerdictSettings

Grid = tuple[int, int, int, int]
LIMITS = VerdictSettings()


def _sum(spec: c.MetricSpec) -> str:
    return f"sum(histogram_sum(rate({n(spec)}{{{F}}}[{RATE}])))"


# (rule, the figure's query, its unit, its threshold)
FIGURES: tuple[tuple[str, str, str, float], ...] = (
    ("input-bound", c.DERIVED_DATA_STALL.query(F, "job", RATE), "percentunit",
     LIMITS.verdict_data_stall),
    # (a job with no collective has no series of their time: its share is 0)
    ("collectives", f"({_sum(c.COLLECTIVE_DURATION)} or on() vector(0)) / "
     f"{_sum(c.STEP_DURATION)}", "percentunit", LIMITS.verdict_collectives),
    # (on CPU: the host's peak RSS against its memory, as the memory panels fall back)
    ("memory near the limit", f"max({c.DERIVED_PHASE_MEMORY_UTILIZATION.query(F, 'job', RATE)}) "
     f"or on() (max({n(c.PROCESS_MEMORY_PEAK_RSS)}{{{F}}}) / max({n(c.HOST_MEMORY_TOTAL)}{{{F}}}))",
     "percentunit", LIMITS.verdict_memory),
    # (a reason's series starts at its first drop: none is none dropped)
    ("telemetry drops", f"sum(increase({n(c.DROPPED)}{{{F}}}[{RATE}])) or on() vector(0)",
     "short", float(LIMITS.verdict_dropped)),
)  # fmt: skip


def _override(ref: str, unit: str, threshold: float) -> dict[str, Any]:
    steps = [{"color": "green", "value": None}, {"color": "red", "value": threshold}]
    return {
        "matcher": {"id": "byFrameRefID", "options": ref},
        "properties": [
            {"id": "unit", "value": unit},
            {"id": "thresholds", "value": {"mode": "absolute", "steps": steps}},
        ],
    }


def verdicts_panel(grid: Grid) -> dict[str, Any]:
    refs = [chr(ord("A") + i) for i in range(len(FIGURES))]
    words = "; ".join(
        f"{rule} (red from {threshold:g}): try {ADVICE[rule]}" for rule, _, _, threshold in FIGURES
    )
    p = panel(
        "Verdicts: the bottleneck",
        [target(q, rule, ref) for ref, (rule, q, _, _) in zip(refs, FIGURES, strict=True)],
        "percentunit",
        grid,
        kind="stat",
        description="The figures behind the run's verdicts (docs/compare.md), red from the "
        f"verdict thresholds' defaults on. {words}. The straggler has a panel of its own; "
        "otel-train compare and the report page give every verdict of a run record.",
    )
    p["fieldConfig"]["overrides"] = [
        _override(ref, unit, threshold)
        for ref, (_, _, unit, threshold) in zip(refs, FIGURES, strict=True)
    ]
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    p["options"] = {"colorMode": "background", "graphMode": "none",
                    "textMode": "value_and_name", "reduceOptions": reduce}  # fmt: skip
    return p
