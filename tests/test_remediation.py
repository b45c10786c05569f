"""Hot-node remediation: the pure policy, and the remediator end to end (the real ``kubernetes``
client against the API double, which serves metrics.k8s.io, the Eviction API and
PodDisruptionBudgets as the API server does)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from kube.leader import LeaseElector
from kube.metrics_api import MetricsAPI
from oversale.annotations import AnnotationKeys
from oversale.cpus import Topology
from oversale.node_fit import CsiVolume, Neighbours, NodeConstraints, node_constraints, placed_pod
from oversale.placement import (
    NodeHeat,
    NodeUsage,
    NodeView,
    PodDemand,
    placement_score,
    pod_demand,
    reservations_of,
    shortfall,
)
from oversale.remediation import (
    Candidate,
    Cooldowns,
    RemediationConfig,
    RuntimeWatermarks,
    Target,
    cooldowns_text,
    eviction_exclusion,
    eviction_order,
    excess,
    hot_taint_expired,
    next_streak,
    plan_moves,
    read_cooldowns,
    serving_replica_of,
    target_for,
    with_hot_taint,
)
from oversale.remediation import candidate as candidate_of
from oversale.settings import Settings
from oversale.timestamps import format_timestamp
from oversale.usage import LoadConfig, NodeLoad
from reconcilers.cluster import Cluster
from reconcilers.remediation import Remediator
from tests.conftest import (
    ROOT,
    cli_env,
    eventually,
    exposed_value,
    free_port,
    loaded_client,
    scraped,
    start_run,
    stop_process,
)
from tests.kube_api import FakeKubeAPI

KEYS = AnnotationKeys()
NOW = 1_800_000_000.0
LONG_AGO = "2020-01-01T00:00:00Z"
GI = 2**30


# ---- the pure policy --------------------------------------------------------------------------

def pod(name: str = "web-5d8f9-abcde", owner: tuple[str, str] | None = ("ReplicaSet", "web-5d8f9"),
        cpu: str | None = "500m", memory: str = "512Mi", started: str = LONG_AGO, **spec: Any) -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu, "memory": memory}} if cpu else {}
    metadata: dict[str, Any] = {"name": name, "namespace": "shop", "labels": {"app": name.split("-")[0]}}
    if owner:
        metadata["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True,
                                        "apiVersion": "apps/v1", "uid": "x"}]
    return {"metadata": metadata,
            "spec": {"nodeName": "node-hot", "containers": [{"name": "app", "image": "x", "resources": resources}],
                     **spec},
            "status": {"phase": "Running", "startTime": started}}


@pytest.mark.parametrize(("changed", "reason"), [
    (pod(owner=("DaemonSet", "agent")), "DaemonSet Pod (it would come back on the same node)"),
    (pod(owner=("Job", "nightly-29345")), "Job Pod (its replacement starts the work over, and the eviction counts "
                                          f"against the Job's backoffLimit; {KEYS.evictable}: y allows it)"),
    (pod(owner=None), "no controller would recreate it"),
    (pod(priorityClassName="system-node-critical", priority=2_000_001_000), "critical priority (system-node-critical)"),
    # The class alone, as on a Pod read before the Priority admission plugin filled its priority in.
    (pod(priorityClassName="system-cluster-critical"), "critical priority (system-cluster-critical)"),
    (pod(priorityClassName="system-node-critical"), "critical priority (system-node-critical)"),
    (pod(priority=2_000_001_000), "critical priority (2000001000)"),
    (pod(priority=2_000_000_000), "critical priority (2000000000)"),  # system-cluster-critical's
    (pod(volumes=[{"name": "cache", "emptyDir": {}}]), f"local storage (cache; {KEYS.evictable}: y allows it)"),
    (pod(volumes=[{"name": "logs", "hostPath": {"path": "/var/log"}}, {"name": "tmp", "emptyDir": {}}]),
     f"local storage (logs, tmp; {KEYS.evictable}: y allows it)"),
    (pod(started=format_timestamp(NOW - 120)), "started 120s ago (minimum age 600s)"),
    (pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
     f"DRA resource claims (no other node is known to have their devices; {KEYS.evictable}: y allows it)"),
])
def test_every_exclusion_rule_keeps_the_pod(changed, reason):
    assert eviction_exclusion(pod(), KEYS, NOW, 600) is None
    assert eviction_exclusion(changed, KEYS, NOW, 600) == reason


def test_only_a_running_pod_old_enough_moves():
    leaving = pod()
    leaving["metadata"]["deletionTimestamp"] = LONG_AGO
    assert eviction_exclusion(leaving, KEYS, NOW, 600) == "not running", "being deleted already"
    assert eviction_exclusion({**pod(), "status": {"phase": "Pending"}}, KEYS, NOW, 600) == "not running"
    started = format_timestamp(NOW - 60)
    assert eviction_exclusion(pod(started=started), KEYS, NOW, 600) == "started 60s ago (minimum age 600s)"
    assert eviction_exclusion(pod(started=started), KEYS, NOW, 60) is None, "exactly the minimum age"
    # A Pod the kubelet has not stamped a start on yet is as old as the Pod object.
    unstamped = {**pod(), "status": {"phase": "Running"}}
    unstamped["metadata"]["creationTimestamp"] = started
    assert eviction_exclusion(unstamped, KEYS, NOW, 600) == "started 60s ago (minimum age 600s)"
    del unstamped["metadata"]["creationTimestamp"]
    assert eviction_exclusion(unstamped, KEYS, NOW, 600) is None, "no age to hold it by"


def test_annotations_opt_out_or_allow_local_storage():
    opted_out = pod()
    opted_out["metadata"]["annotations"] = {KEYS.evictable: "n"}
    assert eviction_exclusion(opted_out, KEYS, NOW, 600) == f"opted out ({KEYS.evictable}: n)"
    local = pod(volumes=[{"name": "cache", "emptyDir": {}}])
    local["metadata"]["annotations"] = {KEYS.evictable: "y"}
    assert eviction_exclusion(local, KEYS, NOW, 600) is None
    batch = pod(owner=("Job", "nightly-29345"))
    batch["metadata"]["annotations"] = {KEYS.evictable: "y"}
    assert eviction_exclusion(batch, KEYS, NOW, 600) is None
    claims = pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    claims["metadata"]["annotations"] = {KEYS.evictable: "y"}
    assert eviction_exclusion(claims, KEYS, NOW, 600) is None, "its team says its claims may move"
    local["metadata"]["annotations"] = {KEYS.evictable: "perhaps"}
    assert eviction_exclusion(local, KEYS, NOW, 600) == \
        f"annotation {KEYS.evictable}='perhaps' is not y or n (kept, to be safe)"
    mirror = pod()
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    assert eviction_exclusion(mirror, KEYS, NOW, 600) == "static Pod"


def test_a_workload_below_the_minimum_of_ready_replicas_keeps_its_pod():
    # The default, as the descheduler's: the only replica may move (a PDB would still hold it).
    assert eviction_exclusion(pod(), KEYS, NOW, 600, ready_replicas=1) is None
    assert eviction_exclusion(pod(), KEYS, NOW, 600, ready_replicas=0, min_replicas=1) is None, "1 asks nothing"
    assert eviction_exclusion(pod(), KEYS, NOW, 600, ready_replicas=1, min_replicas=2) == (
        f"1 Ready replica(s) of ReplicaSet/web-5d8f9, fewer than the 2 remediation needs to move one "
        f"({KEYS.evictable}: y allows it)")
    assert eviction_exclusion(pod(), KEYS, NOW, 600, ready_replicas=2, min_replicas=2) is None
    assert eviction_exclusion(pod(), KEYS, NOW, 600, min_replicas=2) is None, "not counted: nothing to hold it by"
    allowed = pod()
    allowed["metadata"]["annotations"] = {KEYS.evictable: "y"}
    assert eviction_exclusion(allowed, KEYS, NOW, 600, ready_replicas=1, min_replicas=2) is None
    # Only Running, Ready Pods not being deleted serve; they count per controller.
    ready = {**pod(), "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert serving_replica_of(ready) == ("shop", "ReplicaSet", "web-5d8f9")
    assert serving_replica_of(pod()) is None, "no Ready condition"
    assert serving_replica_of({**ready, "status": {**ready["status"], "phase": "Succeeded"}}) is None
    leaving = copy.deepcopy(ready)
    leaving["metadata"]["deletionTimestamp"] = LONG_AGO
    assert serving_replica_of(leaving) is None
    assert serving_replica_of({**ready, "metadata": {"name": "bare", "namespace": "shop"}}) is None


@pytest.mark.parametrize(("key", "kept", "not_kept"), [
    ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false", "true"),
    ("karpenter.sh/do-not-disrupt", "true", "false"),
    ("karpenter.sh/do-not-evict", "true", "False"),
])
def test_a_pod_its_team_marked_not_to_disrupt_for_the_node_autoscalers_is_kept(key, kept, not_kept):
    marked = pod()
    marked["metadata"]["annotations"] = {key: kept}
    assert eviction_exclusion(marked, KEYS, NOW, 600) == f"{key}: {kept!r} ({KEYS.evictable}: y overrides it)"
    # Read as the autoscalers read it: only that exact value keeps the Pod.
    marked["metadata"]["annotations"] = {key: not_kept}
    assert eviction_exclusion(marked, KEYS, NOW, 600) is None
    # Our own annotation is the more specific word, either way.
    marked["metadata"]["annotations"] = {key: kept, KEYS.evictable: "y"}
    assert eviction_exclusion(marked, KEYS, NOW, 600) is None
    marked["metadata"]["annotations"] = {key: not_kept, KEYS.evictable: "n"}
    assert "opted out" in (eviction_exclusion(marked, KEYS, NOW, 600) or "")


def test_the_cores_remediation_defaults_are_the_products():
    assert RemediationConfig() == Settings(kubernetes="off").remediation_config


def test_a_node_is_hot_above_the_watermark_and_a_cool_observation_starts_over():
    real = {"cpu": 4000, "memory": 16 * GI}
    assert excess({"cpu": 3800.0, "memory": 0.0}, real, RuntimeWatermarks()) == {}, "at the watermark: not hot"
    assert excess({"cpu": 3801.0, "memory": 0.0}, real, RuntimeWatermarks()) == {"cpu": pytest.approx(1.0)}
    streak = 0
    for hot in (True, True, False, True):
        streak = next_streak(streak, hot)
    assert streak == 1
    # A node whose real capacity is not known (no record from the node webhook) is never hot.
    assert excess({"cpu": 100.0, "memory": float(GI)}, {"cpu": 0, "memory": 0}, RuntimeWatermarks()) == {}
    assert excess({"cpu": 100.0, "memory": float(GI)}, {"cpu": 4000}, RuntimeWatermarks()) == {}, "memory not known"


def candidate(name: str, qos: str, cpu_request: int, cpu_used: float, workload: str = "") -> Candidate:
    demand = PodDemand(name, {"cpu": cpu_request, "memory": GI}, None, False, owner=workload or f"shop/RS/{name}")
    return Candidate(f"shop/{name}", "shop", workload or f"shop/RS/{name}", qos, demand,
                     {"cpu": cpu_used, "memory": float(GI // 2)})


def target(name: str = "node-cool", cpu_free: int = 8000, cpu_used: float = 500.0) -> Target:
    view = NodeView(name, {"cpu": 8000, "memory": 32 * GI}, Decimal(1), Topology.flat(8),
                    real={"cpu": 8000, "memory": 32 * GI})
    usage = NodeUsage(shared={"cpu": 8000 - cpu_free, "memory": 0})
    return Target(view, usage, NodeHeat(NodeLoad(cpu_used, cpu_used, 4.0 * GI, NOW), NOW))


def preferring_hosts_of(app: str, weight: int) -> dict[str, Any]:
    """Preferred pod affinity for the hosts of ``app``'s Pods."""
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": weight, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}}]}}


