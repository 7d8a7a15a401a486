"""The profiler window (CPU): traces over a chosen step range, linked from those steps'
spans; usable without otel-train; off costs the recorder nothing but a None check."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from otel_helpers import attached, providers

import otel_train
from otel_train import contract as c
from otel_train.debug import memory_snapshot, profiler_window
from otel_train.recording.scopes import NEAR_WINDOW
from otel_train.testing import InMemoryTelemetry

DEBUG = Path(profiler_window.__file__).parent


def run_steps(n: int, size: int = 16) -> None:
    a = torch.randn(size, size)
    for _ in range(n):
        with otel_train.step(samples=4), otel_train.phase("work"):
            (a @ a).sum()


def step_spans(tel: InMemoryTelemetry) -> dict[int, Any]:
    return {s.attributes[c.STEP_INDEX.key]: s for s in tel.spans() if s.name == c.STEP_SPAN.name}


def profile_events(span: Any) -> list[Any]:
    return [e for e in span.events if e.name == c.PROFILE_EVENT]


def test_window_writes_one_trace_and_links_it_from_each_covered_step(tmp_path: Path) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(
        **providers(tel), console="off", profile_steps="2-3", debug_dir=str(tmp_path)
    )
    run_steps(7)
    otel_train.shutdown()

    (trace_file,) = tmp_path.iterdir()
    events = json.loads(trace_file.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)  # the steps' matmuls were profiled

    spans = step_spans(tel)
    for index in (2, 3):  # traced although the sampler would not have picked them
        (event,) = profile_events(spans[index])
        assert event.attributes[c.PROFILE_EVENT_ATTRIBUTES[0].key] == str(trace_file)
        assert event.attributes[c.PROFILE_EVENT_ATTRIBUTES[1].key] == 2
        assert event.attributes[c.PROFILE_EVENT_ATTRIBUTES[2].key] == 3
        assert spans[index].attributes[c.STEP_SAMPLED_BECAUSE.key] in ("debug", "first", "slowest")
    for index, span in spans.items():
        if index not in (2, 3):
            assert not profile_events(span)


def test_profiler_covers_only_the_window(tmp_path: Path) -> None:
    """Work outside the window is not in the trace: a marked op before and after it."""
    otel_train.configure(
        **providers(InMemoryTelemetry()),
        console="off",
        profile_steps="1",
        debug_dir=str(tmp_path),
    )
    for i in range(3):
        with otel_train.step(), torch.profiler.record_function(f"marker_{i}"):
            torch.ones(3).sum()
    otel_train.shutdown()
    (trace_file,) = tmp_path.iterdir()
    names = {e.get("name") for e in json.loads(trace_file.read_text())["traceEvents"]}
    assert "marker_1" in names
    assert "marker_0" not in names and "marker_2" not in names


def test_environment_switches_it_on_and_a_short_run_still_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRAIN_PROFILE_STEPS", "1-50")
    monkeypatch.setenv("OTEL_TRAIN_DEBUG_DIR", str(tmp_path / "traces"))
    tel = InMemoryTelemetry()
    otel_train.configure(**providers(tel), console="off")
    run_steps(4)  # the run ends inside the window: shutdown writes what was recorded
    otel_train.shutdown()
    (trace_file,) = (tmp_path / "traces").iterdir()
    assert json.loads(trace_file.read_text())["traceEvents"]
    assert profile_events(step_spans(tel)[3])


def test_a_failing_window_is_logged_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    tel = InMemoryTelemetry()
    otel_train.configure(
        **providers(tel), console="off", trace_steps="all", profile_steps="1-2",
        debug_dir=str(blocker / "sub"),
    )  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="otel_train"):
        run_steps(4)
        otel_train.shutdown()
    failures = [r for r in caplog.records if "profiler window failed" in r.getMessage()]
    assert len(failures) == 1
    spans = step_spans(tel)
    assert sorted(spans) == [0, 1, 2, 3]  # telemetry itself kept working
    assert not any(profile_events(s) for s in spans.values())  # no link to a missing file


def test_off_means_no_debug_hooks_on_the_recorder() -> None:
    otel_train.configure(**providers(InMemoryTelemetry()), console="off")
    session = otel_train.session.current()
    assert session is not None and session.recorder.debug is None


def test_event_names_mirror_the_contract() -> None:
    assert profiler_window.PROFILE_EVENT == c.PROFILE_EVENT
    keys = (
        profiler_window.PROFILE_PATH,
        profiler_window.PROFILE_FIRST,
        profiler_window.PROFILE_LAST,
    )
    assert keys == tuple(a.key for a in c.PROFILE_EVENT_ATTRIBUTES)
    assert memory_snapshot.SNAPSHOT_EVENT == c.MEMORY_SNAPSHOT_EVENT
    keys = (memory_snapshot.SNAPSHOT_PATH, memory_snapshot.SNAPSHOT_REASON)
    assert keys == tuple(a.key for a in c.MEMORY_SNAPSHOT_EVENT_ATTRIBUTES)


STANDALONE = """
import importlib.util, json, sys
def load(name):
    spec = importlib.util.spec_from_file_location(name, {debug!r} + "/" + name + ".py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
pw = load("profiler_window")
ms = load("memory_snapshot")
leaked = sorted(m for m in sys.modules if m.startswith(("otel_train", "opentelemetry.sdk")))
assert not leaked, leaked

import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("user")
window = pw.ProfilerWindow(1, 2, {out!r})
for i in range(4):
    with tracer.start_as_current_span("step"):
        window.step_started(i)
        torch.ones(4).sum()
        window.step_ended(i)
window.close()
linked = [[dict(e.attributes) for e in s.events] for s in exporter.get_finished_spans()]
print(json.dumps({{"linked": linked, "path": window.path, "written": window.written}}))
"""


def test_components_work_without_the_rest_of_otel_train(tmp_path: Path) -> None:
    code = textwrap.dedent(STANDALONE.format(debug=str(DEBUG), out=str(tmp_path)))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["written"] and Path(result["path"]).is_file()
    path_key = c.PROFILE_EVENT_ATTRIBUTES[0].key
    assert [[e[path_key] for e in events] for events in result["linked"]] == [
        [],
        [result["path"]],
        [result["path"]],
        [],
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
@pytest.mark.parametrize("mode", ["oom", "3-5"])
def test_memory_snapshot_without_cuda_is_a_config_error_at_instrument(mode: str) -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(otel_train.ConfigError) as raised:
        otel_train.instrument(model, **providers(InMemoryTelemetry()), memory_snapshot=mode)
    assert "'memory_snapshot'" in str(raised.value) and "CUDA is not available" in str(raised.value)
    assert not attached(model) and otel_train.session.current() is None


def test_under_otel_train_only_its_step_spans_carry_the_link(tmp_path: Path) -> None:
    tel = InMemoryTelemetry()
    otel_train.configure(
        **providers(tel), console="off", profile_steps="1", debug_dir=str(tmp_path)
    )
    user_tracer = tel.tracer_provider.get_tracer("user")
    with user_tracer.start_as_current_span("user-epoch"):
        run_steps(3)
    otel_train.shutdown()
    (user_span,) = [s for s in tel.spans() if s.name == "user-epoch"]
    assert not profile_events(user_span)
    assert profile_events(step_spans(tel)[1])


def test_the_log_is_deferred_until_near_the_window_and_again_after_it(tmp_path: Path) -> None:
    """Steps are applied on the training thread only near and inside the window (the
    profiler starts and stops there); far from it the hooks only log, as without it."""
    tel = InMemoryTelemetry()
    otel_train.configure(**providers(tel), console="off", trace_steps="all",
                         profile_steps="40-41", debug_dir=str(tmp_path))  # fmt: skip
    session = otel_train.session.current()
    assert session is not None
    recorder, deferred = session.recorder, {}
    a = torch.randn(16, 16)
    for i in range(70):
        marker = torch.profiler.record_function(f"marker_{i}")
        with otel_train.step(samples=4), otel_train.phase("work"), marker:
            deferred[i] = recorder._defer
            (a @ a).sum()
    otel_train.shutdown()

    # Far from the window the hooks log (after the first steps, counted for FLOPs).
    assert all(deferred[i] for i in range(5, 20))
    assert not any(deferred[i] for i in range(40 - NEAR_WINDOW // 2, 42))  # applied here
    assert all(deferred[i] for i in range(42, 70))  # the window passed: logged again
    (trace_file,) = tmp_path.iterdir()
    names = {e.get("name") for e in json.loads(trace_file.read_text())["traceEvents"]}
    assert {f"marker_{i}" for i in range(70)} & names == {"marker_40", "marker_41"}
    spans = step_spans(tel)
    assert sorted(spans) == list(range(70))
    assert [i for i, s in spans.items() if profile_events(s)] == [40, 41]
