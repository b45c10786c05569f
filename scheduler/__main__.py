"""``python -m scheduler --bind HOST:PORT [--certs-dir DIR]``: serve the scheduler extender.

One worker process (the CPU allocation state lives in it; several processes could hand out the
same CPU), several threads. Several replicas run active/standby: only the holder of the Lease
OVERSALE_EXTENDER_LEASE_NAME binds, and in a Pod (POD_NAME set) it labels its Pod
stke.platform/extender-leader=true, which the Service selects. HTTPS when --certs-dir is given
(``enableHTTPS`` in the scheduler's extender config), plain HTTP otherwise.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kube.cli import (
    Parser,
    add_debug_flag,
    bind_address,
    check_api_server,
    required_api_client,
    run_cli,
    settings_or_exit,
)
from kube.tls import CertificatePaths, ca_problem, serving_pair_problem

if TYPE_CHECKING:  # imported where used: `--help` and a bad setting answer before the kubernetes client loads
    from flask import Flask

    from oversale.settings import Settings
    from scheduler.app import ExtenderMetrics
    from scheduler.state import ClusterState

log = logging.getLogger("scheduler")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m scheduler", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bind", default="0.0.0.0:8444", type=bind_address, help="HOST:PORT (default 0.0.0.0:8444)")
    parser.add_argument("--certs-dir", type=Path, help="serve HTTPS with tls.crt/tls.key from here")
    parser.add_argument("--client-ca", type=Path,
                        help="accept only clients with a certificate signed by this CA (kube-scheduler's); "
                             "without it anyone who reaches the port can drive bind")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    settings = settings_or_exit(parser)
    paths = _checked_certificates(parser, args)

    from kube.server import GunicornServer, gunicorn_options

    api_client = required_api_client(settings.kubernetes, "the extender needs")
    # Checked here, in the master: a worker that fails to boot says only "Worker failed to boot".
    log.info("using the cluster at %s", check_api_server(api_client))

    options = gunicorn_options(args.bind, "", "", 1, settings.threads, settings.keepalive_seconds, settings.log_level,
                               str(args.client_ca) if args.client_ca else "")
    if paths:
        options.update(certfile=str(paths.cert), keyfile=str(paths.key))
    else:
        options.pop("certfile")
        options.pop("keyfile")
    if not args.client_ca:
        log.warning("no --client-ca: any client that reaches %s can call bind (development only; deploy/ uses "
                    "mutual TLS)", args.bind)
    GunicornServer(lambda: _build_extender(settings, args, paths), options).run()
    return 0


def _checked_certificates(parser: argparse.ArgumentParser, args: argparse.Namespace) -> CertificatePaths | None:
    """The serving pair of ``--certs-dir`` (None: plain HTTP), once it and ``--client-ca`` are
    known to be usable: a bad file is named at start, not by a TLS handshake that fails later."""
    if args.client_ca and not args.certs_dir:
        parser.error("--client-ca needs --certs-dir (mutual TLS is TLS first)")
    if args.client_ca and not args.client_ca.is_file():
        parser.error(f"--client-ca {args.client_ca}: no such file")
    if args.client_ca and (problem := ca_problem(args.client_ca.read_bytes())):
        parser.error(f"--client-ca {args.client_ca}: {problem}")
    if not args.certs_dir:
        return None
    paths = CertificatePaths.in_dir(args.certs_dir)
    if not paths.exist():
        parser.error(f"--certs-dir {args.certs_dir}: no tls.crt and tls.key (python -m certs generate writes them)")
    if problem := serving_pair_problem(paths):
        parser.error(f"--certs-dir {args.certs_dir}: {problem}")
    return paths


def _build_extender(settings: Settings, args: argparse.Namespace, paths: CertificatePaths | None) -> object:
    """The extender's app, built in the gunicorn worker: its watch, pollers and Lease start there,
    in the one process whose CPU allocation state they feed."""
    from kube.client import load_api_client
    from kube.leader import LeaseElector
    from scheduler.app import ExtenderMetrics, create_app
    from scheduler.kube import ClusterWatch, KubeBinder, Leadership, UsagePoller
    from scheduler.state import ClusterState

    api_client = load_api_client(settings.kubernetes)
    state = ClusterState(settings.keys, load_config=settings.load)
    served = {"serving": paths.cert, "ca": paths.ca} if paths else {}
    metrics = ExtenderMetrics({**served, **({"client-ca": args.client_ca} if args.client_ca else {})})
    watch = ClusterWatch(api_client, state, settings.watch_timeout_seconds, on_restart=metrics.cache_restarts)
    watch.start()
    metrics.client_auth.set(1 if args.client_ca else 0)
    if settings.load_aware:
        UsagePoller(api_client, state, settings.metrics_poll_interval_seconds, metrics.record_poll).start()
        if settings.load_history == "prometheus":
            _start_history_pollers(settings, state, metrics)
    elector = LeaseElector(api_client, settings.namespace, settings.extender_lease_name,
                           f"{socket.gethostname()}-{os.getpid()}", settings.extender_lease_duration_seconds)
    binder = KubeBinder(api_client, watch)

    def label(leading: bool) -> None:
        leader = settings.keys.extender_leader
        binder.label(settings.namespace, settings.pod_name, {leader: "true" if leading else None})

    leadership = Leadership(elector, watch, label=label if settings.pod_name else None)
    leadership.start()
    # A graceful stop (a rollout's SIGTERM) hands the Lease over at once: the standby takes it
    # at its next round instead of a Lease duration later, while kube-scheduler's calls fail.
    atexit.register(leadership.stop)
    app = create_app(settings, state, binder, ready=lambda: watch.synced,
                     metrics=metrics, serving=leadership.leading)
    if args.client_ca and settings.extender_probe_port:
        _serve_probes_without_client_certificates(app, args.bind, settings.extender_probe_port)
    return app


def _start_history_pollers(settings: Settings, state: ClusterState, metrics: ExtenderMetrics) -> None:
    """Node peaks and workload history from the reconcilers' Prometheus, for longer windows than
    the metrics API's polls hold."""
    from kube.prometheus import PrometheusAccess, PrometheusAPI
    from scheduler.kube import HistoryPeakPoller, WorkloadHistoryPoller

    prometheus = PrometheusAPI(settings.prometheus_url, settings.prometheus_timeout_seconds,
                               PrometheusAccess.from_settings(settings))
    log.info("load and workload history also from %s", prometheus.described)
    HistoryPeakPoller(prometheus, state, settings.load_history_interval_seconds,
                      settings.prometheus_node_label, settings.prometheus_rate_window_seconds,
                      settings.prometheus_step_seconds,
                      lambda result: metrics.history_polls.labels(result).inc(),
                      settings.prometheus_node_cpu_query or None).start()
    WorkloadHistoryPoller(prometheus, state, settings.load_history_interval_seconds,
                          settings.workload_history_window_seconds,
                          settings.prometheus_rate_window_seconds, settings.prometheus_step_seconds,
                          lambda result: metrics.workload_history_polls.labels(result).inc()).start()


def _serve_probes_without_client_certificates(app: Flask, bind: str, port: int) -> None:
    """/healthz, /readyz and /metrics on a plain port of their own: with mutual TLS on the main
    port, the kubelet's probes and a scraper (which hold no client certificate) could not reach them."""
    from kube.probes import serve_probes

    client = app.test_client()

    def route(path: str) -> Callable[[], tuple[int, bytes, str]]:
        def answer() -> tuple[int, bytes, str]:
            response = client.get(path)
            return response.status_code, response.get_data(), str(response.content_type)
        return answer

    serve_probes(bind.rpartition(":")[0], port, {p: route(p) for p in ("/healthz", "/readyz", "/metrics")})


if __name__ == "__main__":
    sys.exit(run_cli(main))