def apart_from_hosts_of(app: str) -> dict[str, Any]:
    """Required pod anti-affinity against the hosts of ``app``'s Pods (one per node, for ``app`` itself)."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}}


def test_best_effort_first_then_burstable_using_most_above_request():
    ordered = eviction_order([candidate("g", "Guaranteed", 1000, 3000), candidate("b1", "Burstable", 500, 900),
                              candidate("b2", "Burstable", 500, 1500), candidate("be", "BestEffort", 0, 100),
                              candidate("b3", "Burstable", 2000, 2500)])
    # b3 uses the most of the Burstable Pods, but only 500m above its request: b2's 1000m comes first.
    assert [c.name for c in ordered] == ["shop/be", "shop/b2", "shop/b3", "shop/b1", "shop/g"]


def test_the_fewest_pods_that_cover_the_excess_and_each_has_a_place_to_go():
    pods = [candidate("small", "BestEffort", 0, 200), candidate("big", "Burstable", 500, 1500),
            candidate("other", "Burstable", 500, 700)]
    plan = plan_moves({"cpu": 1000.0}, pods, [target()], LoadConfig(), allowed=5)
    # "small" is preferred but does not matter once "big" is taken: one eviction, not two.
    assert [m.pod.name for m in plan.moves] == ["shop/big"]
    assert plan.moves[0].target == "node-cool" and plan.uncovered == {}


def test_the_excess_is_covered_to_the_millicore():
    pods = [candidate("most", "Burstable", 500, 999), candidate("rest", "Burstable", 500, 10)]
    plan = plan_moves({"cpu": 1000.0}, pods, [target()], LoadConfig(), allowed=5)
    assert [m.pod.name for m in plan.moves] == ["shop/most", "shop/rest"], "1m left by the first is still hot"


def test_a_move_says_what_it_takes_off_each_hot_resource():
    hungry = dataclasses.replace(candidate("big", "Burstable", 500, 1500), usage={"cpu": 1500.0, "memory": 2.0 * GI})
    (move,) = plan_moves({"cpu": 1000.0, "memory": float(GI)}, [hungry], [target()], LoadConfig(), allowed=5).moves
    assert move.reason == ("Burstable, uses 1500m cpu, 1 above the watermark; "
                           "uses 2Gi memory, 1Gi above the watermark")


def test_a_pod_chosen_early_is_dropped_again_only_where_the_others_cover_the_excess_without_it():
    """Greedy in eviction order, then back from the last chosen: a Pod goes back only if the
    excess stays covered without it, counted afresh after each one dropped."""
    first, second = candidate("first", "BestEffort", 0, 500), candidate("second", "BestEffort", 0, 300)
    late = candidate("late", "Burstable", 500, 900)
    plan = plan_moves({"cpu": 1000.0}, [first, second, late], [target()], LoadConfig(), allowed=5)
    # late alone leaves 100m; late and second still do; late and first (1.4 cores) cover the 1.
    assert [m.pod.name for m in plan.moves] == ["shop/first", "shop/late"] and plan.uncovered == {}
    # Covering the excess exactly is covering it: the small Pod first chosen is not needed.
    exact = plan_moves({"cpu": 1000.0}, [first, candidate("whole", "Burstable", 500, 1000)], [target()], LoadConfig(),
                       allowed=5)
    assert [m.pod.name for m in exact.moves] == ["shop/whole"] and exact.uncovered == {}


def test_a_plan_passes_over_pods_that_would_not_cool_the_node_or_could_not_go_anywhere():
    """An idle BestEffort Pod comes first in eviction order but cools nothing; a Pod no node can
    take stays. Neither takes the place of the Pod that can move and cools the node."""
    idle = dataclasses.replace(candidate("idle", "BestEffort", 0, 0), usage={"cpu": 0.0, "memory": float(GI // 2)})
    huge = candidate("huge", "Burstable", 9000, 11000)  # asks more than any node has free
    movable = candidate("web", "Burstable", 500, 1500)
    plan = plan_moves({"cpu": 1000.0}, [idle, huge, movable], [target()], LoadConfig(), allowed=5)
    assert [m.pod.name for m in plan.moves] == ["shop/web"] and plan.uncovered == {}, "1.5 cores cover the 1 over"
    assert [(pod.name, why.split(" (")[0]) for pod, why in plan.kept] == [("shop/huge", "no node can take it")]
    # Nor is an idle Pod moved when the others cannot cover the excess: it would cool nothing.
    short = plan_moves({"cpu": 2000.0}, [idle, movable], [target()], LoadConfig(), allowed=5)
    assert [m.pod.name for m in short.moves] == ["shop/web"] and short.uncovered == {"cpu": 500.0}


def test_a_pod_its_neighbours_keep_off_every_target_does_not_take_the_place_of_one_that_can_move():
    hostname = "kubernetes.io/hostname"
    api_pod = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"))
    batch_pod = pod("batch-1a2b3-xyzab", owner=("ReplicaSet", "batch-1a2b3"))
    guard = pod("guard-9f8e7-abcde", owner=("ReplicaSet", "guard-9f8e7"), affinity=apart_from_hosts_of("api"))
    guard["spec"]["nodeName"] = "node-cool"
    neighbours = Neighbours({n: {hostname: n} for n in ("node-hot", "node-cool")},
                            [placed_pod(p) for p in (api_pod, batch_pod, guard)])
    api = candidate_of(api_pod, pod_demand(api_pod, KEYS), {"cpu": 2000.0, "memory": float(GI)})
    batch = candidate_of(batch_pod, pod_demand(batch_pod, KEYS), {"cpu": 1200.0, "memory": float(GI)})
    cool = dataclasses.replace(target("node-cool"), labels={hostname: "node-cool"})
    plan = plan_moves({"cpu": 1000.0}, [api, batch], [cool], LoadConfig(), allowed=5, neighbours=neighbours)
    assert [m.pod.name for m in plan.moves] == ["shop/batch-1a2b3-xyzab"], "the api Pod uses more, but cannot go"
    assert "required pod anti-affinity" in dict((p.name, why) for p, why in plan.kept)["shop/api-6f7c8-fghij"]


def test_what_the_moves_a_plan_may_make_leave_uncovered():
    pods = [candidate("a", "Burstable", 500, 1500), candidate("b", "Burstable", 500, 1000)]
    exact = plan_moves({"cpu": 1500.0}, pods[:1], [target()], LoadConfig(), allowed=5)
    assert [m.pod.name for m in exact.moves] == ["shop/a"] and exact.uncovered == {}, "covered to the millicore"
    capped = plan_moves({"cpu": 2200.0}, pods, [target()], LoadConfig(), allowed=1)
    assert [m.pod.name for m in capped.moves] == ["shop/a"]
    assert capped.uncovered == {"cpu": pytest.approx(700.0)}
    assert capped.kept == [(pods[1], "over the limit of 1 evictions here this pass")]


def test_a_pod_whose_only_target_is_full_or_would_run_hot_is_not_moved():
    pods = [candidate("big", "Burstable", 500, 1500)]
    full = plan_moves({"cpu": 1000.0}, pods, [target(cpu_free=100)], LoadConfig(), allowed=5)
    assert full.moves == [] and "no node can take it (cpu: 500m requested, 100m free" in full.kept[0][1]
    # 8 real cores at 4.2 used + 1.5 moved = 71%: above the 65% scheduling watermark.
    warm = plan_moves({"cpu": 1000.0}, pods, [target(cpu_used=4200)], LoadConfig(), allowed=5)
    assert warm.moves == [] and "above the scheduling watermark 65%" in warm.kept[0][1]


def test_a_target_with_a_soft_taint_the_pod_does_not_tolerate_comes_last():
    """kube-scheduler's TaintToleration ranks a node lower for each PreferNoSchedule taint the Pod
    does not tolerate (the hot-node taint, a cluster autoscaler's deletion candidate): room held
    there would seldom be taken. Such a node is chosen only when no other can take the Pod."""
    soft = ({"key": "DeletionCandidateOfClusterAutoscaler", "value": "1764000000", "effect": "PreferNoSchedule"},)
    tainted, plain = dataclasses.replace(target("node-tainted"), taints=soft), target("node-plain")
    pod_ = candidate("big", "Burstable", 500, 1500)
    plan = plan_moves({"cpu": 1000.0}, [pod_], [tainted, plain], LoadConfig(), allowed=5)
    assert [m.target for m in plan.moves] == ["node-plain"]
    full = dataclasses.replace(plain, usage=NodeUsage(shared={"cpu": 8000, "memory": 0}))
    plan = plan_moves({"cpu": 1000.0}, [pod_], [tainted, full], LoadConfig(), allowed=5)
    assert [m.target for m in plan.moves] == ["node-tainted"], "the only node with room"
    tolerant = dataclasses.replace(pod_, constraints=NodeConstraints(tolerations=(
        {"key": "DeletionCandidateOfClusterAutoscaler", "operator": "Exists"},)))
    plan = plan_moves({"cpu": 1000.0}, [tolerant], [tainted, plain], LoadConfig(), allowed=5)
    assert [m.target for m in plan.moves] == ["node-tainted"], "tolerated: the score alone decides (a tie: first)"


def test_a_target_the_pods_preferred_node_affinity_weighs_most_comes_first():
    """kube-scheduler's NodeAffinity score (weight 2) ranks nodes by the summed weights of the
    preferred terms they match, above the resource scores (1): the replacement goes where its Pod
    prefers, so that is where room is held. Soft taints (TaintToleration, 3) still come first."""
    spec = {"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 60, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}},
        {"weight": 30, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}}
    plain = candidate("big", "Burstable", 500, 1500)
    prefers = dataclasses.replace(plain, constraints=node_constraints(spec))
    cooler = dataclasses.replace(target("node-b", cpu_used=200.0), labels={"zone": "b", "disk": "ssd"})  # weighs 30
    warmer = dataclasses.replace(target("node-a", cpu_used=2000.0), labels={"zone": "a"})  # weighs 60
    assert [m.target for m in plan_moves({"cpu": 1000.0}, [prefers], [cooler, warmer], LoadConfig(),
                                         allowed=5).moves] == ["node-a"]
    assert [m.target for m in plan_moves({"cpu": 1000.0}, [plain], [cooler, warmer], LoadConfig(),
                                         allowed=5).moves] == ["node-b"], "no preference: the cooler node"
    lightest = {"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}}
    barely = dataclasses.replace(plain, constraints=node_constraints(lightest))
    assert [m.target for m in plan_moves({"cpu": 1000.0}, [barely], [cooler, warmer], LoadConfig(),
                                         allowed=5).moves] == ["node-a"], "normalized: weight 1 weighs as 100"
    soft = ({"key": "DeletionCandidateOfClusterAutoscaler", "value": "1764000000", "effect": "PreferNoSchedule"},)
    tainted = dataclasses.replace(warmer, taints=soft)
    assert [m.target for m in plan_moves({"cpu": 1000.0}, [prefers], [cooler, tainted], LoadConfig(),
                                         allowed=5).moves] == ["node-b"], "a soft taint outweighs the preference"


def test_a_target_the_pods_preferred_pod_affinity_weighs_most_comes_first():
    """kube-scheduler's InterPodAffinity score (weight 2) counts the Pod's preferred terms' weight
    for each Pod they select in a node's domain (anti-affinity against it): the replacement of an
    api Pod that prefers a cache Pod's host, or shuns a web Pod's, goes there or elsewhere, whatever
    the resource scores say. Its score and NodeAffinity's are each normalized before they are
    summed, so their raw weights do not compare."""
    hostname = "kubernetes.io/hostname"

    def api_pod(kind: str, weight: int, app: str, **node_affinity: Any) -> Candidate:
        affinity: dict[str, Any] = {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": weight, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": app}},
                                                   "topologyKey": hostname}}]}, **node_affinity}
        found = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"), affinity=affinity)
        return candidate_of(found, pod_demand(found, KEYS), {"cpu": 1000.0, "memory": float(GI)})

    cooler = dataclasses.replace(target("node-a", cpu_used=200.0), labels={hostname: "node-a", "disk": "ssd"})
    warmer = dataclasses.replace(target("node-b", cpu_used=2000.0), labels={hostname: "node-b"})
    web, cache = pod("web-5d8f9-abcde"), pod("cache-7d9f4-klmno", owner=("ReplicaSet", "cache-7d9f4"))
    web["spec"]["nodeName"], cache["spec"]["nodeName"] = "node-a", "node-b"
    neighbours = Neighbours({n: {hostname: n} for n in ("node-hot", "node-a", "node-b")},
                            [placed_pod(web), placed_pod(cache)])

    def chosen(moving: Candidate, with_neighbours: bool = True) -> list[str]:
        return [m.target for m in plan_moves({"cpu": 500.0}, [moving], [cooler, warmer], LoadConfig(), allowed=1,
                                             neighbours=neighbours if with_neighbours else None).moves]

    assert chosen(api_pod("podAffinity", 50, "cache")) == ["node-b"], "beside the cache Pod"
    assert chosen(api_pod("podAntiAffinity", 50, "web")) == ["node-b"], "away from the web Pod"
    assert chosen(api_pod("podAffinity", 50, "web")) == ["node-a"]
    assert chosen(api_pod("podAffinity", 50, "cache"), with_neighbours=False) == ["node-a"], "Pods unknown"
    ssd = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}
    # Node affinity's 10 and pod affinity's 50 each count in full: a tie, which the resources break.
    assert chosen(api_pod("podAffinity", 50, "cache", **ssd)) == ["node-a"]


def test_a_running_pods_own_affinity_terms_that_select_the_moved_pod_weigh_its_nodes():
    """InterPodAffinity also scores a node by the running Pods' terms that select the incoming Pod:
    their preferred affinity (+weight) and anti-affinity (-weight), and their required affinity at
    hardPodAffinityWeight 1, for the nodes in their domain. An api Pod stating no affinity of its
    own goes where a cache Pod wants it, or away from a web Pod that shuns it."""
    hostname = "kubernetes.io/hostname"
    api_term = {"labelSelector": {"matchLabels": {"app": "api"}}, "topologyKey": hostname}
    moving_pod = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"))
    moving = candidate_of(moving_pod, pod_demand(moving_pod, KEYS), {"cpu": 1000.0, "memory": float(GI)})
    cooler = dataclasses.replace(target("node-a", cpu_used=200.0), labels={hostname: "node-a"})
    warmer = dataclasses.replace(target("node-b", cpu_used=2000.0), labels={hostname: "node-b"})

    def chosen(node: str, affinity: dict[str, Any], *more: tuple[str, dict[str, Any]]) -> list[str]:
        others = []
        for number, (on, terms) in enumerate(((node, affinity), *more)):
            other = pod(f"cache-7d9f4-klmn{number}", owner=("ReplicaSet", "cache-7d9f4"), affinity=terms)
            other["spec"]["nodeName"] = on
            others.append(placed_pod(other))
        neighbours = Neighbours({n: {hostname: n} for n in ("node-hot", "node-a", "node-b")},
                                [placed_pod(moving_pod), *others])
        return [m.target for m in plan_moves({"cpu": 500.0}, [moving], [cooler, warmer], LoadConfig(), allowed=1,
                                             neighbours=neighbours).moves]

    wants = preferring_hosts_of("api", 30)
    shuns = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 30, "podAffinityTerm": api_term}]}}
    needs = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [api_term]}}
    assert chosen("node-b", wants) == ["node-b"], "the cache Pod prefers api Pods beside it"
    assert chosen("node-a", shuns) == ["node-b"], "the Pod on the cooler node shuns api Pods"
    assert chosen("node-b", needs) == ["node-b"], "a required term counts at hardPodAffinityWeight"
    # At 1 exactly: the same as a preferred term of weight 1 beside the cooler node, which the
    # resources then break; weight 2 there outweighs it.
    assert chosen("node-b", needs, ("node-a", preferring_hosts_of("api", 1))) == ["node-a"]
    assert chosen("node-a", preferring_hosts_of("api", 2), ("node-b", needs)) == ["node-a"]
    assert chosen("node-a", preferring_hosts_of("api", 1), ("node-b", needs),
                  ("node-b", preferring_hosts_of("api", 1))) == ["node-b"]
    assert chosen("node-b", {}) == ["node-a"], "no term: the cooler node"


def test_running_pods_terms_that_select_the_moved_pod_add_up_in_their_domain():
    """InterPodAffinity adds the weight of every running Pod's term that selects the incoming Pod:
    two cache Pods on one node wanting api Pods beside them (30 each) outweigh one web Pod's 50
    on a node as cool."""
    hostname = "kubernetes.io/hostname"
    moving_pod = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"))
    moving = candidate_of(moving_pod, pod_demand(moving_pod, KEYS), {"cpu": 1000.0, "memory": float(GI)})
    targets = [dataclasses.replace(target(n, cpu_used=1000.0), labels={hostname: n}) for n in ("node-a", "node-b")]

    def chosen(caches_on_b: int) -> list[str]:
        web = pod("web-5d8f9-abcde", affinity=preferring_hosts_of("api", 50))
        web["spec"]["nodeName"] = "node-a"
        caches = [pod(f"cache-7d9f4-{n}", owner=("ReplicaSet", "cache-7d9f4"), affinity=preferring_hosts_of("api", 30))
                  for n in ("klmno", "pqrst")[:caches_on_b]]
        for cache in caches:
            cache["spec"]["nodeName"] = "node-b"
        neighbours = Neighbours({n: {hostname: n} for n in ("node-hot", "node-a", "node-b")},
                                [placed_pod(moving_pod), placed_pod(web), *map(placed_pod, caches)])
        return [m.target for m in plan_moves({"cpu": 500.0}, [moving], targets, LoadConfig(), allowed=1,
                                             neighbours=neighbours).moves]

    assert chosen(2) == ["node-b"], "30 + 30 beside the two cache Pods, against 50 beside the web Pod"
    assert chosen(1) == ["node-a"], "one cache Pod's 30 against the web Pod's 50"


def test_a_replacement_placed_earlier_in_the_plan_draws_the_pods_its_terms_select():
    """Each replacement is a neighbour of the moves after it, its own affinity terms included: a
    cache Pod that wants api Pods beside it moves first (to the one node its nodeSelector allows),
    and the api Pod moving after it follows it there rather than to the cooler node."""
    hostname = "kubernetes.io/hostname"
    api_pod = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"))
    api = candidate_of(api_pod, pod_demand(api_pod, KEYS), {"cpu": 900.0, "memory": float(GI)})
    labels = {"node-hot": {hostname: "node-hot"}, "node-a": {hostname: "node-a"},
              "node-b": {hostname: "node-b", "disk": "ssd"}}
    cooler = dataclasses.replace(target("node-a", cpu_used=200.0), labels=labels["node-a"])
    warmer = dataclasses.replace(target("node-b", cpu_used=2000.0), labels=labels["node-b"])

    def plan(affinity: dict[str, Any]) -> list[tuple[str, str]]:
        cache_pod = pod("cache-7d9f4-klmno", owner=("ReplicaSet", "cache-7d9f4"), affinity=affinity,
                        nodeSelector={"disk": "ssd"})
        cache = candidate_of(cache_pod, pod_demand(cache_pod, KEYS), {"cpu": 1500.0, "memory": float(GI)})
        neighbours = Neighbours(labels, [placed_pod(api_pod), placed_pod(cache_pod)])
        moves = plan_moves({"cpu": 2000.0}, [api, cache], [cooler, warmer], LoadConfig(), allowed=2,
                           neighbours=neighbours).moves
        return [(m.pod.name, m.target) for m in moves]

    cache_first = ("shop/cache-7d9f4-klmno", "node-b")
    assert plan(preferring_hosts_of("api", 30)) == [cache_first, ("shop/api-6f7c8-fghij", "node-b")]
    assert plan({}) == [cache_first, ("shop/api-6f7c8-fghij", "node-a")], "no term: the cooler node"


def test_a_target_where_the_pods_schedule_anyway_spread_counts_fewer_comes_first():
    """kube-scheduler's PodTopologySpread score (weight 2) ranks nodes by how few Pods a
    ``ScheduleAnyway`` constraint counts in their domain, and a node without its key last; a Pod
    stating no constraint is spread by default from its controller's other Pods."""
    zone = "topology.kubernetes.io/zone"
    spread = {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": zone, "whenUnsatisfiable": "ScheduleAnyway",
                                             "labelSelector": {"matchLabels": {"app": "api"}}}]}
    moving_pod = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"), **spread)
    moving = candidate_of(moving_pod, pod_demand(moving_pod, KEYS), {"cpu": 1000.0, "memory": float(GI)})
    others = [pod(f"api-6f7c8-{n}", owner=("ReplicaSet", "api-6f7c8")) for n in ("aaaaa", "bbbbb")]
    for other in others:
        other["spec"]["nodeName"] = "node-a"
    zones = {"node-hot": {zone: "a"}, "node-a": {zone: "a"}, "node-b": {zone: "b"}, "node-c": {}}
    neighbours = Neighbours(zones, [placed_pod(moving_pod), *map(placed_pod, others)])
    cooler = dataclasses.replace(target("node-a", cpu_used=200.0), labels=zones["node-a"])
    warmer = dataclasses.replace(target("node-b", cpu_used=2000.0), labels=zones["node-b"])
    keyless = dataclasses.replace(target("node-c", cpu_used=100.0), labels={})

    def chosen(*targets: Target) -> list[str]:
        return [m.target for m in plan_moves({"cpu": 500.0}, [moving], list(targets), LoadConfig(), allowed=1,
                                             neighbours=neighbours).moves]

    assert chosen(cooler, warmer) == ["node-b"], "zone a holds two api Pods besides the one moving, zone b none"
    assert chosen(keyless, warmer) == ["node-b"], "a node without the zone label ranks last"
    assert chosen(keyless, cooler) == ["node-a"], "even behind the only zone counted, however crowded"

    def stating_none(owner: tuple[str, str]) -> list[str]:
        plain = dataclasses.replace(moving, constraints=node_constraints(pod("api-6f7c8-fghij", owner=owner)))
        return [m.target for m in plan_moves({"cpu": 500.0}, [plain], [cooler, warmer], LoadConfig(), allowed=1,
                                             neighbours=neighbours).moves]

    # kube-scheduler spreads a ReplicaSet's or StatefulSet's Pods by default, over hosts and zones.
    assert stating_none(("ReplicaSet", "api-6f7c8")) == ["node-b"], "its ReplicaSet's other Pods are in zone a"
    assert stating_none(("ReplicaSet", "api-0a1b2")) == ["node-a"], "no sibling anywhere: the cooler"
    assert stating_none(("Job", "api-6f7c8")) == ["node-a"], "a Job's Pods are not spread by default"


