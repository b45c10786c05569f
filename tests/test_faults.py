"""The usual failures, for each long-running component: watch streams cut mid-event, 429 and 500
storms, the API server down and back, Prometheus answering garbage, a webhook worker killed under
load. Through the real processes and client, the API-server double and real HTTP servers."""

from __future__ import annotations

import http.client
import io
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kube.background import run_every
from kube.prometheus import PrometheusAPI, PrometheusUnavailable, QueryTooLarge
from oversale.annotations import AnnotationKeys
from oversale.settings import Settings
from reconcilers.cluster import Cluster
from reconcilers.history import HistoryUnavailable
from reconcilers.prometheus import PrometheusHistory
from reconcilers.runner import Reconciler
from tests.conftest import RunningWebhook, apply_response, eventually, loaded_client, no_cluster_app, pod_review
from tests.kube_api import FakeKubeAPI
from tests.prometheus_server import GARBAGE_ANSWERS, garbage_prometheus

KEYS = AnnotationKeys()
NS = "shop"


def deployment_and_replicaset(api: FakeKubeAPI, ratio: str) -> None:
    api.put("deployments", {"metadata": {"name": "web", "namespace": NS,
                                         "annotations": {KEYS.cpu_requests_ratio: ratio}}, "spec": {}})
    api.put("replicasets", {"metadata": {"name": "web-5d8f", "namespace": NS, "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u", "controller": True}]},
        "spec": {}})


def web_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-5d8f-", "namespace": NS,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "u",
                                 "controller": True}]},
            "spec": {"containers": [{"name": "app", "image": "nginx",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}


def cpu_after(server: RunningWebhook) -> str:
    pod = web_pod()
    return str(apply_response(pod, server.review(pod_review(pod)))["spec"]["containers"][0]["resources"]
               ["requests"]["cpu"])


@pytest.fixture
def webhook_on_api(tmp_path) -> Iterator[tuple[FakeKubeAPI, RunningWebhook]]:
    api = FakeKubeAPI().start()
    deployment_and_replicaset(api, "2")
    env = {"OVERSALE_KUBERNETES": "auto", "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
           "OVERSALE_OWNER_LOOKUP_TIMEOUT": "0.5"}
    server = RunningWebhook(tmp_path, env=env, workers=1)
    assert eventually(lambda: server.get("/readyz")[0] == 200, timeout=20), server.log.read_text()
    yield api, server
    server.stop()
    api.stop()


def test_a_watch_cut_mid_event_is_picked_up_again(webhook_on_api):
    api, server = webhook_on_api
    assert cpu_after(server) == "500m"
    api.cut_watches.add("deployments")
    deployment_and_replicaset(api, "4")  # this event arrives half-written, then the stream drops
    assert eventually(lambda: cpu_after(server) == "250m", timeout=15), "the change arrives when watched again"
    restarts = "oversale_cache_restarts_total"
    assert server.metric(restarts, kind="Deployment", again="watch", cause="cut") == 1
    assert server.metric(restarts, again="list") == 0, "no cache was listed again"


@pytest.fixture
def pods_api(caplog) -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI().start()
    api.put("pods", placed("node-0"))
    caplog.set_level("INFO", logger="kube.reflector")
    yield api
    api.stop()


@pytest.fixture
def node_cache(pods_api) -> Iterator[tuple[FakeKubeAPI, Any]]:
    reflector = synced_node_cache(pods_api)
    yield pods_api, reflector
    reflector.stop()


def node_reflector(api: FakeKubeAPI, watch_timeout: int = 300, **options: Any) -> Any:
    """The shared list-then-watch cache over Pods (each kept as its node; a miss read with a GET),
    not started; ``reflector.restarts``: what it told its ``on_restart``, (again, cause) each time."""
    from kube.reflector import Reflector

    pods = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    restarts: list[tuple[str, str]] = []
    reflector = Reflector("pods", pods.list_pod_for_all_namespaces, lambda obj: obj["spec"].get("nodeName"),
                          watch_timeout, read_fn=pods.read_namespaced_pod,
                          on_restart=lambda kind, again, cause: restarts.append((again, cause)), **options)
    reflector.restarts = restarts
    return reflector


def synced_node_cache(api: FakeKubeAPI) -> Any:
    """:func:`node_reflector`, started and synced."""
    reflector = node_reflector(api)
    reflector.start()
    assert reflector.synced.wait(10)
    return reflector


def placed(node: str) -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": NS}, "spec": {"nodeName": node}}


def told(caplog, level: str = "INFO") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kube.reflector" and r.levelno >= logging.getLevelName(
        level) and "synced" not in r.getMessage()]


def test_a_cut_watch_is_watched_again_from_its_last_event_not_listed_again(node_cache, caplog):
    """An API server restarting or a load balancer's idle timeout cuts every watch: listing
    every Pod again for each would be the costliest read there is, and nothing was lost."""
    api, reflector = node_cache
    listed_at = api.get("pods", NS, "web")["metadata"]["resourceVersion"]
    api.cut_watches.add("pods")
    api.put("pods", placed("node-1"))  # this watch's first event: cut half-written
    assert eventually(lambda: reflector.get(NS, "web") == "node-1"), told(caplog)
    api.put("pods", placed("node-2"))
    assert eventually(lambda: reflector.get(NS, "web") == "node-2")
    delivered_at = api.get("pods", NS, "web")["metadata"]["resourceVersion"]
    api.cut_watches.add("pods")
    api.put("pods", placed("node-3"))  # cut after the watch had delivered node-2
    assert eventually(lambda: reflector.get(NS, "web") == "node-3"), told(caplog)
    assert api.count("GET", "pods", watch=False) == 1, "the cache was never listed again"
    lines = told(caplog)
    assert lines[0] == ("pods watch cut before any event (the connection dropped); watching again from "
                        f"resourceVersion {listed_at} with a backoff of up to 30s"), lines
    assert lines[1] == "pods watched again (after 1 failed run)"
    assert lines[2] == f"pods watch cut (the connection dropped); watching again from resourceVersion {delivered_at}"
    assert len(lines) == 3, lines
    assert reflector.restarts == [("watch", "cut"), ("watch", "cut")]


