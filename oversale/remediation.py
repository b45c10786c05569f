"""Hot-node remediation: when an oversold node runs hot anyway, which Pods move, and where to.

Overselling bets that usage stays low. Lowering a node's ratio only stops new Pods; the Pods
already there keep the node hot until they leave. So, as the Kubernetes descheduler and
Koordinator's LowNodeLoad do, a node whose **real** usage stays above its *runtime* watermark
(a share of real allocatable, higher than the scheduling watermark) for K consecutive
observations gets Pods evicted, the fewest that bring it back under, and only Pods that another
node can take (Koordinator's PodMigrationJob: room first, then evict). The fit is the extender's
own filter (``oversale.placement``): enough oversold allocatable for the Pod's requests, and its
usage added to the target's load still under that node's scheduling watermark.

Everything here is plain data in, plain data out: the live remediator and the replay call it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from oversale.annotations import AnnotationKeys, AnnotationProblem, parse_switch
from oversale.errors import InvalidAnnotation
from oversale.node_fit import (
    CsiVolume,
    HostPort,
    Neighbours,
    NodeConstraints,
    VolumeAffinity,
    constraint_problem,
    intolerable_soft_taints,
    node_constraints,
    ports_problem,
    preferred_affinity_weight,
    preferred_pod_affinity_weight,
    replacement,
    resources_problem,
    spread_scores,
    volumes_problem,
)
from oversale.placement import NodeHeat, NodeUsage, NodeView, PodDemand, load_shortfall, placement_score, shortfall
from oversale.pods import condition_of, controller_of, is_mirror_or_static, qos_class
from oversale.quantity import CPU, MEMORY, RESOURCES, format_measured
from oversale.timestamps import format_timestamp, parse_timestamp
from oversale.usage import LoadConfig, read_watermarks

CRITICAL_PRIORITY_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})
DO_NOT_DISRUPT = (
    ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),
    ("karpenter.sh/do-not-disrupt", "true"),
    ("karpenter.sh/do-not-evict", "true"),  # Karpenter's name for it before v0.32
)
"""Annotations by which a Pod's team has already told the node autoscalers not to evict it
(cluster-autoscaler's FAQ, "What types of pods can prevent CA from removing a node?"; Karpenter's
pod-level disruption controls). Both tools compare the value as an exact string, and so does this."""
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""Pods at or above this priority are the cluster's own (kube-system's critical classes)."""
_QOS_ORDER = {"BestEffort": 0, "Burstable": 1, "Guaranteed": 2}


@dataclass(frozen=True)
class RuntimeWatermarks:
    """Shares of real allocatable above which a node counts as hot (per node by annotation or label)."""

    cpu: Decimal = Decimal("0.95")
    memory: Decimal = Decimal("0.90")


@dataclass(frozen=True)
class RemediationConfig:
    """Knobs of remediation (``oversale.settings.Settings`` reads them)."""

    watermarks: RuntimeWatermarks = RuntimeWatermarks()
    observations: int = 10
    """Consecutive hot observations before a node is remediated (a spike is not a trend)."""
    min_pod_age_seconds: float = 600.0
    min_replicas: int = 1
    """A Pod whose controller has fewer Ready Pods than this is not evicted (1: any may be)."""
    max_per_node: int = 1
    """Evictions per node per pass."""
    max_per_namespace: int = 2
    """Evictions per namespace per pass."""
    max_per_pass: int = 5
    node_cooldown_seconds: float = 600.0
    """After an eviction, a node is left alone this long (its load settles first)."""
    workload_cooldown_seconds: float = 1800.0
    """After an eviction, the workload's other Pods are left alone this long."""
    interval_seconds: float = 60.0
    """Time between observations (the replay turns observations and cooldowns into its samples)."""
    taint_hot_nodes: bool = True
    """Taint a node evicted from ``PreferNoSchedule`` for its cooldown (see :func:`with_hot_taint`)."""


