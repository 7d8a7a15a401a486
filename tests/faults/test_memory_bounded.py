"""Memory stays bounded over thousands of steps while the Collector is down.

Runs ``benchmarks/collector_down.py`` (every step traced, OTLP pointed at a port where
nothing listens) and prints its figures. Spans beyond the export queue are dropped and
counted, never held: RSS after the warm-up and at the end stay close.
"""

from __future__ import annotations

from pathlib import Path

from collector_helpers import collector_down


def test_rss_stays_flat_with_the_collector_down(tmp_path: Path) -> None:
    result = collector_down(1000, 8000, 2)
    # 8000 steps x 4 spans: unbounded, the span queue alone would hold tens of MiB.
    assert result["dropped"]["span_queue"] > 0, result
    assert result["rss_growth_mib"] < 16, result
