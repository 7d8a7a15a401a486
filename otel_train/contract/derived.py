"""Figures derived in PromQL from the exported metrics. Each was a gauge per rank that
equals an expression over series the rank sends anyway (a rate of a counter, a ratio of
two gauges), so Prometheus computes it at query time instead: that is part of how a rank
stays within its series budget (33 a rank, 36 a DDP rank: docs/scale.md). The
dashboards use these queries; the console, the run summary, the report page and the step
spans still carry the figures themselves."""

from __future__ import annotations

from .metrics import (
    A_CATEGORY,
    A_DTYPE,
    A_KIND,
    A_PHASE,
    DEVICE_MEMORY_LIMIT,
    MFU,
    PHASE_MEMORY_PEAK,
    RUN_TIME,
    SAMPLES,
    THROUGHPUT_FLOPS,
    TOKENS,
)
from .prometheus import prometheus_base_name
from .specs import DerivedSpec, MetricSpec

_RUN_TIME = prometheus_base_name(RUN_TIME)


def _by(by: str, *more: str) -> str:
    return ", ".join(x for x in (by, *more) if x)


def _run_time(selector: str, categories: str, by: str, window: str = "") -> str:
    """Run time of these categories (a regex), summed by ``by``: over ``window`` as a rate,
    or since the first step."""
    sel = f'{_RUN_TIME}{{{selector}, {A_CATEGORY}=~"{categories}"}}'
    if window:
        sel = f"rate({sel}[{window}])"
    return f"sum by ({by}) ({sel})"


def _per_second(counter: MetricSpec, what: str) -> DerivedSpec:
    """A counter's rate, summed by ``by``: samples or tokens per second of wall time."""
    metric = prometheus_base_name(counter)
    return DerivedSpec(
        f"{what} per second",
        f"{{{what[:-1]}}}/s",
        f"{what.capitalize()} per second of wall time: the rate of `{counter.name}`.",
        lambda s, by, w: f"sum by ({by}) (rate({metric}{{{s}}}[{w}]))",
        over="window",
    )


DERIVED_GOODPUT = DerivedSpec(
    "goodput",
    "1",
    "Share of run wall time since the first step spent training (steps less data waits): "
    "the `train` share of `otel_train.run.time`.",
    lambda s, by, w: f"{_run_time(s, 'train', by)} / {_run_time(s, '.+', by)}",
    over="run",
)
DERIVED_DATA_STALL = DerivedSpec(
    "data stall",
    "1",
    "Share of step wall time spent waiting for batches: `data` over `train` + `data` run "
    "time (steps are exactly those two categories).",
    lambda s, by, w: f"{_run_time(s, 'data', by, w)} / {_run_time(s, 'train|data', by, w)}",
    over="window",
)
DERIVED_THROUGHPUT_SAMPLES = _per_second(SAMPLES, "samples")
DERIVED_THROUGHPUT_TOKENS = _per_second(TOKENS, "tokens")
DERIVED_PHASE_MEMORY_UTILIZATION = DerivedSpec(
    "phase memory utilization",
    "1",
    "Peak reserved bytes of each phase over the device's memory (CUDA), most recent step "
    "(the run summary's % of device).",
    lambda s, by, w: (
        f"max by ({_by(by, A_PHASE)}) ({prometheus_base_name(PHASE_MEMORY_PEAK)}{{{s}, "
        f'{A_KIND}="reserved"}}) / on({by}) group_left '
        f"max by ({by}) ({prometheus_base_name(DEVICE_MEMORY_LIMIT)}{{{s}}})"
    ),
    over="latest",
)
DERIVED_DEVICE_PEAK_FLOPS = DerivedSpec(
    "device peak FLOP/s",
    "{flop}/s",
    "The dense peak MFU is measured against, for its `dtype`: achieved FLOP/s over MFU.",
    lambda s, by, w: (
        f"max by ({_by(by, A_DTYPE)}) ({prometheus_base_name(THROUGHPUT_FLOPS)}{{{s}}} "
        f"/ ignoring({A_DTYPE}) group_right {prometheus_base_name(MFU)}{{{s}}})"
    ),
    over="latest",
)

DERIVED = (
    DERIVED_GOODPUT,
    DERIVED_DATA_STALL,
    DERIVED_THROUGHPUT_SAMPLES,
    DERIVED_THROUGHPUT_TOKENS,
    DERIVED_PHASE_MEMORY_UTILIZATION,
    DERIVED_DEVICE_PEAK_FLOPS,
)
