"""Build the provisioned Grafana dashboards and datasources from one source: this file
and its parts beside it.

Every PromQL query is built from ``otel_train.contract`` names translated the way
Prometheus's OTLP receiver names them (the LogsQL one from its attribute keys and log
event names), so a renamed metric breaks the build, not the dashboard. Its parts:
widgets.py (data sources, filters, panels, variables), hang_panels.py and
datasource_files.py. ``python grafana/build.py`` rewrites the JSON/YAML under
``grafana/``; a test checks that the committed files equal this output and that every
query names only contract metrics.

Dashboards:
- training overview: step time p50/p95, throughput, time per phase (stacked), peak
  memory per phase against the device limit (host RSS against host memory on CPU
  runs), per-rank step time spread, loss, the layer's own health, the straggler score
  per rank (from the recording rules) with a data link to that rank's slowest traces;
  each rank's progress age against its limit, its share of step time in each
  collective, and the hang events from VictoriaLogs linked to their step traces
  (hang_panels.py); the figures behind the verdicts, red past their thresholds
  (verdict_panels.py).
- RL loop: rollout / train / optimizer / weight_sync time and memory, each phase's share
  of the iteration, reward; the generator processes' time against the trainer's per
  step and the policy staleness of consumed rollouts (issue 15).
Histogram panels show exemplars; a click on one opens that step's trace in Jaeger.
Duration histograms are native histograms (one series each: deploy/prometheus.yml), read
with ``histogram_quantile``, ``histogram_sum`` and ``histogram_count``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # its parts: widgets.py, hang_panels.py, datasource_files.py

from datasource_files import dashboard_provider, datasources  # noqa: E402
from hang_panels import collectives_panel, hang_events_panel, progress_panel  # noqa: E402
from verdict_panels import verdicts_panel  # noqa: E402
from widgets import (  # noqa: E402,F401 (the uids: tests read them here)
    JAEGER_UID,
    LOGS_TYPE,
    LOGS_UID,
    OTLP,
    PROM_UID,
    RATE,
    THANOS_UID,
    F,
    dashboard,
    explore_url,
    n,
    panel,
    target,
)

from otel_train import contract as c  # noqa: E402

# Recorded by deploy/prometheus/rules/stragglers.yml (a test checks the rule exists).
STRAGGLER_SCORE = "job_rank:otel_train_straggler_score:min"
STRAGGLER_THRESHOLD = 0.7  # the OtelTrainStraggler alert's threshold


def step_quantile(q: float, by: str = "") -> str:
    group = f"sum by ({by})" if by else "sum"
    return f"histogram_quantile({q}, {group} (rate({n(c.STEP_DURATION)}{{{F}}}[{RATE}])))"


def phase_seconds_per_step(phases: str = "") -> str:
    sel = f'{F}, phase=~"{phases}"' if phases else F
    return (
        f"sum by (phase) (histogram_sum(rate({n(c.PHASE_DURATION)}{{{sel}}}[{RATE}]))) "
        f"/ scalar(sum(rate({n(c.STEPS)}{{{F}}}[{RATE}])))"
    )


def memory_targets(phases: str = "") -> list[dict[str, Any]]:
    sel = f'{F}, kind="allocated"' + (f', phase=~"{phases}"' if phases else "")
    peak = (
        f"max by (phase) ({n(c.PHASE_MEMORY_PEAK)}{{{sel}}}) or on() "
        f"label_replace(max({n(c.PROCESS_MEMORY_PEAK_RSS)}{{{F}}}), "
        '"phase", "host peak RSS", "", "")'
    )
    limit = f"max({n(c.DEVICE_MEMORY_LIMIT)}{{{F}}}) or on() max({n(c.HOST_MEMORY_TOTAL)}{{{F}}})"
    return [target(peak, "{{phase}}", "A"), target(limit, "limit", "B")]


def scalar_panel(name: str, title: str, grid: tuple[int, int, int, int]) -> dict[str, Any]:
    """A user scalar recorded with otel_train.record(name=...), one line per rank."""
    expr = f'{n(c.SCALAR)}{{{F}, name="{name}"}}'
    return panel(
        title,
        [target(expr, "rank {{otel_train_rank}}", "A")],
        "short",
        grid,
        description=f"Recorded with otel_train.record({name}=...).",
    )


def slow_traces_link() -> dict[str, Any]:
    """Data link: the clicked rank's slowest sampled steps, searched in Jaeger."""
    query = {
        "refId": "A",
        "queryType": "search",
        "service": "${__field.labels.job}",
        "operation": c.STEP_SPAN.name,
        "tags": f"{c.RANK.key}=${{__field.labels.otel_train_rank}} "
        f"{c.STEP_SAMPLED_BECAUSE.key}=slowest",
        "limit": 20,
    }
    return {
        "title": "Slowest steps of rank ${__field.labels.otel_train_rank} in Jaeger",
        "url": explore_url(JAEGER_UID, query, range={"from": "now-1h", "to": "now"}),
        "targetBlank": True,
    }


