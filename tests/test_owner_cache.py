"""Owner annotations and LimitRanges read from the cluster: the real webhook process, the real
``kubernetes`` client, and the API-server double in tests/kube_api.py."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from oversale.annotations import AnnotationKeys
from tests.conftest import RunningWebhook, apply_response, eventually, pod_review, worker_deaths
from tests.kube_api import FakeKubeAPI

KEYS = AnnotationKeys()
NS = "shop"


def workload(kind_plural: str, name: str, annotations: dict | None = None, owner: tuple[str, str] | None = None,
             namespace: str = NS) -> tuple[str, dict]:
    metadata: dict = {"name": name, "namespace": namespace}
    if annotations is not None:
        metadata["annotations"] = annotations
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                        "uid": f"uid-{owner[1]}", "controller": True}]
    return kind_plural, {"metadata": metadata, "spec": {}}


def owned_pod(kind: str, name: str, cpu: str = "1", memory: str = "1Gi", annotations: dict | None = None,
              namespace: str = NS) -> dict:
    metadata: dict = {
        "generateName": f"{name}-",
        "namespace": namespace,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{name}",
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": "nginx",
                                 "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
    }


def cpu_of(pod: dict) -> str:
    return pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]


RATIO_2 = {KEYS.cpu_requests_ratio: "2"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[FakeKubeAPI, RunningWebhook]]:
    api = FakeKubeAPI().start()
    for plural, obj in [
        workload("deployments", "web", RATIO_2),
        workload("replicasets", "web-5d8f", {}, owner=("Deployment", "web")),
        workload("statefulsets", "db", {KEYS.cpu_requests_ratio: "4", KEYS.memory_requests_ratio: "2"}),
        workload("daemonsets", "agent", {KEYS.cpu_requests_ratio: "1.25"}),
        workload("cronjobs", "report", RATIO_2),
        workload("jobs", "report-2891", None, owner=("CronJob", "report")),
        workload("jobs", "once", {KEYS.cpu_requests_ratio: "4"}),
        workload("replicasets", "bare", {KEYS.cpu_requests_ratio: "4"}),
        workload("deployments", "legacy", {**RATIO_2, KEYS.enable_resource_compress: "n"}),
        workload("replicasets", "legacy-1", {}, owner=("Deployment", "legacy")),
        workload("deployments", "guarded", {KEYS.cpu_requests_ratio: "4"}, namespace="limited"),
        workload("replicasets", "guarded-1", {}, owner=("Deployment", "guarded"), namespace="limited"),
        workload("deployments", "hungry", {KEYS.cpu_requests_ratio: "0.5"}, namespace="quota"),
        workload("replicasets", "hungry-1", {}, owner=("Deployment", "hungry"), namespace="quota"),
    ]:
        api.put(plural, obj)
    api.put("limitranges", {"metadata": {"name": "min", "namespace": "limited"},
                            "spec": {"limits": [{"type": "Container", "min": {"cpu": "400m"}}]}})
    # 1.3 cores of quota left: a 1-core Pod asking to double may grow to 1.3 cores, not 2.
    api.put("resourcequotas", {"metadata": {"name": "team", "namespace": "quota"},
                               "spec": {"hard": {"requests.cpu": "4"}},
                               "status": {"hard": {"requests.cpu": "4"}, "used": {"requests.cpu": "2700m"}}})
    # Full, but only for the Pods of PriorityClass batch.
    api.put("resourcequotas", {"metadata": {"name": "batch", "namespace": "quota"},
                               "spec": {"hard": {"requests.cpu": "2"}, "scopeSelector": {"matchExpressions": [
                                   {"scopeName": "PriorityClass", "operator": "In", "values": ["batch"]}]}},
                               "status": {"hard": {"requests.cpu": "2"}, "used": {"requests.cpu": "2"}}})
    tmp = tmp_path_factory.mktemp("cluster")
    kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
    server = RunningWebhook(tmp, env={"OVERSALE_KUBERNETES": "auto", "KUBECONFIG": str(kubeconfig)}, workers=1)
    assert eventually(lambda: server.get("/readyz")[0] == 200), server.log.read_text()
    assert f"using the cluster at {api.url} (Kubernetes v" in server.log.read_text(), "which cluster, at start"
    yield api, server
    server.stop()
    api.stop()


@pytest.mark.parametrize(
    ("kind", "name", "cpu"),
    [
        ("ReplicaSet", "web-5d8f", "500m"),   # Pod -> ReplicaSet -> Deployment
        ("StatefulSet", "db", "250m"),
        ("DaemonSet", "agent", "800m"),
        ("Job", "report-2891", "500m"),       # Pod -> Job -> CronJob
        ("Job", "once", "250m"),              # a Job of its own
        ("ReplicaSet", "bare", "250m"),       # a ReplicaSet with no Deployment
        ("ReplicaSet", "legacy-1", "1"),      # enable-resource-compress: n on the Deployment
    ],
)
def test_ratios_come_from_the_owning_workload(cluster, kind, name, cpu):
    _, server = cluster
    pod = owned_pod(kind, name)
    mutated = apply_response(pod, server.review(pod_review(pod)))
    assert cpu_of(mutated) == cpu



@pytest.mark.parametrize("kind", ["ReplicationController", "CloneSet", None])
def test_a_pod_of_an_owner_kind_not_followed_goes_by_its_own_annotations(cluster, kind):
    """ReplicationControllers and custom controllers (an OpenKruise CloneSet) are not cached or
    read, and a naked Pod (``kind`` None) has no owner: such Pods go by their own annotations,
    with no API request and no warning."""
    api, server = cluster

    def pod_of(annotations: dict | None = None) -> dict:
        pod = owned_pod(kind or "", "legacy-rc", annotations=annotations)
        if kind is None:
            del pod["metadata"]["ownerReferences"]
        return pod

    before = api.count(watch=False)
    pod = pod_of(RATIO_2)
    response = server.review(pod_review(pod))
    assert cpu_of(apply_response(pod, response)) == "500m"
    assert not response.get("warnings")
    assert "patch" not in server.review(pod_review(pod_of()))
    assert api.count(watch=False) == before

def test_memory_follows_its_own_workload_annotation(cluster):
    _, server = cluster
    pod = owned_pod("StatefulSet", "db")
    mutated = apply_response(pod, server.review(pod_review(pod)))
    assert mutated["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "250m", "memory": "512Mi"}


def test_a_pod_with_no_annotations_map_gets_one(cluster):
    _, server = cluster
    pod = owned_pod("ReplicaSet", "web-5d8f")
    assert "annotations" not in pod["metadata"]
    mutated = apply_response(pod, server.review(pod_review(pod)))
    assert KEYS.original_requests in mutated["metadata"]["annotations"]


def test_the_pods_own_annotation_overrides_the_workload(cluster):
    _, server = cluster
    pod = owned_pod("ReplicaSet", "web-5d8f", annotations={KEYS.cpu_requests_ratio: "4"})
    assert cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "250m"
    pod = owned_pod("ReplicaSet", "web-5d8f", annotations={KEYS.enable_resource_compress: "false"})
    assert "patch" not in server.review(pod_review(pod))


def test_limitrange_from_the_cache_caps_the_compression(cluster):
    _, server = cluster
    pod = owned_pod("ReplicaSet", "guarded-1", namespace="limited")
    mutated = apply_response(pod, server.review(pod_review(pod, namespace="limited")))
    assert cpu_of(mutated) == "400m"
    assert "LimitRange" in mutated["metadata"]["annotations"][KEYS.compression]


def test_a_raise_stops_at_the_namespace_quota_headroom(cluster):
    _, server = cluster
    pod = owned_pod("ReplicaSet", "hungry-1", namespace="quota")
    response = server.review(pod_review(pod, namespace="quota"))
    mutated = apply_response(pod, response)
    # Asked to double 1 core; the quota has 4 - 2.7 = 1.3 cores left, which this Pod's 1 core uses
    # first: its request may grow to 1.3 cores (never past what quota admission would accept).
    assert cpu_of(mutated) == "1300m"
    assert "cpu ResourceQuota headroom (team)" in mutated["metadata"]["annotations"][KEYS.compression]
    assert b'oversale_requests_added_millicores_total{namespace="quota"} 300.0' in server.get("/metrics")[1]
    # Nothing was lowered, and memory was not touched: no series says otherwise, not even at 0.
    for name in ("oversale_requests_freed_millicores_total", "oversale_requests_freed_bytes_total",
                 "oversale_requests_added_bytes_total"):
        assert server.samples(name, namespace="quota") == [], name


def test_a_full_quota_scoped_to_the_pods_priority_class_stops_its_raise(cluster):
    _, server = cluster
    pod = owned_pod("ReplicaSet", "hungry-1", namespace="quota")
    pod["spec"]["priorityClassName"] = "batch"
    assert cpu_of(apply_response(pod, server.review(pod_review(pod, namespace="quota")))) == "1"


def test_warm_cache_admission_makes_no_api_request(cluster):
    api, server = cluster
    pod = owned_pod("ReplicaSet", "web-5d8f")
    server.review(pod_review(pod))
    before = api.count(watch=False)
    hits = server.metric("oversale_owner_lookups_total", result="hit")
    for _ in range(10):
        assert cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "500m"
    assert api.count(watch=False) == before
    assert server.metric("oversale_owner_lookups_total", result="hit") == hits + 20  # the ReplicaSet, its Deployment


def test_cache_miss_costs_one_get_then_is_cached(cluster):
    api, server = cluster
    with api.watches_paused():
        api.put(*workload("deployments", "fresh", {KEYS.cpu_requests_ratio: "4"}))
        api.put(*workload("replicasets", "fresh-1", {}, owner=("Deployment", "fresh")))
        pod = owned_pod("ReplicaSet", "fresh-1")
        gets_before = api.count("GET", watch=False)
        misses = server.metric("oversale_owner_lookups_total", result="miss")
        assert cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "250m"
        assert api.count("GET", watch=False) == gets_before + 2  # the ReplicaSet, then its Deployment
        assert server.metric("oversale_owner_lookups_total", result="miss") == misses + 2
        assert cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "250m"
        assert api.count("GET", watch=False) == gets_before + 2


def test_annotation_changes_arrive_through_the_watch(cluster):
    api, server = cluster
    api.put(*workload("daemonsets", "agent", {KEYS.cpu_requests_ratio: "2"}))
    pod = owned_pod("DaemonSet", "agent")
    assert eventually(lambda: cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "500m")


def test_requests_a_workloads_vpa_sets_are_left_to_it(cluster):
    """VPA's admission runs after this webhook and scales each limit by its recommendation over the
    request it finds: a request lowered here first would get its limit raised by the ratio. So the
    resources a VerticalPodAutoscaler of the workload sets (updateMode not Off, its
    controlledResources) are left as they came, from the watched VPAs."""
    api, server = cluster
    api.put(*workload("deployments", "tuned", {KEYS.cpu_requests_ratio: "2", KEYS.memory_requests_ratio: "2"}))
    api.put(*workload("replicasets", "tuned-1", {}, owner=("Deployment", "tuned")))
    pod = owned_pod("ReplicaSet", "tuned-1")

    def admitted() -> tuple[dict, list[str]]:
        response = server.review(pod_review(pod))
        return apply_response(pod, response)["spec"]["containers"][0]["resources"]["requests"], \
            response.get("warnings") or []

    assert admitted()[0] == {"cpu": "500m", "memory": "512Mi"}
    vpa = {"apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
           "metadata": {"name": "tuned", "namespace": NS},
           "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tuned"},
                    "updatePolicy": {"updateMode": "Auto"},
                    "resourcePolicy": {"containerPolicies": [{"containerName": "*", "controlledResources": ["cpu"]}]}}}
    api.put("verticalpodautoscalers", vpa)
    assert eventually(lambda: admitted()[0] == {"cpu": "1", "memory": "512Mi"}), "cpu VPA's, memory ours"
    assert "cpu requests set by a VerticalPodAutoscaler not compressed: two controllers would set them; remove " \
           "the ratio or the VPA" in admitted()[1]
    # A VPA that only recommends (updateMode: Off) sets nothing.
    api.put("verticalpodautoscalers", {**vpa, "spec": {**vpa["spec"], "updatePolicy": {"updateMode": "Off"}}})
    assert eventually(lambda: admitted()[0] == {"cpu": "500m", "memory": "512Mi"})
    api.delete("verticalpodautoscalers", NS, "tuned")


def test_a_vpa_on_an_argo_rollout_is_seen_through_its_replicaset(cluster):
    """VPA acts on the top-most owner that is of a kind it knows or serves ``scale``: an Argo
    Rollout over its ReplicaSet, which this webhook does not read. The ratio here comes from the Pod
    template; a VPA naming the Rollout sets the cpu request, so it is left as it came."""
    api, server = cluster
    api.put("replicasets", {"metadata": {"name": "canary-7f9c", "namespace": NS, "ownerReferences": [
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "canary", "uid": "uid-canary",
         "controller": True, "blockOwnerDeletion": True}]}, "spec": {}})
    pod = owned_pod("ReplicaSet", "canary-7f9c", annotations={KEYS.cpu_requests_ratio: "2"})
    assert eventually(lambda: cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "500m")
    api.put("verticalpodautoscalers", {
        "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
        "metadata": {"name": "canary", "namespace": NS},
        "spec": {"targetRef": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "canary"},
                 "updatePolicy": {"updateMode": "Auto"}}})
    assert eventually(lambda: cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "1")
    assert any("cpu requests set by a VerticalPodAutoscaler not compressed" in warning
               for warning in server.review(pod_review(pod)).get("warnings") or [])
    # A VPA naming a Deployment over the same Pods' ReplicaSet elsewhere does not reach these.
    api.put("verticalpodautoscalers", {
        "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
        "metadata": {"name": "canary", "namespace": NS},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "canary"}}})
    assert eventually(lambda: cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "500m")
    api.delete("verticalpodautoscalers", NS, "canary")


def test_a_vpa_on_an_owner_kind_not_followed_still_leaves_its_requests(cluster):
    """VPA knows ReplicationControllers, which this webhook does not cache: a Pod directly under
    one goes by its own annotations, and what a VPA naming the controller sets is still left to it."""
    api, server = cluster
    pod = owned_pod("ReplicationController", "old-rc", annotations={KEYS.cpu_requests_ratio: "2"})
    assert cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "500m"
    api.put("verticalpodautoscalers", {
        "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
        "metadata": {"name": "old-rc", "namespace": NS},
        "spec": {"targetRef": {"apiVersion": "v1", "kind": "ReplicationController", "name": "old-rc"},
                 "updatePolicy": {"updateMode": "Auto"}}})
    try:
        assert eventually(lambda: cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "1")
    finally:
        api.delete("verticalpodautoscalers", NS, "old-rc")


def test_each_watched_kind_says_its_cache_is_synced(cluster):
    """An operator's alert reads ``oversale_cache_synced`` per kind: every kind admission reads is
    there, by the name the docs give it, at 1 once listed."""
    _, server = cluster
    synced = {sample.labels["kind"]: sample.value for sample in server.samples("oversale_cache_synced")}
    assert synced == dict.fromkeys(["ReplicaSet", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob",
                                    "LimitRange", "ResourceQuota", "VerticalPodAutoscaler"], 1.0)


def test_expired_watch_relists(cluster):
    api, server = cluster
    lists_before = api.count("GET", "statefulsets", watch=False)
    # Compaction expires only versions older than the newest: a write elsewhere first makes the
    # version the StatefulSet watch resumes from one etcd has forgotten, whichever tests ran before.
    # A running watch that has sent everything goes on through compaction: this one's connection
    # then drops, and the watch it starts again is refused.
    api.put("secrets", {"metadata": {"name": "elsewhere", "namespace": NS}, "data": {}})
    api.compact("statefulsets")
    api.cut_watches.add("statefulsets")
    api.put(*workload("statefulsets", "db", {KEYS.cpu_requests_ratio: "2"}))
    pod = owned_pod("StatefulSet", "db")
    assert eventually(lambda: cpu_of(apply_response(pod, server.review(pod_review(pod)))) == "500m")
    api.cut_watches.discard("statefulsets")  # not used if the watch was starting again already
    assert api.count("GET", "statefulsets", watch=False) > lists_before


def test_unreadable_owner_falls_back_to_pod_annotations_with_a_warning(cluster):
    api, server = cluster
    api.down = True
    try:
        pod = owned_pod("ReplicaSet", "nowhere-1", annotations={KEYS.cpu_requests_ratio: "2"})
        response = server.review(pod_review(pod))
    finally:
        api.down = False
    assert cpu_of(apply_response(pod, response)) == "500m"
    assert "could not read owner ReplicaSet shop/nowhere-1: HTTP 503 Service Unavailable; only the Pod's own " \
           "annotations were used" in response["warnings"]
    assert server.metric("oversale_owner_lookups_total", result="error") >= 1


def test_readiness_waits_for_the_caches(tmp_path):
    """... every cache but that of VerticalPodAutoscalers where their CRD is not installed."""
    api = FakeKubeAPI().start()
    api.absent = {"verticalpodautoscalers"}
    api.down = True
    server = RunningWebhook(tmp_path, env={"OVERSALE_KUBERNETES": "auto",
                                           "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kc"))}, workers=1)
    try:
        assert server.get("/readyz")[0] == 503
        assert server.get("/healthz")[0] == 200
        # The series is there, at 0, from the start: the alert on it (min < 1) sees a cache that
        # never syncs, not a series that does not exist yet.
        assert [sample.value for sample in server.samples("oversale_cache_synced", kind="Deployment")] == [0]
        api.down = False
        assert eventually(lambda: server.get("/readyz")[0] == 200, timeout=20)
        assert server.metric("oversale_cache_synced", kind="Deployment") == 1
        # Not installed is synced too: none of them, and that is all there is.
        assert [sample.value for sample in server.samples("oversale_cache_synced", kind="VerticalPodAutoscaler")] == [1]
        assert server.metric("oversale_cache_restarts_total", kind="Deployment", again="list",
                             cause="list failed") >= 1
    finally:
        server.stop()
        api.stop()


def test_a_worker_that_dies_before_its_caches_sync_does_not_hold_them_unsynced(tmp_path):
    """``oversale_cache_synced`` is the lowest over the live workers: a worker killed while the API
    server was down (out of memory, say) must leave it, or its 0 would hold the alert on the
    synced caches firing for as long as the webhook runs."""
    api = FakeKubeAPI().start()
    api.down = True
    server = RunningWebhook(tmp_path, env={"OVERSALE_KUBERNETES": "auto",
                                           "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kc"))}, workers=1)

    def workers() -> list[str]:
        return subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True).stdout.split()

    try:
        assert server.metric("oversale_cache_synced", kind="Deployment") == 0
        (dying,) = workers()
        os.kill(int(dying), signal.SIGKILL)
        assert eventually(lambda: len(workers()) == 1 and dying not in workers(), timeout=20), "a new worker"
        api.down = False
        assert eventually(lambda: server.get("/readyz")[0] == 200, timeout=20)
        assert eventually(lambda: server.metric("oversale_cache_synced", kind="Deployment") == 1, timeout=10), \
            server.samples("oversale_cache_synced", kind="Deployment")
    finally:
        server.stop()
        api.stop()


def test_a_stop_while_the_api_server_is_answering_leaves_cleanly(tmp_path):
    """A rollout's SIGTERM can come while the owner caches are waiting for the API server's
    answers to their lists (a large cluster's, an API server under load): each worker still
    leaves cleanly. They aborted (SIGABRT) when their interpreter finalized around those threads."""
    api = FakeKubeAPI().start()
    api.trickled_lists |= {"replicasets", "deployments", "statefulsets", "jobs"}
    server = RunningWebhook(tmp_path, env={"OVERSALE_KUBERNETES": "auto",
                                           "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kc"))})
    try:
        assert server.get("/readyz")[0] == 503, "stopped while its lists are still on their way"
    finally:
        server.stop()
        api.stop()
    log = server.log.read_text()
    assert server.process.returncode == 0 and worker_deaths(log) == [], log
