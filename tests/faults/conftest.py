"""Fixtures for the fault tests: a real otelcol per test (see collector_helpers.py).

Every test here carries the ``stack`` marker and skips, with the reason, when
``scripts/stack build`` has not been run (OTEL_TRAIN_STACK_REQUIRED=1 turns that
into a failure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from collector_helpers import Collector, otelcol_or_skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.path).is_relative_to(here):
            item.add_marker(pytest.mark.stack)


@pytest.fixture(scope="session")
def otelcol() -> Path:
    return otelcol_or_skip()


@pytest.fixture
def collector(otelcol: Path, tmp_path: Path) -> Any:
    col = Collector(otelcol, tmp_path)
    try:
        yield col
    finally:
        col.stop()
