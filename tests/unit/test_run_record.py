"""The run record (otel_train/export/record.py): each process's spans and metrics as
OTLP JSON Lines under run_dir, bounded, and never in training's way."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scratch import job_env

import otel_train
from otel_train import contract as c
from otel_train import session as session_mod
from otel_train.export.record import KEEP_PARTS, RecordFile

JOB = textwrap.dedent("""
    import sys, torch, otel_train
    model = torch.nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, prometheus=False,
                          console_every=0, run_dir=sys.argv[1], trace_steps="all")
    for _ in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
    assert otel_train.shutdown()
""")


def _run(tmp_path: Path, run_dir: str = "runs", **env: str) -> subprocess.CompletedProcess[str]:
    env = {**job_env(), **env}
    where = run_dir if run_dir == "off" else str(tmp_path / run_dir)
    return subprocess.run([sys.executable, "-c", JOB, where], env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_writes_otlp_json_lines_and_says_where(tmp_path: Path) -> None:
    job = _run(tmp_path, OTEL_SERVICE_NAME="rec-test", OTEL_TRAIN_RUN_ID="job 42")
    assert job.returncode == 0, job.stderr[-2000:]
    run = tmp_path / "runs" / "rec-test-job_42"
    assert sorted(p.name for p in run.iterdir()) == ["rank0.metrics.jsonl", "rank0.traces.jsonl"]
    spans = [
        s
        for req in _lines(run / "rank0.traces.jsonl")
        for rs in req["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    steps = [s for s in spans if s["name"] == c.STEP_SPAN.name]
    assert len(steps) == 16  # trace_steps="all"
    for s in spans:  # OTLP/JSON: ids in hex, not protobuf's base64
        assert len(s["traceId"]) == 32 and int(s["traceId"], 16)
        assert len(s["spanId"]) == 16 and int(s["spanId"], 16)
    children = [s for s in spans if s.get("parentSpanId")]
    assert {s["parentSpanId"] for s in children} <= {s["spanId"] for s in spans}
    last = _lines(run / "rank0.metrics.jsonl")[-1]
    points = {
        m["name"]: m
        for rm in last["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for m in sm["metrics"]
    }
    (point,) = points[c.STEPS.name]["sum"]["dataPoints"]
    assert float(point.get("asInt", point.get("asDouble", 0))) == 16
    assert f"otel-train: run record in {run}" in job.stderr  # at start
    assert f"(report: otel-train report {run})" in job.stderr  # at the summary's end


def test_exemplars_in_the_record_name_recorded_spans_in_hex(tmp_path: Path) -> None:
    job = _run(tmp_path, OTEL_SERVICE_NAME="ex-test", OTEL_TRAIN_RUN_ID="ex")
    assert job.returncode == 0, job.stderr[-2000:]
    run = tmp_path / "runs" / "ex-test-ex"
    span_ids = {
        (s["traceId"], s["spanId"])
        for req in _lines(run / "rank0.traces.jsonl")
        for rs in req["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    }
    last = _lines(run / "rank0.metrics.jsonl")[-1]
    exemplars = [
        e
        for rm in last["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for m in sm["metrics"]
        for kind in ("histogram", "exponentialHistogram")
        for point in m.get(kind, {}).get("dataPoints", ())
        for e in point.get("exemplars", ())
    ]
    assert exemplars  # trace_steps="all": every step's histogram point links its trace
    for e in exemplars:  # OTLP/JSON: hex, as the spans' own
        assert (e["traceId"], e["spanId"]) in span_ids


def test_run_dir_off_writes_nothing(tmp_path: Path) -> None:
    job = _run(tmp_path, run_dir="off")
    assert job.returncode == 0, job.stderr[-2000:]
    assert not (tmp_path / "runs").exists() and "run record" not in job.stderr


def test_a_bad_run_dir_names_the_setting() -> None:
    with pytest.raises(otel_train.ConfigError, match=r"'run_dir'.*'off' or a directory path"):
        otel_train.configure(run_dir="  ")


def test_rotation_keeps_the_file_set_under_its_cap(tmp_path: Path) -> None:
    f = RecordFile(tmp_path, "rank0", "traces", part_bytes=10_000)
    line = json.dumps({"x": "y" * 1000}) + "\n"
    for _ in range(200):
        assert f.write(line, 1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rank0.traces.1.jsonl", "rank0.traces.2.jsonl", "rank0.traces.3.jsonl",
                     "rank0.traces.jsonl"][: KEEP_PARTS + 1]  # fmt: skip
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= (KEEP_PARTS + 1) * 10_000
    assert f.dropped == 0


def test_a_full_disk_drops_counts_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "rank0.traces.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    f = RecordFile(tmp_path, "rank0", "traces", part_bytes=10**6)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        assert not f.write("{}\n", 3)
        assert not f.write("{}\n", 2)
    assert f.dropped == 5
    assert sum("writing the run record" in r.getMessage() for r in caplog.records) == 1


def test_training_goes_on_with_the_disk_full_and_the_drops_are_counted(tmp_path: Path) -> None:
    """The real sidecar writes the record; with every write failing, training runs to
    the end and otel_train.dropped{reason=run_record} counts what was lost."""
    stamp = "full"
    run = tmp_path / f"otel-train-{stamp}"
    run.mkdir()
    for kind in ("traces", "metrics"):
        (run / f"rank0.{kind}.jsonl").symlink_to("/dev/full")
    os.environ["OTEL_TRAIN_RUN_ID"] = stamp
    try:
        model = torch_model()
        otel_train.configure(run_dir=str(tmp_path), prometheus=False, console="off",
                             trace_steps="all", service_name="otel-train")  # fmt: skip
        for _ in range(8):
            with otel_train.step(samples=1), otel_train.phase("forward"):
                model(model.weight.new_ones(1, 4))
        assert otel_train.flush(timeout=10)
        sess = session_mod.current()
        assert sess is not None and sess.record is not None
        assert sess.record.directory == str(run)
        drops = sess.export_drops()
    finally:
        del os.environ["OTEL_TRAIN_RUN_ID"]
        otel_train.shutdown()
    assert drops.get("run_record", 0) >= 8  # the step spans, at least


def torch_model():  # type: ignore[no-untyped-def]
    import torch

    return torch.nn.Linear(4, 2)


def test_report_serve_rebuilds_the_page_at_each_load(tmp_path: Path) -> None:
    """--serve: the page comes from the record as it is at each request (nothing there
    yet: 503), with a reload meta so an open tab follows the run."""
    import urllib.error
    import urllib.request

    from otel_train.runs import report

    run = tmp_path / "runs" / "served-run"  # (service "served", run id "run")
    run.mkdir(parents=True)
    server, _ = report.serve(run, 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with pytest.raises(urllib.error.HTTPError) as early:
            urllib.request.urlopen(url, timeout=10)
        assert early.value.code == 503
        early.value.close()
        job = _run(tmp_path, OTEL_SERVICE_NAME="served", OTEL_TRAIN_RUN_ID="run")
        assert job.returncode == 0, job.stderr[-2000:]
        with urllib.request.urlopen(url, timeout=30) as resp:
            page = resp.read().decode()
        assert resp.status == 200
        assert f'http-equiv="refresh" content="{report.REFRESH_S}"' in page
        assert "16 steps" in page  # the summary of the record written since
    finally:
        server.shutdown()
        server.server_close()
