"""The OOM snapshot's observer on the CPU (issue 22 item 11): the allocator's OOM observer
also fires for OOMs PyTorch catches itself (cuDNN trying a smaller workspace), so the dump
waits until the error reaches a phase, a guard, or close(); a step boundary in between
means someone caught it. History records allocation stacks only. The allocator and its
history are stand-ins here (tests/gpu/test_memory_snapshot.py runs the real ones)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cuda_standin
import pytest
import torch

from otel_train.debug import memory_snapshot
from otel_train.debug.memory_snapshot import MemorySnapshot


@pytest.fixture
def history(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """torch.cuda.memory's history calls, recorded; dumps write an empty file."""
    calls: list[dict[str, Any]] = []
    with cuda_standin.installed(monkeypatch):

        def record(enabled: Any = "all", **kw: Any) -> None:
            calls.append({"enabled": enabled, **kw})

        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: Path(path).touch())
        monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", lambda fn: None,
                            raising=False)  # fmt: skip
        yield calls


def _oom() -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")


def test_history_keeps_allocation_stacks_only(
    history: list[dict[str, Any]], tmp_path: Path
) -> None:
    snap = MemorySnapshot(tmp_path)
    assert snap.start()
    assert history[0]["context"] == "alloc"
    snap.close()


def test_an_oom_pytorch_catches_itself_is_not_dumped(
    history: list[dict[str, Any]], tmp_path: Path
) -> None:
    snap = MemorySnapshot(tmp_path)
    snap.step_started(0)
    assert snap.recording
    memory_snapshot._observe_oom(0, 4 << 30, 0, 0)  # cuDNN's workspace try, caught in C++
    snap.step_ended(0)  # the step went on and finished
    snap.step_started(1)
    snap.close()
    assert snap.paths == [] and list(tmp_path.iterdir()) == []
    assert snap.recoveries == 1


def test_an_oom_that_reaches_a_phase_is_dumped_once(
    history: list[dict[str, Any]], tmp_path: Path
) -> None:
    snap = MemorySnapshot(tmp_path)
    snap.step_started(0)
    memory_snapshot._observe_oom(0, 4 << 30, 0, 0)
    err = _oom()
    path = snap.handle_error(err)  # the innermost phase's exit
    assert path is not None and Path(path).exists()
    assert snap.handle_error(err) is None  # its parent phase: the same error, linked already
    snap.close()
    assert snap.paths == [path]


def test_an_oom_outside_any_phase_is_dumped_at_close(
    history: list[dict[str, Any]], tmp_path: Path
) -> None:
    snap = MemorySnapshot(tmp_path)
    assert snap.start()
    memory_snapshot._observe_oom(0, 4 << 30, 0, 0)  # (optimizer.step(): no phase exit runs)
    snap.close()
    assert len(snap.paths) == 1 and "memory-oom-" in snap.paths[0]
