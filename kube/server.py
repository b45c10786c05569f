"""gunicorn serving a WSGI app over TLS (the webhook and the scheduler extender).

gthread workers with keep-alive: the API server keeps connections to a webhook open and reuses
them, so each TLS handshake is paid once per connection, not per review (the sync worker closes
every connection). The app is built in each worker after the fork, so the watch threads of the
owner caches run in the process that serves from them.
"""

from __future__ import annotations

import os
import ssl
import sys
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

from kube.background import exit_without_finalizing


def _child_exit(server: Any, worker: Any) -> None:
    # A dead worker's live gauges must leave the multiprocess aggregation.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def _worker_exit(server: Any, worker: Any) -> None:
    # gunicorn calls this in the worker as it leaves, with the worker's SystemExit (its exit code)
    # being raised: the worker's daemon threads (owner caches, the extender's watches, pollers
    # and Lease) must not be there when the interpreter finalizes.
    leaving = sys.exc_info()[1]
    if isinstance(leaving, SystemExit):
        exit_without_finalizing(leaving.code)


class GunicornServer(BaseApplication):  # type: ignore[misc]  # gunicorn ships no type hints
    """Run ``app_factory()`` under gunicorn with the given settings (gunicorn option names)."""

    def __init__(self, app_factory: Callable[[], Any], options: dict[str, Any]) -> None:
        self._factory = app_factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)
        self.cfg.set("worker_exit", _worker_exit)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self.cfg.set("child_exit", _child_exit)

    def load(self) -> Any:
        return self._factory()


def gunicorn_options(
    bind: str, certfile: str, keyfile: str, workers: int, threads: int, keepalive: int, log_level: str,
    client_ca: str = "",
) -> dict[str, Any]:
    """gunicorn settings; with ``client_ca``, TLS clients must present a certificate it signed
    (the handshake fails otherwise, before any request is read)."""
    mutual = {"ca_certs": client_ca, "cert_reqs": ssl.CERT_REQUIRED} if client_ca else {}
    return {
        **mutual,
        "bind": [bind],
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        "keepalive": keepalive,
        "certfile": certfile,
        "keyfile": keyfile,
        "timeout": 30,
        "graceful_timeout": 20,
        "loglevel": log_level.lower(),
        "accesslog": None,
        "preload_app": False,
        "proc_name": "oversale-webhook",
        # gunicorn's runtime control socket lives under $HOME, which is read-only in the
        # deployed image; nothing here uses gunicornc.
        "control_socket_disable": True,
    }
