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
from kube.client import GarbledAnswer, answered, decoded, found, one_line, without_managed_fields

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


class WatchCut(Exception):
    """The watch's stream stopped mid-way (a load balancer's idle timeout, an API server
    restarting, a silent connection): the events up to the cut were applied, so the cache
    watches again from the last of them, as client-go's reflector does, rather than listing
    again. ``at``: the resourceVersion reached; ``progressed``: whether any event arrived."""

    def __init__(self, why: str, at: str, progressed: bool) -> None:
        super().__init__(why)
        self.at, self.progressed = at, progressed


class WatchError(Exception):
    """An ERROR event: the API server ended the watch with a Status (other than 410 Gone)."""

    def __init__(self, status: dict[str, Any]) -> None:
        code = status.get("code")
        self.code = code if isinstance(code, int) else None
        # Not ``status``: one_line would tell it as "HTTP 500" and drop the API server's words.
        super().__init__(f"watch error {self.code or ''}: {status.get('message')}".replace(" :", ":"))


def _momentary(error: BaseException) -> bool:
    """A failure of the road to the API server, or one the API server says is momentary (429
    Too Many Requests, 5xx): the same watch is worth asking again.

    >>> timed_out = WatchError({"code": 500, "message": "etcdserver: request timed out"})
    >>> _momentary(timed_out), one_line(timed_out)
    (True, 'watch error 500: etcdserver: request timed out')
    >>> _momentary(WatchError({"code": 403, "message": "pods is forbidden"}))
    False
    >>> no_code = WatchError({"message": "unknown"})
    >>> _momentary(no_code), one_line(no_code)
    (False, 'watch error: unknown')
    >>> import urllib3
    >>> _momentary(urllib3.exceptions.MaxRetryError(None, "/api/v1/pods", "connection refused"))  # unreachable
    True
    """
    import urllib3

    status = error.code if isinstance(error, WatchError) else getattr(error, "status", None)
    return isinstance(error, urllib3.exceptions.HTTPError) or (
        isinstance(status, int) and (status == 429 or status >= 500))


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
    caller's index never sees it half rebuilt. ``on_restart(kind, again, cause)``: each time the
    cache lists its kind again (``again`` "list"; ``cause`` "list failed": the list before it
    failed, the first one too; "expired": its watch's resourceVersion is gone (410); "refused":
    its watch was refused for good or answered with no events) or watches it again from where it
    stands ("watch"; "cut": the stream ended early; "refused for now": 429, 5xx, the API server
    unreachable), for a metric (:class:`kube.cache_metrics.CacheRestarts`).
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
        on_restart: Callable[[str, str, str], None] = lambda kind, again, cause: None,
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
        self._on_restart = on_restart
        self._items: dict[str, dict[str, Any]] = {}
        self._apply = threading.Lock()
        self._at: int | None = None
        """The resourceVersion the cache stands at: its last list's, or the last watch event's."""
        self._stop = threading.Event()
        # Retried with a backoff of up to 30 s: an API server down for an hour would be 120 lines
        # a cache, each the client's whole answer (status, headers, body) over several lines.
        self._trouble = Trouble(log, f"{name} listed again")
        self._watch_trouble = Trouble(log, f"{name} watched again")
        self._backoff = 0.5
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{name}", daemon=True)
        on_sync(name, False)

    @classmethod
    def for_kind(cls, api_client: Any, kind: WatchedKind, extract: Callable[[dict[str, Any]], Any],
                 watch_timeout_seconds: int, on_sync: Callable[[str, bool], None] = lambda k, s: None,
                 on_restart: Callable[[str, str, str], None] = lambda kind, again, cause: None) -> Reflector:
        """A reflector over a namespaced kind of the typed client (``list_<plural>_for_all_namespaces``)."""
        from kubernetes import client

        api = getattr(client, kind.api)(api_client)
        return cls(kind.kind, getattr(api, f"list_{kind.plural}_for_all_namespaces"), extract, watch_timeout_seconds,
                   on_sync, read_fn=getattr(api, f"read_namespaced_{kind.plural}"), on_restart=on_restart)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def resource_version(self) -> int | None:
        """The resourceVersion the cache stands at (its last list's, or the last watch event's,
        a bookmark's too); None before the first list."""
        return self._at

    def get(self, namespace: str, name: str) -> Any:
        return self._items.get(namespace, {}).get(name)

    def in_namespace(self, namespace: str) -> list[Any]:
        return list(self._items.get(namespace, {}).values())

    def fetch(self, namespace: str, name: str, timeout: float) -> Any:
        """One GET for a cache miss; the result is cached unless the watch has brought the cache
        past it meanwhile. None when the object does not exist."""
        obj = None if self._read is None else found(self._read, name, namespace, _request_timeout=timeout)
        if obj is None:
            return None
        entry = self._extract(without_managed_fields(obj))
        if entry is not None:
            number = _number(str((obj.get("metadata") or {}).get("resourceVersion", "")))
            with self._apply:
                # The watch may have applied a newer version of the object, or its deletion, while
                # the answer was on its way: cached, this one would stand until the object next
                # changes. An object the synced cache misses at or below its version is just that.
                if self._at is None or number is None or number > self._at:
                    self._items.setdefault(namespace, {})[name] = entry
        return entry

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist()
            except Exception as error:  # noqa: BLE001  -- any API failure: retry, never die
                if self._not_served(error):
                    continue
                self._trouble.failed(f"{self.name} list failed ({one_line(error)}); retrying with a backoff of up to "
                                     "30s", kind="failing")
                self._on_restart(self.name, "list", "list failed")
                self._back_off()
                continue
            self._trouble.succeeded()
            self._watch_from(version)

    def _watch_from(self, version: str) -> None:
        """Watch, and watch again, from where the cache stands; return when it is to be listed
        again. A watch cut (a load balancer's idle timeout, an API server restarting, which cuts
        every watch at once), or refused for a moment (the API server unreachable, overloaded:
        429, 5xx), lost nothing the cache holds: it is watched again from its last event, as
        client-go's reflector does, not listed again (a relist of every Pod of a large cluster is
        the costliest read there is, and the last thing an overloaded API server needs). At
        once when the watch delivered events; after the backoff otherwise, so a proxy that cuts
        every stream is not asked again in a loop. Only a resourceVersion too old to watch from
        (410 Gone) lists again at once. A watch refused for good or answered with no events
        (RBAC that lets the list through but not the watch, a proxy's page) lists again after
        the backoff, which only a working watch resets: the cache stays as fresh as the list
        allows, without a list every half second."""
        while not self._stop.is_set():
            try:
                version = self._watch(version)
                self._watched()
                continue
            except WatchCut as cut:
                version = cut.at
                if cut.progressed:  # the stream worked: _watch reset the backoff at its first event
                    log.info("%s watch cut (%s); watching again from resourceVersion %s", self.name, cut, version)
                    self._on_restart(self.name, "watch", "cut")
                    continue
                said, again, kind = f"watch cut before any event ({cut})", True, "cut"
            except Gone:
                log.info("%s watch expired; listing again", self.name)
                self._on_restart(self.name, "list", "expired")
                return
            except Exception as error:  # noqa: BLE001  -- any API failure: retry, never die
                if self._not_served(error):  # its CRD was uninstalled
                    return
                said, again = f"watch failed ({one_line(error)})", _momentary(error)
                kind = "refused for now" if again else "refused"
            then = f"watching again from resourceVersion {version}" if again else "listing again"
            self._watch_trouble.failed(f"{self.name} {said}; {then} with a backoff of up to 30s", kind=kind)
            self._on_restart(self.name, "watch" if again else "list", kind)
            self._back_off()
            if not again:
                return

    def _back_off(self) -> None:
        self._stop.wait(self._backoff)
        self._backoff = min(self._backoff * 2, 30.0)

    def _watched(self) -> None:
        """A watch delivered an event, or ran to its end: the list and the watch both work."""
        self._watch_trouble.succeeded()
        self._backoff = 0.5

    def _not_served(self, error: BaseException) -> bool:
        """Whether ``error`` is the 404 of an optional kind; if so the cache holds none of it and
        is listed again after ``watch_timeout_seconds``."""
        if not (self._optional and getattr(error, "status", None) == 404):
            return False
        self._not_installed()
        self._stop.wait(self._watch_timeout)
        return True

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
        try:
            items, listed_digests, listed = self._read_list(paged=True)
        except _ContinueExpired:
            # A page is asked for at the revision of the first, which etcd keeps until its next
            # compaction (every 5 minutes by default): pages read slower than that would expire
            # again if asked again from the first. One answer cannot expire; client-go's pager
            # falls back to it too.
            log.info("%s list's continue token expired before its last page; listing whole", self.name)
            items, listed_digests, listed = self._read_list(paged=False)
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

    def _read_list(self, paged: bool) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str, Any]], str]:
        """Every object of the kind, listed in pages of 500 or, not ``paged``, in one answer: the
        cache's entries (namespace -> name -> entry), each object's digest for ``on_change``
        where there is one, and the list's resourceVersion. Raises _ContinueExpired where a
        page after the first is refused as too old (410)."""
        items: dict[str, dict[str, Any]] = {}
        listed_digests: list[tuple[str, str, Any]] = []
        token: str | None = None
        while True:
            try:
                # Whole, the API server reads every object before it sends the first byte.
                response = self._list(limit=500, _continue=token, _preload_content=False, _request_timeout=60) \
                    if paged else self._list(_preload_content=False, _request_timeout=(10, 300))
            except Exception as error:
                if token is not None and getattr(error, "status", None) == 410:
                    raise _ContinueExpired() from error
                raise
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
                return items, listed_digests, str((page.get("metadata") or {}).get("resourceVersion", ""))

    def _watch(self, version: str) -> str:
        response = self._list(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _preload_content=False,
            _request_timeout=(10, self._watch_timeout + 30),
        )
        import urllib3

        progressed = False
        try:
            for line in _lines(response):
                event = _event(line, response)
                obj = without_managed_fields(event.get("object") or {})
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise WatchError(obj)
                if not progressed:
                    progressed = True
                    self._watched()
                version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                self._apply_event(kind, obj, version)
        except _Unfinished as cut:
            raise WatchCut(str(cut), version, progressed) from None
        # Nothing the API server said was wrong, only the road to it.
        except urllib3.exceptions.ProtocolError:
            raise WatchCut("the connection dropped", version, progressed) from None
        except urllib3.exceptions.ReadTimeoutError:
            # The API server ends a watch at its timeoutSeconds; silent past that and a grace, the
            # connection is dead without either side having closed it.
            raise WatchCut(f"silent for {self._watch_timeout + 30}s", version, progressed) from None
        finally:
            response.release_conn()
        return version

    def _apply_event(self, kind: Any, obj: dict[str, Any], version: str) -> None:
        """One ADDED, MODIFIED, DELETED or BOOKMARK event of ``version`` applied to the cache and
        told to ``on_change``, unless the cache stands at or past it already."""
        metadata = obj.get("metadata") or {}
        bookmark = kind == "BOOKMARK"
        namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
        entry = None if kind == "DELETED" or bookmark else self._extract(obj)
        digest = None if kind == "DELETED" or bookmark or self._on_change is None else self._digest(obj)
        with self._apply:
            # resourceVersions are etcd revisions in practice; an event the cache already stands
            # past (a concurrent resync listed after it, or a watch started again from a list that
            # was dropped) must not take an object back in time.
            number = _number(version)
            if self._at is not None and number is not None and number <= self._at:
                return
            if number is not None:
                self._at = number  # a bookmark too: every event up to it has arrived
            if bookmark:
                return
            if entry is None:
                self._items.get(namespace, {}).pop(name, None)
            else:
                self._items.setdefault(namespace, {})[name] = entry
            if self._on_change is not None:
                self._on_change(namespace, name, digest)


