"""In-place resize: new ratios reach running Pods through ``pods/resize``.

End to end, the real ``kubernetes`` client talks to the API double, which applies the real API's
resize rules (only cpu/memory of app containers and sidecars, QoS immutable) and answers as the
kubelet would. The Pods start as the webhook admitted them, and a resized Pod is compared with
what the webhook gives a new Pod at the same ratios.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube.leader import LeaseElector
from oversale.annotations import AnnotationKeys
from oversale.compression import CompressionConfig
from oversale.limitrange import NO_BOUNDS, RequestBounds
from oversale.resize import ResizeLimits, plan_resize, vpa_controlled
from oversale.settings import Settings
from oversale.timestamps import format_timestamp
from reconcilers.cluster import Cluster
from reconcilers.runner import NotLeader, Reconciler
from reconcilers.sqlite_history import SqliteHistory
from tests.conftest import apply_response, damage_sqlite, pod_review
from tests.kube_api import FakeKubeAPI
from webhook.owners import OwnerAnnotations
from webhook.pod_admission import admit_pod

KEYS = AnnotationKeys()
NS = "shop"
SETTINGS = Settings(kubernetes="off", full_confidence_seconds=86400.0)
PODS = ("web-5d8f9-abcde", "web-5d8f9-fghij")
KEY = ("Deployment", NS, "web")


def template(cpu: str = "1", memory: str = "1Gi", limits: dict[str, str] | None = None,
             **container: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = limits
    return {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "nginx", "resources": resources, **container}]}}


def deployment(annotations: dict[str, str], pod_template: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": NS, "annotations": annotations},
            "spec": {"template": pod_template}}


def vpa(name: str, update_mode: str | None = "Auto", *policies: dict[str, Any], kind: str = "Deployment") -> dict:
    """A VerticalPodAutoscaler of the Deployment web (``kind``: of another kind of that name)."""
    spec: dict[str, Any] = {"targetRef": {"apiVersion": "apps/v1", "kind": kind, "name": "web"}}
    if update_mode is not None:
        spec["updatePolicy"] = {"updateMode": update_mode}
    if policies:
        spec["resourcePolicy"] = {"containerPolicies": list(policies)}
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec}


class Workloads:
    """What the webhook reads a Pod's owner from: here, the one Deployment under test."""

    def __init__(self, annotations: dict[str, str], bounds: RequestBounds = NO_BOUNDS) -> None:
        self.annotations = annotations
        self.bounds = bounds

    def owner_annotations(self, pod: Any, namespace: str) -> OwnerAnnotations:
        return OwnerAnnotations(KEYS.ours(self.annotations), "Deployment/shop/web")

    def bounds_for(self, namespace: str) -> RequestBounds:
        return self.bounds


def admitted(name: str, pod_template: dict[str, Any], workload: dict[str, str]) -> dict[str, Any]:
    """A Pod of the template as the webhook admits it, then scheduled and running."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, **pod_template["metadata"]},
           "spec": json.loads(json.dumps(pod_template["spec"]))}
    decision = admit_pod(pod_review(pod)["request"], SETTINGS, Workloads(workload))
    pod = apply_response(pod, decision.review["response"])
    pod["spec"]["nodeName"] = "node-1"
    pod["status"] = {"phase": "Running", "containerStatuses": [
        {"name": c["name"], "resources": json.loads(json.dumps(c["resources"]))} for c in pod["spec"]["containers"]]}
    return pod


def requests(pod: dict[str, Any], container: int = 0) -> dict[str, str]:
    return pod["spec"]["containers"][container]["resources"]["requests"]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    fake = FakeKubeAPI().start()
    yield fake
    fake.stop()


def history(path: Path, cpu_millicores: int = 200) -> SqliteHistory:
    """Two days of samples every 10 minutes for both Pods of the Deployment."""
    stored = SqliteHistory(path, retention_seconds=8 * 86400)
    now = time.time()
    for t in range(int(now - 2 * 86400), int(now), 600):
        stored.record(t, [((NS, pod, "app"), cpu_millicores, 300 * 2**20) for pod in PODS], [])
    return stored


def reconciler(api: FakeKubeAPI, tmp_path: Path, settings: Settings = SETTINGS,
               clock: Clock | None = None, leader: LeaseElector | None = None) -> Reconciler:
    cluster = Cluster(client.ApiClient(client.Configuration(host=api.url)))
    return Reconciler(cluster, history(tmp_path / "history.db"), settings, leader, clock=clock or Clock())


def setup(api: FakeKubeAPI, annotations: dict[str, str], pod_template: dict[str, Any] | None = None,
          pods: tuple[str, ...] = PODS) -> None:
    pod_template = pod_template or template()
    api.put("deployments", deployment(annotations, pod_template))
    for name in pods:
        api.put("pods", admitted(name, pod_template, annotations))


def stored(api: FakeKubeAPI, name: str = PODS[0]) -> dict[str, Any]:
    pod = api.get("pods", NS, name)
    assert pod is not None
    return pod


def leading(api: FakeKubeAPI, clock: Clock) -> LeaseElector:
    """A replica holding the reconcilers' Lease for 15 s of ``clock``."""
    elector = LeaseElector(client.ApiClient(client.Configuration(host=api.url)), "oversale", "oversale-reconciler",
                           "a", 15, clock)
    assert elector.try_acquire_or_renew()
    return elector


def resize_calls(api: FakeKubeAPI) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH" and r.path.endswith("/resize"))


# ---- end to end -----------------------------------------------------------------------------

