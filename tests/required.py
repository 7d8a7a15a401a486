"""A part that some tests need is missing: they skip, or, under the CI switch that says
the part is installed (scripts/test sets each), they fail. No quiet skip in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

# opentelemetry-distro (the auto extra, in the test extra): `opentelemetry-instrument` and
# opentelemetry.instrumentation, for tests/unit/test_instrumentor.py and
# tests/e2e/test_zero_code.py.
DISTRO_SWITCH = "OTEL_TRAIN_DISTRO_REQUIRED"


def missing(switch: str, what: str, *, module_level: bool = False) -> NoReturn:
    """Fail when ``switch`` is "1", else skip; ``what``: the missing part and its install."""
    if os.environ.get(switch) == "1":
        pytest.fail(f"{what} is missing, and {switch}=1 says it must be there", pytrace=False)
    pytest.skip(f"{what} is missing", allow_module_level=module_level)