def runtime_watermarks_for(labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None,
                           keys: AnnotationKeys, defaults: RuntimeWatermarks
                           ) -> tuple[RuntimeWatermarks, list[AnnotationProblem]]:
    """A node's runtime watermarks: its annotation, else its label, else the defaults."""
    values, problems = read_watermarks(labels, annotations, {keys.cpu_runtime_watermark: defaults.cpu,
                                                             keys.memory_runtime_watermark: defaults.memory})
    return RuntimeWatermarks(*values), problems


def excess(usage: Mapping[str, float], real: Mapping[str, int], watermarks: RuntimeWatermarks) -> dict[str, float]:
    """Resource -> how much usage is above the runtime watermark (only resources above it)."""
    over = {}
    for resource, watermark in ((CPU, watermarks.cpu), (MEMORY, watermarks.memory)):
        capacity = real.get(resource, 0)
        if capacity > 0 and usage.get(resource, 0.0) > capacity * float(watermark):
            over[resource] = usage.get(resource, 0.0) - capacity * float(watermark)
    return over


def hot_reason(usage: Mapping[str, float], real: Mapping[str, int], watermarks: RuntimeWatermarks) -> str | None:
    """Why one observation of a node counts as hot, or None."""
    for resource, watermark in ((CPU, watermarks.cpu), (MEMORY, watermarks.memory)):
        capacity = real.get(resource, 0)
        if resource in excess(usage, real, watermarks):
            return (f"{resource} usage {usage[resource] / capacity:.0%} of real capacity is above the runtime "
                    f"watermark {float(watermark):.0%}")
    return None


def next_streak(streak: int, hot: bool) -> int:
    """Consecutive hot observations after one more: a cool one starts over."""
    return streak + 1 if hot else 0


def eviction_exclusion(pod: Mapping[str, Any], keys: AnnotationKeys, now: float, min_age_seconds: float,
                       ready_replicas: int | None = None, min_replicas: int = 1) -> str | None:
    """Why a Pod must not be evicted, or None: the descheduler's safety rules, plus an opt-out.

    ``ready_replicas`` is how many Ready Pods its controller has now (itself included); with
    ``min_replicas`` above 1, fewer keep it, as the descheduler's DefaultEvictor ``minReplicas``."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations = metadata.get("annotations") or {}
    choice = annotations.get(keys.evictable)
    try:
        allowed = parse_switch(choice) if choice is not None else None
    except InvalidAnnotation:
        return f"annotation {keys.evictable}={choice!r} is not y or n (kept, to be safe)"
    if allowed is False:
        return f"opted out ({keys.evictable}: n)"
    if allowed is None:
        # Our own annotation, when set, is the more specific word: y overrides these.
        for key, value in DO_NOT_DISRUPT:
            if annotations.get(key) == value:
                return f"{key}: {value!r} ({keys.evictable}: y overrides it)"
    if metadata.get("deletionTimestamp") or status.get("phase") != "Running":
        return "not running"
    if is_mirror_or_static(pod):
        return "static Pod"
    owner = controller_of(metadata)
    if owner is None:
        return "no controller would recreate it"
    if owner[0] == "DaemonSet":
        return "DaemonSet Pod (it would come back on the same node)"
    # The descheduler evicts a Job's Pods like any other. But its replacement starts the work
    # over, and the Job controller counts the evicted Pod as failed against backoffLimit unless the
    # Job's podFailurePolicy ignores the DisruptionTarget condition: with backoffLimit 0, one move
    # fails the whole Job. A service replica's replacement costs a restart; this costs the work.
    if owner[0] == "Job" and allowed is not True:
        return (f"Job Pod (its replacement starts the work over, and the eviction counts against the Job's "
                f"backoffLimit; {keys.evictable}: y allows it)")
    # Evicting a workload's last Ready replica is an outage until its replacement is Ready. The
    # Eviction API prevents that only where a PodDisruptionBudget says so, and single-replica
    # workloads seldom have one.
    if min_replicas > 1 and ready_replicas is not None and ready_replicas < min_replicas and allowed is not True:
        return (f"{ready_replicas} Ready replica(s) of {owner[0]}/{owner[1]}, fewer than the {min_replicas} "
                f"remediation needs to move one ({keys.evictable}: y allows it)")
    if spec.get("priorityClassName") in CRITICAL_PRIORITY_CLASSES or \
            int(spec.get("priority") or 0) >= SYSTEM_CRITICAL_PRIORITY:
        return f"critical priority ({spec.get('priorityClassName') or spec.get('priority')})"
    # A claim's devices are allocated from ResourceSlices this remediator does not read: it cannot
    # tell whether any other node has them free, and a replacement without them waits Pending.
    if spec.get("resourceClaims") and allowed is not True:
        return f"DRA resource claims (no other node is known to have their devices; {keys.evictable}: y allows it)"
    local = [v.get("name") for v in spec.get("volumes") or [] if "emptyDir" in v or "hostPath" in v]
    if local and allowed is not True:
        return f"local storage ({', '.join(map(str, local))}; {keys.evictable}: y allows it)"
    started = parse_timestamp(status.get("startTime") or metadata.get("creationTimestamp"))
    if started is not None and now - started < min_age_seconds:
        return f"started {now - started:.0f}s ago (minimum age {min_age_seconds:.0f}s)"
    return None


def serving_replica_of(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, kind, name) of the controller of a Pod that serves now (Running, Ready, not
    being deleted: what a PodDisruptionBudget counts as healthy), or None for any other Pod.

    >>> serving_replica_of({"metadata": {"namespace": "shop", "ownerReferences": [
    ...     {"kind": "ReplicaSet", "name": "web-5d8f9", "controller": True}]},
    ...     "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    ('shop', 'ReplicaSet', 'web-5d8f9')
    """
    metadata = pod.get("metadata") or {}
    owner = controller_of(metadata)
    if owner is None or metadata.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Running" \
            or condition_of(pod, "Ready") is None:
        return None
    return str(metadata.get("namespace", "")), *owner


