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
from otel_train.export import record
from otel_train.export.record import KEEP_PARTS, LINE_SPANS, RecordFile, RecordSpanExporter
from otel_train.export.run_directory import DIRECTORY_MODE, RunDirectory, make_run_directory
from otel_train.settings import Settings

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
    assert sorted(p.name for p in run.iterdir()) == [
        "rank0.metrics.jsonl", "rank0.run.json", "rank0.traces.jsonl"]  # fmt: skip
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
    umask = os.umask(0)
    os.umask(umask)
    assert run.stat().st_mode & 0o777 == DIRECTORY_MODE & ~umask == 0o700 & ~umask
    for f in run.iterdir():
        assert f.stat().st_mode & 0o777 == record.FILE_MODE == 0o600
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
    f = RecordFile(RunDirectory(str(tmp_path), shared=True), "rank0", "traces", part_bytes=10_000)
    line = json.dumps({"x": "y" * 1000}) + "\n"
    for _ in range(200):
        assert f.write(line, 1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rank0.traces.1.jsonl", "rank0.traces.2.jsonl", "rank0.traces.3.jsonl",
                     "rank0.traces.jsonl"][: KEEP_PARTS + 1]  # fmt: skip
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= (KEEP_PARTS + 1) * 10_000
    assert f.dropped == 0


def test_a_batch_of_spans_is_written_as_requests_of_at_most_line_spans(tmp_path: Path) -> None:
    """A batch becomes several lines (encoding a whole batch at once held ~7 MiB)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult

    f = RecordFile(RunDirectory(str(tmp_path), shared=True), "rank0", "traces", part_bytes=10**8)
    tracer = TracerProvider().get_tracer("t")
    spans = []
    for i in range(3 * LINE_SPANS + 5):
        span = tracer.start_span(f"s{i}")
        span.end()
        spans.append(span)
    assert RecordSpanExporter(f).export(spans) == SpanExportResult.SUCCESS
    f.close()
    lines = [
        [s["name"] for rs in req["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        for req in _lines(tmp_path / "rank0.traces.jsonl")
    ]
    assert max(len(names) for names in lines) <= LINE_SPANS
    assert [name for names in lines for name in names] == [f"s{i}" for i in range(len(spans))]


FAILING_WRITES = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    from otel_train.export.record import RecordFile
    from otel_train.export.run_directory import RunDirectory
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (EFBIG instead of the signal)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    f = RecordFile(RunDirectory(sys.argv[1], True), "rank0", "traces", part_bytes=10**6)
    print(f.write("{}\\n", 3), f.write("{}\\n", 2), f.dropped)
""")


