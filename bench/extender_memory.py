"""Resident memory of the scheduler extender holding a cluster: the real extender process (gunicorn
master and worker) watching the API-server double of tests/, once synced and leading.

    python -m bench.extender_memory [--nodes 500] [--pods 20000]

The nodes are the shared corpus's real GKE Node, renamed; the Pods are the shared corpus's Pods
(made from public workload manifests) cycled and bound to them, as the API server returns them
(``bench.served``: owner, Running status, managedFields), or with ``--bare-pods`` only named,
bound and Running. The floor of the whole is the same extender watching an empty cluster.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.extender_failover import start, status
from bench.proc import status_kib
from bench.served import as_served, gke_nodes, manifests
from kube.cli import Parser
from tests.conftest import stop_process
from tests.kube_api import FakeKubeAPI


def resident_mb(group: int, field: str = "VmRSS") -> float:
    """Summed ``field`` (VmRSS: resident now; VmHWM: each process's peak) of the processes of a
    process group (the extender's master and worker)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) != group:
                continue
            total += status_kib(int(entry.name), field)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total / 1024


def populate(api: FakeKubeAPI, nodes: int, pods: int, bare: bool = False, pending: int = 0) -> None:
    for node in gke_nodes(nodes):
        api.put("nodes", node)
    pod_manifests = manifests()
    for number in range(pods):
        manifest, node_name = pod_manifests[number % len(pod_manifests)], f"node-{number % max(nodes, 1)}"
        if not bare:
            pod = as_served(manifest, number, node_name)
            if number >= pods - pending:  # not scheduled yet: the Pods the extender caches whole
                del pod["spec"]["nodeName"]
                pod["status"] = {"phase": "Pending", "qosClass": pod["status"]["qosClass"]}
            api.put("pods", pod)
            continue
        pod = copy.deepcopy(manifest)
        metadata = pod["metadata"]
        metadata["name"] = f"{metadata.get('name') or metadata.pop('generateName', 'pod-').rstrip('-')}-{number}"
        pod["metadata"].setdefault("namespace", "default")
        pod["spec"]["nodeName"] = node_name
        pod["status"] = {"phase": "Running"}
        api.put("pods", pod)


def measure(work: Path, nodes: int, pods: int, bare: bool = False, pending: int = 0) -> tuple[float, float]:
    api = FakeKubeAPI().start()
    try:
        populate(api, nodes, pods, bare, pending)
        process, url = start(api, work)
        try:
            deadline = time.monotonic() + 600
            while status(f"{url}/readyz") != 200:  # its caches synced
                if time.monotonic() > deadline:
                    raise RuntimeError("the extender did not become ready in 10 minutes")
                time.sleep(0.2)
            time.sleep(2)
            return resident_mb(process.pid), resident_mb(process.pid, "VmHWM")
        finally:
            stop_process(process)
    finally:
        api.stop()


def main() -> int:
    parser = Parser(prog="python -m bench.extender_memory", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--bare-pods", action="store_true",
                        help="the corpus's Pods with only a name, a node and phase Running (the first figures)")
    parser.add_argument("--pending", type=int, default=0, help="how many of the Pods are not scheduled yet")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        floor, _ = measure(Path(directory), 0, 0)
        print(f"empty cluster: {floor:.0f} MB", file=sys.stderr)
        held, peak = measure(Path(directory), args.nodes, args.pods, args.bare_pods, args.pending)
        print(f"{args.nodes} nodes, {args.pods} Pods: {held:.0f} MB, peak {peak:.0f} MB", file=sys.stderr)
    print(json.dumps({"nodes": args.nodes, "pods": args.pods, "pending": args.pending, "floor_mb": round(floor),
                      "resident_mb": round(held), "cluster_mb": round(held - floor), "peak_mb": round(peak)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