def test_a_new_ratio_resizes_running_pods_like_the_webhook_would_admit_them(api, tmp_path, caplog):
    on = {KEYS.enable_resource_compress: "y"}
    setup(api, on)
    clock = Clock()
    reconciler_ = reconciler(api, tmp_path, clock=clock)
    with caplog.at_level(logging.INFO, logger="reconcilers.runner"):
        rows = reconciler_.run_pass()
    assert sorted(m for m in caplog.messages if "resized in place" in m) == [  # written a few at a time
        f"Pod/{NS}/{name}: resized in place: app/cpu 1 -> 800m" for name in PODS]

    # 1000m requested, ~210m used: the first step is capped at +25%, ratio 1.25 -> 800m.
    workload = api.get("deployments", NS, "web")["metadata"]["annotations"]
    assert workload[KEYS.cpu_requests_ratio] == "1.25"
    for name in PODS:
        pod = stored(api, name)
        assert requests(pod) == {"cpu": "800m", "memory": "1Gi"}, "memory is not opted in: left alone"
        assert pod["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] == "800m", "kubelet applied it"
        # The Pod now carries exactly what the webhook gives a new Pod at the new ratio.
        fresh = admitted("web-5d8f9-new00", template(), workload)
        assert requests(pod) == requests(fresh)
        for key in (KEYS.original_requests, KEYS.compression):
            assert pod["metadata"]["annotations"][key] == fresh["metadata"]["annotations"][key]
        assert pod["metadata"]["annotations"][KEYS.resized_ratios] == "cpu=1.25"
    resized = [r for r in rows if r.object.startswith("Pod/") and r.written]
    assert [(r.object, r.resource, r.current, r.proposed, r.reason) for r in resized] == [
        (f"Pod/{NS}/{name}", "cpu", "1", "800m", "in-place resize of app (cpu=1.25)") for name in PODS]
    # Each Event names its Pod by kind too, or `kubectl describe pod` does not show it.
    events = {(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"], e["message"])
              for e in api.list_objects("events", NS, {})["items"]}
    told = "requests resized in place to ratios cpu=1.25: app/cpu 1 -> 800m"
    assert {("Pod", name, "ResizedInPlace", told) for name in PODS} <= events
    assert reconciler_.metrics.resizes.labels("ok")._value.get() == 2
    assert reconciler_.metrics.resize_supported._value.get() == 1

    # The next pass raises the ratio again (1.25 -> 1.56), but a Pod is resized at most once per
    # interval; after it, the Pods follow.
    reconciler_.run_pass()
    assert requests(stored(api)) == {"cpu": "800m", "memory": "1Gi"}
    clock.now += SETTINGS.resize_min_interval_seconds + 1
    reconciler_.run_pass()
    workload = api.get("deployments", NS, "web")["metadata"]["annotations"]
    assert workload[KEYS.cpu_requests_ratio] == "1.95"
    fresh = admitted("web-5d8f9-new01", template(), workload)
    assert requests(stored(api)) == requests(fresh) == {"cpu": "513m", "memory": "1Gi"}
    # Restored from the original, not compounded on 800m.
    assert json.loads(stored(api)["metadata"]["annotations"][KEYS.original_requests]) == {
        "app": {"cpu": "1", "memory": "1Gi"}}


def test_pods_follow_the_ratio_carried_while_the_history_cannot_be_read(api, tmp_path):
    """A ratio written by an earlier pass whose resize was held back (the rate limits, a replica
    stopped): a pass that cannot read the history holds the ratio, and still brings the running
    Pods to it."""
    setup(api, {KEYS.enable_resource_compress: "y"})  # Pods admitted before any ratio: 1000m each
    written = api.get("deployments", NS, "web")
    written["metadata"]["annotations"][KEYS.cpu_requests_ratio] = "2"
    api.put("deployments", written)
    reconciler_ = reconciler(api, tmp_path)
    damage_sqlite(tmp_path / "history.db")
    rows = reconciler_.run_pass()
    assert any(r.object == "Deployment/shop/web" and r.reason.startswith("history unavailable, holding")
               for r in rows)
    assert api.get("deployments", NS, "web")["metadata"]["annotations"][KEYS.cpu_requests_ratio] == "2"
    assert [requests(stored(api, name))["cpu"] for name in PODS] == ["500m", "500m"]


def test_in_place_resize_switched_off_leaves_running_pods_to_their_next_rollout(api, tmp_path):
    setup(api, {KEYS.enable_resource_compress: "y"})
    rows = reconciler(api, tmp_path, dataclasses.replace(SETTINGS, inplace_resize=False)).run_pass()
    assert api.get("deployments", NS, "web")["metadata"]["annotations"][KEYS.cpu_requests_ratio] == "1.25"
    assert resize_calls(api) == 0 and [requests(stored(api, name))["cpu"] for name in PODS] == ["1", "1"]
    assert not [r for r in rows if r.object.startswith("Pod/")]


def test_a_raise_keeps_the_qos_class_and_goes_through_the_real_rules(api, tmp_path):
    annotations = {KEYS.cpu_requests_ratio: "1"}
    burstable = template("500m", "1Gi", limits={"cpu": "1", "memory": "1Gi"})
    setup(api, annotations, burstable, pods=PODS[:1])
    rows = reconciler(api, tmp_path).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "0.25"}})
    pod = stored(api)
    # 500m / 0.25 = 2 cores, capped one millicore under the 1-core limit: Guaranteed would be a QoS change.
    assert requests(pod)["cpu"] == "999m"
    assert [r.written for r in rows if r.object.startswith("Pod/")] == [True]
    assert json.loads(pod["metadata"]["annotations"][KEYS.written_requests]) == {"app": {"cpu": "999m",
                                                                                         "memory": "1Gi"}}


def test_a_resize_that_would_change_the_qos_class_is_never_sent(api, tmp_path):
    settings = dataclasses.replace(SETTINGS, allow_guaranteed_downgrade=True)
    guaranteed = template("1", "1Gi", limits={"cpu": "1", "memory": "1Gi"})
    setup(api, {}, guaranteed, pods=PODS[:1])
    rows = reconciler(api, tmp_path, settings).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert resize_calls(api) == 0
    assert requests(stored(api))["cpu"] == "1"
    assert any("would change the QoS class from Guaranteed to Burstable (the API refuses that)" in r.reason
               for r in rows)
    plan = plan_resize(running(guaranteed), {KEYS.cpu_requests_ratio: "2"}, KEYS,
                       dataclasses.replace(CONFIG, allow_guaranteed_downgrade=True), NO_BOUNDS, 0, LIMITS)
    assert (plan.code, plan.skipped) == ("qos", "would change the QoS class from Guaranteed to Burstable "
                                                "(the API refuses that)")


def test_an_infeasible_resize_is_recorded_and_not_retried_until_the_ratio_changes(api, tmp_path):
    setup(api, {}, pods=PODS[:1])
    api.kubelet_answers[(NS, PODS[0])] = "Infeasible"
    clock = Clock()
    reconciler_ = reconciler(api, tmp_path, clock=clock)
    raise_ratio = {KEY: {KEYS.cpu_requests_ratio: "0.5"}}
    reconciler_.reconcile_resizes(False, raise_ratio)
    assert resize_calls(api) == 1
    assert stored(api)["status"]["conditions"][0]["reason"] == "Infeasible"

    for _ in range(3):
        clock.now += SETTINGS.resize_min_interval_seconds + 1
        rows = reconciler_.reconcile_resizes(False, raise_ratio)
        assert any("Infeasible" in r.reason for r in rows)
    assert resize_calls(api) == 1, "not retried"
    assert stored(api)["metadata"]["annotations"][KEYS.resize_infeasible] == "cpu=0.5"
    warnings = [e for e in api.list_objects("events", NS, {})["items"] if e["reason"] == "ResizeInfeasible"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"

    api.kubelet_answers.pop((NS, PODS[0]))
    clock.now += SETTINGS.resize_min_interval_seconds + 1
    reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "0.8"}})
    assert resize_calls(api) == 2, "a new ratio is tried again"
    pod = stored(api)
    assert requests(pod)["cpu"] == "1250m"
    assert KEYS.resize_infeasible not in pod["metadata"]["annotations"]
    assert not [c for c in pod["status"]["conditions"] if c["type"] == "PodResizePending"]


def test_a_deferred_resize_is_left_to_the_kubelet(api, tmp_path):
    setup(api, {}, pods=PODS[:1])
    api.kubelet_answers[(NS, PODS[0])] = "Deferred"
    clock = Clock()
    reconciler_ = reconciler(api, tmp_path, clock=clock)
    reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "0.5"}})
    clock.now += SETTINGS.resize_min_interval_seconds + 1
    rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "0.5"}})
    assert resize_calls(api) == 1
    assert any("Deferred: left to the kubelet" in r.reason for r in rows)


