"""Scheduling Pods onto oversold nodes: what a node can still take, and how well a Pod fits.

Shared Pods draw on the node's *oversold* allocatable (as the webhook stores it). Bound Pods get
exclusive CPUs from the node's *real* topology (``oversale.cpus``), and each exclusive CPU is also
charged against the oversold pool at ``1 core x ratio``: k real cores are k x ratio of the oversold
allocatable, so exclusive CPUs never draw on capacity that exists only on paper.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from oversale.annotations import AnnotationKeys, AnnotationProblem, current_ratio
from oversale.cpus import (
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    SINGLE_NUMA_NODE,
    FreeSummary,
    NoFit,
    Placement,
    Topology,
    bind_policy,
    parse_cpuset,
    place,
    topology_from_node,
)
from oversale.disruption import Allowances, DisruptionBudget
from oversale.errors import QuantityError
from oversale.node_oversale import applied_ratios, real_allocatable_of
from oversale.pods import controller_of, effective_request, scheduled_request, workload_of
from oversale.quantity import CPU, MEMORY, RESOURCES, format_amount, parse_amount
from oversale.timestamps import parse_timestamp
from oversale.usage import (
    DEFAULT_WATERMARKS,
    LoadConfig,
    NodeLoad,
    Watermarks,
    combined_score,
    estimated_usage,
    hot_reason,
    load_score_after,
    watermark_exceeded,
    watermarks_for,
)

KOORDINATOR_TOPOLOGY = "node.koordinator.sh/cpu-topology"


@dataclass(frozen=True)
class Reservation:
    """Room the remediator holds on a node for the replacement of a Pod it evicts (Koordinator's
    PodMigrationJob idea): Pods of other owners cannot take it until it expires."""

    owner: str
    """``namespace/Kind/name`` of the evicted Pod's controller (the replacement shares it)."""
    requests: Mapping[str, int]
    until: float


@dataclass(frozen=True)
class NodeView:
    """What the extender knows of one node."""

    name: str
    allocatable: Mapping[str, int]
    """Oversold allocatable as stored on the Node (millicores, bytes)."""
    cpu_ratio: Decimal
    topology: Topology
    bind_policy: str | None = None
    """A node label requiring binding of integer-CPU Pods, with this policy."""
    single_numa: bool = False
    strategy: str = MOST_ALLOCATED
    ratio: Fraction = Fraction(1)
    """``cpu_ratio`` as an exact fraction (computed once: this is on the filter's hot path)."""
    real: Mapping[str, int] = field(default_factory=dict)
    """Real allocatable (the kubelet's values, from the node webhook's record)."""
    watermarks: Watermarks = DEFAULT_WATERMARKS
    reservations: tuple[Reservation, ...] = ()
    problems: tuple[AnnotationProblem, ...] = ()
    """Annotations and labels of the node that were there but ignored (unreadable)."""

    def held_for_others(self, owner: str, now: float | None) -> tuple[int, int]:
        """(cpu, memory) reserved for other owners and not expired at ``now`` (None: all count)."""
        cpu = memory = 0
        for reservation in self.reservations:
            if reservation.owner != owner and (now is None or reservation.until > now):
                cpu += reservation.requests.get(CPU, 0)
                memory += reservation.requests.get(MEMORY, 0)
        return cpu, memory

    def holds_for(self, owner: str, now: float | None) -> bool:
        return bool(owner) and any(r.owner == owner and (now is None or r.until > now) for r in self.reservations)