def test_a_larger_max_skew_lets_the_other_preferences_outweigh_the_spread():
    """PodTopologySpread adds max skew - 1 to each domain's count before it normalizes, so the
    larger a constraint's skew, the less one more Pod there weighs. With a sibling on the node its
    node affinity prefers: under maxSkew 1 the two preferences cancel and the cooler node wins;
    under maxSkew 5 the preferred node keeps most of its spread score and wins."""
    hostname = "kubernetes.io/hostname"
    ssd = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}
    sibling = pod("api-6f7c8-aaaaa", owner=("ReplicaSet", "api-6f7c8"))
    sibling["spec"]["nodeName"] = "node-a"
    labels = {"node-hot": {hostname: "node-hot"}, "node-a": {hostname: "node-a", "disk": "ssd"},
              "node-b": {hostname: "node-b"}}
    preferred = dataclasses.replace(target("node-a", cpu_used=4000.0), labels=labels["node-a"])
    cooler = dataclasses.replace(target("node-b", cpu_used=200.0), labels=labels["node-b"])

    def chosen(max_skew: int) -> list[str]:
        moving_pod = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"), affinity=ssd, topologySpreadConstraints=[
            {"maxSkew": max_skew, "topologyKey": hostname, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"app": "api"}}}])
        moving = candidate_of(moving_pod, pod_demand(moving_pod, KEYS), {"cpu": 1000.0, "memory": float(GI)})
        neighbours = Neighbours(labels, [placed_pod(moving_pod), placed_pod(sibling)])
        return [m.target for m in plan_moves({"cpu": 500.0}, [moving], [preferred, cooler], LoadConfig(), allowed=1,
                                             neighbours=neighbours).moves]

    assert chosen(1) == ["node-b"], "spread and node affinity cancel out: the cooler node"
    assert chosen(5) == ["node-a"], "a skew of 5 barely minds one sibling: the preferred node"


def test_a_hot_nodes_pods_stay_where_there_is_no_other_node():
    plan = plan_moves({"cpu": 1000.0}, [candidate("big", "Burstable", 500, 1500)], [], LoadConfig(), allowed=5)
    assert [(kept.name, why) for kept, why in plan.kept] == [("shop/big", "no node can take it (no other node)")]
    assert plan.moves == [] and plan.uncovered == {"cpu": 1000.0}


def test_a_target_without_fresh_metrics_is_judged_by_requests_alone_as_the_extender_judges_it():
    """The extender never filters a node by a load it does not know (a metrics outage must not
    block scheduling), so such a node takes the replacement if its requests fit."""
    unmeasured = dataclasses.replace(target(cpu_free=1000), heat=None)
    assert target_for(candidate("big", "Burstable", 500, 1500), [unmeasured], LoadConfig()) == (0, "")
    assert target_for(candidate("big", "Burstable", 1500, 1500), [unmeasured], LoadConfig())[0] is None


def test_a_move_takes_its_requests_on_its_target_and_no_more():
    web = candidate("web", "Burstable", 500, 900)
    cpu_only = dataclasses.replace(web, demand=dataclasses.replace(web.demand, requests={"cpu": 500}))
    assert target().taking(web).usage.shared == {"cpu": 500, "memory": GI}
    assert target().taking(cpu_only).usage.shared == {"cpu": 500, "memory": 0}, "no memory request: none taken"


def test_a_move_takes_a_volume_slot_on_its_target_for_the_next_move():
    """Two Pods, each with a volume the same CSI driver attaches, and room for one more volume on
    the only target: the first goes, the second stays; a volume already attached there takes no
    slot."""
    ebs = "ebs.csi.aws.com"

    def with_volume(name: str, volume: str) -> Candidate:
        found = candidate(name, "Burstable", 500, 1000)
        return dataclasses.replace(found, constraints=NodeConstraints(csi_volumes=(CsiVolume(ebs, volume),)))

    room = dataclasses.replace(target(), attached={ebs: frozenset({"pv-0"})}, volume_limits={ebs: 2})
    plan = plan_moves({"cpu": 2000.0}, [with_volume("a", "pv-a"), with_volume("b", "pv-b")], [room], LoadConfig(),
                      allowed=5)
    assert [m.pod.name for m in plan.moves] == ["shop/a"]
    assert plan.kept[0][1] == "no node can take it (ebs.csi.aws.com: 2 volumes attached to node-cool, its limit 2)"
    assert room.attached == {ebs: frozenset({"pv-0"})}, "the plan's own copy took the slot, not the target given"
    plan = plan_moves({"cpu": 2000.0}, [with_volume("a", "pv-a"), with_volume("b", "pv-0")], [room], LoadConfig(),
                      allowed=5)
    assert [m.pod.name for m in plan.moves] == ["shop/a", "shop/b"]
    unread = dataclasses.replace(target(), attached=None)  # the attachments not read this pass
    assert unread.taking(with_volume("a", "pv-a")).attached is None


@pytest.mark.parametrize(("constraints", "room", "refused"), [
    (NodeConstraints(host_ports=(("0.0.0.0", "TCP", 8080),)), {"ports": frozenset()},
     "host port 8080/TCP is taken on node-cool"),
    (NodeConstraints(resources={"nvidia.com/gpu": 1}), {"free": {"nvidia.com/gpu": 1, "pods": 110}},
     "nvidia.com/gpu: 1 requested, 0 free on node-cool"),
])
def test_a_move_takes_its_host_port_and_extended_resources_on_its_target_for_the_next_move(
        constraints, room, refused):
    """Two Pods of different workloads that each bind host port 8080, or each want the one GPU
    the only target has left: the first goes there, the second stays, as kube-scheduler would
    leave its replacement pending."""
    pods = [dataclasses.replace(candidate(name, "Burstable", 500, 1000), constraints=constraints) for name in "ab"]
    plan = plan_moves({"cpu": 2000.0}, pods, [dataclasses.replace(target(), **room)], LoadConfig(), allowed=5)
    assert [m.pod.name for m in plan.moves] == ["shop/a"]
    assert plan.kept == [(pods[1], f"no node can take it ({refused})")]


def test_a_moves_usage_counts_in_its_targets_load_for_the_next_move():
    """The target runs 3 of 8 real cores; each moved Pod uses 1.2: after one, 4.2 (53%); a second
    would take it to 5.4 (68%), above the 65% scheduling watermark, so it stays."""
    pods = [candidate(name, "Burstable", 500, 1200) for name in "ab"]
    plan = plan_moves({"cpu": 2400.0}, pods, [target(cpu_used=3000)], LoadConfig(), allowed=5)
    assert [m.pod.name for m in plan.moves] == ["shop/a"]
    assert "above the scheduling watermark 65%" in plan.kept[0][1] and plan.uncovered == {"cpu": 1200.0}


def test_moves_never_exceed_the_limit_and_do_not_pile_onto_one_target():
    pods = [candidate(f"p{i}", "Burstable", 500, 1000) for i in range(4)]
    plan = plan_moves({"cpu": 3500.0}, pods, [target(cpu_free=1000)], LoadConfig(), allowed=3)
    assert len(plan.moves) == 2, "the target has room for two 500m requests"
    limited = plan_moves({"cpu": 3500.0}, pods, [target()], LoadConfig(), allowed=1)
    assert len(limited.moves) == 1 and "over the limit of 1" in limited.kept[-1][1]
    assert limited.uncovered["cpu"] > 0


def test_moves_of_one_plan_take_one_pod_per_workload_and_keep_to_the_namespace_limit():
    pods = [candidate("web-a", "Burstable", 500, 1000, workload="shop/RS/web"),
            candidate("web-b", "Burstable", 500, 900, workload="shop/RS/web"), candidate("api", "Burstable", 500, 800)]
    plan = plan_moves({"cpu": 2500.0}, pods, [target()], LoadConfig(), allowed=3)
    assert [m.pod.name for m in plan.moves] == ["shop/web-a", "shop/api"]
    assert ("shop/web-b", "another Pod of shop/RS/web was chosen before it (one per workload)") in \
        [(c.name, why) for c, why in plan.kept]
    limited = plan_moves({"cpu": 2500.0}, pods, [target()], LoadConfig(), allowed=3, namespace_room={"shop": 1})
    assert [m.pod.name for m in limited.moves] == ["shop/web-a"]
    assert ("shop/api", "over the evictions left in shop this pass (1)") in [(c.name, why) for c, why in limited.kept]


def test_a_pod_dropped_again_holds_no_other_pod_of_its_workload_back():
    """web-a is chosen first and holds web-b back (one per workload); the Guaranteed db then
    covers the excess alone and web-a is dropped. Evicting db while the Burstable web-b would
    do is the wrong order: the plan is made again without web-a, and web-b goes."""
    pods = [candidate("web-a", "BestEffort", 0, 1000, workload="shop/RS/web"),
            candidate("web-b", "Burstable", 500, 2000, workload="shop/RS/web"),
            candidate("db", "Guaranteed", 2000, 2000)]
    plan = plan_moves({"cpu": 1500.0}, pods, [target()], LoadConfig(), allowed=3)
    assert [m.pod.name for m in plan.moves] == ["shop/web-b"] and plan.uncovered == {}
    assert not any("chosen before it" in why for _, why in plan.kept)


@pytest.mark.parametrize("guarded", ["api", "web"])
def test_a_replacement_chosen_earlier_in_the_plan_keeps_the_next_pod_off_its_node(guarded):
    """The api Pod may not share a host with a web Pod, by api's anti-affinity or by web's: once
    web's replacement is headed for node-a, api goes to node-b, not beside it."""
    hostname = "kubernetes.io/hostname"
    web = pod("web-5d8f9-abcde", **({"affinity": apart_from_hosts_of("api")} if guarded == "web" else {}))
    api_pod = pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8"),
                  **({"affinity": apart_from_hosts_of("web")} if guarded == "api" else {}))
    moving = [candidate_of(web, pod_demand(web, KEYS), {"cpu": 1500.0, "memory": float(GI)}),
              candidate_of(api_pod, pod_demand(api_pod, KEYS), {"cpu": 1000.0, "memory": float(GI)})]
    targets = [dataclasses.replace(target(name), labels={hostname: name}) for name in ("node-a", "node-b")]
    neighbours = Neighbours({n: {hostname: n} for n in ("node-hot", "node-a", "node-b")},
                            [placed_pod(web), placed_pod(api_pod)])
    plan = plan_moves({"cpu": 2000.0}, moving, targets, LoadConfig(), allowed=2, neighbours=neighbours)
    assert [(m.pod.name, m.target) for m in plan.moves] == [("shop/web-5d8f9-abcde", "node-a"),
                                                            ("shop/api-6f7c8-fghij", "node-b")]
    assert neighbours.pods == [placed_pod(web), placed_pod(api_pod)], "the plan tried its moves on a copy"


def test_room_taken_on_the_way_by_a_pod_dropped_again_goes_back_to_the_pods_that_move():
    """"small" is chosen first and takes room on the roomier node, then "large" alone turns out to
    cover the excess and "small" is dropped: "large" goes where "small" had stood in its way."""
    pods = [candidate("small", "Burstable", 200, 1000), candidate("large", "Burstable", 800, 1500)]
    roomy, busy = target("node-roomy", cpu_free=900), target("node-busy", cpu_free=8000, cpu_used=3000)
    plan = plan_moves({"cpu": 1400.0}, pods, [roomy, busy], LoadConfig(), allowed=2)
    assert [(m.pod.name, m.target) for m in plan.moves] == [("shop/large", "node-roomy")]


def test_a_reservation_keeps_the_room_for_the_evicted_pods_replacement():
    held = {"shop/ReplicaSet/web-5d8f9": {"cpu": "6", "memory": "1Gi", "until": "2027-01-15T08:05:00Z"}}
    reservations = reservations_of({KEYS.reservations: json.dumps(held)}, KEYS)
    view = dataclasses.replace(target().view, reservations=reservations)
    usage = NodeUsage(shared={"cpu": 1000, "memory": 0})
    other = PodDemand("o", {"cpu": 2000, "memory": GI}, None, False, owner="shop/ReplicaSet/api-6f7")
    replacement = dataclasses.replace(other, owner="shop/ReplicaSet/web-5d8f9")
    assert "1 free" in (shortfall(view, usage, other, NOW) or ""), "7 free cores minus 6 held"
    assert shortfall(view, usage, replacement, NOW) is None
    assert placement_score(view, usage, replacement, None, LoadConfig(), now=NOW) == 10
    later = NOW + 10 * 3600
    assert shortfall(view, usage, other, later) is None, "an expired reservation holds nothing"
    assert reservations_of({KEYS.reservations: "not json"}, KEYS) == ()


# ---- the remediator end to end ------------------------------------------------------------------

SETTINGS = Settings(kubernetes="off", remediation=True, hot_observations=3)


