"""The run record: each process's spans and metrics as OTLP JSON Lines files on disk.

Every line is one OTLP/JSON export request (``ExportTraceServiceRequest`` in
``rank<R>.traces.jsonl``, ``ExportMetricsServiceRequest`` in ``rank<R>.metrics.jsonl``):
the form of the OpenTelemetry file exporter specification, which the Collector's
``otlpjsonfile`` receiver reads, so a recorded run replays into any stack
(``scripts/stack replay``) and ``otel-train report`` reads it back.

The files are written by the exporters' own threads (the sidecar's, normally), never by
the training thread. Each file has a share of ``run_record_mb``: past a part's size it
is renamed ``.1.jsonl`` (older parts shift, the oldest is deleted), so a directory never
grows past its cap. A write that fails (a full disk) drops that batch, counts it in
``otel_train.dropped{reason="run_record"}`` and warns once; later batches try again.

The directory is its owner's and made at the first write (run_directory.py). Files are
mode 0600, created with ``O_EXCL | O_NOFOLLOW`` (a file of that name already there, from
an earlier start under the same run id, is first rotated away as an older part: a
planted symbolic link is moved, never followed).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..identity import local_rank, rank, run_id
from ..settings import Settings
from .run_directory import RunDirectory, free_name

_log = logging.getLogger("otel_train")

FILE_MODE = 0o600  # (the directory's: run_directory.DIRECTORY_MODE)
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
RECORD_INTERVAL_S = 5.0  # metric snapshots in the record (at most the export interval)
KEEP_PARTS = 3  # rotated parts kept per file besides the current one
# Spans per line: a batch (512) is written as several requests, so encoding one holds a
# few hundred KiB of JSON objects at a time, not ~7 MiB (the sidecar's peak memory).
LINE_SPANS = 64
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})
# rank0.traces.jsonl, and its rotated parts rank0.traces.1.jsonl (older: higher numbers)
PART_NAME = re.compile(r"^(?P<prefix>.+)\.(?P<kind>traces|metrics)(?:\.(?P<part>\d+))?\.jsonl$")


def part_name(prefix: str, kind: str, part: int = 0) -> str:
    """The file name of ``kind`` (traces or metrics) part ``part`` (0: current)."""
    return f"{prefix}.{kind}.{part}.jsonl" if part else f"{prefix}.{kind}.jsonl"


@dataclass(frozen=True)
class RecordPlan:
    """Where this process records: decided once in the training process (the sidecar,
    a child of it, could not tell the launcher's start apart from its own)."""

    directory: str
    prefix: str  # file name prefix: rank<R>
    max_bytes: int
    shared: bool  # the processes of one run write there (run_directory.py)


def plan(settings: Settings, service_name: str) -> RecordPlan | None:
    """Where this process records (its directory is made at the first write)."""
    if settings.run_dir == "off":
        return None
    shared = run_id() is not None or local_rank() is not None
    name = directory_name(service_name, run_id() or _start_stamp())
    directory = os.path.abspath(os.path.join(settings.run_dir, name))
    if not shared:
        directory = free_name(directory)
    return RecordPlan(directory, f"rank{rank()}", settings.run_record_mb * 1024 * 1024, shared)


def directory_name(service_name: str, run: str) -> str:
    """A run record's directory name: ``<service>-<run id or start time>``."""
    return f"{_safe(service_name)}-{_safe(run)}"


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:96]


def _start_stamp() -> str:
    """The run's start: under a launcher (LOCAL_RANK set) the launcher's, which every
    rank on the node shares; else this process's."""
    started = time.time()
    if local_rank() is not None:
        started = _process_start(os.getppid()) or started
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))


