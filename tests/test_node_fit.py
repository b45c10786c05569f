"""Which nodes a Pod's replacement could run on: nodeSelector, required node affinity, taints."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oversale.node_fit import (
    CsiVolume,
    Neighbours,
    NodeConstraints,
    VolumeAffinity,
    attached_volumes,
    claim_names,
    constraint_problem,
    csi_volume,
    free_resources,
    host_ports,
    node_constraints,
    other_requests,
    placed_pod,
    ports_problem,
    preferred_affinity_weight,
    preferred_pod_affinity_weight,
    replacement,
    resources_problem,
    selector_matches,
    spread_scores,
    volume_affinity,
    volume_limits,
    volumes_problem,
)
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
    (affinity(expression("cores", "Lt", "16")), False),
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


def test_preferred_node_affinity_weighs_the_terms_a_node_matches_by_label_or_name():
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    terms = [{"weight": 20, "preference": by_name}, {"weight": 5, "preference": expression("pool", "In", "db")},
             {"weight": 7, "preference": expression("gpu", "Exists")}]
    prefers = node_constraints({"spec": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": terms}}}})
    assert preferred_affinity_weight(prefers, NODE, LABELS) == 25
    assert preferred_affinity_weight(prefers, "node-b", LABELS) == 5
    # The API server refuses a term without a whole weight; one read anyway ranks nothing.
    odd = node_constraints({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        "pool=db", {"weight": "20", "preference": by_name}, {"preference": by_name}, *terms[1:]]}}}})
    assert preferred_affinity_weight(odd, NODE, LABELS) == 5


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
    ([{"key": "dedicated"}], {"key": "dedicated", "effect": "NoSchedule"}, True),  # no value on either: equal
    (["nvidia.com/gpu"], GPU, False),
])
def test_blocking_taints_must_be_tolerated(tolerations, taint, admitted):
    assert (problem({"spec": {"tolerations": tolerations}}, taints=[taint]) is None) is admitted


def test_the_reason_names_what_rules_the_node_out():
    assert problem({"spec": {"nodeSelector": {"pool": "web"}}}) == "nodeSelector pool=web: node-a has pool=db"
    assert problem({"spec": {"nodeSelector": {"gpu": "true"}}}) == "nodeSelector gpu=true: node-a has no label gpu"
    assert problem(affinity(expression("pool", "In", "web"))) == \
        "required node affinity: node-a matches none of its 1 term(s)"
    assert problem({"spec": {}}, taints=[GPU]) == "taint nvidia.com/gpu=present:NoSchedule on node-a is not tolerated"
    assert problem({"spec": {}}, taints=["odd", {**GPU, "effect": "PreferNoSchedule"}, {"key": "dedicated",
                                                                                        "effect": "NoExecute"}]) == \
        "taint dedicated:NoExecute on node-a is not tolerated", "the taints that block nothing are passed over"


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


SPEC_KEYS = st.sampled_from(["nodeSelector", "affinity", "tolerations", "topologySpreadConstraints", "containers",
                             "initContainers", "overhead", "resources"])
REQUIRED = st.builds(lambda kind, terms: {kind: {"requiredDuringSchedulingIgnoredDuringExecution": terms}},
                     st.sampled_from(["podAffinity", "podAntiAffinity", "nodeAffinity"]), JSON)


@settings(max_examples=300, deadline=None)
@given(spec=st.dictionaries(SPEC_KEYS, JSON | REQUIRED), terms=JSON, taints=st.lists(JSON, max_size=3))
def test_malformed_specs_and_taints_never_raise(spec, terms, taints):
    for pod in ({"spec": spec}, affinity(terms if isinstance(terms, dict) else {"matchExpressions": terms})):
        there = placed_pod({"metadata": {"name": "x", "labels": LABELS}, "spec": {**spec, "nodeName": NODE}})
        neighbours = Neighbours({NODE: LABELS}, [there])
        for around in (None, neighbours):
            constraints = node_constraints(pod)
            found = constraint_problem(constraints, NODE, LABELS, taints, around)
            assert found is None or isinstance(found, str)
            for told in (ports_problem(constraints.host_ports, {("0.0.0.0", "TCP", 80)}, NODE),
                         resources_problem(constraints.resources, {"pods": 110}, NODE)):
                assert told is None or isinstance(told, str)


@pytest.mark.parametrize("pod", [{"metadata": {"name": "x"}}, {"spec": None}, {"spec": ["containers"]}])
def test_a_pod_without_a_readable_spec_states_no_constraint(pod):
    assert node_constraints(pod) == NodeConstraints()
    assert constraint_problem(node_constraints(pod), NODE, LABELS, [], None) is None


NO_TERM_MATCHES = f"required node affinity: {NODE} matches none of its 1 term(s)"


@pytest.mark.parametrize(("pod", "reason"), [
    ({"spec": {"nodeSelector": ["pool=db"]}}, "its nodeSelector is not a map"),
    (affinity({"matchExpressions": [{"key": "pool", "operator": "Equals", "values": ["db"]}]}), NO_TERM_MATCHES),
    (affinity({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["1", "2"]}]}), NO_TERM_MATCHES),
    (affinity({"matchExpressions": [{"key": ["pool"], "operator": "Exists"}]}), NO_TERM_MATCHES),
    (affinity({"matchExpressions": [{"key": "pool", "operator": "In", "values": "db"}]}), NO_TERM_MATCHES),
    (affinity("pool=db"), NO_TERM_MATCHES),
    (affinity({"matchExpressions": ["pool in (db)"]}), NO_TERM_MATCHES),
    ({"spec": {"containers": [{"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": "one"}}}]}},
     "its resources cannot be read"),
    ({"spec": {"containers": [{"name": "app", "resources": {"requests": ["cpu"]}}]}}, "its resources cannot be read"),
])
def test_a_malformed_constraint_admits_no_node_and_says_what_is_malformed(pod, reason):
    """What the remediator's log gives as the reason a Pod is not moved."""
    assert problem(pod) == reason