def test_a_watch_the_api_server_refuses_for_a_while_is_watched_again_not_listed_again(node_cache, caplog):
    """An API server unavailable (503) or overloaded: listing every Pod again each time its watch
    cannot start is the last thing it needs, and the cache lost nothing."""
    api, reflector = node_cache
    listed_at = api.get("pods", NS, "web")["metadata"]["resourceVersion"]
    assert eventually(lambda: api.count("GET", "pods", watch=True) == 1)
    time.sleep(0.2)  # past the double's check of `down` for that watch
    api.down = True  # new requests get 503; the watch under way goes on
    api.cut_watches.add("pods")
    api.put("pods", placed("node-1"))
    assert eventually(lambda: api.count("GET", "pods", watch=True) >= 3)
    assert reflector.get(NS, "web") == "node-0"
    api.down = False
    assert eventually(lambda: reflector.get(NS, "web") == "node-1"), told(caplog)
    assert api.count("GET", "pods", watch=False) == 1, "the cache was never listed again"
    lines = told(caplog)
    assert lines[:2] == [
        f"pods watch cut before any event (the connection dropped); watching again from resourceVersion {listed_at} "
        "with a backoff of up to 30s",
        f"pods watch failed (HTTP 503 Service Unavailable); watching again from resourceVersion {listed_at} with a "
        "backoff of up to 30s"], lines
    assert re.fullmatch(r"pods watched again \(after [2-9] failed runs\)", lines[2]) and len(lines) == 3, lines
    assert reflector.restarts[0] == ("watch", "cut") and len(reflector.restarts) >= 2
    assert set(reflector.restarts[1:]) == {("watch", "refused for now")}, reflector.restarts


@pytest.mark.parametrize("code, message", [(500, "etcdserver: request timed out"),
                                           (429, "too many requests, please try again later")])
def test_a_watch_the_api_server_ends_with_a_momentary_error_is_watched_again(node_cache, caplog, code, message):
    api, reflector = node_cache
    listed_at = api.get("pods", NS, "web")["metadata"]["resourceVersion"]
    api.failing_watches["pods"] = (code, message)
    api.put("pods", placed("node-1"))  # the watch ends with the error instead of this event
    assert eventually(lambda: reflector.get(NS, "web") == "node-1"), told(caplog)
    assert api.count("GET", "pods", watch=False) == 1, "the cache was never listed again"
    assert told(caplog)[0] == (
        f"pods watch failed (watch error {code}: {message}); watching again from resourceVersion "
        f"{listed_at} with a backoff of up to 30s")
    assert reflector.restarts == [("watch", "refused for now")]


def test_a_watch_the_api_server_ends_for_good_is_listed_again(node_cache, caplog):
    """A Status no second watch from there mends (403: RBAC changed under the cache): listed
    again after the backoff, which sees what the refused watch would have shown."""
    api, reflector = node_cache
    api.failing_watches["pods"] = (403, 'pods is forbidden: User "oversale" cannot watch resource "pods"')
    api.put("pods", placed("node-1"))
    assert eventually(lambda: reflector.get(NS, "web") == "node-1"), told(caplog)
    assert api.count("GET", "pods", watch=False) == 2
    assert told(caplog)[0] == ('pods watch failed (watch error 403: pods is forbidden: User "oversale" cannot watch '
                               'resource "pods"); listing again with a backoff of up to 30s')
    assert reflector.restarts == [("list", "refused")]


def watches_of(api: FakeKubeAPI, plural: str) -> list[Any]:
    """The watch requests of ``plural`` the API server has had, oldest first."""
    return [r for r in list(api.requests) if r.is_watch and f"/{plural}" in r.path]


def test_a_watch_refused_again_and_again_is_asked_less_often_until_one_works(node_cache, caplog):
    """A watch the API server refuses for a moment (500, 503: overloaded) is asked again after
    0.5 s, then 1 s, then 2 s, so an overloaded API server is not asked in a loop; one warning
    for the whole outage, however its answers change. A watch that works starts the count over:
    the next momentary refusal costs half a second, not the longest wait so far."""
    api, reflector = node_cache
    listed_at = reflector.resource_version
    assert eventually(lambda: len(watches_of(api, "pods")) == 1)
    api.storms["pods"] = [500, 1]
    api.cut_watches.add("pods")
    cut_at = time.monotonic()
    api.put("pods", placed("node-1"))  # the running watch is cut before its first event
    assert eventually(lambda: len(watches_of(api, "pods")) == 2), told(caplog)  # refused: 500
    api.storms["pods"] = [503, 1]
    assert eventually(lambda: reflector.get(NS, "web") == "node-1"), told(caplog)
    _first, refused, refused_again, working = watches_of(api, "pods")
    waits = [refused.at - cut_at, refused_again.at - refused.at, working.at - refused_again.at]
    assert all(wait <= seconds < wait + 0.4 for wait, seconds in zip([0.5, 1, 2], waits, strict=True)), waits
    # The working watch is cut after an event (at once again), then refused once more.
    api.storms["pods"] = [500, 1]
    api.cut_watches.add("pods")
    api.put("pods", placed("node-2"))
    assert eventually(lambda: reflector.get(NS, "web") == "node-2"), told(caplog)
    *_, refused, working = watches_of(api, "pods")
    assert 0.5 <= working.at - refused.at < 0.9, "the working watch started the backoff over"
    assert api.count("GET", "pods", watch=False) == 1, "never listed again"
    lines = told(caplog)
    assert lines[0].startswith(f"pods watch cut before any event (the connection dropped); watching again from "
                               f"resourceVersion {listed_at}"), lines
    assert lines[1].startswith("pods watch failed (HTTP 500"), lines
    assert lines[2] == "pods watched again (after 3 failed runs)", lines
    assert lines[3].startswith("pods watch cut (the connection dropped)"), lines
    assert lines[4].startswith("pods watch failed (HTTP 500") and len(lines) == 6, lines


