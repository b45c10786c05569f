"""Whether a node's labels and taints admit a Pod: its ``nodeSelector``, its required node affinity,
its tolerations and its PersistentVolumes' node affinity, as kube-scheduler's NodeAffinity,
TaintToleration and VolumeBinding filters judge them.

kube-scheduler applies these filters before it asks any extender, so the extender never needs
them. The remediator does: it chooses a target node by itself, before it evicts, and a Pod that
only its own pool's nodes admit would otherwise be evicted toward a node its replacement can
never run on (its replacement then waits Pending, or lands back on the hot node).

The rules follow the API's own definitions (k8s.io/component-helpers ``nodeaffinity`` and
``Toleration.ToleratesTaint``): selector terms are ORed and the requirements within a term ANDed;
a term that requires nothing matches no node; ``Gt``/``Lt`` compare integers; only
``NoSchedule`` and ``NoExecute`` taints keep a Pod off; a bound volume is reachable where its
PersistentVolume's ``nodeAffinity.required`` matches the node's labels (a zonal disk in its zone,
a local volume on its one node). Anything malformed admits no node, the safe side: a Pod that
cannot be placed is not moved.

What a Pod takes of a node besides cpu and memory (a Pod slot, ``ephemeral-storage``,
``hugepages-*``, extended resources such as ``nvidia.com/gpu``) is checked as kube-scheduler's
NodeResourcesFit checks it, against the node's allocatable less what its Pods take: cpu and memory
are the extender's to judge, on the oversold allocatable. Its host ports are checked as the
NodePorts filter checks them, against those the node's Pods bind; its volumes a CSI driver
attaches as the NodeVolumeLimits filter checks them, against the driver's limit in the node's
CSINode and the volumes VolumeAttachments show attached there.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from oversale.errors import QuantityError
from oversale.pods import all_containers, controller_of, is_sidecar, scheduled_request
from oversale.quantity import CPU, MEMORY, format_bytes, parse_bytes

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""``PreferNoSchedule`` only lowers a node's score; these two keep a Pod that does not tolerate them off."""
POD_SLOTS = "pods"
"""The allocatable count of Pods a node runs (the kubelet's ``maxPods``): every Pod takes one."""
ANY_IP = "0.0.0.0"
HostPort = tuple[str, str, int]
"""(host IP, protocol, port) a container binds on its node."""


@dataclass(frozen=True)
class VolumeAffinity:
    """Where one of a Pod's bound volumes can be reached from."""

    claim: str
    volume: str
    """The PersistentVolume bound to ``claim`` ("" when none is: no node reaches it)."""
    terms: tuple[Any, ...]
    """Its ``spec.nodeAffinity.required.nodeSelectorTerms``."""


@dataclass(frozen=True)
class CsiVolume:
    """One of a Pod's bound volumes served by a CSI driver, which may cap how many a node attaches."""

    driver: str
    volume: str
    """The PersistentVolume's name (what a VolumeAttachment names too)."""


# In-tree volume plugins and the CSI drivers CSI migration (GA for all of these) hands them to: a
# PersistentVolume still written in the in-tree form is attached, and counted, by that driver.
MIGRATED_PLUGINS = {
    "awsElasticBlockStore": "ebs.csi.aws.com",
    "gcePersistentDisk": "pd.csi.storage.gke.io",
    "azureDisk": "disk.csi.azure.com",
    "azureFile": "file.csi.azure.com",
    "cinder": "cinder.csi.openstack.org",
    "vsphereVolume": "csi.vsphere.vmware.com",
    "portworxVolume": "pxd.portworx.com",
}


