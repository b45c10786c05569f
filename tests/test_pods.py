"""The Pod facts in ``oversale.pods`` that are not policies: the shape check every adapter may use."""

from __future__ import annotations

import json

import pytest

from oversale.pods import (
    effective_limit,
    effective_request,
    held_request,
    is_guaranteed,
    is_mirror_or_static,
    is_terminal,
    qos_class,
    request_of,
    requests_of,
    resize_infeasible,
    scheduled_request,
    shape_problem,
    workload_of,
)
from oversale.quantity import CPU, parse_amount
from tests.conftest import POD_FIXTURES


@pytest.mark.shared
def test_every_real_pod_has_the_shape_the_policies_read():
    for path in POD_FIXTURES:
        assert shape_problem(json.loads(path.read_text())) is None, path.name


@pytest.mark.parametrize(("pod", "problem"), [
    ([], "the Pod is not an object"),
    ({"metadata": "p"}, "metadata is not an object"),
    ({"metadata": {"annotations": ["a"]}}, "metadata.annotations is not an object"),
    ({"metadata": {"ownerReferences": {"kind": "ReplicaSet"}}}, "metadata.ownerReferences is not a list of objects"),
    ({"spec": {"containers": {"name": "app"}}}, "spec.containers is not a list"),
    ({"spec": {"containers": [{"name": "app"}, "sidecar"]}}, "spec.containers[1] is not an object"),
    ({"spec": {"containers": [{"resources": {"limits": ["cpu"]}}]}},
     "spec.containers[0].resources.limits is not an object"),
    ({"spec": {"containers": [{"resources": {"requests": "500m"}}]}},
     "spec.containers[0].resources.requests is not an object"),
    ({"spec": {"resources": "1"}}, "spec.resources is not an object"),
    ({"spec": {"initContainers": [{"name": "init", "resources": ["cpu"]}]}},
     "spec.initContainers[0].resources is not an object"),
    ({"status": 3}, "status is not an object"),
    ({"spec": ["app"]}, "spec is not an object"),
    ({"metadata": {"ownerReferences": [{"kind": "ReplicaSet"}, "web"]}},
     "metadata.ownerReferences is not a list of objects"),
    ({"spec": {"initContainers": [None]}}, "spec.initContainers[0] is not an object"),
    ({"metadata": {"labels": "app=web"}, "spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}},
     "metadata.labels is not an object"),
])
def test_the_first_misshapen_field_is_named(pod, problem):
    assert shape_problem(pod) == problem


def test_missing_and_null_fields_are_fine():
    assert shape_problem({}) is None
    assert shape_problem({"metadata": None, "spec": {"containers": None, "initContainers": []},
                          "status": {}}) is None
    assert shape_problem({"spec": {"containers": [{"resources": None}, {"resources": {"requests": None}}]}}) is None


# ---- what a Pod holds while an in-place resize is under way (KEP 1287) --------------------------

def resizing(spec_cpu: str, applied: str | None, allocated: str | None, *, infeasible: bool = False,
             init: list | None = None, init_statuses: list | None = None) -> dict:
    """A running Pod with one app container: spec request ``spec_cpu``, and what the kubelet
    reports it applies and has admitted (None: not reported)."""
    status: dict = {"name": "app"}
    if applied is not None:
        status["resources"] = {"requests": {"cpu": applied}}
    if allocated is not None:
        status["allocatedResources"] = {"cpu": allocated}
    pod: dict = {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": spec_cpu}}}],
                          "initContainers": init or []},
                 "status": {"phase": "Running", "containerStatuses": [status],
                            "initContainerStatuses": init_statuses or []}}
    if infeasible:
        pod["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
    return pod


@pytest.mark.parametrize(("pod", "held"), [
    (resizing("1", "4", "4"), 4000),                  # downsize asked, the kubelet still holds 4 cores
    (resizing("1", "4", "1"), 4000),                  # admitted, the runtime not yet applied
    (resizing("1", "1", "1"), 1000),                  # done
    (resizing("4", "1", "1"), 4000),                  # upsize asked: the spec counts at once
    (resizing("4", "1", "1", infeasible=True), 1000),  # ... unless the kubelet will never apply it
    (resizing("1", None, "4"), 1000),                 # no applied resources reported: the spec alone
    (resizing("2", "1", "4"), 4000),                  # resized again before 4 admitted cores were applied
], ids=["downsize-pending", "downsize-admitted", "done", "upsize", "upsize-infeasible", "not-reported",
        "resized-again"])
def test_a_resize_in_flight_holds_what_kube_scheduler_counts(pod, held):
    assert held_request(pod, CPU) == held
    assert scheduled_request(pod, CPU) == held
    spec = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    assert effective_request(pod, CPU) == parse_amount(CPU, spec)


def test_legacy_resize_status_infeasible_counts_too():
    pod = resizing("4", "1", "1")
    pod["status"]["resize"] = "Infeasible"          # Kubernetes 1.27-1.32 said it in status.resize
    assert held_request(pod, CPU) == 1000 and resize_infeasible(pod)


def test_sidecars_follow_their_status_and_regular_init_containers_their_spec():
    sidecar = {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}
    setup = {"name": "setup", "resources": {"requests": {"cpu": "2"}}}
    statuses = [{"name": "proxy", "resources": {"requests": {"cpu": "1"}}, "allocatedResources": {"cpu": "1"}},
                {"name": "setup", "resources": {"requests": {"cpu": "3"}}, "allocatedResources": {"cpu": "3"}}]
    pod = resizing("1", "1", "1", init=[sidecar, setup], init_statuses=statuses)
    # The sidecar still holds 1 core (resized down to 500m, not applied yet) and runs beside the
    # init container after it; that one cannot be resized, so its spec (2) counts, not its status.
    assert held_request(pod, CPU) == max(1000 + 2000, 1000 + 1000)
    assert effective_request(pod, CPU) == max(500 + 2000, 500 + 1000)


def test_pod_level_requests_decide_alone_and_pending_pods_hold_their_spec():
    pod = resizing("1", "4", "4")
    pod["spec"]["resources"] = {"requests": {"cpu": "2"}}
    assert held_request(pod, CPU) == 2000
    pending = {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "3"}}}]},
               "status": {"phase": "Pending"}}
    assert held_request(pending, CPU) == 3000