@dataclass(frozen=True)
class Candidate:
    """A Pod that may be evicted from a hot node."""

    name: str
    """``namespace/name``."""
    namespace: str
    workload: str
    """``namespace/Kind/name`` of its controller: what the replacement Pod will share."""
    qos: str
    demand: PodDemand
    usage: Mapping[str, float]
    """Its current usage (millicores, bytes)."""
    constraints: NodeConstraints = field(default_factory=NodeConstraints)
    """What its replacement will ask of a node's labels and taints, its volumes' included (the
    replay's workloads ask nothing)."""

    @property
    def overuse(self) -> float:
        """How far above its cpu request it runs (the heavier resource decides ties)."""
        return self.usage.get(CPU, 0.0) - self.demand.requests.get(CPU, 0)


def candidate(pod: Mapping[str, Any], demand: PodDemand, usage: Mapping[str, float],
              volumes: tuple[VolumeAffinity, ...] = (), csi_volumes: tuple[CsiVolume, ...] = ()) -> Candidate:
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    kind, owner = controller_of(metadata) or ("", "")
    return Candidate(f"{namespace}/{metadata.get('name', '')}", namespace, f"{namespace}/{kind}/{owner}",
                     qos_class(pod), demand, usage, node_constraints(pod, volumes, csi_volumes))


