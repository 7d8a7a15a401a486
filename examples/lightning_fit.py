"""A Lightning ``Trainer.fit`` on a tiny language model, instrumented with one call.

Run (``pip install 'otel-train[lightning]'``)::

    python examples/lightning_fit.py

Batches are dicts with ``input_ids`` and ``attention_mask``, so tokens are counted
from the mask; ``accumulate_grad_batches=2`` shows two ``microstep`` phases per step.
Prints the run summary; exports over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, as the
service OTEL_SERVICE_NAME names, else "lightning-fit" (``default_service_name``).
"""

from __future__ import annotations

import lightning as L
import torch

import otel_train

VOCAB, SEQ = 128, 32


class TinyLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.GRU(32, 32, batch_first=True)
        self.head = torch.nn.Linear(32, VOCAB)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        hidden, _ = self.mix(self.embed(ids[:, :-1]))
        logits = self.head(hidden)
        targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets)
        self.log("loss", loss)
        otel_train.record(loss=loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def batches(n: int = 64) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    return [{"input_ids": ids[i] * mask[i], "attention_mask": mask[i]} for i in range(n)]


def main() -> None:
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(batches(), batch_size=8)
    trainer = L.Trainer(
        max_epochs=2,
        accumulate_grad_batches=2,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    otel_train.instrument(
        trainer, prometheus=False, console_every=4, default_service_name="lightning-fit"
    )
    trainer.fit(TinyLM(), train_dataloaders=loader)
    otel_train.shutdown()


if __name__ == "__main__":
    main()