def unit(name: str, request: str | None = None, limit: str | None = None, sidecar: bool = False) -> dict:
    resources = {kind: {"cpu": amount} for kind, amount in (("requests", request), ("limits", limit)) if amount}
    return {"name": name, "resources": resources, **({"restartPolicy": "Always"} if sidecar else {})}


@pytest.mark.parametrize(("init", "apps", "cpu"), [
    # Sidecars add up as they start; a regular init container runs beside those started before it.
    ([unit("mesh", "100m", sidecar=True), unit("log", "200m", sidecar=True), unit("migrate", "1")],
     [unit("a", "300m"), unit("b", "400m")], 1300),
    # The apps run beside every sidecar; an init container before a sidecar runs without it.
    ([unit("migrate", "500m"), unit("mesh", "200m", sidecar=True)], [unit("app", "1")], 1200),
])
def test_the_effective_request_follows_kube_schedulers_sidecar_rule(init, apps, cpu):
    assert effective_request({"spec": {"initContainers": init, "containers": apps}}, CPU) == cpu


@pytest.mark.parametrize(("spec", "limit"), [
    ({"initContainers": [unit("mesh", limit="100m", sidecar=True), unit("log", limit="200m", sidecar=True),
                         unit("migrate", limit="1")], "containers": [unit("a", limit="300m")]}, 1300),
    ({"initContainers": [unit("mesh", limit="200m", sidecar=True)], "containers": [unit("a", limit="300m"),
                                                                                    unit("b", limit="400m")]}, 900),
    ({"initContainers": [unit("migrate", limit="2")], "containers": [unit("a", limit="300m")]}, 2000),
    # A container without a limit leaves the Pod unbounded, an init container as much as an app.
    ({"initContainers": [unit("migrate", "1")], "containers": [unit("a", limit="300m")]}, None),
    ({"containers": [unit("a", limit="300m"), unit("b", "1")]}, None),
    # Pod-level limits decide alone.
    ({"resources": {"limits": {"cpu": "4"}}, "containers": [unit("a", "1")]}, 4000),
])
def test_the_effective_limit_aggregates_like_the_requests_and_is_none_when_one_is_unbounded(spec, limit):
    assert effective_limit({"spec": spec}, CPU) == limit


def test_pod_level_resources_decide_the_qos_class():
    # The kubelet's ComputePodQOS: with spec.resources set, the class is that of its requests and
    # limits alone, whatever the containers say.
    def with_pod_level(requests: dict, limits: dict, container: dict | None = None) -> dict:
        return {"spec": {"resources": {"requests": requests, "limits": limits},
                         "containers": [container or {"name": "app"}]}}

    both = {"cpu": "1", "memory": "1Gi"}
    guaranteed = with_pod_level(both, both)
    assert qos_class(guaranteed) == "Guaranteed" and is_guaranteed(guaranteed)
    assert qos_class(with_pod_level({"cpu": "500m", "memory": "1Gi"}, both)) == "Burstable"
    assert qos_class(with_pod_level({"cpu": "1"}, {})) == "Burstable"
    equal_containers = {"name": "app", "resources": {"requests": both, "limits": both}}
    assert qos_class(with_pod_level({"cpu": "1"}, {}, equal_containers)) == "Burstable"
    assert qos_class({"spec": {"containers": [equal_containers]}}) == "Guaranteed"
    # Pod-level limits alone: the pod-level requests default to them.
    assert qos_class({"spec": {"resources": {"limits": both}, "containers": [{"name": "app"}]}}) == "Guaranteed"