def test_a_list_refused_in_different_ways_is_one_warning_until_it_works(pods_api, caplog):
    api = pods_api
    api.storms["pods"] = [500, 1]
    reflector = node_reflector(api)
    reflector.start()
    try:
        assert eventually(lambda: reflector.restarts), told(caplog)
        api.storms["pods"] = [503, 1]  # asked again after half a second: refused as unavailable
        assert reflector.synced.wait(10), told(caplog)
        assert reflector.restarts == [("list", "list failed")] * 2
        warnings = told(caplog, "WARNING")
        assert len(warnings) == 1 and warnings[0].startswith("pods list failed (HTTP 500"), warnings
        assert eventually(lambda: "pods listed again (after 2 failed runs)" in told(caplog)), told(caplog)
    finally:
        reflector.stop()


def test_a_callers_index_follows_the_watch_object_by_object(pods_api, caplog):
    """The scheduler's views keep their own index through ``on_change``: each change the watch
    shows reaches it as the object's digest (None once deleted), and a bookmark none, without a
    list again."""
    api = pods_api
    changes: list[Any] = []
    reflector = node_reflector(api, on_change=lambda namespace, name, digest: changes.append((name, digest)),
                               on_reset=lambda: changes.append("reset"), digest=lambda obj: obj["spec"]["nodeName"])
    reflector.start()
    try:
        assert reflector.synced.wait(10)
        assert changes == ["reset", ("web", "node-0")]
        marked = api.bookmark("pods")
        api.put("pods", placed("node-1"))
        api.delete("pods", NS, "web")
        assert eventually(lambda: len(changes) == 4), (changes, told(caplog))
        assert changes[2:] == [("web", "node-1"), ("web", None)]
        assert reflector.resource_version > int(marked)
        assert api.count("GET", "pods", watch=False) == 1, "never listed again"
    finally:
        reflector.stop()


def test_a_cache_miss_answered_late_never_takes_the_cache_back_in_time(pods_api, caplog):
    """A cache miss reads the object with a GET; when that answer comes back after the watch has
    applied a newer version, caching it would make the cache say the old one until the object
    next changes (the webhook would apply an owner's old ratio to every new Pod)."""
    api = pods_api
    api.put("pods", {"metadata": {"name": "idle", "namespace": NS}, "spec": {}})  # listed, nothing kept of it
    reflector = synced_node_cache(api)
    try:
        fetched: list[Any] = []
        with api.watches_paused():
            api.put("pods", {"metadata": {"name": "late", "namespace": NS}, "spec": {"nodeName": "node-1"}})
            assert reflector.get(NS, "late") is None  # a miss: the watch has not shown it yet
            api.held_answers["pods"] = answered = threading.Event()
            reader = threading.Thread(target=lambda: fetched.append(reflector.fetch(NS, "late", 10)))
            reader.start()
            assert eventually(lambda: "pods" in api.answers_held)  # read as on node-1, not yet answered
            api.put("pods", {"metadata": {"name": "late", "namespace": NS}, "spec": {"nodeName": "node-2"}})
        assert eventually(lambda: reflector.get(NS, "late") == "node-2"), told(caplog)
        answered.set()
        reader.join(10)
        assert fetched == ["node-1"], "the miss is answered with what the API server said"
        assert reflector.get(NS, "late") == "node-2"
        with api.watches_paused():
            api.put("pods", {"metadata": {"name": "newer", "namespace": NS}, "spec": {"nodeName": "node-5"}})
            assert reflector.fetch(NS, "newer", 10) == "node-5"
            assert reflector.get(NS, "newer") == "node-5", "a miss ahead of the watch is cached"
            api.put("pods", {"metadata": {"name": "pending", "namespace": NS}, "spec": {}})
            assert reflector.fetch(NS, "pending", 10) is None  # nothing the cache keeps: no node yet
            assert reflector.fetch(NS, "absent", 10) is None
            assert sorted(reflector.in_namespace(NS)) == ["node-0", "node-2", "node-5"]
    finally:
        reflector.stop()


