"""What benchmarks/loadgen.py reads from the stack it loads: the Collector's own counters,
the CPU and memory of each server from /proc, Prometheus's and Thanos receive's head
series, heap and samples appended, and the series per rank in Prometheus."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def collector_counters(stack: dict[str, Any]) -> dict[str, float]:
    """Sums of the Collector's own counters we care about (its /metrics)."""
    url = f"http://127.0.0.1:{stack['ports']['COLLECTOR_METRICS']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            exporter = s.labels.get("exporter", "")
            if exporter.startswith("debug"):
                continue
            key = None
            if name.startswith("otelcol_receiver_") and name.endswith("_total"):
                key = name.removeprefix("otelcol_").removesuffix("_total")
            elif name.startswith("otelcol_exporter_") and name.endswith("_total"):
                key = f"{name.removeprefix('otelcol_').removesuffix('_total')}[{exporter}]"
            elif name == "otelcol_exporter_queue_size":
                out["queue_size"] = max(out.get("queue_size", 0.0), s.value)
            elif name.startswith("otelcol_processor_") and "refused" in name:
                key = name.removeprefix("otelcol_").removesuffix("_total")
            if key:
                out[key] = out.get(key, 0.0) + s.value
    return out


def server_stats(stack: dict[str, Any]) -> dict[str, float]:
    """Memory of each server (RSS), and Prometheus's and Thanos receive's own counts: head
    series, Go heap in use, samples appended (all tenants)."""
    out = {f"rss_mib[{k}]": proc_rss(pid) / 2**20 for k, pid in stack["pids"].items()}
    wanted = {
        "prometheus_tsdb_head_series": "head_series",
        "go_memstats_heap_inuse_bytes": "heap_inuse_mib",
        "prometheus_tsdb_head_samples_appended_total": "samples_appended",
    }
    for server, port in (("prometheus", "PROMETHEUS"), ("thanos-receive", "THANOS_RECEIVE_HTTP")):
        url = f"http://127.0.0.1:{stack['ports'][port]}/metrics"
        try:
            text = urllib.request.urlopen(url, timeout=30).read().decode()
        except OSError:
            continue
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                key = wanted.get(sample.name)
                if key:
                    scale = 2**20 if key.endswith("_mib") else 1
                    name = f"{key}[{server}]"
                    out[name] = out.get(name, 0.0) + sample.value / scale
    return out


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prometheus_series(stack: dict[str, Any], job: str, n: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{stack['ports']['PROMETHEUS']}/api/v1/query?"

    def query(q: str) -> list[Any]:
        url = base + urllib.parse.urlencode({"query": q})
        body = json.loads(urllib.request.urlopen(url, timeout=60).read())
        return body["data"]["result"]  # type: ignore[no-any-return]

    raw = f'job="{job}", otel_train_rank!="", __name__!~".*:.*"'
    per_rank = query(f"count by (otel_train_rank) ({{{raw}}})")
    rules = query(f'count({{job="{job}", otel_train_rank!="", __name__=~".*:.*"}})')
    counts = sorted(int(r["value"][1]) for r in per_rank)
    total = query(f'count({{job="{job}"}})')
    names = query(f'count by (__name__) ({{job="{job}", otel_train_rank=""}})')
    return {
        "ranks_seen": len(counts),
        "per_rank_min": counts[0] if counts else 0,
        "per_rank_max": counts[-1] if counts else 0,
        "recorded_by_rules_per_rank": int(rules[0]["value"][1]) / max(1, n) if rules else 0,
        "total": int(total[0]["value"][1]) if total else 0,
        "without_rank_label": {r["metric"]["__name__"]: int(r["value"][1]) for r in names},
    }
