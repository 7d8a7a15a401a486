"""A run record's files: which ranks wrote what, in the order the lines were written, read
line by line (never a whole file at once); bad lines are counted and left out."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..export.record import PART_NAME
from ..export.run_facts import FACTS_SUFFIX


@dataclass(frozen=True)
class RecordPart:
    path: Path
    prefix: str  # rank<R>
    kind: str  # traces or metrics
    part: int  # 0: the current file; rotated parts count up with age


def record_parts(run_dir: str | Path) -> list[RecordPart]:
    """Every record file under ``run_dir``, per prefix and kind oldest part first."""
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    found = []
    for path in root.rglob("*.jsonl"):
        m = PART_NAME.match(path.name)
        if m:
            part = int(m["part"]) if m["part"] else 0
            found.append(RecordPart(path, m["prefix"], m["kind"], part))
    found.sort(key=lambda f: (f.prefix, f.kind, -f.part))
    if not found:
        raise FileNotFoundError(
            f"{root}: no run record files (rank<R>.traces.jsonl / rank<R>.metrics.jsonl)"
        )
    return found


MAX_FACTS_BYTES = 64 * 1024


def read_facts(part: RecordPart) -> dict[str, Any]:
    """The run facts beside a record file (export/run_facts.py); {} when there are none,
    or they are no JSON object of at most MAX_FACTS_BYTES."""
    path = part.path.parent / (part.prefix + FACTS_SUFFIX)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_FACTS_BYTES + 1)
        facts = json.loads(data) if len(data) <= MAX_FACTS_BYTES else None
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


REQUEST_KEY = {"traces": "resourceSpans", "metrics": "resourceMetrics"}
PROGRESS_BYTES = 16 * 1024 * 1024  # a file this large says how far its reading got


@dataclass
class Skipped:
    """Lines of a record left out, counted by why (said once, by say())."""

    counts: dict[str, int] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)

    def add(self, why: str, path: Path) -> None:
        self.counts[why] = self.counts.get(why, 0) + 1
        self.files.add(path.name)

    def total(self) -> int:
        return sum(self.counts.values())

    def message(self) -> str:
        """'' when nothing was skipped."""
        if not self.counts:
            return ""
        whys = ", ".join(f"{n} {why}" for why, n in sorted(self.counts.items()))
        return (f"skipped {self.total()} bad line(s) of the record ({whys}) in "
                f"{', '.join(sorted(self.files))}")  # fmt: skip

    def say(self, command: str) -> None:
        if self.counts:
            print(f"{command}: {self.message()}", file=sys.stderr)


@dataclass(frozen=True)
class RecordLine:
    raw: bytes  # the line as written
    request: dict[str, Any]  # parsed: an export request of the file's kind (its top level)


def lines(f: RecordPart, reading: str = "reading") -> Iterator[bytes]:
    """The file's complete lines, read one at a time (a line cut short by a crash is left
    out); a large file prints its progress to stderr (``reading``: what is done)."""
    size = f.path.stat().st_size
    step = size // 10 if size >= PROGRESS_BYTES else 0
    done, said = 0, 0
    with open(f.path, "rb") as fh:
        for line in fh:
            done += len(line)
            if step and done >= said + step:
                said = done - done % step
                print(f"otel-train: {reading} {f.path.name}: {done >> 20} of {size >> 20} MiB",
                      file=sys.stderr, flush=True)  # fmt: skip
            if line.endswith(b"\n") and line.strip():
                yield line


def requests(f: RecordPart, skipped: Skipped, reading: str = "reading") -> Iterator[RecordLine]:
    """The file's OTLP/JSON export requests; a line that is not UTF-8, not JSON, or not
    an object with the kind's list (resourceSpans, resourceMetrics) is counted in
    ``skipped`` and left out."""
    key = REQUEST_KEY[f.kind]
    for line in lines(f, reading):
        try:
            request = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            skipped.add("not UTF-8", f.path)
            continue
        except ValueError:
            skipped.add("not JSON", f.path)
            continue
        if not isinstance(request, dict) or not isinstance(request.get(key), list):
            skipped.add(f"not an OTLP {f.kind} export request", f.path)
            continue
        yield RecordLine(line, request)


def write_output(target: Path, text: str) -> Path:
    """Write a command's output file (a report page, a timeline) as a new file renamed
    over ``target``: a symbolic link planted at that name is replaced, never written
    through. Its mode is a new file's (0666 less the umask)."""
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
    return target