def test_a_cache_miss_whose_answer_hangs_gives_up_at_its_timeout(pods_api, tmp_path, monkeypatch):
    """Admission reads an owner its cache misses within the owner lookup timeout: an API server
    that holds the read must not hold the Pod's admission past the webhook's own timeout (the
    API server's failurePolicy would decide then, not oversale). The client the webhook loads."""
    from kube.reflector import Reflector, WatchedKind

    api = pods_api
    pods = WatchedKind("Pod", "CoreV1Api", "pod")
    reflector = Reflector.for_kind(loaded_client(api, tmp_path, monkeypatch), pods,
                                   lambda obj: obj["spec"].get("nodeName"), 300)
    api.held_reads["pods"] = held = threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(Exception, match="timed out"):
            reflector.fetch(NS, "web", 0.5)
        assert time.monotonic() - started < 2
        assert reflector.fetch(NS, "web", 0.5) == "node-0", "the next miss is read again"
    finally:
        held.set()


def test_a_deletion_the_watch_shows_leaves_the_cache(node_cache, caplog):
    api, reflector = node_cache
    api.put("pods", {"metadata": {"name": "other", "namespace": NS}, "spec": {"nodeName": "node-1"}})
    assert eventually(lambda: reflector.get(NS, "other") == "node-1"), told(caplog)
    api.delete("pods", NS, "web")
    assert eventually(lambda: reflector.get(NS, "web") is None), told(caplog)
    assert reflector.in_namespace(NS) == ["node-1"]
    assert api.count("GET", "pods", watch=False) == 1, "seen by the watch, not by a list"


def test_a_watch_bookmark_changes_nothing_but_where_the_watch_starts_again(node_cache, caplog):
    """A BOOKMARK carries only a resourceVersion: no object of the kind changes, but the cache
    stands there, so a watch cut after it starts again from it (etcd keeps recent versions only:
    from an older one it would be refused, and everything listed again)."""
    api, reflector = node_cache
    api.put("secrets", {"metadata": {"name": "elsewhere", "namespace": NS}, "data": {}})  # versions move on
    marked = api.bookmark("pods")
    assert eventually(lambda: reflector.resource_version == int(marked))
    assert reflector.in_namespace(NS) == ["node-0"]
    api.cut_watches.add("pods")
    api.put("pods", placed("node-1"))  # cut half-written, after the bookmark
    assert eventually(lambda: reflector.get(NS, "web") == "node-1"), told(caplog)
    assert told(caplog)[0] == f"pods watch cut (the connection dropped); watching again from resourceVersion {marked}"
    assert reflector.in_namespace(NS) == ["node-1"]
    assert api.count("GET", "pods", watch=False) == 1


def test_a_watch_whose_version_etcd_compacted_away_is_listed_again(node_cache, caplog):
    """A running watch that has sent everything goes on through compaction, as etcd's do; cut
    after it, it starts again from a version etcd no longer has: refused (410 Gone), then
    everything is listed again."""
    api, reflector = node_cache
    api.put("secrets", {"metadata": {"name": "first", "namespace": NS}, "data": {}})  # versions move on
    marked = api.bookmark("pods")  # past the list's version: the watch is running and has sent everything
    assert eventually(lambda: reflector.resource_version == int(marked))
    # Compaction forgets only versions older than the newest: a write elsewhere first.
    api.put("secrets", {"metadata": {"name": "elsewhere", "namespace": NS}, "data": {}})
    api.compact("pods")
    api.cut_watches.add("pods")
    api.put("pods", placed("node-1"))
    assert eventually(lambda: reflector.get(NS, "web") == "node-1"), told(caplog)
    assert api.count("GET", "pods", watch=False) == 2
    # Cut, not expired, first: the watch was still running after the compaction.
    assert told(caplog) == [f"pods watch cut (the connection dropped); watching again from resourceVersion {marked}",
                            "pods watch expired; listing again"]
    assert reflector.restarts == [("watch", "cut"), ("list", "expired")]


def test_a_watch_that_ends_quietly_at_its_timeout_is_watched_again_not_listed_again(pods_api, caplog):
    """The API server ends every watch at its timeoutSeconds (5 to 10 minutes here), most with no
    event in a quiet cluster: each is watched again from where the cache stands, never listed
    again, and one that ends quietly after refused watches says they work again."""
    api = pods_api
    reflector = node_reflector(api, watch_timeout=1)
    restarts = reflector.restarts
    reflector.start()
    try:
        assert reflector.synced.wait(10)
        api.down = True  # the next watch is refused (503)
        assert eventually(lambda: restarts, timeout=10), told(caplog)
        api.down = False
        assert eventually(lambda: any(re.fullmatch(r"pods watched again \(after \d+ failed runs?\)", line)
                                      for line in told(caplog)), timeout=10), told(caplog)
        watches = api.count("GET", "pods", watch=True)
        assert eventually(lambda: api.count("GET", "pods", watch=True) >= watches + 2, timeout=10)
        assert api.count("GET", "pods", watch=False) == 1, "never listed again"
        assert {tuple(r.query.get("resourceVersion", [])) for r in watches_of(api, "pods")} == {
            (str(reflector.resource_version),)}, "each watched from where the cache stands"
        assert set(restarts) == {("watch", "refused for now")}, restarts
        assert reflector.get(NS, "web") == "node-0"
    finally:
        reflector.stop()


