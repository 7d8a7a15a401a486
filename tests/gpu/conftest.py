"""GPU tests: the `cuda` fixture; warnings that torch raises from its own modules do not
fail them.

pytest turns every warning into an error (pyproject.toml); on the lent GPU machine a torch
newer or older than this checkout's raises deprecation notices about its own internals.
Those say nothing about otel-train, so in these tests they are shown, not raised; a
warning attributed to otel-train's code (or a test's) still fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

TORCH_OWN = (
    r"default::DeprecationWarning:torch\.",
    r"default::FutureWarning:torch\.",
    r"default::UserWarning:torch\.",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.path).is_relative_to(here):
            for line in TORCH_OWN:
                item.add_marker(pytest.mark.filterwarnings(line))


@pytest.fixture
def cuda() -> Iterator[torch.device]:
    """The current CUDA device, initialised before instrument() (otel-train never creates
    a context itself), synchronised and emptied around the test."""
    torch.cuda.init()  # type: ignore[no-untyped-call]
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    yield device
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
