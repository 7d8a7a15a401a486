"""Tiny trainers for every adapter, and span-tree / metric queries for the adapter tests."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from typing import Any

import torch

from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

VOCAB, SEQ = 64, 16


# --- span tree and metrics -----------------------------------------------------------------


def step_spans(tel: InMemoryTelemetry) -> list[Any]:
    spans = [s for s in tel.spans() if s.name == c.STEP_SPAN.name]
    return sorted(spans, key=lambda s: s.attributes[c.STEP_INDEX.key])


def children(tel: InMemoryTelemetry, parent: Any) -> list[Any]:
    """Direct children of ``parent`` (by span.parent.span_id), in start order."""
    pid = parent.context.span_id
    kids = [s for s in tel.spans() if s.parent is not None and s.parent.span_id == pid]
    return sorted(kids, key=lambda s: s.start_time)


def tree(tel: InMemoryTelemetry, span: Any) -> list[Any]:
    """``[name, [child trees...]]`` flattened to names: e.g. ["data", ("microstep", [...])]."""
    out: list[Any] = []
    for kid in children(tel, span):
        sub = tree(tel, kid)
        out.append((kid.name, sub) if sub else kid.name)
    return out


def phase_counts(tel: InMemoryTelemetry) -> Counter[str]:
    out: Counter[str] = Counter()
    for p in tel.points(c.PHASE_DURATION.name):
        out[p.attributes[c.A_PHASE]] += p.count
    return out


def total(tel: InMemoryTelemetry, metric: str) -> float | None:
    points = tel.points(metric)
    return float(sum(p.value for p in points)) if points else None


# --- Hugging Face ---------------------------------------------------------------------------


class PaddedTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Token sequences whose last ``pad`` positions are padding (attention_mask 0)."""

    def __init__(self, n: int = 32, pad: int = 4) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
        self.pad = pad

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[SEQ - self.pad :] = 0
        ids = self.ids[i] * mask
        return {"input_ids": ids, "attention_mask": mask,
                "labels": ids.masked_fill(mask == 0, -100)}  # fmt: skip


def hf_trainer(grad_accum: int = 2, max_steps: int = 3, batch_size: int = 4, **args: Any) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip
    training_args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "otel-train-hf-tests"),  # stays empty
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum,
        max_steps=max_steps,
        **{
            "report_to": "none",
            "save_strategy": "no",
            "logging_strategy": "no",
            "disable_tqdm": True,
            "use_cpu": True,
            **args,
        },  # (args may override these)
    )
    dataset = PaddedTokens()
    return Trainer(model=GPT2LMHeadModel(config), args=training_args, train_dataset=dataset,
                   eval_dataset=dataset if "eval_strategy" in args else None)  # fmt: skip


# --- Lightning ------------------------------------------------------------------------------


def lightning_module(fail_at: int | None = None, validation: bool = False) -> Any:
    import lightning as L

    class TinyLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 8)
            self.head = torch.nn.Linear(8, VOCAB)

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            if fail_at is not None and batch_idx == fail_at:
                raise RuntimeError("boom in training_step")
            logits = self.head(self.embed(batch["input_ids"]))
            return torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["input_ids"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class TinyLMWithValidation(TinyLM):
        def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
            self.training_step(batch, batch_idx)

    torch.manual_seed(0)
    return TinyLMWithValidation() if validation else TinyLM()


def lightning_loader(n: int = 24, batch_size: int = 4) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    dataset = PaddedTokens(n)
    items = [{"input_ids": dataset[i]["input_ids"], "attention_mask": dataset[i]["attention_mask"]}
             for i in range(n)]  # fmt: skip
    return torch.utils.data.DataLoader(items, batch_size=batch_size)


def lightning_trainer(**kwargs: Any) -> Any:
    import lightning as L

    options: dict[str, Any] = {
        "max_epochs": 1, "accelerator": "cpu", "devices": 1, "logger": False,
        "enable_checkpointing": False, "enable_progress_bar": False,
        "enable_model_summary": False, "num_sanity_val_steps": 0,
    }  # fmt: skip
    options.update(kwargs)
    return L.Trainer(**options)


# --- torchtitan-style -----------------------------------------------------------------------


class TitanStyleTrainer:
    """The shape of torchtitan's Trainer: train() → train_step(data_iterator) → per
    micro-batch next_batch (or next() on batch_generator's iterator) and
    forward_backward_step, then optimizers.step()."""

    def __init__(self, steps: int = 3, grad_accum: int = 2, use_next_batch: bool = True) -> None:
        torch.manual_seed(0)
        self.model_parts = [torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8),
                                                torch.nn.Linear(8, VOCAB))]  # fmt: skip
        self.optimizers = torch.optim.SGD(self.model_parts[0].parameters(), lr=0.1)
        self.gradient_accumulation_steps = grad_accum
        self.steps = steps
        self.step = 0
        self.use_next_batch = use_next_batch
        g = torch.Generator().manual_seed(0)
        self.dataloader = [({"input": torch.randint(0, VOCAB, (4, SEQ), generator=g)},
                            torch.randint(0, VOCAB, (4, SEQ), generator=g))
                           for _ in range(steps * grad_accum)]  # fmt: skip

    def batch_generator(self, data_iterable: Any) -> Any:
        yield from data_iterable

    def forward_backward_step(self, input_dict: dict[str, torch.Tensor],
                              labels: torch.Tensor) -> torch.Tensor:  # fmt: skip
        pred = self.model_parts[0](input_dict["input"])
        loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1), labels.flatten())
        loss.backward()
        return loss.detach()

    def train_step(self, data_iterator: Any) -> None:
        self.optimizers.zero_grad()
        for _ in range(self.gradient_accumulation_steps):
            if self.use_next_batch:
                input_dict, labels = self.next_batch(data_iterator)
            else:
                input_dict, labels = next(data_iterator)
            self.forward_backward_step(input_dict, labels)
        self.optimizers.step()

    def train(self) -> None:
        data_iterator = self.batch_generator(self.dataloader)
        while self.step < self.steps:
            self.step += 1
            self.train_step(data_iterator)


class TitanWithNextBatch(TitanStyleTrainer):
    """Older torchtitan: a next_batch(data_iterator) method."""

    def next_batch(self, data_iterator: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return next(data_iterator)  # type: ignore[no-any-return]


class TitanWithBatchGenerator(TitanStyleTrainer):
    """torchtitan 0.3: next() on the iterator batch_generator() returned."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(use_next_batch=False, **kwargs)
