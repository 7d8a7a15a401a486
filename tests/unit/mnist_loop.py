"""A loop shaped like pytorch/examples' mnist (main.py), with synthetic images: a small
convnet, ``Normalize`` applied in the dataset's ``__getitem__`` (an ``nn.Module``, as
torchvision's is, called in training mode with grad enabled), Adadelta, ``F.nll_loss``,
and a test pass under ``torch.no_grad()`` after each epoch.

Run as a script, each DataLoader has a worker started with ``spawn`` (as on macOS), and
it prints ``iterations samples`` of what it trained."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

SAMPLES, BATCH, EPOCHS = 48, 8, 2
ITERATIONS = EPOCHS * SAMPLES // BATCH


class Normalize(torch.nn.Module):
    """torchvision's ``transforms.Normalize`` as it is: an ``nn.Module``."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Digits(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Synthetic 28x28 images, normalised on the way out as the example's dataset does."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 1, 28, 28, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g).tolist()
        self.transform = Normalize(0.1307, 0.3081)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[i]), self.labels[i]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, 2)
        self.fc = torch.nn.Linear(4 * 13 * 13, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc(torch.flatten(F.relu(self.conv(x)), 1)), dim=1)


def train(workers: int, context: str | None = None) -> tuple[int, int]:
    """The example's ``main()``: train, then test, each epoch; returns (iterations,
    samples trained on)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    kwargs: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if workers:
        kwargs.update(multiprocessing_context=context, persistent_workers=True)
    train_loader = torch.utils.data.DataLoader(Digits(SAMPLES), shuffle=True, **kwargs)
    test_loader = torch.utils.data.DataLoader(Digits(16), **kwargs)
    iterations = samples = 0
    for _ in range(EPOCHS):
        model.train()
        for data, target in train_loader:
            opt.zero_grad()
            F.nll_loss(model(data), target).backward()
            opt.step()
            iterations += 1
            samples += len(data)
        model.eval()
        with torch.no_grad():
            for data, target in test_loader:
                F.nll_loss(model(data), target, reduction="sum")
    return iterations, samples


if __name__ == "__main__":
    print(*train(1, "spawn"))
