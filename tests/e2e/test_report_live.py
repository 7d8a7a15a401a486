"""``otel-train report --prometheus URL --jaeger URL --job JOB`` against the real stack:
the RL example with a generator process exports over OTLP and writes its run records
too; the page made from the live stack holds what the page made from the records holds
(one implementation draws both): the run summary with the generator's ``rollout
[generator]`` row, line for line; every chart's run figures; the traced steps'
waterfalls with the generator's rollouts in them. Bad use is a clear error. ``compare``
of two live jobs whose set-up differs names what differs, as it does for their records.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from scratch import job_env
from stack_helpers import ROOT, jaeger_traces, poll, prom, running_stack

from otel_train import contract as c

pytestmark = pytest.mark.stack
ITERATIONS = 40
GAUGES = ("memory", "mfu", "tflops")  # charts of gauges
COMPARE_JOB = ROOT / "tests" / "unit" / "compare_job.py"


def _page_data(path: Path) -> dict[str, Any]:
    found = re.search(r'<script id="report-data" type="application/json">(.*?)</script>',
                      path.read_text(), re.S)  # fmt: skip
    assert found, path
    return json.loads(found.group(1).replace("<\\/", "</"))  # type: ignore[no-any-return]


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_train.cli", "report", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_train.cli", "compare", *args, "--json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _exported(stack: dict[str, Any], service: str, steps: int) -> None:
    """Wait for the job's last steps in Prometheus and its traced steps in Jaeger."""
    query = f'{c.prometheus_base_name(c.STEPS)}{{job="{service}"}}'

    def counted() -> bool:
        found = prom(stack, "/api/v1/query", query=query)["result"]
        return any(float(r["value"][1]) >= steps for r in found)

    def traced() -> bool:
        spans = jaeger_traces(stack, service, time.time() - 600)
        return len({s["traceId"] for s in spans if s["name"] == c.STEP_SPAN.name}) >= steps

    poll(counted, f"{service}'s steps in Prometheus")
    poll(traced, f"{service}'s traces")