@dataclass
class Target:
    """A node a Pod may move to: what the extender knows of it."""

    view: NodeView
    usage: NodeUsage
    heat: NodeHeat | None
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Any, ...] = ()
    free: Mapping[str, int] | None = None
    """What it has left besides cpu and memory (``oversale.node_fit.free_resources``; None: not
    known, as for the replay's nodes, whose Pods take nothing else)."""
    ports: frozenset[HostPort] | None = None
    """The host ports its Pods bind (None: not known, as for the replay's nodes)."""
    attached: Mapping[str, frozenset[str]] | None = None
    """Driver -> the CSI volumes attached to it (``oversale.node_fit.attached_volumes``; None:
    not known, as for the replay's nodes, or not read this pass)."""
    volume_limits: Mapping[str, int] = field(default_factory=dict)
    """Driver -> how many volumes it may attach here (``oversale.node_fit.volume_limits``)."""

    def taking(self, moved: Candidate) -> Target:
        """This node after a Pod moved here (its requests taken, its usage pending in the load)."""
        shared = {r: self.usage.shared.get(r, 0) + moved.demand.requests.get(r, 0) for r in RESOURCES}
        heat = self.heat.adding(moved.usage) if self.heat is not None else None
        free = self.free
        if free is not None:
            free = {**free, **{r: free.get(r, 0) - amount for r, amount in moved.constraints.resources.items()}}
        ports = self.ports | frozenset(moved.constraints.host_ports) if self.ports is not None else None
        attached = self.attached
        if attached is not None and moved.constraints.csi_volumes:
            attached = dict(attached)
            for volume in moved.constraints.csi_volumes:
                attached[volume.driver] = attached.get(volume.driver, frozenset()) | {volume.volume}
        return replace(self, usage=NodeUsage(shared, set(self.usage.bound_cpus), self.usage.bound_memory), heat=heat,
                       free=free, ports=ports, attached=attached)


@dataclass(frozen=True)
class Move:
    pod: Candidate
    target: str
    reason: str


@dataclass
class MovePlan:
    moves: list[Move] = field(default_factory=list)
    kept: list[tuple[Candidate, str]] = field(default_factory=list)
    """Candidates not moved, and why (no node can take it, a limit)."""
    uncovered: dict[str, float] = field(default_factory=dict)
    """Excess the moves do not remove (more next pass)."""


def target_for(pod: Candidate, targets: Sequence[Target], config: LoadConfig,
               neighbours: Neighbours | None = None) -> tuple[int | None, str]:
    """The index of the best node that can take ``pod`` (the extender's filter and score, with the
    Pod's *current usage* as its load), or None and why none can. Nodes with fewer
    ``PreferNoSchedule`` taints the Pod does not tolerate come first, as kube-scheduler's
    TaintToleration score ranks them, then those its preferences weigh most: its preferred node
    affinity (NodeAffinity's score) and, with ``neighbours``, its preferred inter-Pod affinity and
    anti-affinity and the running Pods' terms that select it (InterPodAffinity's), and how few
    Pods its ``ScheduleAnyway`` spread constraints, or the default spreading of its controller's
    Pods, count there (PodTopologySpread's), each normalized over the nodes that can take it as
    those plugins normalize it, and summed, as all three weigh 2 (the highest weights of
    kube-scheduler's default score plugins, 3 and 2, against 1 for resources): room held on a
    node it ranks low would seldom be taken."""
    # index, soft taints, node affinity, Pod affinity, score
    feasible: list[tuple[int, int, int, int, int]] = []
    constraints = pod.constraints
    reasons = []
    for index, target in enumerate(targets):
        if (why := _cannot_take(target, pod, config, neighbours)) is not None:
            reasons.append(why)
            continue
        name = target.view.name
        feasible.append((index, intolerable_soft_taints(constraints, target.taints),
                         preferred_affinity_weight(constraints, name, target.labels),
                         preferred_pod_affinity_weight(constraints, name, neighbours) if neighbours is not None else 0,
                         placement_score(target.view, target.usage, pod.demand, target.heat, config,
                                         dict(pod.usage))))
    if not feasible:
        return None, "no node can take it" + (f" ({reasons[0]}{' ...' if len(reasons) > 1 else ''})"
                                              if reasons else " (no other node)")
    # PodTopologySpread weighs its domains by how many the nodes that can take the Pod span.
    crowding = (spread_scores(constraints, [targets[f[0]].view.name for f in feasible], neighbours)
                if neighbours is not None else [0] * len(feasible))
    # NodeAffinity scales its sums by the highest; InterPodAffinity maps its lowest to 0 and its
    # highest to the most (its sums may be negative); PodTopologySpread gives (most + fewest - s) /
    # most of the most, and a node it ignores (a key missing) nothing.
    top = max(f[2] for f in feasible)
    low, high = min(f[3] for f in feasible), max(f[3] for f in feasible)
    counted = [c for c in crowding if c is not None]
    fewest, most = min(counted, default=0), max(counted, default=0)

    def rank(position: int) -> tuple[int, float, int]:
        _, soft_taints, node_weight, pod_weight, score = feasible[position]
        spread = crowding[position]
        preference = ((node_weight / top if top > 0 else 0.0)
                      + ((pod_weight - low) / (high - low) if high > low else 0.0)
                      + (0.0 if spread is None else (most + fewest - spread) / most if most > 0 else 1.0))
        return -soft_taints, preference, score

    return feasible[max(range(len(feasible)), key=rank)][0], ""


