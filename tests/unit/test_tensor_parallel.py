"""FLOPs under tensor parallelism (issue 38 item 13): each rank's count is what that rank
computed on its shards, not the DTensor operators' global shapes (which made MFU the TP
degree too high). Two ranks under torchrun with gloo, a ColwiseParallel then
RowwiseParallel MLP (tp_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_each_rank_counts_the_flops_of_its_own_shards(tmp_path: Path) -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(HERE / "tp_job.py"), str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        b, w, h, world = facts["batch"], facts["width"], facts["hidden"], facts["world"]
        # Whole model, per step: forward of both layers, the second layer's input and
        # weight gradients, the first layer's weight gradient (its input needs none).
        whole = 2 * b * w * h * 5
        assert facts["counted"] == [whole // world]
        assert facts["later"] == [whole // world] * 2
