"""A loop shaped like pytorch/examples' word_language_model (main.py): an LSTM over
sequence-first batches of token ids, ``(bptt, batch)`` as its ``get_batch`` slices them,
and no torch.optim optimizer: the parameters are updated by hand after each backward."""

from __future__ import annotations

import torch

BPTT, BATCH, VOCAB = 35, 20, 50


class RNNModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Embedding(VOCAB, 16)
        self.rnn = torch.nn.LSTM(16, 16)
        self.decoder = torch.nn.Linear(16, VOCAB)

    def forward(
        self, x: torch.Tensor, hidden: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, ...]:
        output, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(output).view(-1, VOCAB), hidden


def batchify(n_batches: int) -> torch.Tensor:
    """A token stream laid out as the example's ``batchify``: ``(length, batch)``."""
    torch.manual_seed(0)
    return torch.randint(0, VOCAB, (n_batches * BPTT + 1, BATCH))


def train(model: RNNModel, data: torch.Tensor, lr: float = 0.1) -> int:
    """One epoch as the example's ``train()``; returns the iterations it ran."""
    model.train()
    hidden = (torch.zeros(1, BATCH, 16), torch.zeros(1, BATCH, 16))
    iterations = 0
    for i in range(0, data.size(0) - 1, BPTT):
        seq_len = min(BPTT, len(data) - 1 - i)
        x, target = data[i : i + seq_len], data[i + 1 : i + 1 + seq_len].reshape(-1)
        if seq_len < BPTT:
            break  # (the example keeps a short last batch; equal steps here)
        model.zero_grad()
        hidden = tuple(h.detach() for h in hidden)
        output, hidden = model(x, hidden)
        loss = torch.nn.functional.cross_entropy(output, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        iterations += 1
    return iterations
