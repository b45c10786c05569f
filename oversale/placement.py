"""Scheduling Pods onto oversold nodes: what a node can still take, and how well a Pod fits.

Shared Pods draw on the node's *oversold* allocatable (as the webhook stores it). Bound Pods get
exclusive CPUs from the node's *real* topology (``oversale.cpus``), and each exclusive CPU is also
charged against the oversold pool at ``1 core x ratio``: k real cores are k x ratio of the oversold
allocatable, so exclusive CPUs never draw on capacity that exists only on paper.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, NoReturn

from oversale.annotations import AnnotationKeys, current_ratio
from oversale.cpus import (
    BIND_POLICIES,
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    SINGLE_NUMA_NODE,
    NoFit,
    Placement,
    Topology,
    place,
    score,
    topology_from_node,
)
from oversale.node_oversale import real_allocatable_of
from oversale.pods import scheduled_request
from oversale.quantity import CPU, MEMORY, RESOURCES, format_amount, parse_amount

KOORDINATOR_TOPOLOGY = "node.koordinator.sh/cpu-topology"


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


@dataclass(frozen=True)
class PodDemand:
    uid: str
    requests: Mapping[str, int]
    bind_policy: str | None
    """The Pod's own binding request (FullPCPUs or SpreadByPCPUs), if any."""
    single_numa: bool

    def binding_on(self, node: NodeView) -> str | None:
        """The policy under which this Pod gets a cpuset on ``node`` (None: a shared Pod)."""
        policy = self.bind_policy or node.bind_policy
        cpu = self.requests.get(CPU, 0)
        return policy if policy and cpu > 0 and cpu % 1000 == 0 else None

    @property
    def cpus(self) -> int:
        return self.requests.get(CPU, 0) // 1000


@dataclass
class NodeUsage:
    """What the Pods on a node already take."""

    shared: dict[str, int] = field(default_factory=dict)
    bound_cpus: set[int] = field(default_factory=set)
    bound_memory: int = 0


def node_view(node: Mapping[str, Any], keys: AnnotationKeys, nrt_zones: Mapping[int, int] | None = None) -> NodeView:
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    real = real_allocatable_of(node, keys)
    ratio = current_ratio(_applied(annotations, keys), keys.cpu_oversale_ratio)
    bind = labels.get(keys.cpu_bind_policy)
    return NodeView(
        name=str(metadata.get("name", "")),
        allocatable={r: parse_amount(r, allocatable[r]) for r in RESOURCES if r in allocatable},
        cpu_ratio=ratio,
        topology=topology_from_node(node, (keys.cpu_topology, KOORDINATOR_TOPOLOGY), real.get(CPU, 0) // 1000,
                                    nrt_zones),
        bind_policy=bind if bind in BIND_POLICIES else None,
        single_numa=labels.get(keys.numa_topology_policy) == SINGLE_NUMA_NODE,
        strategy=LEAST_ALLOCATED if labels.get(keys.numa_allocate_strategy) == LEAST_ALLOCATED else MOST_ALLOCATED,
    )


def _applied(annotations: Mapping[str, str], keys: AnnotationKeys) -> dict[str, str]:
    """The cpu ratio the webhook applied (its record), as a ratio annotation map."""
    try:
        applied = json.loads(annotations.get(keys.applied_oversale_ratio, "{}"))
    except ValueError:
        return {}
    return {keys.cpu_oversale_ratio: str(applied[CPU])} if isinstance(applied, dict) and CPU in applied else {}


def pod_demand(pod: Mapping[str, Any], keys: AnnotationKeys) -> PodDemand:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    policy = annotations.get(keys.cpu_bind_policy)
    return PodDemand(
        uid=str((pod.get("metadata") or {}).get("uid", "")),
        requests={r: scheduled_request(pod, r) for r in RESOURCES},
        bind_policy=policy if policy in BIND_POLICIES else None,
        single_numa=annotations.get(keys.numa_topology_policy) == SINGLE_NUMA_NODE,
    )


def charge(node: NodeView, demand: PodDemand, cpus: int | None) -> dict[str, int]:
    """What a Pod takes from the node's oversold allocatable: its requests, or for a bound Pod
    ``cpus x 1000 x ratio`` millicores of CPU."""
    taken = dict(demand.requests)
    if cpus is not None:
        taken[CPU] = math.ceil(cpus * 1000 * Fraction(node.cpu_ratio))
    return taken


def free(node: NodeView, usage: NodeUsage) -> dict[str, int]:
    bound_charge = math.ceil(len(usage.bound_cpus) * 1000 * Fraction(node.cpu_ratio))
    return {
        CPU: node.allocatable.get(CPU, 0) - usage.shared.get(CPU, 0) - bound_charge,
        MEMORY: node.allocatable.get(MEMORY, 0) - usage.shared.get(MEMORY, 0) - usage.bound_memory,
    }


def check_fit(node: NodeView, usage: NodeUsage, demand: PodDemand) -> Placement | None:
    """None for a shared Pod that fits, the CPUs for a bound one; raises NoFit with the reason."""
    policy = demand.binding_on(node)
    available = free(node, usage)
    needed = charge(node, demand, demand.cpus if policy else None)
    for resource in RESOURCES:
        if needed.get(resource, 0) > available[resource]:
            return _refuse(resource, needed[resource], available[resource], node.name, bool(policy))
    if policy is None:
        return None
    return place(node.topology, usage.bound_cpus, demand.cpus, policy, demand.single_numa or node.single_numa,
                 node.strategy)


def _refuse(resource: str, needed: int, available: int, node: str, bound: bool) -> NoReturn:
    what = "charged for its exclusive CPUs" if bound and resource == CPU else "requested"
    raise NoFit(f"{resource}: {format_amount(resource, needed)} {what}, "
                f"{format_amount(resource, max(available, 0))} free on {node} (oversold allocatable)")


def node_score(node: NodeView, usage: NodeUsage, demand: PodDemand) -> int:
    """0..10: the node's strategy (pack or spread) for this Pod; bound Pods by NUMA zone, with the
    fragmentation tie-break of ``oversale.cpus.score``."""
    policy = demand.binding_on(node)
    try:
        check_fit(node, usage, demand)
    except NoFit:
        return 0
    if policy:
        return score(node.topology, usage.bound_cpus, demand.cpus, policy, demand.single_numa or node.single_numa,
                     node.strategy)
    allocatable = node.allocatable.get(CPU, 0)
    if allocatable <= 0:
        return 0
    after = 1 - (free(node, usage)[CPU] - demand.requests.get(CPU, 0)) / allocatable
    value = after if node.strategy == MOST_ALLOCATED else 1 - after
    return max(0, min(10, round(10 * value)))
