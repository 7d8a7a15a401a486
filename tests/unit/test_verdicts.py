"""Each verdict rule (processing/verdicts.py) triggered and not, on figures built for it;
the thresholds checked as settings are."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from scratch import job_env

from otel_train.processing.verdicts import Figures, verdicts
from otel_train.settings import ConfigError
from otel_train.settings.verdicts import VerdictSettings, verdict_table

GiB = 1024**3
# a rule's line's start: (figures that trigger it, figures under its default threshold,
# words of its line)
CASES = {
    "input-bound:": (
        Figures(data_stall=0.30),
        Figures(data_stall=0.04),
        "steps wait 30.0% of their time for the next batch",
    ),
    "straggler:": (
        Figures(rank_steps={0: 1.0, 1: 1.0, 2: 1.3}, rank_waits={0: 0.2, 1: 0.2, 2: 0.0}),
        Figures(rank_steps={0: 1.0, 1: 1.0, 2: 1.05}),
        "rank 2's median step less its collective waits is 1.30x the ranks' median",
    ),
    "collectives:": (
        Figures(collective_share=0.25),
        Figures(collective_share=0.09),
        "steps wait 25.0% of their time in collectives",
    ),
    "memory near the limit:": (
        Figures(memory={"forward": 0.5, "backward": 0.95}),
        Figures(memory={"backward": 0.8}),
        "backward reserves 95.0% of the device",
    ),
    "allocator:": (
        Figures(fragmentation={"optimizer": 0.45}),
        Figures(fragmentation={"optimizer": 0.1}),
        "45.0% of optimizer's reserved memory unused",
    ),
    "drift:": (
        Figures(drift=1.25),
        Figures(drift=1.05),
        "the last third of the steps is 25.0% slower",
    ),
    "telemetry drops:": (
        Figures(dropped={"queue_full": 12.0}),
        Figures(dropped={}),
        "12 items dropped (12 queue_full",
    ),
    "unsteady steps:": (
        Figures(steady=100, slow_steps=9),
        Figures(steady=100, slow_steps=1),
        "9 of 100 steady steps took over twice the median",
    ),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_triggers_with_its_figure_and_stays_quiet_under_it(rule: str) -> None:
    hot, cold, words = CASES[rule]
    (line,) = verdicts(hot)
    assert line.startswith(rule)
    assert words in line and "; try " in line and "verdict_" in line
    assert verdicts(cold) == []
    assert verdicts(Figures()) == []  # nothing measured: nothing said


def test_the_straggler_says_whether_it_waits_or_works() -> None:
    works = Figures(rank_steps={0: 1.0, 1: 1.0, 2: 1.5}, rank_waits={0: 0.3, 1: 0.3, 2: 0.01})
    waits = Figures(rank_steps={0: 1.0, 1: 1.0, 2: 1.5}, rank_waits={0: 0.01, 1: 0.01, 2: 0.3})
    assert "mostly works" in verdicts(works)[0] and "mostly waits" in verdicts(waits)[0]


def test_allocator_retries_trigger_alone() -> None:
    (line,) = verdicts(Figures(alloc_retries=3))
    assert line.startswith("allocator: 3 allocator retries")


def test_thresholds_are_settings() -> None:
    s = VerdictSettings.resolve({"verdict_data_stall": "0.5"})
    assert verdicts(Figures(data_stall=0.3), s) == []
    env = {"OTEL_TRAIN_VERDICT_DRIFT": "0.3"}
    assert verdicts(Figures(drift=1.25), VerdictSettings.resolve(environ=env)) == []
    for name in ("verdict_data_stall", "verdict_straggler", "verdict_dropped"):
        with pytest.raises(ConfigError, match=rf"'{name}' .* must be a"):
            VerdictSettings.resolve({name: "-1"})
    with pytest.raises(ConfigError, match=r"OTEL_TRAIN_VERDICT_MEMORY.*from 0 to 1; got '95'"):
        VerdictSettings.resolve(environ={"OTEL_TRAIN_VERDICT_MEMORY": "95"})
    with pytest.raises(ConfigError, match=r"unknown verdict setting.*accepted: verdict_data_stall"):
        VerdictSettings.resolve({"verdict_stall": 0.1})
    assert "| `verdict_memory` | `OTEL_TRAIN_VERDICT_MEMORY` | `0.9` |" in verdict_table()


def _job(*env: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    job = Path(__file__).with_name("compare_job.py")
    with tempfile.TemporaryDirectory() as runs:
        return subprocess.run([sys.executable, str(job), runs, "--delay", "0.002", "--steps", "12"],
                              env={**job_env(), **dict(env)}, capture_output=True, text=True,
                              timeout=180)  # fmt: skip


def test_the_run_summary_prints_the_verdicts_and_their_settings_are_checked_at_start() -> None:
    slow = _job()
    assert slow.returncode == 0, slow.stderr[-2000:]
    assert "verdict: input-bound: steps wait " in slow.stderr  # 16 ms a step for its batch
    quiet = _job(("OTEL_TRAIN_VERDICT_DATA_STALL", "0.999"))
    assert quiet.returncode == 0 and "run summary" in quiet.stderr
    assert "verdict:" not in quiet.stderr
    bad = _job(("OTEL_TRAIN_VERDICT_DATA_STALL", "2"))
    assert bad.returncode != 0 and "run summary" not in bad.stderr
    said = "otel_train setting 'verdict_data_stall' (from environment variable "
    assert (
        said + "OTEL_TRAIN_VERDICT_DATA_STALL) must be a number from 0 to 1; got '2'" in bad.stderr
    )


def test_docs_thresholds_table_is_the_settings_rendered() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text()
    pattern = r"<!-- verdict-table:start -->\n(.*?)\n<!-- verdict-table:end -->"
    block = re.search(pattern, text, re.S)
    assert block is not None, "docs/compare.md lost its verdict-table markers"
    assert block.group(1) == verdict_table()
