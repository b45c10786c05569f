"""The floor of the serving stack: reads the request body and returns a fixed ``allowed: true``
AdmissionReview, served exactly like the webhook (same gunicorn settings, TLS, workers, threads).

    python -m bench.floor --bind HOST:PORT --certs-dir DIR
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flask import Flask, Response, request

from certs.tls import CertificatePaths
from oversale.settings import Settings
from webhook.server import GunicornServer, gunicorn_options

ANSWER = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}'


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
    args = parser.parse_args()
    settings = Settings.from_env(os.environ)
    paths = CertificatePaths.in_dir(args.certs_dir)
    options = gunicorn_options(args.bind, str(paths.cert), str(paths.key), settings.workers, settings.threads,
                               settings.keepalive_seconds, "warning")
    GunicornServer(create_floor_app, options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
