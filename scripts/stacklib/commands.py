"""scripts/stack, commands.

The stack's lifecycle commands: `up`, `down`, `status`, `validate`, `env`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .config import (
    AGENT_CONFIG,
    COLLECTOR_CONFIG,
    DEPLOY,
    JAEGER_CONFIG,
    K8S_PROMETHEUS_CONFIG,
    LISTEN_PORTS,
    PROMETHEUS_CONFIG,
    RULE_FILES,
    SERVICES,
    bin_dir,
    checked_run_dir,
    die,
    host,
    log,
    missing_binaries,
    ports,
    prometheus_config,
    prometheus_config_in_run,
    render_prometheus_config,
    run_dir,
    state_file,
    write_private,
)
from .services import (
    _http_ok,
    _log_tail,
    _port_free,
    _proc_start_time,
    _stop_all,
    endpoints,
    is_alive,
    read_state,
    runs_our_binary,
    service_plan,
    write_state,
)


def cmd_up(args: argparse.Namespace) -> int:
    missing = missing_binaries()
    if missing:
        die(
            "binaries not built at the pinned versions: "
            + "; ".join(f"{k}: {v}" for k, v in missing.items())
            + " -- run `scripts/stack build`"
        )
    state = read_state()
    if state:
        alive = {
            n: s
            for n, s in state.get("services", {}).items()
            if is_alive(s["pid"], s.get("start_time")) and runs_our_binary(s["pid"])
        }
        if (
            alive
            and len(alive) == len(SERVICES)
            and all(_http_ok(u) for s in alive.values() for u in s["ready"])
        ):
            log(f"already running (run dir {run_dir()})")
            _print_endpoints(state["endpoints"])
            return 0
        if alive:
            running = ", ".join(f"{n} pid {s['pid']}" for n, s in alive.items())
            die(f"a previous stack is partly running ({running}); run `scripts/stack down` first")
        state_file().unlink(missing_ok=True)

    h, p = host(), ports()
    plan = service_plan()
    seen: dict[int, str] = {}
    for name, port in p.items():
        if port in seen:
            other = f"OTEL_TRAIN_STACK_{seen[port]}_PORT"
            die(f"OTEL_TRAIN_STACK_{name}_PORT and {other} are both {port}")
        seen[port] = name
    busy = [
        f"{name}={p[name]} (OTEL_TRAIN_STACK_{name}_PORT)"
        for name in LISTEN_PORTS
        if not _port_free(h, p[name])
    ]
    if busy:
        die(f"ports already in use on {h}: {', '.join(busy)}")

    rd = checked_run_dir(create=True)
    assert rd is not None
    for data in (rd / "prometheus-data", rd / "thanos-receive-data", rd / "victorialogs-data"):
        if data.exists() and not args.keep_data:
            shutil.rmtree(data)
    render_prometheus_config(prometheus_config(), prometheus_config_in_run(), p)
    state = {
        "version": 1,
        "run_dir": str(rd),
        "host": h,
        "ports": p,
        "endpoints": endpoints(),
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "services": {},
    }
    timeout = float(os.environ.get("OTEL_TRAIN_STACK_TIMEOUT", args.timeout))
    deadline = time.monotonic() + timeout
    try:
        # One at a time, each ready before the next: the collector starts last,
        # when both of its destinations already accept data.
        for name in SERVICES:
            svc = plan[name]
            (rd / f"{name}.log").unlink(missing_ok=True)
            retries = svc.get("start_retries", 0)
            while not _start_service(name, svc, rd, state, deadline, timeout, retries > 0):
                retries -= 1
                wait = 61 - _dt.datetime.now().second  # (past the next minute's start)
                log(f"{name} exited during start-up; starting it again in {wait} s")
                time.sleep(wait)
                deadline += wait
            log(f"{name} ready")
    except BaseException:
        left = _stop_all(state, grace=5)
        state_file().unlink(missing_ok=True)
        for name in SERVICES:
            (rd / f"{name}.pid").unlink(missing_ok=True)
        if left:
            print(f"[stack] could not stop: {', '.join(left)}", file=sys.stderr)
        raise
    log(f"stack up (run dir {rd})")
    _print_endpoints(state["endpoints"])
    return 0


def _start_service(
    name: str,
    svc: dict[str, Any],
    rd: Path,
    state: dict[str, Any],
    deadline: float,
    timeout: float,
    retry: bool,
) -> bool:
    """Start ``name`` and wait until it is ready; False if it exited during start-up and
    ``retry`` says it may be started again (the caller waits first), else it dies."""
    log_path = rd / f"{name}.log"
    env = dict(os.environ)
    env.update(svc["env"])
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(log_fd, "ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            svc["cmd"],
            env=env,
            cwd=str(rd),
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    start_time = None
    for _ in range(50):
        start_time = _proc_start_time(proc.pid)
        if start_time:
            break
        time.sleep(0.01)
    write_private(rd / f"{name}.pid", f"{proc.pid}\n")
    state["services"][name] = {
        "pid": proc.pid,
        "start_time": start_time,
        "cmd": svc["cmd"],
        "env": svc["env"],
        "log": str(log_path),
        "ready": svc["ready"],
    }
    write_state(state)
    log(f"started {name} (pid {proc.pid}), log {log_path}")
    pending = list(svc["ready"])
    while pending:
        if not is_alive(proc.pid, start_time):
            proc.wait()  # (reaped: it is gone)
            if retry:
                return False
            die(f"{name} exited during start-up; last log lines:\n{_log_tail(log_path)}")
        if _http_ok(pending[0]):
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            die(
                f"{name} not ready after {timeout:.0f}s ({pending[0]}); last log lines:\n"
                f"{_log_tail(log_path)}"
            )
        time.sleep(0.2)
    return True


def _print_endpoints(ep: dict[str, str]) -> None:
    log(f"  OTLP/HTTP in:  {ep['otlp_http']}   (OTEL_EXPORTER_OTLP_ENDPOINT)")
    log(f"  OTLP/gRPC in:  {ep['otlp_grpc']}")
    log(f"  Jaeger API:    {ep['jaeger_api']}   (no UI in this build: use compose for it)")
    log(f"  Prometheus:    {ep['prometheus']}/api/v1   (no UI in this build)")
    if "thanos_query" in ep:
        log(f"  Thanos query:  {ep['thanos_query']}/api/v1   (the store Prometheus writes to)")
    if "victorialogs" in ep:
        log(f"  VictoriaLogs:  {ep['victorialogs']}/select/logsql/query   (logs, LogsQL)")
    if "training_metrics" in ep:
        log(f"  scrapes:       {ep['training_metrics']}   (the job's OTEL_TRAIN_PROMETHEUS_PORT)")


def cmd_down(args: argparse.Namespace) -> int:
    state = read_state()
    rd = run_dir()
    if state is None:
        # No state: still honour stray pid files from an interrupted `up`.
        pids = {}
        for name in SERVICES:
            with contextlib.suppress(OSError, ValueError):
                pids[name] = {"pid": int((rd / f"{name}.pid").read_text().strip())}
        if not pids:
            log(f"nothing running (no state in {rd})")
            return 0
        # (without a start time: _stop_pid signals only processes that run our binaries)
        log("no state file; using pid files (cannot check for pid reuse)")
        state = {"services": pids}
    left = _stop_all(state, grace=args.grace)
    if left:
        die(f"processes still alive after SIGKILL: {', '.join(left)}")
    for name in SERVICES:
        (rd / f"{name}.pid").unlink(missing_ok=True)
    state_file().unlink(missing_ok=True)
    if args.clean:
        shutil.rmtree(rd, ignore_errors=True)
    log("stack down: no process left")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = read_state()
    report: dict = {"run_dir": str(run_dir()), "services": {}}
    if state is None:
        report["running"] = False
    else:
        for name in SERVICES:
            svc = state["services"].get(name)
            if not svc:
                report["services"][name] = {"alive": False, "ready": False}
                continue
            alive = is_alive(svc["pid"], svc.get("start_time"))
            ready = alive and all(_http_ok(u) for u in svc["ready"])
            report["services"][name] = {
                "pid": svc["pid"],
                "alive": alive,
                "ready": ready,
                "log": svc["log"],
            }
        report["endpoints"] = state["endpoints"]
        report["running"] = any(s["alive"] for s in report["services"].values())
    up = [n for n, s in report["services"].items() if s.get("ready")]
    if args.json:
        print(json.dumps(report, indent=2))
    elif not report["running"]:
        print(f"stack not running (run dir {run_dir()})")
    else:
        for name, s in report["services"].items():
            word = "ready" if s.get("ready") else ("alive, NOT ready" if s.get("alive") else "DOWN")
            print(f"{name:<15} {word:<17} pid {s.get('pid', '-')}  log {s.get('log', '-')}")
        for key, url in report["endpoints"].items():
            print(f"  {key:<18} {url}")
    if not report["running"]:
        return 3
    return 0 if len(up) == len(SERVICES) else 1


def cmd_validate(args: argparse.Namespace) -> int:
    missing = missing_binaries()
    checks = [
        ("otelcol", [str(bin_dir() / "otelcol"), "validate", f"--config={COLLECTOR_CONFIG}"]),
        ("otelcol", [str(bin_dir() / "otelcol"), "validate", f"--config={AGENT_CONFIG}"]),
        ("jaeger", [str(bin_dir() / "jaeger"), "validate", f"--config={JAEGER_CONFIG}"]),
        ("promtool", [str(bin_dir() / "promtool"), "check", "config", str(PROMETHEUS_CONFIG)]),
        ("promtool", [str(bin_dir() / "promtool"), "check", "config", str(K8S_PROMETHEUS_CONFIG)]),
        ("promtool", [str(bin_dir() / "promtool"), "check", "rules", *map(str, RULE_FILES)]),
    ]
    failed = []
    for name, cmd in checks:
        if name in missing:
            die(f"{name} not built ({missing[name]}); run `scripts/stack build`")
        log(" ".join(cmd))
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=str(DEPLOY), timeout=120)
        out = (res.stdout + res.stderr).strip()
        if out:
            print(out)
        if res.returncode != 0:
            failed.append(name)
    if failed:
        die(f"validation failed: {', '.join(failed)}")
    log("all configs valid")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    state = read_state()
    ep = state["endpoints"] if state else endpoints()
    training = (state or {}).get("ports", {}).get("TRAINING_METRICS", ports()["TRAINING_METRICS"])
    print(f"export OTEL_EXPORTER_OTLP_ENDPOINT={ep['otlp_http']}")
    print("export OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
    print("export OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=cumulative")
    # The port this stack's Prometheus scrapes (job otel-train-inprocess).
    print(f"export OTEL_TRAIN_PROMETHEUS_PORT={training}")
    return 0