def straggler_panel(grid: tuple[int, int, int, int]) -> dict[str, Any]:
    p = panel(
        "Straggler score by rank",
        [target(f"{STRAGGLER_SCORE}{{{F}}}", "rank {{otel_train_rank}}", "A")],
        "percentunit",
        grid,
        description="A healthy rank's time (the fleet median; with 2 ranks the faster rank, "
        "outside the phases that wait on the all-reduce) / this rank's median time in its "
        "worst section (the step, a phase, or its work: step time less time in collectives, "
        "where they are timed; a rank that waits for the others is not scored), 1 = on par, "
        "0.5 = twice as slow; a rank alone scores 1 (deploy/prometheus/rules/"
        f"stragglers.yml). Under {STRAGGLER_THRESHOLD} for 10 minutes fires "
        "OtelTrainStraggler. Click a line for that rank's slowest step traces in Jaeger.",
    )
    defaults = p["fieldConfig"]["defaults"]
    defaults.update({"min": 0, "max": 1, "links": [slow_traces_link()]})
    defaults["thresholds"] = {
        "mode": "absolute",
        "steps": [
            {"color": "red", "value": None},
            {"color": "green", "value": STRAGGLER_THRESHOLD},
        ],
    }
    defaults["custom"]["thresholdsStyle"] = {"mode": "line"}
    return p


def overview() -> dict[str, Any]:
    panels = [
        panel(
            "Step time p50 / p95",
            [
                target(step_quantile(0.5), "p50", "A", exemplar=True),
                target(step_quantile(0.95), "p95", "B", exemplar=True),
            ],
            "s",
            (0, 0, 12, 8),
            description="Host wall time per step. Exemplar dots open the "
            "sampled step's trace in Jaeger.",
        ),
        panel(
            "Throughput",
            [
                target(c.DERIVED_THROUGHPUT_SAMPLES.query(F, "", RATE), "samples/s", "A"),
                target(c.DERIVED_THROUGHPUT_TOKENS.query(F, "", RATE), "tokens/s", "B"),
            ],
            "short",
            (12, 0, 12, 8),
            description="Summed over the selected ranks: the rates of the sample and "
            "token counters.",
        ),
        panel(
            "Time per phase (per step)",
            [
                target(phase_seconds_per_step(), "{{phase}}", "A"),
            ],
            "s",
            (0, 8, 12, 8),
            stacked=True,
            description="Mean seconds per step spent in each "
            "phase (device time where measured). Nested phases are included in their parents.",
        ),
        panel(
            "Peak memory per phase",
            memory_targets(),
            "bytes",
            (12, 8, 12, 8),
            description="Peak CUDA allocator bytes per phase against device memory; on CPU "
            "runs, host peak RSS against host memory.",
        ),
        panel(
            "Step time by rank (p50)",
            [
                target(
                    step_quantile(0.5, "otel_train_rank"),
                    "rank {{otel_train_rank}}",
                    "A",
                    exemplar=True,
                ),
            ],
            "s",
            (0, 16, 12, 8),
            description="Spread across ranks: a rank above the others is a straggler.",
        ),
        scalar_panel("loss", "Loss", (12, 16, 12, 8)),
        panel(
            "otel-train health",
            [
                target(f"max({n(c.PENDING_STEPS)}{{{F}}})", "pending steps", "A"),
                target(
                    # A reason's series starts at its first drop, so the count so far (a
                    # rate would miss that first increase); "none" while nothing dropped.
                    f"sum by (reason) ({n(c.DROPPED)}{{{F}}}) "
                    'or on() label_replace(vector(0), "reason", "none", "", "")',
                    "dropped {{reason}} (so far)",
                    "B",
                ),
                target(f"sum(rate({n(c.SPANS_EMITTED)}{{{F}}}[{RATE}]))", "spans/s", "C"),
            ],
            "short",
            (0, 24, 12, 8),
            description="Steps waiting for CUDA events, telemetry "
            "dropped so training never waits, spans emitted.",
        ),
        panel(
            "otel-train CPU time per step",
            [
                target(f"max({n(c.OVERHEAD)}{{{F}}})", "worker CPU s/step", "A"),
            ],
            "s",
            (12, 24, 12, 8),
        ),
        straggler_panel((0, 32, 24, 8)),
        progress_panel((0, 40, 12, 8)),
        collectives_panel((12, 40, 12, 8)),
        hang_events_panel((0, 48, 24, 10)),
        *efficiency_panels(58),
        verdicts_panel((0, 74, 24, 5)),
    ]
    jobs = f"{n(c.STEPS)}{{{OTLP}}}"  # every training job
    return dashboard(
        "otel-train-overview", "otel-train: training overview", panels, ["training"], jobs
    )


