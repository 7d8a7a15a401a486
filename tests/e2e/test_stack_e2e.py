"""End to end against the real stack on loopback: the Collector, Jaeger v2 and Prometheus
built by ``scripts/stack build``, started from the deploy/ configs.

Three instrumented training runs export over OTLP/HTTP to the Collector: a plain loop,
which also serves the in-process ``/metrics`` on the port this stack's Prometheus
scrapes; the demo (``otel-train demo``, what ``make demo`` runs); and
``examples/rl_loop.py --generators 2`` (a trainer and two generator processes) at its
default length with the default metric export interval. The last two run as a user runs
them, told where the Collector is and their names by the standard variables. Then:
Jaeger's ``/api/v3/traces`` holds their step -> phase trees (the RL steps with the
generators' rollouts and weight syncs in them), Prometheus holds the phase duration,
memory and throughput series with exemplars pointing at those traces, the figures
Prometheus derives (contract.DERIVED) equal what the runs' own counters give, every
query of every dashboard panel returns data for each job it is meant for, and the
dashboards' variables offer those jobs and no other. Stopping the stack leaves no
process behind.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from scratch import job_env as clean_job_env
from series_budget import CUDA_ONLY_SERIES, SERIES_PER_RANK
from stack_helpers import (
    SINGLE_PROCESS_EMPTY,
    TINY_JOB,
    attrs,
    dashboard_queries,
    jaeger_chunks,
    jaeger_traces,
    poll,
    prom,
    query_data,
    running_stack,
    variable_values,
)

from otel_train import contract as c

ROOT = Path(__file__).resolve().parents[2]
RL_EXAMPLE = ROOT / "examples" / "rl_loop.py"
DEMO_STEPS = 200  # a few seconds on a CPU: several 0.5 s metric export intervals
GENERATORS = 2  # the RL example's generator processes
pytestmark = pytest.mark.stack

PLAIN = (
    textwrap.dedent("""
    import os, sys, time, torch, otel_train
""")
    + TINY_JOB
    + textwrap.dedent("""
    # A CPU has no datasheet peak: give one so MFU is exported like on a listed GPU.
    otel_train.instrument(model, optimizer=opt, dataloader=loader, peak_tflops=0.5)
    steps = int(sys.argv[1])
    done = 0
    while done < steps:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
            opt.zero_grad(); loss.backward()
            time.sleep(0.05)  # inside the step: the straggler rules score steps over 1 ms
            opt.step()
            otel_train.record(loss=loss.detach())
            done += 1
            if done == steps:
                break
    time.sleep(float(sys.argv[2]))   # keep /metrics up for Prometheus's scrape
    assert otel_train.shutdown(), "shutdown missed its deadline"
