"""``otel-train replay RUN_DIR``: send a run record to a Collector, as it was recorded.

Each line of a record file is an OTLP/JSON export request; the Collector's OTLP/HTTP
receiver takes it as it is (``Content-Type: application/json`` on ``/v1/traces`` and
``/v1/metrics``), so a replay changes nothing on the way: spans keep their ids and
times, metric points their timestamps (Prometheus takes points older than its newest
within its ``out_of_order_time_window``: 7 d in deploy/, so a run recorded days ago
replays with its metrics).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .files import Skipped, record_parts, requests

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"


@dataclass
class Replayed:
    files: int = 0
    requests: int = 0
    skipped: Skipped = field(default_factory=Skipped)  # bad lines, not sent


def endpoint_from_env() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT


def replay(run_dir: str | Path, endpoint: str, timeout_s: float = 10.0) -> Replayed:
    """POST every request of the record to ``endpoint`` (an OTLP/HTTP base URL); bad
    lines are left out, counted and said once on stderr."""
    done = Replayed()
    base = endpoint.rstrip("/")
    for f in record_parts(run_dir):
        done.files += 1
        url = f"{base}/v1/{f.kind}"
        for line in requests(f, done.skipped, "sending"):
            _post(url, line.raw, timeout_s)
            done.requests += 1
    done.skipped.say("otel-train replay")
    return done


def _post(url: str, body: bytes, timeout_s: float) -> None:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as err:
        detail = err.read()[:300].decode(errors="replace")
        raise RuntimeError(f"{url} refused a record line: HTTP {err.code} {detail}") from None
