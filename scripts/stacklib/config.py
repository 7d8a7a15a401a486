"""scripts/stack, config.

Paths, pinned versions, ports and build stamps: what every other part reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VERSIONS_FILE = DEPLOY / "versions.env"
COLLECTOR_CONFIG = DEPLOY / "otel-collector.yaml"
AGENT_CONFIG = DEPLOY / "k8s" / "otel-collector-agent.yaml"  # the per-node agent (Kubernetes)
JAEGER_CONFIG = DEPLOY / "jaeger.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus.yml"
K8S_PROMETHEUS_CONFIG = DEPLOY / "k8s" / "prometheus.yml"
OCB_MANIFEST = DEPLOY / "otelcol-builder.yaml"
# Recording/alerting rules (prometheus.yml loads prometheus/rules/*.yml).
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))

# name -> default port; each is overridable with OTEL_TRAIN_STACK_<NAME>_PORT.
PORTS = {
    "OTLP_GRPC": 4317,  # collector OTLP/gRPC in
    "OTLP_HTTP": 4318,  # collector OTLP/HTTP in
    "COLLECTOR_HEALTH": 13133,  # collector health_check
    "COLLECTOR_METRICS": 8888,  # collector's own /metrics
    "JAEGER_OTLP_GRPC": 14317,  # Jaeger OTLP/gRPC in (from the collector)
    "JAEGER_OTLP_HTTP": 14318,  # Jaeger OTLP/HTTP in
    "JAEGER_UI": 16686,  # Jaeger query HTTP: UI and /api/v3
    "JAEGER_GRPC": 16685,  # Jaeger query gRPC
    "JAEGER_HEALTH": 14133,  # Jaeger healthcheckv2
    "JAEGER_METRICS": 14269,  # Jaeger's own /metrics
    "PROMETHEUS": 9090,  # Prometheus API and OTLP receiver
    # Thanos: the horizontally scalable store Prometheus remote-writes to, and its query API.
    "THANOS_RECEIVE_WRITE": 19291,  # Thanos receive: remote write in (/api/v1/receive)
    "THANOS_RECEIVE_GRPC": 10901,  # Thanos receive: StoreAPI, read by Thanos query
    "THANOS_RECEIVE_HTTP": 10902,  # Thanos receive: health and its own /metrics
    # Thanos receive: Cap'n Proto replication in (unused by one receive; its default
    # address is 0.0.0.0, so the stack names it to keep it on the host address too).
    "THANOS_RECEIVE_CAPNP": 19391,
    "THANOS_QUERY_GRPC": 10903,  # Thanos query: StoreAPI (for a query tier above it)
    "THANOS_QUERY_HTTP": 10904,  # Thanos query: the Prometheus HTTP API over the store
    # VictoriaLogs: OTLP logs in (/insert/opentelemetry/v1/logs), LogsQL out (/select/logsql),
    # health (/health) and its own /metrics, all on one HTTP port.
    "VICTORIALOGS": 9428,
    # Not bound by the stack: the training job's in-process /metrics, which Prometheus
    # scrapes (job otel-train-inprocess) and `env` hands to the job (OTEL_TRAIN_PROMETHEUS_PORT).
    "TRAINING_METRICS": 9464,
}
# Ports the stack's own processes listen on (`up` checks that they are free).
LISTEN_PORTS = tuple(name for name in PORTS if name != "TRAINING_METRICS")
# The loopback addresses deploy/prometheus.yml names, and the port each stands for: the
# in-process scrape target and Thanos receive's remote write. Prometheus does not expand
# environment variables in its config, so `up` gives it a copy with these ports moved.
CONFIG_ADDRESSES = {
    port: re.compile(rf"(?<![\w.:])127\.0\.0\.1:{PORTS[port]}(?!\w)")
    for port in ("TRAINING_METRICS", "THANOS_RECEIVE_WRITE")
}

# Start order; `down` stops in reverse... except that the collector goes first
# so that it can flush into Jaeger, Prometheus and VictoriaLogs while they still run.
SERVICES = ("thanos-receive", "thanos-query", "prometheus", "jaeger", "victorialogs", "otelcol")
STOP_ORDER = ("otelcol", "victorialogs", "jaeger", "prometheus", "thanos-query", "thanos-receive")
# Thanos receive's external label: what tells replicas apart (Thanos query deduplicates on
# it, --query.replica-label, and drops it from results).
THANOS_REPLICA_LABEL = "receive_replica"
BINARIES = ("otelcol", "jaeger", "prometheus", "promtool", "thanos", "victoria-logs")
THANOS_TAGS = "netgo,slicelabels"  # Thanos's release build tags (its .promu.yml)


def log(msg: str) -> None:
    print(f"[stack] {msg}", flush=True)


def die(msg: str, code: int = 1) -> NoReturn:
    print(f"[stack] error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(code)


# ---------------------------------------------------------------------------
# versions and paths


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse deploy/versions.env (KEY=VALUE lines, # comments)."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key.strip()):
            raise ValueError(f"{path}:{lineno}: not KEY=VALUE: {raw!r}")
        out[key.strip()] = value.strip()
    return out


def cache_dir() -> Path:
    env = os.environ.get("OTEL_TRAIN_STACK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "otel-train" / "stack"


def bin_dir() -> Path:
    return cache_dir() / "bin"


def stamp_file() -> Path:
    return bin_dir() / "versions.json"


def collector_config() -> Path:
    return Path(os.environ.get("OTEL_TRAIN_STACK_COLLECTOR_CONFIG") or COLLECTOR_CONFIG)


def prometheus_config() -> Path:
    return Path(os.environ.get("OTEL_TRAIN_STACK_PROMETHEUS_CONFIG") or PROMETHEUS_CONFIG)


def run_dir() -> Path:
    """Where pids, state, logs and data go: OTEL_TRAIN_STACK_RUN, else a directory of this
    user's ($XDG_RUNTIME_DIR/otel-train-stack, else <cache>/run)."""
    env = os.environ.get("OTEL_TRAIN_STACK_RUN")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "otel-train-stack" if xdg else cache_dir() / "run"