""")
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_stack(tmp_path_factory.mktemp("stack-run")) as running:
        yield running


def job_env(stack: Any, service: str, prometheus: bool, export_interval: str | None) -> dict:
    env = clean_job_env()
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
            "OTEL_SERVICE_NAME": service,
            "OTEL_TRAIN_TRACE_STEPS": "all",
            "OTEL_TRAIN_CONSOLE": "off",
            "OTEL_TRAIN_PROMETHEUS": "true" if prometheus else "false",
            # The port this stack's Prometheus scrapes (scripts/stack env hands out the same).
            "OTEL_TRAIN_PROMETHEUS_PORT": str(stack["ports"]["TRAINING_METRICS"]),
        }
    )
    if export_interval is not None:
        env["OTEL_TRAIN_METRIC_EXPORT_INTERVAL"] = export_interval
    return env


def finished(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def runs(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("jobs")
    tag = uuid.uuid4().hex[:8]
    plain, rl, demo = f"e2e-plain-{tag}", f"e2e-rl-{tag}", f"e2e-demo-{tag}"
    start = time.time()
    (tmp / "plain.py").write_text(PLAIN)

    def start_job(args: list[str], env: dict) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd=tmp,  # (their run records)
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    # The RL example as a user runs it, with generator processes: its default length, the
    # default 10 s export interval; it must span several intervals for the dashboards'
    # rate()s to have data.
    rl_job = start_job(
        [str(RL_EXAMPLE), "--generators", str(GENERATORS)], job_env(stack, rl, False, None)
    )
    # The demo as `make demo` runs it, with its console. --cpu: the CPU-run assertions
    # below hold on a GPU machine too. A CPU has no datasheet peak: MFU needs one, given
    # through the environment as a user would, like the plain run's peak_tflops.
    demo_env = job_env(stack, demo, False, "0.5")
    demo_env.update({"OTEL_TRAIN_CONSOLE": "stderr", "OTEL_TRAIN_PEAK_TFLOPS": "0.5"})
    demo_job = start_job(
        ["-m", "otel_train.cli", "demo", "--steps", str(DEMO_STEPS), "--cpu"], demo_env
    )
    # The plain run also serves /metrics, which the stack's Prometheus scrapes, and stays
    # up past one 15 s scrape interval; it spans several 0.5 s export intervals.
    plain_job = start_job([str(tmp / "plain.py"), "40", "17"], job_env(stack, plain, True, "0.5"))
    finished(plain_job)
    demo_out = finished(demo_job)
    assert f"{DEMO_STEPS} steps on cpu; OTLP export on" in demo_out, demo_out
    assert f"otel-train run summary: {DEMO_STEPS} steps" in demo_out, demo_out
    # `make demo` ends by naming its run record and the command that makes its report.
    record = re.search(r"^otel-train demo: its report page: (\S+) report (\S+)$", demo_out, re.M)
    assert record and Path(record.group(2)).is_dir(), demo_out[-2000:]
    assert demo_out.rstrip().endswith(record.group(0)), demo_out[-2000:]
    iterations = re.search(r"^(\d+) iterations;", finished(rl_job), re.M)
    assert iterations, "the RL example did not report its iterations"
    return {
        "plain": plain,
        "rl": rl,
        "generators": [f"{rl}-generator-{i}" for i in range(GENERATORS)],
        "demo": demo,
        "start": start,
        "steps": {"plain": 40, "rl": int(iterations.group(1)), "demo": DEMO_STEPS},
    }


# (samples, tokens) of every step: 16 rows of 8 token ids; the demo's 16 of 64.
BATCH = {"plain": (16, 16 * 8), "demo": (16, 16 * 64)}


@pytest.mark.parametrize(
    ("kind", "phases"),
    [
        ("plain", {"data", "forward", "backward", "optimizer"}),
        ("demo", {"data", "forward", "backward", "optimizer"}),
        ("rl", {"rollout", "train", "optimizer", "weight_sync"}),
    ],
)
def test_jaeger_holds_the_step_phase_trees(
    stack: Any, runs: dict[str, Any], kind: str, phases: set[str]
) -> None:
    n = runs["steps"][kind]

    def steps_seen() -> list[dict[str, Any]]:
        spans = jaeger_traces(stack, runs[kind], runs["start"])
        roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
        return spans if len(roots) >= n else []

    spans = poll(steps_seen, f"{n} step traces of {runs[kind]} in Jaeger")
    roots = [s for s in spans if s["name"] == c.STEP_SPAN.name]
    assert sorted(int(attrs(r)[c.STEP_INDEX.key]) for r in roots) == list(range(n))
    service = _services(stack, runs[kind], runs["start"])
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["traceId"], []).append(s)
    for root in roots:
        assert not root.get("parentSpanId")
        kids = [s for s in by_trace[root["traceId"]] if s.get("parentSpanId") == root["spanId"]]
        assert {k["name"] for k in kids} == phases
        own = [k for k in kids if service[k["spanId"]] == runs[kind]]
        assert {k["name"] for k in own} == phases
        for k in own:
            a = attrs(k)
            assert a[c.PHASE_NAME.key] == k["name"]
            assert a[c.PHASE_CLOCK.key] == "host"
            assert float(a[c.PHASE_HOST_DURATION.key]) > 0
            assert c.PHASE_DEVICE_DURATION.key not in a  # CPU run: absent, never zero
            assert int(k["startTimeUnixNano"]) >= int(root["startTimeUnixNano"])
            assert int(k["endTimeUnixNano"]) <= int(root["endTimeUnixNano"])
        # The generators' rollouts (made while the step learns from the last ones: they
        # may end after it) and weight loads under the step that asked for them.
        remote = sorted((service[k["spanId"]], k["name"]) for k in kids if k not in own)
        if kind == "rl":
            index = int(attrs(root)[c.STEP_INDEX.key])
            made = (["rollout"] * (2 if index == 0 else 1)) + ["weight_sync"]
            assert remote == [(g, name) for g in runs["generators"] for name in made]
        else:
            assert remote == []
        ra = attrs(root)
        assert int(ra[c.RANK.key]) == 0
        if kind in BATCH:
            assert (int(ra[c.STEP_SAMPLES.key]), int(ra[c.STEP_TOKENS.key])) == BATCH[kind]


def _services(stack: Any, job: str, start: float) -> dict[str, str]:
    """The service.name of every span in the job's traces, by span id."""
    return {
        span["spanId"]: attrs(rs.get("resource", {}))["service.name"]
        for rs in jaeger_chunks(stack, job, start)
        for ss in rs.get("scopeSpans", [])
        for span in ss.get("spans", [])
    }


