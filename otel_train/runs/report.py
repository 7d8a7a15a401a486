"""``otel-train report RUN_DIR``: one self-contained HTML page from a run record (or,
``--prometheus URL [--jaeger URL] --job JOB``, from a live stack: live.py gives the same
run the record does, and the page is drawn by the same code).

Everything the page needs travels inside it: the data as JSON, uPlot (MIT, bundled in
``assets/``, version below), the page's own script and style. It makes no network
request, so it opens offline on an air-gapped cluster. ``--serve`` serves the same page
on 127.0.0.1, rebuilt from the record at each load and reloading itself every few
seconds, for watching a run that is still writing.
"""

from __future__ import annotations

import html
import json
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

from .against import against_data
from .files import write_output
from .live import fetch_run
from .page_data import page_data
from .record_data import Run, load_run
from .trace_sample import MAX_TRACES

UPLOT_VERSION = "1.6.32"  # npm uplot, MIT licence (assets/uPlot.LICENSE)
REFRESH_S = 5
SCRIPTS = ("uPlot.iife.min.js", "charts.js", "report.js")  # in this order


def _asset(name: str) -> str:
    return (
        resources.files(__package__).joinpath("assets").joinpath(name).read_text(encoding="utf-8")
    )


# Inside <script>, the HTML parser looks for "</script", "<!--" and "<script" before the
# JSON parser sees anything; with these as JSON escapes no markup can appear in the data
# (U+2028/2029: line ends to JavaScript, should the data ever be read as a script).
_SCRIPT_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no ``<``, ``>``, ``&`` or U+2028/2029 in it, only
    their JSON escapes, which JSON.parse turns back into the same text."""
    return json.dumps(value, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


def page(run: Run, name: str, refresh_s: int | None = None, source: str = "",
         against: dict[str, Any] | None = None) -> str:  # fmt: skip
    """The page of ``run`` (``name``: its run directory's, or the job's; ``refresh_s``:
    reload itself that often; ``source``: where the data came from, for the header;
    ``against``: the comparison section's data, against.py)."""
    data = page_data(run, name)
    data["against"] = against
    title = html.escape(f"otel-train report: {name}")
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    records = [*run.ranks, *run.others]
    roles = sorted({r.role for r in run.others})
    others = f" and {len(run.others)} other process(es) ({', '.join(roles)})" if roles else ""
    meta = html.escape(
        f"{source}{len(run.ranks)} rank(s){others}; "
        f"{sum(len(r.snapshots) for r in records)} metric snapshots, "
        f"{sum(len(r.spans) for r in records)} spans; bins of {data['bin_seconds']:.3g} s"
        + "".join(f"; {note}" for note in run.notes())
    )
    scripts = "".join(f"<script>{_asset(a)}</script>" for a in SCRIPTS)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title>{refresh}"
        f"<style>{_asset('uPlot.min.css')}</style><style>{_asset('report.css')}</style>"
        f'</head><body><h1>{title}</h1><p class="meta">{meta}. Plots: uPlot '
        f'{UPLOT_VERSION} (MIT).</p><div id="report"></div>'
        f'<script id="report-data" type="application/json">{_script_json(data)}</script>'
        f"{scripts}</body></html>\n"
    )


def render(run_dir: str | Path, refresh_s: int | None = None,
           against: str | Path | None = None) -> str:  # fmt: skip
    """The page for ``run_dir`` and the run's other processes recorded beside it; with
    ``against`` (another run directory), a section comparing the two."""
    run, loaded = Path(run_dir), load_run(run_dir, MAX_TRACES)
    if refresh_s is None:  # (a served page, rebuilt every few seconds: on the page only)
        for note in loaded.notes():
            print(f"otel-train report: {note}", file=sys.stderr)
    other = None
    if against is not None:
        names = (run.name, Path(against).name)
        other = against_data(loaded, load_run(against), names)
    return page(loaded, run.name, refresh_s, against=other)


def render_live(prometheus: str, jaeger: str | None, job: str, seconds: float,
                refresh_s: int | None = None) -> str:  # fmt: skip
    """The page for ``job`` from a live stack (live.py): its last ``seconds``."""
    run = fetch_run(prometheus, jaeger, job, seconds)
    source = f"job {job} from {prometheus}" + (f" and {jaeger}" if jaeger else "")
    return page(run, job, refresh_s, source=f"{source}, the last {seconds:g} s: ")


def write(run_dir: str | Path, out: str | Path | None = None,
          against: str | Path | None = None) -> Path:  # fmt: skip
    """Write the page (default ``RUN_DIR/report.html``); returns its path."""
    target = Path(out) if out is not None else Path(run_dir) / "report.html"
    return write_output(target, render(run_dir, against=against))


def serve(
    run_dir: str | Path | None, port: int = 0, render_page: Callable[[int], str] | None = None
) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve the page on 127.0.0.1:``port`` (0: any free port) from a daemon thread,
    rebuilt at each request: from ``run_dir``, or by ``render_page(refresh_s)``."""
    make = render_page or (lambda refresh: render(str(run_dir), refresh_s=refresh))

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/", "/index.html"):
                self.send_error(404)
                return
            try:
                body = make(REFRESH_S).encode()
                code = 200
            except (OSError, ValueError) as err:
                body, code = f"no report yet: {html.escape(str(err))}".encode(), 503
            self.send_response(code)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", port), Page)
    thread = threading.Thread(target=server.serve_forever, name="otel-train-report", daemon=True)
    thread.start()
    return server, thread
