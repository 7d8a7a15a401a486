"""`opentelemetry-instrument python train.py`: copies of the examples with every
otel_train call taken out run under the real `opentelemetry-instrument` (the SDK
configured by opentelemetry-distro from OTEL_* variables) into a real Collector on
loopback (tests/faults/collector_helpers.py), which prints everything it receives.

- the steps, phases and metrics of each copy arrive, with the counts its loop makes;
- with OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=otel_train nothing of ours arrives (the
  user's own span still does);
- the resource detector (OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=otel_train) puts the
  rank on the resource;
- an unmodified example (its own configure()/instrument()) under
  `opentelemetry-instrument` is instrumented once, not twice.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.stack

TESTS = Path(__file__).resolve().parents[1]
EXAMPLES = TESTS.parent / "examples"
CLI = Path(sys.executable).parent / "opentelemetry-instrument"
if str(TESTS / "faults") not in sys.path:
    sys.path.insert(0, str(TESTS / "faults"))
from collector_helpers import job_env, metric_points, spans, started_collector  # noqa: E402
from required import DISTRO_SWITCH, missing  # noqa: E402

if str(TESTS / "unit") not in sys.path:
    sys.path.insert(0, str(TESTS / "unit"))
from mnist_loop import BATCH, ITERATIONS  # noqa: E402

# What each example's loop makes (its settings, not its output):
# plain_loop: 512 samples in batches of 32, 2 epochs -> 32 optimizer steps.
# hf_trainer: max_steps=8, gradient accumulation 2 (one fetch of both micro-batches a step).
# lightning_fit: 64 samples in batches of 8, 2 epochs, accumulate 2 -> 8 steps of 2 batches.
PLAIN = ("plain_loop.py", 32, {"data": 32, "forward": 32, "backward": 32, "optimizer": 32})
EXAMPLES_RUN = [
    PLAIN,
    ("hf_trainer.py", 8, {"data": 8, "microstep": 16, "forward": 16, "backward": 16,
                          "optimizer": 8}),
    ("lightning_fit.py", 8, {"data": 16, "microstep": 16, "forward": 16, "backward": 16,
                             "optimizer": 8}),
]  # fmt: skip
NEEDS = {"hf_trainer.py": "transformers", "lightning_fit.py": "lightning"}


def strip_otel_train(source: str) -> str:
    """The script without otel-train: every statement whose own text (a compound
    statement's header, its body aside) names ``otel_train``, or a name such a statement
    assigned, is taken out, in order; an emptied block becomes ``pass``."""
    gone = {"otel_train"}
    blocks = ("body", "orelse", "finalbody", "handlers")

    def own_names(stmt: ast.stmt) -> set[str]:
        fields = [v if isinstance(v, list) else [v] for f, v in ast.iter_fields(stmt)
                  if f not in blocks]  # fmt: skip
        parts = [x for field in fields for x in field if isinstance(x, ast.AST)]
        found = {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        return found

    def strip_block(block: list[ast.stmt]) -> list[ast.stmt]:
        kept: list[ast.stmt] = []
        for stmt in block:
            if own_names(stmt) & gone:
                gone.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                            and isinstance(n.ctx, ast.Store))  # fmt: skip
                continue
            for field in blocks:
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    setattr(stmt, field, strip_block(inner) or [ast.Pass()])
            kept.append(stmt)
        return kept

    tree = ast.parse(source)
    tree.body = strip_block(tree.body)
    out = ast.unparse(tree)
    assert "otel_train" not in out
    return out


def stripped(script: str, tmp_path: Path, tail: str = "") -> Path:
    path = tmp_path / script
    path.write_text(strip_otel_train((EXAMPLES / script).read_text()) + "\n" + tail)
    return path


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Any]:
    if not CLI.exists():
        missing(DISTRO_SWITCH, "opentelemetry-instrument (pip install 'otel-train[auto]')")
    with started_collector(tmp_path) as col:
        yield col


def run_instrumented(script: Path, collector: Any, **env_extra: str) -> str:
    """``opentelemetry-instrument python script`` to its end (exit 0, no traceback);
    then the Collector is stopped and everything it printed is returned."""
    env = job_env(collector.endpoint)
    env.update(
        OTEL_SERVICE_NAME=f"zero-code-{uuid.uuid4().hex[:8]}",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_LOGS_EXPORTER="none",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="otel_train",  # the rank on the resource
        HF_HUB_OFFLINE="1",
    )
    env.update(env_extra)
    done = subprocess.run([str(CLI), sys.executable, str(script)], env=env, cwd=script.parent,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    collector.stop()
    text: str = collector.output()
    return text


def histogram_counts(text: str, name: str, key: str = "") -> dict[str, int]:
    """The last count of each data point of a histogram, by its attribute ``key`` ("": all
    points under "")."""
    out: dict[str, int] = {}
    for block in re.split(r"^Metric #\d+\n", text, flags=re.M)[1:]:
        if not re.search(rf"^\s+-> Name: {re.escape(name)}$", block, re.M):
            continue
        for point in re.split(r"^HistogramDataPoints #\d+\n", block, flags=re.M)[1:]:
            value = re.search(rf"^\s+-> {re.escape(key)}: Str\((.*)\)$", point, re.M)
            count = re.search(r"^Count: (\d+)$", point, re.M)
            if count and (value or not key):
                out[value.group(1) if value else ""] = int(count.group(1))
    return out


def assert_counts(text: str, steps: int, phases: dict[str, int]) -> None:
    received = spans(text)
    assert sum(s.get("Name") == "otel_train.step" for s in received) == steps
    names = Counter(s["Name"] for s in received if s.get("Name") != "otel_train.step")
    assert names == phases
    assert metric_points(text, "otel_train.steps")[-1][1] == steps
    assert histogram_counts(text, "otel_train.step.duration") == {"": steps}
    assert histogram_counts(text, "otel_train.phase.duration", "phase") == phases


@pytest.mark.parametrize(("script", "steps", "phases"), EXAMPLES_RUN)
def test_an_unmodified_script_sends_its_steps_phases_and_metrics(
    collector: Any, tmp_path: Path, script: str, steps: int, phases: dict[str, int]
) -> None:
    if script in NEEDS:
        pytest.importorskip(NEEDS[script])
    text = run_instrumented(stripped(script, tmp_path), collector)
    assert_counts(text, steps, phases)
    assert re.search(r"^\s+-> otel_train\.rank: Int\(0\)$", text, re.M)  # (the detector)


def test_with_metrics_exporter_none_the_steps_are_still_traced(
    collector: Any, tmp_path: Path
) -> None:
    """``OTEL_METRICS_EXPORTER=none`` gives an SDK meter provider with no reader (issue 38:
    a TypeError, no spans, no table): the spans still arrive, no metric does."""
    script, steps, phases = PLAIN
    text = run_instrumented(stripped(script, tmp_path), collector, OTEL_METRICS_EXPORTER="none",
                            OTEL_TRAIN_CONSOLE="stderr")  # fmt: skip
    received = spans(text)
    assert sum(s.get("Name") == "otel_train.step" for s in received) == steps
    assert Counter(s["Name"] for s in received if s.get("Name") != "otel_train.step") == phases
    assert not metric_points(text, "otel_train.steps")


def test_disabled_the_instrumentation_sends_nothing_of_ours(collector: Any, tmp_path: Path) -> None:
    user_span = 'from opentelemetry import trace\ntrace.get_tracer("user").start_span("mine").end()'
    script = stripped(PLAIN[0], tmp_path, tail=user_span)
    text = run_instrumented(
        script,
        collector,
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="otel_train",
        OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="",
    )
    assert [s["Name"] for s in spans(text)] == ["mine"]  # the SDK ran; ours did not
    assert "otel_train" not in text


@pytest.mark.parametrize(("script", "steps", "phases"), [EXAMPLES_RUN[0], EXAMPLES_RUN[1]])
def test_an_explicit_instrument_under_opentelemetry_instrument_is_one_instrumentation(
    collector: Any, script: str, steps: int, phases: dict[str, int]
) -> None:
    if script in NEEDS:
        pytest.importorskip(NEEDS[script])
    text = run_instrumented(EXAMPLES / script, collector)
    assert_counts(text, steps, phases)  # not twice as many


def test_mnist_with_a_module_transform_and_spawned_workers(collector: Any, tmp_path: Path) -> None:
    """pytorch/examples' mnist shape (tests/unit/mnist_loop.py): ``Normalize`` is an
    ``nn.Module`` called in the dataset, here in a DataLoader worker started with
    ``spawn``, which runs under ``opentelemetry-instrument`` too (issue 38 item 10). Its
    calls are data: every step has its data phase and its batch's samples, and only the
    training process sends anything of ours."""
    script = tmp_path / "mnist_loop.py"
    script.write_text((TESTS / "unit" / "mnist_loop.py").read_text())
    text = run_instrumented(script, collector)
    phases = ("data", "forward", "backward", "optimizer")
    assert_counts(text, ITERATIONS, dict.fromkeys(phases, ITERATIONS))
    steps = [s for s in spans(text) if s.get("Name") == "otel_train.step"]
    assert {s["otel_train.step.samples"] for s in steps} == {str(BATCH)}
    assert metric_points(text, "otel_train.samples")[-1][1] == ITERATIONS * BATCH
    instances = set(re.findall(r"-> service\.instance\.id: Str\((.*)\)$", text, re.M))
    assert len(instances) == 1  # (no DataLoader worker recorded or exported)
