"""The /metrics server (export/endpoint.py) over real sockets: idle connections cost no
thread past a bound and are closed after a while, and a scrape that arrives while the
SDK is being built waits for its reader instead of meeting the SDK's warning."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from otel_train.export import endpoint
from otel_train.export.setup import build_own
from otel_train.settings import Settings

GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _served() -> tuple[object, int]:
    registry = CollectorRegistry()
    Counter("probe", "a probe", registry=registry).inc()
    sock = endpoint.bind_metrics_socket("127.0.0.1", 0)
    server = endpoint.serve_metrics(registry, sock)
    return server, endpoint.address(sock)[1]


def _scrape(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(GET)
        return _read_all(conn)


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _stop(server: object) -> None:
    server.shutdown()  # type: ignore[attr-defined]
    server.server_close()  # type: ignore[attr-defined]


def test_idle_connections_hold_at_most_the_bound_of_threads() -> None:
    """Many connections that send nothing: the server's threads stay within its bound
    (each connection used to hold a thread for as long as it stayed open)."""
    server, port = _served()
    before = threading.active_count()
    idle = []
    try:
        for _ in range(64):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        time.sleep(0.5)  # (let the server accept them all)
        grown = threading.active_count() - before
        print(f"64 idle connections: {grown} more threads (bound {endpoint.MAX_CONNECTIONS})")
        assert grown <= endpoint.MAX_CONNECTIONS
    finally:
        for conn in idle:
            conn.close()
        _stop(server)


def test_an_idle_connection_is_closed_and_scrapes_go_on() -> None:
    """A connection that sends nothing is closed after IDLE_TIMEOUT_S (the client reads
    the end of the stream); a scrape afterwards is served."""
    server, port = _served()
    try:
        held = [socket.create_connection(("127.0.0.1", port), timeout=60)
                for _ in range(endpoint.MAX_CONNECTIONS)]  # fmt: skip
        for conn in held:
            assert conn.recv(1) == b""  # closed by the server, not by our timeout
            conn.close()
        assert b"probe_total 1.0" in _scrape(port)
    finally:
        _stop(server)


def test_a_scrape_during_start_up_waits_for_its_reader(caplog: pytest.LogCaptureFixture) -> None:
    """Scrapes queued on the bound socket before the SDK exists are answered once the
    reader is registered: each gets the page, none makes the SDK warn that it cannot
    collect yet. (Where they are answered is a race; eight start-ups give it room.)"""
    settings = Settings.resolve({"run_dir": "off", "prometheus": True}, environ={})
    pages = []
    with caplog.at_level(logging.WARNING):
        for _ in range(8):
            pages += _start_up_scrapes(settings)
    assert all(page.startswith(b"HTTP/1.0 200") for page in pages), [p[:40] for p in pages]
    warned = [r.getMessage() for r in caplog.records if "Cannot call collect" in r.getMessage()]
    assert not warned


def _start_up_scrapes(settings: Settings) -> list[bytes]:
    sock = endpoint.bind_metrics_socket("127.0.0.1", 0)
    port = endpoint.address(sock)[1]
    waiting = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(6)]
    for conn in waiting:
        conn.sendall(GET)
    telemetry = build_own(settings, "test", sock)
    try:
        return [_read_all(conn) for conn in waiting]
    finally:
        for conn in waiting:
            conn.close()
        telemetry.shutdown(5)


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("Threads:")))


def test_the_sidecar_holds_no_thread_per_idle_connection() -> None:
    """The real sidecar serving /metrics of a configured session: 64 idle connections
    add at most MAX_CONNECTIONS threads to it (the issue saw 403 threads for 400), and a
    scrape after they are closed is served."""
    import otel_train
    from otel_train import session

    sess = otel_train.configure(prometheus_port=0, console="off", run_dir="off")
    try:
        assert sess.feeder is not None and sess.prometheus_address is not None
        pid, port = sess.feeder.process.proc.pid, sess.prometheus_address[1]
        with otel_train.step(samples=1), otel_train.phase("forward"):
            pass
        assert otel_train.flush(timeout=10)
        assert b"HTTP/1.0 200" in _scrape(port)[:20]  # (the sidecar is up and serving)
        time.sleep(0.5)
        before = _threads(pid)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(64)]
        time.sleep(1.0)  # (let the sidecar accept them)
        grown = _threads(pid) - before
        for conn in idle:
            conn.close()
        print(f"sidecar: 64 idle connections, {grown} more threads")
        assert grown <= endpoint.MAX_CONNECTIONS
        assert b"HTTP/1.0 200" in _scrape(port)[:20]
        assert session.current() is sess
    finally:
        otel_train.shutdown()
