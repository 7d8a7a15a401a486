"""Verdicts: rules that name a run's bottleneck, one line each, with the figure that
decided it and the thing to try. Each rule reads :class:`Figures` (what a run record or
the console measured) against its threshold in
:class:`~otel_train.settings.verdicts.VerdictSettings`; a figure that is None (not
measured) never triggers. The words are the deploy/ alerts' words too."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from ..settings.verdicts import VerdictSettings


@dataclass
class Figures:
    data_stall: float | None = None  # median share of the step waiting for its batch
    collective_share: float | None = None  # steps' time in collectives / their time
    rank_steps: dict[int, float] = field(default_factory=dict)  # median step less waits
    rank_waits: dict[int, float] = field(default_factory=dict)  # collectives share per rank
    memory: dict[str, float] = field(default_factory=dict)  # phase: peak reserved / device
    fragmentation: dict[str, float] = field(default_factory=dict)  # phase: 1 - alloc/reserved
    alloc_retries: int = 0
    drift: float | None = None  # last third's median step / first third's
    dropped: dict[str, float] = field(default_factory=dict)  # reason: items
    steady: int = 0  # steady steps
    slow_steps: int = 0  # of them, over twice the median step


# What to try, by rule: the end of each verdict line, and of the dashboard panel's words.
ADVICE = {
    "input-bound": "more DataLoader workers, pin_memory=True, a larger prefetch_factor",
    "straggler": "its node's health (clocks, thermals, neighbours), its data shard, its input",
    "collectives": "overlapping them with compute (DDP bucket size, FSDP prefetch), fewer or "
    "larger collectives, or a straggler the others wait for",
    "memory near the limit": "activation checkpointing in that phase, a smaller micro-batch, "
    "or sharding (FSDP, ZeRO)",
    "allocator": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, steady tensor shapes",
    "drift": "looking for growing state (caches, lists of tensors, logging), memory growth, "
    "thermal throttling",
    "telemetry drops": "what the reason's entry under otel_train.dropped in docs/telemetry.md "
    "says (queues, exporter, disk)",
    "unsteady steps": "recompile logs (TORCH_LOGS=recompiles), steady batch shapes, fewer "
    "synchronizing calls",
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _line(rule: str, finding: str, setting: str, threshold: str) -> str:
    return f"{rule}: {finding} ({setting} {threshold}); try {ADVICE[rule]}"


def input_bound(f: Figures, s: VerdictSettings) -> str | None:
    if f.data_stall is None or f.data_stall < s.verdict_data_stall:
        return None
    found = f"steps wait {_pct(f.data_stall)} of their time for the next batch"
    return _line("input-bound", found, "verdict_data_stall", _pct(s.verdict_data_stall))


def collectives(f: Figures, s: VerdictSettings) -> str | None:
    if f.collective_share is None or f.collective_share < s.verdict_collectives:
        return None
    found = f"steps wait {_pct(f.collective_share)} of their time in collectives"
    return _line("collectives", found, "verdict_collectives", _pct(s.verdict_collectives))


def straggler(f: Figures, s: VerdictSettings) -> str | None:
    if len(f.rank_steps) < 2:
        return None
    typical = statistics.median(f.rank_steps.values())
    rank = max(f.rank_steps, key=f.rank_steps.__getitem__)
    ratio = f.rank_steps[rank] / typical if typical > 0 else 0.0
    if ratio < s.verdict_straggler:
        return None
    waits = f.rank_waits.get(rank, 0.0)
    others = [w for r, w in f.rank_waits.items() if r != rank]
    how = "waits (in collectives)" if others and waits > max(others) else "works (its own compute)"
    found = (f"rank {rank}'s median step less its collective waits is {ratio:.2f}x the "
             f"ranks' median; it mostly {how}")  # fmt: skip
    return _line("straggler", found, "verdict_straggler", f"{s.verdict_straggler:g}x")


def memory(f: Figures, s: VerdictSettings) -> str | None:
    if not f.memory:
        return None
    phase = max(f.memory, key=f.memory.__getitem__)
    if f.memory[phase] < s.verdict_memory:
        return None
    found = f"{phase} reserves {_pct(f.memory[phase])} of the device"
    return _line("memory near the limit", found, "verdict_memory", _pct(s.verdict_memory))


def allocator(f: Figures, s: VerdictSettings) -> str | None:
    phase = max(f.fragmentation, key=f.fragmentation.__getitem__) if f.fragmentation else None
    frag = f.fragmentation.get(phase, 0.0) if phase else 0.0
    if f.alloc_retries <= 0 and frag < s.verdict_fragmentation:
        return None
    found = [f"{f.alloc_retries} allocator retries (cache flushes)"] if f.alloc_retries else []
    if phase and frag >= s.verdict_fragmentation:
        found.append(f"{_pct(frag)} of {phase}'s reserved memory unused")
    threshold = _pct(s.verdict_fragmentation)
    return _line("allocator", ", ".join(found), "verdict_fragmentation", threshold)


def drift(f: Figures, s: VerdictSettings) -> str | None:
    if f.drift is None or abs(f.drift - 1.0) < s.verdict_drift:
        return None
    way = "slower" if f.drift > 1.0 else "faster"
    found = f"the last third of the steps is {_pct(abs(f.drift - 1.0))} {way} than the first"
    return _line("drift", found, "verdict_drift", _pct(s.verdict_drift))


def dropped(f: Figures, s: VerdictSettings) -> str | None:
    total = sum(f.dropped.values())
    if total < s.verdict_dropped:
        return None
    why = ", ".join(f"{n:,.0f} {reason}" for reason, n in sorted(f.dropped.items()) if n)
    found = f"{total:,.0f} items dropped ({why}): their figures are missing"
    return _line("telemetry drops", found, "verdict_dropped", str(s.verdict_dropped))


def unsteady(f: Figures, s: VerdictSettings) -> str | None:
    if not f.steady or f.slow_steps / f.steady < s.verdict_unsteady:
        return None
    found = f"{f.slow_steps} of {f.steady} steady steps took over twice the median step"
    return _line("unsteady steps", found, "verdict_unsteady", _pct(s.verdict_unsteady))


RULES: tuple[Callable[[Figures, VerdictSettings], str | None], ...] = (
    input_bound, straggler, collectives, memory, allocator, drift, dropped, unsteady,
)  # fmt: skip


def verdicts(f: Figures, s: VerdictSettings | None = None) -> list[str]:
    """Every rule's line that triggered, in RULES' order."""
    s = s or VerdictSettings()
    return [line for rule in RULES if (line := rule(f, s)) is not None]