@dataclass(frozen=True)
class PodDemand:
    """What placing one Pod asks of a node (:func:`pod_demand`): its requests as kube-scheduler
    counts them and the exclusive CPUs it wants."""

    uid: str
    requests: Mapping[str, int]
    bind_policy: str | None
    """The Pod's own binding request (FullPCPUs or SpreadByPCPUs), if any."""
    single_numa: bool
    cpus: int = 0
    """Whole CPUs asked for when the CPU request is an integer (0 otherwise: never bound)."""
    owner: str = ""
    """``namespace/Kind/name`` of the Pod's controller (what a reservation is held for)."""
    priority: int = 0
    """``spec.priority`` (set from the PriorityClass at admission): who may preempt whom."""
    workload: str = ""
    """``namespace/Kind/name`` of its workload (``workload_of``: a Deployment rather than its
    ReplicaSet), whose Pods in the metrics say what it will use (``pod_estimate``)."""

    @property
    def overhead_cpu(self) -> int:
        """Millicores of a bound Pod's request beyond its whole CPUs: its RuntimeClass overhead,
        which runs in the Pod's sandbox rather than on its cpuset, so it draws on the shared pool."""
        return max(0, self.requests.get(CPU, 0) - 1000 * self.cpus) if self.cpus else 0

    def binding_on(self, node: NodeView) -> str | None:
        """The policy under which this Pod gets a cpuset on ``node`` (None: a shared Pod)."""
        policy = self.bind_policy or node.bind_policy
        return policy if policy and self.cpus else None


@dataclass
class NodeUsage:
    """What the Pods on a node already take."""

    shared: dict[str, int] = field(default_factory=dict)
    bound_cpus: set[int] = field(default_factory=set)
    bound_memory: int = 0
    # The caches below are per usage snapshot and per view of the node: with nodeCacheCapable
    # false, kube-scheduler sends its own Node objects, which may be newer than the extender's
    # cache (a ratio lowered a moment ago), and are judged on the cached usage snapshot, outside
    # its lock. Each holds (what it was counted for, the figures) in one attribute, so a thread
    # never reads one view's figures under another view's key.
    _summary: tuple[Topology, FreeSummary] | None = None
    _free: tuple[NodeView, tuple[int, int]] | None = None
    _answers: tuple[NodeView, dict[tuple[int, str | None, bool, int, int], tuple[str | None, int]]] | None = None
    """(the node, (``shortfall``, packing score) per Pod shape) (see ``fit_on``)."""

    def summary(self, topology: Topology) -> FreeSummary:
        """Free CPUs and whole cores per zone (computed once per usage snapshot and topology)."""
        cached = self._summary
        if cached is None or (cached[0] is not topology and cached[0] != topology):
            cached = self._summary = (topology, FreeSummary.of(topology, self.bound_cpus))
        return cached[1]


def held_usage(held: Iterable[tuple[Mapping[str, int], Sequence[int]]]) -> NodeUsage:
    """What Pods take on their node, each given as (requests, exclusive CPUs): a Pod with a cpuset
    holds those CPUs and its memory request, a shared one its requests.

    >>> usage = held_usage([({"cpu": 2000, "memory": 2**30}, (0, 1)), ({"cpu": 500, "memory": 2**20}, ())])
    >>> sorted(usage.bound_cpus), usage.bound_memory, usage.shared
    ([0, 1], 1073741824, {'cpu': 500, 'memory': 1048576})
    """
    usage = NodeUsage()
    for requests, cpus in held:
        hold(usage, requests, cpus)
    return usage


def hold(usage: NodeUsage, requests: Mapping[str, int], cpus: Sequence[int]) -> None:
    """Add one Pod's hold to ``usage`` (see :func:`held_usage`)."""
    if cpus:
        usage.bound_cpus.update(cpus)
        usage.bound_memory += requests.get(MEMORY, 0)
        if (overhead := requests.get(CPU, 0) - 1000 * len(cpus)) > 0:  # see PodDemand.overhead_cpu
            usage.shared[CPU] = usage.shared.get(CPU, 0) + overhead
    else:
        for resource in RESOURCES:
            usage.shared[resource] = usage.shared.get(resource, 0) + requests.get(resource, 0)


