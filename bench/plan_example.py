"""A worked example of ``python -m reconcilers plan`` on real usage: Bitbrains VMs as Pods.

  python -m bench.plan_example [--vms 60] [--days 14] [--scrape 60] [--peaks] [--out plan-example]
                              [--phase 240] [--placements N]

The first ``--vms`` VMs of the shared Bitbrains July 2013 trace become Pods of a cluster (three
namespaces, one ReplicaSet each, spread over nodes of 32 cores and 256 GiB in one GKE node pool).
Their requests and usage are written as kube-state-metrics and cAdvisor publish them, shifted to
end now, the cpu counter scraped every ``--scrape`` seconds (each 5-minute reading held through
its slot) and the gauges every 5 minutes, turned into TSDB blocks with ``promtool``, served by a
real Prometheus, and the plan runs against it as it would against a cluster's (scraped every
minute, the plan reads 5-minute averages, as the trace holds). docs/reconcilers.md shows the
result; the time and peak resident memory of the plan itself are printed (docs/performance.md),
once Prometheus has compacted promtool's 2-hour blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.proc import status_kib
from kube.cli import Parser
from simulator.trace import SLOT, read_trace
from tests.conftest import ROOT, SHARED
from tests.prometheus_server import Family, PrometheusServer, write_openmetrics

TRACE = SHARED / "traces" / "bitbrains-rnd-2013-07" / "rnd_2013-07_cpu_mem.csv.gz"
NAMESPACES = ("shop", "search", "batch")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m bench.plan_example", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vms", type=int, default=60)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--scrape", type=float, default=60.0,
                        help="seconds between the exporters' samples (a trace slot is 300)")
    parser.add_argument("--peaks", action="store_true", help="run the plan with --peaks")
    parser.add_argument("--out", type=Path, default=Path("plan-example"))
    parser.add_argument("--phase", type=float, default=240.0, metavar="SECONDS",
                        help="where the plan's 5-minute steps (multiples of 5 minutes since the epoch) fall in the "
                             "trace's 5-minute slots, in seconds after a slot starts. Each reading is held through its "
                             "slot, and the counter's increment at a scrape is the usage of its own slot: at 240 (the "
                             "default) the 4 increments a step's rate reads are all of one slot; elsewhere a step "
                             "averages two")
    parser.add_argument("--placements", type=int, metavar="N", help="run the plan with --placements N (default: "
                                                                     "the plan's)")
    args = parser.parse_args(argv)
    workloads = read_trace(TRACE)
    origin = min(int(w.slots[0]) for w in workloads)
    span = args.days * 86400 // SLOT
    chosen = [w for w in workloads if int(w.slots[0]) == origin and len(w.slots) > 0.9 * span][: args.vms]
    # The plan's steps are multiples of its 5 minutes since the epoch: the slots start --phase
    # seconds before one.
    end = (time.time() - 120) // SLOT * SLOT - args.phase % SLOT
    start = end - args.days * 86400
    families = {name: Family(name, kind) for name, kind in (
        ("kube_pod_container_resource_requests", "gauge"), ("kube_pod_owner", "gauge"), ("kube_pod_info", "gauge"),
        ("container_cpu_usage_seconds_total", "counter"), ("container_memory_working_set_bytes", "gauge"),
        ("kube_node_status_allocatable", "gauge"), ("kube_node_labels", "gauge"))}
    # The cpu counter at the scrape interval, whose rate the plan reads over its step; the gauges,
    # read at their last value, at the trace's 5 minutes (promtool's time grows with the samples).
    families["container_cpu_usage_seconds_total"].step = args.scrape
    nodes = max(1, len(chosen) // 8)
    for index, workload in enumerate(chosen):
        namespace = NAMESPACES[index % len(NAMESPACES)]
        pod, node = f"vm-{workload.name}-0", f"node-{index % nodes}"
        kept = {"namespace": namespace, "pod": pod}

        def at(values: np.ndarray, slots: np.ndarray = workload.slots) -> Callable[[float], float]:
            def value(t: float) -> float:
                position = int(np.searchsorted(slots, origin + int((t - start) // SLOT)))
                return float(values[min(position, len(values) - 1)])
            return value

        requests = families["kube_pod_container_resource_requests"].series
        requests.append(({**kept, "container": "app", "node": node, "resource": "cpu", "unit": "core"},
                         at(workload.request["cpu"] / 1000)))
        requests.append(({**kept, "container": "app", "node": node, "resource": "memory", "unit": "byte"},
                         at(workload.request["memory"])))
        owner = {**kept, "owner_kind": "ReplicaSet", "owner_name": f"vm-{workload.name}", "owner_is_controller": "true"}
        families["kube_pod_owner"].series.append((owner, lambda t: 1))
        families["kube_pod_info"].series.append(({**kept, "node": node}, lambda t: 1))
        families["container_cpu_usage_seconds_total"].series.append(
            ({**kept, "container": "app"}, at(workload.usage["cpu"] / 1000)))
        families["container_memory_working_set_bytes"].series.append(
            ({**kept, "container": "app"}, at(workload.usage["memory"])))
    for number in range(nodes):
        node = f"node-{number}"
        families["kube_node_status_allocatable"].series += [
            ({"node": node, "resource": "cpu", "unit": "core"}, lambda t: 32),
            ({"node": node, "resource": "memory", "unit": "byte"}, lambda t: 256 * 2**30)]
        families["kube_node_labels"].series.append(
            ({"node": node, "label_cloud_google_com_gke_nodepool": "general"}, lambda t: 1))
    with tempfile.TemporaryDirectory(prefix="oversale-plan-") as directory:
        path = Path(directory) / "history.om"
        samples = write_openmetrics(path, families.values(), start, end, SLOT)
        print(f"{len(chosen)} VMs as Pods over {args.days} days: {samples:,} samples", flush=True)
        server = PrometheusServer(Path(directory), path)
        try:
            # A cluster's Prometheus holds days in a few blocks, not promtool's 2-hour ones.
            blocks = server.wait_for_compaction()
            print(f"Prometheus compacted {blocks[0]} blocks into {blocks[1]}", flush=True)
            # The history ended when it was written, promtool's (and the compaction's) minutes ago:
            # the plan reads that much more, as it would read a cluster's history up to now.
            days = math.ceil((args.days + (time.time() - end) / 86400) * 100) / 100
            extra = [*(["--peaks"] if args.peaks else []),
                     *(["--placements", str(args.placements)] if args.placements else [])]
            seconds, peak_kib = run_plan(server.url, days, args.out, extra)
            print(f"plan took {seconds:.0f}s, peak resident memory {peak_kib / 1024:.0f} MB (sampled every 0.1 s)")
        finally:
            server.stop()
    return 0


def run_plan(url: str, days: float, out: Path, extra: list[str]) -> tuple[float, int]:
    """``python -m reconcilers plan`` on the last ``days`` of history, with ``extra`` options: its
    time and its peak resident memory in KiB."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "reconcilers", "plan", "--prometheus", url,
                              "--days", f"{days:g}", "--out", str(out), *extra], cwd=ROOT)
    # The plan's own peak: VmHWM, which exec starts afresh (a child's ru_maxrss also counts the
    # pages it shared with this process before exec, and this one holds the trace).
    peak_kib = 0
    while child.poll() is None:
        with contextlib.suppress(OSError):  # exited meanwhile
            peak_kib = max(peak_kib, status_kib(child.pid, "VmHWM"))
        time.sleep(0.1)
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args)
    return time.perf_counter() - started, peak_kib


if __name__ == "__main__":
    sys.exit(main())
