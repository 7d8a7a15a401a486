"""A fleet that mixes otel-train versions, read under one set of names: the real
Collector with the schema processor of deploy/otel-collector.schema.yaml translates a
rank of an older schema version with the repository's schema file (schemas/<version>),
served on loopback under a loopback family (the real family's URL is not reachable from
a test; the file is the same, its transformations are what is checked)."""

from __future__ import annotations

import functools
import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from collector_helpers import ROOT, Collector

from otel_train import contract as c


@pytest.fixture
def schema_server() -> Iterator[str]:
    """The repository's schemas/ over HTTP: the family URL to use."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(ROOT))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schemas"
    finally:
        server.shutdown()
        server.server_close()


def gauge_request(names: list[str], schema_url: str, version: str) -> bytes:
    """OTLP/JSON: one otel_train scope of ``version`` with a gauge per name."""
    points = [{"asInt": "1024", "timeUnixNano": "1700000000000000000"}]
    scope = {"name": c.SCOPE_NAME, "version": version}
    metrics = [{"name": n, "unit": "By", "gauge": {"dataPoints": points}} for n in names]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "mixed"}}]}
    body = {"resourceMetrics": [{"resource": resource, "scopeMetrics": [
        {"scope": scope, "schemaUrl": schema_url, "metrics": metrics}]}]}  # fmt: skip
    return json.dumps(body).encode()


def post(collector: Any, body: bytes) -> None:
    request = urllib.request.Request(f"{collector.endpoint}/v1/metrics", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def metric_names(text: str) -> list[str]:
    return [line.split("-> Name: ", 1)[1] for line in text.splitlines() if "-> Name: " in line]


def test_an_older_ranks_renamed_metrics_arrive_under_the_new_names(
    otelcol: Path, tmp_path: Path, schema_server: str
) -> None:
    overlay = yaml.safe_load((ROOT / "deploy" / "otel-collector.schema.yaml").read_text())
    processor = overlay["processors"]["schema/otel_train"]
    assert processor["targets"] == [f"${{env:OTELCOL_OTEL_TRAIN_SCHEMA:-{c.SCHEMA_URL}}}"]
    target = f"{schema_server}/{c.SCHEMA_VERSION}"
    collector = Collector(
        otelcol, tmp_path, processors={"schema/otel_train": {"targets": [target]}}
    )
    collector.start()
    renames = c.SCHEMA_VERSIONS[c.SCHEMA_VERSION]
    old = "0.1.0"  # the version before the renames
    try:
        post(collector, gauge_request(list(renames), f"{schema_server}/{old}", old))
        post(collector, gauge_request(list(renames.values()), target, c.SCHEMA_VERSION))
    finally:
        collector.stop()
    received = metric_names(collector.output())
    assert sorted(received) == sorted([*renames.values(), *renames.values()]), received