def test_an_api_server_without_pods_resize_degrades_to_the_next_rollout(api, tmp_path, caplog):
    api.absent.add("pods/resize")
    setup(api, {KEYS.enable_resource_compress: "y"})
    clock = Clock()
    reconciler_ = reconciler(api, tmp_path, clock=clock)
    said = ("the API server has no pods/resize (Kubernetes before 1.33, or InPlacePodVerticalScaling off): new "
            "ratios reach running Pods at their next rollout")
    with caplog.at_level(logging.WARNING):
        reconciler_.run_pass()
        assert caplog.messages == [said], "said at the first pass"
        reconciler_.run_pass()
    assert api.get("deployments", NS, "web")["metadata"]["annotations"][KEYS.cpu_requests_ratio] == "1.56"
    assert requests(stored(api))["cpu"] == "1", "running Pods keep their requests"
    assert resize_calls(api) == 0
    assert caplog.messages == [said], "said once"
    assert reconciler_.metrics.resize_supported._value.get() == 0

    # The feature gate turned on, then off again (a control plane rolled back): said again.
    api.absent.discard("pods/resize")
    reconciler_.run_pass()
    assert resize_calls(api) == len(PODS) and reconciler_.metrics.resize_supported._value.get() == 1
    api.absent.add("pods/resize")
    clock.now += SETTINGS.resize_min_interval_seconds + 1
    with caplog.at_level(logging.WARNING):
        reconciler_.run_pass()
    assert caplog.messages == [said, said]


def test_workloads_a_vpa_resizes_are_left_alone(api, tmp_path, caplog):
    setup(api, {})
    web_vpa = vpa("web-vpa", "InPlaceOrRecreate")
    api.put("verticalpodautoscalers", web_vpa)
    api.put("pods", admitted("worker-7c6d5-abcde", template(), {}))  # a workload no VPA manages, listed after web's
    ratios = {KEY: {KEYS.cpu_requests_ratio: "2"}, ("Deployment", NS, "worker"): {KEYS.cpu_requests_ratio: "2"}}
    reconciler_ = reconciler(api, tmp_path)
    with caplog.at_level(logging.INFO):
        rows = reconciler_.reconcile_resizes(False, ratios)
    assert [m for m in caplog.messages if "VerticalPodAutoscaler" in m] == [
        "Deployment/shop/web: managed by VerticalPodAutoscaler web-vpa, its Pods are not resized in place (two "
        "controllers resizing one Pod fight)"], "said once for the workload"
    assert [(r.object, r.resource, r.reason) for r in rows if not r.written] == [
        (f"Pod/{NS}/{name}", "*", "skipped: managed by VerticalPodAutoscaler web-vpa") for name in PODS]
    assert reconciler_.metrics.skips.labels("resize-vpa")._value.get() == len(PODS)
    assert resize_calls(api) == 1 and requests(stored(api, "worker-7c6d5-abcde"))["cpu"] == "500m"
    api.delete("pods", NS, "worker-7c6d5-abcde")
    api.requests.clear()

    # A VPA that only recommends does not resize anything: ours may.
    web_vpa["spec"]["updatePolicy"]["updateMode"] = "Off"
    api.put("verticalpodautoscalers", web_vpa)
    reconciler(api, tmp_path).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert resize_calls(api) == 2


def test_pods_a_vpa_on_the_workloads_owner_resizes_are_left_alone(api, tmp_path):
    # A Deployment an operator's scalable resource owns: VPA acts through that resource.
    setup(api, {KEYS.enable_resource_compress: "y"})
    web = api.get("deployments", NS, "web")
    web["metadata"]["ownerReferences"] = [{"apiVersion": "example.com/v1", "kind": "WebApp", "name": "shopfront",
                                           "uid": "u-shopfront", "controller": True}]
    api.put("deployments", web)
    api.put("verticalpodautoscalers", {"metadata": {"name": "shopfront-vpa", "namespace": NS},
                                       "spec": {"targetRef": {"apiVersion": "example.com/v1", "kind": "WebApp",
                                                              "name": "shopfront"},
                                                "updatePolicy": {"updateMode": "InPlaceOrRecreate"}}})
    rows = reconciler(api, tmp_path).run_pass()
    assert resize_calls(api) == 0
    assert any(r.object.startswith("Pod/") and "VerticalPodAutoscaler shopfront-vpa" in r.reason for r in rows)


def test_a_pass_lists_the_vpas_once_for_compression_and_resize(api, tmp_path, caplog):
    # A cluster with thousands of VPAs pays for every list: compression and resize share one.
    setup(api, {KEYS.enable_resource_compress: "y"})
    api.put("verticalpodautoscalers",
            vpa("web-vpa", "InPlaceOrRecreate", {"containerName": "*", "controlledResources": ["memory"]}))
    rows = reconciler(api, tmp_path).run_pass()
    assert api.count("GET", "verticalpodautoscalers") == 1
    # VPA sets memory only: cpu gets a ratio, and the Pods VPA resizes are still left alone.
    assert KEYS.cpu_requests_ratio in api.get("deployments", NS, "web")["metadata"]["annotations"]
    assert resize_calls(api) == 0
    assert any(r.object.startswith("Pod/") and "VerticalPodAutoscaler web-vpa" in r.reason for r in rows)

    # A VPA list the API refuses: no resize at all this pass, and still a single list.
    api.requests.clear()
    api.unavailable.add("verticalpodautoscalers")
    with caplog.at_level(logging.WARNING, logger="reconcilers.runner"):
        rows = reconciler(api, tmp_path).run_pass()
    assert api.count("GET", "verticalpodautoscalers") == 1
    assert resize_calls(api) == 0 and not any(r.object.startswith("Pod/") for r in rows)
    assert caplog.messages == [
        "cannot list VerticalPodAutoscalers (HTTP 503 Service Unavailable): workloads they manage are not told apart "
        "this pass", "in-place resize skipped this pass: the API server failed (HTTP 503 Service Unavailable)"]


def test_clusters_without_the_vpa_crd_resize(api, tmp_path):
    api.absent.add("verticalpodautoscalers")
    setup(api, {}, pods=PODS[:1])
    reconciler(api, tmp_path).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert requests(stored(api))["cpu"] == "500m"


def test_memory_only_when_opted_in_and_without_a_restart_unless_accepted(api, tmp_path):
    restarts = template(resizePolicy=[{"resourceName": "memory", "restartPolicy": "RestartContainer"}])
    setup(api, {}, restarts, pods=PODS[:1])
    ratios = {KEYS.cpu_requests_ratio: "2", KEYS.memory_requests_ratio: "2"}
    reconciler(api, tmp_path).reconcile_resizes(False, {KEY: ratios})
    assert requests(stored(api)) == {"cpu": "500m", "memory": "1Gi"}, "memory not opted in"

    setup(api, {}, restarts, pods=PODS[1:])
    opted = {**ratios, KEYS.enable_memory_compress: "y"}
    reconciler(api, tmp_path).reconcile_resizes(False, {KEY: opted})
    assert requests(stored(api, PODS[1])) == {"cpu": "500m", "memory": "1Gi"}, "memory restarts the container"

    api.put("pods", admitted("web-5d8f9-klmno", restarts, {}))
    reconciler(api, tmp_path).reconcile_resizes(False, {KEY: {**opted, KEYS.resize_restart: "y"}})
    assert requests(stored(api, "web-5d8f9-klmno")) == {"cpu": "500m", "memory": "512Mi"}


