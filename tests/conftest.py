"""Shared test setup: one otel-train session per test, and the `gpu` marker.

Every test ends with ``otel_train.shutdown()`` so no session, hook or patch leaks
into the next one. Tests marked ``gpu`` are skipped, with the reason, when CUDA is
not available.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import otel_train


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="gpu test: CUDA is not available on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _otel_train_shutdown() -> Iterator[None]:
    yield
    otel_train.shutdown()
