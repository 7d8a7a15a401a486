"""The shape the style guide asks for, enforced: recording and adapters talk to the OTel
API only; the SDK, exporters and prometheus_client are imported in export/ (and by the
public testing helpers) alone."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "otel_train"
SDK_SIDE = ("opentelemetry.sdk", "opentelemetry.exporter", "prometheus_client")
FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning", "torchtitan", "accelerate")


def imports(path: Path) -> list[tuple[str, int]]:
    """(absolute or package-relative module, level) of every import in a file."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level))
    return out


def files(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


@pytest.mark.parametrize("sub", ["recording", "adapters"])
def test_recording_and_adapters_use_the_api_only(sub: str) -> None:
    for path in files(sub):
        for module, level in imports(path):
            assert not (level == 0 and module.startswith(SDK_SIDE)), f"{path.name} imports {module}"
            assert not (level and module.split(".")[0] == "export"), f"{path.name} imports export"


def test_recording_does_not_import_adapters_or_frameworks() -> None:
    for path in files("recording"):
        for module, level in imports(path):
            assert not (level and "adapters" in module), f"{path.name} imports {module}"
            assert not module.startswith(FRAMEWORKS), f"{path.name} imports {module}"


def test_adapters_import_frameworks_lazily() -> None:
    for path in files("adapters"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: function bodies may import lazily
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                for name in names:
                    assert not name.startswith(FRAMEWORKS), f"{path.name} imports {name} eagerly"


def test_sdk_is_built_in_one_place() -> None:
    allowed = {PKG / "testing.py", *files("export")}
    for path in sorted(PKG.rglob("*.py")):
        if path in allowed:
            continue
        for module, level in imports(path):
            assert not (level == 0 and module.startswith(SDK_SIDE)), f"{path.name} imports {module}"


# What `make lint` checks besides the package.
LINTED = ("otel_train", "tests", "benchmarks", "examples", "grafana")


@pytest.mark.parametrize("tool", ["ruff", "ruff-format", "mypy"])
def test_lint_and_types_are_clean(tool: str) -> None:
    exe = shutil.which(tool.split("-")[0], path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip(f"{tool} not installed (pip install 'otel-train[dev]')")
    cmd = {
        "ruff": [exe, "check", *LINTED],
        "ruff-format": [exe, "format", "--check", *LINTED],
        "mypy": [exe, str(PKG)],
    }[tool]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=PKG.parent)
    assert done.returncode == 0, done.stdout + done.stderr
