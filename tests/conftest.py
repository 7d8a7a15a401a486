"""Shared test setup: one otel-train session per test, and the `gpu` marker.

Every test ends with ``otel_train.testing.reset()`` (``shutdown()``, forgotten) so no
session, hook or patch leaks into the next one, and the next test's bare calls start a
session of their own. Hypothesis runs under a fixed budget (profile ``ci``). Tests marked
``gpu`` are skipped, with the reason, when CUDA is not available.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

import otel_train
import otel_train.testing

# Property tests run with a fixed budget and a fixed seed in CI ("ci", the default);
# HYPOTHESIS_PROFILE=dev searches longer and randomly when hunting for bugs locally.
hypothesis_settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
hypothesis_settings.register_profile(
    "dev", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Run records of the tests' own-SDK sessions go to a scratch directory, not the checkout
# (subprocesses that drop OTEL_* variables write to their cwd's otel-train-runs/).
os.environ.setdefault("OTEL_TRAIN_RUN_DIR", tempfile.mkdtemp(prefix="otel-train-test-runs-"))


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
    otel_train.testing.reset()
