"""examples/ run as smoke tests: each exits 0 and prints the run summary."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _needs(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"needs {module}")  # fmt: skip


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("plain_loop.py", []),
        # Its default run spans several metric export intervals (about 30 s): the
        # end-to-end stack test runs that one; here a short run.
        ("rl_loop.py", ["--iterations", "20"]),
        pytest.param("hf_trainer.py", [], marks=_needs("transformers")),
        pytest.param("lightning_fit.py", [], marks=_needs("lightning")),
    ],
)
def test_example_runs_and_prints_the_summary(script: str, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_EXPORTER_OTLP", "OTEL_TRAIN_"))}  # fmt: skip
    env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                            text=True, timeout=300, env=env)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "otel-train run summary" in output
    assert "Traceback" not in output