@dataclass(frozen=True)
class NodeConstraints:
    """What a Pod asks of a node's labels and taints."""

    node_selector: Mapping[str, Any] = field(default_factory=dict)
    required_terms: tuple[Any, ...] | None = None
    """``nodeSelectorTerms`` of ``requiredDuringSchedulingIgnoredDuringExecution``; None: none required."""
    preferred_terms: tuple[tuple[int, Any], ...] = ()
    """(weight, ``preference``) of each ``preferredDuringSchedulingIgnoredDuringExecution`` term."""
    tolerations: tuple[Any, ...] = ()
    volumes: tuple[VolumeAffinity, ...] = ()
    """Its bound volumes that only some nodes reach (read from the cluster: :func:`volume_affinity`)."""
    name: str = ""
    """``namespace/name``: the Pod itself no longer counts where it was, for inter-Pod affinity."""
    namespace: str = ""
    labels: Mapping[str, Any] = field(default_factory=dict)
    pod_affinity: tuple[PodTerm, ...] = ()
    pod_anti_affinity: tuple[PodTerm, ...] = ()
    preferred_pod_terms: tuple[tuple[int, PodTerm], ...] = ()
    """(weight, term) of each preferred inter-Pod affinity term, anti-affinity ones with their
    weight negated (:func:`preferred_pod_affinity_weight`)."""
    spread: tuple[SpreadConstraint, ...] = ()
    soft_spread: tuple[SpreadConstraint, ...] = ()
    """Its ``ScheduleAnyway`` topology spread constraints (:func:`spread_scores`)."""
    owner: str = ""
    """``Kind/name`` of its controller ("" without one): its siblings for the default spreading."""
    unreadable: str = ""
    """Why part of its spec cannot be read (no node admits it then), or ""."""
    resources: Mapping[str, int] = field(default_factory=dict)
    """What it takes of a node besides cpu and memory (:func:`other_requests`)."""
    host_ports: tuple[HostPort, ...] = ()
    """The host ports it binds (:func:`host_ports`)."""
    csi_volumes: tuple[CsiVolume, ...] = ()
    """Its bound volumes a CSI driver attaches (read from the cluster: :func:`csi_volume`)."""


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The PersistentVolumeClaims a Pod's volumes use: named ones, and the claim a generic
    ephemeral volume gets (``<pod>-<volume>``, as the ephemeral volume controller names it).

    >>> claim_names({"metadata": {"name": "db-0"}, "spec": {"volumes": [
    ...     {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}},
    ...     {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}, {"name": "tmp", "emptyDir": {}}]}})
    ['data-db-0', 'db-0-scratch']
    """
    spec = pod.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    pod_name = (pod.get("metadata") or {}).get("name", "")
    claims = []
    for volume in volumes if isinstance(volumes, list) else []:
        if not isinstance(volume, Mapping):
            continue
        claim = volume.get("persistentVolumeClaim")
        if isinstance(claim, Mapping) and isinstance(claim.get("claimName"), str):
            claims.append(claim["claimName"])
        elif isinstance(volume.get("ephemeral"), Mapping):
            claims.append(f"{pod_name}-{volume.get('name')}")
    return claims


def volume_affinity(claim: str, persistent_volume: Mapping[str, Any] | None) -> VolumeAffinity | None:
    """Where the volume bound to ``claim`` can be reached from, or None for everywhere (a volume
    with no node affinity: network storage). ``persistent_volume`` None: the claim is not bound.

    >>> pv = {"metadata": {"name": "pv-1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
    ...     {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}]}}}}
    >>> affinity = volume_affinity("data-db-0", pv)
    >>> constraint_problem(NodeConstraints(volumes=(affinity,)), "node-c", {"topology.kubernetes.io/zone": "c"}, [])
    'volume data-db-0 (PersistentVolume pv-1) cannot be reached from node-c: its node affinity does not match'
    """
    if persistent_volume is None:
        return VolumeAffinity(claim, "", ())
    name = str((persistent_volume.get("metadata") or {}).get("name", ""))
    spec = persistent_volume.get("spec") or {}
    node_affinity = spec.get("nodeAffinity") if isinstance(spec, Mapping) else ()
    required = node_affinity.get("required") if isinstance(node_affinity, Mapping) else node_affinity
    if required is None:
        return None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    return VolumeAffinity(claim, name, tuple(terms) if isinstance(terms, list) else ())


def csi_volume(persistent_volume: Mapping[str, Any]) -> CsiVolume | None:
    """The CSI driver that attaches a PersistentVolume (its ``spec.csi``, or the driver CSI
    migration hands its in-tree plugin to), or None for any other volume.

    >>> csi_volume({"metadata": {"name": "pvc-1"}, "spec": {"csi": {"driver": "ebs.csi.aws.com"}}})
    CsiVolume(driver='ebs.csi.aws.com', volume='pvc-1')
    >>> csi_volume({"metadata": {"name": "pv-old"}, "spec": {"gcePersistentDisk": {"pdName": "disk-1"}}}).driver
    'pd.csi.storage.gke.io'
    """
    metadata, spec = persistent_volume.get("metadata"), persistent_volume.get("spec")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(spec, Mapping) or not name:
        return None
    csi = spec.get("csi")
    if isinstance(csi, Mapping) and isinstance(csi.get("driver"), str) and csi["driver"]:
        return CsiVolume(csi["driver"], str(name))
    driver = next((MIGRATED_PLUGINS[plugin] for plugin in MIGRATED_PLUGINS if isinstance(spec.get(plugin), Mapping)),
                  None)
    return CsiVolume(driver, str(name)) if driver else None


def volume_limits(csi_node: Mapping[str, Any]) -> dict[str, int]:
    """Driver -> how many of its volumes the node may have attached, from a CSINode (a driver
    that states no ``allocatable.count`` has no limit).

    >>> volume_limits({"spec": {"drivers": [{"name": "ebs.csi.aws.com", "allocatable": {"count": 25}},
    ...                                     {"name": "efs.csi.aws.com"}]}})
    {'ebs.csi.aws.com': 25}
    """
    spec = csi_node.get("spec")
    drivers = spec.get("drivers") if isinstance(spec, Mapping) else None
    limits = {}
    for driver in drivers if isinstance(drivers, list) else []:
        allocatable = driver.get("allocatable") if isinstance(driver, Mapping) else None
        count = allocatable.get("count") if isinstance(allocatable, Mapping) else None
        if isinstance(count, int) and not isinstance(count, bool) and isinstance(driver.get("name"), str):
            limits[driver["name"]] = count
    return limits


def attached_volumes(volume_attachments: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, frozenset[str]]]:
    """Node -> driver -> the volumes attached there or being attached or detached, from
    VolumeAttachments: a volume counts against a node's limit until its VolumeAttachment is gone
    (kube-scheduler counts them so since kubernetes/kubernetes#127757, a deleted Pod's volume
    being still attached).

    >>> attached_volumes([{"metadata": {"name": "csi-1"}, "spec": {"attacher": "ebs.csi.aws.com",
    ...     "nodeName": "node-a", "source": {"persistentVolumeName": "pvc-1"}}}])
    {'node-a': {'ebs.csi.aws.com': frozenset({'pvc-1'})}}
    """
    found: dict[str, dict[str, set[str]]] = {}
    for attachment in volume_attachments:
        spec = attachment.get("spec")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("nodeName"), str):
            continue
        source = spec.get("source")
        volume = source.get("persistentVolumeName") if isinstance(source, Mapping) else None
        # An inline volume's attachment names no PersistentVolume: it counts as itself.
        metadata = attachment.get("metadata")
        volume = volume or f"VolumeAttachment {metadata.get('name', '') if isinstance(metadata, Mapping) else ''}"
        found.setdefault(spec["nodeName"], {}).setdefault(str(spec.get("attacher", "")), set()).add(str(volume))
    return {node: {driver: frozenset(volumes) for driver, volumes in drivers.items()}
            for node, drivers in found.items()}


def volumes_problem(wanted: Sequence[CsiVolume], attached: Mapping[str, frozenset[str]],
                    limits: Mapping[str, int], node: str) -> str | None:
    """None when the node's CSI drivers can attach the Pod's volumes there too, else why not (as
    kube-scheduler's NodeVolumeLimits judges it: a volume already attached there takes nothing
    more).

    >>> volumes_problem([CsiVolume("ebs.csi.aws.com", "pvc-9")], {"ebs.csi.aws.com": frozenset({"pvc-1", "pvc-2"})},
    ...                 {"ebs.csi.aws.com": 2}, "node-a")
    'ebs.csi.aws.com: 2 volumes attached to node-a, its limit 2'
    """
    for driver in sorted({volume.driver for volume in wanted}):
        limit = limits.get(driver)
        if limit is None:
            continue
        there = attached.get(driver, frozenset())
        new = {volume.volume for volume in wanted if volume.driver == driver} - there
        if new and len(there) + len(new) > limit:
            return f"{driver}: {len(there)} volumes attached to {node}, its limit {limit}"
    return None


def node_constraints(pod: Mapping[str, Any], volumes: tuple[VolumeAffinity, ...] = (),
                     csi_volumes: tuple[CsiVolume, ...] = ()) -> NodeConstraints:
    """The constraints a Pod's spec puts on its node (none for a spec that states none).

    >>> node_constraints({"spec": {"nodeSelector": {"pool": "db"}}}).node_selector
    {'pool': 'db'}
    """
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return NodeConstraints()
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    labels = metadata.get("labels")
    pod_affinity, pod_anti_affinity = (_pod_terms(spec, kind, namespace) for kind in ("podAffinity", "podAntiAffinity"))
    selector = spec.get("nodeSelector")
    unreadable = ""
    if selector is not None and not isinstance(selector, Mapping):
        unreadable = "its nodeSelector is not a map"
    elif pod_affinity is None or pod_anti_affinity is None:
        unreadable = "its required pod affinity cannot be read"
    spread = _spread_constraints(spec, labels if isinstance(labels, Mapping) else {})
    if spread is None:
        unreadable = unreadable or "its topology spread constraints cannot be read"
    terms, preferences = _node_affinity_terms(spec)
    tolerations = spec.get("tolerations")
    try:
        resources = other_requests(pod)
    except (AttributeError, TypeError, ValueError):  # QuantityError is a ValueError
        resources = {}
        unreadable = unreadable or "its resources cannot be read"
    return NodeConstraints(
        node_selector=selector if isinstance(selector, Mapping) else {},
        required_terms=terms,
        preferred_terms=preferences,
        tolerations=tuple(tolerations) if isinstance(tolerations, list) else (),
        volumes=volumes,
        name=f"{namespace}/{metadata.get('name', '')}",
        namespace=namespace,
        labels=labels if isinstance(labels, Mapping) else {},
        pod_affinity=pod_affinity or (),
        pod_anti_affinity=pod_anti_affinity or (),
        preferred_pod_terms=_preferred_pod_terms(spec, namespace),
        # They only rank nodes: one that cannot be read keeps the Pod off none.
        soft_spread=_spread_constraints(spec, labels if isinstance(labels, Mapping) else {}, "ScheduleAnyway") or (),
        owner=_owner(metadata),
        spread=spread or (),
        unreadable=unreadable,
        resources=resources,
        host_ports=host_ports(pod),
        csi_volumes=csi_volumes,
    )


def host_ports(pod: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The host ports a Pod binds on its node, as kube-scheduler's NodePorts filter reads them: of
    its app containers and, since kubernetes/kubernetes#132040, its sidecars (an IP left empty is
    every address, a protocol left empty TCP). The API server sets ``hostPort`` to the
    ``containerPort`` of a Pod on the host network, so those count too.

    >>> web = {"ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 9090}]}
    >>> host_ports({"spec": {"containers": [web]}})
    (('0.0.0.0', 'TCP', 8080),)
    """
    spec = pod.get("spec") or {}
    containers = [c for c in _listed(spec.get("initContainers")) if isinstance(c, Mapping) and is_sidecar(c)]
    containers += [c for c in _listed(spec.get("containers")) if isinstance(c, Mapping)]
    found = []
    for container in containers:
        for port in _listed(container.get("ports")):
            number = port.get("hostPort") if isinstance(port, Mapping) else None
            if isinstance(number, int) and number > 0:
                found.append((str(port.get("hostIP") or ANY_IP), str(port.get("protocol") or "TCP"), number))
    return tuple(found)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def ports_problem(wanted: Sequence[HostPort], used: Collection[HostPort], node: str) -> str | None:
    """None when none of the ports the Pod binds is taken on the node, else which one is. Ports
    clash when protocol and number are the same and either binds every address or both the same
    one (kube-scheduler's ``HostPortInfo.CheckConflict``).

    >>> ports_problem([("0.0.0.0", "TCP", 8080)], {("10.0.0.5", "TCP", 8080)}, "node-b")
    'host port 8080/TCP is taken on node-b'
    >>> ports_problem([("10.0.0.6", "TCP", 8080)], {("10.0.0.5", "TCP", 8080), ("0.0.0.0", "UDP", 8080)}, "node-b")
    """
    for ip, protocol, number in wanted:
        for used_ip, used_protocol, used_number in used:
            if (used_protocol, used_number) == (protocol, number) and (ip == used_ip or ANY_IP in (ip, used_ip)):
                return f"host port {number}/{protocol} is taken on {node}"
    return None


