"""The run report in a real browser: a small model trains with the embedded default (no
endpoint: only its run record), ``otel-train report`` writes the page, and Debian's
headless Chromium, driven by selenium, opens it from disk. No console errors, no request
but the page itself, and the plotted values are the record's, read here by this test's
own parsing of the OTLP/JSON lines. Two run lengths: several snapshots draw curves, an
axis per unit, tick labels (read from uPlot's axes) none twice and none cut; one
snapshot (a run shorter than an export interval) shows every panel's figures instead.
A third page is the RL example's with a generator process: its rollouts are rows of
the trainer's page. A fourth has hostile names (phases and a service named as markup):
the page shows them as text and runs nothing of theirs. A screenshot goes to the test's
output (``OTEL_TRAIN_SCREENSHOT`` names a copy to keep, as docs/report.png was made).
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


def _metric_lines(run: Path) -> list[tuple[float, dict[str, list[dict[str, Any]]]]]:
    """(time, {metric name: data points}) of each snapshot of the record (a line: one
    export; its time its newest point's)."""
    out = []
    for line in (run / "rank0.metrics.jsonl").read_text().splitlines():
        metrics: dict[str, list[dict[str, Any]]] = {}
        for rm in json.loads(line)["resourceMetrics"]:
            for m in (m for sm in rm["scopeMetrics"] for m in sm["metrics"]):
                metrics[m["name"]] = next(
                    v["dataPoints"] for v in m.values() if isinstance(v, dict)
                )
        times = [int(p.get("timeUnixNano", 0)) / 1e9 for ps in metrics.values() for p in ps]
        out.append((max(times), metrics))
    return out


def _number(p: dict[str, Any]) -> float:
    return float(p.get("asDouble", p.get("asInt", 0)))


def _attr(p: dict[str, Any], key: str) -> str:
    return str(next(a["value"]["stringValue"] for a in p["attributes"] if a["key"] == key))


def _recorded(run: Path) -> dict[str, Any]:
    """What the record holds, parsed here: between consecutive snapshots samples/s (the
    samples counter's increase over the time between them) and the phases' seconds per
    step (their sums' increase over the steps counter's; the first snapshot's since the
    start); the last steps counter, phase
    call counts, samples over run time, data stall, resident memory; the traced step
    spans."""
    throughput, per_step, calls, last = [], [], {}, {}
    before: dict[str, float] | None = None  # the snapshot before: time, samples, ...
    for t, metrics in _metric_lines(run):
        now = {"t": t}
        for name, key in ((c.SAMPLES.name, "samples"), (c.STEPS.name, "steps"),
                          (c.PROCESS_MEMORY_RSS.name, "rss")):  # fmt: skip
            if name in metrics:
                now[key] = _number(metrics[name][0])
        for p in metrics.get(c.RUN_TIME.name, []):
            now["run." + _attr(p, c.A_CATEGORY)] = _number(p)
        phases = metrics.get(c.PHASE_DURATION.name, [])
        calls.update({_attr(p, c.A_PHASE): int(p["count"]) for p in phases})
        if phases:
            now["phase_seconds"] = sum(float(p["sum"]) for p in phases)
        if before is not None and t > before["t"] and "samples" in now:
            throughput.append((now["samples"] - before["samples"]) / (t - before["t"]))
        start = before or {"steps": 0.0}  # (the first snapshot: since the start)
        if "samples" in now and now["steps"] > start["steps"]:
            gained = now["phase_seconds"] - start.get("phase_seconds", 0.0)
            per_step.append(gained / (now["steps"] - start["steps"]))
        if "samples" in now:
            before = now
        last.update(now)
    spans = [
        s
        for line in (run / "rank0.traces.jsonl").read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
        if s["name"] == c.STEP_SPAN.name
    ]
    wall = sum(v for k, v in last.items() if k.startswith("run."))
    return {"throughput": throughput, "per_step": per_step, "steps": last["steps"],
            "calls": calls, "step_spans": spans, "snapshots": len(_metric_lines(run)),
            "samples_per_s": last["samples"] / wall, "rss": last["rss"],
            "stall": last["run.data"] / (last["run.data"] + last["run.train"])}  # fmt: skip


SHOWN = """
    const r = window.otelTrainReport, out = {charts: {}, figures: r.figures};
    for (const [id, u] of Object.entries(r.charts)) out.charts[id] = {
        x: Array.from(u.data[0]), plotted: u.plotted,
        labels: u.series.slice(1).map(s => s.label), scales: u.series.slice(1).map(s => s.scale),
        axes: u.axes.map(a => {
            u.ctx.font = a.font[0];
            const labels = Array.from(a._values || []);
            return {side: a.side, scale: a.scale, labels: labels, size: a._size,
                    room: a.ticks.size + a.gap,
                    widths: labels.map(v => u.ctx.measureText(v).width / devicePixelRatio)};
        })};
    out.title = document.title;
    out.summary = document.getElementById('summary').textContent;
    out.waterfalls = document.querySelectorAll('.waterfall').length;
    out.rows = Array.from(document.querySelectorAll('.wf-name')).map(e => e.textContent.trim());
    return out;"""


def _job(tmp_path: Path, seconds: float, interval_ms: int) -> Path:
    """A run of the job for ``seconds``, metrics exported every ``interval_ms``, as the
    service ``run``; its report page written by ``otel-train report``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SERVICE_NAME"] = "run"  # (a title once read "otel-train run run-...")
    env["OTEL_METRIC_EXPORT_INTERVAL"] = str(interval_ms)
    job = subprocess.run([sys.executable, "-c", JOB, str(tmp_path / "runs"), str(seconds)],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    _report(run)
    return run


def _report(run: Path) -> None:
    made = subprocess.run([sys.executable, "-m", "otel_train.cli", "report", str(run)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr


def _open(tmp_path: Path, page: Path) -> dict[str, Any]:
    """The page in Chromium: what it drew (SHOWN), after checking it logged no error and
    requested nothing but itself. A screenshot goes to the test's output."""
    chromium, chromedriver = _browser() or ("", "")
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
        shown: dict[str, Any] = driver.execute_script(SHOWN)
        driver.save_screenshot(str(tmp_path / "report.png"))
    finally:
        driver.quit()
    keep = os.environ.get("OTEL_TRAIN_SCREENSHOT")
    if keep:
        shutil.copyfile(tmp_path / "report.png", keep)
    return shown


def _check_axes(shown: dict[str, Any]) -> None:
    """Every chart: an axis per unit, no tick label twice on an axis, and every label of
    a value axis inside the axis's width (uPlot draws them right of x = 0 on the left
    axis: a wider label is cut)."""
    for cid, ch in shown["charts"].items():
        values = [a for a in ch["axes"] if a["side"] in (1, 3)]
        assert len(values) == len(set(ch["scales"])), (cid, ch["scales"])
        for axis in ch["axes"]:
            assert axis["labels"], (cid, axis)
            assert len(set(axis["labels"])) == len(axis["labels"]), (cid, axis["labels"])
        for axis in values:
            assert max(axis["widths"]) + axis["room"] <= axis["size"], (cid, axis)
    assert shown["title"] == f"otel-train report: {shown['run']}"


def _check_summary(shown: dict[str, Any], record: dict[str, Any]) -> None:
    assert f"{record['steps']:,.0f} steps" in shown["summary"]
    for phase, n in record["calls"].items():
        assert any(line.split()[:1] == [phase] and f" {n} " in line
                   for line in shown["summary"].splitlines()), (phase, n)  # fmt: skip
    assert shown["waterfalls"] == min(60, len(record["step_spans"]))


def test_a_run_of_several_snapshots_draws_its_curves(tmp_path: Path) -> None:
    run = _job(tmp_path, 8.0, 1000)
    record = _recorded(run)
    assert len(record["throughput"]) >= 4
    shown = _open(tmp_path, run / "report.html") | {"run": run.name}
    assert {"step", "phases", "shares", "memory", "throughput", "mfu", "stall", "goodput",
            "scalars"} <= set(shown["charts"])  # fmt: skip
    _check_axes(shown)
    _check_summary(shown, record)
    ch = shown["charts"]["throughput"]
    samples = ch["plotted"][ch["labels"].index("samples/s")]
    plotted = [v for v in samples if v is not None]
    assert plotted and plotted[-1] == pytest.approx(record["throughput"][-1])
    for v in plotted:  # (a bin shows its last snapshot's rate)
        assert any(v == pytest.approx(r) for r in record["throughput"]), v
    scale = dict(zip(ch["labels"], ch["scales"], strict=True))
    assert scale["samples/s"] != scale["tokens/s"]  # an axis each
    # Time per step by phase: each bin holds the phases' seconds over the steps of the
    # snapshots in it, so it lies within what consecutive snapshots give, from the start.
    ch = shown["charts"]["phases"]
    totals = [sum(col[i] or 0.0 for col in ch["plotted"]) for i in range(len(ch["x"]))]
    kept = [t for i, t in enumerate(totals) if any(col[i] is not None for col in ch["plotted"])]
    lo, hi = min(record["per_step"]), max(record["per_step"])
    assert kept and all(lo * 0.999 <= t <= hi * 1.001 for t in kept), (kept, lo, hi)


def test_a_run_of_one_snapshot_shows_its_figures(tmp_path: Path) -> None:
    """A run shorter than one export interval: one snapshot, no curve to draw; every
    panel shows the run's figures instead, as the run summary has them."""
    run = _job(tmp_path, 2.0, 60_000)
    record = _recorded(run)
    assert record["snapshots"] == 1
    shown = _open(tmp_path, run / "report.html") | {"run": run.name}
    figures = {cid: {f["label"]: f["value"] for f in fs} for cid, fs in shown["figures"].items()}
    assert {"step", "phases", "shares", "memory", "throughput", "mfu", "stall", "goodput",
            "scalars"} <= set(figures)  # fmt: skip
    assert not shown["charts"]
    assert figures["throughput"]["samples/s"] == pytest.approx(record["samples_per_s"])
    assert figures["stall"]["data stall"] == pytest.approx(record["stall"])
    assert figures["memory"]["process RSS"] == record["rss"]
    assert sum(figures["shares"].values()) == pytest.approx(1.0)
    _check_axes(shown)
    _check_summary(shown, record)


def test_the_report_shows_the_generators_rollouts(tmp_path: Path) -> None:
    """examples/rl_loop.py with a generator process: the trainer's page has the
    generator's rollouts (its record, beside the trainer's) as a summary row and in the
    traced steps, named as the console names them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_SERVICE_NAME="rl", OTEL_TRAIN_TRACE_STEPS="all", OTEL_TRAIN_CONSOLE="off")
    example = Path(__file__).resolve().parents[2] / "examples" / "rl_loop.py"
    args = [sys.executable, str(example), "--iterations", "20", "--generators", "1"]
    job = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    (run,) = [r for r in (tmp_path / "otel-train-runs").iterdir() if "-generator-" not in r.name]
    _report(run)
    shown = _open(tmp_path, run / "report.html") | {"run": run.name}
    rows = [line.split() for line in shown["summary"].splitlines()]
    (made,) = [r for r in rows if r[:2] == ["rollout", "[generator]"]]
    assert made[4:6] == ["-", "21"]  # all it made: two at the first step, then one a step
    assert shown["rows"].count("rollout [generator]") == 21  # every step traced
    assert shown["rows"].count("weight_sync [generator]") == 20


HOSTILE = ("<!--<script>", "</script><script>window.pwned=1</script>",
           "<img src=x onerror=window.pwned=2> \u2028&\u2029 x")  # fmt: skip
HOSTILE_JOB = textwrap.dedent("""
    import json, sys, torch, otel_train
    names = json.loads(sys.argv[2])
    otel_train.configure(run_dir=sys.argv[1], prometheus=False, console="off",
                         trace_steps="all", metric_export_interval=1)
    for _ in range(12):
        with otel_train.step(samples=4):
            for name in names:
                with otel_train.phase(name):
                    torch.ones(64).sum()
    assert otel_train.shutdown()
""")


def test_hostile_names_show_as_text(tmp_path: Path) -> None:
    """Phase names and a service name made of markup (a comment opener that once blanked
    the page, a closing script tag, an event handler): the page is drawn, its data is
    the record's, the names read as text in the summary and the waterfalls, and no
    script of theirs runs or is added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SERVICE_NAME"] = HOSTILE[1]
    env["OTEL_TRAIN_RUN_ID"] = "hostile"
    job = subprocess.run([sys.executable, "-c", HOSTILE_JOB, str(tmp_path / "runs"),
                          json.dumps(HOSTILE)], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    _report(run)
    html = (run / "report.html").read_text()
    data = html.split('<script id="report-data" type="application/json">')[1]
    assert "<" not in data.split("</script>")[0]  # the data holds no markup at all
    chromium, chromedriver = _browser() or ("", "")
    driver = _driver(chromium, chromedriver)
    try:
        driver.get((run / "report.html").as_uri())
        shown = driver.execute_script(SHOWN.replace("return out;", """
            out.ready = !!r.ready; out.pwned = window.pwned || null;
            out.scripts = document.scripts.length; out.images = document.images.length;
            return out;"""))  # fmt: skip
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    assert shown["ready"] and not errors, errors
    assert shown["pwned"] is None and shown["images"] == 0
    assert shown["scripts"] == 4  # the data and the page's three scripts, none added
    for name in HOSTILE:
        assert name in shown["summary"], name
        assert shown["rows"].count(name) == 12, (name, shown["rows"][:6])  # each traced step


AGAINST = """
    const c = window.otelTrainReport.data.against, box = document.getElementById('against');
    const rows = Array.from(box.querySelectorAll('.cmp-row')).map(row => ({
        name: row.querySelector('.fig-name').textContent,
        a: row.querySelector('.cmp-a').getBoundingClientRect().width,
        b: row.querySelector('.cmp-b').getBoundingClientRect().width,
        lane: row.querySelector('.cmp-lane').getBoundingClientRect().width,
        text: row.querySelector('.cmp-value').textContent}));
    return {title: box.querySelector('h3').textContent, rows: rows, data: c};"""


def test_the_report_against_another_run_draws_both_runs_phase_bars(tmp_path: Path) -> None:
    """``otel-train report A --against B`` over two runs of tests/unit/compare_job.py,
    B's dataset 2 ms a sample slower: a section with each phase's two bars, their
    lengths the runs' medians (the longest the lane), and compare's words for each."""
    job = Path(__file__).resolve().parents[1] / "unit" / "compare_job.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    runs = {}
    for name, delay in (("fast", "0"), ("slow", "0.002")):
        done = subprocess.run([sys.executable, str(job), str(tmp_path / "runs"), "--delay", delay],
                              env={**env, "OTEL_TRAIN_RUN_ID": name}, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        (runs[name],) = (tmp_path / "runs").glob(f"*-{name}")
    made = subprocess.run([sys.executable, "-m", "otel_train.cli", "report", str(runs["fast"]),
                           "--against", str(runs["slow"])], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    compared = subprocess.run([sys.executable, "-m", "otel_train.cli", "compare",
                               str(runs["fast"]), str(runs["slow"]), "--json"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    changes = {r["metric"].removeprefix("phase:"): r for r in json.loads(compared.stdout)["rows"]}
    page = runs["fast"] / "report.html"
    chromium, chromedriver = _browser() or ("", "")
    driver = _driver(chromium, chromedriver)
    try:
        driver.get(page.as_uri())
        shown = driver.execute_script(AGAINST)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        driver.save_screenshot(str(tmp_path / "against.png"))
    finally:
        driver.quit()
    assert not errors, errors
    assert (
        shown["title"]
        == f"Against {runs['slow'].name} (A: {runs['fast'].name}, B: {runs['slow'].name})"
    )
    assert [r["name"] for r in shown["rows"]] == [
        "step",
        "backward",
        "data",
        "forward",
        "optimizer",
    ]
    top = max(max(r["a_median"], r["b_median"]) for r in changes.values() if r["kind"] == "time")
    for row in shown["rows"]:
        want = changes[row["name"]]
        assert row["a"] == pytest.approx(row["lane"] * want["a_median"] / top, abs=1.0)
        assert row["b"] == pytest.approx(row["lane"] * want["b_median"] / top, abs=1.0)
        assert row["text"].endswith(": " + want["change"])
    assert (
        changes["data"]["verdict"] == "slower"
        and "% slower (95% interval" in shown["rows"][2]["text"]
    )
    assert shown["rows"][0]["b"] == pytest.approx(
        shown["rows"][0]["lane"], abs=1.0
    )  # B's step: the longest
