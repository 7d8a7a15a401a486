"""scripts/gpu-check's plan, checkable without a GPU (``--dry-run``): the GPU lane's parts
fit under its budget with the CPU-only tail off by default, and wheels stamped with
another tree than this one are refused before anything runs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU_PARTS = {"gpu tests", "gpu timing", "cuda calls", "pump cuda", "pump cuda, no memory"}


def _dry_run(wheels: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    full.update(env, GPU_CHECK_WHEELS=str(wheels))
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-check"), "--dry-run"],
        env=full, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _stamped(tmp_path: Path, stamp: str | None = None) -> Path:
    wheels = tmp_path / "whl"
    wheels.mkdir()
    if stamp is None:
        tree = subprocess.run([str(REPO / "scripts" / "tree-hash")], capture_output=True,
                              text=True, check=True, timeout=60)  # fmt: skip
        stamp = tree.stdout.strip()
    (wheels / "tree.sha256").write_text(stamp + "\n")
    return wheels


def _plan(out: str) -> dict[str, int]:
    """Part name -> cap (s), from the plan's rows."""
    rows = re.findall(r"^  (\S.*?)\s+(\d+)  \S", out, flags=re.M)
    return {name: int(cap) for name, cap in rows}


def test_the_scripts_parse() -> None:
    for name in ("gpu-check", "gpu-wheels", "tree-hash"):
        subprocess.run(["bash", "-n", str(REPO / "scripts" / name)], check=True, timeout=30)


def test_the_gpu_lane_fits_its_budget_with_the_tail_off(tmp_path: Path) -> None:
    done = _dry_run(_stamped(tmp_path))
    assert done.returncode == 0, done.stderr
    plan = _plan(done.stdout)
    assert set(plan) >= GPU_PARTS, plan
    assert not [name for name in plan if "tail" in name or "beside" in name], plan
    budget = int(re.search(r"budget (\d+) s", done.stdout)[1])
    assert budget <= 420
    total = sum(plan.values())
    print(f"gpu-check caps: {plan} = {total} s of {budget} s")
    assert total < budget
    assert f"GPU lane {total} s" in done.stdout


def test_the_tail_runs_beside_only_when_asked(tmp_path: Path) -> None:
    done = _dry_run(_stamped(tmp_path), GPU_CHECK_TAIL="1")
    assert done.returncode == 0, done.stderr
    plan = _plan(done.stdout)
    beside = {name: cap for name, cap in plan.items() if name.endswith("(beside)")}
    assert "tail (beside)" in beside
    gpu_lane = sum(cap for name, cap in plan.items() if name not in beside)
    assert sum(beside.values()) <= gpu_lane  # (it ends with the GPU lane at the latest)


def test_wheels_of_another_tree_are_refused(tmp_path: Path) -> None:
    done = _dry_run(_stamped(tmp_path, "0" * 64))
    assert done.returncode == 1
    assert "not built from this tree" in done.stderr
    assert "wheels: built from this tree" not in done.stdout
    unstamped = tmp_path / "none"
    unstamped.mkdir()
    done = _dry_run(unstamped)
    assert done.returncode == 1 and "stamp none" in done.stderr
