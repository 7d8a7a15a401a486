"""instrument(lightning.Trainer): real Lightning fits of a tiny language model."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="needs the [lightning] extra: pip install "
                    "'otel-train[lightning]'")  # fmt: skip

from adapter_helpers import (
    SEQ,
    lightning_loader,
    lightning_module,
    lightning_trainer,
    phase_counts,
    step_spans,
    total,
    tree,
)
from opentelemetry.trace import StatusCode

import otel_train
from otel_train import contract as c

PAD = 4


def test_accumulation_shows_data_gaps_and_micro_steps_in_each_step(tel, otel_kwargs) -> None:
    trainer = lightning_trainer(accumulate_grad_batches=2)
    inst = otel_train.instrument(trainer, **otel_kwargs)
    assert inst.kind == "lightning"
    trainer.fit(lightning_module(), train_dataloaders=lightning_loader(n=24, batch_size=4))
    otel_train.shutdown()

    steps = step_spans(tel)
    assert len(steps) == 3 == trainer.global_step  # 6 batches, 2 per optimizer step
    micro = ("microstep", ["forward", "backward"])
    for step in steps:
        assert tree(tel, step) == ["data", micro, "data", micro, "optimizer"]
        assert step.attributes[c.STEP_SAMPLES.key] == 8
        assert step.attributes[c.STEP_TOKENS.key] == 8 * (SEQ - PAD)
    assert phase_counts(tel) == {"data": 6, "microstep": 6, "forward": 6, "backward": 6,
                                 "optimizer": 3}  # fmt: skip
    assert total(tel, c.STEPS.name) == 3
    assert total(tel, c.SAMPLES.name) == 24
    assert total(tel, c.TOKENS.name) == 24 * (SEQ - PAD)


def test_validation_and_epoch_ends_do_not_become_steps(tel, otel_kwargs, tmp_path) -> None:
    trainer = lightning_trainer(max_epochs=2, val_check_interval=2, limit_val_batches=1,
                                num_sanity_val_steps=1, enable_checkpointing=True,
                                default_root_dir=str(tmp_path))  # fmt: skip
    otel_train.instrument(trainer, **otel_kwargs)
    loader = lightning_loader(n=16, batch_size=4)
    trainer.fit(lightning_module(validation=True), train_dataloaders=loader, val_dataloaders=loader)
    otel_train.shutdown()

    steps = step_spans(tel)
    assert len(steps) == 8 == trainer.global_step  # 4 batches x 2 epochs, no data-only steps
    assert all(tree(tel, s) == ["data", "forward", "backward", "optimizer"] for s in steps)
    assert total(tel, c.SAMPLES.name) == 32
    # Goodput: validation runs and checkpoint saves are their own regions, outside steps.
    run_time = {p.attributes[c.A_CATEGORY]: p.value for p in tel.points(c.RUN_TIME.name)}
    assert run_time["evaluation"] > 0
    assert run_time["checkpoint"] > 0
    assert list(tmp_path.rglob("*.ckpt"))


def test_an_exception_in_training_step_marks_the_open_phase(tel, otel_kwargs) -> None:
    trainer = lightning_trainer()
    otel_train.instrument(trainer, **otel_kwargs)
    with pytest.raises(RuntimeError, match="boom in training_step"):
        trainer.fit(lightning_module(fail_at=1), train_dataloaders=lightning_loader())
    otel_train.shutdown()

    steps = step_spans(tel)
    assert len(steps) == 2
    assert tree(tel, steps[0]) == ["data", "forward", "backward", "optimizer"]
    failed = [s for s in tel.spans() if s.status.status_code is StatusCode.ERROR]
    assert "forward" in [s.name for s in failed]


def test_uninstrument_removes_the_callback(otel_kwargs) -> None:
    trainer = lightning_trainer()
    before = list(trainer.callbacks)
    inst = otel_train.instrument(trainer, **otel_kwargs)
    assert len(trainer.callbacks) == len(before) + 1
    trainer.fit(lightning_module(), train_dataloaders=lightning_loader(n=8))
    inst.uninstrument()
    assert trainer.callbacks == before


def test_the_loss_training_step_returned_and_the_learning_rate_are_recorded(
    tel, otel_kwargs
) -> None:
    trainer = lightning_trainer()
    otel_train.instrument(trainer, **otel_kwargs)
    module = lightning_module()
    trainer.fit(module, train_dataloaders=lightning_loader(n=8, batch_size=4))
    otel_train.shutdown()
    scalars = {p.attributes[c.A_NAME]: p.value for p in tel.points(c.SCALAR.name)}
    assert scalars.keys() >= {"loss", "learning_rate"}
    assert scalars["learning_rate"] == 0.1  # the module's SGD
    assert 0 < scalars["loss"] < 20
