"""Shared test setup: one otel-train session per test, and the `gpu` marker.

Every test ends with ``otel_train.testing.reset()`` (``shutdown()``, forgotten) so no
session, hook or patch leaks into the next one, and the next test's bare calls start a
session of their own; then it fails if anything new appeared in the checkout's
``otel-train-runs/`` (scratch.py: where the tests' run records go). Hypothesis runs under
a fixed budget (profile ``ci``). Tests marked ``gpu`` are skipped, with the reason, when
CUDA is not available.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from scratch import RUN_DIR, RUN_DIR_VARIABLE, checkout_runs

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
# nor a directory the user's environment names; jobs the tests start keep it (scratch.py).
os.environ[RUN_DIR_VARIABLE] = RUN_DIR
_CHECKOUT_RUNS_BEFORE = checkout_runs()  # (the user's own runs: theirs, left alone)
_reported: set[str] = set()


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="gpu test: CUDA is not available on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(RUN_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _otel_train_shutdown() -> Iterator[None]:
    yield
    otel_train.testing.reset()
    # A run record that appeared in the checkout since the session began (this test's,
    # or its module fixture's) fails the test that first sees it.
    left = checkout_runs() - _CHECKOUT_RUNS_BEFORE - _reported
    if left:
        _reported.update(left)
        pytest.fail(
            f"a test run left {sorted(left)} in the checkout's otel-train-runs/: tests "
            "record under their scratch directory (tests/scratch.py: job_env())",
            pytrace=False,
        )