def efficiency_panels(y: int) -> list[dict[str, Any]]:
    """MFU, achieved FLOP/s, data stall share and goodput, one line per rank."""
    by_rank = "rank {{otel_train_rank}}"
    time_share = (
        f"sum by (category) (rate({n(c.RUN_TIME)}{{{F}}}[{RATE}])) "
        f"/ scalar(sum(rate({n(c.RUN_TIME)}{{{F}}}[{RATE}])))"
    )
    return [
        panel(
            "MFU by rank",
            [target(f"max by (otel_train_rank) ({n(c.MFU)}{{{F}}})", by_rank, "A")],
            "percentunit",
            (0, y, 12, 8),
            description="Achieved FLOP/s over the device's dense datasheet peak for the matmul "
            "dtype (or the peak_tflops setting). Absent where no peak is known.",
        ),
        panel(
            "Achieved FLOP/s by rank",
            [
                target(f"max by (otel_train_rank) ({n(c.THROUGHPUT_FLOPS)}{{{F}}})", by_rank, "A"),
                target(c.DERIVED_DEVICE_PEAK_FLOPS.query(F, "", ""), "peak ({{dtype}})", "B"),
            ],
            "flops",
            (12, y, 12, 8),
            description="Step FLOPs (counted once per batch size, given or estimated) over "
            "step time.",
        ),
        panel(
            "Data stall share by rank",
            [target(c.DERIVED_DATA_STALL.query(F, "otel_train_rank", RATE), by_rank, "A")],
            "percentunit",
            (0, y + 8, 12, 8),
            description="Share of step time spent waiting for the next batch. A rank above "
            "the others is starved by its loader.",
        ),
        panel(
            "Goodput: where run time goes",
            [
                target(time_share, "{{category}}", "A"),
            ],
            "percentunit",
            (12, y + 8, 12, 8),
            stacked=True,
            description="Share of wall time in training (steps less data waits), data "
            "waits, evaluation, checkpointing, hangs (stalls past hang_after, until progress "
            "resumed) and other time outside steps. Goodput is the train share.",
        ),
    ]


RL = "rollout|train|optimizer|weight_sync"
RL_ONLY = "rollout|train|weight_sync"  # a plain loop has an optimizer phase too


