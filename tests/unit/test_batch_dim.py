"""Samples of sequence-first batches (issue 38 item 11): word_language_model's
``(35, 20)`` batches are 20 samples with ``batch_dim=1``, in the plain-loop adapter and
under zero-code instrumentation (``OTEL_TRAIN_BATCH_DIM``); the summary says how samples
were counted; a bad value is refused at configure time."""

from __future__ import annotations

import pytest
from otel_helpers import providers, step_spans
from word_lm import BATCH, BPTT, RNNModel, batchify, train

import otel_train
from otel_train import contract as c
from otel_train.instrumentor import OtelTrainInstrumentor
from otel_train.settings import ConfigError
from otel_train.testing import InMemoryTelemetry

ITERATIONS = 4


def counted(tel: InMemoryTelemetry, out: str) -> tuple[set[int], set[int], str]:
    steps = step_spans(tel.spans())
    assert len(steps) == ITERATIONS
    samples = {s.attributes[c.STEP_SAMPLES.key] for s in steps}
    tokens = {s.attributes[c.STEP_TOKENS.key] for s in steps}
    return samples, tokens, out.split("run summary:")[1]


def run_plain(
    capsys: pytest.CaptureFixture[str], **settings: int
) -> tuple[set[int], set[int], str]:
    tel = InMemoryTelemetry()
    model = RNNModel()
    otel_train.instrument(model, console="stdout", console_every=0, trace_steps="all",
                          **providers(tel), **settings)  # fmt: skip
    train(model, batchify(ITERATIONS))
    otel_train.shutdown()
    return counted(tel, capsys.readouterr().out)


def test_sequence_first_batches_count_their_second_dimension(
    capsys: pytest.CaptureFixture[str],
) -> None:
    samples, tokens, summary = run_plain(capsys, batch_dim=1)
    assert samples == {BATCH}
    assert tokens == {BPTT * BATCH}
    assert "samples: dimension 1 of each batch's first tensor (sequence-first)" in summary


def test_the_summary_says_the_default_counts_the_first_dimension(
    capsys: pytest.CaptureFixture[str],
) -> None:
    samples, _, summary = run_plain(capsys)
    assert samples == {BPTT}
    assert "samples: dimension 0 of each batch's first tensor (batch-first; batch_dim=1" in summary


def test_sequence_first_batches_under_zero_code(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRAIN_BATCH_DIM", "1")
    tel = InMemoryTelemetry()
    inst = OtelTrainInstrumentor()
    inst.instrument(tracer_provider=tel.tracer_provider, meter_provider=tel.meter_provider)
    try:
        otel_train.configure(console="stdout", console_every=0, trace_steps="all",
                             **providers(tel))  # fmt: skip
        train(RNNModel(), batchify(ITERATIONS))
        otel_train.shutdown()
    finally:
        inst.uninstrument()
    samples, _, summary = counted(tel, capsys.readouterr().out)
    assert samples == {BATCH}
    assert "samples: dimension 1" in summary


@pytest.mark.parametrize("value", [2, -1, "seq", 0.5])
def test_a_bad_batch_dim_is_refused_by_name(value: object) -> None:
    with pytest.raises(ConfigError, match=r"'batch_dim' .* must be an integer from 0 to 1"):
        otel_train.instrument(RNNModel(), batch_dim=value, console="off")


def test_a_bad_batch_dim_variable_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRAIN_BATCH_DIM", "batch")
    with pytest.raises(ConfigError, match=r"OTEL_TRAIN_BATCH_DIM\) must be an integer from 0"):
        otel_train.configure(console="off")
