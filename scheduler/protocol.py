"""The extender wire protocol of k8s.io/kube-scheduler/extender/v1.

The Go structs carry no JSON tags, so the keys are the Go field names (``Pod``, ``NodeNames``...).
Go's decoder matches keys case-insensitively, so requests are read that way too.
"""

from __future__ import annotations

import json
from typing import Any, NotRequired, TypedDict

from oversale.pods import shape_problem


class NodeList(TypedDict):
    metadata: dict[str, Any]
    items: list[dict[str, Any]]


class ExtenderArgs(TypedDict):
    Pod: dict[str, Any]
    Nodes: NotRequired[NodeList | None]
    NodeNames: NotRequired[list[str] | None]


class ExtenderFilterResult(TypedDict, total=False):
    Nodes: NodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int


class ExtenderBindingArgs(TypedDict):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(TypedDict, total=False):
    Error: str


class MetaPod(TypedDict):
    UID: str


class MetaVictims(TypedDict):
    """Victims by UID only: what kube-scheduler sends with ``nodeCacheCapable`` and what every
    extender answers with."""

    Pods: list[MetaPod]
    NumPDBViolations: int


class ExtenderPreemptionArgs(TypedDict):
    """Read into one shape whichever form was sent (``NodeNameToVictims`` carries whole Pods when
    ``nodeCacheCapable`` is false): node -> the victims kube-scheduler chose there."""

    Pod: dict[str, Any]
    NodeNameToMetaVictims: dict[str, MetaVictims]


class ExtenderPreemptionResult(TypedDict, total=False):
    NodeNameToMetaVictims: dict[str, MetaVictims]
    Error: str
    """Not a field of the Go type (kube-scheduler ignores it: no node, no preemption); said for
    the log and the metrics."""


class BadRequest(ValueError):
    """Not a payload of the extender protocol."""


def _fold(payload: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise BadRequest("body is not a JSON object")
    by_lower = {key.lower(): key for key in fields}
    return {by_lower[key.lower()]: value for key, value in payload.items() if key.lower() in by_lower}


def _decoded(body: bytes, fields: tuple[str, ...]) -> dict[str, Any]:
    try:
        decoded = json.loads(body)
    except ValueError as error:
        raise BadRequest(f"body is not JSON: {error}") from None
    return _fold(decoded, fields)


def _with_pod(body: bytes, kind: str, fields: tuple[str, ...]) -> dict[str, Any]:
    """The payload, its Pod checked to be one (the policies read it without further checks)."""
    payload = _decoded(body, fields)
    if not isinstance(payload.get("Pod"), dict):
        raise BadRequest(f"{kind} has no Pod")
    problem = shape_problem(payload["Pod"])
    if problem:
        raise BadRequest(f"{kind}.Pod: {problem}")
    return payload


def parse_args(body: bytes) -> ExtenderArgs:
    payload = _with_pod(body, "ExtenderArgs", ("Pod", "Nodes", "NodeNames"))
    nodes = payload.get("Nodes")
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, dict) else False
        if not (items is None or (isinstance(items, list) and all(isinstance(node, dict) for node in items))):
            raise BadRequest("ExtenderArgs.Nodes has no items list of Node objects")
    names = payload.get("NodeNames")
    if names is not None and not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
        raise BadRequest("ExtenderArgs.NodeNames is not a list of node names")
    typed: ExtenderArgs = payload  # type: ignore[assignment]  # shape checked above
    return typed


def parse_binding(body: bytes) -> ExtenderBindingArgs:
    payload = _decoded(body, ("PodName", "PodNamespace", "PodUID", "Node"))
    for key in ("PodName", "PodNamespace", "Node"):
        if not isinstance(payload.get(key), str) or not payload[key]:
            raise BadRequest(f"ExtenderBindingArgs has no {key}")
    payload.setdefault("PodUID", "")
    typed: ExtenderBindingArgs = payload  # type: ignore[assignment]
    return typed


def parse_preemption(body: bytes) -> ExtenderPreemptionArgs:
    payload = _with_pod(body, "ExtenderPreemptionArgs", ("Pod", "NodeNameToVictims", "NodeNameToMetaVictims"))
    victims: dict[str, MetaVictims] = {}
    # kube-scheduler sends one of the two; were both there, the UIDs it named itself count.
    for field, whole in (("NodeNameToMetaVictims", False), ("NodeNameToVictims", True)):
        by_node = payload.get(field)
        if by_node is None:
            continue
        if not isinstance(by_node, dict):
            raise BadRequest(f"ExtenderPreemptionArgs.{field} is not an object of node names")
        for node, sent in by_node.items():
            if node not in victims:
                victims[node] = _victims(sent, whole, f"ExtenderPreemptionArgs.{field}[{node!r}]")
    return {"Pod": payload["Pod"], "NodeNameToMetaVictims": victims}


def _victims(sent: Any, whole: bool, where: str) -> MetaVictims:
    """One node's victims as UIDs (``whole``: the Pods themselves were sent)."""
    fields = _fold(sent, ("Pods", "NumPDBViolations")) if isinstance(sent, dict) else None
    if fields is None or not isinstance(fields.get("Pods") or [], list):
        raise BadRequest(f"{where} has no Pods list")
    pods: list[MetaPod] = []
    for index, pod in enumerate(fields.get("Pods") or []):
        if not isinstance(pod, dict):
            raise BadRequest(f"{where}.Pods[{index}] is not an object")
        if whole:
            metadata = pod.get("metadata")
            uid = metadata.get("uid") if isinstance(metadata, dict) else None
        else:
            uid = _fold(pod, ("UID",)).get("UID")
        if not isinstance(uid, str) or not uid:
            raise BadRequest(f"{where}.Pods[{index}] has no UID")
        pods.append({"UID": uid})
    violations = fields.get("NumPDBViolations") or 0
    if not isinstance(violations, int) or isinstance(violations, bool):
        raise BadRequest(f"{where}.NumPDBViolations is not an integer")
    return {"Pods": pods, "NumPDBViolations": violations}
