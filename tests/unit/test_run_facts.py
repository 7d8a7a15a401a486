"""The run facts beside a run record (export/run_facts.py): what they hold, and how they
are written (never through a planted link, never into a directory not the record's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from otel_train import contract as c
from otel_train.export.record import RecordPlan
from otel_train.export.run_facts import changed_settings, run_facts, write_run_facts
from otel_train.runs.files import RecordPart, read_facts
from otel_train.settings import Settings


def _plan(directory: Path) -> RecordPlan:
    return RecordPlan(str(directory), "rank0", 1 << 20, shared=True)


def test_the_settings_that_differ_from_their_defaults_without_where_telemetry_goes() -> None:
    settings = Settings.resolve({"trace_steps": "all", "flops": "estimate",
                                 "run_dir": "/data/runs", "otlp_endpoint": "http://u:p@h:4318",
                                 "prometheus_port": 9999})  # fmt: skip
    assert changed_settings(settings) == "trace_steps='all', flops='estimate'"
    assert changed_settings(Settings()) == ""


def test_facts_are_written_beside_the_record_and_read_back(tmp_path: Path) -> None:
    facts = run_facts(Settings.resolve({"trace_steps": "all"}), "9.9", compiled=True)
    assert write_run_facts(_plan(tmp_path), facts)
    written = tmp_path / "rank0.run.json"
    assert written.stat().st_mode & 0o777 == 0o600
    part = RecordPart(tmp_path / "rank0.traces.jsonl", "rank0", "traces", 0)
    assert read_facts(part) == {
        c.RUN_TORCH_VERSION.key: torch.__version__,
        c.RUN_TORCH_COMPILE.key: True,
        c.RUN_VERSION.key: "9.9",
        c.RUN_SETTINGS.key: "trace_steps='all'",
    }
    written.write_text("[1, 2]")  # not an object: no facts
    assert read_facts(part) == {}


def test_a_planted_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "rank0.run.json").symlink_to(victim)
    assert write_run_facts(_plan(run), {"x": 1})
    assert victim.read_text() == "precious\n"
    assert not (run / "rank0.run.json").is_symlink()
    assert json.loads((run / "rank0.run.json").read_text()) == {"x": 1}
    assert sorted(os.listdir(run)) == ["rank0.run.json"]  # no temporary left


def test_no_directory_no_facts(tmp_path: Path) -> None:
    assert not write_run_facts(_plan(tmp_path / "never-recorded"), {"x": 1})
    assert not (tmp_path / "never-recorded").exists()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others can write to it: not the record's own
    assert not write_run_facts(_plan(shared), {"x": 1})


def test_torch_version_without_importing_torch_is_torch_s_own() -> None:
    """The sidecar never imports torch: the version it puts on the resource is the one the
    training process's torch.__version__ says (the local part, such as +cu132, kept)."""
    code = ("import sys; from otel_train.export.run_facts import torch_version; "
            "print(torch_version(), 'torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [torch.__version__, "False"]
