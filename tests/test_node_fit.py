"""Which nodes a Pod's replacement could run on: nodeSelector, required node affinity, taints."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oversale.node_fit import constraint_problem, node_constraints
from tests.conftest import SHARED

NODE = "node-a"
LABELS = {"pool": "db", "zone": "b", "cores": "16", "kubernetes.io/os": "linux"}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}}


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, **({"values": list(values)} if values else {})}]}


def problem(pod: dict[str, Any], labels: dict[str, str] = LABELS, taints: list[Any] | None = None) -> str | None:
    return constraint_problem(node_constraints(pod), NODE, labels, taints or [])


@pytest.mark.parametrize(("pod", "admitted"), [
    ({"spec": {}}, True),
    ({"spec": {"nodeSelector": {"pool": "db"}}}, True),
    ({"spec": {"nodeSelector": {"pool": "db", "zone": "c"}}}, False),
    ({"spec": {"nodeSelector": {"gpu": "true"}}}, False),
    (affinity(expression("pool", "In", "web", "db")), True),
    (affinity(expression("pool", "In", "web")), False),
    (affinity(expression("pool", "NotIn", "web")), True),
    (affinity(expression("gpu", "NotIn", "a100")), True),
    (affinity(expression("pool", "NotIn", "db")), False),
    (affinity(expression("pool", "Exists")), True),
    (affinity(expression("gpu", "Exists")), False),
    (affinity(expression("gpu", "DoesNotExist")), True),
    (affinity(expression("cores", "Gt", "8")), True),
    (affinity(expression("cores", "Gt", "16")), False),
    (affinity(expression("cores", "Lt", "32")), True),
    (affinity(expression("zone", "Gt", "1")), False),
    # Terms are ORed, the requirements within one ANDed.
    (affinity(expression("pool", "In", "web"), expression("zone", "In", "b")), True),
    (affinity({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["db"]},
                                    {"key": "zone", "operator": "In", "values": ["c"]}]}), False),
    # A term that requires nothing matches no node (component-helpers nodeaffinity).
    (affinity({}), False),
    (affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}), True),
    (affinity({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [NODE]}]}), False),
])
def test_node_selector_and_required_affinity_as_kube_scheduler_reads_them(pod, admitted):
    assert (problem(pod) is None) is admitted, problem(pod)


GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(("tolerations", "taint", "admitted"), [
    ([], GPU, False),
    ([], {**GPU, "effect": "NoExecute"}, False),
    ([], {**GPU, "effect": "PreferNoSchedule"}, True),
    ([{"key": "nvidia.com/gpu", "operator": "Exists"}], GPU, True),
    ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}], GPU, True),
    ([{"key": "nvidia.com/gpu", "value": "present"}], GPU, True),
    ([{"key": "nvidia.com/gpu", "value": "absent"}], GPU, False),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], GPU, False),
    ([{"operator": "Exists"}], GPU, True),
    ([{"operator": "Exists", "effect": "NoSchedule"}], GPU, True),
    ([{"key": "dedicated", "operator": "Exists"}], GPU, False),
])
def test_blocking_taints_must_be_tolerated(tolerations, taint, admitted):
    assert (problem({"spec": {"tolerations": tolerations}}, taints=[taint]) is None) is admitted


def test_the_reason_names_what_rules_the_node_out():
    assert problem({"spec": {"nodeSelector": {"pool": "web"}}}) == "nodeSelector pool=web: node-a has pool=db"
    assert problem({"spec": {"nodeSelector": {"gpu": "true"}}}) == "nodeSelector gpu=true: node-a has no label gpu"
    assert problem(affinity(expression("pool", "In", "web"))) == \
        "required node affinity: node-a matches none of its 1 term(s)"
    assert problem({"spec": {}}, taints=[GPU]) == "taint nvidia.com/gpu=present:NoSchedule on node-a is not tolerated"


@pytest.mark.shared
@pytest.mark.parametrize(("fixture", "taints", "admitted"), [
    ("060-kube-prometheus-deployment-blackbox-exporter.json", [], True),          # kubernetes.io/os: linux
    ("020-autoscaler-deployment-inflate.json", [], False),                        # AKS user-mode nodes only
    ("031-koordinator-daemonset-nvidia-driver-installer.json", [], False),        # GKE accelerator nodes only
    ("038-crane-scheduler-deployment-cpu-stress.json", [GPU], False),             # tolerates one other taint
    ("066-kube-prometheus-daemonset-kube-router.json", [GPU], True),              # tolerates every taint
])
def test_real_pods_on_the_real_gke_node(fixture, taints, admitted):
    node = json.loads((SHARED / "fixtures" / "nodes" / "gke-node.json").read_text())
    pod = json.loads((SHARED / "fixtures" / "pods" / fixture).read_text())
    found = constraint_problem(node_constraints(pod), node["metadata"]["name"], node["metadata"]["labels"],
                               [*(node["spec"].get("taints") or []), *taints])
    assert (found is None) is admitted, found


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(spec=st.dictionaries(st.sampled_from(["nodeSelector", "affinity", "tolerations"]), JSON),
       terms=JSON, taints=st.lists(JSON, max_size=3))
def test_malformed_specs_and_taints_never_raise(spec, terms, taints):
    for pod in ({"spec": spec}, affinity(terms if isinstance(terms, dict) else {"matchExpressions": terms})):
        found = constraint_problem(node_constraints(pod), NODE, LABELS, taints)
        assert found is None or isinstance(found, str)


@pytest.mark.parametrize("pod", [
    {"spec": {"nodeSelector": ["pool=db"]}},
    affinity({"matchExpressions": [{"key": "pool", "operator": "Equals", "values": ["db"]}]}),
    affinity({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["1", "2"]}]}),
    affinity({"matchExpressions": [{"key": ["pool"], "operator": "Exists"}]}),
    affinity({"matchExpressions": [{"key": "pool", "operator": "In", "values": "db"}]}),
    affinity("pool=db"),
])
def test_a_malformed_constraint_admits_no_node(pod):
    assert problem(pod) is not None