def _cannot_take(target: Target, pod: Candidate, config: LoadConfig, neighbours: Neighbours | None) -> str | None:
    """Why ``target`` cannot take ``pod`` (the extender's filter, with the Pod's current usage
    added to the node's pending load), or None where it can."""
    name = target.view.name
    why = (constraint_problem(pod.constraints, name, target.labels, target.taints, neighbours)
           or (resources_problem(pod.constraints.resources, target.free, name) if target.free is not None else None)
           or (ports_problem(pod.constraints.host_ports, target.ports, name) if target.ports is not None else None)
           or (volumes_problem(pod.constraints.csi_volumes, target.attached, target.volume_limits, name)
               if target.attached is not None else None)
           or shortfall(target.view, target.usage, pod.demand))
    if why is None and target.heat is not None:
        why = load_shortfall(target.view, target.heat.adding(pod.usage), config)
    return why


def eviction_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """BestEffort first, then Burstable Pods using most above their request, Guaranteed last."""
    return sorted(candidates, key=lambda c: (_QOS_ORDER.get(c.qos, 1), -c.overuse, c.name))


def plan_moves(over: Mapping[str, float], candidates: Iterable[Candidate], targets: Sequence[Target],
               config: LoadConfig, allowed: int, neighbours: Neighbours | None = None,
               namespace_room: Mapping[str, int] | None = None) -> MovePlan:
    """The fewest Pods, in eviction order, whose usage covers the node's excess over its runtime
    watermark, each with a node that can take it; at most ``allowed`` of them. With
    ``neighbours`` (the running Pods), inter-Pod affinity has its say in "can take it".

    The moves of one plan reckon with each other as those of later plans do: one Pod per
    workload (the others wait out its cooldown), no more in a namespace than ``namespace_room``
    leaves (namespace -> evictions left this pass; absent: no limit), and each replacement is
    a neighbour of the moves after it.

    Greedy in eviction order, then a Pod whose usage is not needed to cover the excess is dropped
    again (the least preferred first), so a large Pod found late replaces the small ones before it.
    A dropped Pod may have held others back (its workload's, its namespace's share): then the
    choice is made again without it, so a BestEffort Pod of the same workload is not passed over
    for a Guaranteed one because of a move that never happens. The Pods that stay chosen then get
    their targets again, in order, as if the dropped ones had never been chosen: room a dropped
    Pod took on the way is not lost to the others.
    """
    ordered = eviction_order(candidates)
    dropped: set[str] = set()
    while True:
        choice = _choose(over, [p for p in ordered if p.name not in dropped], targets, config, neighbours,
                         namespace_room)
        if not choice.dropped or not choice.held_back:
            break
        dropped |= {p.name for p in choice.dropped}  # each round drops at least one more Pod: it ends
    plan = MovePlan(kept=choice.kept)
    remaining = choice.remaining
    left_out = [(pod, f"over the limit of {allowed} evictions here this pass") for pod in choice.chosen[allowed:]]
    final_targets, final = list(targets), neighbours.fork() if neighbours is not None else None
    for pod in choice.chosen[:allowed]:
        target, why = _take(pod, final_targets, config, final)
        if target is None:
            left_out.append((pod, why))
        else:
            plan.moves.append(Move(pod, target, _covers(pod, over)))
    for pod, why in left_out:
        plan.kept.append((pod, why))
        for resource in remaining:
            remaining[resource] += pod.usage.get(resource, 0.0)
    plan.uncovered = {r: v for r, v in remaining.items() if v > 0}
    return plan


