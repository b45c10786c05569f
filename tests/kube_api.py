"""A small Kubernetes API server double that speaks the real wire format.

The project's code talks to it through the real ``kubernetes`` client (a kubeconfig points at
it), so list pagination, watch streams (chunked JSON lines, bookmarks, 410 Gone), GET, PATCH, PUT
and status codes all go over HTTP as they would against a real API server. Every request is
logged, so tests can count what the code under test asked for.

This is the one API-server test double of the project; extend it rather than writing another.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import copy
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch
from kubernetes.utils import parse_quantity

# key -> (path prefix, plural in the URL, kind, namespaced). The key is the plural except where two
# groups share one (metrics.k8s.io's pods and nodes).
RESOURCES: dict[str, tuple[str, str, str, bool]] = {
    "pods": ("/api/v1", "pods", "Pod", True),
    "nodes": ("/api/v1", "nodes", "Node", False),
    "limitranges": ("/api/v1", "limitranges", "LimitRange", True),
    "persistentvolumeclaims": ("/api/v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    "persistentvolumes": ("/api/v1", "persistentvolumes", "PersistentVolume", False),
    "resourcequotas": ("/api/v1", "resourcequotas", "ResourceQuota", True),
    "namespaces": ("/api/v1", "namespaces", "Namespace", False),
    "secrets": ("/api/v1", "secrets", "Secret", True),
    "events": ("/api/v1", "events", "Event", True),
    "replicasets": ("/apis/apps/v1", "replicasets", "ReplicaSet", True),
    "deployments": ("/apis/apps/v1", "deployments", "Deployment", True),
    "statefulsets": ("/apis/apps/v1", "statefulsets", "StatefulSet", True),
    "daemonsets": ("/apis/apps/v1", "daemonsets", "DaemonSet", True),
    "jobs": ("/apis/batch/v1", "jobs", "Job", True),
    "cronjobs": ("/apis/batch/v1", "cronjobs", "CronJob", True),
    "horizontalpodautoscalers": ("/apis/autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
                                 True),
    "leases": ("/apis/coordination.k8s.io/v1", "leases", "Lease", True),
    "mutatingwebhookconfigurations": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations",
                                      "MutatingWebhookConfiguration", False),
    "validatingwebhookconfigurations": ("/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations",
                                        "ValidatingWebhookConfiguration", False),
    "bindings": ("/api/v1", "bindings", "Binding", True),
    "noderesourcetopologies": ("/apis/topology.node.k8s.io/v1alpha2", "noderesourcetopologies",
                               "NodeResourceTopology", False),
    "podmetrics": ("/apis/metrics.k8s.io/v1beta1", "pods", "PodMetrics", True),
    "nodemetrics": ("/apis/metrics.k8s.io/v1beta1", "nodes", "NodeMetrics", False),
    "poddisruptionbudgets": ("/apis/policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    "csinodes": ("/apis/storage.k8s.io/v1", "csinodes", "CSINode", False),
    "volumeattachments": ("/apis/storage.k8s.io/v1", "volumeattachments", "VolumeAttachment", False),
    "verticalpodautoscalers": ("/apis/autoscaling.k8s.io/v1", "verticalpodautoscalers", "VerticalPodAutoscaler",
                               True),
}
# GET /version as a v1.33 API server answers it (the client's VersionInfo requires every field).
VERSION = {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "0" * 40, "gitTreeState": "clean",
           "buildDate": "2025-04-23T13:05:48Z", "goVersion": "go1.24.2", "compiler": "gc", "platform": "linux/amd64"}
API_VERSIONS = {
    "/api/v1": "v1",
    "/apis/apps/v1": "apps/v1",
    "/apis/batch/v1": "batch/v1",
    "/apis/autoscaling/v2": "autoscaling/v2",
    "/apis/coordination.k8s.io/v1": "coordination.k8s.io/v1",
    "/apis/admissionregistration.k8s.io/v1": "admissionregistration.k8s.io/v1",
    "/apis/metrics.k8s.io/v1beta1": "metrics.k8s.io/v1beta1",
    "/apis/topology.node.k8s.io/v1alpha2": "topology.node.k8s.io/v1alpha2",
    "/apis/autoscaling.k8s.io/v1": "autoscaling.k8s.io/v1",
    "/apis/policy/v1": "policy/v1",
    "/apis/storage.k8s.io/v1": "storage.k8s.io/v1",
}
# metav1.MicroTime reads only RFC3339Micro ("2006-01-02T15:04:05.000000Z07:00"): Go's time.Parse wants
# exactly the six digits that layout has, so a stamp to the second is refused with 400.
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
MICRO_TIME_FIELDS = {"leases": ("acquireTime", "renewTime")}
# What GET /api/v1 lists besides each core plural (the subresources the code looks for).
CORE_SUBRESOURCES = ("pods/status", "pods/resize", "pods/eviction", "nodes/status")


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    query: dict[str, list[str]]
    at: float = field(default_factory=time.monotonic, compare=False)
    """When the request arrived (``time.monotonic``): how long a client waited between tries."""

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") == ["true"]


class FakeKubeAPI:
    """Objects by plural and (namespace, name); a global resourceVersion; an event log per plural."""

    def __init__(self, port: int = 0) -> None:
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {p: {} for p in RESOURCES}
        self._events: dict[str, list[tuple[int, str, dict[str, Any]]]] = {p: [] for p in RESOURCES}
        self._oldest: dict[str, int] = {p: 0 for p in RESOURCES}
        self._forgotten: dict[str, list[tuple[int, str]]] = {p: [] for p in RESOURCES}
        """The version and namespace of each event compaction forgot."""
        self._version = 100
        self._changed = threading.Condition()
        self._watches_paused = False
        self._stopping = False
        self.requests: list[Logged] = []
        self.token = f"token-{uuid.uuid4().hex}"
        """The kubeconfig's bearer token, this double's own: a process started against another
        double (whose port this one got after it stopped) is refused with 401, as another
        cluster's API server would refuse it, instead of taking this double's Lease."""
        self.users: dict[str, str] = {self.token: "kubernetes-admin"}
        """Bearer token -> username, as the API server's authenticator would map them. A
        request without a token is ``system:anonymous``; one with a token not here gets 401."""
        self.mutating: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        self.validating: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        """plural -> a webhook: takes an AdmissionReview, returns its AdmissionResponse."""
        self.concurrent_writes: dict[str, int] = {}
        """plural, or ``plural/name`` for one object -> how many of the next updates find the
        object changed by another writer first; ``plural/name`` also races a create of it: the
        other writer created it just before (409 AlreadyExists)."""
        self.written_meanwhile: dict[str, Callable[[dict[str, Any]], None]] = {}
        """plural -> what that other writer changes in the object (in place); without it, it
        writes the object back as it was (only its resourceVersion moves), or creates it as the
        create raced would have."""
        self.down = False
        """While True every request gets 503 (an unreachable or overloaded API server)."""
        self.unavailable: set[str] = set()
        """Plurals answered with 503, as the aggregator answers for an APIService whose backend
        (metrics-server) is down."""
        self.absent: set[str] = set()
        """Plurals or ``plural/subresource`` this API server does not serve (404, and left out of
        discovery): a CRD that is not installed, or ``pods/resize`` before Kubernetes 1.33."""
        self.storms: dict[str, list[int]] = {}
        """plural -> [HTTP status, how many more requests get it] (429 with Retry-After, 500...)."""
        self.garbled: set[str] = set()
        """Plurals (and ``version``, for ``GET /version``) answered 200 with an HTML page, as a
        proxy in front of the API server answers with its login page: no Kubernetes answer at all."""
        self.version: dict[str, Any] = VERSION
        """What ``GET /version`` answers, unless garbled."""
        self.garbled_watches: set[str] = set()
        """Plurals whose watch, not list, is answered with that HTML page (a proxy that passes
        plain requests but not long-lived streams)."""
        self.failing_watches: dict[str, tuple[int, str]] = {}
        """plural -> (code, message) the API server ends its next watch event's stream with,
        in an ERROR event instead of that event (etcd timing out under the API server: 500)."""
        self.cut_watches: set[str] = set()
        """Plurals whose next watch event is sent half-written and the connection dropped."""
        self.expired_continues: set[str] = set()
        """Plurals whose list pages after the first are refused with 410 Expired, as the API server
        refuses a continue token older than etcd keeps the list's revision (5 minutes)."""
        self.recreated: set[tuple[str, str]] = set()
        """(namespace, Pod) its controller deletes and creates again under the same name (a new UID)
        just before the next eviction of it arrives: a StatefulSet's Pod, replaced meanwhile."""
        self.vanishing: set[tuple[str, str]] = set()
        """(namespace, Pod) deleted (a rollout, a drain) just before the next eviction of it arrives."""
        self.held_lists: dict[str, threading.Event] = {}
        """plural -> Event: the next list of it takes its snapshot, then waits for the Event before
        it answers (a large cluster's list, paged over seconds while writes and their watch events
        go on); ``lists_held`` names the plurals whose held list has taken its snapshot."""
        self.lists_held: set[str] = set()
        self.trickled_lists: set[str] = set()
        """Plurals whose lists are answered a byte every 50 ms, the status line and headers too: an
        answer seconds on its way (a large cluster's list, an API server under load), the client
        waiting inside its call of the ``kubernetes`` client all the while."""
        self.held_reads: dict[str, threading.Event] = {}
        """plural -> Event: the next read of one object of it waits for the Event, then reads it
        (a request that reaches an overloaded API server late); ``reads_held`` names the plurals
        whose held read is waiting or has waited."""
        self.reads_held: set[str] = set()
        self.held_answers: dict[str, threading.Event] = {}
        """plural -> Event: the next read of one object of it reads it at once, then waits for the
        Event before it answers (an answer slow on its way back while the object changes);
        ``answers_held`` names the plurals whose held answer has been read."""
        self.answers_held: set[str] = set()
        self.slow_writes: dict[str, float] = {}
        """plural -> seconds the API server takes to answer a write of it (a create, an update, a
        patch, a Binding) it has already stored (overloaded): a client that times out first cannot
        tell whether its write happened."""
        self.kubelet_answers: dict[tuple[str, str], str] = {}
        """(namespace, Pod) -> how its kubelet answers a resize: ``applied`` (the default),
        ``Deferred`` or ``Infeasible``."""
        self.server = _QuietServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        # serve_forever notices shutdown() only between polls (0.5 s by default), and every test
        # that starts this server waits for that on its way out.
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(path, self.url, self.token)

    # -- what tests do -----------------------------------------------------------------------
    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (as a controller would) and tell watchers."""
        obj = copy.deepcopy(obj)
        prefix, _, kind, namespaced = RESOURCES[plural]
        metadata = obj.setdefault("metadata", {})
        if "name" not in metadata and "generateName" in metadata:
            metadata["name"] = f"{metadata['generateName']}{uuid.uuid4().hex[:5]}"
        key = (metadata.get("namespace", "") if namespaced else "", metadata["name"])
        with self._changed:
            event = "MODIFIED" if key in self._objects[plural] else "ADDED"
            self._version += 1
            metadata["resourceVersion"] = str(self._version)
            metadata.setdefault("uid", f"uid-{plural}-{key[0]}-{key[1]}")
            obj.setdefault("apiVersion", API_VERSIONS[prefix])
            obj.setdefault("kind", kind)
            self._objects[plural][key] = obj
            self._events[plural].append((self._version, event, copy.deepcopy(obj)))
            self._changed.notify_all()
        return obj

    def bookmark(self, plural: str) -> str:
        """A BOOKMARK event at the newest version, as the API server sends watches that ask for
        them (``allowWatchBookmarks``) about once a minute: an object of the kind with only its
        ``metadata.resourceVersion``. Returns that version."""
        prefix, _, kind, _ = RESOURCES[plural]
        with self._changed:
            version = self._version
            marker = {"kind": kind, "apiVersion": API_VERSIONS[prefix], "metadata": {"resourceVersion": str(version)}}
            self._events[plural].append((version, "BOOKMARK", marker))
            self._changed.notify_all()
        return str(version)

    def written_by_another(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` as the other writer of ``concurrent_writes`` stores it, just before the request
        raced: changed by ``written_meanwhile`` (in place), if set for ``plural``."""
        if plural in self.written_meanwhile:
            self.written_meanwhile[plural](obj)
        return self.put(plural, obj)

    def delete(self, plural: str, namespace: str, name: str) -> None:
        with self._changed:
            obj = self._objects[plural].pop((namespace, name))
            self._version += 1
            # As etcd's watch sends it: the deleted object at the revision of its deletion.
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
            self._events[plural].append((self._version, "DELETED", obj))
            self._changed.notify_all()

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects[plural].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def compact(self, plural: str) -> None:
        """Forget the event history, as etcd compaction does: a watch from an older version gets
        410 Gone, and so does a running watch that had not sent all it forgot (one lagging behind);
        a running watch that had sent everything goes on."""
        with self._changed:
            self._forgotten[plural] += [(version, obj["metadata"].get("namespace", ""))
                                        for version, kind, obj in self._events[plural] if kind != "BOOKMARK"]
            self._events[plural].clear()
            self._oldest[plural] = self._version
            self._changed.notify_all()

    @contextlib.contextmanager
    def watches_paused(self) -> Iterator[None]:
        """Hold back watch events (a watch lagging behind a fresh write)."""
        with self._changed:
            self._watches_paused = True
        try:
            yield
        finally:
            with self._changed:
                self._watches_paused = False
                self._changed.notify_all()

    def count(self, method: str | None = None, plural: str | None = None, watch: bool | None = None) -> int:
        return sum(
            1
            for r in list(self.requests)
            if (method is None or r.method == method)
            and (plural is None or f"/{plural}" in r.path)
            and (watch is None or r.is_watch == watch)
        )

    # -- HTTP semantics ----------------------------------------------------------------------
    def write(self, plural: str, operation: str, subresource: str, obj: dict[str, Any],
              old: dict[str, Any] | None, username: str) -> tuple[int, dict[str, Any]]:
        """Admission, then the registry's update strategy, then storage, as the API server does
        for a CREATE or UPDATE. Returns (HTTP status, stored object or Status)."""
        admitted = self.admit(plural, operation, subresource, obj, old, username)
        if admitted[0] != 200:
            return admitted
        obj = admitted[1]
        if old is not None and plural == "pods" and subresource == "resize":
            problem = _resize_problem(old, obj)
            if problem:
                message = f'Pod "{old["metadata"]["name"]}" is invalid: {problem}'
                return 422, _status(422, "Invalid", message)
            obj = self._kubelet_resizes(old, obj)
        if old is not None and plural == "nodes":
            # The node registry strategies (pkg/registry/core/node/strategy.go), applied after
            # admission: a main-resource update keeps the stored status, a status update keeps the
            # stored spec.
            if subresource == "status":
                obj["spec"] = copy.deepcopy(old.get("spec"))
            else:
                obj["status"] = copy.deepcopy(old.get("status"))
        return (201 if old is None else 200), self.put(plural, obj)

    def admit(self, plural: str, operation: str, subresource: str, obj: dict[str, Any], old: dict[str, Any] | None,
              username: str, kind: str | None = None) -> tuple[int, dict[str, Any]]:
        """The mutating, then the validating webhook of ``plural``, as the API server calls them:
        (200, the object as mutated) or (the refusal's HTTP status, its Status)."""
        kind = kind or RESOURCES[plural][2]
        for chain, mutating in ((self.mutating, True), (self.validating, False)):
            webhook = chain.get(plural)
            if webhook is None:
                continue
            review = {
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": str(uuid.uuid4()),
                    "kind": {"group": "", "version": "v1", "kind": kind},
                    "resource": {"group": "", "version": "v1", "resource": plural},
                    "subResource": subresource, "operation": operation,
                    "name": obj.get("metadata", {}).get("name", ""),
                    "userInfo": {"username": username},
                    "object": obj, "oldObject": old, "dryRun": False,
                },
            }
            if not subresource:
                del review["request"]["subResource"]
            response = webhook(review)
            if not response.get("allowed"):
                status = response.get("status") or {}
                code = status.get("code", 403)
                message = f"admission webhook denied the request: {status.get('message')}"
                return code, _status(code, "Forbidden", message)
            if mutating and response.get("patch"):
                obj = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
        return 200, obj

    def _kubelet_resizes(self, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """The resize registry strategy keeps everything but container resources from the stored
        Pod; then the kubelet answers (synchronously here) with status resources or a condition."""
        pod = copy.deepcopy(old)
        for kind in ("initContainers", "containers"):
            for stored, sent in zip(pod["spec"].get(kind) or [], new["spec"].get(kind) or [], strict=True):
                stored["resources"] = copy.deepcopy(sent.get("resources") or {})
        pod["metadata"]["generation"] = int(pod["metadata"].get("generation", 1)) + 1
        status = pod.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or []
                      if c.get("type") not in ("PodResizePending", "PodResizeInProgress")]
        answer = self.kubelet_answers.get((pod["metadata"].get("namespace", ""), pod["metadata"]["name"]), "applied")
        if answer == "applied":
            by_name = {c["name"]: c for c in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]}
            statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
            for container_status in statuses:
                container = by_name.get(container_status.get("name"))
                if container is not None:
                    container_status["resources"] = copy.deepcopy(container.get("resources") or {})
        else:
            message = ("Node didn't have enough capacity" if answer == "Infeasible"
                       else "Node didn't have enough resource right now")
            conditions.append({"type": "PodResizePending", "status": "True", "reason": answer, "message": message})
        status["conditions"] = conditions
        return pod

    def list_objects(self, plural: str, namespace: str | None, query: dict[str, list[str]]) -> dict[str, Any]:
        with self._changed:
            items = [o for (ns, _), o in sorted(self._objects[plural].items()) if namespace in (None, ns)]
            version = self._version
        for selector in (query.get("fieldSelector", [""])[0] or "").split(","):
            if "!=" in selector:
                path, _, unwanted = selector.partition("!=")
                items = [o for o in items if _field(o, path) != unwanted]
            elif selector:
                path, _, wanted = selector.partition("=")
                items = [o for o in items if _field(o, path) == wanted]
        for selector in (query.get("labelSelector", [""])[0] or "").split(","):
            if selector:
                label, _, wanted = selector.partition("=")
                items = [o for o in items if (o.get("metadata", {}).get("labels") or {}).get(label) == wanted]
        limit = int(query.get("limit", ["0"])[0] or 0)
        start = int(query.get("continue", ["0"])[0] or 0)
        page = items[start : start + limit] if limit else items[start:]
        metadata: dict[str, Any] = {"resourceVersion": str(version)}
        if limit and start + limit < len(items):
            metadata["continue"] = str(start + limit)
        prefix, _, kind, _ = RESOURCES[plural]
        return {
            "apiVersion": API_VERSIONS[prefix],
            "kind": f"{kind}List",
            "metadata": metadata,
            # The API server leaves each item's kind and apiVersion out of a list (kubernetes#3030;
            # kubectl puts them back when it prints): code that needs them must know them.
            "items": [{k: copy.deepcopy(v) for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page],
        }

    def watch_events(
        self, plural: str, namespace: str | None, since: int, timeout: float, bookmarks: bool = False
    ) -> Iterator[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._changed:
            if since < self._oldest[plural]:
                yield {"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}
                return
        sent = since
        while True:
            with self._changed:
                while True:
                    if self._stopping:
                        return
                    if sent < self._oldest[plural] and any(
                            version > sent and namespace in (None, forgotten)
                            for version, forgotten in self._forgotten[plural]):
                        yield {"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}
                        return
                    # Events are kept in version order: only the tail after ``sent`` is looked at (a
                    # scan of every event each half second made the double, not the code under
                    # test, the bottleneck of the load benchmark).
                    events = self._events[plural]
                    tail = [] if self._watches_paused else events[bisect.bisect_right(events, sent, key=_version):]
                    pending = [e for e in tail if namespace in (None, e[2]["metadata"].get("namespace", ""))
                               and (bookmarks or e[1] != "BOOKMARK")]
                    remaining = deadline - time.monotonic()
                    if pending or remaining <= 0:
                        break
                    self._changed.wait(min(remaining, 0.5))
            if not pending:
                return
            for version, kind, obj in pending:
                sent = version
                yield {"type": kind, "object": copy.deepcopy(obj)}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients closing kept-alive connections (the usual end of a test) are not errors."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _version(event: tuple[int, str, dict[str, Any]]) -> int:
    return event[0]


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _resize_problem(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """The API server's validation of a ``pods/resize`` write (ValidatePodResize), or None."""
    def without_resources(spec: dict[str, Any]) -> dict[str, Any]:
        spec = copy.deepcopy(spec)
        for kind in ("initContainers", "containers"):
            for container in spec.get(kind) or []:
                container.pop("resources", None)
                container.pop("resizePolicy", None)
        return spec

    if "kubernetes.io/config.mirror" in ((old.get("metadata") or {}).get("annotations") or {}):
        return "Forbidden: static pods cannot be resized"
    if ((old.get("spec") or {}).get("os") or {}).get("name") == "windows":
        return "Forbidden: windows pods cannot be resized"
    if without_resources(old.get("spec") or {}) != without_resources(new.get("spec") or {}):
        return "spec: Forbidden: only cpu and memory resources are mutable"
    for kind in ("initContainers", "containers"):
        for before, after in zip(old["spec"].get(kind) or [], new["spec"].get(kind) or [], strict=True):
            if before.get("resources") == after.get("resources"):
                continue
            if kind == "initContainers" and before.get("restartPolicy") != "Always":
                return f"spec.initContainers[{before['name']}].resources: Forbidden: resources for non-sidecar " \
                       "init containers are immutable"
            for part in ("requests", "limits"):
                was = (before.get("resources") or {}).get(part) or {}
                now = (after.get("resources") or {}).get(part) or {}
                changed = {k for k in {*was, *now} if was.get(k) != now.get(k)}
                if changed - {"cpu", "memory"}:
                    return f"spec.containers[{before['name']}].resources: Forbidden: only cpu and memory resources " \
                           "are mutable"
                if set(was) - set(now):
                    return f"spec.containers[{before['name']}].resources.{part}: Forbidden: resource {part} may " \
                           "not be removed"
    if _qos(old) != _qos(new):
        return "metadata: Invalid value: \"Pod QoS is immutable\""
    return None


def _qos(pod: dict[str, Any]) -> str:
    """QoS class as pkg/apis/core/helper/qos computes it (written here independently of the code
    under test, so a bug there cannot hide itself; quantities read by the kubernetes client's own
    parser)."""
    spec = pod.get("spec") or {}
    requests: set[str] = set()
    limits: set[str] = set()
    guaranteed = True
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        wanted = _nonzero(resources.get("requests"))
        capped = _nonzero(resources.get("limits"))
        requests |= set(wanted)
        limits |= set(capped)
        if set(capped) != {"cpu", "memory"} or any(wanted.get(k, capped[k]) != capped[k] for k in capped):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _nonzero(amounts: dict[str, Any] | None) -> dict[str, Any]:
    parsed = {k: parse_quantity(v) for k, v in (amounts or {}).items() if k in ("cpu", "memory")}
    return {k: v for k, v in parsed.items() if v}


def write_kubeconfig(path: Path, server: str, token: str = "fake-token") -> Path:
    """A kubeconfig at ``path`` whose one cluster is ``server`` (a token user, as in-cluster)."""
    path.write_text(json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }))
    return path


def undecodable(plural: str, body: Any, endpoint: tuple[str, str] | None = None) -> str | None:
    """Why the API server would refuse to decode a body sent to create or replace an object of
    ``plural`` (400 BadRequest), or None: its apiVersion or kind is not the endpoint's (``plural``'s,
    else a subresource's (apiVersion, kind)), or a MicroTime field is not to the microsecond."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    prefix, _, kind, _ = RESOURCES[plural]
    version = API_VERSIONS[prefix]
    if endpoint is not None:
        version, kind = endpoint
    if body.get("apiVersion") not in (None, version):
        return (f"the API version in the data ({body['apiVersion']}) does not match the expected API version "
                f"({version})")
    if body.get("kind") not in (None, kind):
        return f'no kind "{body["kind"]}" is registered for version "{version}"'
    spec = body.get("spec") or {}
    for stamped in MICRO_TIME_FIELDS.get(plural, ()):
        stamp = spec.get(stamped)
        if stamp is not None and not (isinstance(stamp, str) and MICRO_TIME.fullmatch(stamp)):
            return (f'{kind} in version "{version.rpartition("/")[2]}" cannot be handled as a {kind}: parsing time '
                    f'"{stamp}" as "2006-01-02T15:04:05.000000Z07:00"')
    return None


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _handler(api: FakeKubeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave in separate writes; with Nagle on, each response would wait for
        # the client's delayed ACK (about 40 ms).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _route(self) -> tuple[str, str | None, str | None, str | None, dict[str, list[str]]] | None:
            """(plural, namespace, name, subresource, query) or None."""
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            api.requests.append(Logged(self.command, url.path, query))
            for prefix in API_VERSIONS:
                if not url.path.startswith(prefix + "/"):
                    continue
                parts = url.path[len(prefix) + 1 :].split("/")
                namespace = None
                if parts[0] == "namespaces" and len(parts) >= 3:
                    namespace, parts = parts[1], parts[2:]
                plural = next((key for key, (p, url_plural, _, _) in RESOURCES.items()
                               if p == prefix and url_plural == parts[0]), None)
                if plural is None:
                    return None
                name = parts[1] if len(parts) > 1 else None
                sub = parts[2] if len(parts) > 2 else None
                return plural, namespace, name, sub, query
            return None

        def _sign_in_page(self) -> None:
            """What a proxy in front of the API server answers instead of it (``api.garbled``)."""
            page = b"<html><body>Sign in to continue</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def _send(self, code: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _trickle(self, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            answer = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                      "Connection: close\r\n\r\n").encode() + body
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client gone meanwhile
                for start in range(len(answer)):
                    self.wfile.write(answer[start:start + 1])
                    self.wfile.flush()
                    time.sleep(0.05)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"null")

        def _prologue(self) -> tuple[str, str | None, str | None, str | None, dict[str, list[str]]] | None:
            """The request's route, or None once it has been answered here (an outage, a storm...).
            An answer given here leaves the request's body unread: it is read and dropped, or
            the next request on the kept-alive connection would start in the middle of it."""
            route = self._routed_or_answered()
            if route is None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return route

        def _routed_or_answered(self) -> tuple[str, str | None, str | None, str | None, dict[str, list[str]]] | None:
            route = self._route()
            if api.down:
                self._send(503, _status(503, "ServiceUnavailable", "the server is unable to handle the request"))
                return None
            if self._username() == "":
                self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                return None
            if route is None:
                self._send(404, _status(404, "NotFound", f"the server could not find {self.path}"))
                return None
            if route[0] in api.absent or f"{route[0]}/{route[3]}" in api.absent:
                self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))
                return None
            storm = api.storms.get(route[0])
            if storm and storm[1] > 0:
                storm[1] -= 1
                reason = {403: "Forbidden", 429: "TooManyRequests", 500: "InternalError"}.get(storm[0], "Error")
                said = f"storm: {reason}"
                if storm[0] == 403:  # as RBAC refuses: who, which verb, which resource
                    plural, name, verb = route[0], route[2], self.command.lower()
                    verb = {"post": "create", "put": "update"}.get(verb, "list" if verb == "get" and not name else verb)
                    named = f' "{name}"' if name else ""  # a list names no object
                    said = (f'{plural}{named} is forbidden: User "system:serviceaccount:oversale:oversale" '
                            f'cannot {verb} resource "{plural}"')
                self._send(storm[0], _status(storm[0], reason, said), {"Retry-After": "1"} if storm[0] == 429 else None)
                return None
            if route[0] in api.garbled:
                self._sign_in_page()
                return None
            if route[0] in api.unavailable:
                self._send(503, _status(503, "ServiceUnavailable", "the server is currently unable to handle the "
                                        "request"))
                return None
            return route

        def do_GET(self) -> None:
            if urlsplit(self.path).path.rstrip("/") == "/api/v1":
                return self._discovery()
            if urlsplit(self.path).path.rstrip("/") == "/version":
                api.requests.append(Logged("GET", "/version", {}))
                return self._sign_in_page() if "version" in api.garbled else self._send(200, api.version)
            route = self._prologue()
            if route is None:
                return
            plural, namespace, name, _, query = route
            if name is None and query.get("watch") == ["true"]:
                return self._watch(plural, namespace, query)
            if name is None and query.get("continue") and plural in api.expired_continues:
                return self._send(410, _status(410, "Expired", "The provided continue parameter is too old to "
                                                "display a consistent list result. You can start a new list without "
                                                "the continue parameter."))
            if name is None:
                listed = api.list_objects(plural, namespace, query)
                held = api.held_lists.pop(plural, None)
                if held is not None:
                    api.lists_held.add(plural)
                    held.wait(30)
                if plural in api.trickled_lists:
                    return self._trickle(listed)
                return self._send(200, listed)
            held = api.held_reads.pop(plural, None)
            if held is not None:
                api.reads_held.add(plural)
                held.wait(30)
            obj = api.get(plural, namespace or "", name)
            answer = api.held_answers.pop(plural, None)
            if answer is not None:
                api.answers_held.add(plural)
                answer.wait(30)
            if obj is None:
                return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            self._send(200, obj)

        def _discovery(self) -> None:
            """GET /api/v1: the core group's APIResourceList."""
            api.requests.append(Logged("GET", "/api/v1", {}))
            names = [url_plural for prefix, url_plural, _, _ in RESOURCES.values() if prefix == "/api/v1"]
            names += CORE_SUBRESOURCES
            self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": [
                {"name": name, "namespaced": True, "kind": "", "verbs": ["get", "patch"]}
                for name in names if name not in api.absent]})

        def _watch(self, plural: str, namespace: str | None, query: dict[str, list[str]]) -> None:
            if plural in api.garbled_watches:
                return self._sign_in_page()
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            timeout = float(query.get("timeoutSeconds", ["30"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                bookmarks = query.get("allowWatchBookmarks") == ["true"]
                for event in api.watch_events(plural, namespace, since, timeout, bookmarks):
                    if plural in api.failing_watches:
                        code, message = api.failing_watches.pop(plural)
                        event = {"type": "ERROR", "object": _status(code, "InternalError", message)}
                    line = json.dumps(event).encode() + b"\n"
                    if plural in api.cut_watches:
                        # The connection drops mid-event (a load balancer or API server restart).
                        api.cut_watches.discard(plural)
                        half = line[: len(line) // 2]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(half), half))
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    if event["type"] == "ERROR":
                        break
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _username(self) -> str:
            """Who the request's bearer token says it is; "" for a token no user holds."""
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
            return api.users.get(token, "") if token else "system:anonymous"

        def _update(self, build: Callable[[dict[str, Any], Any], dict[str, Any]], replaces: bool = False) -> None:
            route = self._prologue()
            if route is None:
                return
            plural, namespace, name, sub, _ = route
            current = api.get(plural, namespace or "", name or "")
            body = self._body()
            if replaces and (why := undecodable(plural, body)):
                return self._send(400, _status(400, "BadRequest", why))
            if current is None:
                return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            raced = next((k for k in (f"{plural}/{name}", plural) if api.concurrent_writes.get(k)), None)
            if raced:
                api.concurrent_writes[raced] -= 1
                current = api.written_by_another(plural, current)
            sent = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if sent and sent != current["metadata"]["resourceVersion"]:
                return self._send(409, _status(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": '
                                              "the object has been modified; please apply your changes to the "
                                              "latest version and try again"))
            code, result = api.write(plural, "UPDATE", sub or "", build(current, body), current, self._username())
            time.sleep(api.slow_writes.get(plural, 0.0))
            self._send(code, result)

        def do_PATCH(self) -> None:
            json_patch = "json-patch" in (self.headers.get("Content-Type") or "")
            try:
                self._update(lambda current, body: jsonpatch.apply_patch(current, body) if json_patch
                             else _merge(current, body))
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                self._send(422, _status(422, "Invalid", f"the patch does not apply: {error}"))

        def do_PUT(self) -> None:
            self._update(lambda current, body: body, replaces=True)

        def do_POST(self) -> None:
            route = self._prologue()
            if route is None:
                return
            plural, namespace, name, sub, _ = route
            body = self._body()
            if plural == "pods" and sub == "eviction":
                return self._evict(namespace or "", name or "", body)
            if why := undecodable(plural, body):
                return self._send(400, _status(400, "BadRequest", why))
            if plural == "bindings":
                return self._bind(namespace or "", body)
            if RESOURCES[plural][3]:
                body.setdefault("metadata", {}).setdefault("namespace", namespace or "")
            name = body["metadata"].get("name", "")
            if api.concurrent_writes.get(f"{plural}/{name}") and api.get(plural, namespace or "", name) is None:
                api.concurrent_writes[f"{plural}/{name}"] -= 1
                api.written_by_another(plural, copy.deepcopy(body))
            if api.get(plural, namespace or "", name) is not None:
                return self._send(409, _status(409, "AlreadyExists", "already exists"))
            code, result = api.write(plural, "CREATE", "", body, None, self._username())
            time.sleep(api.slow_writes.get(plural, 0.0))
            self._send(code, result)

        def _evict(self, namespace: str, name: str, eviction: dict[str, Any]) -> None:
            """POST pods/NAME/eviction: the disruption controller's budget decides, as the API server's
            eviction registry does (429 while no disruption is allowed; the Pod is deleted otherwise),
            and a UID precondition that names another Pod is a 409 Conflict. A body that is no
            policy/v1 Eviction is a 400, as the subresource cannot decode it."""
            if why := undecodable("pods", eviction, ("policy/v1", "Eviction")):
                return self._send(400, _status(400, "BadRequest", why))
            if (namespace, name) in api.vanishing:
                api.vanishing.discard((namespace, name))
                api.delete("pods", namespace, name)
            pod = api.get("pods", namespace, name)
            if pod is None:
                return self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
            if (namespace, name) in api.recreated:
                api.recreated.discard((namespace, name))
                pod["metadata"]["uid"] = f"{pod['metadata'].get('uid', '')}-again"
                api.put("pods", pod)
            # An Eviction is a CREATE of pods/eviction, which admission webhooks (a policy engine)
            # may refuse before the disruption budget is looked at.
            code, refusal = api.admit("pods", "CREATE", "eviction", {**eviction, "metadata": {"name": name,
                                      "namespace": namespace}}, None, self._username(), kind="Eviction")
            if code != 200:
                return self._send(code, refusal)
            wanted = ((eviction.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
            if wanted and wanted != pod["metadata"].get("uid"):
                return self._send(409, _status(409, "Conflict", f"Precondition failed: UID in precondition: {wanted}, "
                                                                f"UID in object meta: {pod['metadata'].get('uid')}"))
            labels = pod["metadata"].get("labels") or {}
            for budget in api.list_objects("poddisruptionbudgets", namespace, {})["items"]:
                wanted = ((budget.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
                if not all(labels.get(k) == v for k, v in wanted.items()):
                    continue
                allowed = int((budget.get("status") or {}).get("disruptionsAllowed", 0))
                if allowed < 1:
                    return self._send(429, _status(429, "TooManyRequests", "Cannot evict pod as it would "
                                                   "violate the pod's disruption budget."))
                budget.setdefault("status", {})["disruptionsAllowed"] = allowed - 1
                api.put("poddisruptionbudgets", budget)
            api.delete("pods", namespace, name)
            self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

        def _bind(self, namespace: str, binding: dict[str, Any]) -> None:
            """POST bindings: what the scheduler (or an extender) does to put a Pod on a node."""
            name = (binding.get("metadata") or {}).get("name", "")
            pod = api.get("pods", namespace, name)
            if pod is None:
                return self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
            # The Binding's metadata.uid is a storage precondition (BindingREST.setPodNodeAndMetadata):
            # a Pod made again under the name is not bound in place of the one scheduled.
            uid = (binding.get("metadata") or {}).get("uid")
            if uid and uid != pod["metadata"].get("uid"):
                return self._send(409, _status(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": '
                                               f'Precondition failed: UID in precondition: {uid}, UID in object meta: '
                                               f'{pod["metadata"].get("uid", "")}'))
            if (pod.get("spec") or {}).get("nodeName"):
                return self._send(409, _status(409, "Conflict", f"pod {name} is already assigned to a node"))
            pod.setdefault("spec", {})["nodeName"] = binding["target"]["name"]
            api.put("pods", pod)
            time.sleep(api.slow_writes.get("bindings", 0.0))
            self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

    return Handler


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result