def _two_jobs(stack: dict[str, Any], tmp: Path, urls: list[str]) -> tuple[Any, Any]:
    """Two runs of compare_job.py that differ in their set-up (B's model compiled, its
    metric_export_interval longer), exported to the stack and recorded: ``compare`` of
    the live jobs and of their records."""
    name = f"live-cmp-{uuid.uuid4().hex[:8]}"
    jobs = {f"{name}-a": (), f"{name}-b": ("--compile", "--export-interval", "0.5")}
    endpoint = f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}"
    started = []
    with contextlib.ExitStack() as files:
        for service, args in jobs.items():
            env = {**job_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                   "OTEL_SERVICE_NAME": service, "OTEL_TRAIN_RUN_ID": service}  # fmt: skip
            log = files.enter_context((tmp / f"{service}.log").open("w"))
            started.append(subprocess.Popen([sys.executable, str(COMPARE_JOB), str(tmp), *args],
                                            env=env, stdout=log, stderr=log))  # fmt: skip
        codes = [job.wait(timeout=300) for job in started]
    for code, service in zip(codes, jobs, strict=True):
        assert code == 0, (tmp / f"{service}.log").read_text()[-2000:]
    for service in jobs:
        _exported(stack, service, 40)  # (compare_job.py's steps)
    live = _compare("--prometheus", urls[0], "--jaeger", urls[1], "--last", "600", *jobs)
    records = [str(next(tmp.glob(f"*-{service}"))) for service in jobs]
    return live, _compare(*records)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("live")
    service = f"live-rl-{uuid.uuid4().hex[:8]}"
    with running_stack(tmp / "stack") as stack:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
                   OTEL_SERVICE_NAME=service, OTEL_TRAIN_TRACE_STEPS="all",
                   OTEL_TRAIN_METRIC_EXPORT_INTERVAL="0.5", OTEL_TRAIN_CONSOLE="off")  # fmt: skip
        args = ["--iterations", str(ITERATIONS), "--generators", "1"]
        example = [sys.executable, str(ROOT / "examples" / "rl_loop.py"), *args]
        job = subprocess.run(example, env=env, cwd=tmp, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        assert job.returncode == 0, job.stdout + job.stderr
        (record,) = [d for d in (tmp / "otel-train-runs").iterdir() if "-generator-" not in d.name]
        steps = c.prometheus_base_name(c.STEPS)
        poll(lambda: prom(stack, "/api/v1/query", query=f'{steps}{{job="{service}"}}')["result"],
             "the job's steps in Prometheus")  # fmt: skip

        def traced() -> bool:
            spans = jaeger_traces(stack, service, time.time() - 600)
            return len({s["traceId"] for s in spans if s["name"] == c.STEP_SPAN.name}) >= ITERATIONS

        poll(traced, "its traces")
        time.sleep(2)  # the last exports of the generator
        urls = [f"http://127.0.0.1:{stack['ports'][p]}" for p in ("PROMETHEUS", "JAEGER_UI")]
        live = _report("--prometheus", urls[0], "--jaeger", urls[1], "--job", service,
                       "--last", "10m", "-o", str(tmp / "live.html"))  # fmt: skip
        assert live.returncode == 0, live.stderr
        live_compare = _compare("--prometheus", urls[0], "--jaeger", urls[1], "--last", "600",
                                service, service)  # fmt: skip
        two_jobs = _two_jobs(stack, tmp, urls)
        bad = [_report("--prometheus", urls[0], "--job", "no-such-job", "-o", str(tmp / "x")),
               _report("--prometheus", urls[0]), _report(str(record), "--job", service),
               _report("--prometheus", "http://127.0.0.1:1", "--job", service)]  # fmt: skip
    made = _report(str(record), "-o", str(tmp / "record.html"))
    assert made.returncode == 0, made.stderr
    compared = (live_compare, _compare(str(record), str(record)))
    return {"live": _page_data(tmp / "live.html"), "record": _page_data(tmp / "record.html"),
            "bad": bad, "service": service, "compare": compared,
            "two jobs": two_jobs}  # fmt: skip


def test_the_live_page_has_the_records_summary_with_the_generators_row(pages: Any) -> None:
    live, record = pages["live"]["summary"], pages["record"]["summary"]
    assert live == record
    (row,) = [line.split() for line in live.splitlines() if line.startswith("rollout [")]
    assert row[:2] == ["rollout", "[generator]"]
    assert row[4:6] == ["-", str(ITERATIONS + 1)]  # all it made: one ahead at the first step


def test_the_live_page_has_the_records_figures(pages: Any) -> None:
    def figures(data: dict[str, Any]) -> dict[str, dict[str, float]]:
        return {ch["id"]: {g["label"]: g["value"] for g in ch["figures"]} for ch in data["charts"]}

    live, record = figures(pages["live"]), figures(pages["record"])
    assert set(live) == set(record) >= {"step", "phases", "shares", "memory", "scalars"}
    for cid, values in record.items():
        assert set(live[cid]) == set(values), cid
        # Counters and histograms end on the same values in both; a gauge (resident
        # memory) is read by each exporter's reader at its own last collection.
        rel = 0.05 if cid in GAUGES else 1e-6
        for label, value in values.items():
            assert live[cid][label] == pytest.approx(value, rel=rel), (cid, label)
    for ch in pages["live"]["charts"]:  # the live stack holds many more points than the record
        if ch["id"] in ("step", "phases"):
            assert max(len([v for v in s["values"] if v is not None]) for s in ch["series"]) >= 3


def test_the_live_page_has_the_records_waterfalls_with_the_generators_rollouts(
    pages: Any,
) -> None:
    def rows(data: dict[str, Any]) -> list[tuple[int, list[str]]]:
        return [(w["index"], sorted(p["name"] for p in w["phases"])) for w in data["waterfalls"]]

    live, record = rows(pages["live"]), rows(pages["record"])
    assert live == record
    assert len(live) == min(60, ITERATIONS)
    for index, names in live:
        made = ["rollout [generator]"] * (2 if index == 0 else 1)
        assert names == sorted(["rollout", "train", "optimizer", "weight_sync",
                                "weight_sync [generator]", *made]), index  # fmt: skip


def test_bad_use_is_a_clear_error(pages: Any) -> None:
    no_job, no_job_given, job_without_stack, no_stack = pages["bad"]
    assert no_job.returncode == 1 and "no series of job 'no-such-job'" in no_job.stderr
    assert no_job_given.returncode == 2 and "--prometheus needs --job" in no_job_given.stderr
    assert job_without_stack.returncode == 2 and "go with --prometheus" in job_without_stack.stderr
    assert no_stack.returncode == 1 and "cannot read http://127.0.0.1:1/" in no_stack.stderr


def test_compare_reads_a_live_job_as_it_reads_its_record(pages: Any) -> None:
    """``otel-train compare --prometheus URL --jaeger URL JOB JOB``: the job's steady steps
    from Jaeger's traces are the record's, figure for figure; a run against itself is
    within noise everywhere."""
    done = [json.loads(x.stdout) if x.returncode == 0 else x.stderr for x in pages["compare"]]
    live, record = done
    assert isinstance(live, dict) and isinstance(record, dict), done
    assert live["a"]["unit"] == record["a"]["unit"] == "step"
    assert (live["a"]["steady"], live["a"]["left_out"]) == (
        record["a"]["steady"], record["a"]["left_out"])  # fmt: skip
    assert [r["metric"] for r in live["rows"]] == [r["metric"] for r in record["rows"]]
    for mine, theirs in zip(live["rows"], record["rows"], strict=True):
        assert mine["a_median"] == pytest.approx(theirs["a_median"], rel=1e-6), mine["metric"]
        assert mine["verdict"] == "within noise", mine
    assert live["verdicts"] == record["verdicts"]


def test_compare_names_what_differs_in_two_live_jobs_as_in_their_records(pages: Any) -> None:
    """The run facts of a live job: those known at start from target_info (the changed
    setting), the compile state from its gauge; the same differences as the records'."""
    done = [json.loads(x.stdout) if x.returncode == 0 else x.stderr for x in pages["two jobs"]]
    live, record = done
    assert isinstance(live, dict) and isinstance(record, dict), done
    named = {d["name"]: (d["a"], d["b"]) for d in live["settings"]}
    assert named["torch.compile"] == (False, True)
    assert named["setting metric_export_interval"] == ("0.2", "0.5")
    assert live["settings"] == record["settings"]
