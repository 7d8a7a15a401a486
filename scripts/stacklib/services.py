"""scripts/stack, services.

Each service's command line, environment and readiness URL; processes and state.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from .config import (
    JAEGER_CONFIG,
    STOP_ORDER,
    THANOS_REPLICA_LABEL,
    bin_dir,
    checked_run_dir,
    collector_config,
    host,
    log,
    ports,
    prometheus_config_in_run,
    run_dir,
    state_file,
    write_private,
)

# ---------------------------------------------------------------------------
# processes


def _proc_start_time(pid: int) -> str | None:
    """Kernel start time of a live (non-zombie) process, None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # zombie or dead: as good as gone
        return None
    return fields[19]


def is_alive(pid: int, start_time: str | None = None) -> bool:
    """True while `pid` is the same live process (start time guards against pid reuse)."""
    now = _proc_start_time(pid)
    if now is None:
        return False
    return start_time is None or now == start_time


def runs_our_binary(pid: int) -> bool:
    """Whether `pid` runs one of the binaries in the bin dir: what `up` starts. A state
    file or pid file can name any pid (and its start time): only these are signalled."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return Path(exe.removesuffix(" (deleted)")).parent == bin_dir().resolve()


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_free(h: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((h, port))
        except OSError:
            return False
    return True


def service_plan() -> dict[str, dict]:
    """Command line, environment and readiness URLs of each service."""
    h, p, b = host(), ports(), bin_dir()
    rd = run_dir()
    collector_env = {
        "OTELCOL_OTLP_GRPC_ENDPOINT": f"{h}:{p['OTLP_GRPC']}",
        "OTELCOL_OTLP_HTTP_ENDPOINT": f"{h}:{p['OTLP_HTTP']}",
        "OTELCOL_HEALTH_ENDPOINT": f"{h}:{p['COLLECTOR_HEALTH']}",
        "OTELCOL_TELEMETRY_HOST": h,
        "OTELCOL_TELEMETRY_PORT": str(p["COLLECTOR_METRICS"]),
        "OTELCOL_JAEGER_OTLP_ENDPOINT": f"{h}:{p['JAEGER_OTLP_GRPC']}",
        "OTELCOL_PROMETHEUS_OTLP_ENDPOINT": f"http://{h}:{p['PROMETHEUS']}/api/v1/otlp",
        "OTELCOL_VICTORIALOGS_OTLP_ENDPOINT": f"http://{h}:{p['VICTORIALOGS']}/insert/opentelemetry",
    }
    jaeger_env = {
        "JAEGER_OTLP_GRPC_ENDPOINT": f"{h}:{p['JAEGER_OTLP_GRPC']}",
        "JAEGER_OTLP_HTTP_ENDPOINT": f"{h}:{p['JAEGER_OTLP_HTTP']}",
        "JAEGER_QUERY_HTTP_ENDPOINT": f"{h}:{p['JAEGER_UI']}",
        "JAEGER_QUERY_GRPC_ENDPOINT": f"{h}:{p['JAEGER_GRPC']}",
        "JAEGER_HEALTH_ENDPOINT": f"{h}:{p['JAEGER_HEALTH']}",
        "JAEGER_TELEMETRY_HOST": h,
        "JAEGER_TELEMETRY_PORT": str(p["JAEGER_METRICS"]),
    }
    return {
        **thanos_plan(),
        **victorialogs_plan(),
        "prometheus": {
            "cmd": [
                str(b / "prometheus"),
                f"--config.file={prometheus_config_in_run()}",
                f"--storage.tsdb.path={rd / 'prometheus-data'}",
                f"--web.listen-address={h}:{p['PROMETHEUS']}",
                "--web.enable-otlp-receiver",
                "--enable-feature=exemplar-storage",
            ],
            "env": {},
            "ports": ["PROMETHEUS"],
            "ready": [f"http://{h}:{p['PROMETHEUS']}/-/ready"],
        },
        "jaeger": {
            "cmd": [str(b / "jaeger"), f"--config={JAEGER_CONFIG}"],
            "env": jaeger_env,
            "ports": [
                "JAEGER_OTLP_GRPC",
                "JAEGER_OTLP_HTTP",
                "JAEGER_UI",
                "JAEGER_GRPC",
                "JAEGER_HEALTH",
                "JAEGER_METRICS",
            ],
            "ready": [
                f"http://{h}:{p['JAEGER_HEALTH']}/status",
                f"http://{h}:{p['JAEGER_UI']}/api/v3/services",
            ],
        },
        "otelcol": {
            "cmd": [str(b / "otelcol"), f"--config={collector_config()}"],
            "env": collector_env,
            "ports": ["OTLP_GRPC", "OTLP_HTTP", "COLLECTOR_HEALTH", "COLLECTOR_METRICS"],
            "ready": [f"http://{h}:{p['COLLECTOR_HEALTH']}/"],
        },
    }


def thanos_plan() -> dict[str, dict]:
    """Thanos receive (remote write in, TSDB on disk, StoreAPI out) and Thanos query (the
    Prometheus HTTP API over every StoreAPI it is given; here the one receive)."""
    h, p, b, rd = host(), ports(), bin_dir(), run_dir()
    endpoints = f"endpoints: [{{address: '{h}:{p['THANOS_RECEIVE_GRPC']}', strict: true}}]"
    return {
        "thanos-receive": {
            "cmd": [
                str(b / "thanos"),
                "receive",
                f"--tsdb.path={rd / 'thanos-receive-data'}",
                f"--remote-write.address={h}:{p['THANOS_RECEIVE_WRITE']}",
                f"--grpc-address={h}:{p['THANOS_RECEIVE_GRPC']}",
                f"--http-address={h}:{p['THANOS_RECEIVE_HTTP']}",
                f"--receive.capnproto-address={h}:{p['THANOS_RECEIVE_CAPNP']}",
                f'--label={THANOS_REPLICA_LABEL}="0"',
                # What Prometheus keeps too: exemplars (its default 100k), 30 m out of order.
                "--tsdb.max-exemplars=100000",
                "--tsdb.out-of-order.time-window=30m",
            ],
            "env": {},
            "ports": [
                "THANOS_RECEIVE_WRITE",
                "THANOS_RECEIVE_GRPC",
                "THANOS_RECEIVE_HTTP",
                "THANOS_RECEIVE_CAPNP",
            ],
            "ready": [f"http://{h}:{p['THANOS_RECEIVE_HTTP']}/-/ready"],
            # Its tenant pruning runs once a minute, and does its work in a minute of the
            # day divisible by 2x the block length (00:00, 04:00, ... 20:00 UTC). Started
            # in such a minute, it can prune before the default tenant's TSDB is open and
            # panic (nil TSDB; thanos#8990, fixed after v0.42.5): once more, a minute on.
            "start_retries": 1,
        },
        "thanos-query": {
            "cmd": [
                str(b / "thanos"),
                "query",
                f"--grpc-address={h}:{p['THANOS_QUERY_GRPC']}",
                f"--http-address={h}:{p['THANOS_QUERY_HTTP']}",
                f"--endpoint.sd-config={endpoints}",
                f"--query.replica-label={THANOS_REPLICA_LABEL}",
            ],
            "env": {},
            "ports": ["THANOS_QUERY_GRPC", "THANOS_QUERY_HTTP"],
            "ready": [f"http://{h}:{p['THANOS_QUERY_HTTP']}/-/ready"],
        },
    }


def victorialogs_plan() -> dict[str, dict]:
    """VictoriaLogs: the log store. One process, one HTTP port: OTLP logs in, LogsQL out."""
    h, p, b, rd = host(), ports(), bin_dir(), run_dir()
    return {
        "victorialogs": {
            "cmd": [
                str(b / "victoria-logs"),
                f"-storageDataPath={rd / 'victorialogs-data'}",
                f"-httpListenAddr={h}:{p['VICTORIALOGS']}",
                # Its default, spelled out: logs older than 7 days are dropped.
                "-retentionPeriod=7d",
            ],
            "env": {},
            "ports": ["VICTORIALOGS"],
            "ready": [f"http://{h}:{p['VICTORIALOGS']}/health"],
        },
    }


def endpoints() -> dict[str, str]:
    h, p = host(), ports()
    return {
        "otlp_http": f"http://{h}:{p['OTLP_HTTP']}",
        "otlp_grpc": f"http://{h}:{p['OTLP_GRPC']}",
        "collector_health": f"http://{h}:{p['COLLECTOR_HEALTH']}/",
        "collector_metrics": f"http://{h}:{p['COLLECTOR_METRICS']}/metrics",
        "jaeger_ui": f"http://{h}:{p['JAEGER_UI']}",
        "jaeger_api": f"http://{h}:{p['JAEGER_UI']}/api/v3",
        "jaeger_otlp_grpc": f"{h}:{p['JAEGER_OTLP_GRPC']}",
        "prometheus": f"http://{h}:{p['PROMETHEUS']}",
        "prometheus_otlp": f"http://{h}:{p['PROMETHEUS']}/api/v1/otlp",
        "thanos_receive": f"http://{h}:{p['THANOS_RECEIVE_WRITE']}/api/v1/receive",
        "thanos_query": f"http://{h}:{p['THANOS_QUERY_HTTP']}",
        "victorialogs": f"http://{h}:{p['VICTORIALOGS']}",
        "victorialogs_otlp": f"http://{h}:{p['VICTORIALOGS']}/insert/opentelemetry/v1/logs",
        "training_metrics": f"http://127.0.0.1:{p['TRAINING_METRICS']}/metrics",
    }


def read_state() -> dict | None:
    """The state `up` wrote, from a run dir that passes checked_run_dir (else it dies)."""
    if checked_run_dir() is None:
        return None
    try:
        fd = os.open(state_file(), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def write_state(state: dict) -> None:
    write_private(state_file(), json.dumps(state, indent=2) + "\n")


def _log_tail(path: str | Path, n: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _stop_pid(name: str, pid: int, start_time: str | None, grace: float) -> bool:
    """SIGTERM the process (group), wait, then SIGKILL. True when it is gone, or when it
    is not a process of ours (left alone)."""
    if not is_alive(pid, start_time):
        return True
    if not runs_our_binary(pid):
        log(f"{name}: pid {pid} does not run a binary of {bin_dir()}: not signalled")
        return True

    def send(sig: int) -> None:
        try:
            if os.getpgid(pid) == pid:  # started as a session/group leader by `up`
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass

    log(f"stopping {name} (pid {pid})")
    send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(pid, start_time):
            return True
        time.sleep(0.1)
    log(f"{name} (pid {pid}) ignored SIGTERM for {grace:.0f}s; sending SIGKILL")
    send(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not is_alive(pid, start_time):
            return True
        time.sleep(0.1)
    return not is_alive(pid, start_time)


def _stop_all(state: dict, grace: float) -> list[str]:
    left = []
    services = state.get("services", {})
    for name in STOP_ORDER:
        svc = services.get(name)
        if svc and not _stop_pid(name, svc["pid"], svc.get("start_time"), grace):
            left.append(f"{name} (pid {svc['pid']})")
    return left
