"""Node admission: the mutating webhook that oversells Nodes, and the validating webhook that
refuses a ratio cut the Pods already on the node would not fit in.

Glue only: the formula and the choice of real values are in ``oversale.node_oversale``.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import orjson

from kube.client import one_line
from oversale.annotations import AnnotationKeys, AnnotationProblem, wants
from oversale.node_oversale import (
    NodePolicy,
    NodeResult,
    keep_record,
    lowest_safe_ratio,
    node_policy_from_annotations,
    oversell_node,
    oversold_allocatable,
    read_record,
)
from oversale.patch import make_patch
from oversale.pods import is_terminal, scheduled_request
from oversale.quantity import RESOURCES, format_amount, parse_amount
from oversale.settings import Settings
from webhook.memo import Memo
from webhook.reviews import AdmissionRequest, AdmissionReview, allow, deny

log = logging.getLogger(__name__)


class NodePods(Protocol):
    """Lists the Pods bound to a node (live; raises when the cluster cannot be asked)."""

    def on_node(self, node: str) -> list[dict[str, Any]]: ...


@dataclass
class NodeDecision:
    review: AdmissionReview
    outcome: str
    node: str = ""
    result: NodeResult | None = None
    problems: tuple[AnnotationProblem, ...] = ()
    dry_run: bool = False


def admit_node(request: AdmissionRequest, settings: Settings, writes: StatusWrites | None = None) -> NodeDecision:
    """Answer a Node review; ``writes``, when given, remembers status-write answers (built with
    the same ``settings``)."""
    uid = request["uid"]
    node = request.get("object")
    if not _is_node_review(request) or node is None:
        return NodeDecision(allow(uid), "skipped")
    name = str((node.get("metadata") or {}).get("name", ""))
    stored = request.get("oldObject")
    operation, subresource = request["operation"], request.get("subResource", "")
    keys = settings.keys
    original_annotations = (node.get("metadata") or {}).get("annotations")

    if operation == "UPDATE" and stored is not None and not subresource:
        # The node strategy puts the stored status back after admission on a main-resource update;
        # only the record can change here, and it must keep describing that stored status.
        annotations = keep_record(node, stored, keys)
        patch = make_patch(original_annotations, _or_none(annotations, original_annotations), "/metadata/annotations")
        return NodeDecision(allow(uid, patch), "mutated" if patch else "unchanged", name)
    if not (operation == "CREATE" or (operation == "UPDATE" and subresource == "status" and stored is not None)):
        return NodeDecision(allow(uid), "skipped", name)

    username = (request.get("userInfo") or {}).get("username", "")
    before = stored if operation == "UPDATE" else None
    from_kubelet = settings.is_kubelet_of(username, name)
    policy, result, patch = (writes.answer(node, before, from_kubelet) if writes is not None
                             else reshape_status_write(settings, node, before, from_kubelet))
    for problem in policy.problems:
        log.warning("node %s: %s", name, problem)
    review = allow(uid, patch, [*map(str, policy.problems), *policy.warnings, *result.warnings])
    return NodeDecision(review, "mutated" if patch else "unchanged", name, result, policy.problems,
                        dry_run=bool(request.get("dryRun")))


Reshaped = tuple[NodePolicy, NodeResult, list[dict[str, Any]]]


def reshape_status_write(settings: Settings, node: dict[str, Any], stored: dict[str, Any] | None,
                         from_kubelet: bool) -> Reshaped:
    """The policy, the reshaped Node and the patch for a CREATE (``stored`` None) or a status
    UPDATE. Reads only the Node's annotations and status allocatable/capacity, and the stored
    Node's record annotations and status allocatable/capacity (what :class:`StatusWrites` keys on)."""
    original_annotations = (node.get("metadata") or {}).get("annotations")
    policy = node_policy_from_annotations(original_annotations or {}, settings.keys, settings.oversale_limits)
    result = oversell_node(node, stored, from_kubelet, policy)
    status = node.get("status") or {}
    patch = [
        *make_patch(original_annotations, _or_none(result.annotations, original_annotations), "/metadata/annotations"),
        *make_patch(status.get("allocatable"), _or_none(result.allocatable, status.get("allocatable")),
                    "/status/allocatable"),
        *make_patch(status.get("capacity"), _or_none(result.capacity, status.get("capacity")), "/status/capacity"),
    ]
    if patch and not isinstance(node.get("status"), dict):
        # A Node without a status object has nothing to oversell; never invent one (a patch into
        # a missing or malformed status would not apply, and the API server would refuse the write).
        patch = []
    return policy, result, patch


