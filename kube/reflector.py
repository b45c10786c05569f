"""The list-then-watch loop (client-go's reflector pattern) over the real ``kubernetes`` client:
one kind across all namespaces, kept as a namespace -> name -> entry map. The webhook's owner
caches and the scheduler extender's node and Pod views are built on it."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from kube.background import Trouble
from kube.client import decoded, found, one_line, without_managed_fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchedKind:
    kind: str
    api: str
    """Name of the kubernetes client API class (``AppsV1Api``)."""
    plural: str
    """Function-name stem of the client (``replica_set`` for list_replica_set_for_all_namespaces)."""


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class Reflector:
    """List, then watch, one kind across all namespaces into a namespace -> name -> Entry map.

    ``list_fn`` is a kubernetes client list function (it takes ``watch``, ``resource_version``,
    ``limit``...); ``extract(obj)`` is what the cache keeps of an object (None: nothing, so
    ``get`` misses); ``read_fn`` (name, namespace) fills cache misses. ``on_change(namespace,
    name, digest(object) or None)`` and ``on_reset()`` let a caller keep its own index in step (a
    relist calls ``on_reset`` then ``on_change`` for every object). ``digest`` (default: the whole
    object) is what the caller's index takes of an object: a relist holds it for every object of
    the kind until the last page is in, so a caller that needs a little of each should say so.
    ``optional``: a custom resource whose CRD may not be installed; while the API server answers
    404 for it, the cache is synced and empty, and it lists again every ``watch_timeout_seconds``
    (a CRD installed later is picked up without a restart). ``batch()``: what a relist's
    ``on_reset`` and all its ``on_change`` calls run within (the caller's lock), so a reader of the
    caller's index never sees it half rebuilt.
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
        digest: Callable[[dict[str, Any]], Any] = lambda obj: obj,
        optional: bool = False,
        batch: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        self.name = name
        self._optional = optional
        self._list = list_fn
        self._read = read_fn
        self._extract = extract
        self._watch_timeout = watch_timeout_seconds
        self._on_sync = on_sync
        self._on_change = on_change
        self._on_reset = on_reset
        self._digest = digest
        self._batch = batch
        self._items: dict[str, dict[str, Any]] = {}
        self._apply = threading.Lock()
        self._at: int | None = None
        """The resourceVersion the cache stands at: its last list's, or the last watch event's."""
        self._stop = threading.Event()
        # Retried with a backoff of up to 30 s: an API server down for an hour would be 120 lines
        # a cache, each the client's whole answer (status, headers, body) over several lines.
        self._trouble = Trouble(log, f"{name} listed again")
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
        obj = None if self._read is None else found(self._read, name, namespace, _request_timeout=timeout)
        if obj is None:
            return None
        entry = self._extract(without_managed_fields(obj))
        if entry is not None:
            self._items.setdefault(namespace, {})[name] = entry
        return entry

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self._relist()
                backoff = 0.5
                self._trouble.succeeded()
                while not self._stop.is_set():
                    version = self._watch(version)
            except Gone:
                log.info("%s watch expired; listing again", self.name)
            except Exception as error:  # noqa: BLE001  -- any API failure: retry, never die
                if self._optional and getattr(error, "status", None) == 404:
                    self._not_installed()
                    self._stop.wait(self._watch_timeout)
                    continue
                self._trouble.failed(f"{self.name} list/watch failed ({one_line(error)}); retrying with a backoff "
                                     "of up to 30s", kind="failing")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _not_installed(self) -> None:
        """An optional kind the API server does not serve: no objects, and that is all there is."""
        with self._apply, self._batch():
            # What a caller indexed from an earlier list goes too (the CRD was uninstalled): its
            # own index may hold what this cache does not (an extract that keeps nothing).
            self._items, self._at = {}, None
            if self._on_reset is not None:
                self._on_reset()
        if not self.synced.is_set():
            self.synced.set()
            self._on_sync(self.name, True)
            log.info("%s is not served by the API server (its CRD is not installed): none", self.name)

    def resync(self) -> None:
        """List again now, in the caller's thread, and apply it (what a new leader does before it
        serves): watch events older than this list are dropped when they arrive afterwards, and a
        list older than the events the watch applied while it was read is dropped itself (the
        cache is newer already)."""
        self._relist()

    def _relist(self) -> str:
        items: dict[str, dict[str, Any]] = {}
        listed_digests: list[tuple[str, str, Any]] = []
        token: str | None = None
        while True:
            response = self._list(limit=500, _continue=token, _preload_content=False, _request_timeout=60)
            page = decoded(response)
            for obj in map(without_managed_fields, page.get("items") or []):
                metadata = obj.get("metadata") or {}
                namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
                entry = self._extract(obj)
                if entry is not None:
                    items.setdefault(namespace, {})[name] = entry
                if self._on_change is not None:
                    listed_digests.append((namespace, name, self._digest(obj)))
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                break
        listed = str((page.get("metadata") or {}).get("resourceVersion", ""))
        with self._apply, self._batch():
            number = _number(listed)
            if number is not None and self._at is not None and number < self._at:
                # The watch applied newer events while this list was paged and read (a resync
                # beside the watch): applied now, it would take the cache back in time, and the
                # watch, already past them, never sends those events again.
                return listed
            self._items = items
            self._at = number
            if self._on_change is not None:
                if self._on_reset is not None:
                    self._on_reset()
                for namespace, name, digest in listed_digests:
                    self._on_change(namespace, name, digest)
        if not self.synced.is_set():
            self.synced.set()
            self._on_sync(self.name, True)
            log.info("%s cache synced: %d objects", self.name, sum(map(len, items.values())))
        return listed

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
                obj = without_managed_fields(event.get("object") or {})
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                metadata = obj.get("metadata") or {}
                version = str(metadata.get("resourceVersion", version))
                bookmark = kind == "BOOKMARK"
                namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
                entry = None if kind == "DELETED" or bookmark else self._extract(obj)
                digest = None if kind == "DELETED" or bookmark or self._on_change is None else self._digest(obj)
                with self._apply:
                    # resourceVersions are etcd revisions in practice; an event the cache already
                    # stands past (a concurrent resync listed after it, or a watch started again
                    # from a list that was dropped) must not take an object back in time.
                    number = _number(version)
                    if self._at is not None and number is not None and number <= self._at:
                        continue
                    if number is not None:
                        self._at = number  # a bookmark too: every event up to it has arrived
                    if bookmark:
                        continue
                    if entry is None:
                        self._items.get(namespace, {}).pop(name, None)
                    else:
                        self._items.setdefault(namespace, {})[name] = entry
                    if self._on_change is not None:
                        self._on_change(namespace, name, digest)
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


def _number(version: str) -> int | None:
    try:
        return int(version)
    except ValueError:
        return None
