"""scripts/bootstrap (what ``make demo`` and ``make test`` run first) is quiet unless it
fails (issue 25 item 13): a fresh install prints nothing, not even setuptools' notice box
about an editable install of a flat layout, and a failing install prints pip's error.

The script runs as it is, in a scratch project of one flat-layout package (the layout
that gets the notice, like otel-train's), with the interpreter the tests run under;
pip's cache serves the build backend as it serves a real bootstrap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "bootstrap-probe"
version = "0.1"

[project.optional-dependencies]
test = []

[tool.setuptools.packages.find]
include = ["bootstrap_probe*"]
"""


def bootstrap(project: Path) -> subprocess.CompletedProcess[str]:
    base = getattr(sys, "_base_executable", sys.executable)  # (a venv's own base)
    env = {**os.environ, "PYTHON": base, "EXTRAS": "test"}
    return subprocess.run([str(project / "scripts" / "bootstrap")], env=env, cwd=project,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_a_fresh_install_prints_nothing_and_a_failed_one_prints_why(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap", tmp_path / "scripts" / "bootstrap")
    (tmp_path / "bootstrap_probe").mkdir()
    (tmp_path / "bootstrap_probe" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)

    done = bootstrap(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    probe = subprocess.run([str(tmp_path / ".venv" / "bin" / "python"), "-c",
                            "import bootstrap_probe; print(bootstrap_probe.__file__)"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(probe.stdout.strip()) == tmp_path / "bootstrap_probe" / "__init__.py"

    # A broken pyproject.toml: the reinstall fails, and says so with pip's own error.
    (tmp_path / "pyproject.toml").write_text(PYPROJECT + "broken = [\n")
    for stamp in (tmp_path / ".venv").glob(".otel-train-installed-*"):
        stamp.unlink()  # (its mtime may equal the file's on a coarse clock)
    done = bootstrap(tmp_path)
    assert done.returncode != 0
    assert done.stdout == ""
    assert "scripts/bootstrap: failed: .venv/bin/python -m pip install" in done.stderr
    assert "TOMLDecodeError" in done.stderr, done.stderr
