"""A Hugging Face ``Trainer`` fine-tuning a tiny GPT-2, instrumented with one call.

Run (``pip install 'otel-train[hf]'``)::

    python examples/hf_trainer.py

The model is built from a config (no download) and trains on random padded token
sequences with gradient accumulation 2, so each step shows data, two ``microstep``
phases (forward, backward) and the optimizer; tokens are counted from the attention
mask. Prints the run summary; exports over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set,
as the service OTEL_SERVICE_NAME names, else "hf-trainer" (``default_service_name``).
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is built locally

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import otel_train

VOCAB, SEQ = 128, 32


class PaddedSequences(torch.utils.data.Dataset):
    """Random token sequences of random length, right-padded to SEQ."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
        self.lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        mask = (torch.arange(SEQ) < self.lengths[i]).long()
        ids = self.ids[i] * mask
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            max_steps=8,
            learning_rate=1e-3,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
        )
        trainer = Trainer(model=GPT2LMHeadModel(config), args=args,
                          train_dataset=PaddedSequences())  # fmt: skip
        otel_train.instrument(trainer, prometheus=False, console_every=4,
                              default_service_name="hf-trainer")  # fmt: skip
        trainer.train()
    otel_train.shutdown()


if __name__ == "__main__":
    main()
