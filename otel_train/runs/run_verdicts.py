"""A run record's verdicts: the figures processing/verdicts.py reads, measured over the
run's steady steps (steady.py) and its last metric snapshots."""

from __future__ import annotations

import statistics

from .. import contract as c
from ..processing.verdicts import Figures, verdicts
from ..settings.verdicts import VerdictSettings
from . import figures as f
from .record_data import RankRecord, Run
from .steady import WARMUP_STEPS, Sample, Steady, steady


def _wait_share(samples: list[Sample]) -> float | None:
    seconds = sum(s.seconds * s.steps for s in samples)
    waits = [s.collective_wait * s.steps for s in samples if s.collective_wait is not None]
    return sum(waits) / seconds if waits and seconds > 0 else None


def _work(samples: list[Sample]) -> float:
    """The median step less its waits in collectives: in synchronous training every rank's
    step lasts as long, and the healthy ranks wait in collectives for the slow one."""
    return statistics.median(s.seconds - (s.collective_wait or 0.0) for s in samples)


def _drift(samples: list[Sample]) -> float | None:
    third = len(samples) // 3
    if third < 3:
        return None
    first = statistics.median(s.seconds for s in samples[:third])
    last = statistics.median(s.seconds for s in samples[-third:])
    return last / first if first > 0 else None


def _memory(ranks: list[RankRecord]) -> tuple[dict[str, float], dict[str, float]]:
    """(peak reserved / device, 1 - allocated / reserved) per phase, the worst rank's."""
    use: dict[str, float] = {}
    frag: dict[str, float] = {}
    for rank in ranks:
        limit = max(f.last_values(rank, c.DEVICE_MEMORY_LIMIT.name).values(), default=0.0)
        peaks: dict[tuple[str, str], float] = {}
        for snap in rank.snapshots:
            for (metric, attrs), value in snap.values.items():
                if metric == c.PHASE_MEMORY_PEAK.name:
                    a = dict(attrs)
                    key = (str(a.get(c.A_PHASE)), str(a.get(c.A_KIND)))
                    peaks[key] = max(peaks.get(key, 0.0), value)
        for (phase, kind), reserved in peaks.items():
            if kind != "reserved" or reserved <= 0:
                continue
            if limit > 0:
                use[phase] = max(use.get(phase, 0.0), reserved / limit)
            allocated = peaks.get((phase, "allocated"), reserved)
            frag[phase] = max(frag.get(phase, 0.0), 1.0 - allocated / reserved)
    return use, frag


def figures(run: Run, states: list[Steady]) -> Figures:
    pooled = [s for st in states for s in st.samples]
    stalls = [s.data_stall for s in pooled if s.data_stall is not None]
    use, frag = _memory(run.ranks)
    dropped: dict[str, float] = {}
    for rank in run.ranks:
        for attrs, n in f.last_values(rank, c.DROPPED.name).items():
            reason = str(dict(attrs).get(c.A_REASON))
            dropped[reason] = dropped.get(reason, 0.0) + n
    retries = sum(int(s["attributes"].get(c.PHASE_ALLOC_RETRIES.key) or 0)
                  for r in run.ranks for s in r.spans)  # fmt: skip
    by_step = [s for s in pooled if s.steps == 1]
    typical = statistics.median(s.seconds for s in by_step) if by_step else 0.0
    return Figures(
        data_stall=statistics.median(stalls) if stalls else None,
        collective_share=_wait_share(pooled),
        rank_steps={st.rank: _work(st.samples) for st in states if st.samples},
        rank_waits={st.rank: _wait_share(st.samples) or 0.0 for st in states if st.samples},
        memory=use,
        fragmentation=frag,
        alloc_retries=retries,
        drift=_drift(states[0].samples) if states else None,
        dropped=dropped,
        steady=len(by_step),
        slow_steps=sum(1 for s in by_step if s.seconds > 2 * typical),
    )


def run_verdicts(run: Run, settings: VerdictSettings | None = None,
                 warmup: int = WARMUP_STEPS) -> list[str]:  # fmt: skip
    """The run's verdict lines (none: no rule triggered)."""
    return verdicts(figures(run, [steady(r, warmup) for r in run.ranks]), settings)