def test_dry_run_lists_the_resizes_and_writes_nothing(api, tmp_path):
    setup(api, {KEYS.enable_resource_compress: "y"})
    before = [stored(api, name) for name in PODS]
    rows = reconciler(api, tmp_path).run_pass(dry_run=True)
    assert [(r.object, r.proposed, r.written) for r in rows if r.object.startswith("Pod/")] == [
        (f"Pod/{NS}/{name}", "800m", False) for name in PODS]
    assert [stored(api, name) for name in PODS] == before
    assert not [r for r in api.requests if r.method in ("PATCH", "POST", "PUT")]


@pytest.mark.parametrize("limit", ["workload", "pass"])
def test_rate_limits_per_workload_and_per_pass(api, tmp_path, limit):
    setup(api, {})
    settings = dataclasses.replace(SETTINGS, **{f"resize_max_per_{limit}": 1})
    rows = reconciler(api, tmp_path, settings).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert resize_calls(api) == 1
    waiting = [r.reason for r in rows if r.reason.startswith("not resized: over 1 resizes")]
    assert waiting == ["not resized: over 1 resizes of Deployment/shop/web this pass; next pass" if limit == "workload"
                       else "not resized: over 1 resizes this pass; next pass"]


@pytest.mark.parametrize("limit", ["workload", "pass"])
def test_rate_limits_count_the_resizes_sent_not_the_pods_already_at_their_ratio(api, tmp_path, limit):
    at_ratio = ("web-5d8f9-aaaaa", "web-5d8f9-eeeee")
    to_resize = ("web-5d8f9-bbbbb", "web-5d8f9-ccccc", "web-5d8f9-ddddd")
    ratio = {KEYS.cpu_requests_ratio: "2"}
    setup(api, {}, pods=to_resize)
    for name in at_ratio:
        api.put("pods", admitted(name, template(), ratio))
    settings = dataclasses.replace(SETTINGS, **{f"resize_max_per_{limit}": 2})
    reconciler_ = reconciler(api, tmp_path, settings)
    rows = reconciler_.reconcile_resizes(False, {KEY: ratio})
    assert [requests(stored(api, name))["cpu"] for name in (*at_ratio, *to_resize)] == ["500m"] * 4 + ["1"]
    assert resize_calls(api) == 2
    assert [(r.object, r.resource, r.reason.split(" this pass")[0]) for r in rows if not r.written] == [
        (f"Pod/{NS}/web-5d8f9-ddddd", "*", "not resized: over 2 resizes" + (" of Deployment/shop/web"
                                                                            if limit == "workload" else ""))]
    assert reconciler_.metrics.skips.labels("resize-rate-limited")._value.get() == 1


@pytest.mark.parametrize("ratio", ["1", "0.8"])
def test_pods_growing_in_one_pass_share_the_namespaces_quota_as_read_from_the_api(api, tmp_path, ratio):
    """The ResourceQuota admission plugin checks a resize that grows a Pod as it checks a new Pod.
    A ratio backing off toward 1 (load rose) grows the Pods as a raise (ratio below 1) does, and
    a growth takes from the quota what the next Pod of the namespace can no longer have."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"})
    assert [requests(stored(api, name))["cpu"] for name in PODS] == ["800m", "800m"]
    # 300m left: the first Pod grows by 200m at ratio 1 (at 0.8 by all 300m, where its raise is
    # capped); the second then finds too little left (100m, or none) and waits.
    api.put("resourcequotas", {"metadata": {"name": "team", "namespace": NS},
                               "spec": {"hard": {"requests.cpu": "2"}},
                               "status": {"hard": {"requests.cpu": "2"}, "used": {"requests.cpu": "1700m"}}})
    api.put("resourcequotas", {"metadata": {"name": "elsewhere", "namespace": "other"},
                               "status": {"hard": {"requests.cpu": "1"}, "used": {"requests.cpu": "1"}}})
    reconciler_ = reconciler(api, tmp_path)
    rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: ratio}})
    after = [requests(stored(api, name))["cpu"] for name in PODS]
    if ratio == "1":
        assert after == ["1", "800m"]
        assert f"Pod/{NS}/{PODS[1]}" in {r.object for r in rows if r.reason == (
            "not resized: cpu would grow by 200m, and the namespace's ResourceQuota team has 100m left; next pass")}
        assert reconciler_.metrics.skips.labels("resize-quota")._value.get() == 1
    else:
        assert after == ["1100m", "800m"], "the raise takes all 300m; nothing is left to raise the second"
    assert resize_calls(api) == 1


@pytest.mark.parametrize("ratio", ["1", "0.8"])
@pytest.mark.parametrize("priority_class", ["batch", "web"])
def test_a_full_scoped_quota_holds_back_only_the_pods_its_scopes_bind(api, tmp_path, ratio, priority_class):
    """A quota scoped to a PriorityClass binds only the Pods of that class, as the ResourceQuota
    admission plugin matches it. Full, it holds back the growth of those Pods (a ratio backing off
    toward 1, or a raise) and the API would refuse it; Pods of another class grow as if it were
    not there (at 0.8 to 1250m)."""
    pod_template = template()
    pod_template["spec"]["priorityClassName"] = priority_class
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pod_template)
    api.put("resourcequotas", {"metadata": {"name": "batch", "namespace": NS},
                               "spec": {"hard": {"requests.cpu": "2"}, "scopeSelector": {"matchExpressions": [
                                   {"scopeName": "PriorityClass", "operator": "In", "values": ["batch"]}]}},
                               "status": {"hard": {"requests.cpu": "2"}, "used": {"requests.cpu": "2"}}})
    rows = reconciler(api, tmp_path).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: ratio}})
    after = [requests(stored(api, name))["cpu"] for name in PODS]
    if priority_class == "batch":
        assert after == ["800m", "800m"]
        assert [r.reason for r in rows if r.object.startswith("Pod/")] == [
            "not resized: cpu would grow by 200m, and the namespace's ResourceQuota batch has 0 left; next pass"] * 2
    else:
        assert after == (["1", "1"] if ratio == "1" else ["1250m", "1250m"])


def test_a_raise_keeps_to_the_limit_range_as_read_from_the_api(api, tmp_path):
    setup(api, {KEYS.cpu_requests_ratio: "1.25"})
    api.put("limitranges", {"metadata": {"name": "cap", "namespace": NS},
                            "spec": {"limits": [{"type": "Container", "max": {"cpu": "1100m"}}]}})
    reconciler(api, tmp_path).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "0.5"}})
    assert [requests(stored(api, name))["cpu"] for name in PODS] == ["1100m", "1100m"]


def test_the_api_double_refuses_what_the_real_api_refuses(api):
    """The double's resize rules are what the tests above rely on: check them directly."""
    guaranteed = template("1", "1Gi", limits={"cpu": "1", "memory": "1Gi"})
    api.put("pods", admitted(PODS[0], guaranteed, {}))
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    patch = [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "500m"}]
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod_resize(PODS[0], NS, patch, _content_type="application/json-patch+json")
    assert refused.value.status == 422 and "Pod QoS is immutable" in refused.value.body
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "nginx:2"}]
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod_resize(PODS[0], NS, image, _content_type="application/json-patch+json")
    assert "only cpu and memory resources are mutable" in refused.value.body
    windows = admitted(PODS[1], template(), {})
    windows["spec"]["os"] = {"name": "windows"}
    api.put("pods", windows)
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod_resize(PODS[1], NS, patch, _content_type="application/json-patch+json")
    assert refused.value.status == 422 and "windows pods cannot be resized" in refused.value.body


