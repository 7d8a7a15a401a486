"""Samples of sequence-first batches (issue 38 item 11): word_language_model's
``(35, 20)`` batches are 20 samples with ``batch_dim=1``, in the plain-loop adapter and
under zero-code instrumentation (``OTEL_TRAIN_BATCH_DIM``); the summary says how samples
were counted; a bad value is refused at configure time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from otel_helpers import providers, step_spans
from scratch import job_env
from word_lm import BATCH, BPTT, RNNModel, batchify, train

import otel_train
from otel_train import contract as c
from otel_train.instrumentor import OtelTrainInstrumentor
from otel_train.runs.record_data import load_run
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


JOB = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[2])
    import otel_train
    from otel_train import session
    from word_lm import RNNModel, batchify, train

    model = RNNModel()
    otel_train.instrument(model, batch_dim=1, prometheus=False, console_every=0,
                          run_dir=sys.argv[1])
    train(model, batchify(int(sys.argv[3])))
    sidecar = session.current().feeder is not None
    print(json.dumps({"sidecar": sidecar, "shutdown": otel_train.shutdown()}))
""")


def test_the_sidecar_s_summary_and_record_count_sequence_first_samples(tmp_path: Path) -> None:
    """Where the sidecar makes the summary and the run record, the notes and counts
    cross to it."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    runs = tmp_path / "runs"
    here = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, str(script), str(runs), here, str(ITERATIONS)],
                          env=job_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["sidecar"] and result["shutdown"], done.stderr[-3000:]
    summary = done.stderr.split("run summary:")[1]
    assert "samples: dimension 1 of each batch's first tensor (sequence-first)" in summary
    assert "no torch.optim optimizer stepped" in summary
    (rank,) = load_run(next(runs.iterdir())).ranks
    last = rank.snapshots[-1].values
    assert last[(c.STEPS.name, ())] == ITERATIONS
    assert last[(c.SAMPLES.name, ())] == ITERATIONS * BATCH
