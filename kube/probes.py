"""A plain-HTTP listener for probes and scrapes beside a mutual-TLS server: the kubelet's probes
and Prometheus present no client certificate, and these paths change nothing."""

from __future__ import annotations

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
    """Serve GET ``routes`` on ``host:port`` from a daemon thread; anything else is a 404."""

    class Handler(AnsweringHandler):
        def do_GET(self) -> None:
            answer = routes.get(self.path.split("?", 1)[0])
            self.send(*(answer() if answer else (404, b'{"error": "not found"}', "application/json")))

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server