def node(name: str, cpu: str = "4", labelled: bool = True) -> dict[str, Any]:
    """An opted-in node, or one without labels (the API server omits an empty map)."""
    return {"metadata": {"name": name, **({"labels": {KEYS.oversale_label: "enabled"}} if labelled else {})},
            "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                       "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def usage(api: FakeKubeAPI, node_cpu: str, pods: dict[str, str]) -> None:
    api.put("nodemetrics", {"metadata": {"name": "node-hot"}, "window": "30s",
                            "usage": {"cpu": node_cpu, "memory": "4Gi"}})
    api.put("nodemetrics", {"metadata": {"name": "node-cool"}, "window": "30s",
                            "usage": {"cpu": "500m", "memory": "2Gi"}})
    for name, cpu in pods.items():
        api.put("podmetrics", {"metadata": {"name": name, "namespace": "shop"}, "window": "30s",
                               "containers": [{"name": "app", "usage": {"cpu": cpu, "memory": "300Mi"}}]})


HOT = {"web-5d8f9-abcde": "2500m", "api-6f7c8-fghij": "600m", "agent-xyz12": "200m"}


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    fake = FakeKubeAPI().start()
    fake.put("nodes", node("node-hot"))
    fake.put("nodes", node("node-cool", "8", labelled=False))
    fake.put("pods", pod("web-5d8f9-abcde"))
    fake.put("pods", pod("api-6f7c8-fghij", owner=("ReplicaSet", "api-6f7c8")))
    fake.put("pods", pod("agent-xyz12", owner=("DaemonSet", "agent")))
    usage(fake, "3920m", HOT)   # 98% of 4 real cores: 120m above the 95% watermark
    yield fake
    fake.stop()


def remediator(api: FakeKubeAPI, settings: Settings = SETTINGS, clock: Callable[[], float] = time.time) -> Remediator:
    """A remediator over ``api``; ``clock`` is its time and the one the metrics' ages are read by."""
    api_client = client.ApiClient(client.Configuration(host=api.url))
    return Remediator(Cluster(api_client), MetricsAPI(api_client, clock=clock), settings, clock=clock)


def evictions(api: FakeKubeAPI) -> int:
    return sum(1 for r in api.requests if r.method == "POST" and r.path.endswith("/eviction"))


def described(api: FakeKubeAPI, obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events ``kubectl describe`` shows for ``obj``: it asks the API
    server for those whose involvedObject has the object's kind, namespace, name and UID."""
    metadata = obj["metadata"]
    selector = (f"involvedObject.name={metadata['name']},involvedObject.namespace={metadata.get('namespace', '')},"
                f"involvedObject.kind={obj['kind']},involvedObject.uid={metadata['uid']}")
    return [(e["type"], e["reason"], e["message"])
            for e in api.list_objects("events", None, {"fieldSelector": [selector]})["items"]]


def test_a_node_hot_for_k_observations_loses_the_pod_that_cools_it(api, caplog):
    web = {"kind": "Pod", **api.get("pods", "shop", "web-5d8f9-abcde")}
    remediator_ = remediator(api)
    hot_nodes = partial(remediator_.metrics.registry.get_sample_value, "oversale_remediation_hot_nodes")
    for _ in range(2):
        rows = remediator_.run_pass()
        assert evictions(api) == 0 and any("hot" in r.reason and r.object == "Node/node-hot" for r in rows)
        assert hot_nodes() == 0, "not hot for 3 observations yet"
    with caplog.at_level(logging.INFO, logger="reconcilers.remediation"):
        rows = remediator_.run_pass()
    assert evictions(api) == 1 and hot_nodes() == 1
    assert api.get("pods", "shop", "web-5d8f9-abcde") is None, "evicted: the Eviction API deleted it"
    assert api.get("pods", "shop", "api-6f7c8-fghij") is not None
    (moved,) = [r for r in rows if r.written]
    assert (moved.object, moved.resource, moved.current, moved.proposed) == (
        "Pod/shop/web-5d8f9-abcde", "*", "node-hot", "node-cool")
    assert moved.reason.startswith("evict from hot node-hot (cpu usage 98% of real capacity is above the runtime ")
    held = json.loads(api.get("nodes", "", "node-cool")["metadata"]["annotations"][KEYS.reservations])
    assert held["shop/ReplicaSet/web-5d8f9"]["cpu"] == "500m"
    assert described(api, web) == [("Normal", "EvictedFromHotNode", "evicted from hot node node-hot toward node-cool: "
                                    "Burstable, uses 2500m cpu, 120m above the watermark")]
    assert described(api, {"kind": "Node", **api.get("nodes", "", "node-hot")}) == [
        ("Normal", "HotNodeRemediated", "evicted shop/web-5d8f9-abcde toward node-cool (room reserved); "
                                        f"tainted {KEYS.hot_taint}:PreferNoSchedule for its cooldown")]
    assert remediator_.metrics.evictions.labels("hot-node")._value.get() == 1
    assert remediator_.metrics.registry.get_sample_value("oversale_remediation_reservations_total") == 1
    assert not [r.path for r in api.requests if "csinodes" in r.path or "volumeattachments" in r.path], \
        "no Pod has a CSI volume: no node's volume limits are read"
    assert ("Pod/shop/web-5d8f9-abcde: evicted from hot node node-hot toward node-cool: Burstable, uses 2500m cpu, "
            "120m above the watermark") in [r.getMessage() for r in caplog.records]
    # The node cools down for a while: no second eviction even if it stays hot.
    for _ in range(3):
        remediator_.run_pass()
    assert evictions(api) == 1
    # The ReplicaSet's replacement lands where the room was held: the hold is spent and goes.
    api.put("pods", {**pod("web-5d8f9-zzzzz"), "spec": {**pod()["spec"], "nodeName": "node-cool"}})
    remediator_.run_pass()
    assert KEYS.reservations not in (api.get("nodes", "", "node-cool")["metadata"].get("annotations") or {})


def test_remediate_evicts_under_the_lease_and_gives_it_back_and_its_dry_run_takes_none(api, tmp_path):
    """``python -m reconcilers remediate``: one observation makes node-hot hot. A dry run prints
    the move, evicts nothing and takes no Lease (another replica may be leading); the real pass
    evicts under the Lease and gives it back for the running replicas."""
    env = cli_env(api, tmp_path)

    def remediate(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reconcilers", "remediate", *flags], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    planned = remediate("--dry-run")
    assert planned.returncode == 0, planned.stderr
    (move,) = [line for line in planned.stdout.splitlines() if "Pod/shop/web-5d8f9-abcde" in line]
    assert "node-hot" in move and "node-cool" in move
    assert evictions(api) == 0 and api.get("leases", "oversale", "oversale-reconciler") is None
    done = remediate()
    assert done.returncode == 0, done.stderr
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    lease = api.get("leases", "oversale", "oversale-reconciler")
    assert lease is not None and not lease["spec"].get("holderIdentity"), "taken, then given back"


def test_a_node_hot_on_memory_loses_the_pod_whose_containers_together_use_most_of_it(api):
    # metrics-server lists a Pod's containers apart: web's two together use 1000Mi, the most on
    # node-hot, whose 15Gi used is 614.4Mi above the 90% memory watermark of its real 16Gi.
    api.put("nodemetrics", {"metadata": {"name": "node-hot"}, "window": "30s", "usage": {"cpu": "1", "memory": "15Gi"}})
    api.put("podmetrics", {"metadata": {"name": "web-5d8f9-abcde", "namespace": "shop"}, "window": "30s",
                           "containers": [{"name": "app", "usage": {"cpu": "100m", "memory": "600Mi"}},
                                          {"name": "proxy", "usage": {"cpu": "10m", "memory": "400Mi"}}]})
    api.put("podmetrics", {"metadata": {"name": "api-6f7c8-fghij", "namespace": "shop"}, "window": "30s",
                           "containers": [{"name": "app", "usage": {"cpu": "100m", "memory": "700Mi"}}]})
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    (moved,) = [r for r in rows if r.written]
    assert moved.object == "Pod/shop/web-5d8f9-abcde" and moved.proposed == "node-cool"
    assert moved.reason.endswith("(memory usage 94% of real capacity is above the runtime watermark 90%); "
                                 "Burstable, uses 1000Mi memory, 615Mi above the watermark")
    assert evictions(api) == 1


def test_a_malformed_reading_is_skipped_and_the_others_are_read_exactly(api):
    """One item metrics-server (or a proxy before it) garbles says nothing of the others; nor may
    it borrow their figures."""
    api.put("nodemetrics", {"metadata": {"name": "node-garbled"}, "usage": {"cpu": "lots", "memory": "1Gi"}})
    api.put("nodemetrics", {"metadata": {"name": "a-node-without-usage"}})
    api.put("podmetrics", {"metadata": {"name": "web-5d8f9-abcde", "namespace": "shop"},
                           "containers": [{"name": "app", "usage": {"cpu": "250m", "memory": "300Mi"}},
                                          {"name": "proxy", "usage": {"memory": "20Mi"}},
                                          {"name": "log", "usage": {"cpu": "5m", "memory": "a lot"}},
                                          {"name": "probe", "usage": {"cpu": "1m", "memory": "1Mi"}}]})
    reader = MetricsAPI(client.ApiClient(client.Configuration(host=api.url)))
    assert {m.name: (m.cpu, m.memory) for m in reader.nodes()} == {"node-hot": (3920, 4 * GI),
                                                                    "node-cool": (500, 2 * GI)}
    web = [(c.container, c.cpu, c.memory) for c in reader.containers() if c.pod == "web-5d8f9-abcde"]
    assert web == [("app", 250, 300 * 2**20), ("probe", 1, 2**20)]


def test_readings_are_timed_from_when_the_reader_first_saw_their_stamp(api):
    """A reading's age counts on the reader's clock from its first sight (``first_seen``): a node
    whose clock runs ahead does not keep an unrenewed reading fresh, for Pods as for nodes."""
    clock = [NOW]
    ahead = format_timestamp(NOW + 3600)
    api.put("nodemetrics", {**api.get("nodemetrics", "", "node-hot"), "timestamp": ahead})
    api.put("podmetrics", {**api.get("podmetrics", "shop", "web-5d8f9-abcde"), "timestamp": ahead})
    reader = MetricsAPI(client.ApiClient(client.Configuration(host=api.url)), clock=lambda: clock[0])

    def times() -> tuple[float | None, ...]:
        node = {m.name: m.at for m in reader.nodes()}
        pods = {c.pod: c.at for c in reader.containers()}
        return node["node-hot"], node["node-cool"], pods["web-5d8f9-abcde"], pods["api-6f7c8-fghij"]

    assert times() == (NOW, NOW, NOW, None), "no stamp: a node's reading is as of now, a Pod's of no time"
    clock[0] += 300
    assert times() == (NOW, NOW + 300, NOW, None), "not scraped again: 300 s old, whatever its stamp says"
    renewed = format_timestamp(NOW + 290)
    api.put("podmetrics", {**api.get("podmetrics", "shop", "web-5d8f9-abcde"), "timestamp": renewed})
    clock[0] += 10
    assert times()[2] == NOW + 310, "a new stamp: a new reading"
    # A Pod of the same name in another namespace, and another in the same one, each scraped
    # every poll: each Pod's reading keeps its own first sight.
    others = [("staging", "web-5d8f9-abcde"), ("shop", "worker-8c9d0-klmno")]
    for stamp in (NOW + 305, NOW + 315):
        for namespace, name in others:
            api.put("podmetrics", {"metadata": {"name": name, "namespace": namespace},
                                   "timestamp": format_timestamp(stamp),
                                   "containers": [{"name": "app", "usage": {"cpu": "1m", "memory": "1Mi"}}]})
        seen = {(c.namespace, c.pod): c.at for c in reader.containers()}
        clock[0] += 10
    assert seen[("shop", "web-5d8f9-abcde")] == NOW + 310, "its stamp has not changed: as old as it was"
    assert [seen[pod] for pod in others] == [NOW + 320] * 2, "scraped again: as of this poll"


def test_a_metrics_list_the_api_server_holds_gives_up_at_the_readers_timeout(api, tmp_path, monkeypatch):
    """metrics-server overloaded behind the aggregator: a poll gives up at its timeout rather than
    hold the remediator's or the extender's poller until the API server's own 60 s. The client
    the commands load (it does not send a timed-out GET again)."""
    reader = MetricsAPI(loaded_client(api, tmp_path, monkeypatch), timeout=0.5)
    api.held_lists["nodemetrics"] = held = threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(Exception, match="timed out"):
            reader.nodes()
        assert time.monotonic() - started < 2
        assert {m.name for m in reader.nodes()} == {"node-hot", "node-cool"}, "the next poll reads again"
    finally:
        held.set()


def test_the_hot_node_taint_keeps_other_taints_and_says_until_when():
    dedicated = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    tainted = with_hot_taint([dedicated], KEYS.hot_taint, NOW + 600)
    assert tainted == [dedicated, {"key": KEYS.hot_taint, "value": str(int(NOW) + 600), "effect": "PreferNoSchedule"}]
    assert with_hot_taint(tainted, KEYS.hot_taint, None) == [dedicated]
    assert not hot_taint_expired(tainted, KEYS.hot_taint, NOW + 599)
    assert hot_taint_expired(tainted, KEYS.hot_taint, NOW + 600)
    assert not hot_taint_expired([dedicated], KEYS.hot_taint, NOW + 600), "no taint of ours: nothing expires"
    assert hot_taint_expired([{"key": KEYS.hot_taint, "value": "soon"}], KEYS.hot_taint, NOW), "not a time: up"


@pytest.mark.parametrize("enabled", [True, False])
def test_a_node_evicted_from_is_tainted_prefer_no_schedule_for_its_cooldown(api, caplog, enabled):
    """The room held on the target steers only what the oversale profile places; a replacement
    default-scheduler places would otherwise often go straight back to the hot node."""
    dedicated = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    api.put("nodes", {**node("node-hot"), "spec": {"taints": [dedicated]}})
    clock = [time.time()]
    api_client = client.ApiClient(client.Configuration(host=api.url))
    settings = dataclasses.replace(SETTINGS, hot_observations=1, hot_node_taint=enabled)
    remediator_ = Remediator(Cluster(api_client), MetricsAPI(api_client), settings, clock=lambda: clock[0])
    caplog.set_level(logging.INFO, logger="reconcilers.remediation")
    tainting = partial(re.findall, r"Node/node-hot: hot-node taint .*")
    remediator_.run_pass()
    set_until = format_timestamp(clock[0] + settings.node_cooldown_seconds)
    assert evictions(api) == 1
    until = str(int(clock[0] + settings.node_cooldown_seconds))
    ours = {"key": KEYS.hot_taint, "value": until, "effect": "PreferNoSchedule"}
    assert api.get("nodes", "", "node-hot")["spec"]["taints"] == ([dedicated, ours] if enabled else [dedicated])
    (remediated,) = [e for e in api.list_objects("events", None, {})["items"] if e["reason"] == "HotNodeRemediated"]
    assert ("tainted" in remediated["message"]) is enabled
    clock[0] += settings.node_cooldown_seconds - 5
    remediator_.run_pass()
    assert len(api.get("nodes", "", "node-hot")["spec"]["taints"]) == (2 if enabled else 1), "still cooling down"
    clock[0] += 5
    remediator_.run_pass()
    assert api.get("nodes", "", "node-hot")["spec"]["taints"] == [dedicated], "its time is up: only ours goes"
    assert tainting(caplog.text) == ([f"Node/node-hot: hot-node taint set until {set_until}",
                                      "Node/node-hot: hot-node taint removed"] if enabled else [])


def taint_left_behind(api: FakeKubeAPI) -> tuple[dict[str, str], dict[str, str]]:
    """node-hot with a taint of its own and our hot-node taint whose time was up a minute ago."""
    dedicated = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    left = {"key": KEYS.hot_taint, "value": str(int(time.time()) - 60), "effect": "PreferNoSchedule"}
    api.put("nodes", {**node("node-hot"), "spec": {"taints": [dedicated, left]}})
    return dedicated, left


def test_a_taint_left_behind_goes_even_with_remediation_off_but_not_on_a_dry_run(api):
    dedicated, left = taint_left_behind(api)
    remediator_ = remediator(api)
    remediator_.run_pass(dry_run=True)  # `remediate --dry-run` changes nothing
    assert api.get("nodes", "", "node-hot")["spec"]["taints"] == [dedicated, left]
    remediator_.run_pass(dry_run=True, tidy=True)  # the running loop with OVERSALE_REMEDIATION off
    assert api.get("nodes", "", "node-hot")["spec"]["taints"] == [dedicated]
    assert evictions(api) == 0


def test_run_with_remediation_off_evicts_nothing_and_takes_a_taint_left_behind_away(api, tmp_path):
    """Remediation switched off after it tainted a node: ``python -m reconcilers run`` (off by
    default) sees node-hot hot, pass after pass, evicts nothing, and takes away our taint whose
    time is up."""
    dedicated, _ = taint_left_behind(api)
    port = free_port()
    process, log = start_run(api, tmp_path, "run", lease_duration="30", OVERSALE_RECONCILER_METRICS_PORT=str(port),
                             OVERSALE_REMEDIATION_INTERVAL="1s", OVERSALE_HOT_OBSERVATIONS="1")
    try:
        assert eventually(lambda: api.get("nodes", "", "node-hot")["spec"]["taints"] == [dedicated], timeout=30), \
            log.read_text()
        assert eventually(lambda: re.search(r"^oversale_remediation_hot_nodes 1\.0$", scraped(port), re.MULTILINE),
                          timeout=30), log.read_text()
        time.sleep(3)  # three passes more, each of which would move a Pod if it remediated
        assert "remediation off: observing only" in log.read_text() and evictions(api) == 0
    finally:
        stop_process(process)


def test_run_with_remediation_on_moves_a_pod_off_the_hot_oversold_node(api, tmp_path):
    """OVERSALE_REMEDIATION=true: the running loop evicts, as ``remediate`` does in one pass, and
    its log says that it remediates, not that it only observes."""
    port = free_port()
    process, log = start_run(api, tmp_path, "run", lease_duration="30", OVERSALE_REMEDIATION="true",
                             OVERSALE_REMEDIATION_INTERVAL="1s", OVERSALE_HOT_OBSERVATIONS="1",
                             OVERSALE_RECONCILER_METRICS_PORT=str(port))
    try:
        assert eventually(lambda: evictions(api) >= 1, timeout=30), log.read_text()
        assert "observing nodes every 1s (remediating hot oversold nodes)" in log.read_text()
        # Said by each observation too, every second here (and passes an hour apart).
        assert eventually(lambda: "pass done" in log.read_text(), timeout=30), log.read_text()
        passed = time.time()
        observed = "oversale_remediation_last_observation_timestamp_seconds"
        assert eventually(lambda: exposed_value(scraped(port), observed) > passed, timeout=30), log.read_text()
        assert "oversale_reconciler_leader 1.0" in scraped(port)
    finally:
        stop_process(process)


def follower_then_holder(api: FakeKubeAPI) -> list[Remediator]:
    """Two replicas over ``api``: the first does not hold the Lease, the second does."""
    api_client = client.ApiClient(client.Configuration(host=api.url))
    holder = LeaseElector(api_client, "oversale", "oversale-reconciler", "a", 15)
    follower = LeaseElector(api_client, "oversale", "oversale-reconciler", "b", 15)
    assert holder.try_acquire_or_renew() and not follower.try_acquire_or_renew()
    return [Remediator(Cluster(api_client), MetricsAPI(api_client), SETTINGS, leader=elector)
            for elector in (follower, holder)]


def test_a_taint_left_behind_that_a_policy_keeps_is_said_and_stays(api, caplog):
    dedicated, left = taint_left_behind(api)
    api.validating["nodes"] = lambda review: {"allowed": False,
                                              "status": {"code": 403, "message": "nodes are not tainted here"}}
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        remediator(api).run_pass()
    assert api.get("nodes", "", "node-hot")["spec"]["taints"] == [dedicated, left]
    assert [m for m in caplog.messages if "taint" in m] == [
        "Node/node-hot: hot-node taint not removed (403 admission webhook denied the request: nodes are not tainted "
        "here)"]


def test_only_the_replica_holding_the_lease_tidies_a_taint_left_behind(api):
    """Every replica runs the loop; only the one holding the Lease writes to the nodes."""
    dedicated, left = taint_left_behind(api)
    for replica, taints in zip(follower_then_holder(api), ([dedicated, left], [dedicated]), strict=True):
        replica.run_pass(dry_run=True, tidy=True)
        assert api.get("nodes", "", "node-hot")["spec"]["taints"] == taints
    assert evictions(api) == 0


def spend_a_hold_on(api: FakeKubeAPI, node_name: str) -> None:
    """Give ``node_name`` a hold for a replacement whose time was up long ago."""
    held = api.get("nodes", "", node_name)
    ended = {"cpu": "500m", "memory": "512Mi", "until": LONG_AGO}
    held["metadata"]["annotations"] = {KEYS.reservations: json.dumps({"shop/ReplicaSet/gone-7f8e9": ended})}
    api.put("nodes", held)


def test_only_the_replica_holding_the_lease_drops_a_spent_hold(api):
    spend_a_hold_on(api, "node-hot")  # listed after node-cool, which holds nothing: each node's holds are read
    for replica, kept in zip(follower_then_holder(api), (True, False), strict=True):
        replica.run_pass()
        annotations = api.get("nodes", "", "node-hot")["metadata"].get("annotations") or {}
        assert (KEYS.reservations in annotations) is kept
    assert evictions(api) == 0, "node-hot has been hot for one pass of each replica"


def test_a_node_that_cools_down_before_k_observations_is_left_alone(api):
    remediator_ = remediator(api)
    remediator_.run_pass()
    remediator_.run_pass()
    usage(api, "2000m", HOT)
    remediator_.run_pass()
    usage(api, "3920m", HOT)
    remediator_.run_pass()
    remediator_.run_pass()
    assert evictions(api) == 0


def test_a_node_not_opted_in_is_left_alone_unless_every_node_is_remediated(api):
    api.put("nodes", node("node-hot", labelled=False))
    once = dataclasses.replace(SETTINGS, hot_observations=1)
    rows = remediator(api, once).run_pass()
    assert evictions(api) == 0 and not [r for r in rows if r.current == "node-hot" or r.object == "Node/node-hot"]
    remediator(api, dataclasses.replace(once, remediate_all_nodes=True)).run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None


def test_a_dry_run_leaves_a_spent_hold_for_the_running_loop_to_drop(api):
    spend_a_hold_on(api, "node-cool")
    remediator_ = remediator(api)
    remediator_.run_pass(dry_run=True)
    held = api.get("nodes", "", "node-cool")["metadata"]["annotations"]
    assert KEYS.reservations in held, "`remediate --dry-run` writes nothing"
    remediator_.run_pass()
    assert KEYS.reservations not in (api.get("nodes", "", "node-cool")["metadata"].get("annotations") or {})


def test_a_pdb_refusal_is_retried_later_and_the_pod_is_never_deleted_around_it(api, caplog):
    budget = {"metadata": {"name": "web", "namespace": "shop"},
              "spec": {"selector": {"matchLabels": {"app": "web"}}}, "status": {"disruptionsAllowed": 0}}
    api.put("poddisruptionbudgets", budget)
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
    with caplog.at_level(logging.INFO, logger="reconcilers.remediation"):
        for _ in range(3):
            remediator_.run_pass()
    assert [r.getMessage() for r in caplog.records if "eviction" in r.getMessage()] == 3 * [
        "Pod/shop/web-5d8f9-abcde: eviction refused for now (PodDisruptionBudget); retried next pass"]
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None, "protected by its budget"
    assert evictions(api) == 3 and not any(r.method == "DELETE" for r in api.requests)
    assert remediator_.metrics.evictions.labels("refused-by-pdb")._value.get() == 3
    assert KEYS.reservations not in (api.get("nodes", "", "node-cool")["metadata"].get("annotations") or {}), \
        "the reservation is released"
    budget["status"]["disruptionsAllowed"] = 1
    api.put("poddisruptionbudgets", budget)
    remediator_.run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is None


def test_an_eviction_its_budget_refuses_leaves_the_pass_and_namespace_limits_to_the_next_hot_node(api):
    api.put("poddisruptionbudgets", {"metadata": {"name": "web", "namespace": "shop"},
                                     "spec": {"selector": {"matchLabels": {"app": "web"}}},
                                     "status": {"disruptionsAllowed": 0}})
    a_second_hot_node(api, "batch-1a2b3-xyzab", ("ReplicaSet", "batch-1a2b3"))
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1, evictions_per_pass=1,
                                               evictions_per_namespace=1)).run_pass()
    assert [(r.object, r.written) for r in rows if r.proposed] == [
        ("Pod/shop/web-5d8f9-abcde", False), ("Pod/shop/batch-1a2b3-xyzab", True)]
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None, "protected by its budget"
    assert api.get("pods", "shop", "batch-1a2b3-xyzab") is None


def test_a_pod_marked_safe_to_evict_false_stays_and_the_next_candidate_moves(api):
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["metadata"]["annotations"] = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    api.put("pods", web)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None, "its team said: not to be evicted"
    # The table `remediate --dry-run` prints says why each of the hot node's Pods stays.
    assert {(r.object, r.reason) for r in rows if r.reason.startswith("kept: ")} == {
        ("Pod/shop/web-5d8f9-abcde", "kept: cluster-autoscaler.kubernetes.io/safe-to-evict: 'false' "
                                     f"({KEYS.evictable}: y overrides it)"),
        ("Pod/shop/agent-xyz12", "kept: DaemonSet Pod (it would come back on the same node)")}
    assert api.get("pods", "shop", "api-6f7c8-fghij") is None, "600m cover the 120m over the watermark"
    assert evictions(api) == 1
    (moved,) = [r for r in rows if r.written]
    assert moved.object == "Pod/shop/api-6f7c8-fghij"


def test_a_pod_is_not_evicted_toward_a_node_without_the_gpus_or_pod_slots_it_takes(api):
    # kube-scheduler's NodeResourcesFit holds the replacement to every resource it requests: a
    # GPU Pod sent to node-cool, which has none, would wait Pending.
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    api.put("pods", web)
    web_stays_and_api_moves(api, "nvidia.com/gpu: 1 requested, 0 free on node-cool")

    # node-cool with the GPU, but every Pod slot taken: no move at all (node-hot's cooldown after
    # the eviction above ended).
    settings = dataclasses.replace(SETTINGS, hot_observations=1)
    end_cooldowns(api, "node-hot")
    cool = api.get("nodes", "", "node-cool")
    cool["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    cool["status"]["allocatable"]["pods"] = "2"
    api.put("nodes", cool)
    for name in ("batch-7c9d-xyzab", "batch-7c9d-stuvw"):  # both slots: each Pod takes one
        other = pod(name, owner=("ReplicaSet", "batch-7c9d"))
        other["spec"]["nodeName"] = "node-cool"
        api.put("pods", other)
    rows = remediator(api, settings).run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None
    assert ("Pod/shop/web-5d8f9-abcde", "not moved: no node can take it (pods: 1 requested, 0 free on node-cool)") \
        in {(r.object, r.reason) for r in rows}
    cool["status"]["allocatable"]["pods"] = "110"
    api.put("nodes", cool)
    rows = remediator(api, settings).run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is None, "room for it now: it moves"


@pytest.mark.parametrize(("gpus", "moves"), [("3", True), ("2", False)])
def test_the_gpus_a_targets_pods_hold_are_summed_to_the_last_one(api, gpus, moves):
    """node-cool's Pods hold 2 GPUs between them: with 3 it has one left for web's, with 2 none."""
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    api.put("pods", web)
    api.delete("pods", "shop", "api-6f7c8-fghij")
    cool = api.get("nodes", "", "node-cool")
    cool["status"]["allocatable"]["nvidia.com/gpu"] = gpus
    api.put("nodes", cool)
    for name in ("train-7c9d-xyzab", "train-7c9d-stuvw"):
        other = pod(name, owner=("ReplicaSet", "train-7c9d"))
        other["spec"]["nodeName"] = "node-cool"
        other["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
        api.put("pods", other)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert (api.get("pods", "shop", "web-5d8f9-abcde") is None) is moves
    if not moves:
        assert ("Pod/shop/web-5d8f9-abcde", "not moved: no node can take it (nvidia.com/gpu: 1 requested, 0 free "
                "on node-cool)") in {(r.object, r.reason) for r in rows}


@pytest.mark.parametrize(("age", "judged"), [(180, True), (181, False)])
def test_a_reading_counts_up_to_the_metrics_age_limit_and_not_a_second_longer(api, age, judged):
    api.put("nodemetrics", {**api.get("nodemetrics", "", "node-hot"), "timestamp": format_timestamp(NOW - age)})
    settings = dataclasses.replace(SETTINGS, hot_observations=1)
    assert settings.metrics_max_age_seconds == 180
    remediator_ = remediator(api, settings, clock=lambda: NOW)
    remediator_.run_pass()
    assert evictions(api) == (1 if judged else 0)
    assert (remediator_.metrics.hot_nodes._value.get() == 1) is judged


def test_a_target_hot_within_the_hour_is_passed_over_until_that_hour_is_over(api):
    """A target must be under its scheduling watermarks as the extender reads them: the 5-minute
    average (65%) and the 1-hour maximum (85%) of the samples the remediator kept from its passes.
    node-cool ran 7.5 of its 8 cores: 59 min 59 s later, at 500m, it is still no target (a
    replacement would land on a node whose load just peaked); once that reading is an hour old,
    web moves there."""
    clock = [NOW]
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1), lambda: clock[0])

    def cool_node_at(cpu: str) -> dict[str, str]:
        api.put("nodemetrics", {"metadata": {"name": "node-cool"}, "window": "30s",
                                "timestamp": format_timestamp(clock[0]), "usage": {"cpu": cpu, "memory": "2Gi"}})
        api.put("nodemetrics", {"metadata": {"name": "node-hot"}, "window": "30s",
                                "timestamp": format_timestamp(clock[0]), "usage": {"cpu": "3920m", "memory": "4Gi"}})
        return {r.object: r.reason for r in remediator_.run_pass()}

    assert cool_node_at("7500m")["Pod/shop/web-5d8f9-abcde"].startswith("not moved: no node can take it (cpu usage ")
    clock[0] += 3599
    assert "(1-hour maximum" in cool_node_at("500m")["Pod/shop/web-5d8f9-abcde"], "7.5 cores 59 min 59 s ago"
    assert evictions(api) == 0
    clock[0] += 1
    cool_node_at("500m")
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    # Nor is it kept: a remediator passing every minute for months would hold every reading.
    assert [sample.at for sample in remediator_.samples["node-cool"]] == [NOW + 3599, NOW + 3600]


def test_a_pod_is_not_evicted_toward_a_node_where_its_host_port_is_taken(api):
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080}]
    api.put("pods", web)
    exporter = pod("exporter-5c4d-qwert", owner=("ReplicaSet", "exporter-5c4d"))
    exporter["spec"]["nodeName"] = "node-cool"
    exporter["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080, "hostIP": "10.0.0.9"}]
    api.put("pods", exporter)
    web_stays_and_api_moves(api, "host port 8080/TCP is taken on node-cool")


@pytest.mark.parametrize("bound", [True, False])
def test_exclusive_cpus_on_the_target_are_charged_at_its_ratio_as_the_extender_charges_them(api, bound):
    # node-cool oversold x2: 8 real cores, 16 allocatable. A Pod there holds 6 whole cores (or is
    # nominated there to get them), which the extender charges 12 of the 16 (real cores cannot be
    # oversold); its 6-core request alone would leave 10 free, room for web's 5 cores, which the
    # extender would then refuse.
    cool = api.get("nodes", "", "node-cool")
    cool["metadata"]["annotations"] = {KEYS.real_allocatable: json.dumps({"cpu": "8", "memory": "16Gi"}),
                                       KEYS.applied_oversale_ratio: json.dumps({"cpu": "2"})}
    cool["status"]["allocatable"]["cpu"] = cool["status"]["capacity"]["cpu"] = "16"
    api.put("nodes", cool)
    pinned = pod("db-0", owner=("StatefulSet", "db"), cpu="6", memory="1Gi")
    if bound:
        pinned["spec"]["nodeName"] = "node-cool"
        pinned["metadata"]["annotations"] = {KEYS.resource_status: json.dumps({"cpuset": "0-5", "numaNode": 0})}
    else:
        del pinned["spec"]["nodeName"]
        pinned["metadata"]["annotations"] = {KEYS.cpu_bind_policy: "FullPCPUs"}
        pinned["status"] = {"phase": "Pending", "nominatedNodeName": "node-cool"}
    api.put("pods", pinned)
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "5"
    api.put("pods", web)
    api_pod = api.get("pods", "shop", "api-6f7c8-fghij")
    api_pod["metadata"]["annotations"] = {KEYS.evictable: "n"}  # web is the one candidate
    api.put("pods", api_pod)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert ("Pod/shop/web-5d8f9-abcde", "not moved: no node can take it (cpu: 5 requested, 4 free on node-cool "
            "(oversold allocatable))") in {(r.object, r.reason) for r in rows}
    assert evictions(api) == 0
    # With 4 cores or less, it fits what the extender leaves free, and moves.
    web["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"
    api.put("pods", web)
    remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is None


def test_room_a_pod_nominated_to_the_target_will_take_is_not_offered_to_a_replacement(api):
    # A Pod kube-scheduler has nominated to node-cool (a preemption's, or one whose volumes are
    # being provisioned before its bind) will take 7800m of its 8 cores: kube-scheduler keeps that
    # room, so neither web's nor api's replacement (500m each) would get in.
    waiting = pod("report-0", owner=("StatefulSet", "report"), cpu="7800m")
    del waiting["spec"]["nodeName"]
    waiting["status"] = {"phase": "Pending", "nominatedNodeName": "node-cool"}
    api.put("pods", waiting)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 0
    assert ("Pod/shop/web-5d8f9-abcde", "not moved: no node can take it (cpu: 500m requested, 200m free on "
            "node-cool (oversold allocatable))") in {(r.object, r.reason) for r in rows}
    # Once it is bound elsewhere, the room is free again.
    waiting["spec"]["nodeName"], waiting["status"] = "node-hot", {"phase": "Running", "startTime": LONG_AGO}
    api.put("pods", waiting)
    remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 1


def end_cooldowns(api: FakeKubeAPI, node_name: str) -> None:
    """As if the cooldowns an eviction from ``node_name`` recorded on it had ended."""
    node_ = api.get("nodes", "", node_name)
    del node_["metadata"]["annotations"][KEYS.remediation_cooldowns]
    api.put("nodes", node_)


def web_stays_and_api_moves(api: FakeKubeAPI, reason: str) -> None:
    """One pass: the web Pod, which would cool the hot node most, stays, as no node can take it
    for ``reason``; the api Pod, which takes nothing node-cool lacks, moves instead."""
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None
    assert ("Pod/shop/web-5d8f9-abcde", f"not moved: no node can take it ({reason})") in \
        {(r.object, r.reason) for r in rows}
    assert api.get("pods", "shop", "api-6f7c8-fghij") is None, "the Pod that can go moves instead"


def test_with_a_minimum_of_two_ready_replicas_a_single_replica_stays_and_a_replicated_pod_moves(api):
    def ready(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        return obj

    for name in ("web-5d8f9-abcde", "api-6f7c8-fghij"):
        api.put("pods", ready(api.get("pods", "shop", name)))
    other = ready(pod("api-6f7c8-klmno", owner=("ReplicaSet", "api-6f7c8")))
    other["spec"]["nodeName"] = "node-cool"
    api.put("pods", other)
    settings = dataclasses.replace(SETTINGS, hot_observations=1, eviction_min_replicas=2)
    rows = remediator(api, settings).run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None, "its only replica: an eviction is an outage"
    assert ("Pod/shop/web-5d8f9-abcde", "kept: 1 Ready replica(s) of ReplicaSet/web-5d8f9, fewer than the 2 "
            f"remediation needs to move one ({KEYS.evictable}: y allows it)") in {(r.object, r.reason) for r in rows}
    assert api.get("pods", "shop", "api-6f7c8-fghij") is None, "another replica serves on node-cool"
    assert evictions(api) == 1


def test_a_pod_is_not_evicted_toward_a_node_its_replacement_could_not_run_on(api):
    """kube-scheduler holds the replacement to the Pod's nodeSelector and tolerations: a target
    they rule out is no target (the replacement would wait Pending, or come back to the hot node)."""
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["nodeSelector"] = {"pool": "hot"}
    api.put("pods", web)
    label_nodes(api, "pool", {"node-hot": "hot"})
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
    rows = remediator_.run_pass(dry_run=True)
    assert "not moved: no node can take it (nodeSelector pool=hot: node-cool has no label pool)" in \
        {r.reason for r in rows if r.object == "Pod/shop/web-5d8f9-abcde"}
    (planned,) = [r for r in rows if r.proposed == "node-cool"]
    assert planned.object == "Pod/shop/api-6f7c8-fghij", "the Pod that can go moves instead"

    cool = api.get("nodes", "", "node-cool")
    cool["spec"] = {"taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]}
    api.put("nodes", cool)
    rows = remediator_.run_pass()
    assert evictions(api) == 0
    assert "not moved: no node can take it (taint dedicated=batch:NoSchedule on node-cool is not tolerated)" in \
        {r.reason for r in rows if r.object == "Pod/shop/api-6f7c8-fghij"}

    api_pod = api.get("pods", "shop", "api-6f7c8-fghij")
    api_pod["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    api.put("pods", api_pod)
    remediator_.run_pass()
    assert api.get("pods", "shop", "api-6f7c8-fghij") is None and evictions(api) == 1


def test_a_pod_moves_to_a_node_whose_labels_its_node_selector_asks_for(api):
    """The target's own labels are what kube-scheduler matches the nodeSelector against: a node
    that carries the label takes the Pod (the labels are not dropped on the way to the plan)."""
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["nodeSelector"] = {"pool": "general"}
    api.put("pods", web)
    label_nodes(api, "pool", {"node-hot": "general", "node-cool": "general"})
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert [(r.object, r.proposed) for r in rows if r.proposed] == [("Pod/shop/web-5d8f9-abcde", "node-cool")]


def pass_while_unavailable(api: FakeKubeAPI, caplog: Any, plural: str) -> tuple[Remediator, list[Any]]:
    """A remediator's first pass (hot at once) while ``plural`` answers HTTP 503: nothing moves."""
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
    api.unavailable = {plural}
    with caplog.at_level(logging.DEBUG, logger="reconcilers.remediation"):
        rows = remediator_.run_pass()
    api.unavailable = set()
    assert evictions(api) == 0, f"{plural} cannot be read: no move"
    return remediator_, rows


def with_claimed_volumes(api: FakeKubeAPI, web: tuple[str, str, dict[str, Any]],
                         api_pod: tuple[str, str, dict[str, Any]]) -> None:
    """The web and the api Pod each mount a claim (name, its PersistentVolume, that volume's spec)."""
    for pod_name, (claim, volume, source) in (("web-5d8f9-abcde", web), ("api-6f7c8-fghij", api_pod)):
        pod_ = api.get("pods", "shop", pod_name)
        pod_["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        api.put("pods", pod_)
        api.put("persistentvolumeclaims", {"metadata": {"name": claim, "namespace": "shop"},
                                           "spec": {"volumeName": volume}, "status": {"phase": "Bound"}})
        api.put("persistentvolumes", {"metadata": {"name": volume}, "spec": source})


def test_a_pod_is_not_evicted_away_from_the_zone_its_disk_is_in(api, caplog):
    """A zonal PersistentVolume attaches only in its zone: kube-scheduler's VolumeBinding filter
    would keep the replacement Pending anywhere else (or send it back to the hot node)."""
    label_nodes(api, "topology.kubernetes.io/zone", {"node-hot": "a", "node-cool": "b"})
    zonal = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}}
    with_claimed_volumes(api, ("data-web", "pv-disk-a", {"nodeAffinity": zonal}),
                         ("cache-api", "pv-nfs", {"nfs": {"server": "nfs", "path": "/"}}))
    remediator_, rows = pass_while_unavailable(api, caplog, "persistentvolumeclaims")
    assert "shop/web-5d8f9-abcde kept: its volumes could not be read (HTTP 503" in caplog.text
    assert "kept: its volumes could not be read (HTTP 503 Service Unavailable)" in \
        {r.reason for r in rows if r.object == "Pod/shop/web-5d8f9-abcde"}
    rows = remediator_.run_pass()
    assert ("not moved: no node can take it (volume data-web (PersistentVolume pv-disk-a) cannot be reached from "
            "node-cool: its node affinity does not match)") in \
        {r.reason for r in rows if r.object == "Pod/shop/web-5d8f9-abcde"}
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None
    assert api.get("pods", "shop", "api-6f7c8-fghij") is None, "network storage goes anywhere: this Pod moves"


MOVABLE = ("Pod/shop/web-5d8f9-abcde", "Pod/shop/api-6f7c8-fghij")


def test_a_pod_is_not_evicted_toward_a_node_whose_csi_driver_attaches_no_more_volumes(api, caplog):
    """A CSI driver caps how many of its volumes a node attaches (its CSINode's allocatable count):
    kube-scheduler's NodeVolumeLimits filter would keep the replacement Pending on a node at its
    limit, counting the volumes VolumeAttachments show there. An in-tree EBS volume is attached by
    the EBS CSI driver (CSI migration) and counts the same."""
    api.delete("pods", "shop", "agent-xyz12")  # the limits are read for the Pods with CSI volumes themselves
    with_claimed_volumes(api, ("data-web", "pv-web", {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}),
                         ("cache-api", "pv-api", {"awsElasticBlockStore": {"volumeID": "vol-2"}}))
    api.put("csinodes", {"metadata": {"name": "node-cool"}, "spec": {"drivers": [
        {"name": "ebs.csi.aws.com", "nodeID": "i-cool", "allocatable": {"count": 2}}]}})
    for attached in ("pv-other", "pv-another"):
        api.put("volumeattachments", {"metadata": {"name": f"csi-{attached}"}, "spec": {
            "attacher": "ebs.csi.aws.com", "nodeName": "node-cool", "source": {"persistentVolumeName": attached}}})
    remediator_, rows = pass_while_unavailable(api, caplog, "volumeattachments")
    assert "CSINodes or VolumeAttachments could not be listed (HTTP 503" in caplog.text
    assert {r.object: r.reason for r in rows if r.object in MOVABLE} == dict.fromkeys(
        MOVABLE, "kept: the CSI volume limits of other nodes could not be read this pass")
    rows = remediator_.run_pass()
    assert evictions(api) == 0
    assert {r.object: r.reason for r in rows if r.object in MOVABLE} == dict.fromkeys(
        MOVABLE, "not moved: no node can take it (ebs.csi.aws.com: 2 volumes attached to node-cool, its limit 2)")
    # One volume detached (its VolumeAttachment gone): room for one more there.
    api.delete("volumeattachments", "", "csi-pv-another")
    remediator_.run_pass()
    assert evictions(api) == 1


def label_nodes(api: FakeKubeAPI, key: str, values: dict[str, str]) -> None:
    for name, value in values.items():
        node_ = api.get("nodes", "", name)
        node_["metadata"].setdefault("labels", {})[key] = value
        api.put("nodes", node_)


def another_replica_keeps_it(api: FakeKubeAPI, reason: str, **spec: Any) -> None:
    """The web Pod, given ``spec``, would move to node-cool while no other replica runs there; once
    one with the same ``spec`` does, it stays, for ``reason``, and the api Pod moves instead."""
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"].update(spec)
    api.put("pods", web)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert [r.object for r in rows if r.proposed == "node-cool"] == ["Pod/shop/web-5d8f9-abcde"], "room, no replica"
    other = pod("web-5d8f9-vwxyz")
    other["spec"] = {**other["spec"], "nodeName": "node-cool", **spec}
    api.put("pods", other)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert f"not moved: no node can take it ({reason})" in \
        {r.reason for r in rows if r.object == "Pod/shop/web-5d8f9-abcde"}
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None
    assert api.get("pods", "shop", "api-6f7c8-fghij") is None, "the Pod that can go moves instead"


def test_a_replica_spread_one_per_node_is_not_sent_beside_another(api):
    """Required pod anti-affinity on the hostname (one replica per node): a node already running a
    replica cannot take the replacement, whatever room it has."""
    label_nodes(api, "kubernetes.io/hostname", {"node-hot": "node-hot", "node-cool": "node-cool"})
    another_replica_keeps_it(api, "required pod anti-affinity (kubernetes.io/hostname): shop/web-5d8f9-vwxyz "
                                  "shares node-cool's kubernetes.io/hostname", affinity=apart_from_hosts_of("web"))


def web_away_from_the_retail_teams_etl(api) -> None:
    """web keeps away from ETL Pods of the retail team's namespaces only; the one on node-cool
    runs in the data team's namespace ``jobs``."""
    label_nodes(api, "kubernetes.io/hostname", {"node-hot": "node-hot", "node-cool": "node-cool"})
    for name, team in (("shop", "retail"), ("jobs", "data")):
        api.put("namespaces", {"metadata": {"name": name, "labels": {"team": team}}})
    etl = pod("etl-7c9d-qwert", owner=("ReplicaSet", "etl-7c9d"))
    etl["metadata"]["namespace"] = "jobs"
    etl["spec"]["nodeName"] = "node-cool"
    api.put("pods", etl)
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "etl"}}, "topologyKey": "kubernetes.io/hostname",
         "namespaceSelector": {"matchLabels": {"team": "retail"}}}]}}
    api.put("pods", web)


