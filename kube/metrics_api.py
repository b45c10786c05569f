"""The resource metrics API (``metrics.k8s.io/v1beta1``, served by metrics-server through the API
server): NodeMetrics and PodMetrics of the whole cluster, two list calls."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kube.client import decoded
from oversale.errors import QuantityError
from oversale.quantity import CPU, MEMORY, RESOURCES, parse_bytes, parse_millicores
from oversale.timestamps import parse_go_duration, parse_timestamp
from oversale.usage import first_seen

GROUP, VERSION = "metrics.k8s.io", "v1beta1"


@dataclass(frozen=True)
class NodeMetrics:
    name: str
    cpu: int
    """Millicores."""
    memory: int
    """Bytes (working set)."""
    at: float
    """When this reader first saw the reading, on its own clock (seconds; see
    ``oversale.usage.first_seen``): a stamp that stops changing makes the reading age."""
    window: float | None = None
    """Seconds the cpu usage is a rate over (the reading's ``window``: metrics-server's
    ``--metric-resolution``, 15 s by default); None when the reading states none."""


@dataclass(frozen=True)
class ContainerMetrics:
    namespace: str
    pod: str
    container: str
    cpu: int
    memory: int
    at: float | None = None
    """When this reader first saw its Pod's reading, on its own clock (as ``NodeMetrics.at``);
    None when the reading states no time."""


def pod_usage(containers: Iterable[ContainerMetrics]) -> dict[tuple[str, str], dict[str, float]]:
    """(namespace, Pod) -> its usage, cpu millicores and memory bytes, summed over its containers
    (PodMetrics list each container apart)."""
    usage: dict[tuple[str, str], dict[str, float]] = {}
    for container in containers:
        totals = usage.setdefault((container.namespace, container.pod), dict.fromkeys(RESOURCES, 0.0))
        totals[CPU] += container.cpu
        totals[MEMORY] += container.memory
    return usage


class MetricsAPI:
    """Lists the metrics API with the real ``kubernetes`` client (raises its errors, and
    ``kube.client.GarbledAnswer`` for an answer that is no list of metrics). Keep one
    per reader: it remembers each node's and Pod's last reading to time it on ``clock``."""

    def __init__(self, api_client: Any, timeout: float = 30, clock: Callable[[], float] = time.time) -> None:
        from kubernetes import client

        self._api = client.CustomObjectsApi(api_client)
        self._timeout = timeout
        self._clock = clock
        self._seen: dict[str, tuple[float, float]] = {}
        self._seen_pods: dict[tuple[str, str], tuple[float, float]] = {}

    def nodes(self) -> list[NodeMetrics]:
        now = self._clock()
        found = []
        seen: dict[str, tuple[float, float]] = {}
        for item in self._list("nodes"):
            try:
                name = item["metadata"]["name"]
                cpu, memory = parse_millicores(item["usage"]["cpu"]), parse_bytes(item["usage"]["memory"])
            except (KeyError, TypeError, QuantityError):
                continue  # a malformed item says nothing about the others
            seen[name] = first_seen(self._seen.get(name), _timestamp(item, now), now)
            found.append(NodeMetrics(name, cpu, memory, seen[name][1], parse_go_duration(item.get("window"))))
        self._seen = seen
        return found

    def containers(self) -> list[ContainerMetrics]:
        now = self._clock()
        found = []
        seen: dict[tuple[str, str], tuple[float, float]] = {}
        for item in self._list("pods"):
            metadata = item.get("metadata") or {}
            pod: tuple[str, str] = (metadata.get("namespace", ""), metadata.get("name", ""))
            at = None
            if (stamp := parse_timestamp(item.get("timestamp"))) is not None:
                seen[pod] = first_seen(self._seen_pods.get(pod), stamp, now)
                at = seen[pod][1]
            for container in item.get("containers") or []:
                try:
                    found.append(ContainerMetrics(metadata.get("namespace", ""), metadata["name"], container["name"],
                                                  parse_millicores(container["usage"]["cpu"]),
                                                  parse_bytes(container["usage"]["memory"]), at))
                except (KeyError, TypeError, QuantityError):
                    continue
        self._seen_pods = seen
        return found

    def _list(self, plural: str) -> list[dict[str, Any]]:
        response: Any = self._api.list_cluster_custom_object(GROUP, VERSION, plural, _preload_content=False,
                                                             _request_timeout=self._timeout)
        items: list[dict[str, Any]] = decoded(response).get("items") or []
        return items


def _timestamp(item: dict[str, Any], default: float) -> float:
    stamp = parse_timestamp(item.get("timestamp"))
    return default if stamp is None else stamp
