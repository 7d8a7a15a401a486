"""A DDP training job under torchrun (gloo, CPU), instrumented with one call to
``otel_train.instrument``, exporting over OTLP/HTTP to a stack from ``running_stack``; and
deploy/prometheus.yml with the straggler rules' intervals shortened, so a short job has
scores. Shared by test_torchrun_ranks.py and test_thanos_store.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from scratch import job_env

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40

TRAIN = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist, otel_train
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = int(os.environ["SLOW_RANK"]) == rank

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 32), torch.nn.Linear(32, 64),
                                            torch.nn.ReLU(), torch.nn.Linear(64, 4))
        def forward(self, input_ids):
            if slow:
                time.sleep(0.06)   # the straggler: a slow forward pass on one rank
            return self.body(input_ids)

    torch.manual_seed(rank)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [{"input_ids": torch.randint(0, 100, (8, 16)), "labels": torch.randint(0, 4, (8,))}
            for _ in range(16)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    # A CPU has no datasheet peak: give one so MFU is exported like on a listed GPU.
    otel_train.instrument(model, optimizer=opt, dataloader=loader, peak_tflops=0.5)
    done, steps = 0, int(os.environ["STEPS"])
    while done < steps:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
            opt.zero_grad(); loss.backward(); opt.step()
            otel_train.record(loss=loss.detach())
            time.sleep(0.02)
            done += 1
            if done == steps:
                break
    assert otel_train.shutdown(), "shutdown missed its deadline"
    dist.destroy_process_group()
""")


def fast_rules(tmp: Path) -> Path:
    """deploy/prometheus.yml and its straggler rules, with short evaluation intervals only."""
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules/stragglers.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "3s"
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    config["rule_files"] = [str(tmp / "rules.yml")]
    for job in config["scrape_configs"]:
        job["file_sd_configs"] = [{"files": [str(ROOT / "deploy/prometheus/targets/*.yml")]}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    return tmp / "prometheus.yml"


def run_ddp(stack: Any, tmp: Path, ranks: int, slow: int) -> dict[str, Any]:
    """``torchrun --nproc_per_node=ranks`` of TRAIN, rank ``slow`` sleeping in its forward
    pass; returns the job's service name, start time, ranks and slow rank."""
    script = tmp / "train.py"
    script.write_text(TRAIN)
    service = f"ddp{ranks}-{uuid.uuid4().hex[:8]}"
    env = job_env()
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack['ports']['OTLP_HTTP']}",
            "OTEL_SERVICE_NAME": service,
            "OTEL_TRAIN_METRIC_EXPORT_INTERVAL": "0.5",
            "OTEL_TRAIN_CONSOLE": "off",
            "OTEL_TRAIN_PROMETHEUS": "false",
            "OMP_NUM_THREADS": "1",
            "SLOW_RANK": str(slow),
            "STEPS": str(STEPS),
        }
    )
    start = time.time()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={ranks}", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return {"service": service, "start": start, "ranks": ranks, "slow": slow}