def persistent_volume(name: str, *terms: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "10Gi"}}
    if terms:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": list(terms)}}
    return {"metadata": {"name": name}, "spec": spec}


ZONAL = persistent_volume("pv-zonal", expression("topology.kubernetes.io/zone", "In", "b"))
LOCAL = persistent_volume("pv-local", expression("kubernetes.io/hostname", "In", "node-a"))


@pytest.mark.parametrize(("volume", "labels", "admitted"), [
    (ZONAL, {"topology.kubernetes.io/zone": "b"}, True),
    (ZONAL, {"topology.kubernetes.io/zone": "c"}, False),
    (ZONAL, {}, False),
    (LOCAL, {"kubernetes.io/hostname": "node-a"}, True),
    (LOCAL, {"kubernetes.io/hostname": "node-b"}, False),
    # The VolumeBinding filter matches labels only: a term on the node's name matches no node.
    (persistent_volume("pv-named", {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}),
     {}, False),
])
def test_a_bound_volume_is_reached_only_where_its_persistent_volume_says(volume, labels, admitted):
    affinity = volume_affinity("data", volume)
    assert affinity is not None
    found = constraint_problem(node_constraints({"spec": {}}, (affinity,)), NODE, labels, [])
    assert (found is None) is admitted, found


def test_network_storage_reaches_every_node_and_an_unbound_claim_none():
    assert volume_affinity("shared", persistent_volume("pv-nfs")) is None
    assert volume_affinity("shared", {"metadata": {"name": "pv-x"}, "spec": {"nodeAffinity": {}}}) is None
    unbound = volume_affinity("data", None)
    assert constraint_problem(node_constraints({"spec": {}}, (unbound,)), NODE, LABELS, []) == \
        "volume data is not bound to a PersistentVolume"
    for spec in ("zone b", {"nodeAffinity": ["zone b"]}, {"nodeAffinity": {"required": {"nodeSelectorTerms": "b"}}}):
        malformed = {"metadata": {"name": "pv-m"}, "spec": spec}
        assert volume_affinity("data", malformed) == VolumeAffinity("data", "pv-m", ()), "reaches no node"


def test_the_claims_a_pod_uses():
    pod = {"metadata": {"name": "db-0"}, "spec": {"volumes": [
        "garbage", {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "config", "configMap": {"name": "db"}}, {"name": "odd", "persistentVolumeClaim": {}}]}}
    assert claim_names(pod) == ["data-db-0", "db-0-scratch"]
    assert claim_names({"spec": {"volumes": "data"}}) == [] and claim_names({}) == []


# ---- inter-Pod affinity -----------------------------------------------------------------------

HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
NODES = {"a": {HOST: "a", ZONE: "z1"}, "b": {HOST: "b", ZONE: "z1"}, "c": {HOST: "c", ZONE: "z2"}, "bare": {}}


def term(key: str, selector: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": selector, "topologyKey": key, **extra}


def running(name: str, node: str, labels: dict[str, str], namespace: str = "shop",
            affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, **({"affinity": affinity} if affinity else {})}}


def anti(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def with_affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


WEB_APART = anti(term(HOST, {"matchLabels": {"app": "web"}}))
CLUSTER = [running("web-1", "a", {"app": "web"}, affinity=WEB_APART), running("db-0", "b", {"app": "db"}),
           running("cache-0", "c", {"app": "cache"}, affinity=anti(term(ZONE, {"matchLabels": {"app": "batch"}})))]


def where(pod: dict[str, Any], pods: list[dict[str, Any]] = CLUSTER) -> dict[str, str | None]:
    neighbours = Neighbours(NODES, [placed_pod(p) for p in pods])
    return {node: constraint_problem(node_constraints(pod), node, NODES[node], [], neighbours) for node in NODES}


def test_required_anti_affinity_of_the_pod_and_of_the_pods_already_there():
    # A second replica of a Deployment spread one per node: not beside the first.
    found = where(running("web-2", "", {"app": "web"}, affinity=WEB_APART))
    assert found["a"] == f"required pod anti-affinity ({HOST}): shop/web-1 shares a's {HOST}"
    assert found["b"] is None and found["c"] is None and found["bare"] is None, "no hostname label: no domain"
    # The Pods already running have their say: cache-0 keeps batch Pods out of its zone.
    found = where(running("batch-1", "", {"app": "batch"}))
    assert found["c"] == f"shop/cache-0's required pod anti-affinity ({ZONE}) keeps it off c"
    assert found["a"] is None and found["b"] is None
    # Terms select in their owner's namespace unless they name others; a null selector selects nothing.
    assert where(running("batch-1", "", {"app": "batch"}, namespace="jobs"))["c"] is None
    assert where(running("web-9", "", {"app": "web"}, namespace="other", affinity=WEB_APART))["a"] is None, \
        "each term selects in its own Pod's namespace: web-1's in shop, web-9's in other"
    spread_all = anti(term(HOST, {"matchLabels": {"app": "web"}}, namespaceSelector={}))
    assert where(running("web-9", "", {"app": "web"}, namespace="other", affinity=spread_all))["a"] is not None
    assert where(running("x", "", {"app": "web"}, affinity=anti(term(HOST, None))))["a"] is not None, \
        "web-1's term still selects it"
    assert where(running("x", "", {"app": "x"}, affinity=anti(term(HOST, None))))["a"] is None
    # A term whose key the node lacks rules nothing out, and the next term still does.
    web = {"matchLabels": {"app": "web"}}
    assert where(running("web-2", "", {"app": "web"}, affinity=anti(term("rack", web), term(HOST, web))))["a"] == \
        f"required pod anti-affinity ({HOST}): shop/web-1 shares a's {HOST}"
    # The Pod that moves is among the ones whose own terms count, and the others' terms still do.
    batch_1 = running("batch-1", "a", {"app": "batch"}, affinity=anti(term(HOST, {"matchLabels": {"app": "etl"}})))
    assert where(batch_1, [batch_1, *CLUSTER])["c"] == \
        f"shop/cache-0's required pod anti-affinity ({ZONE}) keeps it off c"


NAMESPACES = {"shop": {"team": "retail"}, "jobs": {"team": "data"}, "other": {"team": "retail"}}


def test_a_namespace_selector_picks_the_namespaces_its_labels_match():
    """kube-scheduler's reading: the namespaces listed and those the selector matches, together;
    an empty selector, every namespace. Without the namespaces' labels, every namespace."""
    pods = [*CLUSTER, running("etl-1", "c", {"app": "etl"}, namespace="jobs")]

    def found(*terms: dict[str, Any], namespace_labels: dict[str, Any] | None = NAMESPACES) -> dict[str, str | None]:
        pod = running("api-1", "", {"app": "api"}, namespace="other", affinity=anti(*terms))
        neighbours = Neighbours(NODES, [placed_pod(p) for p in pods], namespace_labels)
        return {node: constraint_problem(node_constraints(pod), node, NODES[node], [], neighbours) for node in NODES}

    apart = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "etl"]}]}
    retail = found(term(HOST, apart, namespaceSelector={"matchLabels": {"team": "retail"}}))
    assert retail["a"] == f"required pod anti-affinity ({HOST}): shop/web-1 shares a's {HOST}"
    assert retail["c"] is None, "etl-1 runs in jobs, a data namespace"
    both = found(term(HOST, apart, namespaces=["jobs"], namespaceSelector={"matchLabels": {"team": "retail"}}))
    assert both["a"] is not None and both["c"] is not None, "the listed namespace and the selected ones"
    assert found(term(HOST, apart, namespaceSelector={"matchLabels": {"team": "none"}}))["a"] is None
    assert found(term(HOST, apart, namespaceSelector={}))["c"] is not None, "an empty selector: every namespace"
    unknown = found(term(HOST, apart, namespaceSelector={"matchLabels": {"team": "none"}}), namespace_labels=None)
    assert unknown["a"] is not None and unknown["c"] is not None, "labels not known: every namespace"


