"""A plain-HTTP listener for probes and scrapes beside a mutual-TLS server: the kubelet's probes
and Prometheus present no client certificate, and these paths change nothing."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[], tuple[int, bytes, str]]
"""() -> (HTTP status, body, content type)"""


class AnsweringHandler(BaseHTTPRequestHandler):
    """A handler that answers whole bodies (:meth:`send`) and logs nothing: probes come every few
    seconds."""

    def send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_probes(host: str, port: int, routes: dict[str, Answer]) -> ThreadingHTTPServer:
    """Serve GET ``routes`` on ``host:port`` from a daemon thread; anything else is a 404. ``host``
    as ``--bind`` gives it: a name, an IPv4 address, or an IPv6 address bracketed or not."""

    class Handler(AnsweringHandler):
        def do_GET(self) -> None:
            answer = routes.get(self.path.split("?", 1)[0])
            self.send(*(answer() if answer else (404, b'{"error": "not found"}', "application/json")))

    # ``host`` comes from a --bind gunicorn reads, where an IPv6 address is bracketed ("[::]:8444"
    # on an IPv6-only cluster); the socket takes it bare, and in a family of its own.
    bare = host.removeprefix("[").removesuffix("]")

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in bare else socket.AF_INET

    server = Server((bare, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server
