"""Small helpers shared by the GPU tests."""

from __future__ import annotations

from typing import Any

import torch


def mlp(device: torch.device, width: int = 1024) -> tuple[torch.nn.Module, Any]:
    """A two-layer MLP on ``device`` (seeded) and its SGD optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
    ).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)