@pytest.mark.parametrize("kind", sorted(BATCH))
def test_prometheus_holds_phase_memory_and_throughput_series(
    stack: Any, runs: dict[str, Any], kind: str
) -> None:
    job, n = runs[kind], runs["steps"][kind]
    sel = f'{{job="{job}"}}'
    phase = c.prometheus_base_name(c.PHASE_DURATION)
    result = poll(
        lambda: prom(
            stack, "/api/v1/query", query=f"histogram_count(last_over_time({phase}{sel}[10m]))"
        )["result"],
        "phase duration series",
    )
    per_phase = {r["metric"]["phase"]: float(r["value"][1]) for r in result}
    assert per_phase == {p: float(n) for p in ("data", "forward", "backward", "optimizer")}
    assert {r["metric"]["otel_train_rank"] for r in result} == {"0"}
    for spec in (
        c.PROCESS_MEMORY_RSS,
        c.STEPS,
        c.SAMPLES,
        c.TOKENS,
    ):
        got = prom(
            stack, "/api/v1/query", query=f"max_over_time({c.prometheus_base_name(spec)}{sel}[10m])"
        )["result"]
        assert got, f"no {spec.name} series"
        assert float(got[0]["value"][1]) > 0
    total = prom(
        stack,
        "/api/v1/query",
        query=f"max_over_time({c.prometheus_base_name(c.SAMPLES)}{sel}[10m])",
    )["result"]
    assert float(total[0]["value"][1]) == n * BATCH[kind][0]


def _samples(stack: Any, spec: Any, job: str) -> dict[str, dict[int, float]]:
    """A counter's raw samples as Prometheus stored them ({ms: value}), by series (its
    category, "" if none)."""
    query = f'{c.prometheus_base_name(spec)}{{job="{job}"}}[15m]'
    return {
        r["metric"].get(c.A_CATEGORY, ""): {round(float(t) * 1e3): float(v) for t, v in r["values"]}
        for r in prom(stack, "/api/v1/query", query=query)["result"]
    }


