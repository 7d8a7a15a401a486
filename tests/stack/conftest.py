"""Shared fixtures for the tests of the no-Docker observability stack (deploy/, scripts/stack).

Every test here carries the `stack` marker. Tests that need the real binaries
skip, with the reason, when `scripts/stack build` has not been run; set
OTEL_TRAIN_STACK_REQUIRED=1 (CI does, after building) to turn that skip into a failure.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STACK_SCRIPT = REPO / "scripts" / "stack"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "stack: needs the observability stack binaries built by `scripts/stack build`"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.path).is_relative_to(here):
            item.add_marker(pytest.mark.stack)


def load_stack_module():
    """Import scripts/stack (no .py suffix) as a module, for its paths and version logic."""
    loader = importlib.machinery.SourceFileLoader("otel_train_stack_script", str(STACK_SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(loader.name, module)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def stack_module():
    return load_stack_module()


@pytest.fixture(scope="session")
def versions(stack_module) -> dict[str, str]:
    return stack_module.read_versions()


@pytest.fixture(scope="session")
def stack_bins(stack_module) -> Path:
    """The bin dir with every binary at its pinned version, or skip."""
    missing = stack_module.missing_binaries()
    if missing:
        reason = (
            "stack binaries not built -- run `scripts/stack build` ("
            + "; ".join(f"{name}: {why}" for name, why in missing.items())
            + ")"
        )
        if os.environ.get("OTEL_TRAIN_STACK_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return stack_module.bin_dir()
