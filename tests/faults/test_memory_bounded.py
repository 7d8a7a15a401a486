"""Memory stays bounded over thousands of steps while the Collector is down.

Runs ``benchmarks/collector_down.py`` (every step traced, OTLP pointed at a port where
nothing listens) and prints its figures. Spans beyond the export queue are dropped and
counted, never held: RSS after the warm-up and at the end stay close.
"""

from __future__ import annotations

import json
from pathlib import Path

from collector_helpers import ROOT, run_job


def test_rss_stays_flat_with_the_collector_down(tmp_path: Path) -> None:
    done = run_job(
        [str(ROOT / "benchmarks" / "collector_down.py"), "--warmup", "1000", "--steps", "8000",
         "--timeout", "2"],
        None,
        timeout=600,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print("\n" + json.dumps(result))
    # 8000 steps x 4 spans: unbounded, the span queue alone would hold tens of MiB.
    assert result["dropped"]["span_queue"] > 0, result
    assert result["rss_growth_mib"] < 16, result