def other_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """What a Pod takes of its node besides cpu and memory, as kube-scheduler's NodeResourcesFit
    counts it: one of the node's Pod slots, and each other resource it requests, sidecar-aware and
    with its RuntimeClass overhead, as cpu and memory are counted (a limit alone is its request).

    >>> other_requests({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    {'pods': 1, 'nvidia.com/gpu': 1}
    """
    spec = pod.get("spec") or {}
    names: set[str] = set(_names(spec.get("overhead")))
    for unit in [*all_containers(pod), spec]:  # spec: pod-level resources
        resources = unit.get("resources") or {}
        for kind in ("requests", "limits"):
            names.update(_names(resources.get(kind)))
    taken = {POD_SLOTS: 1}
    for name in sorted(names - {CPU, MEMORY, POD_SLOTS}):
        if amount := scheduled_request(pod, name):
            taken[name] = amount
    return taken


def _names(amounts: Any) -> list[str]:
    """The resource names of a ``requests``/``limits``/``overhead`` map (TypeError for a non-map)."""
    if amounts is None:
        return []
    if not isinstance(amounts, Mapping) or not all(isinstance(name, str) for name in amounts):
        raise TypeError("not a map of resource names")
    return list(amounts)


def free_resources(allocatable: Mapping[str, Any], taken: Mapping[str, int]) -> dict[str, int]:
    """What a node has left of each resource besides cpu and memory: its ``status.allocatable``
    less what its Pods take (the sums of :func:`other_requests`). One it does not state, or states
    unreadably, it has none of.

    >>> free_resources({"cpu": "8", "pods": "110", "nvidia.com/gpu": "2"}, {"pods": 12, "nvidia.com/gpu": 2})
    {'pods': 98, 'nvidia.com/gpu': 0}
    """
    free = {}
    for name, text in allocatable.items():
        if name in (CPU, MEMORY):
            continue
        try:
            free[name] = parse_bytes(str(text)) - taken.get(name, 0)
        except QuantityError:
            continue
    return free


