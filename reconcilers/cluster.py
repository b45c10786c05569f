"""What the reconcilers read from and write to the API server, as plain dicts.

Writes are merge patches of annotations carrying the resourceVersion the decision was made from,
so a concurrent change makes them fail with 409 and the caller decides again on a fresh object.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube.client import VPA, GarbledAnswer, decoded, found, without_managed_fields
from oversale.pods import TERMINAL_PHASES
from oversale.timestamps import format_timestamp

# kind -> (API class, function stem)
WORKLOAD_APIS = {
    "Deployment": ("AppsV1Api", "deployment"),
    "StatefulSet": ("AppsV1Api", "stateful_set"),
    "DaemonSet": ("AppsV1Api", "daemon_set"),
    "CronJob": ("BatchV1Api", "cron_job"),
}
API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1", "CronJob": "batch/v1"}
MERGE_PATCH = "application/merge-patch+json"
WRITE_TRIES = 3
"""How many times a write carrying a resourceVersion is decided and sent, the object read again
after each 409: a node's kubelet writes its status every few seconds to minutes, and other
controllers write workloads and nodes too. Past that the write waits for the next pass."""
JSON_PATCH = "application/json-patch+json"
API_FAILURES = (ApiException, urllib3.exceptions.HTTPError, GarbledAnswer)
"""What any call of the API server may fail with: a refusal, no road to it, or an answer that is
no Kubernetes object (a proxy's page). A step that meets one stops and says which; what it wrote
stands."""


def packed(obj: dict[str, Any]) -> bytes:
    """An object a pass holds until it reads it again, kept as its compact JSON: a parsed Pod
    takes five to six times as much in Python objects, and a pass holding every running Pod of a
    large cluster parsed would not fit the reconciler's memory limit (``bench.reconciler_memory``)."""
    return orjson.dumps(obj)


def unpacked(data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads(data)
    return obj


class Cluster:
    """The reconcilers' reads and writes of the API server (the module docstring says how writes
    stay safe), through the real client, with every request bounded by ``timeout``."""

    def __init__(self, api_client: Any, timeout: float = 60.0) -> None:
        self._client = api_client
        self._timeout = timeout
        self._core: Any = client.CoreV1Api(api_client)
        self._autoscaling: Any = client.AutoscalingV2Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)

    def _api(self, kind: str) -> tuple[Any, str]:
        api_class, stem = WORKLOAD_APIS[kind]
        return getattr(client, api_class)(self._client), stem

    # -- reads -------------------------------------------------------------------------------
    def workloads(self) -> Iterator[dict[str, Any]]:
        for kind in WORKLOAD_APIS:
            api, stem = self._api(kind)
            yield from self._list(getattr(api, f"list_{stem}_for_all_namespaces"), kind, API_VERSIONS[kind])

    def workload(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        api, stem = self._api(kind)
        response: Any = getattr(api, f"read_namespaced_{stem}")(name, namespace, _preload_content=False,
                                                               _request_timeout=self._timeout)
        item = decoded(response)
        item["kind"] = kind
        return item

    def autoscalers(self) -> list[dict[str, Any]]:
        return list(self._list(self._autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces,
                               "HorizontalPodAutoscaler", "autoscaling/v2"))

    def nodes(self, label_selector: str) -> list[dict[str, Any]]:
        found = []
        for node in self._list(self._core.list_node, "Node", label_selector=label_selector):
            # A Node's status lists the images on it (up to the kubelet's nodeStatusMaxImages, 50,
            # each with all its names and size), most of the object; nothing here reads them.
            (node.get("status") or {}).pop("images", None)
            found.append(node)
        return found

    def node(self, name: str) -> dict[str, Any]:
        response: Any = self._core.read_node(name, _preload_content=False, _request_timeout=self._timeout)
        return decoded(response)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        response: Any = self._core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                       _request_timeout=self._timeout)
        return decoded(response)

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        response: Any = self._core.read_namespaced_persistent_volume_claim(
            name, namespace, _preload_content=False, _request_timeout=self._timeout)
        return decoded(response)

    def persistent_volume(self, name: str) -> dict[str, Any]:
        response: Any = self._core.read_persistent_volume(name, _preload_content=False, _request_timeout=self._timeout)
        return decoded(response)

    def csi_nodes(self) -> Iterator[dict[str, Any]]:
        """Every CSINode: each node's CSI drivers and how many volumes each may attach there."""
        yield from self._list(client.StorageV1Api(self._client).list_csi_node, "CSINode", "storage.k8s.io/v1")

    def volume_attachments(self) -> Iterator[dict[str, Any]]:
        """Every VolumeAttachment: which CSI volume is attached (or attaching, detaching) where."""
        yield from self._list(client.StorageV1Api(self._client).list_volume_attachment, "VolumeAttachment",
                              "storage.k8s.io/v1")

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        """Every namespace's labels (what a pod affinity term's ``namespaceSelector`` matches)."""
        return {namespace["metadata"]["name"]: namespace["metadata"].get("labels") or {}
                for namespace in self._list(self._core.list_namespace, "Namespace")}

    def running_pods(self) -> Iterator[dict[str, Any]]:
        """Pods that hold node resources (bound, not finished)."""
        yield from self._list(self._core.list_pod_for_all_namespaces, "Pod",
                              field_selector=",".join(f"status.phase!={phase}" for phase in TERMINAL_PHASES))

    def limit_ranges(self) -> list[dict[str, Any]]:
        return list(self._list(self._core.list_limit_range_for_all_namespaces, "LimitRange"))

    def resource_quotas(self) -> list[dict[str, Any]]:
        return list(self._list(self._core.list_resource_quota_for_all_namespaces, "ResourceQuota"))

    def supports_resize(self) -> bool:
        """Whether the API server serves ``pods/resize`` (discovery of the core group)."""
        response: Any = self._core.get_api_resources(_preload_content=False, _request_timeout=self._timeout)
        return any(r.get("name") == "pods/resize" for r in decoded(response).get("resources") or [])

    def vertical_autoscalers(self) -> list[dict[str, Any]] | None:
        """Every VerticalPodAutoscaler, or None when its CRD is not installed."""
        listed = found(self._custom.list_cluster_custom_object, *VPA, _request_timeout=self._timeout)
        if listed is None:
            return None
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    def _list(self, function: Any, kind: str, api_version: str = "v1", **selectors: str) -> Iterator[dict[str, Any]]:
        """Every item of a list, page by page, with its ``kind`` and ``apiVersion``: the API server
        leaves them out of a list's items (kubernetes#3030), and an Event whose involvedObject has
        no kind is not among the ones ``kubectl describe`` shows for the object."""
        token = None
        while True:
            response: Any = function(limit=500, _continue=token, _preload_content=False,
                                     _request_timeout=self._timeout, **selectors)
            page = decoded(response)
            for item in page.get("items") or []:
                yield {"apiVersion": api_version, "kind": kind, **without_managed_fields(item)}
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    # -- writes ------------------------------------------------------------------------------
    def annotate_workload(self, kind: str, namespace: str, name: str, annotations: dict[str, str],
                          resource_version: str) -> None:
        api, stem = self._api(kind)
        patch = _conditional(annotations_patch(annotations), resource_version)
        getattr(api, f"patch_namespaced_{stem}")(name, namespace, patch, _content_type=MERGE_PATCH,
                                                 _preload_content=False, _request_timeout=self._timeout)

    def annotate_node(self, name: str, annotations: Mapping[str, str | None], resource_version: str) -> None:
        self.patch_node(name, annotations_patch(annotations), resource_version)

    def patch_node(self, name: str, patch: dict[str, Any], resource_version: str) -> None:
        """A merge patch of a node (a list in it, such as the taints, replaces the node's whole);
        with a ``resource_version``, only if the node is still at it (409 otherwise)."""
        self._core.patch_node(name, _conditional(patch, resource_version), _content_type=MERGE_PATCH,
                              _preload_content=False, _request_timeout=self._timeout)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None],
                     resource_version: str) -> None:
        self._core.patch_namespaced_pod(name, namespace, _conditional(annotations_patch(annotations),
                                                                      resource_version),
                                        _content_type=MERGE_PATCH, _preload_content=False,
                                        _request_timeout=self._timeout)

    def resize_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        """Send a JSON patch of container requests to ``pods/resize``; return the Pod as stored."""
        response: Any = self._core.patch_namespaced_pod_resize(name, namespace, patch, _content_type=JSON_PATCH,
                                                               _preload_content=False,
                                                               _request_timeout=self._timeout)
        return decoded(response)

    def evict(self, namespace: str, name: str, uid: str = "") -> None:
        """Ask for a Pod's eviction (policy/v1 Eviction): the API server refuses it with 429 while a
        PodDisruptionBudget allows no disruption, and never deletes a Pod around its budget. With
        ``uid``, only that Pod: one recreated under its name since (a StatefulSet's) is refused
        with 409, rather than evicted in its place."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        self._core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False,
                                                  _request_timeout=self._timeout)

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        self._core.patch_node_status(name, body, _content_type=MERGE_PATCH, _preload_content=False,
                                     _request_timeout=self._timeout)

    def patch_autoscaler(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._autoscaling.patch_namespaced_horizontal_pod_autoscaler(
            name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=self._timeout)

    def event(self, obj: dict[str, Any], reason: str, message: str, component: str, kind: str = "Normal") -> None:
        """A core/v1 Event (``Normal`` or ``Warning``) on ``obj`` (shown by ``kubectl describe``)."""
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace") or "default"
        now = format_timestamp(time.time())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{metadata.get('name')}.", "namespace": namespace},
            "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind"),
                               "name": metadata.get("name"), "namespace": metadata.get("namespace", ""),
                               "uid": metadata.get("uid", "")},
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._core.create_namespaced_event(namespace, body, _preload_content=False, _request_timeout=self._timeout)


def annotations_patch(annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """The merge patch that sets these annotations (None removes one)."""
    return {"metadata": {"annotations": dict(annotations)}}


def _conditional(patch: dict[str, Any], resource_version: str) -> dict[str, Any]:
    """``patch`` applied only if the object is still at ``resource_version`` (409 otherwise);
    unconditional with ""."""
    if not resource_version:
        return patch
    return {**patch, "metadata": {**(patch.get("metadata") or {}), "resourceVersion": resource_version}}