def test_the_pod_that_moves_no_longer_counts_where_it_was():
    # web-1 leaves a: for its zone-wide spread, its own old place does not count against b.
    zone_apart = anti(term(ZONE, {"matchLabels": {"app": "web"}}))
    pods = [running("web-1", "a", {"app": "web"}, affinity=zone_apart), running("db-0", "b", {"app": "db"})]
    assert where(running("web-1", "a", {"app": "web"}, affinity=zone_apart), pods)["b"] is None
    assert where(running("web-2", "", {"app": "web"}, affinity=zone_apart), pods)["b"] is not None


def test_required_affinity_needs_a_matching_pod_in_the_domain():
    beside_db = with_affinity(term(ZONE, {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}))
    found = where(running("api-1", "", {"app": "api"}, affinity=beside_db))
    assert found["a"] is None and found["b"] is None
    assert found["c"] == f"required pod affinity ({ZONE}): no Pod it must run beside shares c's {ZONE}"
    assert found["bare"] == f"required pod affinity: bare has no label {ZONE}"
    # The first of a group that selects itself may start anywhere (no other Pod matches).
    together = with_affinity(term(ZONE, {"matchLabels": {"app": "new"}}))
    assert where(running("new-1", "", {"app": "new"}, affinity=together))["c"] is None
    assert where(running("new-2", "", {"app": "new"}, affinity=together),
                 [*CLUSTER, running("new-1", "a", {"app": "new"})])["c"] is not None
    # One of the group that moves is no company for itself where it was: new-1 may leave a for
    # zone z2 while it is the group's only Pod, and may not leave new-2 behind for b (z1).
    new_1 = running("new-1", "a", {"app": "new"}, affinity=together)
    assert where(new_1, [*CLUSTER, new_1])["c"] is None
    assert where(new_1, [*CLUSTER, new_1, running("new-2", "c", {"app": "new"}, affinity=together)])["b"] == \
        f"required pod affinity ({ZONE}): no Pod it must run beside shares b's {ZONE}"


def test_a_replacement_sent_this_pass_counts_for_the_next_pod():
    neighbours = Neighbours(NODES, [placed_pod(p) for p in CLUSTER])
    web_2 = node_constraints(running("web-2", "a", {"app": "web"}, affinity=WEB_APART))
    assert constraint_problem(web_2, "b", NODES["b"], [], neighbours) is None
    neighbours.place(replacement(web_2, "b"))
    web_3 = node_constraints(running("web-3", "c", {"app": "web"}, affinity=WEB_APART))
    assert constraint_problem(web_3, "b", NODES["b"], [], neighbours) == \
        f"required pod anti-affinity ({HOST}): shop/web-2 (replacement) shares b's {HOST}"


@pytest.mark.parametrize("affinity", [
    {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "spread"}},
    anti({"labelSelector": {"matchLabels": {"app": "web"}}}),
    with_affinity("web"),
    {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": 3}},
    anti(term(HOST, {"matchLabels": {"app": "web"}}, namespaces="shop")),
    anti(term(HOST, {"matchLabels": {"app": "web"}}, namespaceSelector=["shop"])),
])
def test_unreadable_pod_affinity_admits_no_node(affinity):
    assert set(where(running("w", "", {"app": "w"}, affinity=affinity)).values()) == \
        {"its required pod affinity cannot be read"}


@pytest.mark.parametrize("selector", [{"matchLabels": ["app=web"]}, {"matchLabels": {"app": "web"},
                                                                      "matchExpressions": {"key": "app"}}])
