"""One reconcile pass at scale: N workloads and M nodes against a real Prometheus holding their
history, and the API-server double of tests/ holding the objects.

    python -m bench.reconcile_scale [--workloads 10000] [--nodes 5000] [--hours 24] [--sample 600]
                                    [--memory-sizes 1] [--memory-step 8] [--node-cpus 0]
                                    [--recorded-node-cpu] [--concurrency 4[,2...]] [--rounds 1]
                                    [--per-query]

Prints how long the history takes to build, the pass time (dry run and with writes), the
number of PromQL queries, and the cpu time Prometheus and the bench's own process (the
reconciler, the API double) used in the pass, against the machine's cores: a pass whose cpu
time is its wall time times the cores waits on the machine, and no order of its queries makes it
shorter. ``--per-query`` also prints each query's time, slowest first. The passes
start once Prometheus has compacted the backfilled blocks, as a Prometheus that has held the
history for that long has them. Needs Debian's prometheus package (prometheus, promtool).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.proc import cpu_seconds
from kube.cli import Parser
from kube.prometheus import PrometheusAPI
from oversale.annotations import AnnotationKeys
from oversale.settings import Settings
from reconcilers.cluster import Cluster
from reconcilers.prometheus import PrometheusHistory
from reconcilers.runner import Reconciler
from tests.kube_api import FakeKubeAPI
from tests.prometheus_server import PrometheusServer

KEYS = AnnotationKeys()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


NODE_MODES = ("user", "system", "nice", "irq", "softirq", "idle", "iowait", "steal")
"""node-exporter's cpu modes (Linux): a node has one counter per cpu and mode."""