def checked_run_dir(create: bool = False) -> Path | None:
    """The run dir once it is safe to trust (None when absent and not ``create``d): a
    directory, not a symlink, of this user's, that no one else may write to; made with
    mode 0700 when ``create``, and one of ours readable by others is closed to 0700.
    Anything else dies: its state could name any pid and its files could be links."""
    rd = run_dir()
    if create:
        rd.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            rd.mkdir(mode=0o700)
    try:
        st = os.lstat(rd)
    except FileNotFoundError:
        return None
    hint = "set OTEL_TRAIN_STACK_RUN to a directory of yours"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        die(f"run dir {rd} is a symlink or not a directory: not using it ({hint})")
    if st.st_uid != os.getuid():
        die(
            f"run dir {rd} belongs to uid {st.st_uid}, not to you ({os.getuid()}): "
            f"not using it ({hint})"
        )
    if st.st_mode & 0o022:
        die(
            f"run dir {rd} is writable by others (mode {st.st_mode & 0o777:o}): "
            f"not using it ({hint})"
        )
    if st.st_mode & 0o077:
        log(f"run dir {rd}: mode {st.st_mode & 0o777:o} -> 700")
        os.chmod(rd, 0o700)
    return rd


def write_private(path: Path, text: str) -> None:
    """Write ``path`` whole (a new file of mode 0600 moved over it): never through a
    link planted at its name or its temporary name."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def state_file() -> Path:
    return run_dir() / "state.json"


def prometheus_config_in_run() -> Path:
    """Where `up` writes the Prometheus config it starts Prometheus with."""
    return run_dir() / "prometheus-config" / prometheus_config().name


def render_prometheus_config(source: Path, dest: Path, ports: dict[str, int]) -> int:
    """Write ``source`` to ``dest`` with the addresses of CONFIG_ADDRESSES moved to
    ``ports`` (the in-process target, Thanos receive's remote write).

    Every other entry of ``source``'s directory is linked beside ``dest``, so the
    relative paths in the config (rule files, file_sd targets) resolve as they do in
    place. Comments are left as they are. Returns how many addresses were moved.
    """
    out, moved = [], 0
    for line in source.read_text().splitlines(keepends=True):
        code, hash_, comment = line.partition("#")
        for name, address in CONFIG_ADDRESSES.items():
            code, n = address.subn(f"127.0.0.1:{ports[name]}", code)
            moved += n
        out.append(code + hash_ + comment)
    if dest.parent.exists():
        shutil.rmtree(dest.parent)
    dest.parent.mkdir(parents=True)
    for entry in source.parent.iterdir():
        if entry.name != source.name and entry.resolve() != dest.parent.resolve():
            (dest.parent / entry.name).symlink_to(entry.resolve())
    dest.write_text("".join(out))
    return moved


def host() -> str:
    return os.environ.get("OTEL_TRAIN_STACK_HOST", "127.0.0.1")


def ports() -> dict[str, int]:
    out = {}
    for name, default in PORTS.items():
        raw = os.environ.get(f"OTEL_TRAIN_STACK_{name}_PORT", str(default))
        try:
            out[name] = int(raw)
        except ValueError:
            die(f"OTEL_TRAIN_STACK_{name}_PORT={raw!r} is not a port number")
    return out


def expected_stamps(versions: dict[str, str] | None = None) -> dict[str, str]:
    """What each binary's stamp must say to count as built at the pinned version."""
    v = versions or read_versions()
    manifest_hash = hashlib.sha256(OCB_MANIFEST.read_bytes()).hexdigest()[:12]
    return {
        "otelcol": f"{v['OTELCOL_VERSION']} manifest:{manifest_hash}",
        "jaeger": f"{v['JAEGER_VERSION']} (go module v{v['JAEGER_GO_MODULE_VERSION']})",
        "prometheus": f"{v['PROMETHEUS_VERSION']} (go module v{v['PROMETHEUS_GO_MODULE_VERSION']})",
        "promtool": f"{v['PROMETHEUS_VERSION']} (go module v{v['PROMETHEUS_GO_MODULE_VERSION']})",
        "thanos": f"{v['THANOS_VERSION']} (go module v{v['THANOS_VERSION']}, tags {THANOS_TAGS})",
        "victoria-logs": f"{v['VICTORIALOGS_VERSION']} (go module v{v['VICTORIALOGS_VERSION']})",
    }


def read_stamps() -> dict[str, str]:
    try:
        return json.loads(stamp_file().read_text())
    except (OSError, ValueError):
        return {}


def write_stamp(name: str, value: str) -> None:
    stamps = read_stamps()
    stamps[name] = value
    tmp = stamp_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(stamps, indent=2, sort_keys=True) + "\n")
    tmp.replace(stamp_file())


def missing_binaries() -> dict[str, str]:
    """name -> reason, for each binary that is absent or not at its pinned version."""
    want = expected_stamps()
    have = read_stamps()
    out = {}
    for name in BINARIES:
        path = bin_dir() / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            out[name] = f"{path} missing"
        elif have.get(name) != want[name]:
            out[name] = f"built as {have.get(name)!r}, pinned {want[name]!r}"
    return out