def bound_cpus_of(pod: Mapping[str, Any], keys: AnnotationKeys) -> tuple[int, ...]:
    """The exclusive CPUs the extender gave a Pod at its bind (the cpuset of its
    ``resource-status`` annotation); none for a shared Pod, or for an annotation it cannot read.

    >>> bound_cpus_of({"metadata": {"annotations": {"stke.platform/resource-status": '{"cpuset": "0-1,8"}'}}},
    ...               AnnotationKeys())
    (0, 1, 8)
    >>> bound_cpus_of({"metadata": {"annotations": {"stke.platform/resource-status": '{"cpuset": "x"}'}}},
    ...               AnnotationKeys())
    ()
    """
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.resource_status)
    if not text:
        return ()
    try:
        return tuple(parse_cpuset(str(json.loads(text)["cpuset"])))
    except (ValueError, KeyError, TypeError):
        return ()


def node_view(node: Mapping[str, Any], keys: AnnotationKeys, nrt_zones: Mapping[int, int] | None = None,
              watermarks: Watermarks = DEFAULT_WATERMARKS) -> NodeView:
    """What placement needs of a Node: its allocatable as reported (oversold), its real one and
    ratio (the node webhook's record), its CPU topology (``nrt_zones``: NUMA zone -> CPU count,
    from a NodeResourceTopology), binding policy, watermarks and reservations, from its labels and
    annotations."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    real = real_allocatable_of(node, keys)
    applied = applied_ratios(annotations, keys)
    ratio = current_ratio({keys.cpu_oversale_ratio: applied[CPU]} if CPU in applied else {}, keys.cpu_oversale_ratio)
    topology, topology_problems = topology_from_node(node, (keys.cpu_topology, KOORDINATOR_TOPOLOGY),
                                                     real.get(CPU, 0) // 1000, nrt_zones)
    node_watermarks, watermark_problems = watermarks_for(labels, annotations, keys, watermarks)
    return NodeView(
        name=str(metadata.get("name", "")),
        allocatable={r: parse_amount(r, allocatable[r]) for r in RESOURCES if r in allocatable},
        cpu_ratio=ratio,
        ratio=Fraction(ratio),
        topology=topology,
        bind_policy=bind_policy(labels.get(keys.cpu_bind_policy)),
        single_numa=labels.get(keys.numa_topology_policy) == SINGLE_NUMA_NODE,
        strategy=LEAST_ALLOCATED if labels.get(keys.numa_allocate_strategy) == LEAST_ALLOCATED else MOST_ALLOCATED,
        real=real,
        watermarks=node_watermarks,
        reservations=reservations_of(annotations, keys),
        problems=(*topology_problems, *watermark_problems),
    )


def held_reservations(annotations: Mapping[str, str], keys: AnnotationKeys) -> dict[str, dict[str, Any]]:
    """A Node's reservations annotation as written: owner -> ``{"cpu", "memory", "until"}``. An
    unreadable annotation, or entry, holds nothing: a reservation can only make room, never block
    scheduling.

    >>> keys = AnnotationKeys()
    >>> held_reservations({keys.reservations: '{"shop/ReplicaSet/web": {"cpu": "500m"}, "x": 3}'}, keys)
    {'shop/ReplicaSet/web': {'cpu': '500m'}}
    >>> held_reservations({keys.reservations: "[1]"}, keys)
    {}
    """
    try:
        held = json.loads(annotations.get(keys.reservations) or "{}")
    except ValueError:
        return {}
    if not isinstance(held, dict):
        return {}
    return {str(owner): value for owner, value in held.items() if isinstance(value, dict)}


def reservations_of(annotations: Mapping[str, str], keys: AnnotationKeys) -> tuple[Reservation, ...]:
    """The reservations a Node's annotation holds (see :func:`held_reservations`)."""
    try:
        return tuple(Reservation(owner, {r: parse_amount(r, value[r]) for r in RESOURCES if r in value},
                                 parse_timestamp(value.get("until")) or 0.0)
                     for owner, value in held_reservations(annotations, keys).items())
    except (ValueError, AttributeError, TypeError, QuantityError):
        return ()


