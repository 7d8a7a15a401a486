"""Step timelines for Perfetto, read by a real parser of the Chrome trace event format:
TracerBench's ``@tracerbench/trace-model`` (npm), which builds processes, threads and
nested events from a trace as Chrome's tooling does. A loop trains with the embedded
default and ``profile_steps``; ``otel-train timeline`` writes the file; the parser finds a
process per rank with its step events, the phases nested in them, and the profiler's
kernels (here CPU operators) merged on the same clock, inside the steps they ran in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from scratch import job_env

from otel_train import contract as c

TRACE_MODEL = "@tracerbench/trace-model@8.0.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "otel-train" / "npm"

JOB = textwrap.dedent("""
    import sys, torch, otel_train
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randn(256, 4))
    loader = torch.utils.data.DataLoader(ds, batch_size=16)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, run_dir=sys.argv[1],
                          prometheus=False, console="off", trace_steps="all",
                          profile_steps="3-4", debug_dir=sys.argv[2])
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    assert otel_train.shutdown()
""")

PARSE = """
const { buildModel } = require("@tracerbench/trace-model");
const model = buildModel(JSON.parse(require("fs").readFileSync(process.argv[2], "utf8")));
console.log(JSON.stringify(model.processes.map(p => ({
  pid: p.id, name: p.name,
  threads: p.threads.map(t => ({ name: t.name, events: t.events.filter(e => e.ph === "X").map(
    e => ({ name: e.name, start: e.start, end: e.end, args: e.args || {},
            parent: e.parent ? e.parent.name : null })) })),
}))));
"""


def _trace_model() -> Path:
    """The parser, installed from the npm registry into a cache directory once."""
    if (CACHE / "node_modules" / "@tracerbench" / "trace-model").is_dir():
        return CACHE
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        if os.environ.get("OTEL_TRAIN_BROWSER_REQUIRED") == "1":
            pytest.fail("node and npm are needed for the trace parser")
        pytest.skip("node and npm are needed for the trace parser")
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund",
                    TRACE_MODEL], check=True, capture_output=True, timeout=300)  # fmt: skip
    return CACHE


def test_the_timeline_parses_with_steps_phases_and_the_profiler_on_one_clock(
    tmp_path: Path,
) -> None:
    _trace_model()  # (before the job: fail early without node)
    env = job_env()
    job = subprocess.run([sys.executable, "-c", JOB, str(tmp_path / "runs"),
                          str(tmp_path / "debug")], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    out = tmp_path / "steps.json"
    processes = _parse(tmp_path, run)
    by_name = {p["name"].split(" (")[0]: p for p in processes}
    assert {"rank 0", "rank 0 profiler"} <= set(by_name), list(by_name)

    threads = {t["name"]: t["events"] for t in by_name["rank 0"]["threads"]}
    steps = [e for e in threads["steps (host)"] if e["name"] == c.STEP_SPAN.name]
    assert len(steps) == 16  # trace_steps="all": every step of the epoch
    phases = [e for e in threads["steps (host)"] if e["name"] != c.STEP_SPAN.name]
    assert {e["name"] for e in phases} == {"data", "forward", "backward", "optimizer"}
    loose = [e for e in phases if e["parent"] != c.STEP_SPAN.name]
    assert not loose, loose[:3]  # nested in their steps by the parser

    covered = [s for s in steps if s["args"].get(c.STEP_INDEX.key) in ("3", "4")]
    lo, hi = min(s["start"] for s in covered), max(s["end"] for s in covered)
    kernels = [e for t in by_name["rank 0 profiler"]["threads"] for e in t["events"]
               if e["name"].startswith("aten::")]  # fmt: skip
    assert kernels
    slack = 2_000  # us: the profiler starts as step 3 begins and stops as step 4 ends
    outside = [k for k in kernels if not lo - slack <= k["start"] <= k["end"] <= hi + slack]
    assert not outside, (lo, hi, outside[:3])
    assert json.loads(out.read_text())["otherData"]["profiler_traces"]


def _parse(tmp_path: Path, run: Path) -> list[dict[str, Any]]:
    """``otel-train timeline`` of ``run``, read back by the trace-model parser."""
    modules = _trace_model()
    out = tmp_path / "steps.json"
    made = subprocess.run([sys.executable, "-m", "otel_train.cli", "timeline", str(run), "-o",
                           str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    script = tmp_path / "parse.js"
    script.write_text(PARSE)
    node_env = {**os.environ, "NODE_PATH": str(modules / "node_modules")}
    parsed = subprocess.run(["node", str(script), str(out)], capture_output=True, text=True,
                            timeout=120, env=node_env)  # fmt: skip
    assert parsed.returncode == 0, parsed.stderr
    return json.loads(parsed.stdout)  # type: ignore[no-any-return]


def test_the_timeline_shows_the_generators_rollouts(tmp_path: Path) -> None:
    """examples/rl_loop.py with a generator process: the trainer's run directory's
    timeline has the generator (its record beside the trainer's) as a process of its own,
    its rollouts named as in the console (``rollout [generator]``), one per rollout it made
    (every step traced, so every carrier sampled)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_SERVICE_NAME="timeline-rl", OTEL_TRAIN_TRACE_STEPS="all",
               OTEL_TRAIN_CONSOLE="off")  # fmt: skip
    example = Path(__file__).resolve().parents[2] / "examples" / "rl_loop.py"
    args = [sys.executable, str(example), "--iterations", "20", "--generators", "1"]
    job = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    runs = sorted((tmp_path / "otel-train-runs").iterdir())
    (trainer,) = [r for r in runs if "-generator-" not in r.name]
    assert len(runs) == 2, runs  # the generator's record, beside the trainer's
    by_name = {p["name"]: p for p in _parse(tmp_path, trainer)}
    assert set(by_name) == {"rank 0 (timeline-rl)", "generator 0 (timeline-rl-generator-0)"}
    threads = {t["name"]: t for t in by_name["generator 0 (timeline-rl-generator-0)"]["threads"]}
    names = [e["name"] for e in threads["phases [generator] (host)"]["events"]]
    assert names.count("rollout [generator]") == 21  # two at the first step, then one each
    assert names.count("weight_sync [generator]") == 20
    steps = {t["name"]: t["events"] for t in by_name["rank 0 (timeline-rl)"]["threads"]}
    assert len([e for e in steps["steps (host)"] if e["name"] == c.STEP_SPAN.name]) == 20
