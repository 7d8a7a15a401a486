"""Helpers for the fault tests: a real Collector (the otelcol `scripts/stack build` makes).

Each test starts, kills and restarts its own Collector on free loopback ports with a
small config: an OTLP receiver (HTTP, optionally TLS) and the debug exporter at
``detailed`` verbosity, whose output (every span and data point) is what the tests
read back. Training runs in a subprocess, as a user's job would.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from scratch import job_env as clean_job_env

ROOT = Path(__file__).resolve().parents[2]


def load_stack_module() -> Any:
    """scripts/stack (no .py suffix), loaded by path for its binary paths."""
    path = str(ROOT / "scripts" / "stack")
    loader = importlib.machinery.SourceFileLoader("otel_train_stack_faults", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def otelcol_or_skip() -> Path:
    """The built otelcol; skips the test, or fails under OTEL_TRAIN_STACK_REQUIRED=1, when
    ``scripts/stack build`` has not made it."""
    stack = load_stack_module()
    missing = stack.missing_binaries()
    if "otelcol" in missing:
        reason = f"otelcol not built -- run `scripts/stack build` ({missing['otelcol']})"
        if os.environ.get("OTEL_TRAIN_STACK_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(stack.bin_dir()) / "otelcol"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CONFIG = """
extensions:
  health_check:
    endpoint: 127.0.0.1:{health}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
{tls}
{processors}
exporters:
  debug:
    verbosity: detailed
service:
  extensions: [health_check]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [{names}]
      exporters: [debug]
    metrics:
      receivers: [otlp]
      processors: [{names}]
      exporters: [debug]
    logs:
      receivers: [otlp]
      processors: [{names}]
      exporters: [debug]
  telemetry:
    metrics:
      level: none
"""


@dataclass
class Collector:
    """One real otelcol on loopback; ``start``/``kill``/``stop`` as often as a test likes."""

    binary: Path
    workdir: Path
    otlp_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    tls: tuple[Path, Path] | None = None  # (cert, key) for the HTTP receiver
    processors: dict[str, Any] = field(default_factory=dict)  # name -> config, in order
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.otlp_port}"

    def start(self) -> None:
        tls = ""
        if self.tls:
            tls = (
                "        tls:\n"
                f"          cert_file: {self.tls[0]}\n"
                f"          key_file: {self.tls[1]}\n"
            )
        config = self.workdir / "otelcol.yaml"
        processors = (
            "processors: " + json.dumps(self.processors) if self.processors else ""
        )  # (JSON is YAML)
        config.write_text(CONFIG.format(health=self.health_port, otlp=self.otlp_port, tls=tls,
                                        processors=processors,
                                        names=", ".join(self.processors)))  # fmt: skip
        log = self.workdir / f"otelcol-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), f"--config={config}"], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"otelcol exited: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"otelcol not healthy in 60 s: {log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: the Collector vanishes mid-run without a goodbye."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
            self.proc = None

    def output(self, since: int = 0) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs[since:])


@contextmanager
def started_collector(workdir: Path) -> Iterator[Collector]:
    """A real Collector (the built otelcol, else skip) running until the block ends."""
    col = Collector(otelcol_or_skip(), workdir)
    col.start()
    try:
        yield col
    finally:
        col.stop()


# -- reading the debug exporter's detailed output ---------------------------------------

_SPAN = re.compile(r"^Span #\d+\n(.*?)(?=^Span #|^ResourceSpans #|^Metric #|\Z)", re.M | re.S)


def spans(text: str) -> list[dict[str, str]]:
    """Every span the Collector printed: its header fields and attributes as strings."""
    out = []
    for block in _SPAN.findall(text):
        span: dict[str, str] = {}
        for line in block.splitlines():
            head = re.match(r"^\s+([A-Za-z ]+?)\s+: (.*)$", line)
            if head and not line.lstrip().startswith("->"):
                span[head.group(1)] = head.group(2).strip()
            attr = re.match(r"^\s+-> ([\w.]+): \w+\((.*)\)$", line)
            if attr:
                span.setdefault(attr.group(1), attr.group(2))
        out.append(span)
    return out


def step_indices(text: str) -> list[int]:
    return [
        int(s["otel_train.step.index"])
        for s in spans(text)
        if s.get("Name") == "otel_train.step" and "otel_train.step.index" in s
    ]


_METRIC = re.compile(r"^Metric #\d+\n(.*?)(?=^Metric #|^ResourceMetrics #|^Span #|\Z)", re.M | re.S)


def metric_points(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Data points of one metric in arrival order: (attributes, value)."""
    out = []
    for block in _METRIC.findall(text):
        if not re.search(rf"^\s+-> Name: {re.escape(name)}$", block, re.M):
            continue
        for point in re.split(r"^NumberDataPoints #\d+\n", block, flags=re.M)[1:]:
            attrs = dict(re.findall(r"^\s+-> ([\w.]+): \w+\((.*)\)$", point, re.M))
            value = re.search(r"^Value: ([-+0-9.eE]+)", point, re.M)
            if value:
                out.append((attrs, float(value.group(1))))
    return out


