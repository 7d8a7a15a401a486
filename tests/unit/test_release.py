"""What a release carries: the licence, one version, a changelog cut for it.

The built sdist and wheel are checked by scripts/package-check (scripts/test runs it):
the licence files in both, the wheel installed into a clean venv.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

import otel_train

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CHANGELOG = (REPO / "CHANGELOG.md").read_text()
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


def _sections() -> dict[str, str]:
    """Version heading (``[0.2.0] - 2026-12-06``, ``[Unreleased]``) -> its text."""
    parts = re.split(r"^## (.+)$", CHANGELOG, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_licence_is_the_apache_text_pyproject_names() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    for name in project["license-files"]:
        assert (REPO / name).is_file(), name


def test_the_newest_changelog_section_is_this_version_with_a_date() -> None:
    released = [h for h in _sections() if h != "[Unreleased]"]
    assert released, "no released version in CHANGELOG.md"
    match = re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})", released[0])
    assert match, f"not `[X.Y.Z] - YYYY-MM-DD`: {released[0]!r}"
    assert match.group(1) == otel_train.__version__
    assert PYPROJECT["project"]["dynamic"] == ["version"]  # one place: session.__version__


def test_each_changelog_section_has_each_kind_of_heading_once() -> None:
    for version, text in _sections().items():
        kinds = re.findall(r"^### (.+)$", text, flags=re.M)
        assert set(kinds) <= set(KINDS), (version, kinds)
        assert len(kinds) == len(set(kinds)), f"{version}: {kinds}"


def test_the_paths_the_changelog_names_exist() -> None:
    """A backquoted repository path (``recording/phases.py``, ``scripts/stack``) names a
    file or folder of today's tree (under the repository or the package)."""
    dirs = ("otel_train/", "scripts/", "tests/", "docs/", "deploy/", "benchmarks/", "examples/")
    missing = []
    for token in re.findall(r"`([^`\s]+)`", CHANGELOG):
        path = token.split(":")[0].rstrip(",.")
        looks_like_file = "/" in path and re.search(r"\.(py|md|ya?ml|json|c|toml)$", path)
        named = looks_like_file or path.startswith(dirs)
        if named and not ((REPO / path).exists() or (REPO / "otel_train" / path).exists()):
            missing.append(token)
    assert not missing, f"CHANGELOG.md names paths that do not exist: {missing}"