def test_a_kind_the_api_server_does_not_serve_is_an_error_unless_it_is_optional(pods_api, caplog):
    """Only a custom resource whose CRD may be missing reads a 404 as "none of them": Pods not
    found is an API server or proxy in the way, and a cache synced empty would say no Pod runs."""
    from kube.reflector import Reflector

    pods_api.absent.add("pods")
    required, optional = node_reflector(pods_api), node_reflector(pods_api, optional=True)
    restarts = required.restarts
    # An optional kind's other failures are failures: a 500 is no uninstalled CRD.
    pods_api.storms["nodes"] = [500, 2]
    failing: list[tuple[str, str]] = []
    nodes = client.CoreV1Api(client.ApiClient(client.Configuration(host=pods_api.url)))
    flaky = Reflector("nodes", nodes.list_node, lambda obj: obj, 300, optional=True,
                      on_restart=lambda kind, again, cause: failing.append((again, cause)))
    for reflector in (required, optional, flaky):
        reflector.start()
    try:
        assert optional.synced.wait(10) and optional.in_namespace(NS) == []
        assert eventually(lambda: restarts), told(caplog)
        assert not required.synced.is_set() and restarts[0] == ("list", "list failed")
        # The nodes cache fails on its own thread meanwhile: its warning may come first.
        warned = [m for m in told(caplog, "WARNING") if m.startswith("pods ")]
        assert warned and "pods list failed (HTTP 404 Not Found" in warned[0], told(caplog, "WARNING")
        assert flaky.synced.wait(10) and failing == [("list", "list failed")] * 2
    finally:
        for reflector in (required, optional, flaky):
            reflector.stop()


def test_an_optional_kind_uninstalled_while_watched_is_emptied_quietly_and_seen_again_when_back(pods_api, caplog):
    """A CRD removed under a running cache (NodeResourceTopology's, when its exporter is
    uninstalled): its objects are gone with it, which is no failure to warn about or count; once
    installed again, it is listed again without a restart."""
    api = pods_api
    reflector = node_reflector(api, watch_timeout=1, optional=True)
    restarts = reflector.restarts
    api.absent.add("pods")  # not installed yet: listed again every watch timeout, said once
    started = time.monotonic()
    reflector.start()
    try:
        assert reflector.synced.wait(10) and reflector.in_namespace(NS) == []
        assert eventually(lambda: api.count("GET", "pods", watch=False) >= 3, timeout=10)
        assert time.monotonic() - started >= 2, "a list a watch timeout apart, not in a loop"
        assert told(caplog) == ["pods is not served by the API server (its CRD is not installed): none"]
        api.absent.discard("pods")
        assert eventually(lambda: reflector.get(NS, "web") == "node-0", timeout=10)
        api.absent.add("pods")  # the next watch, at the latest in a second, is answered 404
        assert eventually(lambda: reflector.in_namespace(NS) == [], timeout=10)
        api.absent.discard("pods")
        assert eventually(lambda: reflector.get(NS, "web") == "node-0", timeout=10)
        assert told(caplog, "WARNING") == [] and restarts == []
    finally:
        reflector.stop()


def test_a_watch_a_proxy_answers_with_its_page_is_said_once_and_listed_again_slowly(pods_api, caplog):
    """A proxy that passes the list but answers the long-lived watch with its own page: the cache
    is listed again for freshness, with a growing backoff, not every half second, and the
    operator reads what answered, not a JSON parser's complaint."""
    api = pods_api
    api.garbled_watches.add("pods")
    reflector = synced_node_cache(api)
    try:
        time.sleep(6)  # lists again after 0.5, 1.5 and 3.5 s, the next at 7.5 s
        lists, restarts = api.count("GET", "pods", watch=False), list(reflector.restarts)
        assert 2 <= lists <= 5
        # Each told before its backoff: the last one may be waiting for its list.
        assert set(restarts) == {("list", "refused")} and lists - 1 <= len(restarts) <= lists, (lists, restarts)
        assert told(caplog, "WARNING") == ["pods watch failed (the watch of /api/v1/pods answered no watch stream "
                                           "(text/html)); listing again with a backoff of up to 30s"]
        api.garbled_watches.clear()
        api.put("pods", placed("node-1"))  # read by the next list, or by the watch after it
        assert eventually(lambda: reflector.get(NS, "web") == "node-1", timeout=20)
        api.put("pods", placed("node-2"))
        assert eventually(lambda: reflector.get(NS, "web") == "node-2")
        assert re.fullmatch(r"pods watched again \(after [2-5] failed runs\)", told(caplog)[-1]), told(caplog)
    finally:
        reflector.stop()


def test_a_list_whose_continue_token_expired_is_read_whole_not_from_its_first_page_again(pods_api, caplog):
    """A page is read at the first page's revision, which etcd keeps 5 minutes: a large
    cluster's Pods paged slower than that, asked again from the first page, expire again, and the
    cache never syncs."""
    api = pods_api
    for index in range(500):  # 501 Pods with "web": two pages of 500
        api.put("pods", {"metadata": {"name": f"web-{index}", "namespace": NS}, "spec": {"nodeName": "node-0"}})
    api.expired_continues.add("pods")
    reflector = synced_node_cache(api)
    try:
        assert len(reflector.in_namespace(NS)) == 501
        assert api.count("GET", "pods", watch=False) == 3, "the first page, the second refused, then all in one"
        assert told(caplog) == ["pods list's continue token expired before its last page; listing whole"]
        api.put("pods", placed("node-1"))  # watched from the whole list's resourceVersion
        assert eventually(lambda: reflector.get(NS, "web") == "node-1")
        assert reflector.restarts == []
    finally:
        reflector.stop()


def test_the_api_server_down_and_back_admission_fails_open_and_caches_recover(webhook_on_api):
    api, server = webhook_on_api
    api.down = True
    try:
        statuses = []
        for _ in range(20):
            pod = web_pod()
            status, body = server.request("POST", "/mutate/pods", json.dumps(pod_review(pod)).encode())
            statuses.append(status)
            assert json.loads(body)["response"]["allowed"] is True
        assert statuses == [200] * 20, "never a 5xx"
        assert cpu_after(server) == "500m", "the warm cache still answers while the API server is down"
        deployment_and_replicaset(api, "4")  # changed while the webhook cannot see it
    finally:
        api.down = False
    assert eventually(lambda: cpu_after(server) == "250m", timeout=40), "caches catch up once it is back"