def pod_demand(pod: Mapping[str, Any], keys: AnnotationKeys) -> PodDemand:
    """The Pod's :class:`PodDemand`, from its spec and annotations."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    controller = controller_of(metadata)
    requests = {r: scheduled_request(pod, r) for r in RESOURCES}
    # Whole CPUs come from the containers' request: a RuntimeClass overhead (Kata, gVisor) is the
    # sandbox's, not theirs, and would otherwise make 4 cores read as 4250m and never be bound.
    cpu = effective_request(pod, CPU)
    return PodDemand(
        uid=str((pod.get("metadata") or {}).get("uid", "")),
        requests=requests,
        bind_policy=bind_policy(annotations.get(keys.cpu_bind_policy)),
        single_numa=annotations.get(keys.numa_topology_policy) == SINGLE_NUMA_NODE,
        cpus=cpu // 1000 if cpu > 0 and cpu % 1000 == 0 else 0,
        owner=f"{metadata.get('namespace', '')}/{controller[0]}/{controller[1]}" if controller else "",
        priority=priority if isinstance(priority := (pod.get("spec") or {}).get("priority"), int) else 0,
        workload=workload_of(metadata),
    )


def bound_charge(node: NodeView, cpus: int) -> int:
    """Millicores of the oversold pool that ``cpus`` exclusive real CPUs take: ``cpus x 1000 x ratio``."""
    # Integer ceiling of cpus x 1000 x numerator / denominator: exact, and fast on the hot path.
    return -(-cpus * 1000 * node.ratio.numerator // node.ratio.denominator)


def free(node: NodeView, usage: NodeUsage) -> tuple[int, int]:
    """(cpu millicores, memory bytes) of the oversold allocatable not yet taken (cached per
    snapshot and view of the node)."""
    cached = usage._free
    if cached is None or cached[0] is not node:
        cached = usage._free = (node, (
            node.allocatable.get(CPU, 0) - usage.shared.get(CPU, 0) - bound_charge(node, len(usage.bound_cpus)),
            node.allocatable.get(MEMORY, 0) - usage.shared.get(MEMORY, 0) - usage.bound_memory,
        ))
    return cached[1]


def shortfall(node: NodeView, usage: NodeUsage, demand: PodDemand, now: float | None = None) -> str | None:
    """None when the Pod fits the node, else why not (filter and score; no CPUs are chosen).
    Room reserved for another owner's replacement Pod is not free (until it expires at ``now``)."""
    policy = demand.binding_on(node)
    free_cpu, free_memory = free(node, usage)
    if node.reservations:
        held_cpu, held_memory = node.held_for_others(demand.owner, now)
        free_cpu, free_memory = free_cpu - held_cpu, free_memory - held_memory
    cpu = bound_charge(node, demand.cpus) + demand.overhead_cpu if policy else demand.requests.get(CPU, 0)
    if cpu > free_cpu:
        what = "charged for its exclusive CPUs" if policy else "requested"
        return (f"cpu: {format_amount(CPU, cpu)} {what}, {format_amount(CPU, max(free_cpu, 0))} free on "
                f"{node.name} (oversold allocatable)")
    memory = demand.requests.get(MEMORY, 0)
    if memory > free_memory:
        return (f"memory: {format_amount(MEMORY, memory)} requested, {format_amount(MEMORY, max(free_memory, 0))} "
                f"free on {node.name} (oversold allocatable)")
    if policy:
        return usage.summary(node.topology).shortage(demand.cpus, policy, demand.single_numa or node.single_numa)
    return None


def fit(node: NodeView, usage: NodeUsage, demand: PodDemand, now: float | None = None) -> None:
    """Raise NoFit, with the reason, unless the Pod fits the node."""
    reason = shortfall(node, usage, demand, now)
    if reason is not None:
        raise NoFit(reason)