@pytest.mark.parametrize("kind", sorted(BATCH))
def test_the_derived_figures_equal_the_runs_own_counters(
    stack: Any, runs: dict[str, Any], kind: str
) -> None:
    """Each figure Prometheus derives (contract.DERIVED; the memory and peak ones:
    tests/stack/test_stack_lifecycle.py), queried as a dashboard queries it, against the
    same figure computed here from the run's counters: between two export times every
    counter has a sample at (the window ends on one and starts a millisecond before the
    other, so rate() extrapolates by that millisecond only), and goodput at the last."""
    job, n = runs[kind], runs["steps"][kind]
    poll(
        lambda: max(_samples(stack, c.SAMPLES, job)[""].values()) == n * BATCH[kind][0],
        "the last samples counter",
    )
    counters = {"samples": _samples(stack, c.SAMPLES, job)[""],
                "tokens": _samples(stack, c.TOKENS, job)[""],
                **_samples(stack, c.RUN_TIME, job)}  # fmt: skip
    assert {"samples", "tokens", "train", "data"} <= set(counters), sorted(counters)
    common = sorted(set.intersection(*(set(v) for v in counters.values())))
    assert len(common) >= 3, common
    t0, t1 = common[0], common[-1]

    def delta(name: str) -> float:
        return counters[name][t1] - counters[name][t0]

    def latest(series: dict[int, float]) -> float:
        return series[max(t for t in series if t <= t1)]

    seconds = (t1 - t0) / 1e3
    train = latest(counters["train"])
    wall = sum(latest(counters[k]) for k in counters if k not in ("samples", "tokens"))
    expected = {
        c.DERIVED_THROUGHPUT_SAMPLES.name: (delta("samples") / seconds, 1e-3),
        c.DERIVED_THROUGHPUT_TOKENS.name: (delta("tokens") / seconds, 1e-3),
        c.DERIVED_DATA_STALL.name: (delta("data") / (delta("train") + delta("data")), 1e-3),
        c.DERIVED_GOODPUT.name: (train / wall, 1e-6),
    }
    for d in c.DERIVED:
        if d.name not in expected:  # (CUDA only)
            continue
        query = d.query(f'job="{job}"', "otel_train_rank", f"{t1 - t0 + 1}ms")
        got = prom(stack, "/api/v1/query", query=query, time=f"{t1 / 1e3:.3f}")["result"]
        assert [r["metric"] for r in got] == [{"otel_train_rank": "0"}], d.name
        value, rel = expected[d.name]
        assert float(got[0]["value"][1]) == pytest.approx(value, rel=rel), d.name
    assert {d.name for d in c.DERIVED} - set(expected) == {
        c.DERIVED_PHASE_MEMORY_UTILIZATION.name,
        c.DERIVED_DEVICE_PEAK_FLOPS.name,
    }


@pytest.mark.parametrize("kind", sorted(BATCH))
def test_histograms_are_native_and_a_rank_has_few_series(
    stack: Any, runs: dict[str, Any], kind: str
) -> None:
    """The duration histograms arrive as exponential histograms and are stored as native
    histograms: one series per histogram, no _bucket/_sum/_count series; so a rank has a
    few dozen series, where classic buckets gave it 24 per histogram (docs/scale.md)."""
    job = runs[kind]
    for spec in (c.STEP_DURATION, c.PHASE_DURATION):
        name = c.prometheus_base_name(spec)
        result = prom(stack, "/api/v1/query", query=f'last_over_time({name}{{job="{job}"}}[10m])')
        assert result["result"], f"no {name} series"
        for r in result["result"]:
            assert "histogram" in r and "value" not in r, r  # a native histogram sample
        classic = prom(stack, "/api/v1/series", **{"match[]": f'{{__name__=~"{name}_.+"}}'})
        assert not [x for x in classic if x.get("otel_train_source") != "scrape"], classic
    series = prom(
        stack,
        "/api/v1/series",
        **{"match[]": f'{{job="{job}", __name__!~".*:.*"}}', "start": str(runs["start"] - 60)},
    )  # what the job sent, without the rules' recorded series
    assert {x["otel_train_rank"] for x in series} == {"0"}
    names = [x["__name__"] for x in series]
    durations = {c.prometheus_base_name(s) for s in (c.STEP_DURATION, c.PHASE_DURATION)}
    assert len([n for n in names if n in durations]) == 1 + 4  # the step, 4 phases
    # At most SERIES_PER_RANK a rank (tests/series_budget.py, docs/scale.md), on a GPU too:
    # these CPU runs have tokens and MFU; CUDA adds each phase's allocated and reserved
    # peaks and the device's memory limit. The deprecated aliases of renamed metrics are
    # sent beside them for one release only.
    aliases = {c.prometheus_base_name(old) for old, _ in c.DEPRECATED_METRICS}
    assert aliases & set(names)  # (still sent in this release)
    hangs = {c.prometheus_base_name(s) for s in (c.PROGRESS_AGE, c.PROGRESS_LIMIT)}
    assert hangs <= set(names)
    count = len([n for n in names if n not in aliases]) + CUDA_ONLY_SERIES
    assert count <= SERIES_PER_RANK, sorted(names)


