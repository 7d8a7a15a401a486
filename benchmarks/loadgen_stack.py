"""The stack benchmarks/loadgen.py loads: ``scripts/stack up`` from deploy/ on free
loopback ports in a temporary run dir, optionally with the metrics pipeline ending in the
Collector (``--collector-only``) or a Prometheus that keeps classic histograms
(``--classic``)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STACK = [sys.executable, str(ROOT / "scripts" / "stack")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collector_only_config(run_dir: Path) -> Path:
    """deploy/otel-collector.yaml with the metrics pipeline ending in the debug exporter
    only: the Collector's own ceiling, without Prometheus's ingest behind it."""
    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "otel-collector.yaml").read_text())
    config["service"]["pipelines"]["metrics"]["exporters"] = ["debug"]
    path = run_dir / "otel-collector-only.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def classic_prometheus_config(run_dir: Path) -> Path:
    """deploy/prometheus.yml storing explicit-bucket histograms as classic histograms (one
    series per bucket, _sum and _count), as before native histograms: the "before" run."""
    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    config["otlp"]["convert_histograms_to_nhcb"] = False
    config["rule_files"] = [str(ROOT / "deploy" / "prometheus" / "rules" / "*.yml")]
    for job in config["scrape_configs"]:
        job["file_sd_configs"] = [{"files": [str(ROOT / "deploy/prometheus/targets/*.yml")]}]
    path = run_dir / "prometheus-classic" / "prometheus.yml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config))
    return path


def start_stack(run_dir: Path, collector_only: bool, classic: bool) -> dict[str, Any]:
    env = dict(os.environ, OTEL_TRAIN_STACK_RUN=str(run_dir), OTEL_TRAIN_STACK_HOST="127.0.0.1")
    if collector_only:
        env["OTEL_TRAIN_STACK_COLLECTOR_CONFIG"] = str(collector_only_config(run_dir))
    if classic:
        env["OTEL_TRAIN_STACK_PROMETHEUS_CONFIG"] = str(classic_prometheus_config(run_dir))
    loader = importlib.machinery.SourceFileLoader("otel_train_stack_loadgen", STACK[1])
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    names = list(module.PORTS)
    ports = {name: free_port() for name in names}
    env.update({f"OTEL_TRAIN_STACK_{k}_PORT": str(v) for k, v in ports.items()})
    up = subprocess.run([*STACK, "up"], env=env, capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        raise SystemExit(f"scripts/stack up failed:\n{up.stdout}{up.stderr}")
    state = json.loads((run_dir / "state.json").read_text())
    pids = {name: svc["pid"] for name, svc in state["services"].items()}
    return {"env": env, "ports": ports, "pids": pids}