def test_429_and_500_storms_on_lists_are_retried_until_the_caches_sync(tmp_path):
    api = FakeKubeAPI().start()
    deployment_and_replicaset(api, "2")
    api.storms = {"deployments": [429, 3], "replicasets": [500, 3]}
    env = {"OVERSALE_KUBERNETES": "auto", "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig"))}
    server = RunningWebhook(tmp_path, env=env, workers=1)
    try:
        assert eventually(lambda: server.get("/readyz")[0] == 200, timeout=30), server.log.read_text()
        assert api.storms["deployments"][1] == 0 and api.storms["replicasets"][1] == 0, "every storm was met"
        assert cpu_after(server) == "500m"
    finally:
        server.stop()
        api.stop()


def test_a_500_storm_stops_the_pass_with_a_reason_and_the_next_pass_works(tmp_path, caplog):
    api = FakeKubeAPI().start()
    try:
        api.put("nodes", {"metadata": {"name": "n1", "labels": {KEYS.oversale_label: "enabled"},
                                       "annotations": {KEYS.cpu_oversale_ratio: "3"}},
                          "status": {"allocatable": {"cpu": "4", "memory": "16Gi"}}})
        reconciler = Reconciler(Cluster(client.ApiClient(client.Configuration(host=api.url))),
                                _NoHistory(), Settings(kubernetes="off", inplace_resize=False))
        api.storms = {"nodes": [500, 100]}
        with caplog.at_level(logging.WARNING, logger="reconcilers"):
            rows = reconciler.run_pass()
        assert [(r.object, r.resource, r.reason) for r in rows] == [
            ("*", "*", "oversale: the API server failed (HTTP 500 Internal Server Error); retried next pass")]
        assert reconciler.incomplete == ["oversale: the API server failed (HTTP 500 Internal Server Error)"]
        assert "oversale pass stopped: the API server failed (HTTP 500 Internal Server Error); retried next pass" \
            in caplog.messages
        assert reconciler.metrics.skips.labels("oversale-api-error")._value.get() == 1
        last_pass = reconciler.metrics.last_pass
        assert last_pass.labels("incomplete")._value.get() > time.time() - 60
        assert last_pass.labels("complete")._value.get() == 0, "what the PassesIncomplete alert reads"
        api.storms = {}
        rows = reconciler.run_pass()
        assert [r.object for r in rows] == ["Node/n1", "Node/n1"] and all("holding" in r.reason for r in rows)
        assert reconciler.metrics.evaluated.labels("oversale")._value.get() == 1, "one node, two rows"
        assert reconciler.metrics.evaluated.labels("compression")._value.get() == 0
        assert 0 < reconciler.metrics.pass_duration.labels("oversale")._value.get() < 30
        assert reconciler.incomplete == ["node history unavailable (down)"], "each pass says its own"
        assert reconciler.metrics.staleness.labels("nodes")._value.get() == -1, "-1: source unavailable"
    finally:
        api.stop()


class _NoHistory:
    """A history source whose backend is down (what both real sources raise then)."""

    queries = 0

    def container_stats(self, window: float, percentile: float) -> dict[Any, Any]:
        raise HistoryUnavailable("down")

    def node_stats(self, window: float, percentile: float, memory_percentile: float | None = None,
                   counts_from: Any = None, steps_counted: Any = None) -> dict[Any, Any]:
        raise HistoryUnavailable("down")

    def node_hot_time(self, windows: Any, real: dict[str, Any]) -> list[Any]:
        raise HistoryUnavailable("down")

    def node_peaks(self, window: float) -> dict[Any, Any]:
        raise HistoryUnavailable("down")

    def check_rate_window(self) -> None:
        raise HistoryUnavailable("down")


@pytest.mark.parametrize(("body", "raw"), GARBAGE_ANSWERS)
def test_prometheus_answering_garbage_holds_the_ratios_and_says_why(body, raw):
    server = garbage_prometheus(body, raw=raw)
    api = FakeKubeAPI().start()
    try:
        api.put("deployments", {"metadata": {"name": "web", "namespace": NS, "annotations": {
            KEYS.enable_resource_compress: "y", KEYS.cpu_requests_ratio: "2"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}})
        history = PrometheusHistory(server.url, resolution=300)
        reconciler = Reconciler(Cluster(client.ApiClient(client.Configuration(host=api.url))), history,
                                Settings(kubernetes="off", inplace_resize=False))
        rows = reconciler.run_pass()
        assert any("history unavailable, holding" in r.reason for r in rows), [r.reason for r in rows]
        annotations = api.get("deployments", NS, "web")["metadata"]["annotations"]
        assert annotations[KEYS.cpu_requests_ratio] == "2", "held"
    finally:
        server.shutdown()
        api.stop()


@pytest.mark.parametrize("values", ['[[1, "0.5"], [2]]', '[[1, "half"]]', '"0.5"', '[[1, "NaN"], [2, "0.5"]]'])
def test_a_range_answer_is_read_series_by_series_and_a_malformed_one_said_so(values):
    """A range query's points are read into arrays as each series is parsed (a whole answer as
    lists took 200 bytes a point); points that are not time and value pairs say the answer is
    no range vector, and NaN steps are left out."""
    body = ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"instance": "a"}, '
            f'"values": {values}}}]}}}}').encode()
    server = garbage_prometheus(body)
    try:
        api = PrometheusAPI(server.url)
        if "NaN" in values:
            [(labels, (times, points))] = api.query_range("up", 1, 2, 1)
            assert labels == {"instance": "a"} and list(times) == [2.0] and list(points) == [0.5]
        else:
            with pytest.raises(PrometheusUnavailable, match="answered no range vector"):
                api.query_range("up", 1, 2, 1)
    finally:
        server.shutdown()


