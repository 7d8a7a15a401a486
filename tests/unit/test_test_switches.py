"""The switches that turn a missing part's skip into a failure (issue 25 item 12, issue
40 item 14): scripts/test sets each one, and under it the Ray end-to-end module fails
without ray, and the instrumentor's module without opentelemetry-distro, rather than
skipping quietly (tests/e2e/test_zero_code.py takes the same switch, tests/required.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from required import DISTRO_SWITCH

ROOT = Path(__file__).resolve().parents[2]
SWITCHES = (
    "OTEL_TRAIN_STACK_REQUIRED",
    "OTEL_TRAIN_BROWSER_REQUIRED",
    "OTEL_TRAIN_RAY_REQUIRED",
    DISTRO_SWITCH,
)


def test_scripts_test_sets_every_required_switch() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    pytest_line = re.search(r"^(OTEL_TRAIN_\w+=1 (?:\\\n|.)*?)-m pytest", script, re.M)
    assert pytest_line, script
    for switch in SWITCHES:
        assert f"{switch}=1" in pytest_line.group(1), switch


def _collect_ray_module(tmp_path: Path, required: bool) -> subprocess.CompletedProcess[str]:
    """Collect tests/e2e/test_ray_e2e.py where ``import ray`` fails (a module of that name
    on the path that raises ImportError, as an absent package does)."""
    (tmp_path / "ray.py").write_text("raise ImportError('no ray here')\n")
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    if required:
        env["OTEL_TRAIN_RAY_REQUIRED"] = "1"
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           str(ROOT / "tests" / "e2e" / "test_ray_e2e.py")]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_ray_module_fails_without_ray_when_required(tmp_path: Path) -> None:
    done = _collect_ray_module(tmp_path, required=True)
    assert done.returncode not in (0, 5), done.stdout + done.stderr
    assert "ray is missing: install the test extra" in done.stdout + done.stderr


def test_the_ray_module_skips_without_ray_otherwise(tmp_path: Path) -> None:
    done = _collect_ray_module(tmp_path, required=False)
    assert done.returncode == 5, done.stdout + done.stderr  # (collected nothing: skipped)
    assert "the ray extra is not installed" in done.stdout + done.stderr


def _collect_instrumentor_module(
    tmp_path: Path, required: bool
) -> subprocess.CompletedProcess[str]:
    """Collect tests/unit/test_instrumentor.py where ``import opentelemetry.instrumentation``
    fails (a plugin loaded first sets its sys.modules entry to None, as an absent package
    would fail; the rest of OpenTelemetry stays importable)."""
    (tmp_path / "no_distro.py").write_text(
        "import sys\nsys.modules['opentelemetry.instrumentation'] = None\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    if required:
        env[DISTRO_SWITCH] = "1"
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "-p", "no_distro", str(ROOT / "tests" / "unit" / "test_instrumentor.py")]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_instrumentor_module_fails_without_the_distro_when_required(tmp_path: Path) -> None:
    done = _collect_instrumentor_module(tmp_path, required=True)
    assert done.returncode not in (0, 5), done.stdout + done.stderr
    assert (
        f"opentelemetry-distro (pip install 'otel-train[auto]') is missing, and {DISTRO_SWITCH}=1"
        in (done.stdout + done.stderr)
    )


def test_the_instrumentor_module_skips_without_the_distro_otherwise(tmp_path: Path) -> None:
    done = _collect_instrumentor_module(tmp_path, required=False)
    assert done.returncode == 5, done.stdout + done.stderr  # (collected nothing: skipped)
    assert "opentelemetry-distro (pip install 'otel-train[auto]') is missing" in (
        done.stdout + done.stderr
    )
