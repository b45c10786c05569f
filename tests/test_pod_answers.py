"""The webhook remembers Pod compressions (webhook.pod_admission.PodAnswers): a remembered answer
must be the answer the Pod would get on its own. Real fixture Pods, and pairs of Pods that differ in
one thing compression reads, answered one after the other through one memo."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from oversale.annotations import AnnotationKeys
from oversale.limitrange import NO_BOUNDS, RequestBounds, bounds_from_limit_ranges
from oversale.settings import Settings
from tests.conftest import FRONTEND_POD, POD_FIXTURES, load_fixture_pod, pod_review
from webhook.owners import OwnerAnnotations
from webhook.pod_admission import PodAnswers, admit_pod

KEYS = AnnotationKeys()
SETTINGS = Settings(kubernetes="off")


class Namespaces:
    """Owners with the bounds, the workload (its annotations and name), the VPA resources and the
    problem reading the owner that a test sets."""

    def __init__(self, bounds: RequestBounds = NO_BOUNDS, workload: dict[str, str] | None = None,
                 vpa: frozenset[str] = frozenset(), name: str | None = None, problem: str | None = None) -> None:
        self.bounds = bounds
        self.owner = OwnerAnnotations(workload or {}, name, problem, vpa)

    def owner_annotations(self, pod: Any, namespace: str) -> OwnerAnnotations:
        return self.owner

    def bounds_for(self, namespace: str) -> RequestBounds:
        return self.bounds


def answer(pod: dict[str, Any], answers: PodAnswers | None, owners: Namespaces | None = None) -> dict[str, Any]:
    review = pod_review(pod)
    review["request"]["uid"] = "same"
    decision = admit_pod(review["request"], SETTINGS, owners or Namespaces(), answers)
    return {"review": decision.review, "outcome": decision.outcome, "freed": decision.freed,
            "reasons": decision.reasons}


def annotated(pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
    return pod


RATIOS = [
    {KEYS.cpu_requests_ratio: "2"},
    {KEYS.cpu_requests_ratio: "3", KEYS.memory_requests_ratio: "1.5"},
    {KEYS.cpu_requests_ratio: "0.8"},
    {KEYS.cpu_requests_ratio: "2", KEYS.enable_resource_compress: "n"},
]


@pytest.mark.shared
def test_every_fixture_pod_gets_its_own_answer_through_a_shared_memo():
    answers = PodAnswers(SETTINGS)
    for ratios in RATIOS:
        for path in POD_FIXTURES:
            pod = annotated(load_fixture_pod(path), **ratios)
            alone = answer(pod, None)
            assert answer(pod, answers) == alone, path.name
            assert answer(copy.deepcopy(pod), answers) == alone, path.name   # remembered


def _frontend() -> dict[str, Any]:
    return annotated(load_fixture_pod(FRONTEND_POD), **{KEYS.cpu_requests_ratio: "2", KEYS.memory_requests_ratio: "2"})


def _change(pod: dict[str, Any], how: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    container = pod["spec"]["containers"][0]
    if how == "limits":
        container["resources"]["limits"] = dict(container["resources"]["requests"])  # Guaranteed now
    elif how == "name":
        container["name"] = "renamed"
    elif how == "sidecar":
        pod["spec"]["initContainers"] = [{"name": "init", "restartPolicy": "Always",
                                          "resources": {"requests": {"cpu": "300m"}}}]
    elif how == "init":
        pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "300m"}}}]
    elif how == "ratio from the workload":
        pod["metadata"]["annotations"] = {"team": "shop"}
    elif how == "ratio from the workload, no annotations map":
        pod["metadata"].pop("annotations")
    elif how == "recorded originals":
        pod["metadata"]["annotations"][KEYS.original_requests] = json.dumps({container["name"]: {"cpu": "400m"}})
    elif how == "mirror":
        pod["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "abc"
    elif how == "bare":
        pod["metadata"].pop("ownerReferences")
    elif how == "node-owned":
        pod["metadata"]["ownerReferences"] = [{"kind": "Node", "name": "n1", "apiVersion": "v1", "uid": "u"}]
    elif how == "pod-level":
        pod["spec"]["resources"] = {"requests": {"cpu": "200m"}}
    elif how == "ratio":
        pod["metadata"]["annotations"][KEYS.cpu_requests_ratio] = "4"
    elif how == "exclusive CPUs asked":
        pod["metadata"]["annotations"][KEYS.cpu_bind_policy] = "FullPCPUs"
    elif how == "exclusive CPUs held":
        pod["metadata"]["annotations"][KEYS.resource_status] = '{"cpuset":"0-1","numaNode":0}'
    elif how == "requests set by VPA":
        pod["metadata"]["annotations"]["vpaUpdates"] = "Pod resources updated by web: container 0: cpu request"
    return pod


# (what the first Pod has, what its twin has instead)
CHANGES = [("", "limits"), ("", "name"), ("init", "sidecar"), ("", "init"), ("", "recorded originals"), ("", "mirror"),
           ("", "node-owned"), ("bare", "node-owned"), ("", "pod-level"), ("", "ratio"), ("", "exclusive CPUs asked"),
           ("", "exclusive CPUs held"), ("", "requests set by VPA"),
           ("ratio from the workload", "ratio from the workload, no annotations map")]


@pytest.mark.shared
@pytest.mark.parametrize(("first", "twin"), CHANGES)
def test_a_pod_that_differs_in_one_thing_compression_reads_is_not_answered_from_its_twin(first, twin):
    owners = Namespaces(workload={KEYS.cpu_requests_ratio: "2"}) if "workload" in twin else Namespaces()
    pod, other = _change(_frontend(), first), _change(_change(_frontend(), first), twin)
    alone = answer(other, None, owners)
    assert alone != answer(pod, None, owners), f"{twin!r} should change the answer (the test would be vacuous)"
    answers = PodAnswers(SETTINGS)
    answer(pod, answers, owners)
    assert answer(other, answers, owners) == alone


@pytest.mark.shared
@pytest.mark.parametrize("bounds", [
    bounds_from_limit_ranges([{"limits": [{"type": "Container", "min": {"cpu": "80m"}}]}]),
    RequestBounds(quota_headroom={"cpu": 10}),
])
def test_the_namespace_bounds_are_part_of_the_question(bounds):
    pod = annotated(load_fixture_pod(FRONTEND_POD), **{KEYS.cpu_requests_ratio: "2"})
    raised = annotated(load_fixture_pod(FRONTEND_POD), **{KEYS.cpu_requests_ratio: "0.5"})
    for subject in (pod, raised):
        alone = answer(subject, None, Namespaces(bounds))
        answers = PodAnswers(SETTINGS)
        answer(subject, answers)                                   # remembered without bounds
        assert answer(subject, answers, Namespaces(bounds)) == alone


@pytest.mark.shared
def test_a_pod_a_scoped_quota_binds_is_not_answered_from_its_twin_it_does_not_bind():
    """Under a full quota scoped to PriorityClass batch, a Pod of that class keeps its request and
    its twin of no class is raised: the scopes a quota matches Pods by are part of the question."""
    full = {"spec": {"hard": {"requests.cpu": "64"}, "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": ["batch"]}]}},
            "status": {"hard": {"requests.cpu": "64"}, "used": {"requests.cpu": "64"}}}
    owners = Namespaces(NO_BOUNDS.with_quotas([full]))
    pod = annotated(load_fixture_pod(FRONTEND_POD), **{KEYS.cpu_requests_ratio: "0.5"})
    batch = copy.deepcopy(pod)
    batch["spec"]["priorityClassName"] = "batch"
    alone = answer(batch, None, owners)
    assert alone != answer(pod, None, owners), "the quota should stop the raise of batch only"
    answers = PodAnswers(SETTINGS)
    answer(pod, answers, owners)
    assert answer(batch, answers, owners) == alone


@pytest.mark.shared
def test_the_resources_a_vpa_of_the_workload_sets_are_part_of_the_question():
    """Twins of two workloads, one of which a VerticalPodAutoscaler sets the cpu of: that one keeps
    its cpu request for VPA, the other is compressed."""
    pod = annotated(load_fixture_pod(FRONTEND_POD), **{KEYS.cpu_requests_ratio: "2"})
    by_vpa = Namespaces(vpa=frozenset({"cpu"}))
    alone = answer(pod, None, by_vpa)
    assert alone != answer(pod, None), "VPA's cpu should keep the request (the test would be vacuous)"
    answers = PodAnswers(SETTINGS)
    answer(pod, answers)
    assert answer(pod, answers, by_vpa) == alone


# A LimitRange and a scoped quota, as multi-tenant namespaces have (a limit/request ratio is a
# fraction in the bounds, which the memo's key must still hold).
LIMIT_RANGE = bounds_from_limit_ranges([{"limits": [
    {"type": "Container", "min": {"cpu": "80m"}, "maxLimitRequestRatio": {"cpu": "4"}}]}])
SCOPED_QUOTA = {"spec": {"hard": {"requests.cpu": "64"}, "scopeSelector": {"matchExpressions": [
                    {"scopeName": "PriorityClass", "operator": "In", "values": ["batch"]}]}},
                "status": {"hard": {"requests.cpu": "64"}, "used": {"requests.cpu": "8"}}}


@pytest.mark.shared
@pytest.mark.parametrize("bounds", [
    NO_BOUNDS,
    LIMIT_RANGE,
    LIMIT_RANGE.with_quotas(
        [SCOPED_QUOTA, {"spec": {"hard": {"requests.memory": "64Gi"}},
                        "status": {"hard": {"requests.memory": "64Gi"}, "used": {"requests.memory": "1Gi"}}}]),
], ids=["no bounds", "limit range", "limit range and quotas"])
def test_a_rollouts_replicas_are_answered_from_one_remembered_compression(bounds):
    """What the memo is for: the second replica of a workload costs a lookup, not a compression,
    in a namespace with LimitRanges and quotas too."""
    answers = PodAnswers(SETTINGS)
    replica = _frontend()
    annotations = replica["metadata"]["annotations"]
    first = answers.compression(replica, annotations, answers.policy(annotations), bounds)
    second = copy.deepcopy(replica)
    assert answers.policy(dict(annotations)) is answers.policy(annotations)
    assert answers.compression(second, dict(annotations), answers.policy(annotations), bounds) is first
    assert first.patch, "the replicas are compressed (the test would be vacuous)"
