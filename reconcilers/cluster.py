"""What the reconcilers read from and write to the API server, as plain dicts.

Writes are merge patches of annotations carrying the resourceVersion the decision was made from,
so a concurrent change makes them fail with 409 and the caller decides again on a fresh object.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client

from oversale.pods import TERMINAL_PHASES

# kind -> (API class, function stem)
WORKLOAD_APIS = {
    "Deployment": ("AppsV1Api", "deployment"),
    "StatefulSet": ("AppsV1Api", "stateful_set"),
    "DaemonSet": ("AppsV1Api", "daemon_set"),
    "CronJob": ("BatchV1Api", "cron_job"),
}
API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1", "CronJob": "batch/v1"}
MERGE_PATCH = "application/merge-patch+json"


class Cluster:
    def __init__(self, api_client: Any, timeout: float = 60.0) -> None:
        self._client = api_client
        self._timeout = timeout
        self._core: Any = client.CoreV1Api(api_client)
        self._autoscaling: Any = client.AutoscalingV2Api(api_client)

    def _api(self, kind: str) -> tuple[Any, str]:
        api_class, stem = WORKLOAD_APIS[kind]
        return getattr(client, api_class)(self._client), stem

    # -- reads -------------------------------------------------------------------------------
    def workloads(self) -> Iterator[dict[str, Any]]:
        for kind in WORKLOAD_APIS:
            api, stem = self._api(kind)
            for item in self._list(getattr(api, f"list_{stem}_for_all_namespaces")):
                item["kind"] = kind  # list items carry no kind
                item.setdefault("apiVersion", API_VERSIONS[kind])
                yield item

    def workload(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        api, stem = self._api(kind)
        response: Any = getattr(api, f"read_namespaced_{stem}")(name, namespace, _preload_content=False,
                                                               _request_timeout=self._timeout)
        item: dict[str, Any] = json.loads(response.data)
        item["kind"] = kind
        return item

    def autoscalers(self) -> list[dict[str, Any]]:
        return list(self._list(self._autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces))

    def nodes(self, label_selector: str) -> list[dict[str, Any]]:
        return list(self._list(self._core.list_node, label_selector=label_selector))

    def node(self, name: str) -> dict[str, Any]:
        response: Any = self._core.read_node(name, _preload_content=False, _request_timeout=self._timeout)
        node: dict[str, Any] = json.loads(response.data)
        return node

    def running_pods(self) -> Iterator[dict[str, Any]]:
        """Pods that hold node resources (bound, not finished)."""
        yield from self._list(self._core.list_pod_for_all_namespaces,
                              field_selector=",".join(f"status.phase!={phase}" for phase in TERMINAL_PHASES))

    def _list(self, function: Any, **selectors: str) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            response: Any = function(limit=500, _continue=token, _preload_content=False,
                                     _request_timeout=self._timeout, **selectors)
            page = json.loads(response.data)
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    # -- writes ------------------------------------------------------------------------------
    def annotate_workload(self, kind: str, namespace: str, name: str, annotations: dict[str, str],
                          resource_version: str) -> None:
        api, stem = self._api(kind)
        getattr(api, f"patch_namespaced_{stem}")(name, namespace, _annotation_patch(annotations, resource_version),
                                                 _content_type=MERGE_PATCH, _preload_content=False,
                                                 _request_timeout=self._timeout)

    def annotate_node(self, name: str, annotations: dict[str, str], resource_version: str) -> None:
        self._core.patch_node(name, _annotation_patch(annotations, resource_version), _content_type=MERGE_PATCH,
                              _preload_content=False, _request_timeout=self._timeout)

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        self._core.patch_node_status(name, body, _content_type=MERGE_PATCH, _preload_content=False,
                                     _request_timeout=self._timeout)

    def patch_autoscaler(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._autoscaling.patch_namespaced_horizontal_pod_autoscaler(
            name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=self._timeout)

    def event(self, obj: dict[str, Any], reason: str, message: str, component: str) -> None:
        """A Normal core/v1 Event on ``obj`` (shown by ``kubectl describe``)."""
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace") or "default"
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{metadata.get('name')}.", "namespace": namespace},
            "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind"),
                               "name": metadata.get("name"), "namespace": metadata.get("namespace", ""),
                               "uid": metadata.get("uid", "")},
            "reason": reason,
            "message": message[:1024],
            "type": "Normal",
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._core.create_namespaced_event(namespace, body, _preload_content=False, _request_timeout=self._timeout)


def _annotation_patch(annotations: dict[str, str], resource_version: str) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