@pytest.mark.parametrize("kind", sorted(BATCH))
def test_exemplars_point_at_exported_traces(stack: Any, runs: dict[str, Any], kind: str) -> None:
    job = runs[kind]
    step = c.prometheus_base_name(c.STEP_DURATION)
    data = poll(
        lambda: prom(
            stack,
            "/api/v1/query_exemplars",
            query=f'{step}{{job="{job}"}}',
            start=str(runs["start"] - 60),
            end=str(time.time() + 60),
        ),
        "exemplars",
    )
    trace_ids = {e["labels"]["trace_id"] for series in data for e in series["exemplars"]}
    jaeger_ids = {s["traceId"] for s in jaeger_traces(stack, job, runs["start"])}
    assert trace_ids and trace_ids <= jaeger_ids


# Each dashboard and the runs it is meant for (the 2-rank job: tests/e2e/test_torchrun_ranks.py).
MEANT_FOR = {"training-overview": ["plain", "demo"], "rl-loop": ["rl"]}
CASES = [
    (name, kind, panel, expr)
    for name, kinds in MEANT_FOR.items()
    for kind in kinds
    for panel, expr in dashboard_queries(name)
    if panel.split(" [")[0] not in SINGLE_PROCESS_EMPTY
]


@pytest.mark.parametrize(
    ("dashboard", "kind", "panel", "expr"),
    CASES,
    ids=[f"{d}:{k}:{p}" for d, k, p, _ in CASES],
)
def test_every_dashboard_query_returns_data_from_the_run(
    stack: Any, runs: dict[str, Any], dashboard: str, kind: str, panel: str, expr: str
) -> None:
    assert poll(
        lambda: query_data(stack, expr, runs[kind], runs["start"]),
        f"data for {dashboard} / {panel} from the {kind} run",
        timeout=30,
    )


def test_dashboard_variables_offer_the_training_jobs_only(stack: Any, runs: dict[str, Any]) -> None:
    # Wait for the scrape of the in-process /metrics: its job must not be offered.
    steps = c.prometheus_base_name(c.STEPS)
    poll(
        lambda: prom(stack, "/api/v1/query", query=f'{steps}{{otel_train_source="scrape"}}[10m]')[
            "result"
        ],
        "a scrape of the in-process /metrics",
    )
    start = runs["start"]
    overview = variable_values(stack, "training-overview", "job", start)
    assert {runs["plain"], runs["demo"], runs["rl"]} <= set(overview), overview
    assert "otel-train-inprocess" not in overview, overview
    rl = variable_values(stack, "rl-loop", "job", start)
    assert runs["rl"] in rl
    assert not {runs["plain"], runs["demo"], "otel-train-inprocess"} & set(rl), rl
    # The generators are no job of either: their figures show in the trainer's panels.
    assert not set(runs["generators"]) & (set(rl) | set(overview)), (rl, overview)
    for dashboard, kind in (
        ("training-overview", "plain"),
        ("training-overview", "demo"),
        ("rl-loop", "rl"),
    ):
        ranks = variable_values(stack, dashboard, "rank", start, job=runs[kind])
        assert ranks == ["0"], (dashboard, ranks)


def test_scraped_series_are_labelled_and_not_double_counted(
    stack: Any, runs: dict[str, Any]
) -> None:
    steps = c.prometheus_base_name(c.STEPS)
    scraped = poll(
        lambda: prom(
            stack,
            "/api/v1/query",
            query=f'max_over_time({steps}{{otel_train_source="scrape"}}[10m])',
        )["result"],
        "a scrape of the in-process /metrics",
    )
    assert all(r["metric"]["job"] == "otel-train-inprocess" for r in scraped)
    # /metrics serves classic histograms; Prometheus stores them as native histograms with
    # custom buckets (convert_classic_histograms_to_nhcb), the bounds of the contract.
    step = c.prometheus_base_name(c.STEP_DURATION)
    (native,) = prom(
        stack, "/api/v1/query", query=f'last_over_time({step}{{otel_train_source="scrape"}}[10m])'
    )["result"]
    bounds = {float(b[2]) for b in native["histogram"][1]["buckets"]}
    assert bounds <= set(c.DURATION_BUCKETS) | {float("inf")}, bounds
    otlp = prom(
        stack,
        "/api/v1/query",
        query=f'max_over_time({steps}{{job="{runs["plain"]}", otel_train_source=""}}[10m])',
    )["result"]
    assert [float(r["value"][1]) for r in otlp] == [40.0]