def wait_for(fn: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def job_env(endpoint: str | None, **extra: str) -> dict[str, str]:
    env = clean_job_env(("OTEL_TRAIN_", "OTEL_EXPORTER_", "OTEL_BSP_"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(
        {
            "OTEL_TRAIN_TRACE_STEPS": "all",
            "OTEL_TRAIN_METRIC_EXPORT_INTERVAL": "0.5",
            "OTEL_TRAIN_CONSOLE": "off",
            "OTEL_TRAIN_PROMETHEUS": "false",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
    )
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    env.update(extra)
    return env


def run_job(
    args: list[str], endpoint: str | None, *, timeout: float, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run a job script (``args`` after the interpreter) under ``job_env`` to its end;
    it must exit 0 (its stderr is the failure message)."""
    done = subprocess.run(
        [sys.executable, *args],
        env=job_env(endpoint),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return done


def collector_down(warmup: int, steps: int, timeout_s: float) -> dict[str, Any]:
    """``benchmarks/collector_down.py`` run to its end: its JSON figures (printed too)."""
    done = run_job(
        [str(ROOT / "benchmarks" / "collector_down.py"), "--warmup", str(warmup), "--steps",
         str(steps), "--timeout", str(timeout_s)],
        None,
        timeout=600,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print("\n" + json.dumps(result))
    return result


# -- the logs signal, and data by the resource's rank -------------------------------------

_RESOURCE = re.compile(
    r"Resource(?:Log|Metrics|Spans) #\d+\n(.*?)(?=Resource(?:Log|Metrics|Spans) #|\Z)", re.S
)
_ATTRIBUTE = re.compile(r"^\s+-> ([\w.]+): (\w+)\((.*?)\)$(?=\n\s+-> |\n[A-Z]|\n*\Z)", re.M | re.S)


def _attributes(block: str) -> dict[str, str]:
    return {key: value for key, _, value in _ATTRIBUTE.findall(block)}


def log_records(text: str) -> list[dict[str, Any]]:
    """Every log record the Collector printed: ``event`` (its EventName), ``rank`` (the
    resource's otel_train.rank), ``trace_id`` and its attributes (values as strings)."""
    out = []
    for chunk in _RESOURCE.findall(text):
        if "LogRecord #" not in chunk:
            continue
        head, _, rest = chunk.partition("ScopeLogs #")
        resource = _attributes(head)
        for record in re.split(r"^LogRecord #\d+\n", rest, flags=re.M)[1:]:
            event = re.search(r"^EventName: (.*)$", record, re.M)
            trace = re.search(r"^Trace ID: ?(.*)$", record, re.M)
            attrs = _attributes(record.partition("Attributes:")[2].partition("Trace ID:")[0])
            out.append({
                "event": event.group(1).strip() if event else "",
                "rank": int(resource.get("otel_train.rank", "-1")),
                "trace_id": trace.group(1).strip() if trace else "",
                **attrs,
            })  # fmt: skip
    return out


def rank_values(text: str, name: str) -> dict[int, list[float]]:
    """A metric's data point values in arrival order, by the resource's otel_train.rank."""
    out: dict[int, list[float]] = {}
    for chunk in _RESOURCE.findall(text):
        if "Metric #" not in chunk:
            continue
        rank = int(_attributes(chunk.partition("ScopeMetrics #")[0]).get("otel_train.rank", "-1"))
        out.setdefault(rank, []).extend(v for _, v in metric_points(chunk, name))
    return out