def test_a_malformed_label_selector_selects_no_pod(selector):
    """A selector the API server would have refused keeps nothing away: a web Pod repelling it
    may still run beside web-1."""
    assert not selector_matches(selector, {"app": "web"})
    assert selector_matches({"matchLabels": {"app": "web"}}, {"app": "web"}), "the same selector, well formed"
    web_1 = [running("web-1", "a", {"app": "web"})]
    assert where(running("web-2", "", {"app": "web"}, affinity=anti(term(HOST, selector))), web_1)["a"] is None
    assert where(running("web-2", "", {"app": "web"}, affinity=WEB_APART), web_1)["a"] is not None


def spread(key: str, max_skew: int = 1, **extra: Any) -> dict[str, Any]:
    return {"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}}, **extra}


def spreading(name: str, node: str, *constraints: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod = running(name, node, {"app": "web"})
    pod["spec"].update(topologySpreadConstraints=list(constraints), **spec)
    return pod


def test_topology_spread_counts_matching_pods_per_domain_as_kube_scheduler_does():
    webs = [running("web-1", "a", {"app": "web"}), running("web-2", "b", {"app": "web"}),
            running("web-x", "c", {"app": "web"}, namespace="other")]
    found = where(spreading("web-3", "", spread(ZONE)), webs)
    # z1 holds 2 (web-x is in another namespace and does not count), z2 none: only z2 keeps the skew.
    assert found["a"] == f"topology spread ({ZONE}): 3 matching Pods in a's domain with it, 0 in the emptiest, " \
        "max skew 1"
    assert found["c"] is None
    assert found["bare"] == f"topology spread: bare has no label {ZONE}"
    assert where(spreading("web-3", "", spread(ZONE, 3)), webs)["a"] is None, "a larger skew allows it"
    # The Pod that moves no longer counts where it was: web-1 may go to b (z1: web-2 and it).
    assert where(spreading("web-1", "a", spread(ZONE)), webs)["b"] is not None
    assert where(spreading("web-1", "a", spread(ZONE, 2)), webs)["b"] is None
    # ScheduleAnyway only scores: it keeps the Pod off no node.
    assert where(spreading("web-3", "", {**spread(ZONE), "whenUnsatisfiable": "ScheduleAnyway"}), webs)["a"] is None


def test_topology_spread_domains_are_the_nodes_the_pod_could_use():
    webs = [running("web-1", "a", {"app": "web"}), running("web-2", "c", {"app": "web"})]
    assert where(spreading("web-3", "", spread(ZONE)), webs)["b"] is None, "z1 1 + it, z2 1: skew 1"
    # Fewer domains than minDomains: the emptiest counts as 0.
    assert where(spreading("web-3", "", spread(ZONE, minDomains=3)), webs)["b"] is not None
    assert where(spreading("web-3", "", spread(ZONE, minDomains=2)), webs)["b"] is None, "as many domains as asked"
    # Nodes its node affinity rules out are no domain: with z2 out of reach, z1 is the only one.
    only_z1 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        expression(ZONE, "In", "z1")]}}}
    lonely = [running("web-1", "a", {"app": "web"}), running("web-2", "b", {"app": "web"})]
    assert where(spreading("web-3", "", spread(ZONE), affinity=only_z1), lonely)["a"] is None
    assert where(spreading("web-3", "", spread(ZONE)), lonely)["a"] is not None

    def by_name(*nodes: str) -> dict[str, Any]:
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(nodes)}]}]}}}

    assert where(spreading("web-3", "", spread(ZONE), affinity=by_name("a", "b")), lonely)["a"] is None
    assert where(spreading("web-3", "", spread(ZONE), affinity=by_name("a", "b", "c")), lonely)["a"] is not None


def test_a_replacement_reaches_the_answers_asked_before_it_and_a_forks_stay_in_the_fork():
    """Neighbours remembers its answers for the pass: a replacement placed must reach the ones asked
    before it (required affinity, topology spread, preferred affinity weights), and one placed on a
    fork (a trial plan) must not reach the Neighbours it was forked from."""
    neighbours = Neighbours(NODES, [placed_pod(running("web-1", "a", {"app": "web"}))])
    beside_api = node_constraints(running("front-1", "", {"app": "front"},
                                          affinity=with_affinity(term(HOST, {"matchLabels": {"app": "api"}}))))
    web_2 = node_constraints(spreading("web-2", "", spread(ZONE)))

    def preferring(name: str, labels: dict[str, str], app: str) -> dict[str, Any]:
        return running(name, "", labels, affinity={"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 30, "podAffinityTerm": term(HOST, {"matchLabels": {"app": app}})}]}})

    api = node_constraints(running("api-1", "", {"app": "api"}))
    cache = node_constraints(preferring("cache-1", {"app": "cache"}, "api"))
    wants_cache = node_constraints(preferring("back-1", {"app": "back"}, "cache"))

    def answers(on: Neighbours) -> tuple[str | None, str | None, int, int]:
        return (constraint_problem(beside_api, "b", NODES["b"], [], on),
                constraint_problem(web_2, "a", NODES["a"], [], on),
                preferred_pod_affinity_weight(api, "b", on), preferred_pod_affinity_weight(wants_cache, "b", on))

    before = answers(neighbours)
    assert before[0] == f"required pod affinity ({HOST}): no Pod it must run beside shares b's {HOST}"
    assert before[1] == f"topology spread ({ZONE}): 2 matching Pods in a's domain with it, 0 in the emptiest, " \
        "max skew 1"
    assert before[2:] == (0, 0)
    trial = neighbours.fork()
    for placed in (replacement(api, "b"), replacement(web_2, "c"), replacement(cache, "b")):
        trial.place(placed)
    # api-1 is beside front-1; web-2 in z2 evens the zones; cache-1's term selects api-1; back-1's, cache-1.
    assert answers(trial) == (None, None, 30, 30)
    assert answers(neighbours) == before, "what the trial placed"
    for placed in (replacement(api, "b"), replacement(web_2, "c"), replacement(cache, "b")):
        neighbours.place(placed)
    assert answers(neighbours) == (None, None, 30, 30)


def test_each_term_counts_its_own_pods_when_a_pod_states_several_over_one_key():
    """Neighbours remembers what each term found in a domain for the pass; two terms over the same
    topology key select different Pods, and each keeps its own answer."""
    pods = [running("api-0", "b", {"app": "api"}), running("db-1", "a", {"app": "db"}),
            running("db-2", "b", {"app": "db"}), running("web-1", "c", {"app": "web"})]
    api, db, web = ({"matchLabels": {"app": app}} for app in ("api", "db", "web"))
    beside_both = running("front-1", "", {"app": "front"}, affinity=with_affinity(term(HOST, api), term(HOST, {
        "matchExpressions": [{"key": "app", "operator": "In", "values": ["cache"]}]})))
    assert where(beside_both, pods)["b"] == \
        f"required pod affinity ({HOST}): no Pod it must run beside shares b's {HOST}"
    prefers = node_constraints(running("front-1", "", {"app": "front"}, affinity={"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 30, "podAffinityTerm": term(HOST, api)},
                                                            {"weight": 10, "podAffinityTerm": term(HOST, web)}]}}))
    assert preferred_pod_affinity_weight(prefers, "b", Neighbours(NODES, [placed_pod(p) for p in pods])) == 30
    # Spread from the web Pods and from the db Pods, by zone: z1 holds no web Pod, but both db Pods.
    from_both = spreading("web-3", "", spread(ZONE), {**spread(ZONE), "labelSelector": db})
    assert where(from_both, pods)["a"] == f"topology spread ({ZONE}): 2 matching Pods in a's domain with it, " \
        "0 in the emptiest, max skew 1"
    assert where(spreading("web-3", "", spread(ZONE)), pods)["a"] is None
    soft = {"whenUnsatisfiable": "ScheduleAnyway"}
    scores = spread_scores(node_constraints(spreading("web-3", "", {**spread(ZONE), **soft},
                                                      {**spread(ZONE), **soft, "labelSelector": db})),
                           ["a", "c"], Neighbours(NODES, [placed_pod(p) for p in pods]))
    assert scores == [round(2 * math.log(4)), round(math.log(4))], "a: the two db Pods; c: the web Pod"


