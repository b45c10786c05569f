"""``python -m webhook --bind HOST:PORT --certs-dir DIR``: serve the admission webhooks over HTTPS.

Settings come from the environment (see docs/settings.md). When DIR holds none of ca.crt, tls.crt
and tls.key, a CA and a serving certificate for localhost/127.0.0.1 are created there, so the
webhook runs on a laptop with no cluster; clients verify against DIR/ca.crt. Part of a set is
refused, not written over.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
from pathlib import Path

from kube.cli import CliError, Parser, add_debug_flag, bind_address, run_cli, settings_or_exit
from kube.tls import LOCAL_HOSTS, CertificatePaths, generate, serving_pair_problem
from oversale.settings import Settings

log = logging.getLogger("webhook")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m webhook", description=__doc__)
    parser.add_argument("--bind", default="0.0.0.0:8443", type=bind_address,
                        help="HOST:PORT to listen on (default 0.0.0.0:8443)")
    parser.add_argument("--certs-dir", type=Path, required=True, help="directory with ca.crt, tls.crt, tls.key")
    parser.add_argument("--workers", type=int, help="worker processes (default OVERSALE_WORKERS or 2)")
    parser.add_argument("--threads", type=int, help="threads per worker (default OVERSALE_THREADS or 4)")
    parser.add_argument(
        "--metrics-dir",
        type=Path,
        help="prometheus multiprocess directory (default PROMETHEUS_MULTIPROC_DIR or a fresh temporary one)",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    settings = settings_or_exit(parser)
    for flag in ("workers", "threads"):
        value = getattr(args, flag)
        if value is not None:
            if value < 1:
                parser.error(f"--{flag} must be at least 1")
            settings = dataclasses.replace(settings, **{flag: value})

    paths = CertificatePaths.in_dir(args.certs_dir)
    if not paths.exist():
        if partial := paths.partial():
            parser.error(f"--certs-dir {args.certs_dir}: {partial}; give it tls.crt and tls.key (python -m certs "
                         "generate writes a set), or a directory with none of the three, where a set is made")
        generate(args.certs_dir, LOCAL_HOSTS)
        log.info("no certificate in %s: created a CA and a certificate for %s (verify with %s)",
                 args.certs_dir, ", ".join(LOCAL_HOSTS), paths.ca)
    problem = serving_pair_problem(paths)
    if problem:
        parser.error(f"--certs-dir {args.certs_dir}: {problem}")

    _prepare_metrics_dir(args.metrics_dir)
    settings = _resolve_cluster(settings)

    # Imported only now: prometheus_client picks its multiprocess mode when first imported.
    from kube.server import GunicornServer, gunicorn_options
    from webhook.app import create_app

    options = gunicorn_options(
        args.bind, str(paths.cert), str(paths.key), settings.workers, settings.threads,
        settings.keepalive_seconds, settings.log_level,
    )
    log.info("serving on https://%s with %d workers x %d threads", args.bind, settings.workers, settings.threads)
    served = {"serving": paths.cert, "ca": paths.ca}
    GunicornServer(lambda: create_app(settings, certificates=served), options).run()
    return 0


def _prepare_metrics_dir(requested: Path | None) -> None:
    directory = requested or (Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]) if os.environ.get("PROMETHEUS_MULTIPROC_DIR")
                              else Path(tempfile.mkdtemp(prefix="oversale-metrics-")))
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()  # samples of a previous run's workers would be added to ours
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)


def _resolve_cluster(settings: Settings) -> Settings:
    """Decide once, in the master, whether there is a cluster, so the fact is logged once; a
    cluster that is configured but unreachable stops the start with one line."""
    if settings.kubernetes == "off":
        log.info("no cluster (OVERSALE_KUBERNETES=off): serving with Pod annotations only")
        return settings
    from kube.cli import check_api_server
    from kube.client import load_api_client, one_line

    api_client = load_api_client(settings.kubernetes)
    if api_client is None:
        log.info("no cluster (no in-cluster config and no kubeconfig): serving with Pod annotations only")
        return dataclasses.replace(settings, kubernetes="off")
    try:
        log.info("using the cluster at %s for owner annotations, LimitRanges and quotas", check_api_server(api_client))
    except Exception as error:  # noqa: BLE001  -- told as one line, below
        raise CliError(f"the cluster in the kubeconfig cannot be used ({one_line(error)}); fix KUBECONFIG, "
                       "or serve without a cluster: OVERSALE_KUBERNETES=off") from None
    return settings


if __name__ == "__main__":
    sys.exit(run_cli(main))
