"""Certificates for the webhooks.

  python -m certs generate --dir DIR --service NAME --namespace NS [--host H ...] [--days N] [--force]
  python -m certs ensure --secret NS/NAME --service NAME [--host H ...] [--days N] [--renew-fraction F]
                        [--restart NS/DEPLOYMENT ...]
  python -m certs inject --webhook NAME [--webhook NAME ...] (--secret NS/NAME | --ca-file PATH)
  python -m certs restart-on-change --secret NS/NAME [--secret ...] --restart NS/DEPLOYMENT [...]

``ensure``, ``inject`` and ``restart-on-change`` use the in-cluster config, else the kubeconfig.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kube.cli import CliError, Parser, add_debug_flag, required_api_client, run_cli, settings_or_exit
from kube.tls import (
    CA_DAYS,
    RENEW_FRACTION,
    SERVING_DAYS,
    CertificatePaths,
    ca_problem,
    check_hosts,
    generate,
    service_hosts,
)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "days", 1) < 1:
        parser.error("--days must be at least 1")
    # Each command checks its arguments before it reaches the cluster, so a typo is named as a typo.
    command: Callable[[argparse.ArgumentParser, argparse.Namespace], int] = args.run
    return command(parser, args)


def _parser() -> Parser:
    parser = Parser(
        prog="python -m certs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="write ca.crt, tls.crt and tls.key to a directory")
    gen.set_defaults(run=_generate)
    gen.add_argument("--dir", required=True, type=Path, help="where to write the files")
    _names(gen)
    gen.add_argument("--namespace", default="default", help="Service namespace (default: default)")
    gen.add_argument("--ca-days", type=int, default=CA_DAYS, help=f"CA lifetime in days (default {CA_DAYS})")
    gen.add_argument("--force", action="store_true",
                     help="replace a CA, certificate or key already in --dir (clients that trust the old CA stop "
                          "trusting the server)")

    ensure = commands.add_parser("ensure", help="create or renew a TLS Secret in the cluster")
    ensure.set_defaults(run=_ensure)
    ensure.add_argument("--secret", required=True, help="NAMESPACE/NAME of the serving Secret")
    _names(ensure)
    ensure.add_argument("--client", action="store_true",
                        help="a client certificate (kube-scheduler's, for the extender's mutual TLS) signed by "
                             "its own CA; its first --host is the common name")
    ensure.add_argument(
        "--renew-fraction",
        type=float,
        default=RENEW_FRACTION,
        help="renew when less than this fraction of the lifetime is left (default 1/3)",
    )
    ensure.add_argument("--restart", action="append", default=[], metavar="NAMESPACE/DEPLOYMENT",
                        help="roll this Deployment's Pods when the certificates it mounts from the Secret differ from "
                             "those its Pod template records (then record them): for a consumer that reads "
                             "the certificate only at start (kube-scheduler's extender tlsConfig); repeatable")

    inject = commands.add_parser("inject", help="set caBundle on webhook configurations")
    inject.set_defaults(run=_inject)
    inject.add_argument("--webhook", action="append", required=True, help="Mutating/ValidatingWebhookConfiguration")
    source = inject.add_mutually_exclusive_group(required=True)
    source.add_argument("--secret", help="NAMESPACE/NAME of a Secret with ca.crt")
    source.add_argument("--ca-file", type=Path, help="a PEM file")

    follow = commands.add_parser(
        "restart-on-change", help="roll Deployments that read these Secrets only at start when the "
        "certificates in them changed (for Secrets another tool renews, e.g. cert-manager)")
    follow.set_defaults(run=_restart_on_change)
    follow.add_argument("--secret", action="append", required=True, metavar="NAMESPACE/NAME",
                        help="a Secret the Deployment mounts (tls.crt and ca.crt count); repeatable")
    follow.add_argument("--restart", action="append", required=True, metavar="NAMESPACE/DEPLOYMENT",
                        help="the Deployment to roll when they changed; repeatable")

    add_debug_flag(parser)
    return parser


def _generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.ca_days < args.days:
        # A chain verifies only while every certificate in it is valid: the serving
        # certificate's extra days would be days of failed handshakes.
        parser.error(f"--days {args.days} outlives --ca-days {args.ca_days}: the certificate would stop "
                     "verifying when its CA expires")
    hosts = _hosts(parser, args, args.namespace)
    paths = CertificatePaths.in_dir(args.dir)
    existing = paths.present()
    if existing and not args.force:
        lost = ("its CA would be replaced and every client that trusts it would stop trusting the server"
                if existing[0] == paths.ca else "a certificate or key put there would be replaced")
        raise CliError(f"{existing[0]} exists: {lost}; pass --force to replace it, or choose another --dir")
    paths = generate(args.dir, hosts, days=args.days, ca_days=args.ca_days)
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key} for {', '.join(hosts)}")
    return 0


def _ensure(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if not 0 < args.renew_fraction < 1:
        parser.error("--renew-fraction must be between 0 and 1")
    namespace, name = _namespaced(parser, args.secret)
    hosts = _hosts(parser, args, namespace)
    restarts = [_namespaced(parser, text) for text in args.restart]
    keys = settings_or_exit(parser).keys if restarts else None

    from certs.cluster import ForeignSecret, ensure_secret

    api_client = required_api_client("auto", f"{args.command} needs")
    try:
        outcome = ensure_secret(api_client, namespace, name, hosts, args.days, args.renew_fraction, args.client)
    except ForeignSecret as error:
        raise CliError(str(error)) from None
    print(f"secret {namespace}/{name}: {outcome}")
    if keys is not None:
        # Compared with what each Deployment records, not with whether this run wrote the Secret:
        # a restart that failed (an API error, a run stopped between the write and the roll) is
        # done by the next run, which finds the Secret unchanged.
        _restart_changed(api_client, restarts, [(namespace, name)], keys.certificates_from(namespace, name))
    return 0


def _restart_on_change(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    secrets = [_namespaced(parser, text) for text in args.secret]
    restarts = [_namespaced(parser, text) for text in args.restart]
    keys = settings_or_exit(parser).keys

    api_client = required_api_client("auto", f"{args.command} needs")
    _restart_changed(api_client, restarts, secrets, keys.certificates)
    return 0


def _restart_changed(api_client: Any, restarts: list[tuple[str, str]], secrets: list[tuple[str, str]],
                     key: str) -> None:
    """Roll each Deployment whose record under ``key`` differs from the certificates it mounts
    from ``secrets``, read once and all there before anything restarts."""
    from certs.cluster import read_certificates, restart_on_change

    try:
        held = read_certificates(api_client, secrets)
    except LookupError as error:
        raise CliError(f"{error}; nothing was restarted") from None
    for deployment in restarts:
        try:
            print(restart_on_change(api_client, *deployment, held, key))
        except LookupError as error:
            raise CliError(f"{error}; deployment {'/'.join(deployment)} not restarted") from None


def _inject(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.secret:
        secret = _namespaced(parser, args.secret)
    else:
        ca = args.ca_file.read_bytes()
        _usable_ca(ca, args.ca_file)

    from certs.cluster import inject_ca_bundle, read_ca_from_secret

    api_client = required_api_client("auto", f"{args.command} needs")
    try:
        if args.secret:
            ca = read_ca_from_secret(api_client, *secret)
            _usable_ca(ca, args.secret)
        for line in inject_ca_bundle(api_client, args.webhook, ca):
            print(line)
    except LookupError as error:
        raise CliError(str(error)) from None
    return 0


def _usable_ca(ca: bytes, source: object) -> None:
    """A caBundle that verifies nothing would make every call to the webhooks fail: refused."""
    problem = ca_problem(ca)
    if problem:
        raise CliError(f"{source}: {problem}; no caBundle was changed")


def _names(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--service", help="Service name (adds its four in-cluster DNS names as SANs)")
    sub.add_argument("--host", action="append", default=[], help="extra SAN; an IP becomes an IP SAN")
    sub.add_argument(
        "--days", type=int, default=SERVING_DAYS, help=f"serving certificate lifetime (default {SERVING_DAYS})"
    )


def _hosts(parser: argparse.ArgumentParser, args: argparse.Namespace, namespace: str) -> list[str]:
    try:
        hosts = [*(service_hosts(args.service, namespace) if args.service else []), *args.host]
        if not hosts:
            parser.error("give --service and/or --host")
        check_hosts(hosts, getattr(args, "client", False))
    except ValueError as error:
        parser.error(str(error))
    return hosts


def _namespaced(parser: argparse.ArgumentParser, text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        parser.error(f"expected NAMESPACE/NAME, got {text!r}")
    return namespace, name


if __name__ == "__main__":
    sys.exit(run_cli(main))