def test_preferred_anti_affinity_counts_its_weight_against_each_pod_it_selects():
    shuns = node_constraints(running("web-9", "", {"app": "web"}, affinity={"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            "odd", {"weight": "30", "podAffinityTerm": term(ZONE, {"matchLabels": {"app": "db"}})},
            {"weight": 30, "podAffinityTerm": term(ZONE, {"matchLabels": {"app": "web"}})}]}}))
    pods = [running("web-1", "a", {"app": "web"}), running("web-2", "b", {"app": "web"})]
    weights = [preferred_pod_affinity_weight(shuns, node, Neighbours(NODES, [placed_pod(p) for p in pods]))
               for node in ("a", "c")]
    assert weights == [-60, 0], "zone z1 holds two web Pods"


def test_a_pod_that_prefers_its_own_kind_counts_the_others_not_itself():
    """A Deployment whose Pods prefer each other's hosts: the one that moves does not draw itself
    to the node it leaves, and every other such Pod draws it to theirs."""
    together = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 30, "podAffinityTerm": term(HOST, {"matchLabels": {"app": "api"}})}]}}
    pods = [running(f"api-{n}", node, {"app": "api"}, affinity=together) for n, node in ((1, "b"), (2, "c"))]
    neighbours = Neighbours(NODES, [placed_pod(p) for p in pods])
    moving = node_constraints(pods[0])
    # c: api-2 there (its own term, 30) and api-2's term selects it (30); b: only itself, which leaves.
    assert [preferred_pod_affinity_weight(moving, node, neighbours) for node in ("a", "b", "c")] == [0, 0, 60]


