"""The extender's read of workload history (``OVERSALE_LOAD_HISTORY=prometheus``) at scale: N
Deployments, each rolled out once in the window (so two Pods, one after the other), against a
real Prometheus holding what cAdvisor and kube-state-metrics published.

    python -m bench.workload_history [--workloads 5000] [--hours 24] [--sample 300] [--repeats 5]

Prints the median time of one read (``WorkloadHistoryPoller.poll_once``: five instant queries, then
the Pods tied to their workloads on the poller's thread) and its range over the repeats, once
Prometheus has compacted the backfilled blocks. Needs Debian's prometheus package (prometheus,
promtool).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kube.cli import Parser
from kube.prometheus import PrometheusAPI
from oversale.annotations import AnnotationKeys
from oversale.usage import LoadConfig
from scheduler.kube import WorkloadHistoryPoller
from scheduler.state import ClusterState
from tests.prometheus_server import PrometheusServer


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def container_labels(workload: int, replica_set: str) -> str:
    pod = f"w{workload}-{replica_set}-x"
    return f'container="app",id="/kubepods/{pod}/app",namespace="ns{workload % 50}",pod="{pod}"'


def write_history(path: Path, workloads: int, start: float, end: float, step: float) -> int:
    """OpenMetrics of each workload's two Pods (ReplicaSets ``<hash>`` before the rollout halfway,
    ``<hash2>`` after), their owners and their ReplicaSets' owner, written fast."""
    start = math.ceil(start / step) * step
    times = [start + i * step for i in range(int((end - start) // step) + 1)]
    halves = (times[: len(times) // 2], times[len(times) // 2:])
    pods = [(w, replica_set, half) for w in range(workloads) for replica_set, half in zip(("5d8f9", "7c9b4"), halves,
                                                                                      strict=True)]
    lines = 0
    with path.open("w") as out:
        out.write("# TYPE container_cpu_usage_seconds counter\n")
        for w, replica_set, half in pods:
            labels = container_labels(w, replica_set)
            total = 0.0
            for t in half:
                total += (0.05 + (w % 20) / 100 + 0.02 * math.sin(t / 7200 + w)) * step
                out.write(f"container_cpu_usage_seconds_total{{{labels}}} {total:.3f} {int(t)}\n")
            lines += len(half)
        out.write("# TYPE container_memory_working_set_bytes gauge\n")
        for w, replica_set, half in pods:
            labels = container_labels(w, replica_set)
            value = (100 + w % 200) * 2**20
            out.write("".join(f"container_memory_working_set_bytes{{{labels}}} {value} {int(t)}\n" for t in half))
            lines += len(half)
        # kube-state-metrics: each Pod's ReplicaSet while the Pod lives, each ReplicaSet's Deployment.
        owned = {"kube_pod_owner": [(f'owner_kind="ReplicaSet",owner_name="w{w}-{rs}",pod="w{w}-{rs}-x"', w, half)
                                    for w, rs, half in pods],
                 "kube_replicaset_owner": [(f'owner_kind="Deployment",owner_name="w{w}",replicaset="w{w}-{rs}"', w,
                                            times) for w, rs, _ in pods]}
        for metric, series in owned.items():
            out.write(f"# TYPE {metric} gauge\n")
            for owner, w, alive in series:
                labels = f'namespace="ns{w % 50}",owner_is_controller="true",{owner}'
                out.write("".join(f"{metric}{{{labels}}} 1 {int(t)}\n" for t in alive))
                lines += len(alive)
        out.write("# EOF\n")
    return lines


def main() -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=5000)
    parser.add_argument("--hours", type=float, default=24.0, help="history length and window (default 24)")
    parser.add_argument("--sample", type=float, default=300.0, help="seconds between samples (default 300)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="oversale-bench-"))
    end = time.time() - 300
    log(f"writing {args.hours:g} h of history for {args.workloads} Deployments (two Pods each)")
    samples = write_history(work / "history.om", args.workloads, end - args.hours * 3600, end, args.sample)
    log(f"{samples:,} samples written; building TSDB blocks with promtool")
    prometheus = PrometheusServer(work, work / "history.om")
    (work / "history.om").unlink()
    log("waiting for Prometheus to compact promtool's blocks")
    blocks = prometheus.wait_for_compaction()
    log(f"{blocks[0]} blocks compacted to {blocks[1]}")
    try:
        state = ClusterState(AnnotationKeys(), load_config=LoadConfig())
        results: list[str] = []
        # Samples are args.sample apart: rate() needs a window holding several of them.
        poller = WorkloadHistoryPoller(PrometheusAPI(prometheus.url, 300), state, 300, args.hours * 3600,
                                       4 * args.sample, args.sample, results.append)
        timings = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            poller.poll_once()
            timings.append(time.perf_counter() - started)
        known = len(state._workload_history)
        assert results == ["ok"] * args.repeats and known == args.workloads, (results, known)
        figures = {"workloads": args.workloads, "pods": 2 * args.workloads, "history_samples": samples,
                   "read_median_seconds": round(statistics.median(timings), 2),
                   "read_min_seconds": round(min(timings), 2), "read_max_seconds": round(max(timings), 2)}
        log(f"one read of {2 * args.workloads} Pods' history: median {figures['read_median_seconds']} s "
            f"({figures['read_min_seconds']}-{figures['read_max_seconds']} s over {args.repeats}), "
            f"{known} workloads known")
        print(json.dumps(figures, indent=2))
    finally:
        prometheus.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