def test_a_namespace_selector_is_read_with_the_namespaces_labels(api):
    """The ETL Pod on node-cool is not the retail team's, so kube-scheduler would place web's
    replacement there, and it moves."""
    web_away_from_the_retail_teams_etl(api)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert [r.object for r in rows if r.proposed == "node-cool"] == ["Pod/shop/web-5d8f9-abcde"]
    # Once the ETL namespace is the retail team's too, the term reaches it.
    api.put("namespaces", {"metadata": {"name": "jobs", "labels": {"team": "retail"}}})
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert [r.object for r in rows if r.proposed == "node-cool"] == ["Pod/shop/api-6f7c8-fghij"]



def test_namespaces_that_cannot_be_listed_make_a_namespace_selector_reach_every_namespace(api, caplog):
    """A Role without ``namespaces: list``: a term's namespaceSelector is read as every namespace,
    the reading that keeps an anti-affinity's Pods apart, so web stays off node-cool, and the log
    says so."""
    web_away_from_the_retail_teams_etl(api)
    api.storms["namespaces"] = [403, 10]
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert "Pod/shop/web-5d8f9-abcde" not in [r.object for r in rows if r.proposed == "node-cool"]
    assert [r.object for r in rows if r.proposed == "node-cool"] == ["Pod/shop/api-6f7c8-fghij"]
    assert ('namespaces could not be listed (HTTP 403 Forbidden: namespaces is forbidden: User '
            '"system:serviceaccount:oversale:oversale" cannot list resource "namespaces"): a pod affinity term\'s '
            "namespaceSelector is taken as every namespace this pass") in caplog.messages