def test_pods_on_nodes_or_in_namespaces_not_known_count_nowhere():
    """The node and namespace lists are read apart from the Pods: a Pod on a node just deleted, or
    a namespace whose labels are not known yet, is in no domain and raises nothing."""
    web_apart = running("web-1", "gone", {"app": "web"}, affinity={**WEB_APART, "podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 30, "podAffinityTerm": term(HOST, {"matchLabels": {"app": "web"}})}]}})
    neighbours = Neighbours(NODES, [placed_pod(web_apart), placed_pod(running("etl-1", "a", {"app": "web"}, "new"))],
                            NAMESPACES)
    selecting = {"matchLabels": {"app": "web"}}
    web_2 = node_constraints(running("web-2", "", {"app": "web"}, affinity={"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 30, "podAffinityTerm": term(HOST, selecting, namespaceSelector={"matchLabels": {"x": "y"}})}]}}))
    assert [preferred_pod_affinity_weight(web_2, node, neighbours) for node in ("a", "gone")] == [0, 0]
    assert constraint_problem(web_2, "gone", {}, [], neighbours) is None
    assert constraint_problem(web_2, "a", NODES["a"], [], neighbours) is None, "web-1's anti-affinity holds nowhere"
    web_3 = node_constraints(spreading("web-3", "", {**spread(ZONE), "whenUnsatisfiable": "ScheduleAnyway"}))
    assert spread_scores(web_3, ["a", "gone"], neighbours) == [0, None]


def sibling(name: str, node: str = "", kind: str = "ReplicaSet") -> dict[str, Any]:
    """A web Pod of the ReplicaSet web-5d8f9 (or of another ``kind`` of that name)."""
    found = running(name, node, {"app": "web"})
    found["metadata"]["ownerReferences"] = [{"kind": kind, "name": "web-5d8f9", "controller": True}]
    return found


def test_a_replacement_counts_as_its_controllers_pod_for_default_spreading():
    neighbours = Neighbours(NODES, [])
    web_9 = node_constraints(sibling("web-9"))
    alone = spread_scores(web_9, ["a", "c"], neighbours)
    assert alone[0] == alone[1]
    neighbours.place(replacement(node_constraints(sibling("web-1")), "a"))
    beside = spread_scores(web_9, ["a", "c"], neighbours)
    assert beside[0] > beside[1], "web-1's replacement is on a"


def test_spread_scores_are_kube_schedulers_weighted_counts_with_the_skew_added():
    """PodTopologySpread's score before normalizing: per ScheduleAnyway constraint, the Pods it
    counts in the node's domain x ln(domains among the candidate nodes + 2), plus max skew - 1,
    summed and rounded; a node lacking a key of the Pod's own constraints is ignored (None)."""
    soft = {"whenUnsatisfiable": "ScheduleAnyway"}
    pod = spreading("web-9", "", {**spread(HOST), **soft}, {**spread(ZONE, 2), **soft})
    webs = [running("web-1", "a", {"app": "web"}), running("web-2", "a", {"app": "web"}),
            running("web-3", "c", {"app": "web"}), running("web-x", "c", {"app": "web"}, namespace="other")]
    neighbours = Neighbours(NODES, [placed_pod(p) for p in webs])
    # Hosts: 3 candidates, ln 5 = 1.61 a Pod; zones z1 and z2: ln 4 = 1.39 a Pod, + 1 for skew 2.
    # a: 2 x 1.61 + (2 x 1.39 + 1) = 6.99; b: 0 + 3.77; c: 1.61 + 2.39 = 4.00 (web-x: other namespace).
    assert spread_scores(node_constraints(pod), ["a", "b", "c", "bare"], neighbours) == [7, 4, 4, None]
    # Two candidates, one zone: each Pod on a host weighs ln 4, each in the zone ln 3.
    assert spread_scores(node_constraints(pod), ["a", "b"], neighbours) == [round(2 * 1.386 + 2 * 1.099 + 1),
                                                                             round(2 * 1.099 + 1)]
    # Pods count only on nodes the Pod's node affinity admits (nodeAffinityPolicy: Honor): with
    # node a ruled out, zone z1 counts none of its Pods for b.
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [expression(HOST, "NotIn", "a")]}}}
    assert spread_scores(node_constraints(pod), ["b", "c"], neighbours) == [1, round(1.386 + 1.386 + 1)]


def test_default_spreading_scores_a_node_without_a_zone_by_its_host():
    """A ReplicaSet's Pod stating no constraint is spread by kube-scheduler's defaults (host,
    max skew 3; zone, max skew 5) from its siblings; a node without the zone label is still
    scored, by its host alone, and a Job's Pod is not spread at all."""
    hosts = {**NODES, "bare": {HOST: "bare"}}  # the kubelet always sets the hostname label
    neighbours = Neighbours(hosts, [placed_pod(p) for p in (sibling("web-1", "a"), sibling("web-2", "bare"))])
    # Hosts: 4 candidates, ln 6 = 1.79; zones among them: z1, z2 and "none", ln 5 = 1.61.
    # a: 1.79 + 2 + (1.61 + 4) = 9.40; b: 2 + 5.61; c: 2 + 4; bare: 1.79 + 2, no zone term.
    assert spread_scores(node_constraints(sibling("web-9", "")), ["a", "b", "c", "bare"], neighbours) == [9, 8, 6, 4]
    assert spread_scores(node_constraints(sibling("web-9", "", "Job")), ["a", "bare"], neighbours) == [0, 0]
    # The other controllers whose selector kube-scheduler's default spreading counts siblings by.
    for kind in ("StatefulSet", "ReplicationController"):
        pods = (sibling("web-1", "a", kind), sibling("web-2", "bare", kind))
        neighbours = Neighbours(hosts, [placed_pod(p) for p in pods])
        assert spread_scores(node_constraints(sibling("web-9", "", kind)), ["a", "b", "c", "bare"],
                             neighbours) == [9, 8, 6, 4], kind


def test_match_label_keys_count_only_the_pods_of_the_same_rollout():
    """``matchLabelKeys: [pod-template-hash]``: the old ReplicaSet's Pods, still running during a
    rollout, do not count against the new one's spread."""
    hash_key = "pod-template-hash"
    webs = [running("web-old-1", "a", {"app": "web", hash_key: "old"}),
            running("web-old-2", "b", {"app": "web", hash_key: "old"}),
            running("web-new-1", "c", {"app": "web", hash_key: "new"})]
    new = spreading("web-new-2", "", spread(ZONE, matchLabelKeys=[hash_key]))
    new["metadata"]["labels"][hash_key] = "new"
    assert where(new, webs)["a"] is None, "z1 holds no Pod of this rollout, z2 one"
    assert where(spreading("web-new-2", "", spread(ZONE)), webs)["a"] is not None, "without the key z1 holds two"
    assert where(spreading("web-new-2", "", spread(ZONE, matchLabelKeys=[hash_key])), webs)["a"] is not None, \
        "a key the Pod does not carry is left out"
    assert where(new, [*webs[:2], running("web-new-3", "a", {"app": "web", hash_key: "new"})])["b"] is not None, \
        "z1 holds one Pod of this rollout and z2 none: a second in z1 is a skew of 2"
    # The API server refuses matchLabelKeys without a labelSelector; such a constraint counts no Pod.
    unselected = spreading("web-new-2", "", spread(ZONE, labelSelector=None, matchLabelKeys=[hash_key]))
    unselected["metadata"]["labels"][hash_key] = "new"
    assert where(unselected, [*webs, running("web-new-3", "a", {"app": "web", hash_key: "new"})])["a"] is None
    # ScheduleAnyway narrows its count the same way: z1 scores as empty (0), z2 one Pod x ln(2 zones + 2).
    soft = spreading("web-new-2", "", spread(ZONE, matchLabelKeys=[hash_key], whenUnsatisfiable="ScheduleAnyway"))
    soft["metadata"]["labels"][hash_key] = "new"
    assert spread_scores(node_constraints(soft), ["a", "c"], Neighbours(NODES, [placed_pod(p) for p in webs])) == [0, 1]


def test_match_label_keys_narrow_a_selector_of_expressions_too():
    """The selector's own expressions stay: the front tier's version 2 Pods count, not version 2
    of the back tier."""
    front = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]}
    pods = [running("back-1", "a", {"tier": "back", "version": "2"}),
            running("back-2", "b", {"tier": "back", "version": "2"}),
            running("front-1", "c", {"tier": "front", "version": "2"})]
    moving = running("front-2", "", {"tier": "front", "version": "2"})
    moving["spec"]["topologySpreadConstraints"] = [spread(ZONE, labelSelector=front, matchLabelKeys=["version"])]
    assert where(moving, pods)["a"] is None, "z1 holds no front Pod, z2 one"
    assert where(moving, pods)["c"] is not None, "z2 would hold two, z1 none"