class _ContinueExpired(Exception):
    """A list's page after the first was refused: its continue token is older than etcd keeps."""


class _Unfinished(Exception):
    """The stream ended part of the way into an event."""


def _lines(response: Any) -> Iterator[bytes]:
    """The watch's events, one JSON document a line. The API server ends each with a newline, so
    a stream that ends on a part of a line was cut in the middle of an event; one that is no JSON
    at all (a proxy's page, with no newline to split it by) is told as such at once.

    >>> class Cut:
    ...     headers = {"Content-Type": "application/json"}
    ...     def stream(self, amount, decode_content):
    ...         yield b'{"type": "ADDED", "object": {}}\\n{"type": "MODI'
    >>> lines = _lines(Cut())
    >>> next(lines)
    b'{"type": "ADDED", "object": {}}'
    >>> next(lines)
    Traceback (most recent call last):
    ...
    kube.reflector._Unfinished: the stream ended 14 bytes into an event
    """
    kind = (getattr(response, "headers", None) or {}).get("Content-Type") or ""
    if kind and "json" not in kind:
        raise _garbled(response, "answered no watch stream")
    buffer = b""
    for chunk in response.stream(65536, decode_content=True):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
    if buffer.strip():
        raise _Unfinished(f"the stream ended {len(buffer)} bytes into an event")


