"""The plain-loop adapter leaves no trace in what a user keeps of the model: a whole-model
``torch.save`` (reloaded with ``weights_only=True`` where otel-train is not installed),
``copy.deepcopy`` and ``state_dict()`` are what they are without otel-train."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import torch
from otel_helpers import (
    children_of,
    providers,
    step_spans,
    tiny_loader,
    tiny_model,
    train_epoch,
)

import otel_train
from otel_train import contract as c
from otel_train.testing import InMemoryTelemetry

# Loads a whole-model save as torch does by default (weights_only=True, the model's own
# classes allowed), in a Python where otel_train cannot be imported.
RELOAD = """
import sys
sys.modules["otel_train"] = None  # (an editable install would find it otherwise)
import torch
from torch import nn
torch.serialization.add_safe_globals([nn.Sequential, nn.Linear, nn.ReLU])
model = torch.load(sys.argv[1], weights_only=True)
print(type(model).__module__, type(model).__qualname__, sorted(vars(model)))
print(model(torch.ones(2, 8)).tolist())
"""


def saved(model: torch.nn.Module) -> dict[str, bytes]:
    """``torch.save(model)``'s records (the pickle and the tensors' bytes), without the
    random serialization id each save writes."""
    buf = io.BytesIO()
    torch.save(model, buf)
    with zipfile.ZipFile(buf) as z:
        return {n: z.read(n) for n in z.namelist() if not n.endswith("serialization_id")}


def instrumented_after_a_step() -> torch.nn.Module:
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, console="off", **providers(InMemoryTelemetry()))
    train_epoch(model, opt, tiny_loader(n=8))
    return model


def trained_plain() -> torch.nn.Module:
    model, opt = tiny_model()
    train_epoch(model, opt, tiny_loader(n=8))
    return model


def test_a_whole_model_save_is_the_one_made_without_otel_train(tmp_path: Path) -> None:
    model = instrumented_after_a_step()
    records = saved(model)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    otel_train.shutdown()
    assert records == saved(trained_plain())  # byte for byte
    out = subprocess.run(
        [sys.executable, "-I", "-c", RELOAD, str(path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    kind, expected = out.stdout.splitlines()
    plain = trained_plain()
    assert kind == f"torch.nn.modules.container Sequential {sorted(vars(plain))}"
    with torch.no_grad():
        assert expected == str(plain(torch.ones(2, 8)).tolist())


def test_deepcopy_and_state_dict_are_those_of_the_model_without_otel_train() -> None:
    model = instrumented_after_a_step()
    plain = trained_plain()
    ema = copy.deepcopy(model)
    assert type(ema) is type(plain)
    assert sorted(vars(ema)) == sorted(vars(copy.deepcopy(plain)))
    assert saved(ema) == saved(plain)
    state, plain_state = model.state_dict(), plain.state_dict()
    assert list(state) == list(plain_state)
    assert all(torch.equal(state[k], plain_state[k]) for k in state)
    otel_train.shutdown()


PHASES = ["forward", "backward", "optimizer"]


def test_another_instance_of_the_models_class_runs_its_forward_untimed() -> None:
    """A replica made as DataParallel's is (``type(model).__new__``, the model's
    attributes copied) runs the class's own forward, untimed: the steps are the
    model's alone."""
    tel = InMemoryTelemetry()
    model, opt = tiny_model()
    otel_train.instrument(model, optimizer=opt, console="off", trace_steps="all",
                          **providers(tel))  # fmt: skip
    replica = type(model).__new__(type(model))
    replica.__dict__ = model.__dict__.copy()
    x = torch.ones(2, 8)
    for _ in range(3):
        assert torch.equal(replica(x), model.__class__.forward(model, x))
    train_epoch(model, opt, tiny_loader(n=16))
    otel_train.shutdown()
    spans = tel.spans()
    steps = step_spans(spans)
    assert [[k.name for k in children_of(spans, s)] for s in steps] == [PHASES, PHASES]
    assert [s.attributes[c.STEP_SAMPLES.key] for s in steps] == [8, 8]
