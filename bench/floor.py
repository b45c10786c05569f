"""The floor of the serving stack: reads the request body and returns a fixed ``allowed: true``
AdmissionReview, served exactly like the webhook (same gunicorn settings, TLS, workers, threads).

    python -m bench.floor --bind HOST:PORT --certs-dir DIR [--kind bare|flask]

``bare`` (default) is a plain WSGI callable: no framework at all, the real minimum of the stack.
``flask`` is the same answer through Flask, to show what the framework alone costs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

from kube.server import GunicornServer, gunicorn_options
from kube.tls import CertificatePaths
from oversale.settings import Settings

ANSWER = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}'


def bare_floor(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """Read the body, answer the fixed review."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length) if length else environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(ANSWER)))])
    return [ANSWER]


def create_floor_app() -> Flask:
    app = Flask("floor")

    @app.post("/mutate/<path:kind>")
    def answer(kind: str) -> Response:
        request.get_data()
        return Response(ANSWER, mimetype="application/json")

    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--certs-dir", type=Path, required=True)
    parser.add_argument("--kind", choices=["bare", "flask"], default="bare")
    args = parser.parse_args()
    settings = Settings.from_env(os.environ)
    paths = CertificatePaths.in_dir(args.certs_dir)
    options = gunicorn_options(args.bind, str(paths.cert), str(paths.key), settings.workers, settings.threads,
                               settings.keepalive_seconds, "warning")
    GunicornServer(create_floor_app if args.kind == "flask" else (lambda: bare_floor), options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