def test_zero_requests_and_limits_count_for_nothing_in_the_qos_class():
    zero = {"name": "app", "resources": {"requests": {"cpu": "0"}, "limits": {"memory": "0"}}}
    assert qos_class({"spec": {"containers": [zero]}}) == "BestEffort"


@pytest.mark.parametrize(("conditions", "infeasible"), [
    ([{"type": "Ready", "status": "True"}, {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}],
     True),
    ([{"type": "PodResizePending", "status": "True", "reason": "Deferred"}], False),
    ([{"type": "PodResizePending", "status": "False", "reason": "Infeasible"}], False),
])
def test_a_resize_is_infeasible_only_by_a_true_pod_resize_pending_condition_saying_so(conditions, infeasible):
    assert resize_infeasible({"status": {"conditions": conditions}}) is infeasible


def test_a_limit_alone_counts_as_the_request_the_api_server_defaults_it_to():
    limited = {"name": "app", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"memory": "512Mi"}}}
    assert requests_of(limited) == {"cpu": 2000, "memory": 2**29}
    assert requests_of(limited, default_from_limits=False) == {"memory": 2**29}
    assert request_of(limited, CPU) == 2000 and request_of(limited, CPU, default_from_limits=False) is None


def test_the_runtime_class_overhead_is_scheduled_on_top_of_what_the_pod_holds():
    pod = resizing("1", "1", "1")
    pod["spec"]["overhead"] = {"cpu": "250m"}
    assert held_request(pod, CPU) == 1000 and scheduled_request(pod, CPU) == 1250


@pytest.mark.parametrize(("metadata", "static"), [
    ({"annotations": {"kubernetes.io/config.mirror": "0f3c"}}, True),
    ({"ownerReferences": [{"kind": "Node", "name": "worker-1", "controller": True}]}, True),
    ({"ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f9", "controller": True}]}, False),
    ({}, False),
])
def test_a_static_pod_is_known_by_its_mirror_annotation_or_its_node_owner(metadata, static):
    assert is_mirror_or_static({"metadata": metadata}) is static


@pytest.mark.parametrize(("phase", "terminal"), [("Succeeded", True), ("Failed", True), ("Running", False),
                                                 ("Pending", False), (None, False)])
def test_a_pod_is_done_once_it_succeeded_or_failed(phase, terminal):
    assert is_terminal({"status": {"phase": phase}}) is terminal


def owned(kind: str, name: str, labels: dict | None = None) -> dict:
    return {"namespace": "shop", "labels": labels or {},
            "ownerReferences": [{"kind": kind, "name": name, "controller": True}]}


@pytest.mark.parametrize(("metadata", "workload"), [
    # The Deployment controller names a ReplicaSet <deployment>-<pod-template-hash>.
    (owned("ReplicaSet", "web-5d8f9", {"pod-template-hash": "5d8f9"}), "shop/Deployment/web"),
    (owned("ReplicaSet", "api-v2-7c9b4", {"pod-template-hash": "7c9b4"}), "shop/Deployment/api-v2"),
    (owned("ReplicaSet", "a-5d8f9", {"pod-template-hash": "5d8f9"}), "shop/Deployment/a"),
    # Argo Rollouts names its ReplicaSets <rollout>-<hash> too, with a label of its own.
    (owned("ReplicaSet", "pay-86666d6ffc", {"rollouts-pod-template-hash": "86666d6ffc"}), "shop/Rollout/pay"),
    # A ReplicaSet of its own (or an operator's), whatever labels its Pods carry.
    (owned("ReplicaSet", "web"), "shop/ReplicaSet/web"),
    (owned("ReplicaSet", "web-5d8f9", {"pod-template-hash": "7c9b4"}), "shop/ReplicaSet/web-5d8f9"),
    (owned("ReplicaSet", "-5d8f9", {"pod-template-hash": "5d8f9"}), "shop/ReplicaSet/-5d8f9"),
    (owned("StatefulSet", "db", {"pod-template-hash": "5d8f9"}), "shop/StatefulSet/db"),
    ({"namespace": "shop", "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f9"}]}, ""),
    ({"namespace": "shop"}, ""),
])
def test_the_workload_of_a_pod_is_its_deployment_across_replica_sets(metadata, workload):
    assert workload_of(metadata) == workload
