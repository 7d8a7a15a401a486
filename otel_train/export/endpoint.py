"""The /metrics endpoint: its listening socket, bound in the training process where the
settings are checked (a taken port is a ConfigError at configure time, even when the
sidecar serves it), and prometheus_client's WSGI server on that socket."""

from __future__ import annotations

import errno
import socket
import threading
from typing import Any

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


def serve_metrics(registry: Any, sock: socket.socket) -> Any:
    """Serve ``registry`` on an already listening socket, from a daemon thread."""
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler, make_wsgi_app

    class Server(ThreadingWSGIServer):
        address_family = sock.family

    server = Server(sock.getsockname()[:2], _SilentHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    host, port = address(sock)
    server.server_name, server.server_port = host, port
    server.setup_environ()
    server.set_app(make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, name="otel-train-metrics", daemon=True).start()
    return server
