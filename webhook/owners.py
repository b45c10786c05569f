"""Watch-backed caches of what admission needs from the cluster: workload annotations, the
ReplicaSet -> Deployment and Job -> CronJob links, LimitRanges and ResourceQuotas, and (where
its CRD is installed) which resources each workload's VerticalPodAutoscaler sets.

Each kind is one list-then-watch loop (the client-go reflector pattern) over the real
``kubernetes`` client, keeping only the few fields admission reads. A Pod admitted milliseconds
after its Deployment was created may find its ReplicaSet missing from the cache: then one GET
with a short timeout fills the gap, so the hot path makes no API call once caches are warm.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kube.client import VPA, one_line
from kube.reflector import Reflector, WatchedKind
from oversale.annotations import AnnotationKeys
from oversale.limitrange import NO_BOUNDS, RequestBounds, bounds_from_limit_ranges
from oversale.pods import controller_of
from oversale.resize import vpa_controlled, vpa_targets

log = logging.getLogger(__name__)

_NO_ANNOTATIONS: Mapping[str, str] = {}
_NO_VPA: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Entry:
    """What the cache remembers of one object."""

    annotations: Mapping[str, str]
    controller: tuple[str, str] | None = None
    extra: Any = None


WORKLOAD_KINDS = (
    WatchedKind("ReplicaSet", "AppsV1Api", "replica_set"),
    WatchedKind("Deployment", "AppsV1Api", "deployment"),
    WatchedKind("StatefulSet", "AppsV1Api", "stateful_set"),
    WatchedKind("DaemonSet", "AppsV1Api", "daemon_set"),
    WatchedKind("Job", "BatchV1Api", "job"),
    WatchedKind("CronJob", "BatchV1Api", "cron_job"),
)
LIMIT_RANGES = WatchedKind("LimitRange", "CoreV1Api", "limit_range")
# A raise must fit what the namespace's quota has left: the ResourceQuota plugin checks it after us.
RESOURCE_QUOTAS = WatchedKind("ResourceQuota", "CoreV1Api", "resource_quota")
# Owners whose own controller carries the workload's annotations.
_PARENT_KIND = {"ReplicaSet": "Deployment", "Job": "CronJob"}
_MAX_CHAIN = 4
"""Owners read above a Pod at most (a Deployment under an operator's resource is three)."""


@dataclass(frozen=True)
class OwnerAnnotations:
    """The annotations of a Pod's owning workload, and where they came from."""

    annotations: Mapping[str, str]
    workload: str | None = None
    """``Kind/namespace/name`` of the workload read, None for a naked Pod."""
    problem: str | None = None
    """Why the owner could not be read (then only the Pod's own annotations apply)."""
    vpa: frozenset[str] = frozenset()
    """The resources a VerticalPodAutoscaler of the workload sets on its Pods."""


class OwnerCache:
    """Resolves a Pod to its workload's annotations and its namespace's LimitRange and quota bounds."""

    def __init__(
        self,
        api_client: Any,
        keys: AnnotationKeys,
        lookup_timeout: float,
        watch_timeout_seconds: int,
        on_sync: Callable[[str, bool], None] = lambda kind, synced: None,
        on_lookup: Callable[[str], None] = lambda result: None,
        on_restart: Callable[[str, str, str], None] = lambda kind, again, cause: None,
    ) -> None:
        def workload(obj: dict[str, Any]) -> Entry:
            metadata = obj.get("metadata") or {}
            return Entry(keys.ours(metadata.get("annotations")) or _NO_ANNOTATIONS, controller_of(metadata))

        def limit_range(obj: dict[str, Any]) -> Entry:
            return Entry(_NO_ANNOTATIONS, extra=obj.get("spec") or {})

        def resource_quota(obj: dict[str, Any]) -> Entry:
            return Entry(_NO_ANNOTATIONS, extra={"metadata": {"name": (obj.get("metadata") or {}).get("name")},
                                                 "spec": obj.get("spec") or {}, "status": obj.get("status") or {}})

        self._lookup_timeout = lookup_timeout
        self._on_lookup = on_lookup
        self._reflectors = {
            kind.kind: Reflector.for_kind(api_client, kind, workload, watch_timeout_seconds, on_sync, on_restart)
            for kind in WORKLOAD_KINDS
        }
        self._limit_ranges = Reflector.for_kind(api_client, LIMIT_RANGES, limit_range, watch_timeout_seconds, on_sync,
                                                on_restart)
        self._quotas = Reflector.for_kind(api_client, RESOURCE_QUOTAS, resource_quota, watch_timeout_seconds, on_sync,
                                          on_restart)
        # VPA's admission runs after this webhook (its configuration's name sorts after ours) and
        # scales limits by its recommendation over the request it finds: the resources it will
        # set must be known before it runs. Without the CRD there is none.
        from kubernetes import client

        self._vpas = Reflector("VerticalPodAutoscaler",
                               partial(client.CustomObjectsApi(api_client).list_cluster_custom_object, *VPA),
                               lambda vpa: Entry(_NO_ANNOTATIONS, extra=vpa_controlled([vpa])),
                               watch_timeout_seconds, on_sync, optional=True, on_restart=on_restart)

    def start(self) -> None:
        for reflector in self._all():
            reflector.start()

    def stop(self) -> None:
        for reflector in self._all():
            reflector.stop()

    def _all(self) -> list[Reflector]:
        return [*self._reflectors.values(), self._limit_ranges, self._quotas, self._vpas]

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self._all())

    def bounds_for(self, namespace: str) -> RequestBounds:
        entries = self._limit_ranges.in_namespace(namespace)
        bounds = bounds_from_limit_ranges(e.extra for e in entries) if entries else NO_BOUNDS
        quotas = self._quotas.in_namespace(namespace)
        return bounds.with_quotas(e.extra for e in quotas) if quotas else bounds

    def owner_annotations(self, pod: Mapping[str, Any], namespace: str) -> OwnerAnnotations:
        owner = controller_of(pod.get("metadata") or {})
        if owner is None:
            return OwnerAnnotations(_NO_ANNOTATIONS)
        chain, problem = self._controller_chain(owner, namespace)
        if problem is not None:  # API trouble must not block admission: the Pod's own annotations
            return OwnerAnnotations(_NO_ANNOTATIONS, problem=problem)
        kind, name, entry = chain[0]
        if len(chain) > 1 and chain[1][0] == _PARENT_KIND.get(kind):
            kind, name, entry = chain[1]
        vpas = self._vpas.in_namespace(namespace)
        vpa = self._vpa_resources(vpas, namespace, vpa_targets([(k, n) for k, n, _ in chain])) if vpas else _NO_VPA
        workload = f"{kind}/{namespace}/{name}"
        if entry is None:
            return OwnerAnnotations(_NO_ANNOTATIONS, workload, vpa=vpa)
        return OwnerAnnotations(entry.annotations, workload, vpa=vpa)

    def _controller_chain(self, first: tuple[str, str],
                          namespace: str) -> tuple[list[tuple[str, str, Entry | None]], str | None]:
        """The Pod's controller and the controllers above it, each with its cache entry (None for
        a kind not followed, such as an Argo Rollout over its ReplicaSet: the chain stops there),
        or why one could not be read."""
        chain: list[tuple[str, str, Entry | None]] = []
        seen: set[tuple[str, str]] = set()
        owner: tuple[str, str] | None = first
        while owner is not None and len(chain) < _MAX_CHAIN and owner not in seen:
            seen.add(owner)
            kind, name = owner
            try:
                entry = self._entry(kind, namespace, name)
            except Exception as error:  # noqa: BLE001  -- said in the answer's warning
                self._on_lookup("error")
                return chain, f"could not read owner {kind} {namespace}/{name}: {one_line(error)}"
            chain.append((kind, name, entry))
            owner = entry.controller if entry is not None else None
        return chain, None

    @staticmethod
    def _vpa_resources(vpas: list[Entry], namespace: str, targets: list[tuple[str, str]]) -> frozenset[str]:
        return frozenset(resource for vpa in vpas for kind, name in targets
                         for resource in vpa.extra.get((kind, namespace, name), ()))

    def _entry(self, kind: str, namespace: str, name: str) -> Entry | None:
        reflector = self._reflectors.get(kind)
        if reflector is None:
            return None  # an owner kind we do not follow (ReplicationController, custom resources)
        entry: Entry | None = reflector.get(namespace, name)
        if entry is not None:
            self._on_lookup("hit")
            return entry
        self._on_lookup("miss")
        fetched: Entry | None = reflector.fetch(namespace, name, self._lookup_timeout)
        return fetched


class NoCluster:
    """Stands in for OwnerCache when no API server is configured: Pod annotations only."""

    synced = True

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def bounds_for(self, namespace: str) -> RequestBounds:
        return NO_BOUNDS

    def owner_annotations(self, pod: Mapping[str, Any], namespace: str) -> OwnerAnnotations:
        return OwnerAnnotations(_NO_ANNOTATIONS)