def test_a_replica_is_not_moved_where_it_would_break_its_topology_spread(api):
    """One replica per zone at most one apart (maxSkew 1): the hot node's replica may not join
    another in its zone while a zone (here a cordoned node's) has none."""
    cordoned = node("node-z2", "8", labelled=False)
    cordoned["spec"] = {"unschedulable": True}
    api.put("nodes", cordoned)
    label_nodes(api, "topology.kubernetes.io/zone", {"node-hot": "z1", "node-cool": "z1", "node-z2": "z2"})
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "web"}}}]
    another_replica_keeps_it(api, "topology spread (topology.kubernetes.io/zone): 2 matching Pods in node-cool's "
                                  "domain with it, 0 in the emptiest, max skew 1", topologySpreadConstraints=spread)


def test_several_evictions_from_one_node_take_one_replica_and_keep_to_the_namespace_limit(api, caplog):
    """With three evictions a node allowed, two replicas of one workload still do not leave
    together (the workload's cooldown), and a namespace's limit holds within the one plan."""
    api.put("pods", pod("web-5d8f9-bbbbb"))
    usage(api, "4000m", {"web-5d8f9-abcde": "150m", "web-5d8f9-bbbbb": "140m", "api-6f7c8-fghij": "100m",
                         "agent-xyz12": "10m"})  # 200m above the watermark: two Pods' worth
    settings = dataclasses.replace(SETTINGS, hot_observations=1, evictions_per_node=3)
    rows = remediator(api, dataclasses.replace(settings, evictions_per_namespace=1)).run_pass(dry_run=True)
    assert [r.object for r in rows if r.proposed] == ["Pod/shop/web-5d8f9-abcde"]
    reasons = {r.object: r.reason for r in rows}
    assert reasons["Pod/shop/api-6f7c8-fghij"] == "not moved: over the evictions left in shop this pass (1)"
    with caplog.at_level(logging.INFO, logger="reconcilers.remediation"):
        remediator(api, settings).run_pass()
    assert evictions(api) == 2
    assert api.get("pods", "shop", "web-5d8f9-abcde") is None and api.get("pods", "shop", "api-6f7c8-fghij") is None
    assert len([m for m in caplog.messages if m.startswith("Node/node-hot: hot-node taint set")]) == 1, \
        "tainted by the first eviction; the second finds the taint there"
    assert api.get("pods", "shop", "web-5d8f9-bbbbb") is not None, "one replica of web a pass"


def a_second_hot_node(api: FakeKubeAPI, pod_name: str, owner: tuple[str, str]) -> None:
    """node-hot-2, as hot as node-hot, with one Pod of ``owner`` in shop using 2500m."""
    api.put("nodes", node("node-hot-2"))
    api.put("pods", {**pod(pod_name, owner=owner), "spec": {**pod()["spec"], "nodeName": "node-hot-2"}})
    api.put("nodemetrics", {"metadata": {"name": "node-hot-2"}, "window": "30s",
                            "usage": {"cpu": "3920m", "memory": "4Gi"}})
    api.put("podmetrics", {"metadata": {"name": pod_name, "namespace": "shop"}, "window": "30s",
                           "containers": [{"name": "app", "usage": {"cpu": "2500m", "memory": "300Mi"}}]})


def test_the_pass_and_namespace_limits_hold_across_hot_nodes(api):
    a_second_hot_node(api, "batch-1a2b3-xyzab", ("ReplicaSet", "batch-1a2b3"))
    one_pass = dataclasses.replace(SETTINGS, hot_observations=1)
    rows = remediator(api, dataclasses.replace(one_pass, evictions_per_pass=1)).run_pass(dry_run=True)
    assert [r.object for r in rows if r.proposed] == ["Pod/shop/web-5d8f9-abcde"]
    assert {r.object: r.reason for r in rows}["Node/node-hot-2"] == "hot, over 1 evictions this pass: next pass"
    rows = remediator(api, dataclasses.replace(one_pass, evictions_per_namespace=1)).run_pass(dry_run=True)
    assert [r.object for r in rows if r.proposed] == ["Pod/shop/web-5d8f9-abcde"]
    assert {r.object: r.reason for r in rows}["Pod/shop/batch-1a2b3-xyzab"] == \
        "kept: over 1 evictions in shop this pass"
    limited = remediator(api, dataclasses.replace(one_pass, evictions_per_namespace=1))
    limited.run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "batch-1a2b3-xyzab") is not None
    limited.run_pass()
    assert evictions(api) == 2, "the limit is per pass: the next one moves the second node's Pod"
    assert api.get("pods", "shop", "batch-1a2b3-xyzab") is None
    assert api.get("pods", "shop", "api-6f7c8-fghij") is not None, "node-hot is in its cooldown"


def test_a_workload_moved_once_stays_until_its_cooldown_ends(api):
    clock = [float(int(time.time()))]  # whole seconds: the cooldown's record ends exactly 60 s on
    settings = dataclasses.replace(SETTINGS, hot_observations=1, workload_cooldown_seconds=60)
    remediator_ = remediator(api, settings, lambda: clock[0])
    remediator_.run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    # Another replica of web runs hot elsewhere (node-hot itself is in its own cooldown now).
    a_second_hot_node(api, "web-5d8f9-bbbbb", ("ReplicaSet", "web-5d8f9"))
    rows = remediator_.run_pass()
    assert evictions(api) == 1
    assert {r.object: r.reason for r in rows}["Pod/shop/web-5d8f9-bbbbb"] == \
        "kept: workload shop/ReplicaSet/web-5d8f9 moved recently (cooling down)"
    clock[0] += 59
    remediator_.run_pass()
    assert evictions(api) == 1, "a second of its cooldown left"
    clock[0] += 1
    remediator_.run_pass()
    assert evictions(api) == 2 and api.get("pods", "shop", "web-5d8f9-bbbbb") is None, "it ends at 60 s"


def test_a_node_is_judged_again_the_second_its_cooldown_ends(api):
    clock = [float(int(time.time()))]
    settings = dataclasses.replace(SETTINGS, hot_observations=1, node_cooldown_seconds=60)
    remediator_ = remediator(api, settings, lambda: clock[0])
    remediator_.run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    clock[0] += 59
    rows = remediator_.run_pass()
    assert evictions(api) == 1
    assert {r.object: r.reason for r in rows}["Node/node-hot"] == (
        "hot, cooling down after an eviction (1s left): cpu usage 98% of real capacity is above the runtime "
        "watermark 95%")
    clock[0] += 1
    remediator_.run_pass()
    assert evictions(api) == 2 and api.get("pods", "shop", "api-6f7c8-fghij") is None, "still hot: the next Pod"


def test_the_hold_of_a_pod_without_a_memory_request_holds_no_memory(api):
    web = api.get("pods", "shop", "web-5d8f9-abcde")
    web["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m"}}
    api.put("pods", web)
    remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    held = json.loads(api.get("nodes", "", "node-cool")["metadata"]["annotations"][KEYS.reservations])
    assert {k: v for k, v in held["shop/ReplicaSet/web-5d8f9"].items() if k != "until"} == {"cpu": "500m",
                                                                                           "memory": "0"}


