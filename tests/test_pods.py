"""The Pod facts in ``oversale.pods`` that are not policies: the shape check every adapter may use."""

from __future__ import annotations

import json

import pytest

from oversale.pods import (
    effective_request,
    held_request,
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
    ({"spec": {"resources": "1"}}, "spec.resources is not an object"),
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
], ids=["downsize-pending", "downsize-admitted", "done", "upsize", "upsize-infeasible", "not-reported"])
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


def owned(kind: str, name: str, labels: dict | None = None) -> dict:
    return {"namespace": "shop", "labels": labels or {},
            "ownerReferences": [{"kind": kind, "name": name, "controller": True}]}


@pytest.mark.parametrize(("metadata", "workload"), [
    # The Deployment controller names a ReplicaSet <deployment>-<pod-template-hash>.
    (owned("ReplicaSet", "web-5d8f9", {"pod-template-hash": "5d8f9"}), "shop/Deployment/web"),
    (owned("ReplicaSet", "api-v2-7c9b4", {"pod-template-hash": "7c9b4"}), "shop/Deployment/api-v2"),
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
