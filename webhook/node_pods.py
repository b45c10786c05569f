"""Live lookup of the Pods bound to a node, for the node validating webhook.

Ratio changes are rare, so a live LIST with a field selector is cheaper than watching every Pod of
the cluster in every webhook worker.
"""

from __future__ import annotations

from typing import Any

from kube.client import decoded


class LiveNodePods:
    def __init__(self, api_client: Any, timeout: float) -> None:
        from kubernetes import client

        self._api = client.CoreV1Api(api_client)
        self._timeout = timeout

    def on_node(self, node: str) -> list[dict[str, Any]]:
        response: Any = self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False, _request_timeout=self._timeout
        )
        items: list[dict[str, Any]] = decoded(response).get("items") or []
        return items


class NoClusterPods:
    def on_node(self, node: str) -> list[dict[str, Any]]:
        raise RuntimeError("no Kubernetes API server is configured")
