"""``otel-train report RUN_DIR``: one self-contained HTML page from a run record.

Everything the page needs travels inside it: the data as JSON, uPlot (MIT, bundled in
``assets/``, version below), the page's own script and style. It makes no network
request, so it opens offline on an air-gapped cluster. ``--serve`` serves the same page
on 127.0.0.1, rebuilt from the record at each load and reloading itself every few
seconds, for watching a run that is still writing.
"""

from __future__ import annotations

import html
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

from .page_data import page_data
from .record_data import load

UPLOT_VERSION = "1.6.32"  # npm uplot, MIT licence (assets/uPlot.LICENSE)
REFRESH_S = 5


def _asset(name: str) -> str:
    return (
        resources.files(__package__).joinpath("assets").joinpath(name).read_text(encoding="utf-8")
    )


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no closing tag can appear in it."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


def render(run_dir: str | Path, refresh_s: int | None = None) -> str:
    """The page for ``run_dir`` (``refresh_s``: reload itself that often, when served)."""
    run = Path(run_dir)
    ranks = load(run)
    data = page_data(ranks, run.name)
    title = html.escape(f"otel-train run {run.name}")
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    meta = html.escape(
        f"{len(ranks)} rank(s); {sum(len(r.snapshots) for r in ranks)} metric snapshots, "
        f"{sum(len(r.spans) for r in ranks)} spans; bins of {data['bin_seconds']:.3g} s"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title>{refresh}"
        f"<style>{_asset('uPlot.min.css')}</style><style>{_asset('report.css')}</style>"
        f'</head><body><h1>{title}</h1><p class="meta">{meta}. Plots: uPlot '
        f'{UPLOT_VERSION} (MIT).</p><div id="report"></div>'
        f'<script id="report-data" type="application/json">{_script_json(data)}</script>'
        f"<script>{_asset('uPlot.iife.min.js')}</script>"
        f"<script>{_asset('report.js')}</script></body></html>\n"
    )


def write(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``); returns its path."""
    target = Path(out) if out is not None else Path(run_dir) / "report.html"
    target.write_text(render(run_dir), encoding="utf-8")
    return target


def serve(run_dir: str | Path, port: int = 0) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve the page on 127.0.0.1:``port`` (0: any free port) from a daemon thread."""
    run = Path(run_dir)

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/", "/index.html"):
                self.send_error(404)
                return
            try:
                body = render(run, refresh_s=REFRESH_S).encode()
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
