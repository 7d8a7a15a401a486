"""scripts/stack's start of one service (stacklib/commands.py): ready, or its exit during
start-up either ends `up` or, where its plan allows a retry, hands the retry back.

Thanos receive v0.42.x can panic when started in a minute when its tenant pruning is due
(thanos#8990): the stack starts it once more a minute on (its plan's ``start_retries``).
Real processes here, in a private run directory: one that exits at once, one that serves.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def _commands(stack_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OTEL_TRAIN_STACK_RUN", str(tmp_path))  # (its state file too)
    from stacklib import commands  # (scripts/ is on the path once scripts/stack is loaded)

    return commands


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(commands: Any, svc: dict[str, Any], tmp_path: Path, retry: bool) -> bool:
    state: dict[str, Any] = {"services": {}}
    return bool(
        commands._start_service("svc", svc, tmp_path, state, time.monotonic() + 30, 30, retry)
    )


def test_an_exit_during_start_up_is_handed_back_for_a_retry_or_ends_up(
    stack_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = _commands(stack_module, tmp_path, monkeypatch)
    svc = {"cmd": ["sh", "-c", "echo panic; exit 2"], "env": {},
           "ready": [f"http://127.0.0.1:{_free_port()}/"]}  # fmt: skip
    assert _start(commands, svc, tmp_path, retry=True) is False
    with pytest.raises(SystemExit):
        _start(commands, svc, tmp_path, retry=False)
    assert (tmp_path / "svc.log").read_text().count("panic") == 2  # (both attempts kept)


def _serving(commands: Any, tmp_path: Path) -> dict[str, Any]:
    """Start a service that answers (an HTTP server), wait until it is ready, stop it."""
    port = _free_port()
    svc = {"cmd": [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
           "env": {}, "ready": [f"http://127.0.0.1:{port}/"]}  # fmt: skip
    try:
        assert _start(commands, svc, tmp_path, retry=True) is True
    finally:
        os.kill(int((tmp_path / "svc.pid").read_text()), signal.SIGTERM)
    return svc


# (The launcher leaves the service running on purpose: its Popen goes unwaited.)
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_service_that_answers_is_ready(
    stack_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = _commands(stack_module, tmp_path, monkeypatch)
    _serving(commands, tmp_path)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_service_start_writes_through_no_planted_link(
    stack_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pid file is written as a new 0600 file over a link planted at its name; a link
    planted at the log's name stops the start (ELOOP) instead of being written through."""
    commands = _commands(stack_module, tmp_path, monkeypatch)
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("untouched")
    (tmp_path / "svc.pid").symlink_to(victim)
    svc = _serving(commands, tmp_path)
    assert victim.read_text() == "untouched"
    assert not (tmp_path / "svc.pid").is_symlink()
    for name in ("svc.pid", "svc.log"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    (tmp_path / "svc.log").unlink()
    (tmp_path / "svc.log").symlink_to(victim)
    with pytest.raises(OSError):
        _start(commands, svc, tmp_path, retry=True)
    assert victim.read_text() == "untouched"
