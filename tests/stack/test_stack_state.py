"""scripts/stack trusts only its own run dir and signals only what it started.

A run dir another user made, a symlink, or one open to others is refused; a state file
or pid file naming a process that does not run one of the stack's binaries leaves that
process alone. None of this needs the binaries built: `down` and `status` run without.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack"


def _stack(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(STACK), *args], env=env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_TRAIN_STACK_")}
    env.pop("XDG_RUNTIME_DIR", None)
    env.update(extra)
    return env


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen]:
    """A process of this user's that the stack did not start (its own process group, as
    the stack's services have)."""
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _start_time(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()[19]


def _plant_state(rd: Path, pid: int) -> None:
    """A state.json (and pid file) such as `up` writes, naming ``pid`` as the collector."""
    state = {
        "version": 1,
        "services": {
            "otelcol": {"pid": pid, "start_time": _start_time(pid), "cmd": ["otelcol"],
                        "env": {}, "log": str(rd / "otelcol.log"), "ready": []},
        },
        "endpoints": {},
    }  # fmt: skip
    (rd / "state.json").write_text(json.dumps(state))
    (rd / "otelcol.pid").write_text(f"{pid}\n")


def test_the_default_run_dir_is_the_users_own(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    done = _stack(_env(XDG_RUNTIME_DIR=str(xdg)), "status", "--json")
    assert json.loads(done.stdout)["run_dir"] == str(xdg / "otel-train-stack")
    home = tmp_path / "home"
    done = _stack(_env(HOME=str(home)), "status", "--json")
    expected = home / ".cache" / "otel-train" / "stack" / "run"
    assert json.loads(done.stdout)["run_dir"] == str(expected)


@pytest.mark.parametrize("with_state", [True, False], ids=["state.json", "pid files only"])
def test_down_leaves_a_process_it_did_not_start_alone(
    tmp_path: Path, bystander: subprocess.Popen, with_state: bool
) -> None:
    rd = tmp_path / "run"
    rd.mkdir(mode=0o700)
    _plant_state(rd, bystander.pid)
    if not with_state:
        (rd / "state.json").unlink()
    done = _stack(_env(OTEL_TRAIN_STACK_RUN=str(rd)), "down", "--grace", "1")
    assert bystander.poll() is None, f"down signalled pid {bystander.pid}:\n{done.stdout}"
    assert done.returncode == 0, done.stderr
    assert f"pid {bystander.pid} does not run a binary" in done.stdout


def test_a_run_dir_that_is_a_symlink_is_refused(
    tmp_path: Path, bystander: subprocess.Popen
) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    _plant_state(real, bystander.pid)
    link = tmp_path / "run"
    link.symlink_to(real)
    for command in (["down", "--clean"], ["status"]):
        done = _stack(_env(OTEL_TRAIN_STACK_RUN=str(link)), *command)
        assert done.returncode != 0, command
        assert "is a symlink" in done.stderr, done.stderr
    assert bystander.poll() is None
    assert (real / "state.json").exists()  # (not followed, not cleaned)


def test_a_run_dir_others_may_write_to_is_refused(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    rd.mkdir()
    rd.chmod(0o777)  # as /tmp/otel-train-stack could be, made by anyone
    done = _stack(_env(OTEL_TRAIN_STACK_RUN=str(rd)), "down")
    assert done.returncode != 0
    assert "writable by others" in done.stderr, done.stderr


def test_a_run_dir_of_another_user_is_refused(
    tmp_path: Path, stack_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's directory: this process seen as another uid (as root here, or not,
    chown to another user is not open to a test)."""
    rd = tmp_path / "run"
    rd.mkdir(mode=0o700)
    monkeypatch.setenv("OTEL_TRAIN_STACK_RUN", str(rd))
    monkeypatch.setattr(os, "getuid", lambda: os.stat(rd).st_uid + 1)
    with pytest.raises(SystemExit):
        stack_module.main(["down"])


def test_the_run_dir_is_made_private_and_its_writes_follow_no_link(
    tmp_path: Path, stack_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` makes the run dir with mode 0700 (whatever the umask) and writes its state and
    pid files as new files: a link planted at their names is replaced, not written through."""
    rd = tmp_path / "parent" / "run"
    monkeypatch.setenv("OTEL_TRAIN_STACK_RUN", str(rd))
    old = os.umask(0o022)
    try:
        made = stack_module.checked_run_dir(create=True)
    finally:
        os.umask(old)
    assert made == rd
    assert stat.S_IMODE(os.lstat(rd).st_mode) == 0o700
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    for name in ("state.json", "state.json.tmp"):
        (rd / name).symlink_to(victim)
    stack_module.write_state({"services": {}})
    assert victim.read_text() == "untouched"
    assert not (rd / "state.json").is_symlink()
    assert json.loads((rd / "state.json").read_text()) == {"services": {}}
    assert stat.S_IMODE(os.lstat(rd / "state.json").st_mode) == 0o600
