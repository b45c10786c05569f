"""Memory the reconcilers' two passes over the whole cluster take: the remediation pass, and the
compression pass with the in-place resize pass it ends with, dry runs.

    python -m bench.reconciler_memory [--nodes 500] [--pods 20000]

The Pods are the shared corpus's Pods (made from public workload manifests) cycled, bound and
made to look as the API server returns them: a ReplicaSet owner, a Running status with container
statuses and conditions, and the ``managedFields`` the API server keeps for each writer (the
controller's fields of metadata and spec, the kubelet's of status), built from the Pod's own
fields as server-side field tracking records them. They belong to 2,000 opted-in Deployments made
the same way, whose cpu ratio (2) the Pods do not have yet. The API-server double of tests/ serves them from
a child process, so the figure is the reconciler's alone: the peak of Python allocations during
the pass (tracemalloc), over what was allocated before it.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import queue
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from bench.extender_memory import FIXTURES
from oversale.annotations import AnnotationKeys

STARTED = "2026-11-01T00:00:00Z"
WORKLOADS = 2000
"""Deployments the Pods belong to (named ``w<n>`` in namespace ``ns<n % 50>``)."""


def suffix(number: int) -> str:
    """A ReplicaSet Pod's random suffix (five of the letters and digits Kubernetes draws from)."""
    letters = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(letters[number // len(letters) ** i % len(letters)] for i in range(5))


def fields_v1(value: Any) -> Any:
    """Server-side field tracking's FieldsV1 for a value: ``f:<field>`` per map key, ``k:<key>``
    per list item keyed by name, ``{}`` for a leaf."""
    if isinstance(value, dict):
        return {".": {}, **{f"f:{key}": fields_v1(item) for key, item in value.items()}}
    if isinstance(value, list):
        return {(f"k:{json.dumps({'name': item['name']})}" if isinstance(item, dict) and "name" in item
                 else f"v:{json.dumps(item)}"): fields_v1(item) for item in value}
    return {}


def as_served(pod: dict[str, Any], number: int, node: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    metadata = pod["metadata"]
    workload = number % WORKLOADS
    metadata.pop("generateName", None)
    metadata["name"] = f"w{workload}-5d8f9c7b6-{suffix(number)}"
    metadata["namespace"] = f"ns{workload % 50}"
    metadata["labels"] = {**(metadata.get("labels") or {}), "pod-template-hash": "5d8f9c7b6"}
    metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"w{workload}-5d8f9c7b6",
                                    "uid": f"rs-{workload}", "controller": True, "blockOwnerDeletion": True}]
    metadata["creationTimestamp"] = STARTED
    pod["spec"]["nodeName"] = node
    containers = pod["spec"].get("containers") or []
    pod["status"] = {
        "phase": "Running", "hostIP": "10.128.0.7", "podIP": "10.4.1.23", "podIPs": [{"ip": "10.4.1.23"}],
        "startTime": STARTED, "qosClass": "Burstable",
        "conditions": [{"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": STARTED}
                       for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                    "PodScheduled")],
        "containerStatuses": [{
            "name": c["name"], "ready": True, "restartCount": 0, "started": True,
            "image": c.get("image", ""), "imageID": f"docker.io/library/{c['name']}@sha256:{'0' * 64}",
            "containerID": f"containerd://{'1' * 64}", "state": {"running": {"startedAt": STARTED}},
            "lastState": {}, "resources": c.get("resources") or {}} for c in containers],
    }
    metadata["managedFields"] = [
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": STARTED,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": fields_v1(
             {k: metadata[k] for k in ("labels", "ownerReferences", "annotations") if metadata.get(k)}),
             "f:spec": fields_v1({k: v for k, v in pod["spec"].items() if k != "nodeName"})}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": STARTED, "fieldsType": "FieldsV1",
         "subresource": "status", "fieldsV1": {"f:status": fields_v1(pod["status"])}},
    ]
    return pod


def deployment(pod: dict[str, Any], number: int) -> dict[str, Any]:
    """Deployment ``w<number>``, opted in to right-sizing with a cpu ratio of 2, its template the
    Pod's spec, with a status and the managedFields of its writer (kubectl) and controller."""
    keys = AnnotationKeys()
    metadata = {"name": f"w{number}", "namespace": f"ns{number % 50}", "generation": 3,
                "creationTimestamp": STARTED, "labels": {"app": f"w{number}"},
                "annotations": {keys.enable_resource_compress: "true", keys.cpu_requests_ratio: "2",
                                "deployment.kubernetes.io/revision": "3"}}
    spec = {"replicas": 10, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
            "selector": {"matchLabels": {"app": f"w{number}"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": {"app": f"w{number}"}}, "spec": copy.deepcopy(pod["spec"])}}
    status = {"observedGeneration": 3, "replicas": 10, "updatedReplicas": 10, "readyReplicas": 10,
              "availableReplicas": 10, "conditions": [
                  {"type": kind, "status": "True", "lastUpdateTime": STARTED, "lastTransitionTime": STARTED,
                   "reason": reason, "message": f"Deployment w{number} {reason}"}
                  for kind, reason in (("Available", "MinimumReplicasAvailable"),
                                       ("Progressing", "NewReplicaSetAvailable"))]}
    metadata["managedFields"] = [
        {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "apps/v1", "time": STARTED,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": fields_v1({"labels": metadata["labels"]}),
                                                "f:spec": fields_v1(spec)}},
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1", "time": STARTED,
         "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": fields_v1(status)}},
    ]
    return {"metadata": metadata, "spec": spec, "status": status}


def serve(nodes: int, pods: int, urls: Any, done: Any) -> None:
    """The child: the API double holding the cluster, until the parent is done."""
    from tests.kube_api import FakeKubeAPI

    api = FakeKubeAPI().start()
    node = json.loads((FIXTURES / "nodes" / "gke-node.json").read_text())
    for number in range(nodes):
        named = copy.deepcopy(node)
        named["metadata"]["name"] = f"node-{number}"
        api.put("nodes", named)
        api.put("nodemetrics", {"metadata": {"name": f"node-{number}"}, "timestamp": STARTED, "window": "30s",
                                "usage": {"cpu": "1", "memory": "4Gi"}})
    manifests = [json.loads(path.read_text()) for path in sorted((FIXTURES / "pods").glob("*.json"))]
    for number in range(WORKLOADS):
        api.put("deployments", deployment(manifests[number % len(manifests)], number))
    for number in range(pods):
        api.put("pods", as_served(manifests[number % len(manifests)], number, f"node-{number % max(nodes, 1)}"))
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
    parser = argparse.ArgumentParser(prog="python -m bench.reconciler_memory", description=__doc__,
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
