"""Size and render time of the run report for a many-step, many-rank run.

Runs ``--ranks`` real training processes (RANK/WORLD_SIZE set, one shared run id, the
embedded default: each writes its run record through its own sidecar), ``--steps`` steps
each, with a metric snapshot every ``--interval-ms``; then ``otel-train report`` and, when
Debian's Chromium is installed, the time headless Chromium takes until the page says it
is drawn. Prints the figures; asserts nothing.

    .venv/bin/python benchmarks/report_page.py --ranks 8 --steps 10000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

JOB = textwrap.dedent("""
    import sys, torch, otel_train
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4); opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(torch.randn(512, 16), torch.randn(512, 4))
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, run_dir=sys.argv[1],
                          prometheus=False, console="off")
    done, steps = 0, int(sys.argv[2])
    while done < steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            otel_train.record(loss=loss.detach())
            done += 1
            if done == steps:
                break
    otel_train.shutdown()
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--interval-ms", type=int, default=100)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="otel-train-report-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_TRAIN_RUN_ID="bench",
        OTEL_SERVICE_NAME="report-bench",
        OTEL_METRIC_EXPORT_INTERVAL=str(args.interval_ms),
        WORLD_SIZE=str(args.ranks),
    )
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JOB, str(work / "runs"), str(args.steps)],
            env={**env, "RANK": str(r)},
        )
        for r in range(args.ranks)
    ]
    if any(p.wait() for p in procs):
        print("a training process failed", file=sys.stderr)
        return 1
    (run,) = (work / "runs").iterdir()
    record = sum(f.stat().st_size for f in run.iterdir())
    print(f"training: {args.ranks} ranks x {args.steps} steps in {time.monotonic() - t0:.0f} s; "
          f"record {record / 1e6:.1f} MB")  # fmt: skip
    t1 = time.monotonic()
    subprocess.run([sys.executable, "-m", "otel_train.cli", "report", str(run)], check=True)
    page = run / "report.html"
    print(f"report: {page.stat().st_size / 1e6:.2f} MB, built in {time.monotonic() - t1:.2f} s")
    if shutil.which("chromium") and shutil.which("chromedriver"):
        print(f"render in headless Chromium: {_render(page):.2f} s (load to drawn)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _render(page: Path) -> float:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--window-size=1200,3000"):  # fmt: skip
        opts.add_argument(flag)
    opts.binary_location = shutil.which("chromium") or ""
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or ""), options=opts)
    try:
        t0 = time.monotonic()
        driver.get(page.as_uri())  # returns after the load event: the page draws inline
        assert driver.execute_script("return !!(window.otelTrainReport||{}).ready")
        return time.monotonic() - t0
    finally:
        driver.quit()


if __name__ == "__main__":
    sys.exit(main())