@dataclass
class _Choice:
    """One greedy round of :func:`plan_moves`."""

    chosen: list[Candidate]
    dropped: list[Candidate]
    """Chosen, then found not needed to cover the excess."""
    kept: list[tuple[Candidate, str]]
    remaining: dict[str, float]
    """The excess the chosen Pods leave."""
    held_back: bool
    """Some Pod was kept because of one chosen before it (its workload's, its namespace's share)."""


def _choose(over: Mapping[str, float], ordered: Sequence[Candidate], targets: Sequence[Target], config: LoadConfig,
            neighbours: Neighbours | None, namespace_room: Mapping[str, int] | None) -> _Choice:
    remaining = dict(over)
    chosen: list[Candidate] = []
    kept: list[tuple[Candidate, str]] = []
    held_back = False
    trial_targets, trial = list(targets), neighbours.fork() if neighbours is not None else None
    for pod in ordered:
        if all(v <= 0 for v in remaining.values()):
            break
        if not any(pod.usage.get(r, 0.0) > 0 for r, v in remaining.items() if v > 0):
            continue  # it would not cool what is hot
        why = _held_back(pod, chosen, namespace_room)
        held_back = held_back or why is not None
        if why is None:
            why = _take(pod, trial_targets, config, trial)[1]
        if why:
            kept.append((pod, why))
            continue
        chosen.append(pod)
        for resource in remaining:
            remaining[resource] -= pod.usage.get(resource, 0.0)
    dropped = []
    for pod in reversed(list(chosen)):
        if all(remaining.get(r, 0.0) + pod.usage.get(r, 0.0) <= 0 for r in remaining):
            chosen.remove(pod)
            dropped.append(pod)
            for resource in remaining:
                remaining[resource] += pod.usage.get(resource, 0.0)
    return _Choice(chosen, dropped, kept, remaining, held_back)


def _held_back(pod: Candidate, chosen: Sequence[Candidate], namespace_room: Mapping[str, int] | None) -> str | None:
    """Why the moves already chosen in this plan keep ``pod`` where it is, or None."""
    if any(other.workload == pod.workload for other in chosen):
        return f"another Pod of {pod.workload} was chosen before it (one per workload)"
    room = (namespace_room or {}).get(pod.namespace)
    if room is not None and sum(other.namespace == pod.namespace for other in chosen) >= room:
        return f"over the evictions left in {pod.namespace} this pass ({room})"
    return None


def _take(pod: Candidate, targets: list[Target], config: LoadConfig,
          neighbours: Neighbours | None) -> tuple[str | None, str]:
    """Send ``pod`` to the best of ``targets``: that target takes its room and load, and its
    replacement joins ``neighbours``. The target's name, or None and why no node can take it."""
    index, why = target_for(pod, targets, config, neighbours)
    if index is None:
        return None, why
    name = targets[index].view.name
    targets[index] = targets[index].taking(pod)
    if neighbours is not None:
        neighbours.place(replacement(pod.constraints, name))
    return name, ""


def _covers(pod: Candidate, over: Mapping[str, float]) -> str:
    parts = [f"uses {format_measured(r, pod.usage.get(r, 0.0))} {r}, "
             f"{format_measured(r, over[r])} above the watermark" for r in over]
    return f"{pod.qos}, " + "; ".join(parts)


@dataclass(frozen=True)
class Cooldowns:
    """When a node's cooldown after an eviction ends, and those of the workloads moved off it
    (Unix seconds). Kept in the remediator's memory and, so that a replica taking the Lease over
    (a rollout, a crash) does not judge the node or move the workloads again at once, on the node."""

    node: float | None = None
    workloads: Mapping[str, float] = field(default_factory=dict)

    def merged(self, other: Cooldowns) -> Cooldowns:
        """Each cooldown at the later of its two ends."""
        node = max((t for t in (self.node, other.node) if t is not None), default=None)
        workloads = dict(self.workloads)
        for workload, until in other.workloads.items():
            workloads[workload] = max(until, workloads.get(workload, until))
        return Cooldowns(node, workloads)

    def after(self, now: float) -> Cooldowns:
        """Only the cooldowns still running at ``now``."""
        return Cooldowns(self.node if self.node is not None and self.node > now else None,
                         {w: until for w, until in self.workloads.items() if until > now})