def allocate(node: NodeView, usage: NodeUsage, demand: PodDemand, now: float | None = None) -> Placement | None:
    """At bind: check the fit again and choose the CPUs of a bound Pod (None for a shared one)."""
    fit(node, usage, demand, now)
    policy = demand.binding_on(node)
    if policy is None:
        return None
    return place(node.topology, usage.bound_cpus, demand.cpus, policy, demand.single_numa or node.single_numa,
                 node.strategy)


def node_score(node: NodeView, usage: NodeUsage, demand: PodDemand, now: float | None = None) -> int:
    """0..10: the node's strategy (pack or spread) for this Pod; bound Pods by NUMA zone, with the
    fragmentation tie-break of ``FreeSummary.score``."""
    return 0 if shortfall(node, usage, demand, now) is not None else _packing(node, usage, demand)


def _packing(node: NodeView, usage: NodeUsage, demand: PodDemand) -> int:
    """``node_score`` of a Pod known to fit."""
    policy = demand.binding_on(node)
    if policy:
        return usage.summary(node.topology).score(demand.cpus, policy, demand.single_numa or node.single_numa,
                                                  node.strategy)
    allocatable = node.allocatable.get(CPU, 0)
    if allocatable <= 0:
        return 0
    after = 1 - (free(node, usage)[0] - demand.requests.get(CPU, 0)) / allocatable
    value = after if node.strategy == MOST_ALLOCATED else 1 - after
    return max(0, min(10, round(10 * value)))


@dataclass(frozen=True)
class NodeHeat:
    """The load side of one node at one moment (see ``oversale.usage``)."""

    load: NodeLoad | None
    now: float
    """The time the view is read at (metrics older than the limit then are stale)."""
    pending: Mapping[str, float] = field(default_factory=dict)
    """Estimated usage of Pods bound recently and not yet in the metrics."""

    def adding(self, usage: Mapping[str, float]) -> NodeHeat:
        """This view with one more Pod headed here: its ``usage`` added to the pending estimates."""
        return replace(self, pending={r: self.pending.get(r, 0.0) + usage.get(r, 0.0) for r in RESOURCES})


@dataclass(frozen=True, slots=True)
class LoadFacts:
    """What load-aware placement needs of one node, whatever Pod is placed: computed once per
    metrics poll (by the extender) rather than once per Pod and node, which is what lets one
    filter + prioritize over thousands of nodes stay within a few milliseconds."""

    at: float
    """When the freshest sample was taken (the metrics are stale ``max_age_seconds`` later)."""
    is_hot: bool
    """Above a scheduling watermark (``oversale.usage.watermark_exceeded``)."""
    cpu_used: float
    """Millicores: the 5-minute average + Pods bound but not yet in the metrics."""
    memory_used: float
    real_cpu: int
    real_memory: int
    load: NodeLoad
    pending: Mapping[str, float]
    real: Mapping[str, int]
    watermarks: Watermarks

    @property
    def hot(self) -> str | None:
        """Why the node is above a scheduling watermark, or None; worded only when asked (for the
        nodes a filter refuses), not for every node at every poll."""
        return hot_reason(self.load, self.pending, self.real, self.watermarks) if self.is_hot else None

    def is_fresh(self, now: float, config: LoadConfig) -> bool:
        return now - self.at <= config.max_age_seconds


def load_facts(node: NodeView, heat: NodeHeat | None) -> LoadFacts | None:
    """The node's ``LoadFacts``, or None when it has no metrics or no record of its real
    allocatable: such a node is neither filtered nor favoured by load."""
    if heat is None or heat.load is None or not node.real:
        return None
    load, pending, real = heat.load, heat.pending, node.real
    return LoadFacts(load.at, watermark_exceeded(load, pending, real, node.watermarks) is not None,
                     load.cpu_average + pending.get(CPU, 0.0), load.memory + pending.get(MEMORY, 0.0),
                     real.get(CPU, 0), real.get(MEMORY, 0), load, pending, real, node.watermarks)


