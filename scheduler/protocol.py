"""The extender wire protocol of k8s.io/kube-scheduler/extender/v1.

The Go structs carry no JSON tags, so the keys are the Go field names (``Pod``, ``NodeNames``...).
Go's decoder matches keys case-insensitively, so requests are read that way too.
"""

from __future__ import annotations

import json
from typing import Any, NotRequired, TypedDict

from oversale.pods import shape_problem

MIN_PRIORITY = 0
MAX_PRIORITY = 10


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


class BadRequest(ValueError):
    """Not a payload of the extender protocol."""


def _fold(payload: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise BadRequest("body is not a JSON object")
    by_lower = {key.lower(): key for key in fields}
    return {by_lower[key.lower()]: value for key, value in payload.items() if key.lower() in by_lower}


def parse_args(body: bytes) -> ExtenderArgs:
    try:
        payload = _fold(json.loads(body), ("Pod", "Nodes", "NodeNames"))
    except ValueError as error:
        raise BadRequest(f"body is not JSON: {error}") from None
    if not isinstance(payload.get("Pod"), dict):
        raise BadRequest("ExtenderArgs has no Pod")
    problem = shape_problem(payload["Pod"])
    if problem:
        raise BadRequest(f"ExtenderArgs.Pod: {problem}")
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
    try:
        payload = _fold(json.loads(body), ("PodName", "PodNamespace", "PodUID", "Node"))
    except ValueError as error:
        raise BadRequest(f"body is not JSON: {error}") from None
    for key in ("PodName", "PodNamespace", "Node"):
        if not isinstance(payload.get(key), str) or not payload[key]:
            raise BadRequest(f"ExtenderBindingArgs has no {key}")
    payload.setdefault("PodUID", "")
    typed: ExtenderBindingArgs = payload  # type: ignore[assignment]
    return typed
