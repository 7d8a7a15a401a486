"""Fixtures for the adapter tests: real transformers and Lightning, tiny models, no downloads.

Every test ends with ``otel_train.shutdown()`` (also done by the root conftest) so no
session, hook or patch leaks into the next test. Third-party deprecation warnings that
the pinned framework versions raise are ignored here, per test, by exact message, so
``filterwarnings = error`` stays strict for otel-train's own code.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import otel_train
from otel_train.testing import InMemoryTelemetry

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never reach a hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent

# (message regex, category): raised from inside transformers / lightning, not from us.
THIRD_PARTY_WARNINGS = (
    # lightning.pytorch.utilities._pytree builds torch's deprecated LeafSpec (torch>=2.10)
    r"ignore:.*isinstance\(treespec, LeafSpec\).*:FutureWarning",
    # Lightning suggests DataLoader workers for the tiny in-process datasets used here
    r"ignore:.*does not have many workers.*",
    # Lightning on a CPU-only machine with a fresh install
    r"ignore:.*GPU available but not used.*",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            for spec in THIRD_PARTY_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(autouse=True)
def _shutdown_after_each_test() -> Iterator[None]:
    yield
    otel_train.shutdown()


@pytest.fixture
def tel() -> InMemoryTelemetry:
    return InMemoryTelemetry()


@pytest.fixture
def otel_kwargs(tel: InMemoryTelemetry) -> dict[str, object]:
    """instrument() keywords: in-memory providers, every step traced, nothing printed."""
    return {
        "tracer_provider": tel.tracer_provider,
        "meter_provider": tel.meter_provider,
        "trace_steps": "all",
        "console": "off",
    }