def _process_start(pid: int) -> float | None:
    """A process's start time (Linux /proc), to the second."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except Exception:
        return None


class RecordFile:
    """One JSON Lines file with its size cap and rotation; thread-safe. Opened at its
    first write, created exclusively (module docstring)."""

    def __init__(self, directory: RunDirectory, prefix: str, kind: str, part_bytes: int) -> None:
        self.directory = directory
        self._names = (prefix, kind)
        self.path = Path(directory.planned) / part_name(prefix, kind)  # (once made: its own)
        self.part_bytes = max(4096, part_bytes)
        self.dropped = 0  # batches (spans or metric points) not written
        self._warned = False
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False
        self._size = 0

    def write(self, line: str, items: int) -> bool:
        data = line.encode()
        with self._lock:
            if self._closed:
                self.dropped += items
                return False
            try:
                if self._fd is not None and self._size and self._size + len(data) > self.part_bytes:
                    self._rotate()
                fd = self._fd if self._fd is not None else self._open()
                self._write_all(fd, data)
                return True
            except OSError as err:
                self.dropped += items
                if not self._warned:
                    self._warned = True
                    _log.warning(
                        "otel-train: writing the run record %s failed (%s); training goes "
                        "on, unwritten data is counted in otel_train.dropped"
                        "{reason=run_record}",
                        self.path,
                        err,
                    )
                return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _open(self) -> int:
        """The current part, created exclusively; one already there is rotated away."""
        self.path = self.directory.path() / part_name(*self._names)
        if os.path.lexists(self.path):
            self._rotate()
        self._fd = os.open(self.path, _OPEN_FLAGS, FILE_MODE)
        self._size = 0
        return self._fd

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            self._size += n
            view = view[n:]

    def _rotate(self) -> None:
        """The current part becomes part 1 (older parts shift; the oldest is deleted).
        Renames and unlinks act on names: a symbolic link is moved, not followed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        prefix, kind = self._names

        def part(i: int) -> Path:
            return self.path.parent / part_name(prefix, kind, i)

        part(KEEP_PARTS).unlink(missing_ok=True)
        for i in range(KEEP_PARTS - 1, 0, -1):
            if os.path.lexists(part(i)):
                part(i).rename(part(i + 1))
        self.path.rename(part(1))
        self._size = 0


def otlp_json(message: Any) -> str:
    """One OTLP/JSON line: protobuf's JSON mapping, enums as integers, and trace and span
    ids in hex as OTLP/JSON requires (protobuf's mapping writes bytes in base64)."""
    import json

    tree = MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(tree)
    return json.dumps(tree, separators=(",", ":")) + "\n"


def _hex_ids(tree: dict[str, Any]) -> None:
    """The ids where OTLP has them (spans and their links; metric exemplars) from
    base64 into hex: only those paths are walked, not the whole tree (a metrics snapshot
    holds ~350 values per id-bearing exemplar)."""
    for resource in tree.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                _hex(span)
                for link in span.get("links", ()):
                    _hex(link)
    for resource in tree.get("resourceMetrics", ()):
        for scope in resource.get("scopeMetrics", ()):
            for metric in scope.get("metrics", ()):
                for data in metric.values():
                    if isinstance(data, dict):  # sum, gauge, histogram, ... (not name, unit)
                        for point in data.get("dataPoints", ()):
                            for exemplar in point.get("exemplars", ()):
                                _hex(exemplar)


def _hex(node: dict[str, Any]) -> None:
    for key in _ID_KEYS.intersection(node):
        node[key] = base64.b64decode(node[key]).hex()


class RecordSpanExporter(SpanExporter):
    batch_spans = LINE_SPANS  # what its SpanBatcher hands it at a time (pipeline.py)

    def __init__(self, file: RecordFile) -> None:
        self.file = file

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        ok = True
        for start in range(0, len(spans), LINE_SPANS):
            ok = self._line(spans[start : start + LINE_SPANS]) and ok
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def _line(self, spans: Sequence[Any]) -> bool:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        try:
            line = otlp_json(encode_spans(spans))
        except Exception:
            _log.exception("otel-train: encoding spans for the run record failed")
            self.file.dropped += len(spans)
            return False
        return self.file.write(line, len(spans))

    def shutdown(self) -> None:
        self.file.close()


class RecordMetricExporter(MetricExporter):
    def __init__(
        self, file: RecordFile, preferred_aggregation: dict[type, Any] | None = None
    ) -> None:
        """``preferred_aggregation``: the OTLP exporter's, so the record holds what OTLP
        carries (exponential histograms by default)."""
        super().__init__(preferred_aggregation=preferred_aggregation)
        self.file = file

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

        points = _points(metrics_data)
        try:
            line = otlp_json(encode_metrics(metrics_data))
        except Exception:
            _log.exception("otel-train: encoding metrics for the run record failed")
            self.file.dropped += points
            return MetricExportResult.FAILURE
        ok = self.file.write(line, points)
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.file.close()


def _points(metrics_data: Any) -> int:
    return sum(
        len(m.data.data_points)
        for rm in metrics_data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


def record_files(record: RecordPlan) -> tuple[RecordFile, RecordFile]:
    """(traces, metrics) files of ``record``; spans get three quarters of the cap."""
    base = RunDirectory(record.directory, record.shared)
    part = record.max_bytes // (KEEP_PARTS + 1)
    traces = RecordFile(base, record.prefix, "traces", part * 3 // 4)
    metrics = RecordFile(base, record.prefix, "metrics", part // 4)
    return traces, metrics
