"""Where the tests' run records go: a scratch directory, never the checkout's
``otel-train-runs/`` (issue 25 item 8).

conftest.py points ``OTEL_TRAIN_RUN_DIR`` at :data:`RUN_DIR` for the whole session, so
sessions in the test process record there; jobs the tests start without the OTel
variables (so that they configure themselves only from what the test gives them) get
their environment from :func:`job_env`, which keeps that one. conftest.py fails a test
that leaves anything new in the checkout's ``otel-train-runs/`` all the same.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

RUN_DIR_VARIABLE = "OTEL_TRAIN_RUN_DIR"
RUN_DIR = tempfile.mkdtemp(prefix="otel-train-test-runs-")
CHECKOUT_RUNS = Path(__file__).resolve().parents[1] / "otel-train-runs"


def job_env(drop: tuple[str, ...] = ("OTEL_",)) -> dict[str, str]:
    """This process's environment without the variables whose names start with one of
    ``drop``, its run record directory kept: a job started with it records in the
    tests' scratch directory (or where the test then says)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env[RUN_DIR_VARIABLE] = os.environ.get(RUN_DIR_VARIABLE, RUN_DIR)
    return env


def checkout_runs() -> set[str]:
    """The names in the checkout's ``otel-train-runs/`` now."""
    try:
        return set(os.listdir(CHECKOUT_RUNS))
    except FileNotFoundError:
        return set()