def test_parts_sized_by_points_hold_one_step_at_least_when_the_series_outnumber_the_points():
    """Parts after the first are sized to about ``part_points`` points from the series the last
    part had (steps = points / series); with more series than that, each part is still one step,
    not none (which asked no step, forever)."""
    two_series = (b'{"status": "success", "data": {"resultType": "matrix", "result": ['
                  b'{"metric": {"node": "a"}, "values": [[1, "1"]]}, '
                  b'{"metric": {"node": "b"}, "values": [[1, "2"]]}]}}')
    server = garbage_prometheus(two_series)
    try:
        parts = list(PrometheusAPI(server.url).range_parts("up", 0, 3, 1, part_steps=1, part_points=1))
        assert len(parts) == 4 and len(server.headers_seen) == 4
        # 4 points a part of 2 series: 2 steps a part after the first (steps 0, 1-2, 3).
        parts = list(PrometheusAPI(server.url).range_parts("up", 0, 3, 1, part_steps=1, part_points=4))
        assert len(parts) == 3 and len(server.headers_seen) == 4 + 3
    finally:
        server.shutdown()


def test_an_error_answered_with_200_is_a_failed_query_and_too_many_samples_is_asked_again_in_halves():
    """A proxy or store may answer an error with status 200: its ``error`` is what the message
    says, and one that says the query would load too many samples is asked again in halves, as a
    422 saying so is (4 steps, then 2, then 1, then refused)."""
    failed = garbage_prometheus(b'{"status": "error", "errorType": "execution", "error": "store gateway gone"}')
    too_many = garbage_prometheus(b'{"status": "error", "errorType": "execution", '
                                  b'"error": "query processing would load too many samples into memory"}')
    try:
        with pytest.raises(PrometheusUnavailable) as raised:
            PrometheusAPI(failed.url).instant("up", 1, ())
        assert str(raised.value) == "prometheus query failed: store gateway gone"
        with pytest.raises(QueryTooLarge, match="too many samples"):
            PrometheusAPI(too_many.url).query_range("up", 0, 3, 1)
        assert len(too_many.headers_seen) == 3
    finally:
        failed.shutdown()
        too_many.shutdown()


def test_a_prometheus_that_never_answers_is_given_up_on_and_a_node_read_says_what_to_set():
    """A Prometheus that takes a query and never answers (its process stopped, a proxy holding
    the connection) is given up on 5 s after the query's own timeout (Prometheus's own timeout
    answers first where it runs), and a node read it held says what makes node reads slow and
    what to set, as one Prometheus timed out does; a connection refused says no such thing."""
    with socket.socket() as never_answers:
        never_answers.bind(("127.0.0.1", 0))
        never_answers.listen(8)  # connections wait in the backlog, their queries read by no one
        url = f"http://127.0.0.1:{never_answers.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(HistoryUnavailable) as raised:
            PrometheusHistory(url, timeout=0.5, resolution=60).node_stats(86400, 0.99)
        assert 5.5 <= time.monotonic() - started < 15
    assert f"prometheus at {url} did not answer within 5.5s" in str(raised.value)
    assert "OVERSALE_PROMETHEUS_NODE_CPU_QUERY" in str(raised.value)
    # Its port closed now: a refused connection is no slow query, and says nothing of one.
    with pytest.raises(HistoryUnavailable) as refused:
        PrometheusHistory(url, timeout=0.5, resolution=60).node_stats(86400, 0.99)
    assert f"prometheus at {url} unreachable" in str(refused.value)
    assert "OVERSALE_PROMETHEUS_NODE_CPU_QUERY" not in str(refused.value)


def test_a_worker_killed_under_load_costs_no_5xx(webhook_no_cluster):
    server = webhook_no_cluster
    body = json.dumps(pod_review(web_pod())).encode()
    statuses: list[int] = []
    resets = 0
    stop = threading.Event()

    def load() -> None:
        nonlocal resets
        connection = server.connection()
        while not stop.is_set():
            try:
                connection.request("POST", "/mutate/pods", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                statuses.append(response.status)
            except (ConnectionError, http.client.HTTPException, ssl.SSLError, OSError):
                resets += 1  # allowed: the API server retries a reset connection
                connection.close()
                connection = server.connection()
        connection.close()

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    workers = subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True).stdout.split()
    assert workers, "gunicorn workers"
    os.kill(int(workers[0]), signal.SIGKILL)
    time.sleep(2.0)
    stop.set()
    for thread in threads:
        thread.join()
    assert statuses and set(statuses) == {200}, f"statuses seen: {set(statuses)}"
    assert eventually(lambda: len(subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True,
                                                 text=True).stdout.split()) == len(workers)), "worker replaced"
    assert server.get("/healthz")[0] == 200


