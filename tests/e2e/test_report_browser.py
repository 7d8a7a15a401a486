"""The run report in a real browser: a small model trains with the embedded default (no
endpoint: only its run record), ``otel-train report`` writes the page, and Debian's
headless Chromium, driven by selenium, opens it from disk. No console errors, no request
but the page itself, and the plotted values are the record's, read here by this test's
own parsing of the OTLP/JSON lines. A screenshot goes to the test's output
(``OTEL_TRAIN_SCREENSHOT`` names a copy to keep, as docs/report.png was made).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from scratch import job_env

from otel_train import contract as c

JOB = textwrap.dedent("""
    import sys, time, torch, otel_train
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Flatten(),
                                torch.nn.Linear(32 * 8, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (512, 8))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, ids[:, 0]),
                                         batch_size=16)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, run_dir=sys.argv[1],
                          prometheus=False, console_every=0, peak_tflops=0.5)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            otel_train.record(loss=loss.detach())
            time.sleep(0.01)
    assert otel_train.shutdown()
""")


def _browser() -> tuple[str, str] | None:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    if os.environ.get("OTEL_TRAIN_BROWSER_REQUIRED") == "1":
        pytest.fail("chromium / chromedriver missing: run scripts/browser (scripts/test does)")
    pytest.skip("chromium / chromedriver missing: run scripts/browser")
    return None


def _driver(chromium: str, chromedriver: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--window-size=1200,5200"):  # fmt: skip
        opts.add_argument(flag)
    opts.binary_location = chromium
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


def _recorded(run: Path) -> dict[str, Any]:
    """What the record holds, parsed here: samples/s between consecutive snapshots (the
    samples counter's increase over the time between them: a snapshot's time is its
    newest point's), the last steps counter and phase call counts, and the traced step
    spans."""
    throughput, steps, calls = [], 0.0, {}
    before: tuple[float, float] | None = None  # (time, samples) of the snapshot before
    for line in (run / "rank0.metrics.jsonl").read_text().splitlines():
        t, samples = 0.0, None
        for rm in json.loads(line)["resourceMetrics"]:
            for m in (m for sm in rm["scopeMetrics"] for m in sm["metrics"]):
                points = next(v["dataPoints"] for k, v in m.items() if isinstance(v, dict))
                t = max([t, *(int(p.get("timeUnixNano", 0)) / 1e9 for p in points)])
                if m["name"] == c.SAMPLES.name:
                    samples = float(points[0].get("asDouble", points[0].get("asInt", 0)))
                elif m["name"] == c.STEPS.name:
                    steps = float(points[0].get("asDouble", points[0].get("asInt", 0)))
                elif m["name"] == c.PHASE_DURATION.name:
                    for p in points:
                        phase = next(a["value"]["stringValue"] for a in p["attributes"]
                                     if a["key"] == c.A_PHASE)  # fmt: skip
                        calls[phase] = int(p["count"])
        if samples is not None:
            if before is not None and t > before[0]:
                throughput.append((samples - before[1]) / (t - before[0]))
            before = (t, samples)
    spans = [
        s
        for line in (run / "rank0.traces.jsonl").read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
        if s["name"] == c.STEP_SPAN.name
    ]
    return {"throughput": throughput, "steps": steps, "calls": calls, "step_spans": spans}


def test_the_report_renders_the_record_offline_in_chromium(tmp_path: Path) -> None:
    chromium, chromedriver = _browser() or ("", "")
    env = job_env()
    env["OTEL_SERVICE_NAME"] = "report-test"
    env["OTEL_METRIC_EXPORT_INTERVAL"] = "1000"
    job = subprocess.run([sys.executable, "-c", JOB, str(tmp_path / "runs"), "8"], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    made = subprocess.run([sys.executable, "-m", "otel_train.cli", "report", str(run)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    page = run / "report.html"
    record = _recorded(run)
    assert len(record["throughput"]) >= 4

    driver = _driver(chromium, chromedriver)
    try:
        t0 = time.monotonic()
        driver.get(page.as_uri())
        ready = driver.execute_script("return !!(window.otelTrainReport||{}).ready")
        print(f"report: {page.stat().st_size:,} bytes, ready in {time.monotonic() - t0:.2f} s")
        assert ready
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        events = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
        urls = [m["params"]["request"]["url"] for m in events
                if m["method"] == "Network.requestWillBeSent"]  # fmt: skip
        assert urls == [page.as_uri()], urls  # nothing else: no CDN, no network
        shown = driver.execute_script("""
            const r = window.otelTrainReport, out = {};
            for (const [id, u] of Object.entries(r.charts)) out[id] = {
                x: Array.from(u.data[0]), plotted: u.plotted,
                labels: u.series.slice(1).map(s => s.label)};
            out.summary = document.getElementById('summary').textContent;
            out.waterfalls = document.querySelectorAll('.waterfall').length;
            return out;""")
        driver.save_screenshot(str(tmp_path / "report.png"))
    finally:
        driver.quit()
    keep = os.environ.get("OTEL_TRAIN_SCREENSHOT")
    if keep:
        shutil.copyfile(tmp_path / "report.png", keep)

    samples = shown["throughput"]["plotted"][shown["throughput"]["labels"].index("samples/s")]
    plotted = [v for v in samples if v is not None]
    assert plotted and plotted[-1] == pytest.approx(record["throughput"][-1])
    for v in plotted:  # (a bin shows its last snapshot's rate)
        assert any(v == pytest.approx(r) for r in record["throughput"]), v
    assert f"{record['steps']:,.0f} steps" in shown["summary"]
    for phase, n in record["calls"].items():
        assert any(line.split()[:1] == [phase] and f" {n} " in line
                   for line in shown["summary"].splitlines()), (phase, n)  # fmt: skip
    assert shown["waterfalls"] == min(60, len(record["step_spans"]))
    assert {"step", "phases", "shares", "throughput", "mfu", "stall", "goodput",
            "scalars"} <= set(shown)  # fmt: skip
