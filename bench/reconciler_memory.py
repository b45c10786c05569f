"""Memory the reconcilers' two passes over the whole cluster take: the remediation pass, and the
compression pass with the in-place resize pass it ends with, dry runs.

    python -m bench.reconciler_memory [--nodes 500] [--pods 20000]

The Pods are the shared corpus's Pods (made from public workload manifests) cycled, bound and
made to look as the API server returns them (``bench.served``: a ReplicaSet owner, a Running
status with container statuses and conditions, and the ``managedFields`` of each writer). They
belong to 2,000 opted-in Deployments made the same way, whose cpu ratio (2) the Pods do not have
yet. The API-server double of tests/ serves them from a child process, so the figure is the
reconciler's alone: the peak of Python allocations during the pass (tracemalloc), over what was
allocated before it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from bench.served import STARTED, WORKLOADS, as_served, deployment, gke_nodes, manifests
from kube.cli import Parser


def serve(nodes: int, pods: int, urls: Any, done: Any) -> None:
    """The child: the API double holding the cluster, until the parent is done."""
    from tests.kube_api import FakeKubeAPI

    api = FakeKubeAPI().start()
    for node in gke_nodes(nodes):
        api.put("nodes", node)
        api.put("nodemetrics", {"metadata": {"name": node["metadata"]["name"]}, "timestamp": STARTED,
                                "window": "30s", "usage": {"cpu": "1", "memory": "4Gi"}})
    pod_manifests = manifests()
    for number in range(WORKLOADS):
        api.put("deployments", deployment(pod_manifests[number % len(pod_manifests)], number))
    for number in range(pods):
        api.put("pods", as_served(pod_manifests[number % len(pod_manifests)], number,
                                  f"node-{number % max(nodes, 1)}"))
    urls.put(api.url)
    done.wait()
    api.stop()


def peak_mb(run: Any) -> float:
    """Peak Python allocations while ``run()`` runs, above those before it, in MB."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        run()
        _, peak = tracemalloc.get_traced_memory()
        return (peak - before) / 2**20
    finally:
        tracemalloc.stop()


def main() -> int:
    parser = Parser(prog="python -m bench.reconciler_memory", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=20000)
    args = parser.parse_args()

    from kubernetes import client

    from kube.metrics_api import MetricsAPI
    from oversale.settings import Settings
    from reconcilers.cluster import Cluster
    from reconcilers.remediation import Remediator
    from reconcilers.runner import Reconciler
    from reconcilers.sqlite_history import SqliteHistory

    context = multiprocessing.get_context("fork")
    urls, done = context.Queue(), context.Event()
    child = context.Process(target=serve, args=(args.nodes, args.pods, urls, done), daemon=True)
    child.start()
    work = Path(tempfile.mkdtemp(prefix="oversale-bench-"))
    try:
        url = None
        while url is None:  # the child may take minutes to fill the double, or fail
            try:
                url = urls.get(timeout=1)
            except queue.Empty:
                if not child.is_alive():
                    print("error: the API double's process failed (its traceback is above)", file=sys.stderr)
                    return 1
        api_client = client.ApiClient(client.Configuration(host=url))
        settings = Settings(kubernetes="off")
        cluster = Cluster(api_client, timeout=300)
        figures: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods}
        remediator = Remediator(cluster, MetricsAPI(api_client), settings)
        figures["remediation_pass_mb"] = round(peak_mb(lambda: remediator.run_pass(dry_run=True)), 1)
        print(f"remediation pass: {figures['remediation_pass_mb']} MB", file=sys.stderr)
        # Every Pod's workload carries a ratio its Pods do not have yet: the resize pass, which
        # the compression pass ends with, reads and plans every Pod. No usage history: the
        # compression pass proposes nothing new, but reads and plans every workload.
        reconciler = Reconciler(cluster, SqliteHistory(work / "history.db", 86400.0), settings)
        figures["compression_pass_mb"] = round(peak_mb(lambda: reconciler.reconcile_workloads(True)), 1)
        print(f"compression pass, with its resize pass: {figures['compression_pass_mb']} MB", file=sys.stderr)
    finally:
        done.set()
        child.join(timeout=60)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
