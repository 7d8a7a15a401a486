"""One trace across processes with Ray (issue 15): a local Ray cluster on the CPU
(``ray`` from PyPI, the ``ray`` extra), a generator actor with its own otel-train session
(role generator, its own sidecar and resource) and the trainer in the driver, both
exporting OTLP/HTTP to the real Collector on free loopback ports.

The trainer calls ``generator.generate.remote(prompts, otel_train.carrier(...))`` inside
each step and consumes the rollout one step later (off-policy, one version stale). Then
Jaeger holds, for every sampled carrier, one trace with the trainer's step span and the
actor's rollout under it, each with its own process's resource; the next step's span
links to that rollout; and Prometheus has the actor's rollouts and the staleness.

Without ray the module is skipped, or fails under OTEL_TRAIN_RAY_REQUIRED=1 (scripts/test
sets it: the test extra it installs has ray).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest
from scratch import job_env
from stack_helpers import attrs, poll, prom, running_stack
from test_carrier_e2e import _ids, _trace

from otel_train import contract as c

pytestmark = pytest.mark.stack
try:
    import ray  # noqa: F401  (the job below imports it; checked here)
except ImportError:
    # scripts/test installs the test extra, which has ray: there this test must run.
    if os.environ.get("OTEL_TRAIN_RAY_REQUIRED") == "1":
        pytest.fail("ray is missing: install the test extra (scripts/test does)", pytrace=False)
    pytest.skip("the ray extra is not installed", allow_module_level=True)
STEPS = 8

RUN = textwrap.dedent("""
    import json, sys, time
    import ray
    import otel_train

    @ray.remote
    class Generator:
        def __init__(self, service):
            otel_train.configure(service_name=service, role="generator", console="off",
                                 prometheus=False, metric_export_interval=0.5)

        def generate(self, prompts, carrier):
            with otel_train.phase("rollout", parent=carrier) as rollout:
                with otel_train.phase("generate"):
                    time.sleep(0.05)
            return [p * 2 for p in prompts], rollout.produced()

        def close(self):
            return otel_train.shutdown()

    if __name__ == "__main__":
        trainer, gen, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20)
        try:
            generator = Generator.remote(gen)
            otel_train.configure(service_name=trainer, role="trainer", console="off",
                                 prometheus=False, metric_export_interval=0.5,
                                 trace_window_seconds=0.3)
            carriers, tokens, previous = [], [], None
            for k in range(steps):
                with otel_train.step(samples=4):
                    carrier = otel_train.carrier(policy_version=k)
                    carriers.append(carrier)
                    with otel_train.phase("wait_rollout"):
                        rollout, token = ray.get(generator.generate.remote([k] * 4, carrier))
                    assert rollout == [2 * k] * 4
                    tokens.append(token)
                    if previous is not None:
                        otel_train.consumed(previous, policy_version=k)
                    previous = token
                    with otel_train.phase("train"):
                        time.sleep(0.02)
            assert ray.get(generator.close.remote(), timeout=60), "generator shutdown late"
            assert otel_train.shutdown(), "the trainer's shutdown missed its deadline"
        finally:
            ray.shutdown()
        print(json.dumps({"carriers": carriers, "tokens": tokens}))
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("ray")
    script = tmp / "rl_ray.py"
    script.write_text(RUN)
    tag = uuid.uuid4().hex[:8]
    names = {"trainer": f"ray-trainer-{tag}", "generator": f"ray-generator-{tag}"}
    with running_stack(tmp_path_factory.mktemp("ray-stack")) as stack:
        env = job_env(("OTEL_", "RAY_"))
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}"
        env["OMP_NUM_THREADS"] = "1"
        if env.get("PYTHONPATH"):  # (Ray's workers start elsewhere: no relative entries)
            paths = env["PYTHONPATH"].split(os.pathsep)
            env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
        env["RAY_USAGE_STATS_ENABLED"] = "0"  # no network: no usage report
        env["RAY_TMPDIR"] = str(tmp)  # the cluster's session files, removed with tmp
        cmd = [sys.executable, str(script), names["trainer"], names["generator"], str(STEPS)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        yield {"stack": stack, "names": names, **out}


def test_each_sampled_step_is_one_trace_with_the_actors_rollout_under_it(
    run: dict[str, Any],
) -> None:
    stack, names = run["stack"], run["names"]
    sampled = [c_ for c_ in run["carriers"] if _ids(c_)[2]]
    assert 1 <= len(sampled) < STEPS
    for carrier in sampled:
        trace_id, span_id, _ = _ids(carrier)

        def whole(trace_id: str = trace_id) -> Any:
            spans = _trace(stack, trace_id)
            got = {s["name"] for _, s in spans}
            return spans if {c.STEP_SPAN.name, "rollout", "generate", "train"} <= got else None

        by_name = {s["name"]: (r, s) for r, s in poll(whole, f"trace {trace_id}")}
        step_res, step = by_name[c.STEP_SPAN.name]
        assert step["spanId"] == span_id and step_res[c.RESOURCE_ROLE.key] == "trainer"
        assert step_res["service.name"] == names["trainer"]
        rollout_res, rollout = by_name["rollout"]
        assert rollout["parentSpanId"] == span_id
        assert rollout_res["service.name"] == names["generator"]
        assert rollout_res[c.RESOURCE_ROLE.key] == "generator"
        assert rollout_res["service.instance.id"] != step_res["service.instance.id"]
        assert by_name["generate"][1]["parentSpanId"] == rollout["spanId"]
        assert by_name["train"][1]["parentSpanId"] == span_id


def test_the_next_step_links_to_the_actors_rollout(run: dict[str, Any]) -> None:
    stack, carriers, tokens = run["stack"], run["carriers"], run["tokens"]
    linked = 0
    for k, carrier in enumerate(carriers[:-1]):
        if not _ids(carrier)[2]:
            continue
        consumer = carriers[k + 1]

        def step_span(consumer: dict[str, str] = consumer) -> Any:
            spans = _trace(stack, _ids(consumer)[0])
            return next((s for _, s in spans if s["name"] == c.STEP_SPAN.name), None)

        (link,) = poll(step_span, f"step {k + 1}'s span")["links"]
        assert (link["traceId"], link["spanId"]) == _ids(tokens[k])[:2]
        assert int(attrs(link)[c.LINK_STALENESS.key]) == 1
        linked += 1
    assert linked >= 1
    stale = c.prometheus_base_name(c.POLICY_STALENESS)  # (native histograms: one series)
    rollouts = c.prometheus_base_name(c.PHASE_DURATION)
    names = run["names"]
    for query, want in (
        (f'histogram_count(last_over_time({stale}{{job="{names["trainer"]}"}}[10m]))', STEPS - 1),
        (
            f'histogram_count(last_over_time({rollouts}{{job="{names["generator"]}", '
            f'phase="rollout", otel_train_role="generator"}}[10m]))',
            STEPS,
        ),
    ):

        def got(query: str = query, want: int = want) -> Any:
            result = prom(stack, "/api/v1/query", query=query)["result"]
            return result if result and float(result[0]["value"][1]) == want else None

        poll(got, query)