def test_a_windows_pod_is_never_sent_a_resize_the_api_refuses(api, tmp_path):
    setup(api, {KEYS.cpu_requests_ratio: "1"}, pods=PODS[:1])
    windows = stored(api)
    windows["spec"]["os"] = {"name": "windows"}
    api.put("pods", windows)
    reconciler_ = reconciler(api, tmp_path)
    rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert resize_calls(api) == 0 and requests(stored(api))["cpu"] == "1"
    assert [r.reason for r in rows if r.object == f"Pod/{NS}/{PODS[0]}"] == [
        "not resized: Windows Pod (the API refuses to resize one); new ratios apply at the next rollout"]
    assert reconciler_.metrics.resizes.labels("error")._value.get() == 0


# ---- the pure policy --------------------------------------------------------------------------

CONFIG = CompressionConfig()
LIMITS = ResizeLimits()


def running(pod_template: dict[str, Any], **status: Any) -> dict[str, Any]:
    pod = admitted("web-5d8f9-abcde", pod_template, {})
    pod["status"].update(status)
    return pod


def test_a_finished_init_container_keeps_its_requests_and_a_sidecar_is_resized():
    pod_template = template()
    pod_template["spec"]["initContainers"] = [
        {"name": "migrate", "image": "x", "resources": {"requests": {"cpu": "2"}}},
        {"name": "proxy", "image": "x", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}}]
    pod = running(pod_template)
    plan = plan_resize(pod, {KEYS.cpu_requests_ratio: "2"}, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    assert {(c.container, c.after) for c in plan.changes} == {("app", 500), ("proxy", 100)}
    assert all("/initContainers/0/" not in op["path"] for op in plan.patch)
    # The resize subresource gets one patch for every container that changes.
    spec = jsonpatch.apply_patch(pod, plan.patch)["spec"]
    assert [c["resources"]["requests"]["cpu"] for c in [*spec["initContainers"], *spec["containers"]]] == \
        ["2", "100m", "500m"]


def test_a_sidecar_that_restarts_to_resize_memory_keeps_the_pods_memory_as_it_is():
    """A native sidecar's resizePolicy counts like an app container's: memory that would restart
    it is not resized in place (a restarting proxy cuts the app's traffic) unless the workload
    accepts restarts; cpu still is."""
    pod_template = template()
    pod_template["spec"]["initContainers"] = [
        {"name": "proxy", "image": "x", "restartPolicy": "Always", "resources": {"requests": {"memory": "256Mi"}},
         "resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]}]
    ratios = {KEYS.cpu_requests_ratio: "2", KEYS.memory_requests_ratio: "2", KEYS.enable_memory_compress: "y"}
    plan = plan_resize(running(pod_template), ratios, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    assert [(c.container, c.resource) for c in plan.changes] == [("app", "cpu")]
    accepted = plan_resize(running(pod_template), {**ratios, KEYS.resize_restart: "y"}, KEYS, CONFIG, NO_BOUNDS, 0,
                           LIMITS)
    assert {(c.container, c.resource) for c in accepted.changes} == {("app", "cpu"), ("app", "memory"),
                                                                    ("proxy", "memory")}


def test_a_ratio_on_the_pod_template_overrides_the_workloads_in_place_too():
    """As at admission, the Pod's own (template) annotation wins over its workload's: a running Pod
    whose template asks for 4 is resized to 1 core / 4, not to the workload's 2."""
    pod_template = template()
    pod_template["metadata"]["annotations"] = {KEYS.cpu_requests_ratio: "4"}
    pod = running(pod_template)
    plan = plan_resize(pod, {KEYS.cpu_requests_ratio: "2"}, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    resized = jsonpatch.apply_patch(pod, plan.patch) if plan.patch else pod
    assert requests(resized)["cpu"] == "250m"


@pytest.mark.parametrize(("found", "controlled"), [
    (vpa("web-vpa", None), {"cpu": "web-vpa", "memory": "web-vpa"}),  # updateMode defaults to Auto
    (vpa("web-vpa", "Initial"), {"cpu": "web-vpa", "memory": "web-vpa"}),  # sets requests at creation
    (vpa("web-vpa", "Off"), None),  # recommends only
    (vpa("web-vpa", "Auto", {"containerName": "*", "controlledResources": ["cpu"]}), {"cpu": "web-vpa"}),
    (vpa("web-vpa", "Auto", {"containerName": "*", "mode": "Off"},
         {"containerName": "app", "controlledResources": ["memory"]}), {"memory": "web-vpa"}),
    (vpa("web-vpa", "Auto", {"containerName": "*", "mode": "Off"}), None),
    (vpa("web-vpa", "Auto", {"containerName": "*"}), {"cpu": "web-vpa", "memory": "web-vpa"}),  # both by default
    # Without a "*" policy, the containers no policy names get VPA's defaults: both resources.
    (vpa("web-vpa", "Auto", {"containerName": "proxy", "mode": "Off"}), {"cpu": "web-vpa", "memory": "web-vpa"}),
    (vpa("web-vpa", "Auto", kind=""), None),
])
def test_which_requests_a_vertical_pod_autoscaler_sets(found, controlled):
    """What VPA's updater and admission controller would set on the workload's Pods, so that
    neither compression nor in-place resize fights them."""
    expected = {("Deployment", NS, "web"): controlled} if controlled else {}
    assert vpa_controlled([found]) == expected
    assert vpa_controlled([vpa("old-vpa", "Off"), found]) == expected, "a VPA that only recommends is passed over"


def with_pod(part: str, **values: Any) -> dict[str, Any]:
    """A running Pod of the template with ``values`` set in its ``part`` (metadata, spec)."""
    pod = running(template())
    pod[part].update(values)
    return pod


@pytest.mark.parametrize(("pod", "workload", "code", "reason"), [
    (running(template(), phase="Pending"), {}, "not-running", "phase Pending, not running"),
    (with_pod("metadata", annotations={"kubernetes.io/config.mirror": "abc"}), {}, "static",
     "static Pod (the kubelet rejects changes to it)"),
    (with_pod("spec", os={"name": "windows"}), {}, "windows",
     "Windows Pod (the API refuses to resize one); new ratios apply at the next rollout"),
    (running(template()), {KEYS.inplace_resize: "n"}, "disabled",
     f"in-place resize switched off by {KEYS.inplace_resize}"),
    (running(template()), {KEYS.inplace_resize: "maybe"}, "invalid-annotation",
     f"annotation {KEYS.inplace_resize} ignored: 'maybe' is not one of y, yes, true, n, no, false; not resized"),
    (with_pod("spec", resources={"requests": {"cpu": "1"}}), {}, "pod-level",
     "pod-level resources are not resized in place; new ratios apply at the next rollout"),
])
def test_each_reason_a_pod_is_not_resized_is_told_word_for_word(pod, workload, code, reason):
    plan = plan_resize(pod, {KEYS.cpu_requests_ratio: "2", **workload}, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    assert (plan.code, plan.skipped, plan.patch) == (code, reason, [])


def test_a_pod_holding_exclusive_cpus_keeps_its_cpu_request_in_place():
    pod = running(template(limits={"cpu": "4", "memory": "2Gi"}))
    pod["metadata"].setdefault("annotations", {})[KEYS.resource_status] = '{"cpuset":"0","numaNode":0}'
    plan = plan_resize(pod, {KEYS.cpu_requests_ratio: "2"}, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    assert plan.code == "exclusive-cpus" and not plan.patch
    assert plan.skipped == (f"cpu request kept: it holds exclusive CPUs ({KEYS.resource_status}), as many as its "
                            "cpu request")
    # With memory opted in, memory is still resized; cpu is not.
    both = plan_resize(pod, {KEYS.cpu_requests_ratio: "2", KEYS.memory_requests_ratio: "2",
                             KEYS.enable_memory_compress: "y"}, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    assert [(c.resource, c.before, c.after) for c in both.changes] == [("memory", 2**30, 2**29)]


def test_the_recorded_ratios_name_a_resource_opted_in_without_a_ratio_at_1():
    """Memory opted in but given no ratio: the Pod's ``resized-ratios`` says memory is at 1 (left
    as admitted), so a ratio set later differs from the record and reaches the Pod."""
    opted = {KEYS.cpu_requests_ratio: "2", KEYS.enable_memory_compress: "y"}
    plan = plan_resize(running(template()), opted, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    assert plan.ratios == plan.annotations[KEYS.resized_ratios] == "cpu=2,memory=1"
    assert [(c.resource, c.before, c.after) for c in plan.changes] == [("cpu", 1000, 500)]
    both = plan_resize(running(template()), {**opted, KEYS.memory_requests_ratio: "2"}, KEYS, CONFIG, NO_BOUNDS, 0,
                       LIMITS)
    assert both.describe() == "app/cpu 1 -> 500m; app/memory 1Gi -> 512Mi", "as the Event and the log say it"


def test_a_raise_counts_the_pods_own_requests_as_quota_headroom():
    # The namespace has 300m left; the Pod already holds 1 core of the quota, so it may grow by
    # 300m (to 1300m), not shrink to 300m.
    bounds = RequestBounds(quota_headroom={"cpu": 300})
    plan = plan_resize(running(template()), {KEYS.cpu_requests_ratio: "0.5"}, KEYS, CONFIG, bounds, 0, LIMITS)
    assert [(c.before, c.after) for c in plan.changes] == [(1000, 1300)]
    assert plan.added == {"cpu": 300}
    barely = plan_resize(running(template("999m")), {KEYS.cpu_requests_ratio: "0.999"}, KEYS, CONFIG, NO_BOUNDS, 0,
                         LIMITS)
    assert barely.added == {"cpu": 1}, "a millicore more is quota taken"
    lowered = plan_resize(running(template()), {KEYS.cpu_requests_ratio: "2"}, KEYS, CONFIG, bounds, 0, LIMITS)
    assert lowered.added == {} and not lowered.record_infeasible
    assert ResizeLimits() == Settings(kubernetes="off").resize_limits, "the core's defaults are the product's"


def test_a_resize_waits_on_the_kubelet_a_past_infeasible_answer_and_the_minimum_interval():
    ratios = {KEYS.cpu_requests_ratio: "2"}
    now = 1_000_000.0

    def plan_for(pod: dict[str, Any], at: float = now) -> Any:
        return plan_resize(pod, ratios, KEYS, CONFIG, NO_BOUNDS, at, LIMITS)

    fresh = plan_for(running(template()))
    assert fresh.skipped is None and [(c.before, c.after) for c in fresh.changes] == [(1000, 500)]
    assert fresh.annotations[KEYS.resized_ratios] == fresh.ratios == "cpu=2"

    def with_state(conditions: list[dict[str, str]] = (), **annotations: str) -> dict[str, Any]:
        pod = running(template(), conditions=list(conditions))
        pod["metadata"].setdefault("annotations", {}).update(annotations)
        return pod

    in_progress = {"type": "PodResizeInProgress", "status": "True"}
    assert plan_for(with_state([in_progress])).code == "in-progress"
    assert plan_for(with_state([{**in_progress, "status": "False"}])).skipped is None, "a False condition is none"
    deferred = {"type": "PodResizePending", "status": "True", "reason": "Deferred"}
    waiting = plan_for(with_state([deferred], **{KEYS.resized_ratios: "cpu=2"}))
    assert (waiting.code, waiting.skipped) == ("deferred", "the last resize is Deferred: left to the kubelet")
    # Pending at other ratios than those asked now: the new ratios are sent.
    assert plan_for(with_state([deferred], **{KEYS.resized_ratios: "cpu=1.5"})).skipped is None
    infeasible = {"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": "Node didn't have "
                  "enough capacity"}
    answered = plan_for(with_state([infeasible], **{KEYS.resized_ratios: "cpu=2"}))
    assert answered.code == "infeasible" and answered.skipped == (
        "the last resize is Infeasible on this node (Node didn't have enough capacity); not retried until the ratios "
        "change")
    assert answered.record_infeasible and answered.ratios == "cpu=2" and not answered.patch
    assert answered.annotations == {KEYS.resize_infeasible: "cpu=2"}
    recorded = plan_for(with_state([infeasible], **{KEYS.resized_ratios: "cpu=2", KEYS.resize_infeasible: "cpu=2"}))
    assert recorded.code == "infeasible" and not recorded.record_infeasible, "recorded once"
    assert recorded.annotations == {}
    no_reason = plan_for(with_state([{"type": "PodResizePending", "status": "True"}], **{KEYS.resized_ratios: "cpu=2"}))
    assert no_reason.skipped == "the last resize is pending: left to the kubelet"
    # Once the condition is gone, the record alone keeps the same ratios from being retried.
    remembered = plan_for(with_state(**{KEYS.resize_infeasible: "cpu=2"}))
    assert (remembered.code, remembered.skipped) == (
        "infeasible", "the resize was Infeasible at these ratios; not retried until they change")
    assert plan_for(with_state(**{KEYS.resize_infeasible: "cpu=1.5"})).skipped is None
    # The minimum interval, from the last resize's time.
    last = {KEYS.last_resize: format_timestamp(now - LIMITS.min_interval_seconds + 1)}
    limited = plan_for(with_state(**last))
    assert limited.code == "rate-limited" and limited.skipped == "resized 599s ago (minimum interval 600s)"
    assert plan_for(with_state(**last), at=now + 1).skipped is None


def test_deleting_and_already_resized_pods_send_no_resize():
    deleting = running(template())
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert plan_resize(deleting, {KEYS.cpu_requests_ratio: "2"}, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS).code == \
        "not-running"
    # Admitted at ratio 2 already: nothing left to change in place.
    at_ratio = admitted("web-5d8f9-abcde", template(), {KEYS.cpu_requests_ratio: "2"})
    plan = plan_resize(at_ratio, {KEYS.cpu_requests_ratio: "2"}, KEYS, CONFIG, NO_BOUNDS, 0, LIMITS)
    assert plan.code == "in-place" and not plan.patch and not plan.changes


def test_a_pod_being_deleted_is_passed_over_without_a_row(api, tmp_path):
    """A rollout deletes the old Pods while they still run: one is listed, and passed over without
    a row or a skip counted (saying so every rollout would be noise)."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS[:1])
    deleting = stored(api)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    api.put("pods", deleting)
    reconciler_ = reconciler(api, tmp_path)
    assert reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}}) == []
    assert resize_calls(api) == 0 and requests(stored(api))["cpu"] == "800m"
    assert reconciler_.metrics.skips.labels("resize-not-running")._value.get() == 0


def test_a_refused_resize_is_a_warning_event_and_the_record_is_put_back(api, tmp_path, caplog):
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS[:1])
    before = stored(api)["metadata"]["annotations"]
    assert requests(stored(api))["cpu"] == "800m"

    def policy_engine(review: dict[str, Any]) -> dict[str, Any]:
        """A validating webhook such as a policy engine may deny resizes: the API answers 403."""
        if review["request"].get("subResource") == "resize":
            return {"allowed": False, "status": {"code": 403, "message": "resizes need a change ticket"}}
        return {"allowed": True}

    api.validating["pods"] = policy_engine
    reconciler_ = reconciler(api, tmp_path)
    with caplog.at_level(logging.WARNING, logger="reconcilers.runner"):
        rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    refusal = "403 admission webhook denied the request: resizes need a change ticket"
    assert caplog.messages == [f"Pod/{NS}/{PODS[0]}: resize refused: {refusal}"]
    pod = stored(api)
    assert requests(pod)["cpu"] == "800m"
    assert [r.written for r in rows] == [False]
    after = pod["metadata"]["annotations"]
    assert {k: after.get(k) for k in before} == before, "the record describes the Pod as it still is"
    (event,) = [e for e in api.list_objects("events", NS, {})["items"] if e["reason"] == "ResizeFailed"]
    assert (event["type"], event["message"]) == ("Warning", f"in-place resize refused: {refusal}")
    assert reconciler_.metrics.resizes.labels("error")._value.get() == 1


def test_a_pod_its_kubelet_wrote_meanwhile_is_read_again_and_resized_in_the_same_pass(api, tmp_path):
    """The pass lists the Pods, then writes each one's record with the resourceVersion it read: a
    kubelet status write in between (a probe turning ready) is a 409. The Pod is read again and,
    its plan unchanged, resized now rather than a pass later."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS[:1])
    api.concurrent_writes[f"pods/{PODS[0]}"] = 1
    api.written_meanwhile["pods"] = lambda pod: pod["status"].setdefault("conditions", []).append(
        {"type": "Ready", "status": "True"})
    reconciler_ = reconciler(api, tmp_path)
    rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert requests(stored(api))["cpu"] == "500m"
    assert [r.written for r in rows] == [True]
    assert reconciler_.metrics.resizes.labels("conflict")._value.get() == 1
    assert reconciler_.metrics.resizes.labels("ok")._value.get() == 1
    assert resize_calls(api) == 1
    (event,) = [e for e in api.list_objects("events", NS, {})["items"] if e["reason"] == "ResizedInPlace"]
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("Pod", PODS[0])


def test_a_lease_lost_while_a_pods_conflict_is_read_again_resizes_nothing(api, tmp_path):
    """The kubelet's write that made the record a 409 comes while this replica's Lease runs out
    (the API server too slow for its renewals): read again, the Pod is left to the next leader."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS[:1])
    clock = Clock()
    elector = leading(api, clock)

    def kubelet_writes_while_the_lease_runs_out(pod: dict[str, Any]) -> None:
        clock.now += 11
        pod["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True"})

    api.concurrent_writes[f"pods/{PODS[0]}"] = 1
    api.written_meanwhile["pods"] = kubelet_writes_while_the_lease_runs_out
    before = stored(api)["metadata"]["annotations"]
    with pytest.raises(NotLeader):
        reconciler(api, tmp_path, clock=clock, leader=elector).reconcile_resizes(
            False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert resize_calls(api) == 0 and requests(stored(api))["cpu"] == "800m"
    assert stored(api)["metadata"]["annotations"] == before, "no record of a resize that was not sent"


def test_a_replica_whose_lease_ran_out_before_the_resizes_resizes_nothing(api, tmp_path):
    """The Lease runs out while the pass lists the Pods (a long list, a slow API server): the first
    resize finds it gone, and nothing is written, not even the record of a resize."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS[:1])
    clock = Clock()
    elector = leading(api, clock)
    clock.now += 16
    before = stored(api)["metadata"]["annotations"]
    with pytest.raises(NotLeader):
        reconciler(api, tmp_path, clock=clock, leader=elector).reconcile_resizes(
            False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert resize_calls(api) == 0 and requests(stored(api))["cpu"] == "800m"
    assert stored(api)["metadata"]["annotations"] == before


def test_a_pod_whose_plan_moved_meanwhile_waits_for_the_next_pass(api, tmp_path, caplog):
    """Read again after a 409, the Pod's kubelet is now applying a resize: the plan is not the one
    the pass made (and took quota room for), so nothing is written and the reason is logged."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS[:1])
    before = stored(api)["metadata"]["annotations"]
    api.concurrent_writes[f"pods/{PODS[0]}"] = 1
    api.written_meanwhile["pods"] = lambda pod: pod["status"].setdefault("conditions", []).append(
        {"type": "PodResizeInProgress", "status": "True"})
    reconciler_ = reconciler(api, tmp_path)
    with caplog.at_level(logging.INFO, logger="reconcilers.runner"):
        rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert requests(stored(api))["cpu"] == "800m"
    assert stored(api)["metadata"]["annotations"] == before
    assert [r.written for r in rows] == [False]
    assert resize_calls(api) == 0
    assert (f"Pod/{NS}/{PODS[0]}: not resized: it changed since the pass read it (the kubelet is applying the "
            "last resize); next pass") in caplog.messages


@pytest.mark.parametrize(("theirs", "now"), [("900m", "now app/cpu 900m -> 500m"),
                                             ("500m", "requests already at the workload's ratios")])
def test_a_pod_another_writer_resized_meanwhile_waits_and_the_log_says_what_the_resize_is_now(
        api, tmp_path, caplog, theirs, now):
    """The other writer's requests are this pass's next plan: still a resize, or (resized to just
    the ratio's requests) none."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS[:1])

    def resized_by_another(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = theirs
        pod["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] = theirs

    api.concurrent_writes[f"pods/{PODS[0]}"] = 1
    api.written_meanwhile["pods"] = resized_by_another
    with caplog.at_level(logging.INFO, logger="reconcilers.runner"):
        reconciler(api, tmp_path).reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert requests(stored(api))["cpu"] == theirs and resize_calls(api) == 0
    assert caplog.messages == [f"Pod/{NS}/{PODS[0]}: not resized: it changed since the pass read it ({now}); "
                               "next pass"]


def test_a_pod_replaced_under_its_name_or_changing_under_every_try_is_left_alone(api, tmp_path, caplog):
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS)
    api.concurrent_writes.update({f"pods/{PODS[0]}": 1, f"pods/{PODS[1]}": 3})

    def meanwhile(pod: dict[str, Any]) -> None:
        if pod["metadata"]["name"] == PODS[0]:  # a StatefulSet's Pod deleted and created again
            pod["metadata"]["uid"] = "a-new-uid"

    api.written_meanwhile["pods"] = meanwhile
    reconciler_ = reconciler(api, tmp_path)
    with caplog.at_level(logging.INFO, logger="reconcilers.runner"):
        rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert [requests(stored(api, name))["cpu"] for name in PODS] == ["800m", "800m"]
    assert [r.written for r in rows] == [False, False]
    assert resize_calls(api) == 0
    assert reconciler_.metrics.resizes.labels("conflict")._value.get() == 4
    assert f"Pod/{NS}/{PODS[0]}: not resized: another Pod has its name now" in caplog.messages
    assert f"Pod/{NS}/{PODS[1]}: not resized: it changed under each of 3 tries; next pass" in caplog.messages


def test_a_listing_the_api_server_fails_skips_the_resizes_and_keeps_the_pass(api, tmp_path, caplog):
    """The ratios are written, then the Pods' bounds and the Pods are listed for in-place resize:
    a failed list skips the resizes of this pass (the Pods follow next pass), and the pass still
    reports the ratios it wrote, rather than one line saying it stopped."""
    setup(api, {KEYS.enable_resource_compress: "y"})
    api.storms["limitranges"] = [500, 1]
    reconciler_ = reconciler(api, tmp_path)
    with caplog.at_level(logging.WARNING, logger="reconcilers.runner"):
        rows = reconciler_.run_pass()
    assert api.get("deployments", NS, "web")["metadata"]["annotations"][KEYS.cpu_requests_ratio] == "1.25"
    assert ("Deployment/shop/web", "cpu", "1.25", True) in [(r.object, r.resource, r.proposed, r.written)
                                                            for r in rows]
    assert ("*", "*", "in-place resize: the API server failed (HTTP 500 Internal Server Error); retried next pass") in {
        (r.object, r.resource, r.reason) for r in rows}
    assert reconciler_.incomplete == ["in-place resize: the API server failed (HTTP 500 Internal Server Error)"]
    assert ("in-place resize skipped this pass: the API server failed (HTTP 500 Internal Server Error)"
            in caplog.messages)
    assert reconciler_.metrics.skips.labels("resize-api-error")._value.get() == 1
    assert resize_calls(api) == 0 and requests(stored(api))["cpu"] == "1"
    reconciler_.run_pass()
    workload = api.get("deployments", NS, "web")["metadata"]["annotations"]
    assert resize_calls(api) == len(PODS), "next pass, the Pods follow"
    assert requests(stored(api)) == requests(admitted("web-5d8f9-new00", template(), workload))


def test_an_infeasible_answer_is_told_once_it_is_recorded(api, tmp_path, caplog):
    """The kubelet's Infeasible answer is recorded on the Pod, then told by a Warning Event. The
    record meeting a 409 (the kubelet wrote the Pod meanwhile) is retried on the Pod read again;
    one that cannot be written is neither counted nor told, so the next pass records and tells it
    once, rather than a Warning every pass while the record never lands."""
    setup(api, {}, pods=PODS[:1])
    api.kubelet_answers[(NS, PODS[0])] = "Infeasible"
    clock = Clock()
    reconciler_ = reconciler(api, tmp_path, clock=clock)
    raise_ratio = {KEY: {KEYS.cpu_requests_ratio: "0.5"}}
    reconciler_.reconcile_resizes(False, raise_ratio)  # sent; the kubelet answers Infeasible

    def told() -> int:
        return sum(e["reason"] == "ResizeInfeasible" for e in api.list_objects("events", NS, {})["items"])

    clock.now += SETTINGS.resize_min_interval_seconds + 1
    api.concurrent_writes[f"pods/{PODS[0]}"] = 3  # every try of this pass meets a 409
    with caplog.at_level(logging.WARNING, logger="reconcilers.runner"):
        reconciler_.reconcile_resizes(False, raise_ratio)
    assert KEYS.resize_infeasible not in stored(api)["metadata"]["annotations"]
    assert told() == 0 and reconciler_.metrics.resizes.labels("infeasible")._value.get() == 0
    assert (f"Pod/{NS}/{PODS[0]}: Infeasible answer not recorded: it changed under each of 3 tries; next pass"
            in caplog.messages)

    api.concurrent_writes[f"pods/{PODS[0]}"] = 1  # one 409, then the Pod read again: recorded
    reconciler_.reconcile_resizes(False, raise_ratio)
    assert stored(api)["metadata"]["annotations"][KEYS.resize_infeasible] == "cpu=0.5"
    assert told() == 1 and reconciler_.metrics.resizes.labels("infeasible")._value.get() == 1
    (event,) = [e for e in api.list_objects("events", NS, {})["items"] if e["reason"] == "ResizeInfeasible"]
    assert (event["type"], event["message"]) == (
        "Warning", "in-place resize to ratios cpu=0.5 is Infeasible on this node; not retried until the ratios change")
    reconciler_.reconcile_resizes(False, raise_ratio)
    assert told() == 1 and resize_calls(api) == 1, "recorded: neither told nor sent again"


def test_a_pod_record_refused_or_unreadable_after_a_conflict_waits_for_the_next_pass(api, tmp_path, caplog):
    """Two ways a resize's record fails without a retry: a policy engine refuses the Pod's update
    (403, said in its words), or the Pod cannot be read again after a 409 (500). Neither Pod is
    resized, and the pass writes what it can."""
    setup(api, {KEYS.cpu_requests_ratio: "1.25"}, pods=PODS)

    def policy_engine(review: dict[str, Any]) -> dict[str, Any]:
        if review["request"]["name"] == PODS[0] and not review["request"].get("subResource"):
            return {"allowed": False, "status": {"code": 403, "message": "annotations are frozen"}}
        return {"allowed": True}

    api.validating["pods"] = policy_engine
    api.concurrent_writes[f"pods/{PODS[1]}"] = 1
    api.written_meanwhile["pods"] = lambda pod: api.storms.update({"pods": [500, 1]})
    one_at_a_time = dataclasses.replace(SETTINGS, write_concurrency=1)  # the failing read is PODS[1]'s own
    reconciler_ = reconciler(api, tmp_path, one_at_a_time)
    with caplog.at_level(logging.WARNING, logger="reconcilers.runner"):
        rows = reconciler_.reconcile_resizes(False, {KEY: {KEYS.cpu_requests_ratio: "2"}})
    assert [requests(stored(api, name))["cpu"] for name in PODS] == ["800m", "800m"]
    assert [r.written for r in rows] == [False, False] and resize_calls(api) == 0
    assert (f"Pod/{NS}/{PODS[0]}: not resized (403 admission webhook denied the request: annotations are frozen), "
            "next pass") in caplog.messages
    assert any(m.startswith(f"Pod/{NS}/{PODS[1]}: not resized: reading it again after a conflict failed (500 ")
               for m in caplog.messages)
    assert reconciler_.metrics.resizes.labels("error")._value.get() == 1
    assert reconciler_.metrics.resizes.labels("conflict")._value.get() == 1