def load_shortfall(node: NodeView, heat: NodeHeat | None, config: LoadConfig) -> str | None:
    """Why a node is too hot for new Pods, or None; a node without fresh metrics (or without a
    record of its real allocatable) is never filtered by load, so a metrics outage cannot block
    scheduling."""
    facts = load_facts(node, heat)
    return facts.hot if facts is not None and heat is not None and facts.is_fresh(heat.now, config) else None


def nominated_ahead(demand: PodDemand, nominated: Iterable[PodDemand]) -> list[PodDemand]:
    """The Pods nominated to a node whose room ``demand`` must leave: kube-scheduler's rule for
    its own filters (``addGENominatedPods``), every other Pod of at least the same priority."""
    return [pod for pod in nominated if pod.uid != demand.uid and pod.priority >= demand.priority]


def with_nominated(node: NodeView, usage: NodeUsage, nominated: Iterable[PodDemand]) -> NodeUsage:
    """``usage`` plus the room of Pods nominated to the node by a preemption, which wait there for
    their victims to leave. One that will get a cpuset holds the CPUs it would be given now (which
    ones is decided at its bind; how many, and in which NUMA node, is what other Pods must leave);
    while its victims still hold the cores it needs, it holds what its cpuset will cost the pool
    (``cpus x ratio``, as ``shortfall`` charges it). A shared one holds its requests."""
    taken = NodeUsage(dict(usage.shared), set(usage.bound_cpus), usage.bound_memory)
    for pod in nominated:
        policy = pod.binding_on(node)
        if policy is None:
            for resource in RESOURCES:
                taken.shared[resource] = taken.shared.get(resource, 0) + pod.requests.get(resource, 0)
            continue
        try:
            cpus = place(node.topology, taken.bound_cpus, pod.cpus, policy, pod.single_numa or node.single_numa,
                         node.strategy).cpus
        except NoFit:
            taken.shared[CPU] = taken.shared.get(CPU, 0) + bound_charge(node, pod.cpus) + pod.overhead_cpu
            taken.bound_memory += pod.requests.get(MEMORY, 0)
            continue
        taken.bound_cpus.update(cpus)
        taken.bound_memory += pod.requests.get(MEMORY, 0)
        if pod.overhead_cpu:
            taken.shared[CPU] = taken.shared.get(CPU, 0) + pod.overhead_cpu
    return taken


def crowded_out(node: NodeView, usage: NodeUsage, demand: PodDemand, nominated: Iterable[PodDemand],
                now: float | None = None) -> str | None:
    """Why the Pod, which fits ``usage``, does not once the Pods nominated ahead of it on the node
    keep their room, or None.

    kube-scheduler's own filters already count those Pods' requests against the oversold
    allocatable. What they cannot count is what the extender adds: the real cores a nominated
    Pod's cpuset will need, and its exclusive CPUs charged at the node's ratio. Without this, a
    lower-priority Pod could take the cores a preemption has just freed, and the preemptor would
    preempt again.
    """
    ahead = nominated_ahead(demand, nominated)
    if not ahead:
        return None
    reason = shortfall(node, with_nominated(node, usage, ahead), demand, now)
    return None if reason is None else f"{reason}, with room kept for {len(ahead)} Pod(s) nominated there"


@dataclass(frozen=True)
class HeldPod:
    """A Pod bound to a node, as a preemption sees it."""

    uid: str
    requests: Mapping[str, int]
    cpus: tuple[int, ...]
    """Its exclusive CPUs (empty: a shared Pod)."""
    priority: int
    bound_at: float | None = None
    """When it was bound (None: long ago, or unknown)."""
    evictable: bool = True
    """False for a bind still in flight: kube-scheduler cannot find it on the node to evict it."""
    namespace: str = ""
    name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    """What decides which PodDisruptionBudgets cover it."""


