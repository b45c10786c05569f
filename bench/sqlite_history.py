"""The SQLite usage history (the default source, no Prometheus) read at scale: what one reconcile
pass reads from it, in time and memory.

    python -m bench.sqlite_history [--containers 2000] [--nodes 100] [--days 15] [--interval 300]

The file holds ``--days`` of samples every ``--interval`` seconds for each container and node
(written in SQL, so the Python process stays small while it is built). One pass then reads the
container statistics over ``OVERSALE_COMPRESSION_WINDOW``'s default (two weeks), the node
statistics over ``OVERSALE_HISTORY_WINDOW``'s (one), each at most ``--days``, and the nodes' hot
time, as the reconcilers do, in this process;
the peak resident memory it reaches is what the reconciler Pod's memory limit must hold. The floor
is the bare minimum of the same read: SQLite walking the rows into Python, nothing kept.
"""

from __future__ import annotations

import argparse
import resource
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from kube.cli import Parser
from oversale.settings import Settings
from reconcilers.sqlite_history import SqliteHistory


def build(path: Path, containers: int, nodes: int, days: float, interval: int, now: int) -> int:
    """Fill the history file; returns the number of samples."""
    history = SqliteHistory(path, retention_seconds=days * 86400 + interval)
    history.close()
    steps = int(days * 86400 // interval)
    db = sqlite3.connect(str(path))
    with db:
        db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                   "INSERT INTO series (id, kind, namespace, pod, container) "
                   "SELECT i, 'container', 'ns-' || (i % 20), 'pod-' || i, 'app' FROM n", (containers,))
        db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                   "INSERT INTO series (id, kind, namespace, pod, container) "
                   "SELECT ? + i, 'node', '', 'node-' || i, '' FROM n", (nodes, containers))
        # Usage that moves with time and series, so quantiles are real work.
        db.execute("WITH RECURSIVE k(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM k WHERE j < ? - 1) "
                   "INSERT INTO samples SELECT s.id, ? - (? - k.j) * ?, 50 + (s.id * 7 + k.j * 13) % 400, "
                   "(100 + (s.id * 11 + k.j * 3) % 200) * 1048576 FROM series s, k",
                   (steps, now, steps, interval))
    count = int(db.execute("SELECT count(*) FROM samples").fetchone()[0])
    db.close()
    return count


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m bench.sqlite_history", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containers", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--days", type=float, default=Settings().history_retention_seconds / 86400,
                        help="history held (OVERSALE_HISTORY_RETENTION's default)")
    parser.add_argument("--interval", type=int, default=300, help="seconds between samples (OVERSALE_SAMPLE_INTERVAL)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    now = int(time.time())
    window = args.days * 86400
    defaults = Settings()
    container_window = min(window, defaults.compression_window_seconds)
    node_window = min(window, defaults.history_window_seconds)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "history.db"
        started = time.monotonic()
        samples = build(path, args.containers, args.nodes, args.days, args.interval, now)
        print(f"history: {args.containers:,} containers and {args.nodes:,} nodes, {samples:,} samples, "
              f"{path.stat().st_size / 1e6:.0f} MB on disk (built in {time.monotonic() - started:.0f} s)")
        print(f"resident memory before reading: {peak_mb():.0f} MB")

        floors = []
        for _ in range(args.runs):
            started = time.monotonic()
            db = sqlite3.connect(str(path))
            for _row in db.execute("SELECT series, ts, cpu, memory FROM samples WHERE ts >= ? ORDER BY series, ts",
                                   (int(now - window),)):
                pass
            db.close()
            floors.append(time.monotonic() - started)
        print(f"floor (walk every row, keep nothing): median {statistics.median(floors):.2f} s "
              f"(runs {', '.join(f'{t:.2f}' for t in floors)}); peak resident {peak_mb():.0f} MB")

        history = SqliteHistory(path, retention_seconds=window + args.interval)
        real = {f"node-{i}": {"cpu": 300.0, "memory": 250.0 * 2**20} for i in range(1, args.nodes + 1)}
        passes = []
        for _ in range(args.runs):
            started = time.monotonic()
            containers = history.container_stats(container_window, 0.99)
            nodes = history.node_stats(node_window, 0.99)
            history.node_hot_time([86400, 7 * 86400], real)
            passes.append(time.monotonic() - started)
        history.close()
        assert len(containers) == args.containers and len(nodes) == args.nodes
        print(f"one pass (container stats, node stats, node hot time): median {statistics.median(passes):.2f} s "
              f"(runs {', '.join(f'{t:.2f}' for t in passes)}); peak resident {peak_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
