"""``python -m otel_train.contract``: print docs/telemetry.md (the docs test runs this)."""

from __future__ import annotations

from .markdown import render_markdown

if __name__ == "__main__":  # pragma: no cover - exercised by the docs test via subprocess
    print(render_markdown(), end="")