@dataclass(frozen=True)
class Preemption:
    """The extender's answer for one candidate node of a preemption."""

    added: tuple[str, ...] = ()
    """UIDs of Pods to evict besides the victims kube-scheduler chose, least important first."""
    refused: str | None = None
    """Why no preemption on this node lets the Pod pass the filter (None: it does)."""
    violations: int = 0
    """How many of the added victims break a PodDisruptionBudget, beyond kube-scheduler's."""


def preemption_on(node: NodeView, held: Sequence[HeldPod], chosen: Iterable[str], demand: PodDemand,
                  heat: NodeHeat | None, config: LoadConfig, now: float | None, load_aware: bool,
                  nominated: Iterable[PodDemand] = (), budgets: Sequence[DisruptionBudget] = ()) -> Preemption:
    """The victims that let the Pod pass the filter on ``node``: kube-scheduler's (``chosen``) and,
    where they are not enough, the fewest more Pods of lower priority; or why none do.

    kube-scheduler's preemption picks victims with its own plugins alone, until the requests fit
    the node's allocatable; it asks an extender only through the preempt verb. So its victims may
    leave a cpuset the remaining real cores still cannot give, or exclusive CPUs charged at
    ``cpus x ratio`` where it counted ``cpus``: on a full oversold node, a Pod asking for
    exclusive CPUs would seldom get to preempt. The preempt verb may answer another set of
    victims per node (the extender interface: "a different set of victim pods for every given
    candidate node"), so the extender adds to kube-scheduler's set as its ``SelectVictimsOnNode``
    does: with every other Pod of lower priority gone the Pod must pass; then each is given back,
    the most important first (higher priority, then bound earlier: ``MoreImportantPod``), where
    the Pod still passes without it. Since kubernetes#135486 a node where kube-scheduler's own
    plugins need no victim comes with none (``chosen`` empty), and every victim is the extender's.

    PodDisruptionBudgets (``budgets``) weigh as they do in ``SelectVictimsOnNode``: kube-scheduler's
    own victims spend the budgets first; the Pods whose eviction would then break one are given
    back before the others; and each added victim that still breaks one is counted
    (``violations``), to be added to kube-scheduler's own count, by which it prefers one candidate
    node over another.

    A hot node is never worth a preemption: its windows keep the evicted Pods' usage for minutes
    (the average) to an hour (the maximum), and the Pod would wait for a node the filter refuses.
    Pods nominated there ahead of this one keep their room (``crowded_out``).
    """
    if load_aware:
        hot = load_shortfall(node, heat, config)
        if hot is not None:
            return Preemption(refused=hot)
    ahead = list(nominated)

    def refusal(gone: set[str]) -> str | None:
        left = held_usage((pod.requests, pod.cpus) for pod in held if pod.uid not in gone)
        return shortfall(node, left, demand, now) or crowded_out(node, left, demand, ahead, now)

    gone = set(chosen)
    reason = refusal(gone)
    if reason is None:
        return Preemption()
    lower = [pod for pod in held if pod.evictable and pod.uid not in gone and pod.priority < demand.priority]
    evicted = {pod.uid for pod in lower}
    if not lower:
        return Preemption(refused=reason)
    if (still := refusal(gone | evicted)) is not None:
        return Preemption(refused=f"{still}, even with its {len(lower)} other Pod(s) of lower priority evicted too")
    lower.sort(key=lambda pod: (-pod.priority, -math.inf if pod.bound_at is None else pod.bound_at))
    spent = Allowances(budgets)
    for pod in held:
        if pod.uid in gone:
            spent.spend(pod.namespace, pod.name, pod.labels)
    breaking = spent.copy()
    breakers = {pod.uid for pod in lower if breaking.spend(pod.namespace, pod.name, pod.labels)}
    for pod in [*(p for p in lower if p.uid in breakers), *(p for p in lower if p.uid not in breakers)]:
        evicted.discard(pod.uid)
        if refusal(gone | evicted) is not None:
            evicted.add(pod.uid)
    added = [pod for pod in lower if pod.uid in evicted]
    return Preemption(added=tuple(pod.uid for pod in reversed(added)),
                      violations=sum(spent.spend(pod.namespace, pod.name, pod.labels) for pod in added))


