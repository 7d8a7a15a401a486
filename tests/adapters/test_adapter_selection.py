"""Which adapter instrument() picks, without importing frameworks it does not need, and
the error a missing framework gives."""

from __future__ import annotations

import subprocess
import sys

import pytest

import otel_train


def test_importing_otel_train_imports_no_trainer_framework() -> None:
    code = (
        "import sys, otel_train, otel_train.adapters.hf, otel_train.adapters.lightning, "
        "otel_train.adapters.torchtitan\n"
        "print(sorted(m for m in ('transformers', 'accelerate', 'lightning', "
        "'pytorch_lightning', 'torchtitan') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"


def _fake(module: str) -> object:
    cls = type("Trainer", (), {"__module__": module})
    return cls()


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("transformers.trainer", "transformers", "otel-train[hf]"),
        ("lightning.pytorch.trainer.trainer", "lightning.pytorch.callbacks",
         "otel-train[lightning]"),
        ("pytorch_lightning.trainer.trainer", "pytorch_lightning.callbacks",
         "otel-train[lightning]"),
    ],
)  # fmt: skip
def test_a_missing_framework_names_the_extra_to_install(
    module: str, blocked: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, blocked, None)  # makes `import blocked` fail
    with pytest.raises(ImportError, match=extra.replace("[", r"\[")):
        otel_train.instrument(_fake(module))
    assert otel_train.session.current() is None  # nothing started


def test_unsupported_targets_list_every_trainer() -> None:
    with pytest.raises(TypeError) as raised:
        otel_train.instrument(object())
    message = str(raised.value)
    for fragment in ("transformers.Trainer", "Lightning Trainer", "torchtitan-style",
                     "torch.nn.Module", "phases="):  # fmt: skip
        assert fragment in message
