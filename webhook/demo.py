"""See it work without a cluster: ``python -m webhook.demo`` (or ``make demo``).

Builds the webhook app exactly as ``python -m webhook`` does with ``OVERSALE_KUBERNETES=off``, sends
it four AdmissionReview v1 requests a cluster would send (through the app's own WSGI entry, so
the same admission path answers them), and prints what went in, the JSON patch, the warnings
kubectl would show and what the object looks like afterwards.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

from oversale.annotations import AnnotationKeys
from oversale.settings import Settings
from webhook.app import create_app

KEYS = AnnotationKeys()


def _container(name: str, cpu: str, memory: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = limits
    return {"name": name, "image": f"example.com/{name}:1.0", "resources": resources}


def _pod(name: str, annotations: dict[str, str], *containers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{name}-7d4b9-", "namespace": "shop", "annotations": annotations},
            "spec": {"containers": list(containers)}}


def _review(kind: str, resource: str, obj: dict[str, Any], operation: str = "CREATE",
            old: dict[str, Any] | None = None, sub: str | None = None, user: str = "system:serviceaccount:kube-system:"
            "replicaset-controller") -> dict[str, Any]:
    request: dict[str, Any] = {"uid": f"demo-{kind.lower()}", "kind": {"group": "", "version": "v1", "kind": kind},
                               "resource": {"group": "", "version": "v1", "resource": resource},
                               "namespace": obj["metadata"].get("namespace", ""), "operation": operation,
                               "userInfo": {"username": user}, "object": obj, "oldObject": old, "dryRun": False}
    if sub:
        request["subResource"] = sub
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _node(allocatable: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "worker-1", "labels": {KEYS.oversale_label: "enabled"}, "annotations": annotations},
            "status": {"allocatable": dict(allocatable), "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    node_before = _node({"cpu": "15890m", "memory": "61Gi", "pods": "110"}, {KEYS.cpu_oversale_ratio: "1.5"})
    return [
        ("A Deployment's Pod asking for ratio 2 (its template carries the annotation)", "/mutate/pods",
         _review("Pod", "pods", _pod("web", {KEYS.cpu_requests_ratio: "2"}, _container("app", "1", "1Gi"),
                                     _container("proxy", "200m", "128Mi")))),
        ("A Guaranteed Pod: left alone, and kubectl is told why", "/mutate/pods",
         _review("Pod", "pods", _pod("db", {KEYS.cpu_requests_ratio: "2"},
                                     _container("db", "2", "4Gi", limits={"cpu": "2", "memory": "4Gi"})))),
        ("An invalid annotation: nothing changes, the warning names the value", "/mutate/pods",
         _review("Pod", "pods", _pod("api", {KEYS.cpu_requests_ratio: "fast"}, _container("api", "500m", "256Mi")))),
        ("An opted-in Node at ratio 1.5: its kubelet's status write, oversold", "/mutate/nodes",
         _review("Node", "nodes", node_before, "UPDATE", old=node_before, sub="status", user="system:node:worker-1")),
    ]


def _requests(obj: dict[str, Any]) -> str:
    if obj.get("kind") == "Node":
        return json.dumps((obj.get("status") or {}).get("allocatable"))
    return ", ".join(f"{c['name']} {json.dumps(c['resources'].get('requests'))}" for c in obj["spec"]["containers"])


def main() -> int:
    import logging

    import jsonpatch

    logging.basicConfig(level=logging.ERROR)  # the warnings below are the point; no log lines around them
    app = create_app(Settings(kubernetes="off"))
    client = app.test_client()
    for title, path, review in cases():
        obj = review["request"]["object"]
        answer = client.post(path, data=json.dumps(review), content_type="application/json").get_json()
        response = answer["response"]
        patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        after = jsonpatch.apply_patch(obj, patch) if patch else obj
        print(f"== {title}\n   POST {path}")
        print(f"   before:   {_requests(obj)}")
        print(f"   after:    {_requests(after)}")
        for operation in patch:
            print(f"   patch:    {operation['op']} {operation['path']} {json.dumps(operation.get('value'))[:100]}")
        for warning in response.get("warnings") or []:
            print(f"   warning:  {warning}")
        audit = ((after.get("metadata") or {}).get("annotations") or {}).get(KEYS.compression)
        if audit:
            print(f"   audit:    {KEYS.compression}: {audit}")
        print(f"   allowed:  {response['allowed']}\n")
    print("Serve it for real with `make run` (HTTPS on 127.0.0.1:8443), then e.g.\n"
          "  curl --cacert .certs/ca.crt https://127.0.0.1:8443/mutate/pods -H 'Content-Type: application/json' "
          "-d @docs/examples/pod-review.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