def test_a_hold_that_expires_this_second_is_dropped(api):
    """A hold lasts until its ``until``, not through it: the extender stops counting it then too."""
    clock = [float(int(time.time()))]
    cool = api.get("nodes", "", "node-cool")
    ending = {"cpu": "500m", "memory": "512Mi", "until": format_timestamp(clock[0] + 1)}
    cool["metadata"]["annotations"] = {KEYS.reservations: json.dumps({"batch/Job/etl": ending})}
    api.put("nodes", cool)
    usage(api, "1", HOT)  # nothing hot: the pass only tidies
    remediator_ = remediator(api, SETTINGS, lambda: clock[0])
    remediator_.run_pass()
    assert KEYS.reservations in api.get("nodes", "", "node-cool")["metadata"]["annotations"], "a second left"
    clock[0] += 1
    remediator_.run_pass()
    assert KEYS.reservations not in (api.get("nodes", "", "node-cool")["metadata"].get("annotations") or {})


def test_cooldowns_merge_at_the_later_end_drop_the_ended_and_read_back_as_written():
    earlier = Cooldowns(100.0, {"shop/ReplicaSet/a": 200.0, "shop/ReplicaSet/b": 50.0})
    later = Cooldowns(None, {"shop/ReplicaSet/a": 150.0, "shop/ReplicaSet/c": 300.0})
    merged = earlier.merged(later)
    assert merged == Cooldowns(100.0, {"shop/ReplicaSet/a": 200.0, "shop/ReplicaSet/b": 50.0,
                                       "shop/ReplicaSet/c": 300.0})
    assert merged.after(60) == Cooldowns(100.0, {"shop/ReplicaSet/a": 200.0, "shop/ReplicaSet/c": 300.0})
    assert merged.after(100) == Cooldowns(None, {"shop/ReplicaSet/a": 200.0, "shop/ReplicaSet/c": 300.0})
    assert cooldowns_text(merged.after(300)) is None, "nothing left: the annotation is removed"
    text = cooldowns_text(merged)
    assert text is not None
    # The pass tidies a record whose text its running cooldowns no longer give: a record read back
    # must give the same text, or it would be written again every pass.
    assert read_cooldowns({KEYS.remediation_cooldowns: text}, KEYS) == merged
    assert cooldowns_text(read_cooldowns({KEYS.remediation_cooldowns: text}, KEYS)) == text
    assert read_cooldowns(None, KEYS) == Cooldowns(), "a node without annotations records none"
    # A node's cooldown set longer than its workloads' outlasts theirs on the record.
    assert cooldowns_text(merged.after(250)) == '{"workloads": {"shop/ReplicaSet/c": "1970-01-01T00:05:00Z"}}'
    assert cooldowns_text(Cooldowns(100.0)) == '{"node": "1970-01-01T00:01:40Z"}'


def test_a_replica_that_takes_the_lease_over_keeps_the_cooldowns_of_the_one_before(api):
    """A rollout of the reconcilers starts a replica with empty memory: without the record on the
    node it would judge node-hot a pass after an eviction, before its load settled, and move the
    other replica of a workload just moved."""
    clock = [time.time()]
    settings = dataclasses.replace(SETTINGS, hot_observations=1)

    def replica() -> Remediator:
        return remediator(api, settings, lambda: clock[0])

    def recorded() -> Cooldowns:
        return read_cooldowns(api.get("nodes", "", "node-hot")["metadata"].get("annotations"), KEYS)

    replica().run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    first = recorded()
    assert clock[0] + settings.node_cooldown_seconds <= first.node < clock[0] + settings.node_cooldown_seconds + 1
    assert first.workloads == {"shop/ReplicaSet/web-5d8f9": pytest.approx(clock[0] + settings.workload_cooldown_seconds,
                                                                          abs=1)}
    a_second_hot_node(api, "web-5d8f9-bbbbb", ("ReplicaSet", "web-5d8f9"))
    rows = replica().run_pass()
    assert evictions(api) == 1
    reasons = {r.object: r.reason for r in rows}
    # The record keeps whole seconds (rounded up): 600 s or a second more left.
    assert re.match(r"hot, cooling down after an eviction \((600|601)s left\)", reasons["Node/node-hot"])
    assert reasons["Pod/shop/web-5d8f9-bbbbb"] == \
        "kept: workload shop/ReplicaSet/web-5d8f9 moved recently (cooling down)"

    clock[0] += settings.node_cooldown_seconds + 1  # node-hot's cooldown ended, web's has not
    replica().run_pass()
    assert evictions(api) == 2 and api.get("pods", "shop", "api-6f7c8-fghij") is None, "node-hot judged again"
    assert api.get("pods", "shop", "web-5d8f9-bbbbb") is not None
    assert set(recorded().workloads) == {"shop/ReplicaSet/web-5d8f9", "shop/ReplicaSet/api-6f7c8"}, "merged"

    # Once every cooldown has ended, the next pass of the Lease holder removes the record.
    clock[0] += settings.workload_cooldown_seconds + 1
    for name in ("node-hot", "node-hot-2"):
        api.put("nodemetrics", {"metadata": {"name": name}, "window": "30s", "usage": {"cpu": "500m", "memory": "2Gi"}})
    replica().run_pass(dry_run=True)
    assert KEYS.remediation_cooldowns in api.get("nodes", "", "node-hot")["metadata"]["annotations"], "not on a dry run"
    replica().run_pass()
    assert KEYS.remediation_cooldowns not in api.get("nodes", "", "node-hot")["metadata"]["annotations"]


@pytest.mark.parametrize("garbage", ["not json", "[1]", '{"node": 5, "workloads": ["x"]}', '{"node": "soon"}'])
def test_an_unreadable_cooldown_record_holds_nothing(api, garbage):
    one_pass_with_annotation(api, "node-hot", KEYS.remediation_cooldowns, garbage)
    assert evictions(api) == 1


def one_pass_with_annotation(api: FakeKubeAPI, node_name: str, key: str, value: str) -> None:
    """One remediation pass (hot after one observation) with ``key: value`` on ``node_name``."""
    annotated = api.get("nodes", "", node_name)
    annotated["metadata"]["annotations"] = {key: value}
    api.put("nodes", annotated)
    remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()


def test_an_eviction_a_policy_refuses_is_told_in_its_words_and_the_room_held_for_it_given_back(api, caplog):
    def policy_engine(review: dict[str, Any]) -> dict[str, Any]:
        if review["request"].get("subResource") == "eviction":
            return {"allowed": False, "status": {"code": 403, "message": "evictions need a maintenance window"}}
        return {"allowed": True}

    api.validating["pods"] = policy_engine
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        rows = remediator_.run_pass()
    assert api.get("pods", "shop", "web-5d8f9-abcde") is not None
    assert "Pod/shop/web-5d8f9-abcde: eviction failed: 403 admission webhook denied the request: evictions need a " \
           "maintenance window" in caplog.messages
    assert remediator_.metrics.evictions.labels("error")._value.get() == 1
    assert not [r for r in rows if r.written]
    assert KEYS.reservations not in (api.get("nodes", "", "node-cool")["metadata"].get("annotations") or {})
    assert KEYS.remediation_cooldowns not in (api.get("nodes", "", "node-hot")["metadata"].get("annotations") or {})


def test_a_lease_lost_while_an_eviction_is_admitted_stops_the_pass_but_the_eviction_is_recorded(api, caplog):
    """The eviction's admission (a slow webhook, or an API server too busy to renew the Lease)
    outlasts 2/3 of the Lease: the remediator moves nothing more, but the eviction happened, so its
    cooldowns and taint are written, and the replica taking over does not move the next Pod off
    node-hot before its load settled."""
    clock = [time.time()]
    api_client = client.ApiClient(client.Configuration(host=api.url))
    elector = LeaseElector(api_client, "oversale", "oversale-reconciler", "a", 15, lambda: clock[0])
    assert elector.try_acquire_or_renew()

    def slow_admission(review: dict[str, Any]) -> dict[str, Any]:
        if review["request"].get("subResource") == "eviction":
            clock[0] += 11
        return {"allowed": True}

    api.validating["pods"] = slow_admission
    a_second_hot_node(api, "batch-1a2b3-xyzab", ("ReplicaSet", "batch-1a2b3"))
    api.put("nodes", node("node-cool-2", "8", labelled=False))  # room for node-hot-2's Pod too
    api.put("nodemetrics", {"metadata": {"name": "node-cool-2"}, "window": "30s",
                            "usage": {"cpu": "500m", "memory": "2Gi"}})
    settings = dataclasses.replace(SETTINGS, hot_observations=1)
    assert len([r for r in remediator(api, settings).run_pass(dry_run=True) if r.proposed]) == 2
    lost = Remediator(Cluster(api_client), MetricsAPI(api_client), settings, leader=elector, clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        lost.run_pass()
    assert not elector.is_leader()
    assert lost.incomplete == ["the Lease was lost during the pass"], "`remediate` exits 1: not every node judged"
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    assert api.get("pods", "shop", "batch-1a2b3-xyzab") is not None, "node-hot-2 waits for the next Lease holder"
    assert "lease lost during the remediation pass: stopped evicting" in caplog.messages
    hot = api.get("nodes", "", "node-hot")
    assert read_cooldowns(hot["metadata"].get("annotations"), KEYS).node is not None
    assert [t["key"] for t in hot["spec"].get("taints") or []] == [KEYS.hot_taint]
    held = json.loads(api.get("nodes", "", "node-cool")["metadata"]["annotations"][KEYS.reservations])
    assert list(held) == ["shop/ReplicaSet/web-5d8f9"], "room held only for the Pod evicted"

    taker = Remediator(Cluster(api_client), MetricsAPI(api_client), settings, clock=lambda: clock[0])
    reasons = {r.object: r.reason for r in taker.run_pass()}
    assert reasons["Node/node-hot"].startswith("hot, cooling down after an eviction")
    assert evictions(api) == 2 and api.get("pods", "shop", "api-6f7c8-fghij") is not None
    assert api.get("pods", "shop", "batch-1a2b3-xyzab") is None


def test_a_hold_another_writer_added_meanwhile_is_kept(api):
    """Reservations, the cooldown record and the taint list are written only over the node as
    read, and read again after a 409: a merge from an older read would drop what the replica
    whose Lease just ran out, or the node lifecycle controller, wrote meanwhile."""
    theirs = {"cpu": "1", "memory": "1Gi", "until": "2099-01-01T00:00:00Z"}

    def previous_holder_reserves(node_: dict[str, Any]) -> None:
        node_["metadata"].setdefault("annotations", {})[KEYS.reservations] = json.dumps({"batch/Job/etl": theirs})

    api.written_meanwhile["nodes"] = previous_holder_reserves
    api.concurrent_writes["nodes/node-cool"] = 1
    remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 1
    held = json.loads(api.get("nodes", "", "node-cool")["metadata"]["annotations"][KEYS.reservations])
    assert set(held) == {"batch/Job/etl", "shop/ReplicaSet/web-5d8f9"}


@pytest.mark.parametrize("busy", ["node-cool", "node-hot"])
def test_a_node_that_keeps_changing_goes_without_its_write_and_the_eviction_stands(api, caplog, busy):
    """Three 409s in a row on the target (no room held) or on the hot node (no taint): the
    eviction goes ahead, and the log says what was not written, in the API's words."""
    api.concurrent_writes[f"nodes/{busy}"] = 3
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    conflict = (f'409 Operation cannot be fulfilled on nodes "{busy}": the object has been modified; please apply '
                "your changes to the latest version and try again")
    cool, hot = api.get("nodes", "", "node-cool"), api.get("nodes", "", "node-hot")
    (remediated,) = [e for e in api.list_objects("events", None, {})["items"] if e["reason"] == "HotNodeRemediated"]
    if busy == "node-cool":
        assert f"Node/node-cool: could not reserve room ({conflict}); the eviction goes ahead, placed by the " \
               "scheduler" in caplog.messages
        assert KEYS.reservations not in (cool["metadata"].get("annotations") or {})
        assert "(room reserved)" not in remediated["message"] and "tainted" in remediated["message"]
    else:
        assert f"Node/node-hot: hot-node taint not set ({conflict})" in caplog.messages
        assert not (hot.get("spec") or {}).get("taints")
        assert "(room reserved)" in remediated["message"] and "tainted" not in remediated["message"]
        assert read_cooldowns(hot["metadata"].get("annotations"), KEYS).node is not None, "written once it settled"


def test_a_node_write_a_policy_refuses_is_sent_once_and_the_eviction_stands(api, caplog):
    """Only a 409 (the node changed since it was read) is worth reading the node again for: a
    policy engine's refusal of the hold on node-cool stands however often it is asked."""
    api.validating["nodes"] = lambda review: {"allowed": review["request"]["name"] != "node-cool",
                                              "status": {"code": 403, "message": "nodes are not annotated here"}}
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    assert [r.method for r in api.requests if r.path.endswith("/nodes/node-cool")] == ["GET", "PATCH"]
    assert any(m.startswith("Node/node-cool: could not reserve room (403 ") and "nodes are not annotated here" in m
               for m in caplog.messages), caplog.messages


def test_cooldowns_a_busy_node_does_not_take_are_said_and_still_kept_by_this_replica(api, caplog):
    """Six 409s in a row on the hot node: neither the taint nor the record of its cooldown is
    written. The eviction stands, the log says the record is missing (a replica taking the Lease
    over would not know it), and this replica still keeps the node in its cooldown."""
    api.concurrent_writes["nodes/node-hot"] = 6
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        remediator_.run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    conflict = ('409 Operation cannot be fulfilled on nodes "node-hot": the object has been modified; please apply '
                "your changes to the latest version and try again")
    assert (f"Node/node-hot: cooldowns not recorded ({conflict}): a replica taking the Lease over would not know "
            "them") in caplog.messages
    assert KEYS.remediation_cooldowns not in (api.get("nodes", "", "node-hot")["metadata"].get("annotations") or {})
    remediator_.run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "api-6f7c8-fghij") is not None, "node-hot cools down"


def test_events_rbac_refuses_are_logged_and_the_eviction_stands(api, caplog):
    """A Role that lost ``events: create`` (or an API server shedding Event writes): the move is
    what matters, so the pass goes on and the log says each Event not written, in RBAC's words."""
    api.storms["events"] = [403, 10]
    with caplog.at_level(logging.WARNING, logger="reconcilers"):
        remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None
    assert not api.list_objects("events", None, {})["items"]
    refused = ('403 events is forbidden: User "system:serviceaccount:oversale:oversale" cannot create resource '
               '"events"')
    assert {f"event EvictedFromHotNode not written: {refused}",
            f"event HotNodeRemediated not written: {refused}"} <= set(caplog.messages)


def test_dry_run_prints_the_plan_and_changes_nothing(api):
    api.put("pods", pod("cache-8d9e0-lmnop", owner=("ReplicaSet", "cache-8d9e0")))  # started after the last scrape
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    (planned,) = [r for r in rows if r.object == "Pod/shop/web-5d8f9-abcde"]
    assert planned.current == "node-hot" and planned.proposed == "node-cool" and not planned.written
    assert "Burstable, uses 2500m cpu, 120m above the watermark" in planned.reason
    assert {r.object: r.reason for r in rows}["Pod/shop/cache-8d9e0-lmnop"] == \
        "kept: no PodMetrics (its usage is unknown)"
    assert not [r for r in api.requests if r.method in ("POST", "PATCH", "PUT", "DELETE")]


def test_a_pod_whose_only_target_is_full_is_not_evicted(api):
    api.put("pods", {**pod("filler-7a8b9-qwert"), "spec": {**pod()["spec"], "nodeName": "node-cool", "containers": [
        {"name": "app", "image": "x", "resources": {"requests": {"cpu": "7800m", "memory": "1Gi"}}}]}})
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert evictions(api) == 0
    assert {r.object for r in rows if "no node can take it" in r.reason} == {"Pod/shop/web-5d8f9-abcde",
                                                                             "Pod/shop/api-6f7c8-fghij"}
    assert {r.object: r.reason for r in rows}["Node/node-hot"] == ("hot: cpu usage 98% of real capacity is above "
                                                                   "the runtime watermark 95%; nothing can move "
                                                                   "(2 candidates)"), "the DaemonSet Pod is none"