def resources_problem(requests: Mapping[str, int], free: Mapping[str, int], node: str) -> str | None:
    """None when the node has room for all the Pod takes besides cpu and memory, else why not.

    >>> resources_problem({"pods": 1, "nvidia.com/gpu": 1}, {"pods": 30}, "node-b")
    'nvidia.com/gpu: 1 requested, 0 free on node-b'
    """
    for name, amount in sorted(requests.items()):
        left = free.get(name, 0)
        if amount > left:
            return f"{name}: {format_bytes(amount)} requested, {format_bytes(max(left, 0))} free on {node}"
    return None


def constraint_problem(constraints: NodeConstraints, node: str, labels: Mapping[str, str],
                       taints: Sequence[Any], neighbours: Neighbours | None = None) -> str | None:
    """None when the node admits the Pod, else why not; with ``neighbours``, the Pods running on
    the nodes have their say too (:func:`inter_pod_problem`).

    >>> db = NodeConstraints(node_selector={"pool": "db"})
    >>> constraint_problem(db, "node-b", {"pool": "web"}, [])
    'nodeSelector pool=db: node-b has pool=web'
    >>> gpu = [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]
    >>> constraint_problem(NodeConstraints(), "node-g", {}, gpu)
    'taint gpu=a100:NoSchedule on node-g is not tolerated'
    >>> constraint_problem(NodeConstraints(tolerations=({"key": "gpu", "operator": "Exists"},)), "node-g", {}, gpu)
    """
    if constraints.unreadable:
        return constraints.unreadable
    problem = _labels_problem(constraints, node, labels)
    if problem is not None:
        return problem
    for taint in taints:
        if not isinstance(taint, Mapping) or taint.get("effect") not in BLOCKING_EFFECTS:
            continue
        if not any(_tolerates(toleration, taint) for toleration in constraints.tolerations):
            value = taint.get("value")
            return (f"taint {taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')} on {node} "
                    "is not tolerated")
    for bound in constraints.volumes:
        # The VolumeBinding filter matches a PersistentVolume's terms against the node's labels
        # alone (volumeutil.CheckNodeAffinity builds a Node of labels, with no name).
        if not any(_term_matches(term, "", labels) for term in bound.terms):
            if not bound.volume:
                return f"volume {bound.claim} is not bound to a PersistentVolume"
            return (f"volume {bound.claim} (PersistentVolume {bound.volume}) cannot be reached from {node}: its node "
                    "affinity does not match")
    return inter_pod_problem(constraints, node, neighbours) if neighbours is not None else None


def intolerable_soft_taints(constraints: NodeConstraints, taints: Sequence[Any]) -> int:
    """How many of a node's ``PreferNoSchedule`` taints the Pod does not tolerate: the count
    kube-scheduler's TaintToleration plugin scores nodes by (fewer is better), at the highest
    weight of its default score plugins.

    >>> soft = [{"key": "stke.platform/hot", "value": "1764000000", "effect": "PreferNoSchedule"}]
    >>> intolerable_soft_taints(NodeConstraints(), soft), intolerable_soft_taints(NodeConstraints(), [])
    (1, 0)
    """
    return sum(1 for taint in taints if isinstance(taint, Mapping) and taint.get("effect") == "PreferNoSchedule"
               and not any(_tolerates(toleration, taint) for toleration in constraints.tolerations))


def preferred_affinity_weight(constraints: NodeConstraints, node: str, labels: Mapping[str, str]) -> int:
    """The summed weights of the Pod's preferred node affinity terms that ``node`` matches: what
    kube-scheduler's NodeAffinity score ranks nodes by ("the node(s) with the highest sum are the
    most preferred", the API's words), at the weight 2 of its default score plugins, second to
    TaintToleration's 3.

    >>> zone_a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    >>> prefers = NodeConstraints(preferred_terms=((80, zone_a),))
    >>> preferred_affinity_weight(prefers, "n1", {"zone": "a"}), preferred_affinity_weight(prefers, "n2", {"zone": "b"})
    (80, 0)
    """
    return sum(weight for weight, term in constraints.preferred_terms if _term_matches(term, node, labels))


def _labels_problem(constraints: NodeConstraints, node: str, labels: Mapping[str, str]) -> str | None:
    """What the Pod's nodeSelector and required node affinity say of a node's labels."""
    for key, wanted in constraints.node_selector.items():
        if labels.get(key) != wanted:
            has = f"{key}={labels[key]}" if key in labels else f"no label {key}"
            return f"nodeSelector {key}={wanted}: {node} has {has}"
    if constraints.required_terms is not None and not any(
            _term_matches(term, node, labels) for term in constraints.required_terms):
        return f"required node affinity: {node} matches none of its {len(constraints.required_terms)} term(s)"
    return None


def _term_matches(term: Any, node: str, labels: Mapping[str, str]) -> bool:
    if not isinstance(term, Mapping):
        return False
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list) or not (expressions or fields):
        return False  # a term that requires nothing matches no node
    return (all(_requirement_holds(r, labels) for r in expressions)
            and all(_requirement_holds(r, {"metadata.name": node}) for r in fields))