def placement_score(node: NodeView, usage: NodeUsage, demand: PodDemand, heat: NodeHeat | None,
                    config: LoadConfig, estimate: Mapping[str, float] | None = None, now: float | None = None) -> int:
    """0..10 for one node (``score_on``), its metrics read at ``heat.now``. ``estimate``: the
    Pod's ``pod_estimate`` (default: from its requests alone)."""
    return score_on(node, usage, load_facts(node, heat), Ask.of(demand, config, estimate), now,
                    heat.now if heat is not None else 0.0)


@dataclass(frozen=True, slots=True)
class Ask:
    """What placing one Pod asks of every node, read once per filter or prioritize call, not
    once per node."""

    demand: PodDemand
    config: LoadConfig
    shape: tuple[int, str | None, bool, int, int]
    """What a node's fit and packing score depend on, of the Pod (its owner only matters where
    a node holds reservations)."""
    cpu: int
    """Its cpu request (millicores)."""
    memory: int
    pod_cpu: float
    """Its estimated cpu usage (millicores), for the load score."""
    pod_memory: float

    @classmethod
    def of(cls, demand: PodDemand, config: LoadConfig, estimate: Mapping[str, float] | None = None) -> Ask:
        pod = estimate if estimate is not None else estimated_usage(demand.requests, config)
        cpu, memory = demand.requests.get(CPU, 0), demand.requests.get(MEMORY, 0)
        return cls(demand, config, (demand.cpus, demand.bind_policy, demand.single_numa, cpu, memory), cpu, memory,
                   pod.get(CPU, 0.0), pod.get(MEMORY, 0.0))


def fit_on(node: NodeView, usage: NodeUsage, ask: Ask, now: float | None) -> tuple[str | None, int]:
    """(``shortfall``, ``node_score``) of the Pod on the node. A node holding no reservation gives
    the same answers to every Pod of one shape (the replicas of a workload) until its Pods change,
    which makes a new usage snapshot: they are remembered per shape, for this view of the node."""
    if node.reservations:
        reason = shortfall(node, usage, ask.demand, now)
        return reason, 0 if reason is not None else _packing(node, usage, ask.demand)
    cached = usage._answers
    if cached is None or cached[0] is not node or len(cached[1]) > 64:
        cached = usage._answers = (node, {})
    answer = cached[1].get(ask.shape)
    if answer is None:
        reason = shortfall(node, usage, ask.demand, now)
        answer = cached[1][ask.shape] = (reason, 0 if reason is not None else _packing(node, usage, ask.demand))
    return answer


def score_on(node: NodeView, usage: NodeUsage, facts: LoadFacts | None, ask: Ask, now: float | None,
             fresh_at: float) -> int:
    """The score on one node, 0..10: the packing score (``node_score``) combined with how cool
    the node stays after placing the Pod (``ask.pod_cpu`` and ``ask.pod_memory``), by the
    configured weights; by packing alone where metrics are missing or stale at ``fresh_at``. A
    node holding a reservation for the Pod's owner scores 10: the room was made for it."""
    reason, packing = fit_on(node, usage, ask, now)
    if reason is not None:
        return 0
    if node.reservations and node.holds_for(ask.demand.owner, now):
        return 10
    config = ask.config
    if facts is None or config.load_weight <= 0 or fresh_at - facts.at > config.max_age_seconds:
        return packing
    return combined_score(packing, load_score_after(facts.cpu_used + ask.pod_cpu, facts.memory_used + ask.pod_memory,
                                                    facts.real_cpu, facts.real_memory), config)