def test_a_failing_write_drops_counts_and_warns_once(tmp_path: Path) -> None:
    """Every write fails (a file size limit of 0: EFBIG, as a full disk gives ENOSPC):
    both batches are counted as dropped, with one warning."""
    done = subprocess.run([sys.executable, "-c", FAILING_WRITES, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "5"]
    assert done.stderr.count("writing the run record") == 1, done.stderr


def test_training_goes_on_when_the_record_cannot_be_written_and_drops_are_counted(
    tmp_path: Path,
) -> None:
    """The real sidecar writes the record; with a file where its directory is to be made
    (at the first write: every write fails), training runs to the end and
    otel_train.dropped{reason=run_record} counts what was lost."""
    stamp = "gone"
    run = tmp_path / f"otel-train-{stamp}"
    os.environ["OTEL_TRAIN_RUN_ID"] = stamp
    try:
        model = torch_model()
        otel_train.configure(run_dir=str(tmp_path), prometheus=False, console="off",
                             trace_steps="all", service_name="otel-train")  # fmt: skip
        sess = session_mod.current()
        assert sess is not None and sess.record is not None
        assert sess.record.directory == str(run) and sess.feeder is not None
        assert not run.exists()  # (made at the first write)
        run.write_text("not a directory")
        for _ in range(8):
            with otel_train.step(samples=1), otel_train.phase("forward"):
                model(model.weight.new_ones(1, 4))
        assert otel_train.flush(timeout=10)
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


def test_a_planted_symlink_in_the_run_directory_is_moved_not_followed(tmp_path: Path) -> None:
    """The run's directory exists (this user's: a rank of the same run id started
    before) with rank0.traces.jsonl a symbolic link to another file: the job writes a
    new file of its own, the link is kept as an older part, and the file it named is
    untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "runs" / "planted-link"
    run.mkdir(parents=True, mode=0o700)
    (run / "rank0.traces.jsonl").symlink_to(victim)
    job = _run(tmp_path, OTEL_SERVICE_NAME="planted", OTEL_TRAIN_RUN_ID="link")
    assert job.returncode == 0, job.stderr[-2000:]
    assert victim.read_text() == "precious\n"
    current = run / "rank0.traces.jsonl"
    assert not current.is_symlink() and current.stat().st_mode & 0o777 == 0o600
    assert _lines(current)[0]["resourceSpans"]
    assert (run / "rank0.traces.1.jsonl").readlink() == victim


def _plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_id: str | None) -> object:
    for name in ("OTEL_TRAIN_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "K8S_JOB_NAME",
                 "LOCAL_RANK"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    if run_id is not None:
        monkeypatch.setenv("OTEL_TRAIN_RUN_ID", run_id)
    return record.plan(Settings.resolve({"run_dir": str(tmp_path)}, environ={}), "svc")


def _first_write(plan: object) -> tuple[RecordFile, bool]:
    traces, _ = record.record_files(plan)  # type: ignore[arg-type]
    return traces, traces.write("{}\n", 1)


def test_a_run_directory_that_is_a_symlink_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "svc-r1").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        traces, written = _first_write(_plan(tmp_path, monkeypatch, "r1"))
    assert not written and traces.dropped == 1 and not list(elsewhere.iterdir())
    assert "svc-r1 exists and is a symbolic link" in caplog.text


def test_a_run_directory_others_can_write_to_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "svc-r2"
    shared.mkdir()
    shared.chmod(0o777)  # (made by someone else for everyone: a planted directory)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        traces, written = _first_write(_plan(tmp_path, monkeypatch, "r2"))
    assert not written and traces.dropped == 1 and not list(shared.iterdir())
    assert "svc-r2 exists and others can write to it (mode 777)" in caplog.text


def test_a_run_of_the_same_run_id_shares_its_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranks of one run share the directory the first of them made."""
    first, second = _plan(tmp_path, monkeypatch, "r3"), _plan(tmp_path, monkeypatch, "r3")
    assert _first_write(first)[1] and _first_write(second)[1]
    assert first.directory == second.directory == str(tmp_path / "svc-r3")  # type: ignore[attr-defined]


def test_a_process_that_writes_nothing_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, monkeypatch, None)
    record.record_files(plan)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


def test_a_lone_process_never_reuses_an_existing_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No run id, no launcher: the directory is made exclusively; a name taken (another
    run started in the same second, or a planted directory) gets the next number, and
    where the record went is said when it is not where the start said."""
    base = str(tmp_path / "svc-20260101T000000Z")
    made = [make_run_directory(base, shared=False) for _ in range(3)]
    assert [Path(m).name for m in made] == [
        "svc-20260101T000000Z", "svc-20260101T000000Z-2", "svc-20260101T000000Z-3"]  # fmt: skip
    plan = _plan(tmp_path / "runs", monkeypatch, None)
    Path(plan.directory).mkdir(parents=True)  # type: ignore[attr-defined]  # (taken meanwhile)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        traces, written = _first_write(plan)
    assert written and traces.path.parent.name == Path(plan.directory).name + "-2"  # type: ignore[attr-defined]
    assert f"run record in {traces.path.parent} ({plan.directory} was taken" in caplog.text  # type: ignore[attr-defined]
