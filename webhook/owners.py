"""Watch-backed caches of what admission needs from the cluster: workload annotations, the
ReplicaSet -> Deployment and Job -> CronJob links, LimitRanges and ResourceQuotas.

Each kind is one list-then-watch loop (the client-go reflector pattern) over the real
``kubernetes`` client, keeping only the few fields admission reads. A Pod admitted milliseconds
after its Deployment was created may find its ReplicaSet missing from the cache: then one GET
with a short timeout fills the gap, so the hot path makes no API call once caches are warm.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from oversale.annotations import AnnotationKeys
from oversale.limitrange import NO_BOUNDS, RequestBounds, bounds_from_limit_ranges
from oversale.pods import controller_of

log = logging.getLogger(__name__)

_NO_ANNOTATIONS: Mapping[str, str] = {}


@dataclass(frozen=True)
class Entry:
    """What the cache remembers of one object."""

    annotations: Mapping[str, str]
    controller: tuple[str, str] | None = None
    extra: Any = None


@dataclass(frozen=True)
class WatchedKind:
    kind: str
    api: str
    """Name of the kubernetes client API class (``AppsV1Api``)."""
    plural: str
    """Function-name stem of the client (``replica_set`` for list_replica_set_for_all_namespaces)."""


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


@dataclass(frozen=True)
class OwnerAnnotations:
    """The annotations of a Pod's owning workload, and where they came from."""

    annotations: Mapping[str, str]
    workload: str | None = None
    """``Kind/namespace/name`` of the workload read, None for a naked Pod."""
    problem: str | None = None
    """Why the owner could not be read (then only the Pod's own annotations apply)."""


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class Reflector:
    """List, then watch, one kind across all namespaces into a namespace -> name -> Entry map.

    ``list_fn`` is a kubernetes client list function (it takes ``watch``, ``resource_version``,
    ``limit``...); ``read_fn`` (name, namespace) fills cache misses. ``on_change(namespace, name,
    entry or None)`` and ``on_reset()`` let a caller keep its own index in step (a relist calls
    ``on_reset`` then ``on_change`` for every object).
    """

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        extract: Callable[[dict[str, Any]], Any],
        watch_timeout_seconds: int,
        on_sync: Callable[[str, bool], None] = lambda kind, synced: None,
        read_fn: Callable[..., Any] | None = None,
        on_change: Callable[[str, str, Any], None] | None = None,
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._list = list_fn
        self._read = read_fn
        self._extract = extract
        self._watch_timeout = watch_timeout_seconds
        self._on_sync = on_sync
        self._on_change = on_change
        self._on_reset = on_reset
        self._items: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{name}", daemon=True)
        on_sync(name, False)

    @classmethod
    def for_kind(cls, api_client: Any, kind: WatchedKind, extract: Callable[[dict[str, Any]], Any],
                 watch_timeout_seconds: int, on_sync: Callable[[str, bool], None] = lambda k, s: None) -> Reflector:
        """A reflector over a namespaced kind of the typed client (``list_<plural>_for_all_namespaces``)."""
        from kubernetes import client

        api = getattr(client, kind.api)(api_client)
        return cls(kind.kind, getattr(api, f"list_{kind.plural}_for_all_namespaces"), extract, watch_timeout_seconds,
                   on_sync, read_fn=getattr(api, f"read_namespaced_{kind.plural}"))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def get(self, namespace: str, name: str) -> Any:
        return self._items.get(namespace, {}).get(name)

    def in_namespace(self, namespace: str) -> list[Any]:
        return list(self._items.get(namespace, {}).values())

    def fetch(self, namespace: str, name: str, timeout: float) -> Any:
        """One GET for a cache miss; the result is cached. None when the object does not exist."""
        from kubernetes.client.exceptions import ApiException

        if self._read is None:
            return None
        try:
            response = self._read(name, namespace, _preload_content=False, _request_timeout=timeout)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        entry = self._extract(json.loads(response.data))
        self._items.setdefault(namespace, {})[name] = entry
        return entry

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self._relist()
                backoff = 0.5
                while not self._stop.is_set():
                    version = self._watch(version)
            except Gone:
                log.info("%s watch expired; listing again", self.name)
            except Exception as error:  # noqa: BLE001  -- any API failure: retry, never die
                log.warning("%s list/watch failed (%s); retrying in %.1fs", self.name, error, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _relist(self) -> str:
        items: dict[str, dict[str, Any]] = {}
        token: str | None = None
        while True:
            response = self._list(limit=500, _continue=token, _preload_content=False, _request_timeout=60)
            page = json.loads(response.data)
            for obj in page.get("items") or []:
                metadata = obj.get("metadata") or {}
                items.setdefault(metadata.get("namespace", ""), {})[metadata.get("name", "")] = self._extract(obj)
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                break
        self._items = items
        if self._on_change is not None:
            if self._on_reset is not None:
                self._on_reset()
            for namespace, by_name in items.items():
                for name, entry in by_name.items():
                    self._on_change(namespace, name, entry)
        if not self.synced.is_set():
            self.synced.set()
            self._on_sync(self.name, True)
            log.info("%s cache synced: %d objects", self.name, sum(map(len, items.values())))
        return str((page.get("metadata") or {}).get("resourceVersion", ""))

    def _watch(self, version: str) -> str:
        response = self._list(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _preload_content=False,
            _request_timeout=(10, self._watch_timeout + 30),
        )
        try:
            for line in _lines(response):
                event = json.loads(line)
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                metadata = obj.get("metadata") or {}
                version = str(metadata.get("resourceVersion", version))
                if kind == "BOOKMARK":
                    continue
                namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
                entry = None if kind == "DELETED" else self._extract(obj)
                if entry is None:
                    self._items.get(namespace, {}).pop(name, None)
                else:
                    self._items.setdefault(namespace, {})[name] = entry
                if self._on_change is not None:
                    self._on_change(namespace, name, entry)
        finally:
            response.release_conn()
        return version


def _lines(response: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in response.stream(65536, decode_content=True):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
    if buffer.strip():
        yield buffer


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
    ) -> None:
        def workload(obj: dict[str, Any]) -> Entry:
            metadata = obj.get("metadata") or {}
            return Entry(keys.ours(metadata.get("annotations")) or _NO_ANNOTATIONS, controller_of(metadata))

        def limit_range(obj: dict[str, Any]) -> Entry:
            return Entry(_NO_ANNOTATIONS, extra=obj.get("spec") or {})

        def resource_quota(obj: dict[str, Any]) -> Entry:
            return Entry(_NO_ANNOTATIONS, extra={"spec": obj.get("spec") or {}, "status": obj.get("status") or {}})

        self._lookup_timeout = lookup_timeout
        self._on_lookup = on_lookup
        self._reflectors = {
            kind.kind: Reflector.for_kind(api_client, kind, workload, watch_timeout_seconds, on_sync)
            for kind in WORKLOAD_KINDS
        }
        self._limit_ranges = Reflector.for_kind(api_client, LIMIT_RANGES, limit_range, watch_timeout_seconds, on_sync)
        self._quotas = Reflector.for_kind(api_client, RESOURCE_QUOTAS, resource_quota, watch_timeout_seconds, on_sync)

    def start(self) -> None:
        for reflector in self._all():
            reflector.start()

    def stop(self) -> None:
        for reflector in self._all():
            reflector.stop()

    def _all(self) -> list[Reflector]:
        return [*self._reflectors.values(), self._limit_ranges, self._quotas]

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self._all())

    def wait_synced(self, timeout: float) -> bool:
        return all(r.synced.wait(timeout) for r in self._all())

    def bounds_for(self, namespace: str) -> RequestBounds:
        entries = self._limit_ranges.in_namespace(namespace)
        bounds = bounds_from_limit_ranges(e.extra for e in entries) if entries else NO_BOUNDS
        quotas = self._quotas.in_namespace(namespace)
        return bounds.with_quotas(e.extra for e in quotas) if quotas else bounds

    def owner_annotations(self, pod: Mapping[str, Any], namespace: str) -> OwnerAnnotations:
        owner = controller_of(pod.get("metadata") or {})
        if owner is None:
            return OwnerAnnotations(_NO_ANNOTATIONS)
        kind, name = owner
        try:
            entry = self._entry(kind, namespace, name)
            parent_kind = _PARENT_KIND.get(kind)
            if entry is not None and entry.controller and entry.controller[0] == parent_kind:
                kind, name = entry.controller
                entry = self._entry(kind, namespace, name)
        except Exception as error:  # noqa: BLE001  -- API trouble must not block admission
            self._on_lookup("error")
            return OwnerAnnotations(_NO_ANNOTATIONS, problem=f"could not read owner {kind} {namespace}/{name}: {error}")
        if entry is None:
            return OwnerAnnotations(_NO_ANNOTATIONS, f"{kind}/{namespace}/{name}")
        return OwnerAnnotations(entry.annotations, f"{kind}/{namespace}/{name}")

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

    def wait_synced(self, timeout: float) -> bool:
        return True

    def bounds_for(self, namespace: str) -> RequestBounds:
        return NO_BOUNDS

    def owner_annotations(self, pod: Mapping[str, Any], namespace: str) -> OwnerAnnotations:
        return OwnerAnnotations(_NO_ANNOTATIONS)


def load_api_client(mode: str) -> Any | None:
    """A kubernetes ApiClient from in-cluster config, else the kubeconfig; None when neither exists
    or ``mode`` is ``off``."""
    if mode == "off":
        return None
    from kubernetes import client, config

    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException:
        pass
    try:
        configuration = client.Configuration()
        config.load_kube_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except (config.ConfigException, OSError, TypeError, ValueError):
        return None