def test_a_pod_states_both_kinds_of_spread_constraint_each_in_its_place():
    pod = spreading("web-3", "", {**spread(HOST), "whenUnsatisfiable": "ScheduleAnyway"}, spread(ZONE))
    constraints = node_constraints(pod)
    assert [c.topology_key for c in constraints.spread] == [ZONE], "DoNotSchedule: a filter"
    assert [c.topology_key for c in constraints.soft_spread] == [HOST], "ScheduleAnyway: a score"


@pytest.mark.parametrize("constraint", [
    {**spread(ZONE), "matchLabelKeys": "pod-template-hash"},
    {**spread(ZONE), "maxSkew": 0}, {**spread(ZONE), "maxSkew": "1"}, {**spread(ZONE), "whenUnsatisfiable": None},
    {**spread(ZONE), "topologyKey": None}, "zone",
])
def test_unreadable_topology_spread_admits_no_node(constraint):
    assert set(where(spreading("w", "", constraint)).values()) == {"its topology spread constraints cannot be read"}


GPU_POD = {"spec": {
    "initContainers": [
        {"name": "fetch", "resources": {"requests": {"ephemeral-storage": "10Gi"}}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}],
    "containers": [
        {"name": "train", "resources": {"requests": {"cpu": "4", "ephemeral-storage": "2Gi"},
                                        "limits": {"nvidia.com/gpu": "2", "hugepages-2Mi": "512Mi"}}}],
    "overhead": {"cpu": "250m", "ephemeral-storage": "1Mi"}}}


def test_what_a_pod_takes_besides_cpu_and_memory_is_counted_as_node_resources_fit_counts_it():
    gpu_pod = GPU_POD
    # The init container runs alone (10Gi); the app beside its sidecar takes 3Gi; the overhead adds.
    assert other_requests(gpu_pod) == {"pods": 1, "ephemeral-storage": 10 * 2**30 + 2**20,
                                       "hugepages-2Mi": 512 * 2**20, "nvidia.com/gpu": 2}
    assert other_requests({"spec": {"containers": [{"name": "web", "resources": {"requests": {"cpu": "1"}}}]}}) == {
        "pods": 1}
    assert node_constraints(gpu_pod).resources["nvidia.com/gpu"] == 2
    # A RuntimeClass's overhead counts even for a resource no container names.
    assert other_requests({"spec": {"containers": [{"name": "vm"}], "overhead": {"example.com/vfio": "1"}}}) == {
        "pods": 1, "example.com/vfio": 1}

    requests = other_requests(gpu_pod)
    roomy = free_resources({"pods": "110", "ephemeral-storage": "100Gi", "hugepages-2Mi": "1Gi",
                            "nvidia.com/gpu": "2"}, {"pods": 3})
    assert resources_problem(requests, roomy, NODE) is None
    assert free_resources({"example.com/odd": "lots", "pods": "110"}, {}) == {"pods": 110}, "the odd one alone is lost"
    roomy["nvidia.com/gpu"] -= 1
    assert resources_problem(requests, roomy, NODE) == f"nvidia.com/gpu: 2 requested, 1 free on {NODE}"
    assert resources_problem(requests, {**roomy, "nvidia.com/gpu": 2, "hugepages-2Mi": 0}, NODE) == \
        f"hugepages-2Mi: 512Mi requested, 0 free on {NODE}"


@pytest.mark.shared
def test_the_real_gke_node_has_no_room_for_what_it_does_not_have():
    # What it allocates, less what its Pods take (it has no GPU, no hugepages).
    node = json.loads((SHARED / "fixtures" / "nodes" / "gke-node.json").read_text())
    free = free_resources(node["status"]["allocatable"], {"pods": 12, "ephemeral-storage": 2**30})
    assert free == {"ephemeral-storage": 104638878617 - 2**30, "hugepages-2Mi": 0, "pods": 98}
    requests = other_requests(GPU_POD)
    assert resources_problem(requests, free, NODE) == f"hugepages-2Mi: 512Mi requested, 0 free on {NODE}"
    assert resources_problem({"pods": 1}, {**free, "pods": 0}, NODE) == f"pods: 1 requested, 0 free on {NODE}"


