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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""``PreferNoSchedule`` only lowers a node's score; these two keep a Pod that does not tolerate them off."""


@dataclass(frozen=True)
class VolumeAffinity:
    """Where one of a Pod's bound volumes can be reached from."""

    claim: str
    volume: str
    """The PersistentVolume bound to ``claim`` ("" when none is: no node reaches it)."""
    terms: tuple[Any, ...]
    """Its ``spec.nodeAffinity.required.nodeSelectorTerms``."""


@dataclass(frozen=True)
class NodeConstraints:
    """What a Pod asks of a node's labels and taints."""

    node_selector: Mapping[str, Any] | None = field(default_factory=dict)
    """Labels the node must carry; None: the Pod's ``nodeSelector`` is not a map (no node)."""
    required_terms: tuple[Any, ...] | None = None
    """``nodeSelectorTerms`` of ``requiredDuringSchedulingIgnoredDuringExecution``; None: none required."""
    tolerations: tuple[Any, ...] = ()
    volumes: tuple[VolumeAffinity, ...] = ()
    """Its bound volumes that only some nodes reach (read from the cluster: :func:`volume_affinity`)."""


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


def node_constraints(pod: Mapping[str, Any], volumes: tuple[VolumeAffinity, ...] = ()) -> NodeConstraints:
    """The constraints a Pod's spec puts on its node (none for a spec that states none).

    >>> node_constraints({"spec": {"nodeSelector": {"pool": "db"}}}).node_selector
    {'pool': 'db'}
    """
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return NodeConstraints()
    selector = spec.get("nodeSelector")
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
                if isinstance(node_affinity, Mapping) else None)
    terms: tuple[Any, ...] | None = None
    if required is not None:
        listed = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
        terms = tuple(listed) if isinstance(listed, list) else ()
    tolerations = spec.get("tolerations")
    return NodeConstraints(
        node_selector=selector if isinstance(selector, Mapping) else ({} if selector is None else None),
        required_terms=terms,
        tolerations=tuple(tolerations) if isinstance(tolerations, list) else (),
        volumes=volumes,
    )


def constraint_problem(constraints: NodeConstraints, node: str, labels: Mapping[str, str],
                       taints: Sequence[Any]) -> str | None:
    """None when the node admits the Pod, else why not.

    >>> db = NodeConstraints(node_selector={"pool": "db"})
    >>> constraint_problem(db, "node-b", {"pool": "web"}, [])
    'nodeSelector pool=db: node-b has pool=web'
    >>> gpu = [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]
    >>> constraint_problem(NodeConstraints(), "node-g", {}, gpu)
    'taint gpu=a100:NoSchedule on node-g is not tolerated'
    >>> constraint_problem(NodeConstraints(tolerations=({"key": "gpu", "operator": "Exists"},)), "node-g", {}, gpu)
    """
    if constraints.node_selector is None:
        return "its nodeSelector is not a map"
    for key, wanted in constraints.node_selector.items():
        if labels.get(key) != wanted:
            has = f"{key}={labels[key]}" if key in labels else f"no label {key}"
            return f"nodeSelector {key}={wanted}: {node} has {has}"
    if constraints.required_terms is not None and not any(
            _term_matches(term, node, labels) for term in constraints.required_terms):
        return f"required node affinity: {node} matches none of its {len(constraints.required_terms)} term(s)"
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