def _event(line: bytes, response: Any) -> dict[str, Any]:
    """One watch event; :class:`GarbledAnswer` for a whole line that is none (a proxy that lets
    the list through but answers the stream itself), which a watch again would not mend.

    >>> class Stream:
    ...     url, headers = "/api/v1/pods?watch=true", {"Content-Type": "text/html"}
    >>> _event(b'{"type": "ADDED", "object": {}}', Stream())["type"]
    'ADDED'
    >>> _event(b"<html>Sign in</html>", Stream())
    Traceback (most recent call last):
    ...
    kube.client.GarbledAnswer: the watch of /api/v1/pods sent a line that is no watch event (text/html, 20 bytes)
    >>> _event(b'{"object": {}}', Stream())
    Traceback (most recent call last):
    ...
    kube.client.GarbledAnswer: the watch of /api/v1/pods sent a line that is no watch event (text/html, 14 bytes)
    """
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise _garbled(response, "sent a line that is no watch event", f", {len(line)} bytes")
    return event


def _garbled(response: Any, said: str, size: str = "") -> GarbledAnswer:
    path, kind = answered(response)
    return GarbledAnswer(f"the watch of {path} {said} ({kind}{size})")


def _number(version: str) -> int | None:
    try:
        return int(version)
    except ValueError:
        return None
