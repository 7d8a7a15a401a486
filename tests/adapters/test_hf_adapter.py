"""instrument(transformers.Trainer): a real Trainer on a tiny GPT-2 built from a config."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="needs the [hf] extra: pip install 'otel-train[hf]'")

import torch
from adapter_helpers import SEQ, hf_trainer, phase_counts, step_spans, total, tree

import otel_train
from otel_train import contract as c

PAD = 4  # PaddedTokens pads the last 4 positions: 12 real tokens per sample


def test_grad_accumulation_shows_micro_steps_under_each_optimizer_step(tel, otel_kwargs) -> None:
    trainer = hf_trainer(grad_accum=2, max_steps=3, batch_size=4)
    inst = otel_train.instrument(trainer, **otel_kwargs)
    assert inst.kind == "hf"
    trainer.train()
    otel_train.shutdown()

    steps = step_spans(tel)
    assert len(steps) == 3 == trainer.state.global_step
    micro = ("microstep", ["forward", "backward"])
    for step in steps:
        assert tree(tel, step) == ["data", micro, micro, "optimizer"]
        assert step.attributes[c.STEP_SAMPLES.key] == 8  # 2 micro-batches of 4
        assert step.attributes[c.STEP_TOKENS.key] == 8 * (SEQ - PAD)  # from attention_mask
        for span in tel.spans():  # every phase of this trace hangs off this step
            if span.context.trace_id == step.context.trace_id and span is not step:
                assert span.attributes[c.STEP_INDEX.key] == step.attributes[c.STEP_INDEX.key]
    assert phase_counts(tel) == {"data": 3, "microstep": 6, "forward": 6, "backward": 6,
                                 "optimizer": 3}  # fmt: skip
    assert total(tel, c.STEPS.name) == 3
    assert total(tel, c.SAMPLES.name) == 24
    assert total(tel, c.TOKENS.name) == 24 * (SEQ - PAD)
    assert [p.count for p in tel.points(c.STEP_DURATION.name)] == [3]


def test_without_accumulation_phases_are_direct_children_of_the_step(tel, otel_kwargs) -> None:
    trainer = hf_trainer(grad_accum=1, max_steps=2, batch_size=2)
    otel_train.instrument(trainer, **otel_kwargs)
    trainer.train()
    otel_train.shutdown()

    steps = step_spans(tel)
    assert [tree(tel, s) for s in steps] == [["data", "forward", "backward", "optimizer"]] * 2
    assert [s.attributes[c.STEP_TOKENS.key] for s in steps] == [2 * (SEQ - PAD)] * 2


def test_reentrant_activation_checkpointing_gives_one_backward_a_step(tel, otel_kwargs) -> None:
    """Reentrant checkpointing recomputes each layer in backward and calls backward there
    (issue 38 item 7): those calls are part of the step's one backward phase."""
    trainer = hf_trainer(grad_accum=1, max_steps=2, batch_size=2, activation_checkpointing=True,
                         activation_checkpointing_kwargs={"use_reentrant": True})  # fmt: skip
    otel_train.instrument(trainer, **otel_kwargs)
    trainer.train()
    otel_train.shutdown()

    steps = step_spans(tel)
    assert [tree(tel, s) for s in steps] == [["data", "forward", "backward", "optimizer"]] * 2
    assert phase_counts(tel)["backward"] == 2


def test_evaluation_between_steps_adds_no_steps_or_phases(tel, otel_kwargs) -> None:
    trainer = hf_trainer(grad_accum=1, max_steps=2, batch_size=8, eval_strategy="steps",
                         eval_steps=1, per_device_eval_batch_size=16)  # fmt: skip
    otel_train.instrument(trainer, **otel_kwargs)
    trainer.train()
    otel_train.shutdown()

    assert len(step_spans(tel)) == 2
    assert phase_counts(tel)["forward"] == 2  # the eval forwards ran with grad off, outside steps
    run_time = {p.attributes[c.A_CATEGORY]: p.value for p in tel.points(c.RUN_TIME.name)}
    assert run_time["evaluation"] > 0  # Trainer.evaluate is the goodput region "evaluation"
    assert "checkpoint" not in run_time  # save_strategy="no": no checkpoint second, no series


def test_uninstrument_restores_the_trainer_exactly(otel_kwargs) -> None:
    trainer = hf_trainer(grad_accum=2, max_steps=1)
    attrs, callbacks = dict(vars(trainer)), list(trainer.callback_handler.callbacks)
    backward = torch.autograd.backward
    inst = otel_train.instrument(trainer, **otel_kwargs)
    assert "get_batch_samples" in vars(trainer) and "training_step" in vars(trainer)
    assert len(trainer.model._forward_pre_hooks) == 1
    trainer.train()
    inst.uninstrument()

    assert "get_batch_samples" not in vars(trainer) and "training_step" not in vars(trainer)
    assert "evaluate" not in vars(trainer) and "_save_checkpoint" not in vars(trainer)
    assert trainer.callback_handler.callbacks == callbacks
    assert not trainer.model._forward_pre_hooks
    assert torch.autograd.backward is backward
    assert type(trainer).__name__ == "Trainer"
    assert set(attrs) <= set(vars(trainer))
    for name, value in vars(trainer).items():
        assert not (getattr(value, "__module__", None) or "").startswith("otel_train"), name