def rl_loop() -> dict[str, Any]:
    share = (
        "sum by (phase) (histogram_sum(rate("
        f'{n(c.PHASE_DURATION)}{{{F}, phase=~"{RL}"}}[{RATE}]))) '
        f"/ scalar(sum(histogram_sum(rate({n(c.STEP_DURATION)}{{{F}}}[{RATE}]))))"
    )
    quantile = (
        f"histogram_quantile(0.95, sum by (phase) (rate("
        f'{n(c.PHASE_DURATION)}{{{F}, phase=~"{RL}"}}[{RATE}])))'
    )
    panels = [
        panel(
            "Iteration time by phase",
            [target(phase_seconds_per_step(RL), "{{phase}}", "A")],
            "s",
            (0, 0, 12, 8),
            stacked=True,
            description="Mean seconds per iteration in rollout, train, optimizer and weight sync.",
        ),
        panel(
            "Share of the iteration",
            [target(share, "{{phase}}", "A")],
            "percentunit",
            (12, 0, 12, 8),
            kind="bargauge",
        ),
        panel(
            "Phase time p95",
            [target(quantile, "{{phase}}", "A", exemplar=True)],
            "s",
            (0, 8, 12, 8),
            description="Exemplar dots open the slow iteration's trace.",
        ),
        panel("Peak memory per phase", memory_targets(RL), "bytes", (12, 8, 12, 8)),
        scalar_panel("reward", "Reward", (0, 16, 12, 8)),
        panel(
            "Iterations per second",
            [
                target(f"sum(rate({n(c.STEPS)}{{{F}}}[{RATE}]))", "iterations/s", "A"),
            ],
            "short",
            (12, 16, 12, 8),
        ),
    ]
    panels += cross_process_panels(24)
    # RL trainers only: a generator's rollouts show in its trainer's panels.
    jobs = f'{n(c.PHASE_DURATION)}{{{OTLP}, phase=~"{RL_ONLY}", otel_train_role!="generator"}}'
    return dashboard("otel-train-rl", "otel-train: RL loop", panels, ["rl"], jobs)


# Panels of a trainer ($job) with generator processes (role generator) beside it; their
# queries are checked against live runs with generators in tests/e2e/test_carrier_e2e.py
# and tests/e2e/test_stack_e2e.py (examples/rl_loop.py --generators 2).
CROSS_PROCESS_PANELS = ("Generator against trainer time per step", "Policy staleness")


def cross_process_panels(y: int) -> list[dict[str, Any]]:
    steps = f"scalar(sum(rate({n(c.STEPS)}{{{F}}}[{RATE}])))"
    # The generators of the trainer's run: the same otel_train_job (both unset alike).
    generator = (
        f'sum by (phase) (histogram_sum(rate({n(c.PHASE_DURATION)}{{otel_train_role="generator", '
        f'phase=~"rollout|weight_sync", {OTLP}}}[{RATE}])) '
        f"and on (otel_train_job) {n(c.STEPS)}{{{F}}}) / {steps}"
    )
    trainer = f"sum(histogram_sum(rate({n(c.STEP_DURATION)}{{{F}}}[{RATE}]))) / {steps}"
    stale = n(c.POLICY_STALENESS)
    return [
        panel(
            CROSS_PROCESS_PANELS[0],
            [
                target(trainer, "trainer step", "A"),
                target(generator, "generator {{phase}}", "B"),
            ],
            "s",
            (0, y, 12, 8),
            description="Seconds per trainer step: the trainer's step against the generator "
            "processes' rollouts and weight syncs (role generator, the trainer's run). "
            "Generators above the step: the trainer waits for rollouts.",
        ),
        panel(
            CROSS_PROCESS_PANELS[1],
            [
                target(
                    f"sum(histogram_sum(rate({stale}{{{F}}}[{RATE}]))) "
                    f"/ sum(histogram_count(rate({stale}{{{F}}}[{RATE}])))",
                    "mean",
                    "A",
                ),
                target(
                    f"histogram_quantile(0.95, sum(rate({stale}{{{F}}}[{RATE}])))",
                    "p95",
                    "B",
                ),
            ],
            "short",
            (12, y, 12, 8),
            description="Policy versions between a rollout's making and the step that "
            "consumed it (otel_train.consumed(token, policy_version=j)): 0 is on-policy.",
        ),
    ]


def outputs() -> dict[str, str]:
    """Relative path under grafana/ -> file content."""

    def js(d: dict[str, Any]) -> str:
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    return {
        "dashboards/training-overview.json": js(overview()),
        "dashboards/rl-loop.json": js(rl_loop()),
        "provisioning/datasources/datasources.yaml": datasources(),
        "provisioning/dashboards/dashboards.yaml": dashboard_provider(),
    }


def main() -> None:
    for rel, text in outputs().items():
        path = HERE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote grafana/{rel}")


if __name__ == "__main__":
    main()
