"""``python -m certs generate --dir DIR --service NAME --namespace NS [--host H ...] [--days N]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from certs.tls import generate, service_hosts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m certs", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="write ca.crt, tls.crt and tls.key for a Service")
    gen.add_argument("--dir", required=True, type=Path, help="where to write the files")
    gen.add_argument("--service", help="Service name (adds its four in-cluster DNS names as SANs)")
    gen.add_argument("--namespace", default="default", help="Service namespace (default: default)")
    gen.add_argument("--host", action="append", default=[], help="extra SAN; an IP becomes an IP SAN")
    gen.add_argument("--days", type=int, default=365, help="serving certificate lifetime (default 365)")
    args = parser.parse_args(argv)
    hosts = [*(service_hosts(args.service, args.namespace) if args.service else []), *args.host]
    if not hosts:
        parser.error("give --service and/or --host")
    if args.days < 1:
        parser.error("--days must be at least 1")
    paths = generate(args.dir, hosts, days=args.days)
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key} for {', '.join(hosts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