def test_without_usage_nothing_is_evicted_and_nothing_is_reported_as_seen(api):
    """metrics-server down: no eviction, and the utilization observed before is not reported on as
    if seen now (it would hold OversaleNodeAboveRealCapacity firing, or quiet, on an old figure);
    the time of the last observation stays where it was, for OversaleRemediatorBlind."""
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
    remediator_.run_pass(dry_run=True)
    registry = remediator_.metrics.registry
    utilization = {"node": "node-hot", "resource": "cpu"}
    assert registry.get_sample_value("oversale_node_real_utilization", utilization) == pytest.approx(3.92 / 4), \
        "3920m used of node-hot's 4 real cores"
    observed = registry.get_sample_value("oversale_remediation_last_observation_timestamp_seconds")
    assert observed > time.time() - 60
    api.unavailable = {"nodemetrics", "podmetrics"}
    assert remediator_.run_pass() == []
    assert evictions(api) == 0
    assert registry.get_sample_value("oversale_node_real_utilization", utilization) is None
    assert registry.get_sample_value("oversale_remediation_hot_nodes") == 0
    assert registry.get_sample_value("oversale_remediation_last_observation_timestamp_seconds") == observed


def test_passes_blind_for_a_while_say_so_when_it_starts_and_when_it_ends(api, caplog):
    """metrics-server down under a running remediator (a pass a minute): one warning when the
    passes start observing nothing and one line when they observe again; each skip counted."""
    remediator_ = remediator(api)
    api.unavailable = {"nodemetrics"}
    with caplog.at_level(logging.INFO, logger="reconcilers.remediation"):
        for _ in range(3):
            assert remediator_.run_pass(dry_run=True) == []
            assert remediator_.incomplete == ["cannot read usage or the cluster (HTTP 503 Service Unavailable)"]
        api.unavailable = set()
        remediator_.run_pass(dry_run=True)
        assert remediator_.incomplete == [], "a pass that observed everything is complete again"
    said = [r.getMessage() for r in caplog.records if "usage" in r.getMessage()]
    assert said == ["remediation pass skipped: cannot read usage or the cluster (HTTP 503 Service Unavailable)",
                    "remediation reads usage and the cluster again (after 3 failed runs)"]
    skips = remediator_.metrics.registry.get_sample_value("oversale_reconcile_skips_total",
                                                          {"reason": "remediation-no-usage"})
    assert skips == 3


def test_a_pass_that_cannot_reach_the_api_server_says_where_and_why():
    """Not the client's exception name (MaxRetryError) but which server and what happened."""
    port = free_port()  # nothing listens there
    api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    remediator_ = Remediator(Cluster(api_client), MetricsAPI(api_client), SETTINGS)
    assert remediator_.run_pass(dry_run=True) == []
    assert remediator_.incomplete == [f"cannot read usage or the cluster (127.0.0.1:{port} unreachable (connection "
                                      "refused))"]


def test_a_node_can_carry_its_own_runtime_watermark(api, caplog):
    hot = api.get("nodes", "", "node-hot")
    hot["metadata"]["annotations"] = {KEYS.cpu_runtime_watermark: "0.99"}
    api.put("nodes", hot)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert rows == [] and evictions(api) == 0, "98% is under this node's 99%"
    hot["metadata"]["annotations"] = {KEYS.cpu_runtime_watermark: "99%"}
    api.put("nodes", hot)
    with caplog.at_level(logging.WARNING, logger="reconcilers.remediation"):
        every_minute = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
        rows = every_minute.run_pass()
        assert evictions(api) == 1, "an unreadable value keeps the default 95%"
        every_minute.run_pass()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings.count(f"Node/node-hot: annotation {KEYS.cpu_runtime_watermark}='99%' ignored: not a number "
                          "above 0 and at most 1; default kept") == 1, "said once, not at every pass"


def test_a_node_pool_can_carry_its_own_runtime_watermark_as_a_label(api):
    hot = api.get("nodes", "", "node-hot")
    hot["metadata"]["labels"][KEYS.cpu_runtime_watermark] = "0.99"
    api.put("nodes", hot)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass()
    assert rows == [] and evictions(api) == 0, "98% is under this node's 99%"


def test_two_hot_nodes_in_one_pass_do_not_both_fill_the_one_target(api):
    """The room a first move takes on a target is gone for the next hot node of the same pass."""
    api.put("nodes", node("node-hot-2"))
    api.put("pods", {**pod("batch-1a2b3-xyzab", owner=("ReplicaSet", "batch-1a2b3")),
                     "spec": {**pod()["spec"], "nodeName": "node-hot-2"}})
    api.put("nodemetrics", {"metadata": {"name": "node-hot-2"}, "window": "30s",
                            "usage": {"cpu": "3920m", "memory": "4Gi"}})
    api.put("podmetrics", {"metadata": {"name": "batch-1a2b3-xyzab", "namespace": "shop"}, "window": "30s",
                           "containers": [{"name": "app", "usage": {"cpu": "2500m", "memory": "300Mi"}}]})
    # node-cool has 600m of its 8 cores left by requests: room for one 500m Pod, not two.
    api.put("pods", {**pod("filler-7a8b9-qwert"), "spec": {**pod()["spec"], "nodeName": "node-cool", "containers": [
        {"name": "app", "image": "x", "resources": {"requests": {"cpu": "7400m", "memory": "1Gi"}}}]}})
    one_pass = dataclasses.replace(SETTINGS, hot_observations=1)
    planned = remediator(api, one_pass).run_pass(dry_run=True)
    assert [r.proposed for r in planned if r.object.startswith("Pod/") and r.proposed] == ["node-cool"]
    assert any(r.object.startswith("Pod/") and "no node can take it" in r.reason for r in planned)
    remediator(api, one_pass).run_pass()
    assert evictions(api) == 1
    held = json.loads(api.get("nodes", "", "node-cool")["metadata"]["annotations"][KEYS.reservations])
    assert len(held) == 1, "one hold, for the one Pod the target has room for"


@pytest.mark.parametrize("garbage", ["[1]", "\"held\"", "not json", "{\"shop/ReplicaSet/old\": 3}"])
def test_an_unreadable_reservation_on_the_target_holds_nothing_and_blocks_nothing(api, garbage):
    one_pass_with_annotation(api, "node-cool", KEYS.reservations, garbage)
    assert evictions(api) == 1
    held = json.loads(api.get("nodes", "", "node-cool")["metadata"]["annotations"][KEYS.reservations])
    assert list(held) == ["shop/ReplicaSet/web-5d8f9"], "rewritten as one readable hold"


@pytest.mark.parametrize("recreated", [True, False])
def test_a_pod_gone_or_recreated_under_its_name_since_the_pass_read_it_is_not_evicted(api, caplog, recreated):
    """The eviction names the Pod the pass read by its UID: a StatefulSet recreates its Pods under
    the same name, and the new one is no part of this node's heat (409); a Pod deleted meanwhile
    is not found (404). Neither is an error."""
    (api.recreated if recreated else api.vanishing).add(("shop", "web-5d8f9-abcde"))
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1))
    with caplog.at_level(logging.INFO, logger="reconcilers.remediation"):
        rows = remediator_.run_pass()
    assert evictions(api) == 1, "asked for once"
    survivor = api.get("pods", "shop", "web-5d8f9-abcde")
    if recreated:
        assert survivor is not None and survivor["metadata"]["uid"].endswith("-again"), "the new Pod stays"
    assert [r for r in rows if r.written] == []
    assert remediator_.metrics.evictions.labels("gone")._value.get() == 1
    assert remediator_.metrics.evictions.labels("error")._value.get() == 0
    said = "another Pod has its name now" if recreated else "deleted meanwhile"
    assert f"Pod/shop/web-5d8f9-abcde: gone since this pass read it ({said}); not evicted" in caplog.messages
    assert KEYS.reservations not in (api.get("nodes", "", "node-cool")["metadata"].get("annotations") or {}), \
        "the room held for its replacement is released"


def test_nodes_gone_from_the_cluster_and_ended_cooldowns_are_forgotten(api):
    clock = [float(int(time.time()))]
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1, node_cooldown_seconds=60,
                                                      workload_cooldown_seconds=60), lambda: clock[0])
    remediator_.run_pass()
    assert evictions(api) == 1 and set(remediator_.node_cooldown) == {"node-hot"}
    assert {"node-hot", "node-cool"} <= set(remediator_.samples) and "node-hot" in remediator_.streaks
    api.delete("nodes", "", "node-hot")
    remediator_.run_pass()
    assert "node-hot" not in remediator_.samples and "node-hot" not in remediator_.streaks
    assert remediator_.node_cooldown == {}, "forgotten with its node, before it ends"
    assert set(remediator_.workload_cooldown) == {"shop/ReplicaSet/web-5d8f9"}, "its Pods may be elsewhere"
    clock[0] += 60
    remediator_.run_pass()
    assert remediator_.workload_cooldown == {}, "forgotten the second it ends"
    utilization = remediator_.metrics.registry.get_sample_value
    assert utilization("oversale_node_real_utilization", {"node": "node-hot", "resource": "cpu"}) is None, \
        "a node deleted while hot is no longer reported hot (its alert would fire for good)"


def test_a_hot_reading_from_a_node_whose_clock_runs_ahead_stops_counting_once_it_stops_changing(api):
    # NodeMetrics are stamped by the node's own clock; node-hot's runs an hour ahead, and
    # metrics-server keeps serving its one hot reading. Three passes 200 s apart (the reading is
    # older than the 180 s limit from the second on) observe it hot once, not three times.
    ahead = format_timestamp(time.time() + 3600)
    api.put("nodemetrics", {**api.get("nodemetrics", "", "node-hot"), "timestamp": ahead})
    now = [time.time()]
    remediator_ = remediator(api, SETTINGS, lambda: now[0])
    for _ in range(3):
        remediator_.run_pass()
        now[0] += 200
    assert evictions(api) == 0
    assert remediator_.streaks.get("node-hot", 0) == 0


def test_a_replacement_planned_for_one_hot_node_keeps_the_next_hot_nodes_pod_off_its_target(api):
    """Inter-Pod affinity reads the replacements planned earlier in the pass too: batch must keep
    off web's hosts, and web's replacement goes to node-cool before node-hot-2 plans."""
    api.put("nodes", node("node-cool", "16", labelled=False))  # room and load for both
    a_second_hot_node(api, "batch-1a2b3-xyzab", ("ReplicaSet", "batch-1a2b3"))
    label_nodes(api, "kubernetes.io/hostname", {n: n for n in ("node-hot", "node-hot-2", "node-cool")})
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert [(r.object, r.proposed) for r in rows if r.proposed] == [
        ("Pod/shop/web-5d8f9-abcde", "node-cool"), ("Pod/shop/batch-1a2b3-xyzab", "node-cool")], "nothing keeps apart"
    batch = api.get("pods", "shop", "batch-1a2b3-xyzab")
    batch["spec"]["affinity"] = apart_from_hosts_of("web")
    api.put("pods", batch)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert [(r.object, r.proposed) for r in rows if r.proposed] == [("Pod/shop/web-5d8f9-abcde", "node-cool")]
    assert {r.object: r.reason for r in rows}["Pod/shop/batch-1a2b3-xyzab"] == (
        "not moved: no node can take it (required pod anti-affinity (kubernetes.io/hostname): "
        "shop/web-5d8f9-abcde (replacement) shares node-cool's kubernetes.io/hostname ...)")


@pytest.mark.parametrize(("limits", "reason"), [
    ({"evictions_per_pass": 2}, "over the limit of 1 evictions here this pass"),
    ({"evictions_per_namespace": 2}, "over the evictions left in shop this pass (1)"),
])
def test_a_second_hot_node_plans_with_what_the_first_left_of_the_pass_and_namespace_limits(api, limits, reason):
    """node-hot-2 is 200m above its watermark, two of its Pods' worth; node-hot's move took one of
    the two evictions the pass, or shop, has."""
    api.put("nodes", node("node-cool", "16", labelled=False))
    a_second_hot_node(api, "batch-1a2b3-xyzab", ("ReplicaSet", "batch-1a2b3"))
    a_second_hot_node(api, "jobs-4c5d6-qwert", ("ReplicaSet", "jobs-4c5d6"))
    for name, cpu in (("batch-1a2b3-xyzab", "150m"), ("jobs-4c5d6-qwert", "140m")):
        api.put("podmetrics", {"metadata": {"name": name, "namespace": "shop"}, "window": "30s",
                               "containers": [{"name": "app", "usage": {"cpu": cpu, "memory": "300Mi"}}]})
    api.put("nodemetrics", {"metadata": {"name": "node-hot-2"}, "window": "30s",
                            "usage": {"cpu": "4000m", "memory": "4Gi"}})
    settings = dataclasses.replace(SETTINGS, hot_observations=1, evictions_per_node=3, evictions_per_pass=5,
                                   evictions_per_namespace=5)
    rows = remediator(api, settings).run_pass(dry_run=True)
    assert len([r for r in rows if r.proposed]) == 3, "without the limit, all three move"
    rows = remediator(api, dataclasses.replace(settings, **limits)).run_pass(dry_run=True)
    assert [r.object for r in rows if r.proposed] == ["Pod/shop/web-5d8f9-abcde", "Pod/shop/batch-1a2b3-xyzab"]
    assert {r.object: r.reason for r in rows}["Pod/shop/jobs-4c5d6-qwert"] == f"not moved: {reason}"


def test_a_reading_metrics_server_has_not_renewed_counts_once_in_a_targets_average(api):
    """metrics-server scrapes on its own clock: a pass may find node-cool's reading it found the
    pass before. Counted again, it would weigh in the 5-minute average twice: node-cool ran at
    4000m, then 1000m, and averages 2500m; with web's 2500m that is 62% of its 8 cores, under its
    65%, where 3000m would make 69%."""
    api.delete("pods", "shop", "api-6f7c8-fghij")  # it would go instead: web is the one to move
    clock = [time.time()]
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1), lambda: clock[0])

    def cool_node_at(cpu: str, scraped: float) -> dict[str, str]:
        stamp = format_timestamp(scraped)
        api.put("nodemetrics", {"metadata": {"name": "node-cool"}, "window": "30s", "timestamp": stamp,
                                "usage": {"cpu": cpu, "memory": "2Gi"}})
        return {r.object: r.reason for r in remediator_.run_pass()}

    first = clock[0]
    cool_node_at("4000m", first)
    clock[0] += 60
    kept = cool_node_at("4000m", first)["Pod/shop/web-5d8f9-abcde"]  # not scraped again
    assert kept.startswith("not moved: no node can take it (cpu usage ") and "(5-min average" in kept, kept
    assert evictions(api) == 0
    clock[0] += 60
    cool_node_at("1000m", clock[0])
    assert evictions(api) == 1 and api.get("pods", "shop", "web-5d8f9-abcde") is None


def test_after_an_eviction_a_node_must_stay_hot_k_observations_again(api):
    """The eviction's effect shows only once the load settles: when node-hot's cooldown ends, its
    streak starts from the eviction, not from before it."""
    clock = [time.time()]
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=2, node_cooldown_seconds=60),
                             lambda: clock[0])
    remediator_.run_pass()
    remediator_.run_pass()
    assert evictions(api) == 1
    clock[0] += 61  # node-hot still reads 3920m: the metrics have not caught up
    reasons = {r.object: r.reason for r in remediator_.run_pass()}
    assert evictions(api) == 1 and reasons["Node/node-hot"].startswith("hot 1/2: "), reasons
    remediator_.run_pass()
    assert evictions(api) == 2 and api.get("pods", "shop", "api-6f7c8-fghij") is None


def test_the_room_held_for_a_replacement_lasts_the_reservation_ttl_then_goes(api):
    """OVERSALE_RESERVATION_TTL: long enough for the ReplicaSet's replacement to be scheduled; a
    hold whose replacement never comes (the workload scaled down meanwhile) goes once it is up."""
    clock = [float(int(time.time()))]  # whole seconds, as the hold's time is written
    remediator_ = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1, reservation_seconds=120),
                             lambda: clock[0])

    def held() -> dict[str, Any]:
        annotations = api.get("nodes", "", "node-cool")["metadata"].get("annotations") or {}
        return json.loads(annotations.get(KEYS.reservations, "{}"))

    remediator_.run_pass()
    assert evictions(api) == 1
    assert held()["shop/ReplicaSet/web-5d8f9"]["until"] == format_timestamp(clock[0] + 120)
    clock[0] += 119
    remediator_.run_pass()
    assert list(held()) == ["shop/ReplicaSet/web-5d8f9"]
    clock[0] += 1
    remediator_.run_pass()
    assert held() == {} and evictions(api) == 1


@pytest.mark.parametrize("ready", ["False", "Unknown"])
def test_a_node_not_ready_is_no_target(api, ready):
    """A NotReady node (its kubelet silent: Unknown) takes no new Pod; kube-scheduler's
    node.kubernetes.io/not-ready taint keeps replacements off it too."""
    cool = api.get("nodes", "", "node-cool")
    cool["status"]["conditions"] = [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]
    api.put("nodes", cool)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert not [r for r in rows if r.proposed]
    cool["status"]["conditions"][1]["status"] = "True"
    api.put("nodes", cool)
    rows = remediator(api, dataclasses.replace(SETTINGS, hot_observations=1)).run_pass(dry_run=True)
    assert [(r.object, r.proposed) for r in rows if r.proposed] == [("Pod/shop/web-5d8f9-abcde", "node-cool")]
