"""instrument(trainer) for torchtitan-style trainers, recognised by their methods.

The real torchtitan Trainer needs an accelerator (``torchtitan.tools.utils`` falls back
to ``cuda`` and ``Trainer.__init__`` calls ``torch.cuda.set_device``), so these tests
use objects of the same shape: both the older ``next_batch`` form and torchtitan 0.3's
``batch_generator`` form.
"""

from __future__ import annotations

import pytest
import torch
from adapter_helpers import (
    SEQ,
    TitanWithBatchGenerator,
    TitanWithNextBatch,
    phase_counts,
    step_spans,
    total,
    tree,
)

import otel_train
from otel_train import contract as c


@pytest.mark.parametrize("cls", [TitanWithNextBatch, TitanWithBatchGenerator])
def test_steps_data_forward_backward_and_optimizer(cls: type, tel, otel_kwargs) -> None:
    trainer = cls(steps=3, grad_accum=2)
    inst = otel_train.instrument(trainer, **otel_kwargs)
    assert inst.kind == "torchtitan"
    trainer.train()
    otel_train.shutdown()

    steps = step_spans(tel)
    assert len(steps) == 3
    fwd_bwd = ("forward_backward", ["backward"])
    for step in steps:
        assert tree(tel, step) == ["data", fwd_bwd, "data", fwd_bwd, "optimizer"]
        assert step.attributes[c.STEP_SAMPLES.key] == 8
        assert step.attributes[c.STEP_TOKENS.key] == 8 * SEQ
    assert phase_counts(tel) == {"data": 6, "forward_backward": 6, "backward": 6,
                                 "optimizer": 3}  # fmt: skip
    assert total(tel, c.TOKENS.name) == 24 * SEQ


def test_shape_recognition_needs_the_methods_on_the_class() -> None:
    from unittest import mock

    from otel_train.adapters import torchtitan

    assert torchtitan.matches(TitanWithNextBatch())
    assert not torchtitan.matches(mock.MagicMock())  # answers every attribute: not a trainer
    assert not torchtitan.matches(torch.nn.Linear(2, 2))


def test_uninstrument_restores_methods_and_hooks(otel_kwargs) -> None:
    trainer = TitanWithBatchGenerator(steps=1)
    attrs = dict(vars(trainer))
    backward = torch.autograd.backward
    inst = otel_train.instrument(trainer, **otel_kwargs)
    trainer.train()
    inst.uninstrument()
    assert vars(trainer).keys() == attrs.keys()
    assert not trainer.optimizers._optimizer_step_pre_hooks
    assert not trainer.optimizers._optimizer_step_post_hooks
    assert torch.autograd.backward is backward
