"""The /metrics endpoint: its listening socket, bound in the training process where the
settings are checked (a taken port is a ConfigError at configure time, even when the
sidecar serves it), and a WSGI server of prometheus_client's app on that socket.

The server gives each connection a thread, at most MAX_CONNECTIONS at once (one more
is closed as soon as it is accepted), and closes a connection that sends nothing for
IDLE_TIMEOUT_S: idle connections cannot pile up threads in the process that serves it.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from ..settings import ConfigError


def bind_metrics_socket(host: str, port: int, policy: str = "offset") -> socket.socket:
    """The listening socket of /metrics (bound where the settings are checked, so that a
    taken port is a ConfigError at configure time even when the sidecar serves it)."""
    if port > 65535:
        raise ConfigError(
            f"otel_train setting 'prometheus_port': base port plus LOCAL_RANK is {port}, past "
            "65535; choose a lower prometheus_port or prometheus_ranks='first' "
            "(accepted: 'offset', 'first', 'all')"
        )
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(16)
        except BaseException:
            sock.close()
            raise
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"otel_train setting 'prometheus_port': port {port} on {host} is already in "
                f"use (prometheus_ranks={policy!r}); choose another with prometheus_port= or "
                "OTEL_TRAIN_PROMETHEUS_PORT (0 picks a free port), set prometheus_ranks to "
                "'offset' (port + LOCAL_RANK) or 'first' (local rank 0 only) when several "
                "ranks share a node, or turn /metrics off with prometheus=False"
            ) from None
        raise ConfigError(
            f"otel_train setting 'prometheus_host': cannot serve /metrics on {host}:{port}: {err}"
        ) from None
    return sock


def address(sock: socket.socket) -> tuple[str, int]:
    bound = sock.getsockname()
    return str(bound[0]), int(bound[1])


MAX_CONNECTIONS = 8  # served at once (a scrape takes milliseconds; Prometheus sends one)
IDLE_TIMEOUT_S = 10.0  # a connection silent this long is closed (Prometheus's own timeout)


class _QuietHandler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S  # (socketserver sets it on the connection)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, MAX_CONNECTIONS of them at most."""

    daemon_threads = True

    def __init__(self, sock: socket.socket) -> None:
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], _QuietHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed now, not queued on a thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection timed out or reset: closed, nothing printed (the default prints
        its traceback to stderr)."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve_metrics(registry: Any, sock: socket.socket) -> Any:
    """Serve ``registry`` on an already listening socket, from a daemon thread. Call it
    once the registry's reader is registered on its meter provider: a scrape before
    then makes the SDK warn that it cannot collect (until then, scrapes wait in the
    socket's backlog)."""
    from prometheus_client import make_wsgi_app

    server = _BoundedServer(sock)
    host, port = address(sock)
    server.server_name, server.server_port = host, port
    server.setup_environ()
    server.set_app(make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, name="otel-train-metrics", daemon=True).start()
    return server
