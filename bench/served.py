"""Cluster objects as the API server returns them, for the memory benchmarks: the shared corpus's
Node and Pods (made from public workload manifests) with what a live cluster adds to them: owners,
statuses, and the ``managedFields`` of server-side field tracking, built from each object's own
fields as the API server records them."""

from __future__ import annotations

import copy
import json
from typing import Any

from oversale.annotations import AnnotationKeys
from tests.conftest import POD_FIXTURES, SHARED

FIXTURES = SHARED / "fixtures"
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




def gke_nodes(count: int) -> list[dict[str, Any]]:
    """The shared corpus's real GKE Node, named ``node-<n>``."""
    node = json.loads((FIXTURES / "nodes" / "gke-node.json").read_text())
    named = []
    for number in range(count):
        copied = copy.deepcopy(node)
        copied["metadata"]["name"] = f"node-{number}"
        named.append(copied)
    return named


def manifests() -> list[dict[str, Any]]:
    """The shared corpus's Pods, in file order."""
    return [json.loads(path.read_text()) for path in POD_FIXTURES]