def test_host_ports_clash_as_the_node_ports_filter_judges_them():
    proxy = {"spec": {
        "initContainers": [
            {"name": "setup", "ports": [{"containerPort": 1, "hostPort": 7000}]},  # runs before: binds nothing after
            {"name": "mesh", "restartPolicy": "Always", "ports": [{"containerPort": 15001, "hostPort": 15001}]}],
        "containers": [{"name": "dns", "ports": [
            {"containerPort": 53, "hostPort": 53, "protocol": "UDP"},
            {"containerPort": 8080, "hostPort": 8080, "hostIP": "10.0.0.5"},
            {"containerPort": 9090}, {"containerPort": 9091, "hostPort": 0}, {"containerPort": 1, "hostPort": 1}]}]}}
    wanted = host_ports(proxy)
    # hostPort 0 (the API's "none"), and no hostPort, bind nothing.
    assert wanted == (("0.0.0.0", "TCP", 15001), ("0.0.0.0", "UDP", 53), ("10.0.0.5", "TCP", 8080),
                      ("0.0.0.0", "TCP", 1))
    assert node_constraints(proxy).host_ports == wanted
    assert ports_problem(wanted, set(), NODE) is None
    # Another address, or another protocol, is no clash; every address, or the same one, is.
    assert ports_problem(wanted, {("10.0.0.6", "TCP", 8080), ("0.0.0.0", "TCP", 53)}, NODE) is None
    assert ports_problem(wanted, {("0.0.0.0", "TCP", 8080)}, NODE) == f"host port 8080/TCP is taken on {NODE}"
    assert ports_problem(wanted, {("10.0.0.5", "TCP", 8080)}, NODE) == f"host port 8080/TCP is taken on {NODE}"
    assert ports_problem(wanted, {("10.0.0.7", "UDP", 53)}, NODE) == f"host port 53/UDP is taken on {NODE}"
    assert ports_problem(wanted, {("10.0.0.7", "TCP", 15001)}, NODE) == f"host port 15001/TCP is taken on {NODE}"


def test_csi_volumes_count_against_each_drivers_limit_as_node_volume_limits_counts_them():
    ebs, efs = "ebs.csi.aws.com", "efs.csi.aws.com"
    ebs_volume = {"metadata": {"name": "pv-1"}, "spec": {"csi": {"driver": ebs, "volumeHandle": "vol-1"}}}
    assert csi_volume(ebs_volume) == CsiVolume(ebs, "pv-1")
    # In-tree volumes are attached by the driver CSI migration hands them to (the names of
    # k8s.io/csi-translation-lib's plugins).
    for plugin, driver in (("awsElasticBlockStore", ebs), ("azureDisk", "disk.csi.azure.com"),
                           ("gcePersistentDisk", "pd.csi.storage.gke.io"), ("azureFile", "file.csi.azure.com"),
                           ("cinder", "cinder.csi.openstack.org"), ("vsphereVolume", "csi.vsphere.vmware.com"),
                           ("portworxVolume", "pxd.portworx.com")):
        assert csi_volume({"metadata": {"name": "pv-old"}, "spec": {plugin: {}}}) == CsiVolume(driver, "pv-old")
    for other in ({"metadata": {"name": "pv-nfs"}, "spec": {"nfs": {"server": "nfs", "path": "/"}}},
                  {"metadata": {"name": "pv-local"}, "spec": {"local": {"path": "/mnt"}}},
                  {"metadata": {"name": "pv-x"}, "spec": {"csi": {"driver": ""}}},
                  {"metadata": {"name": "pv-x"}, "spec": "garbage"},
                  {"metadata": {}, "spec": {"csi": {"driver": ebs}}},
                  {"metadata": "x", "spec": {"csi": {"driver": ebs}}}):
        assert csi_volume(other) is None

    csi_node = {"spec": {"drivers": [{"name": ebs, "allocatable": {"count": 3}}, {"name": efs},
                                     {"name": "odd", "allocatable": {"count": "3"}}, "garbage"]}}
    assert volume_limits(csi_node) == {ebs: 3}, "a driver stating no count has no limit"
    assert volume_limits({"spec": None}) == {} and volume_limits({}) == {}

    def attachment(name: str, volume: str) -> dict[str, Any]:
        return {"metadata": {"name": name},
                "spec": {"attacher": ebs, "nodeName": NODE, "source": {"persistentVolumeName": volume}}}

    attachments = [
        attachment("a1", "pv-1"), attachment("a2", "pv-2"),
        # A migrated inline volume's attachment names no PersistentVolume: it counts by itself.
        {"metadata": {"name": "a3"}, "spec": {"attacher": ebs, "nodeName": NODE, "source": {"inlineVolumeSpec": {}}}},
        {"metadata": {"name": "a4"}, "spec": {"attacher": efs, "nodeName": "node-b", "source": {
            "persistentVolumeName": "pv-9"}}},
        {"metadata": {"name": "bad"}, "spec": {"attacher": ebs}}, {"metadata": {"name": "worse"}},
        {"metadata": "x", "spec": {"attacher": ebs, "nodeName": "node-c"}}]
    attached = attached_volumes(attachments)
    assert attached == {NODE: {ebs: frozenset({"pv-1", "pv-2", "VolumeAttachment a3"})},
                        "node-b": {efs: frozenset({"pv-9"})}, "node-c": {ebs: frozenset({"VolumeAttachment "})}}

    there, limits = attached[NODE], {ebs: 4}
    assert volumes_problem([CsiVolume(ebs, "pv-3")], there, limits, NODE) is None, "3 of 4: room for one"
    assert volumes_problem([CsiVolume(ebs, "pv-3"), CsiVolume(ebs, "pv-4")], there, limits, NODE) == \
        "ebs.csi.aws.com: 3 volumes attached to node-a, its limit 4"
    assert volumes_problem([CsiVolume(ebs, "pv-1"), CsiVolume(ebs, "pv-3")], there, limits, NODE) is None, \
        "a volume attached there already takes nothing more"
    assert volumes_problem([CsiVolume(efs, "pv-5")] * 2, there, limits, NODE) is None, "no limit for that driver"
    azure = CsiVolume("disk.csi.azure.com", "pv-6")  # a driver with no limit there, read before ebs
    assert volumes_problem([azure, CsiVolume(ebs, "pv-3"), CsiVolume(ebs, "pv-4")], there, limits, NODE) == \
        "ebs.csi.aws.com: 3 volumes attached to node-a, its limit 4"
    assert volumes_problem([CsiVolume(ebs, "pv-3")], {}, {ebs: 0}, NODE) == \
        "ebs.csi.aws.com: 0 volumes attached to node-a, its limit 0"