def test_companions_are_refused_before_any_change(otel_kwargs) -> None:
    trainer = hf_trainer(max_steps=1)
    with pytest.raises(TypeError, match="owns its optimizer and data"):
        otel_train.instrument(trainer, optimizer=torch.optim.SGD(trainer.model.parameters()),
                              **otel_kwargs)  # fmt: skip
    assert "get_batch_samples" not in vars(trainer)
    assert not trainer.model._forward_pre_hooks


def test_the_trainers_loss_learning_rate_and_grad_norm_are_recorded(tel, otel_kwargs) -> None:
    """What the Trainer computed anyway, with no record() call of the user's."""
    trainer = hf_trainer(grad_accum=1, max_steps=4, batch_size=2, logging_strategy="steps",
                         logging_steps=2, learning_rate=1e-3)  # fmt: skip
    otel_train.instrument(trainer, **otel_kwargs)
    trainer.train()
    otel_train.shutdown()
    scalars = {p.attributes[c.A_NAME]: p.value for p in tel.points(c.SCALAR.name)}
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert scalars.keys() >= {"loss", "learning_rate", "grad_norm"}
    assert 0 < scalars["loss"] < 20  # a cross-entropy over a 64-token vocabulary
    assert scalars["learning_rate"] == pytest.approx(trainer.lr_scheduler.get_last_lr()[0])
    assert scalars["grad_norm"] == pytest.approx(logged[-1]["grad_norm"])


@pytest.mark.parametrize("flush_at_log", [False, True], ids=["one batch", "a batch a log"])
def test_a_loss_the_user_records_wins_over_the_adapters_own(
    tel, otel_kwargs, flush_at_log: bool
) -> None:
    """A callback records the logged loss in on_log (issue 25 item 3): from then on the
    ``loss`` scalar is the user's; the adapter's per-step loss no longer overwrites it,
    and the adapter's other figures (learning_rate) are still there. Whether the steps
    around a log reach the exporters with it (one batch at the end of a short run) or
    after it (``flush_at_log``: as in a long run, later batches than the log's)."""
    from transformers import TrainerCallback

    logged: list[float] = []

    class LogLoss(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: object, state: object, control: object, logs=None, **kw) -> None:
            if logs and "loss" in logs:
                logged.append(logs["loss"])
                otel_train.record(loss=logs["loss"])
                if flush_at_log:
                    assert otel_train.flush()

    # Logs at steps 2 and 4; step 5 ends the run with an unlogged loss of the adapter's.
    trainer = hf_trainer(grad_accum=1, max_steps=5, batch_size=4, logging_strategy="steps",
                         logging_steps=2)  # fmt: skip
    trainer.add_callback(LogLoss())
    otel_train.instrument(trainer, **otel_kwargs)
    trainer.train()
    otel_train.shutdown()

    assert len(logged) == 2
    scalars = {p.attributes[c.A_NAME]: p.value for p in tel.points(c.SCALAR.name)}
    assert scalars["loss"] == logged[-1]
    assert scalars["learning_rate"] == trainer.lr_scheduler.get_last_lr()[0]


def _compiled_llama_run(instrument_with: dict[str, object] | None) -> tuple[int, int, int]:
    """Two steps of a tiny Llama whose forward is ``compile(fullgraph=True)``d (GPT-2's
    forward breaks the graph by itself): (steps, graph breaks, graphs), from a fresh Dynamo."""
    import torch._dynamo
    from adapter_helpers import VOCAB, PaddedTokens
    from torch._dynamo.utils import counters
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=SEQ)  # fmt: skip
    model = LlamaForCausalLM(config)
    model.compile(fullgraph=True, backend="eager")
    args = hf_trainer(grad_accum=1, max_steps=2).args  # (the shared ones: CPU, nothing saved)
    trainer = Trainer(model=model, args=args, train_dataset=PaddedTokens())
    if instrument_with is not None:
        otel_train.instrument(trainer, **instrument_with)
    trainer.train()
    otel_train.shutdown()
    torch._dynamo.reset()
    breaks = sum(counters["graph_break"].values())
    return trainer.state.global_step, breaks, counters["stats"]["unique_graphs"]


def test_a_fullgraph_compiled_forward_runs_as_without_otel_train(tel, otel_kwargs) -> None:
    """Issue 38 item 16: the forward pre-hook read the clock inside the compiled forward, a
    graph break (an error under fullgraph=True); it passes through while Dynamo traces."""
    without = _compiled_llama_run(None)
    assert without[1] == 0  # (the model compiles to one graph by itself)
    assert _compiled_llama_run(otel_kwargs) == without
    steps = step_spans(tel)
    assert len(steps) == 2
    assert all("backward" in tree(tel, s) for s in steps)
