"""A run record's files: which ranks wrote what, in the order the lines were written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..export.record import PART_NAME


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


def lines(f: RecordPart) -> Iterator[str]:
    """The file's complete lines (a line cut short by a crash is left out)."""
    with open(f.path, encoding="utf-8") as fh:
        for line in fh:
            if line.endswith("\n") and line.strip():
                yield line


def requests(f: RecordPart) -> Iterator[dict[str, Any]]:
    """The file's OTLP/JSON export requests, parsed."""
    for line in lines(f):
        try:
            yield json.loads(line)
        except ValueError:
            continue