def _requirement_holds(requirement: Any, values: Mapping[str, str]) -> bool:
    if not isinstance(requirement, Mapping):
        return False
    key, operator, listed = requirement.get("key"), requirement.get("operator"), requirement.get("values") or []
    if not isinstance(key, str) or not isinstance(listed, list):
        return False
    present = key in values
    if operator == "In":
        return present and values[key] in listed
    if operator == "NotIn":
        return not present or values[key] not in listed
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(listed) == 1:
        try:
            have, bound = int(values[key]), int(listed[0])
        except (TypeError, ValueError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _tolerates(toleration: Any, taint: Mapping[str, Any]) -> bool:
    if not isinstance(toleration, Mapping):
        return False
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


@dataclass(frozen=True)
class PodTerm:
    """One required inter-Pod affinity or anti-affinity term."""

    selector: Mapping[str, Any] | None
    """Its ``labelSelector``; None selects no Pod (as the API defines a null selector)."""
    namespaces: frozenset[str] | None
    """Where the Pods it selects live: its ``namespaces`` (with neither these nor a
    ``namespaceSelector``, its owner's namespace); None: every namespace (an empty
    ``namespaceSelector``)."""
    topology_key: str
    namespace_selector: Mapping[str, Any] | None = None
    """Its ``namespaceSelector`` when it selects by labels: the namespaces whose labels it matches
    count too (read with :attr:`Neighbours.namespace_labels`)."""


@dataclass(frozen=True)
class SpreadConstraint:
    """A ``topologySpreadConstraints`` entry with ``whenUnsatisfiable: DoNotSchedule`` (one that
    says ``ScheduleAnyway`` only scores nodes, it keeps a Pod off none)."""

    max_skew: int
    topology_key: str
    selector: Mapping[str, Any] | None
    """Its ``labelSelector``; None selects no Pod."""
    min_domains: int | None = None

    def term(self, namespace: str) -> PodTerm:
        """What it counts, as a term: the Pods its selector picks in the spread Pod's namespace."""
        return PodTerm(self.selector, frozenset({namespace}), self.topology_key)


@dataclass(frozen=True)
class PlacedPod:
    """A running Pod as inter-Pod affinity sees it."""

    name: str
    """``namespace/name``."""
    namespace: str
    labels: Mapping[str, Any]
    node: str
    anti_affinity: tuple[PodTerm, ...] = ()
    owner: str = ""
    """``Kind/name`` of its controller ("" without one)."""
    courting: tuple[tuple[int, PodTerm], ...] = ()
    """Its preferred pod affinity (+weight) and anti-affinity (-weight) terms, and its required
    affinity terms at kube-scheduler's ``hardPodAffinityWeight`` (1): what draws other Pods to
    its domain or keeps them from it (:meth:`Neighbours.courted`)."""


def _owner(metadata: Any) -> str:
    owner = controller_of(metadata) if isinstance(metadata, Mapping) else None
    return f"{owner[0]}/{owner[1]}" if owner else ""


HARD_POD_AFFINITY_WEIGHT = 1
"""kube-scheduler's InterPodAffinity ``hardPodAffinityWeight`` default: a running Pod's required
affinity term that selects the incoming Pod scores its domain this much."""


def _courting(preferred: tuple[tuple[int, PodTerm], ...],
              required: tuple[PodTerm, ...]) -> tuple[tuple[int, PodTerm], ...]:
    """A Pod's terms as they score other Pods' nodes: preferred ones at their (signed) weight,
    required affinity at ``HARD_POD_AFFINITY_WEIGHT``."""
    return (*preferred, *((HARD_POD_AFFINITY_WEIGHT, term) for term in required))


def placed_pod(pod: Mapping[str, Any]) -> PlacedPod:
    """What inter-Pod affinity reads of a running Pod."""
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    labels = metadata.get("labels")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    courting = _courting(_preferred_pod_terms(spec, namespace), _pod_terms(spec, "podAffinity", namespace) or ())
    return PlacedPod(f"{namespace}/{metadata.get('name', '')}", namespace,
                     labels if isinstance(labels, Mapping) else {}, str(spec.get("nodeName") or ""),
                     _pod_terms(spec, "podAntiAffinity", namespace) or (), _owner(metadata), courting)


class Neighbours:
    """The running Pods and every node's labels, for one pass: which Pods share a term's topology
    domain with a node (the nodes whose label ``topologyKey`` has the same value)."""

    def __init__(self, node_labels: Mapping[str, Mapping[str, str]], pods: Sequence[PlacedPod],
                 namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.node_labels = node_labels
        self.namespace_labels = namespace_labels
        """Every namespace's labels, for terms with a ``namespaceSelector``; None: not known, and
        such a term is taken to reach every namespace."""
        self._domains: dict[str, dict[str, list[PlacedPod]]] = {}
        self._selected: dict[tuple[str, str | None, str], PlacedPod | None] = {}
        self._counted: dict[tuple[str, str, str], int] = {}
        self._spread: dict[tuple[str, ...], dict[str, int]] = {}
        self.pods = pods
        self.guarded = [p for p in pods if p.anti_affinity]
        """The Pods whose own anti-affinity may keep another Pod out (few, in most clusters)."""
        self.courting = [p for p in pods if p.courting]
        """The Pods whose affinity terms score other Pods' nodes."""
        self._courted: dict[str, dict[tuple[str, str], int]] = {}

    def fork(self) -> Neighbours:
        """A copy to try placements on: what the copy places, this one does not see."""
        twin = copy.copy(self)
        # place() rebinds the lists and clears the memos, so the copy needs memos of its own
        # (their entries are never changed in place, and still hold until the first place()).
        twin._domains, twin._selected, twin._spread = dict(self._domains), dict(self._selected), dict(self._spread)
        twin._counted, twin._courted = dict(self._counted), dict(self._courted)
        return twin

    def place(self, pod: PlacedPod) -> None:
        """A Pod this pass sends to ``pod.node``: the Pods after it must reckon with its replacement."""
        self.pods = [*self.pods, pod]
        self.guarded = [*self.guarded, pod] if pod.anti_affinity else self.guarded
        self.courting = [*self.courting, pod] if pod.courting else self.courting
        self._courted.clear()
        self._domains.clear()
        self._selected.clear()
        self._counted.clear()
        self._spread.clear()

    def selected(self, term: PodTerm, value: str | None, moving: str) -> PlacedPod | None:
        """A Pod but ``moving`` that ``term`` selects in its domain ``value`` (None: anywhere), or
        None. Remembered for the pass: every target in one zone asks the same of the same Pods."""
        memo = (repr(term), value, moving)
        if memo not in self._selected:
            domain = self.pods if value is None else self._domain(term.topology_key).get(value, [])
            self._selected[memo] = next((p for p in domain if p.name != moving and self.selects(term, p)), None)
        return self._selected[memo]

    def count(self, term: PodTerm, value: str, moving: str) -> int:
        """How many Pods but ``moving`` ``term`` selects in its domain ``value`` (remembered for
        the pass, as :meth:`selected`)."""
        memo = (repr(term), value, moving)
        if memo not in self._counted:
            self._counted[memo] = sum(1 for p in self._domain(term.topology_key).get(value, [])
                                      if p.name != moving and self.selects(term, p))
        return self._counted[memo]

    def courted(self, constraints: NodeConstraints) -> dict[tuple[str, str], int]:
        """(topology key, value) -> what the running Pods' own affinity terms that select the Pod
        ``constraints`` describe give the nodes of that domain (remembered for the pass)."""
        found = self._courted.get(constraints.name)
        if found is None:
            incoming = PlacedPod(constraints.name, constraints.namespace, constraints.labels, "")
            found = self._courted[constraints.name] = {}
            for pod in self.courting:
                if pod.name == constraints.name:
                    continue
                for weight, term in pod.courting:
                    value = self.node_labels.get(pod.node, {}).get(term.topology_key)
                    if value is not None and self.selects(term, incoming):
                        found[(term.topology_key, value)] = found.get((term.topology_key, value), 0) + weight
        return found

    def spread_counts(self, spread: SpreadConstraint, constraints: NodeConstraints) -> dict[str, int]:
        """The Pods ``spread`` counts in each of its domains, as kube-scheduler's PodTopologySpread
        filter counts them: in the Pod's namespace, on the nodes that carry every key of the Pod's
        constraints and that its nodeSelector and node affinity admit (``nodeAffinityPolicy:
        Honor``, the default; taints are ignored, ``nodeTaintsPolicy: Ignore``); every such
        domain counts, empty ones too. The Pod that moves no longer counts where it was."""
        return self.domain_counts(spread.topology_key, tuple(s.topology_key for s in constraints.spread),
                                  constraints, repr(spread), partial(self.selects, spread.term(constraints.namespace)))

    def domain_counts(self, key: str, keys: tuple[str, ...], constraints: NodeConstraints, counted: str,
                       counts_pod: Callable[[PlacedPod], bool]) -> dict[str, int]:
        """The Pods but the moving one that ``counts_pod`` (described by ``counted``, for the memo)
        picks in each domain of ``key``, on the nodes that carry every one of ``keys`` and that the
        Pod's nodeSelector and node affinity admit; every such domain counts, empty ones too."""
        memo = (counted, key, repr(constraints.node_selector), repr(constraints.required_terms), repr(keys),
                constraints.namespace, constraints.name)
        counts = self._spread.get(memo)
        if counts is None:
            eligible = {node: labels[key] for node, labels in self.node_labels.items()
                        if key in labels and all(k in labels for k in keys)
                        and _labels_problem(constraints, node, labels) is None}
            counts = self._spread[memo] = dict.fromkeys(eligible.values(), 0)
            for pod in self.pods:
                if pod.node in eligible and pod.name != constraints.name and counts_pod(pod):
                    counts[eligible[pod.node]] += 1
        return counts

    def selects(self, term: PodTerm, pod: PlacedPod) -> bool:
        """Whether ``term`` selects ``pod``: its namespace, then its labels."""
        if term.selector is None:
            return False
        if term.namespaces is not None and pod.namespace not in term.namespaces:
            if term.namespace_selector is None:
                return False
            if self.namespace_labels is not None and not selector_matches(
                    term.namespace_selector, self.namespace_labels.get(pod.namespace, {})):
                return False
        return selector_matches(term.selector, pod.labels)

    def _domain(self, key: str) -> dict[str, list[PlacedPod]]:
        """The running Pods by their node's value of ``key`` (one walk over them per key)."""
        domains = self._domains.get(key)
        if domains is None:
            domains = self._domains[key] = {}
            for pod in self.pods:
                value = self.node_labels.get(pod.node, {}).get(key)
                if value is not None:
                    domains.setdefault(value, []).append(pod)
        return domains


def replacement(constraints: NodeConstraints, node: str) -> PlacedPod:
    """The Pod that will replace the one ``constraints`` describe, once it runs on ``node``."""
    return PlacedPod(f"{constraints.name} (replacement)", constraints.namespace, constraints.labels, node,
                     constraints.pod_anti_affinity, constraints.owner,
                     _courting(constraints.preferred_pod_terms, constraints.pod_affinity))


def inter_pod_problem(constraints: NodeConstraints, node: str, neighbours: Neighbours) -> str | None:
    """None when the Pod's required inter-Pod affinity and anti-affinity, its ``DoNotSchedule``
    topology spread constraints and every running Pod's required anti-affinity let it run on
    ``node`` (kube-scheduler's InterPodAffinity and PodTopologySpread filters), else why not. The
    Pod that moves (``constraints.name``) no longer counts where it was."""
    labels = neighbours.node_labels.get(node, {})
    incoming = PlacedPod(constraints.name, constraints.namespace, constraints.labels, node)
    affinity = constraints.pod_affinity
    if affinity:
        missing = next((t.topology_key for t in affinity if labels.get(t.topology_key) is None), None)
        if missing is not None:
            return f"required pod affinity: {node} has no label {missing}"
        unmet = next((t for t in affinity if neighbours.selected(t, labels[t.topology_key], constraints.name) is None),
                     None)
        # The first Pod of a group that selects itself may start anywhere the keys are, as
        # kube-scheduler allows when no other Pod matches any term and it matches them all.
        if unmet is not None and not (all(neighbours.selects(t, incoming) for t in affinity) and all(
                neighbours.selected(t, None, constraints.name) is None for t in affinity)):
            return (f"required pod affinity ({unmet.topology_key}): no Pod it must run beside shares {node}'s "
                    f"{unmet.topology_key}")
    for term in constraints.pod_anti_affinity:
        value = labels.get(term.topology_key)
        if value is None:
            continue
        clash = neighbours.selected(term, value, constraints.name)
        if clash is not None:
            return f"required pod anti-affinity ({term.topology_key}): {clash.name} shares {node}'s {term.topology_key}"
    for spread in constraints.spread:
        value = labels.get(spread.topology_key)
        if value is None:
            return f"topology spread: {node} has no label {spread.topology_key}"
        counts = neighbours.spread_counts(spread, constraints)
        fewest = min(counts.values(), default=0)
        if spread.min_domains is not None and len(counts) < spread.min_domains:
            fewest = 0
        there = counts.get(value, 0) + (1 if neighbours.selects(spread.term(constraints.namespace), incoming) else 0)
        if there - fewest > spread.max_skew:
            return (f"topology spread ({spread.topology_key}): {there} matching Pods in {node}'s domain with it, "
                    f"{fewest} in the emptiest, max skew {spread.max_skew}")
    for other in neighbours.guarded:
        if other.name == constraints.name:
            continue
        for term in other.anti_affinity:
            value = labels.get(term.topology_key)
            if (value is not None and neighbours.node_labels.get(other.node, {}).get(term.topology_key) == value
                    and neighbours.selects(term, incoming)):
                return f"{other.name}'s required pod anti-affinity ({term.topology_key}) keeps it off {node}"
    return None


def preferred_pod_affinity_weight(constraints: NodeConstraints, node: str, neighbours: Neighbours) -> int:
    """What kube-scheduler's InterPodAffinity score counts for ``node``: each of the Pod's own
    preferred terms' weight for every running Pod it selects in ``node``'s topology domain, and
    each running Pod's term that selects this Pod, where ``node`` shares that Pod's domain
    (:meth:`Neighbours.courted`); negative for anti-affinity.

    >>> web = PodTerm({"matchLabels": {"app": "web"}}, frozenset({"shop"}), "zone")
    >>> pods = [PlacedPod(f"shop/web-{n}", "shop", {"app": "web"}, f"n{n}") for n in (1, 2)]
    >>> near = Neighbours({"n1": {"zone": "a"}, "n2": {"zone": "a"}, "n3": {"zone": "b"}}, pods)
    >>> wants = NodeConstraints(name="shop/api-1", preferred_pod_terms=((40, web),))
    >>> [preferred_pod_affinity_weight(wants, n, near) for n in ("n1", "n3")]
    [80, 0]
    """
    labels = neighbours.node_labels.get(node, {})
    own = sum(weight * neighbours.count(term, labels[term.topology_key], constraints.name)
              for weight, term in constraints.preferred_pod_terms if term.topology_key in labels)
    courted = neighbours.courted(constraints)
    return own + sum(weight for (key, value), weight in courted.items() if labels.get(key) == value)


DEFAULT_SPREAD = (SpreadConstraint(3, "kubernetes.io/hostname", None),
                  SpreadConstraint(5, "topology.kubernetes.io/zone", None))
"""kube-scheduler's default spreading (its PodTopologySpread ``systemDefaulted`` constraints,
``ScheduleAnyway``, max skew 3 over hosts and 5 over zones) for a Pod that states no spread
constraint of its own; they count its controller's other Pods."""
DEFAULT_SPREAD_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
"""The controllers whose selector that default spreading counts a Pod's siblings by (Services'
too, which are not read here)."""


def spread_scores(constraints: NodeConstraints, nodes: Sequence[str], neighbours: Neighbours) -> list[int | None]:
    """kube-scheduler's PodTopologySpread score of each of ``nodes`` (those that can take the Pod)
    before it is normalized: the higher, the more crowded. Per ``ScheduleAnyway`` constraint whose
    key the node carries, the Pods it counts in the node's domain x ln(domains among ``nodes`` + 2)
    (so the few domains of a zone key are not watered down by the many of a hostname key), plus
    max skew - 1 (so a larger skew tolerates more); summed and rounded. None for a node lacking a
    key of the Pod's own constraints, which that plugin ignores (scores 0). A Pod with no spread
    constraint of its own, made by a ReplicaSet, StatefulSet or ReplicationController, is spread
    by :data:`DEFAULT_SPREAD` from its controller's other Pods, and a node lacking the zone key is
    then scored by its host alone. Pods count only on nodes the Pod's node affinity admits
    (``nodeAffinityPolicy: Honor``).

    >>> spread = SpreadConstraint(1, "zone", {"matchLabels": {"app": "web"}})
    >>> pods = [PlacedPod(f"shop/web-{n}", "shop", {"app": "web"}, f"n{n}") for n in (1, 2)]
    >>> near = Neighbours({"n1": {"zone": "a"}, "n2": {"zone": "a"}, "n3": {"zone": "b"}, "n4": {}}, pods)
    >>> spreads = NodeConstraints(name="shop/web-3", namespace="shop", soft_spread=(spread,))
    >>> spread_scores(spreads, ["n1", "n3", "n4"], near)  # 2 x ln(2 zones + 2) = 2.77
    [3, 0, None]
    """
    explicit = bool(constraints.soft_spread or constraints.spread)
    if explicit:
        spreads = constraints.soft_spread
    elif constraints.owner.partition("/")[0] in DEFAULT_SPREAD_OWNERS:
        spreads = DEFAULT_SPREAD
    else:
        spreads = ()
    if not spreads:
        return [0] * len(nodes)
    labels_of = [neighbours.node_labels.get(node, {}) for node in nodes]
    # Only the Pod's own constraints need every key: default spreading still spreads by host on
    # nodes without a zone label.
    keys = tuple(spread.topology_key for spread in spreads) if explicit else ()
    scored = [labels for labels in labels_of if all(k in labels for k in keys)]
    terms = []
    for spread in spreads:
        if spread.topology_key == "kubernetes.io/hostname":
            size = len(scored)
        else:
            size = len({labels.get(spread.topology_key, "") for labels in scored})
        if explicit:
            counts = neighbours.domain_counts(spread.topology_key, keys, constraints, repr(spread),
                                               partial(neighbours.selects, spread.term(constraints.namespace)))
        else:
            counts = neighbours.domain_counts(
                spread.topology_key, keys, constraints, f"siblings of {constraints.owner}",
                lambda pod: pod.owner == constraints.owner and pod.namespace == constraints.namespace)
        terms.append((spread, math.log(size + 2), counts))
    scores: list[int | None] = []
    for labels in labels_of:
        if not all(k in labels for k in keys):
            scores.append(None)
            continue
        raw = sum(counts.get(labels[spread.topology_key], 0) * weight + spread.max_skew - 1
                  for spread, weight, counts in terms if spread.topology_key in labels)
        scores.append(math.floor(raw + 0.5))  # Go's math.Round: halves away from zero
    return scores


def _spread_constraints(spec: Mapping[str, Any], labels: Mapping[str, Any],
                        when: str = "DoNotSchedule") -> tuple[SpreadConstraint, ...] | None:
    """The Pod's topology spread constraints whose ``whenUnsatisfiable`` is ``when``; None when
    they cannot be read. ``matchLabelKeys`` narrow the selector to the Pod's own values of those
    labels (typically ``pod-template-hash``: one rollout's Pods are spread apart from the last
    one's), as kube-scheduler merges them; a key the Pod does not carry is left out, as it leaves
    it out."""
    listed = spec.get("topologySpreadConstraints")
    if listed is None:
        return ()
    if not isinstance(listed, list):
        return None
    found = []
    for entry in listed:
        if not isinstance(entry, Mapping):
            return None
        if entry.get("whenUnsatisfiable") in {"ScheduleAnyway", "DoNotSchedule"} - {when}:
            continue
        skew, key, min_domains = entry.get("maxSkew"), entry.get("topologyKey"), entry.get("minDomains")
        if (entry.get("whenUnsatisfiable") != when or type(skew) is not int or skew < 1
                or not isinstance(key, str) or not (min_domains is None or type(min_domains) is int)):
            return None
        selector, keys = entry.get("labelSelector"), entry.get("matchLabelKeys") or []
        if not isinstance(keys, list):
            return None
        if isinstance(selector, Mapping) and any(k in labels for k in keys):
            own = [{"key": k, "operator": "In", "values": [labels[k]]} for k in keys if k in labels]
            selector = {**selector, "matchExpressions": [*(selector.get("matchExpressions") or []), *own]}
        found.append(SpreadConstraint(skew, key, selector if isinstance(selector, Mapping) else None, min_domains))
    return tuple(found)


def _pod_terms(spec: Mapping[str, Any], kind: str, namespace: str) -> tuple[PodTerm, ...] | None:
    """The required terms of ``affinity.<kind>``; None when they cannot be read."""
    listed = _affinity_block(spec, kind).get("requiredDuringSchedulingIgnoredDuringExecution")
    if listed is None:
        return ()
    if not isinstance(listed, list):
        return None
    terms = [_pod_term(term, namespace) for term in listed]
    return None if None in terms else tuple(term for term in terms if term is not None)


def _preferred_pod_terms(spec: Mapping[str, Any], namespace: str) -> tuple[tuple[int, PodTerm], ...]:
    """The ``preferredDuringSchedulingIgnoredDuringExecution`` terms of ``podAffinity`` and, with
    their weight negated, of ``podAntiAffinity``. They only rank nodes, so one that cannot be read
    is left out (the API server would have refused it)."""
    found = []
    for kind, sign in (("podAffinity", 1), ("podAntiAffinity", -1)):
        listed = _affinity_block(spec, kind).get("preferredDuringSchedulingIgnoredDuringExecution")
        for entry in listed if isinstance(listed, list) else ():
            weight = entry.get("weight") if isinstance(entry, Mapping) else None
            if isinstance(weight, int) and (term := _pod_term(entry.get("podAffinityTerm"), namespace)) is not None:
                found.append((sign * weight, term))
    return tuple(found)


def _node_affinity_terms(spec: Mapping[str, Any]) -> tuple[tuple[Any, ...] | None, tuple[tuple[int, Any], ...]]:
    """The required ``nodeSelectorTerms`` of ``affinity.nodeAffinity`` (None where nothing is
    required; a requirement that cannot be read has no terms, so no node matches it) and the
    preferred terms with their weights (one without a whole weight ranks nothing)."""
    node_affinity = _affinity_block(spec, "nodeAffinity")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[Any, ...] | None = None
    if required is not None:
        listed = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
        terms = tuple(listed) if isinstance(listed, list) else ()
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    preferences = tuple((term["weight"], term.get("preference")) for term in preferred
                        if isinstance(term, Mapping) and type(term.get("weight")) is int) \
        if isinstance(preferred, list) else ()
    return terms, preferences


def _affinity_block(spec: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    affinity = spec.get("affinity")
    block = affinity.get(kind) if isinstance(affinity, Mapping) else None
    return block if isinstance(block, Mapping) else {}


def _pod_term(term: Any, namespace: str) -> PodTerm | None:
    """One ``PodAffinityTerm`` of a Pod in ``namespace``; None when it cannot be read."""
    if not isinstance(term, Mapping) or not isinstance(term.get("topologyKey"), str):
        return None
    selector, names, by_labels = term.get("labelSelector"), term.get("namespaces"), term.get("namespaceSelector")
    if not isinstance(names, list | None) or not isinstance(by_labels, Mapping | None):
        return None
    # The namespaces listed and those the selector matches, together; neither: the Pod's own;
    # an empty selector: every namespace (the API's rules for a PodAffinityTerm).
    namespaces = frozenset(map(str, names or ())) or (frozenset({namespace}) if by_labels is None else frozenset())
    return PodTerm(selector if isinstance(selector, Mapping) else None,
                   None if by_labels is not None and not by_labels else namespaces, term["topologyKey"],
                   by_labels or None)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """Whether a label selector (``matchLabels``, ``matchExpressions``) matches ``labels``."""
    match_labels, expressions = selector.get("matchLabels") or {}, selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return False
    return (all(labels.get(key) == value for key, value in match_labels.items())
            and all(_requirement_holds(e, labels) for e in expressions))