def test_background_work_outlives_a_failure_it_did_not_foresee(caplog):
    """The sampler, the remediator, the extender's pollers and its leadership check run on
    daemon threads: one that died on an unforeseen error would leave the process on its last
    figures with nothing said. The failure is logged by name and the next run goes ahead."""
    runs: list[float] = []
    parked = threading.Event()  # never set: once seen, the work waits out the rest of the suite

    def work() -> None:
        if len(runs) >= 3:
            parked.wait()
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise KeyError("an answer of a shape nobody foresaw")

    with caplog.at_level("ERROR", logger="tests.background"):
        thread = run_every(0.05, work, "usage-poller", logging.getLogger("tests.background"))
        assert eventually(lambda: len(runs) >= 3, timeout=10), "runs again after the failure"
    assert thread.daemon and thread.name == "usage-poller" and thread.is_alive()
    assert runs[1] - runs[0] >= 0.05 and runs[2] - runs[1] >= 0.05, "each run waits the interval after the last"
    failures = [r for r in caplog.records if r.name == "tests.background"]
    assert len(failures) == 1 and failures[0].getMessage() == "usage-poller failed; trying again in 0.05s"
    assert failures[0].exc_info is not None, "with the traceback"


def test_an_answer_that_cannot_be_written_as_json_is_allowed_unchanged_counted_and_logged(caplog):
    """The last guard of the fail-open edge: whatever a policy hands back, the API server gets an
    AdmissionReview that allows the object unchanged, never a 5xx. Its time is observed too."""
    from webhook.app import admission
    from webhook.metrics import Metrics

    metrics, review = Metrics(), pod_review(web_pod())
    uid = review["request"]["uid"]
    started = time.perf_counter()
    with caplog.at_level("ERROR", logger="webhook.app"):
        status, body = admission(Settings(kubernetes="off"), metrics, "pods",
                                 lambda request: {"response": {"uid": request["uid"], "allowed": True,
                                                               "odd": {1, 2}}},
                                 json.dumps(review).encode())
    took = time.perf_counter() - started
    assert status == 200
    assert json.loads(body) == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                "response": {"uid": uid, "allowed": True}}
    assert metrics.admissions.labels("pods", "error")._value.get() == 1
    assert [r.getMessage() for r in caplog.records if r.name == "webhook.app"] == [
        f"review {uid} could not be serialised; allowing unchanged"]
    assert 0 < metrics.latency.labels("pods")._sum.get() <= took


def test_an_answer_that_raises_is_allowed_unchanged_counted_and_logged_with_its_traceback(caplog):
    from webhook.app import admission
    from webhook.metrics import Metrics

    metrics, review = Metrics(), pod_review(web_pod())
    uid = review["request"]["uid"]

    def broken_policy(request: Any) -> Any:
        raise KeyError("an answer of a shape nobody foresaw")

    with caplog.at_level("ERROR", logger="webhook.app"):
        status, body = admission(Settings(kubernetes="off"), metrics, "pods", broken_policy,
                                 json.dumps(review).encode())
    assert status == 200 and json.loads(body)["response"] == {"uid": uid, "allowed": True}
    assert metrics.admissions.labels("pods", "error")._value.get() == 1
    [logged] = [r for r in caplog.records if r.name == "webhook.app"]
    assert logged.getMessage() == f"admission of pods review {uid} failed; allowing unchanged"
    assert logged.exc_info is not None and "nobody foresaw" in str(logged.exc_info[1])


def wsgi_post(app: Any, stream: io.BytesIO, content_length: str | None) -> tuple[str, bytes]:
    """POST ``stream`` to /mutate/pods as a WSGI server hands a body over (a chunked one comes with
    no CONTENT_LENGTH): the status line and the body answered."""
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/mutate/pods", "wsgi.input": stream,
               **({} if content_length is None else {"CONTENT_LENGTH": content_length})}
    started: list[str] = []
    answer = b"".join(app.wsgi_app(environ, lambda status, headers: started.append(status)))
    return started[0], answer


def test_a_review_exactly_at_the_body_limit_is_answered_and_one_byte_more_is_not():
    """OVERSALE_MAX_BODY_BYTES is the largest body answered, whether its length is declared or
    only known once read (a chunked body)."""
    body = json.dumps(pod_review(web_pod())).encode()
    app = no_cluster_app(max_body_bytes=len(body))
    for chunked in (False, True):
        for sent in (body, body + b" "):
            status, answer = wsgi_post(app, io.BytesIO(sent), None if chunked else str(len(sent)))
            if sent == body:
                assert status == "200 OK" and json.loads(answer)["response"]["allowed"] is True, chunked
            else:
                assert status == "400 Bad Request", chunked
                assert f"larger than {len(body)} bytes" in json.loads(answer)["error"], chunked


def test_a_body_over_the_limit_is_read_to_its_end_up_to_a_bound():
    """A client still sending when the connection closes sees a reset instead of the 400 that
    explains it: an oversized body is read and dropped, up to about 4x the limit in all."""
    limit = 1000
    app = no_cluster_app(max_body_bytes=limit)
    for size, declared in ((3 * limit, True), (3 * limit, False), (10 * limit, True), (10 * limit, False)):
        stream = io.BytesIO(b" " * size)
        assert wsgi_post(app, stream, str(size) if declared else None)[0] == "400 Bad Request"
        if size <= 4 * limit:
            assert stream.tell() == size, declared
        else:
            assert 4 * limit <= stream.tell() <= 4 * limit + 1, declared


def test_a_content_length_that_is_not_a_number_is_read_as_no_length():
    body = json.dumps(pod_review(web_pod())).encode()
    status, answer = wsgi_post(no_cluster_app(), io.BytesIO(body), "lots")
    assert status == "200 OK" and json.loads(answer)["response"]["uid"] == json.loads(body)["request"]["uid"]
