"""A small loopback OTLP/HTTP receiver for benchmarks: it takes every export and counts it.

The stack's five servers (Collector, Prometheus, Jaeger, Thanos, VictoriaLogs) share the
two CPUs of this machine with the job being timed and were most of the noise in tail
runs; this answers the exporters as a Collector does (``200``, an empty
``Export*ServiceResponse``) at a fraction of the CPU. It prints ``ready <port>`` once it
listens, and its counts by path when it gets SIGTERM.

Usage: python benchmarks/otlp_sink.py [--port 0]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COUNTS: dict[str, int] = {}
BYTES: dict[str, int] = {}
_lock = threading.Lock()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size)
        with _lock:
            COUNTS[self.path] = COUNTS.get(self.path, 0) + 1
            BYTES[self.path] = BYTES.get(self.path, 0) + len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Sink)

    def stop(*_: Any) -> None:
        print(json.dumps({"requests": COUNTS, "bytes": BYTES}), flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    print(f"ready {server.server_address[1]}", flush=True)
    server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