def write_history(path: Path, workloads: int, nodes: int, start: float, end: float, step: float,
                  node_cpus: int = 0, recorded: bool = False) -> int:
    """OpenMetrics for one Pod per workload and node-exporter series per node, written fast.

    ``node_cpus``: 0 writes one cpu counter per node (the floor of node-exporter's cost), N
    writes N cpus' counters in each of the 8 modes, as a node-exporter on a node of N cpus
    publishes them; ``recorded`` writes each node's cores as one recording rule's series
    (kube-prometheus's ``instance:node_cpu:rate:sum``) instead of its counters."""
    # Aligned to the subquery step: a gauge sampled this sparsely is only visible to the steps
    # within Prometheus's 5-minute lookback of a sample.
    start = math.ceil(start / step) * step
    times = [start + i * step for i in range(int((end - start) // step) + 1)]
    lines = 0
    with path.open("w") as out:
        out.write("# TYPE container_cpu_usage_seconds counter\n")
        for w in range(workloads):
            labels = f'container="app",namespace="ns{w % 50}",pod="w{w}-5d8f9-abcde"'
            base = 0.05 + (w % 20) / 100
            total = 0.0
            for t in times:
                total += (base + 0.02 * math.sin(t / 7200 + w)) * step
                out.write(f"container_cpu_usage_seconds_total{{{labels}}} {total:.3f} {int(t)}\n")
            lines += len(times)
        out.write("# TYPE container_memory_working_set_bytes gauge\n")
        for w in range(workloads):
            labels = f'container="app",namespace="ns{w % 50}",pod="w{w}-5d8f9-abcde"'
            value = (100 + w % 200) * 2**20
            out.write("".join(f"container_memory_working_set_bytes{{{labels}}} {value} {int(t)}\n" for t in times))
            lines += len(times)
        if recorded:
            out.write("# TYPE instance:node_cpu:rate:sum gauge\n")
            for n in range(nodes):
                labels = f'instance="node-{n}:9100",job="node-exporter"'
                out.write("".join(f"instance:node_cpu:rate:sum{{{labels}}} {2 + math.sin(t / 3600 + n):.4f} {int(t)}\n"
                                  for t in times))
                lines += len(times)
        else:
            out.write("# TYPE node_cpu_seconds counter\n")
            # The same cores in all as one counter gives (2 + sin), shared by the busy modes of
            # every cpu; the modes the usage leaves out (idle, iowait, steal) count too.
            busy_modes = NODE_MODES[:5]
            counters = ([("0", "user", 1.0)] if node_cpus == 0 else
                        [(str(c), mode, 1 / (node_cpus * len(busy_modes)) if mode in busy_modes else 0.0)
                         for c in range(node_cpus) for mode in NODE_MODES])
            for n in range(nodes):
                for cpu, mode, share in counters:
                    total = 0.0
                    labels = f'cpu="{cpu}",instance="node-{n}:9100",job="node-exporter",mode="{mode}"'
                    rows = []
                    for t in times:
                        total += ((2 + math.sin(t / 3600 + n)) * share if share else 0.25) * step
                        rows.append(f"node_cpu_seconds_total{{{labels}}} {total:.3f} {int(t)}\n")
                    out.write("".join(rows))
                    lines += len(times)
        for name, gauge in (("node_memory_MemTotal_bytes", 64e9), ("node_memory_MemAvailable_bytes", 40e9)):
            out.write(f"# TYPE {name} gauge\n")
            for n in range(nodes):
                out.write("".join(f'{name}{{instance="node-{n}:9100"}} {gauge:.0f} {int(t)}\n' for t in times))
                lines += len(times)
        out.write("# EOF\n")
    return lines


def populate(api: FakeKubeAPI, workloads: int, nodes: int, pods_per_node: int, memory_sizes: int = 1,
             memory_step: int = 8) -> None:
    """``memory_sizes``: the nodes' memory allocatable takes that many values, ``memory_step`` MiB
    apart (8: one instance type whose nodes' kernels and firmware keep different amounts)."""
    template = {"spec": {"containers": [{"name": "app", "image": "x",
                                         "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
    for w in range(workloads):
        api.put("deployments", {"metadata": {"name": f"w{w}", "namespace": f"ns{w % 50}",
                                             "annotations": {KEYS.enable_resource_compress: "y"}},
                                "spec": {"template": template}})
    for n in range(nodes):
        api.put("nodes", {"metadata": {"name": f"node-{n}", "labels": {KEYS.oversale_label: "enabled"}},
                          "status": {"allocatable": {"cpu": "15890m",
                                                     "memory": f"{60 * 1024 - memory_step * (n % memory_sizes)}Mi"},
                                     "capacity": {"cpu": "16", "memory": "64Gi"}}})
        for p in range(pods_per_node):
            requests = {"cpu": "3", "memory": "8Gi"}
            api.put("pods", {"metadata": {"name": f"p{n}-{p}", "namespace": "load"},
                             "spec": {"nodeName": f"node-{n}", "containers": [
                                 {"name": "c", "image": "x", "resources": {"requests": requests}}]},
                             "status": {"phase": "Running"}})


def time_each_query(api: PrometheusAPI) -> list[tuple[float, str]]:
    """Each query ``api`` answers from now on, with its wall time (the bench's own instrument: the
    pass's two readers query at once, so a query's time includes its share of Prometheus's cores)."""
    timings: list[tuple[float, str]] = []

    def timed(ask: Callable[..., Any]) -> Callable[..., Any]:
        def asking(query: str, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return ask(query, *args, **kwargs)
            finally:
                timings.append((time.perf_counter() - started, query))
        return asking

    def timed_parts(ask: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        # From the first request to the last part read, the reader's work on each part included.
        def asking(query: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
            started = time.perf_counter()
            try:
                yield from ask(query, *args, **kwargs)
            finally:
                timings.append((time.perf_counter() - started, query))
        return asking

    api.instant = timed(api.instant)  # type: ignore[method-assign]
    # Every range query goes through range_parts (query_range joins its parts).
    api.range_parts = timed_parts(api.range_parts)  # type: ignore[method-assign]
    return timings


def concurrencies(text: str) -> list[int]:
    """``--concurrency``: one count or several, comma-separated, each at least 1."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: whole numbers, comma-separated (4, or 2,4)") from None
    if min(values) < 1:  # "".split(",") is [""], refused above: never empty here
        raise argparse.ArgumentTypeError(f"{text!r}: each at least 1")
    return values


def _parser() -> Parser:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=4)
    parser.add_argument("--hours", type=float, default=26.0, help="history length (default 26)")
    parser.add_argument("--sample", type=float, default=600.0, help="seconds between samples (default 600)")
    parser.add_argument("--memory-sizes", type=int, default=1,
                        help="distinct memory allocatable values among the nodes (default 1)")
    parser.add_argument("--memory-step", type=int, default=8, help="MiB between those values (default 8)")
    parser.add_argument("--node-cpus", type=int, default=0,
                        help="cpus per node, each with node-exporter's 8 modes' counters (default 0: one counter "
                             "per node, the floor)")
    parser.add_argument("--recorded-node-cpu", action="store_true",
                        help="each node's cpu as a recording rule's one series (instance:node_cpu:rate:sum), read "
                             "with OVERSALE_PROMETHEUS_NODE_CPU_QUERY, instead of its counters")
    parser.add_argument("--concurrency", type=concurrencies, default=[Settings.prometheus_concurrency],
                        help="queries in flight at once (OVERSALE_PROMETHEUS_CONCURRENCY; default "
                             f"{Settings.prometheus_concurrency}); several, comma-separated, time a dry run at each "
                             "in turn on the same history, the pass with writes at the first")
    parser.add_argument("--rounds", type=int, default=1,
                        help="dry runs at each --concurrency, taken in turn (default 1)")
    parser.add_argument("--per-query", action="store_true",
                        help="also print each query's time, slowest first (and write them with --json)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser


def _serve_history(args: argparse.Namespace, work: Path) -> tuple[PrometheusServer, int, tuple[int, int]]:
    """Write the history, backfill it with promtool and serve it once compacted: (the server, the
    samples written, the blocks before and after compaction)."""
    end = time.time() - 300
    log(f"writing {args.hours:g} h of history for {args.workloads} workloads and {args.nodes} nodes")
    started = time.perf_counter()
    samples = write_history(work / "history.om", args.workloads, args.nodes, end - args.hours * 3600, end,
                            args.sample, args.node_cpus, args.recorded_node_cpu)
    log(f"{samples:,} samples written in {time.perf_counter() - started:.0f}s; building TSDB blocks with promtool")
    started = time.perf_counter()
    prometheus = PrometheusServer(work, work / "history.om")
    (work / "history.om").unlink()
    log(f"prometheus ready in {time.perf_counter() - started:.0f}s; waiting for it to compact promtool's blocks")
    started = time.perf_counter()
    blocks = prometheus.wait_for_compaction()
    log(f"{blocks[0]} blocks compacted to {blocks[1]} in {time.perf_counter() - started:.0f}s")
    return prometheus, samples, blocks


def _settings(args: argparse.Namespace, prometheus_url: str) -> Settings:
    # Samples are args.sample apart: rate() needs a window holding several of them.
    return dataclasses.replace(
        Settings(kubernetes="off"), prometheus_url=prometheus_url, prometheus_step_seconds=args.sample,
        prometheus_rate_window_seconds=4 * args.sample, prometheus_timeout_seconds=120, min_samples=10,
        full_confidence_seconds=86400.0,
        prometheus_node_cpu_query="instance:node_cpu:rate:sum" if args.recorded_node_cpu else "")


def _timed_pass(reconciler: Reconciler, history: PrometheusHistory, prometheus_pid: int, label: str, dry_run: bool,
                concurrency: int, kept: bool) -> dict[str, Any]:
    """One pass, with its wall time, queries and the cpu time Prometheus and this process used."""
    queries, waited = history.queries, history.query_seconds
    log(f"pass ({label.replace('_', ' ')}, {concurrency} queries at once, the account's hours "
        f"{'kept from the pass before' if kept else 'counted whole'})")
    cpu_before = cpu_seconds(prometheus_pid), cpu_seconds(os.getpid())
    started = time.perf_counter()
    rows = reconciler.run_pass(dry_run=dry_run)
    elapsed = time.perf_counter() - started
    prometheus_cpu = cpu_seconds(prometheus_pid) - cpu_before[0]
    bench_cpu = cpu_seconds(os.getpid()) - cpu_before[1]
    queries, waited = history.queries - queries, history.query_seconds - waited
    measured = {
        "concurrency": concurrency, "account_hours_kept": kept, "seconds": round(elapsed, 1),
        # The node quantiles' samples kept after the pass, 16 bytes each (step and value).
        "quantile_samples_kept": history.quantile_samples_kept,
        "queries": queries,
        "prometheus_seconds": round(waited, 1), "rows": len(rows), "written": sum(r.written for r in rows),
        "prometheus_cpu_seconds": round(prometheus_cpu, 1), "bench_cpu_seconds": round(bench_cpu, 1),
        # The cores the pass kept busy on average: at the machine's count it waits on cpu,
        # below it on something else (a query alone on one core, the API double).
        "cores_busy": round((prometheus_cpu + bench_cpu) / elapsed, 2)}
    log(f"{label}: {elapsed:.1f}s, {queries} PromQL queries ({waited:.1f}s waited), {len(rows)} rows, "
        f"{measured['written']} ratios written; cpu {prometheus_cpu:.1f}s Prometheus + "
        f"{bench_cpu:.1f}s bench = {measured['cores_busy']:.2f} of {os.cpu_count()} cores busy; "
        f"{measured['quantile_samples_kept']:,} node quantile samples kept")
    return measured


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: at least 1")

    prometheus, samples, blocks = _serve_history(args, Path(tempfile.mkdtemp(prefix="oversale-bench-")))
    log("loading the API double")
    api = FakeKubeAPI().start()
    try:
        populate(api, args.workloads, args.nodes, args.pods_per_node, args.memory_sizes, args.memory_step)
        api_client = client.ApiClient(client.Configuration(host=api.url))
        settings = _settings(args, prometheus.url)
        figures = {"workloads": args.workloads, "nodes": args.nodes, "pods": args.nodes * args.pods_per_node,
                   "memory_sizes": args.memory_sizes,
                   "memory_step_mib": args.memory_step, "node_cpus": args.node_cpus,
                   "recorded_node_cpu": args.recorded_node_cpu, "concurrency": args.concurrency[0],
                   "history_samples": samples, "machine_cores": os.cpu_count(),
                   "tsdb_blocks": blocks[1]}
        passes = [("dry_run", True, concurrency) for _ in range(args.rounds) for concurrency in args.concurrency]
        passes.append(("with_writes", False, args.concurrency[0]))
        # One history per concurrency, kept from pass to pass as the reconcilers keep theirs: the
        # first pass at each counts the account's week whole, the next ones its newest hours alone.
        histories: dict[int, tuple[PrometheusHistory, list[tuple[float, str]]]] = {}
        for number, (label, dry_run, concurrency) in enumerate(passes):
            kept = concurrency in histories
            if not kept:
                history = PrometheusHistory.from_settings(dataclasses.replace(settings,
                                                                              prometheus_concurrency=concurrency))
                history.check_rate_window()  # once per process, not part of a pass
                histories[concurrency] = history, time_each_query(history.api) if args.per_query else []
            history, every_query = histories[concurrency]
            timed_before = len(every_query)
            reconciler = Reconciler(Cluster(api_client, timeout=300), history, settings)
            measured = _timed_pass(reconciler, history, prometheus.process.pid, label, dry_run, concurrency, kept)
            if args.per_query:
                slowest_first = sorted(every_query[timed_before:], reverse=True)
                measured["per_query"] = [[round(seconds, 2), query] for seconds, query in slowest_first]
                for seconds, query in slowest_first:
                    log(f"  {seconds:6.1f}s  {query[:150]}")
            if number == 0 or not dry_run:
                figures |= {f"{label}_{key}": value for key, value in measured.items() if key != "concurrency"}
            if dry_run and len(passes) > 2:
                figures.setdefault("dry_runs", []).append(measured)
    finally:
        api.stop()
        prometheus.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
