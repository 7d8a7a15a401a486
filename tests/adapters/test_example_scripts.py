"""examples/ run as smoke tests: each exits 0 and prints the run summary; each exports
under the service the environment names (OTEL_SERVICE_NAME), else under its own name, to
a real Collector (the one of the fault tests, tests/faults/collector_helpers.py)."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scratch import job_env

TESTS = Path(__file__).resolve().parents[1]
EXAMPLES = TESTS.parent / "examples"


def _needs(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"needs {module}")  # fmt: skip


EXAMPLE_RUNS = [
    ("plain_loop.py", []),
    # Its default run spans several metric export intervals (about 30 s): the
    # end-to-end stack test runs that one; here a short run.
    ("rl_loop.py", ["--iterations", "20"]),
    ("rl_loop.py", ["--iterations", "20", "--generators", "1"]),  # and its generator's name
    pytest.param("hf_trainer.py", [], marks=_needs("transformers")),
    pytest.param("lightning_fit.py", [], marks=_needs("lightning")),
]


def run_example(script: str, args: list[str], **env_extra: str) -> str:
    """Run ``examples/<script>`` to its end with only ``env_extra`` of the OTel variables;
    it must exit 0 without a traceback. Its output."""
    env = job_env()
    env.update(HF_HUB_OFFLINE="1", **env_extra)
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                            text=True, timeout=300, env=env)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    return output


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Any]:
    """A real Collector on loopback that prints every resource it receives."""
    if str(TESTS / "faults") not in sys.path:
        sys.path.insert(0, str(TESTS / "faults"))
    from collector_helpers import started_collector

    with started_collector(tmp_path) as col:
        yield col


def service_names(collector: Any) -> set[str]:
    """The service.name of every resource the Collector received (stopped: all printed)."""
    collector.stop()
    return set(re.findall(r"^\s+-> service\.name: Str\((.*)\)$", collector.output(), re.M))


@pytest.mark.parametrize(("script", "args"), EXAMPLE_RUNS)
def test_example_runs_and_prints_the_summary(script: str, args: list[str]) -> None:
    out = run_example(script, args)
    assert "otel-train run summary" in out
    if "--generators" in args:  # the generator's rollouts, as the trainer consumed them
        assert re.search(r"^rollout \[generator\] .* - +20 ", out, re.M), out[-3000:]


@pytest.mark.stack
@pytest.mark.parametrize(("script", "args"), EXAMPLE_RUNS)
def test_example_exports_under_the_service_the_environment_names(
    collector: Any, script: str, args: list[str]
) -> None:
    name = f"example-{uuid.uuid4().hex[:8]}"
    run_example(script, args, OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
                OTEL_SERVICE_NAME=name)  # fmt: skip
    generators = [f"{name}-generator-0"] if "--generators" in args else []
    assert service_names(collector) == {name, *generators}


@pytest.mark.stack
def test_example_exports_under_its_own_name_when_the_environment_names_none(
    collector: Any,
) -> None:
    run_example("plain_loop.py", [], OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint)
    assert service_names(collector) == {"plain-loop"}


def test_the_rl_example_fails_when_its_shutdown_misses_the_deadline(tmp_path: Path) -> None:
    """The end-to-end stack test runs the RL example and checks its exit status: a
    shutdown cut short by its deadline (here: a Collector address nobody listens on, a
    0.5 s deadline) must fail the run, not pass quietly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed again: nothing listens there)
    env = job_env()
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
               OTEL_TRAIN_SHUTDOWN_TIMEOUT="0.5", OTEL_TRAIN_RUN_DIR=str(tmp_path))  # fmt: skip
    done = subprocess.run([sys.executable, str(EXAMPLES / "rl_loop.py"), "--iterations", "20"],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "otel_train.shutdown() missed its deadline" in done.stderr
