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

from kube.cli import CliError, Parser, add_debug_flag, bind_address, check_api_server, run_cli, settings_or_exit
from kube.tls import CertificatePaths, ca_problem, serving_pair_problem


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

    if args.client_ca and not args.certs_dir:
        parser.error("--client-ca needs --certs-dir (mutual TLS is TLS first)")
    if args.client_ca and not args.client_ca.is_file():
        parser.error(f"--client-ca {args.client_ca}: no such file")
    if args.client_ca and (problem := ca_problem(args.client_ca.read_bytes())):
        parser.error(f"--client-ca {args.client_ca}: {problem}")
    if args.certs_dir:
        paths = CertificatePaths.in_dir(args.certs_dir)
        if not paths.exist():
            parser.error(f"--certs-dir {args.certs_dir}: no tls.crt and tls.key (python -m certs generate writes "
                         "them)")
        if problem := serving_pair_problem(paths):
            parser.error(f"--certs-dir {args.certs_dir}: {problem}")

    from kube.client import load_api_client
    from kube.server import GunicornServer, gunicorn_options

    api_client = load_api_client(settings.kubernetes)
    if api_client is None:
        raise CliError("no in-cluster config and no kubeconfig: the extender needs an API server "
                       "(set KUBECONFIG or run inside the cluster)")
    # Checked here, in the master: a worker that fails to boot says only "Worker failed to boot".
    logging.getLogger("scheduler").info("using the cluster at %s", check_api_server(api_client))

    def build() -> object:
        from kube.leader import LeaseElector
        from kube.probes import serve_probes
        from scheduler.app import ExtenderMetrics, create_app
        from scheduler.kube import (
            ClusterWatch,
            HistoryPeakPoller,
            KubeBinder,
            Leadership,
            UsagePoller,
            WorkloadHistoryPoller,
        )
        from scheduler.state import ClusterState

        api_client = load_api_client(settings.kubernetes)
        state = ClusterState(settings.keys, load_config=settings.load)
        watch = ClusterWatch(api_client, state, settings.watch_timeout_seconds)
        watch.start()
        served = {"serving": paths.cert, "ca": paths.ca} if args.certs_dir else {}
        metrics = ExtenderMetrics({**served, **({"client-ca": args.client_ca} if args.client_ca else {})})
        metrics.client_auth.set(1 if args.client_ca else 0)
        if settings.load_aware:
            UsagePoller(api_client, state, settings.metrics_poll_interval_seconds, metrics.record_poll).start()
            if settings.load_history == "prometheus":
                from kube.prometheus import PrometheusAccess, PrometheusAPI

                prometheus = PrometheusAPI(settings.prometheus_url, settings.prometheus_timeout_seconds,
                                           PrometheusAccess.from_settings(settings))
                logging.getLogger("scheduler").info("load and workload history also from %s", prometheus.described)
                HistoryPeakPoller(prometheus, state, settings.load_history_interval_seconds,
                                  settings.prometheus_node_label, settings.prometheus_rate_window_seconds,
                                  settings.prometheus_step_seconds,
                                  lambda result: metrics.history_polls.labels(result).inc(),
                                  settings.prometheus_node_cpu_query or None).start()
                WorkloadHistoryPoller(prometheus, state, settings.load_history_interval_seconds,
                                      settings.workload_history_window_seconds,
                                      settings.prometheus_rate_window_seconds, settings.prometheus_step_seconds,
                                      lambda result: metrics.workload_history_polls.labels(result).inc()).start()
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
            client = app.test_client()

            def route(path: str) -> Callable[[], tuple[int, bytes, str]]:
                def answer() -> tuple[int, bytes, str]:
                    response = client.get(path)
                    return response.status_code, response.get_data(), str(response.content_type)
                return answer

            host = args.bind.rpartition(":")[0] or "0.0.0.0"
            serve_probes(host, settings.extender_probe_port, {p: route(p) for p in ("/healthz", "/readyz", "/metrics")})
        return app

    options = gunicorn_options(args.bind, "", "", 1, settings.threads, settings.keepalive_seconds, settings.log_level,
                               str(args.client_ca) if args.client_ca else "")
    if args.certs_dir:  # `paths` was checked above
        options.update(certfile=str(paths.cert), keyfile=str(paths.key))
    else:
        options.pop("certfile")
        options.pop("keyfile")
    if not args.client_ca:
        logging.getLogger("scheduler").warning(
            "no --client-ca: any client that reaches %s can call bind (development only; deploy/ uses mutual TLS)",
            args.bind)
    GunicornServer(build, options).run()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