def read_cooldowns(annotations: Mapping[str, str] | None, keys: AnnotationKeys) -> Cooldowns:
    """The cooldowns recorded on a node (:attr:`AnnotationKeys.remediation_cooldowns`); a record
    that cannot be read holds none, as an unreadable reservation holds no room.

    >>> keys = AnnotationKeys()
    >>> text = '{"node": "2026-12-01T10:10:00Z", "workloads": {"shop/ReplicaSet/web-5d8f9": "2026-12-01T10:30:00Z"}}'
    >>> read_cooldowns({keys.remediation_cooldowns: text}, keys)
    Cooldowns(node=1796119800.0, workloads={'shop/ReplicaSet/web-5d8f9': 1796121000.0})
    >>> read_cooldowns({keys.remediation_cooldowns: "[1]"}, keys)
    Cooldowns(node=None, workloads={})
    """
    text = (annotations or {}).get(keys.remediation_cooldowns)
    try:
        record = json.loads(text) if text else {}
    except ValueError:
        return Cooldowns()
    if not isinstance(record, dict):
        return Cooldowns()
    workloads = record.get("workloads")
    return Cooldowns(parse_timestamp(record.get("node")),
                     {w: until for w, t in workloads.items() if (until := parse_timestamp(t)) is not None}
                     if isinstance(workloads, dict) else {})


def cooldowns_text(cooldowns: Cooldowns) -> str | None:
    """The annotation's value for ``cooldowns`` (None: nothing to record, the annotation removed)."""
    if cooldowns.node is None and not cooldowns.workloads:
        return None
    # Whole seconds, rounded up: a cooldown read back never ends before it would have.
    record: dict[str, Any] = {}
    if cooldowns.node is not None:
        record["node"] = format_timestamp(math.ceil(cooldowns.node))
    if cooldowns.workloads:
        record["workloads"] = {w: format_timestamp(math.ceil(t)) for w, t in sorted(cooldowns.workloads.items())}
    return json.dumps(record, sort_keys=True)


HOT_TAINT_EFFECT = "PreferNoSchedule"


def with_hot_taint(taints: Sequence[Mapping[str, Any]], key: str, until: float | None) -> list[dict[str, Any]]:
    """A node's taints with the remediator's hot-node taint lasting until ``until`` (Unix seconds;
    None: without it).

    The room a move holds on its target steers only replacements that the ``oversale`` profile
    places (its extender honours the hold). Any other scheduler (``default-scheduler``, most Pods)
    sees the hot node with the evicted Pod's requests free again, and its resource scores may well
    send the replacement straight back, to be moved again after the cooldowns. A
    ``PreferNoSchedule`` taint that no Pod tolerates is a score, not a filter: every
    kube-scheduler's TaintToleration plugin scores the node lowest, at the largest weight of the
    default plugins (3), and nothing is kept off it that has nowhere else to go, DaemonSet Pods
    included. The value says until when, so a taint a stopped remediator left behind is still
    recognised as expired and removed by the next one.
    """
    kept = [dict(taint) for taint in taints if taint.get("key") != key]
    if until is not None:
        kept.append({"key": key, "value": str(int(until)), "effect": HOT_TAINT_EFFECT})
    return kept


def hot_taint_expired(taints: Sequence[Mapping[str, Any]], key: str, now: float) -> bool:
    """Whether the node carries the remediator's hot-node taint and its time is up (a value that is
    not a time counts as up)."""
    for taint in taints:
        if taint.get("key") == key:
            try:
                return float(str(taint.get("value", ""))) <= now
            except ValueError:
                return True
    return False