class StatusWrites:
    """Answers to recent Node status writes, by everything an answer depends on.

    The kubelet re-sends the same allocatable and capacity in each status update of a node (its
    conditions and heartbeat times change, our inputs do not), so a node's next write usually asks
    what its last one asked. The key is exactly what :func:`reshape_status_write` reads.
    """

    def __init__(self, settings: Settings, size: int = 4096) -> None:
        self.settings = settings
        self._memo: Memo[Reshaped] = Memo(size)

    def answer(self, node: dict[str, Any], stored: dict[str, Any] | None, from_kubelet: bool) -> Reshaped:
        """:func:`reshape_status_write` under this memo's settings."""
        return self._memo.get(self._key(node, stored, from_kubelet),
                              lambda: reshape_status_write(self.settings, node, stored, from_kubelet))

    def _key(self, node: dict[str, Any], stored: dict[str, Any] | None, from_kubelet: bool) -> Hashable | None:
        # One bytes object (see webhook.memo): a node whose annotations change on every write
        # would otherwise leave tuples for the collector to traverse on every miss.
        try:
            key = [(node.get("metadata") or {}).get("annotations"), _status_part(node), from_kubelet, stored is None]
            if stored is not None:
                kept = (stored.get("metadata") or {}).get("annotations") or {}
                key += [{name: kept[name] for name in self.settings.keys.node_record_keys() if name in kept},
                        _status_part(stored)]
            return orjson.dumps(key)
        except (AttributeError, TypeError):  # a malformed Node: answered (and failed open) without the memo
            return None


def _status_part(node: dict[str, Any]) -> list[Any]:
    """What the reshaping reads of a status: allocatable and capacity, or that it is no object."""
    status = node.get("status")
    if not isinstance(status, dict):
        return [False, status]
    return [True, status.get("allocatable"), status.get("capacity")]


def validate_node(request: AdmissionRequest, settings: Settings, pods: NodePods) -> AdmissionReview:
    """Refuse a ratio change on a Node whose Pods would no longer fit the lower allocatable."""
    uid = request["uid"]
    node, stored = request.get("object"), request.get("oldObject")
    if not _is_node_review(request) or request["operation"] != "UPDATE" or request.get("subResource") \
            or node is None or stored is None:
        return allow(uid)
    keys, limits = settings.keys, settings.oversale_limits
    before = node_policy_from_annotations(_annotations(stored), keys, limits)
    after = node_policy_from_annotations(_annotations(node), keys, limits)
    lowered = [r for r in RESOURCES if after.ratios.get(r, Decimal(1)) < before.ratios.get(r, Decimal(1))]
    if not lowered:
        return allow(uid)
    name = str((node.get("metadata") or {}).get("name", ""))
    record = read_record(_annotations(stored), keys)
    real = record.allocatable if record else ((stored.get("status") or {}).get("allocatable") or {})
    try:
        running = [p for p in pods.on_node(name) if not is_terminal(p)]
    except Exception as error:  # noqa: BLE001  -- fail open: a ratio change is the operator's call
        log.warning("node %s: could not list its Pods (%s); allowing the ratio change", name, one_line(error))
        return allow(uid, warnings=[f"could not check the Pods on {name} ({one_line(error)}); ratio change allowed "
                                    "unchecked"])
    problems = []
    for resource in lowered:
        if resource not in real:
            continue
        base = parse_amount(resource, real[resource])
        ratio = after.ratios.get(resource, Decimal(1))
        allocatable = oversold_allocatable(base, ratio)
        requested = sum(scheduled_request(p, resource) for p in running)
        if requested > allocatable:
            problems.append(_refusal(
                _asked(_annotations(node), keys, resource, after.ratios.get(resource)), resource, allocatable,
                len(running), name, requested, lowest_safe_ratio(base, requested), limits.max_for(resource)))
    if problems:
        return deny(uid, "; ".join(problems))
    return allow(uid)


def _asked(annotations: dict[str, str], keys: AnnotationKeys, resource: str, ratio: Decimal | None) -> str:
    """What the write asks for, in the user's words: the new ratio, a value that reads as no ratio
    (the reconciler writes ``1`` to stop overselling), removing it, or switching the node off."""
    short = keys.oversale_ratio(resource).split("/")[-1]
    if ratio is not None:
        return f"{short} {ratio}"
    if keys.mutate in annotations and not wants(annotations, keys.mutate):  # unclear reads as off, too
        return f"{keys.mutate.split('/')[-1]} {annotations[keys.mutate]}"
    text = annotations.get(keys.oversale_ratio(resource))
    return f"{short} {text}" if text is not None else f"removing {short}"


def _refusal(asked: str, resource: str, allocatable: int, count: int, node: str,
             requested: int, safe: Decimal, maximum: Decimal) -> str:
    message = (f"{asked} gives {format_amount(resource, allocatable)} allocatable; the {count} pods on {node} "
               f"request {format_amount(resource, requested)}; the lowest safe ratio is {safe}")
    if safe > maximum:
        message += f", above the maximum {maximum}: move pods off {node} first"
    return message


def _is_node_review(request: AdmissionRequest) -> bool:
    return request["kind"].get("kind") == "Node" and request["resource"].get("resource") == "nodes"


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _or_none(mutated: dict[str, str], original: Any) -> dict[str, str] | None:
    """Leave an absent map absent when it would stay empty."""
    return mutated if mutated or original is not None else None
