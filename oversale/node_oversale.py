"""Node overselling: a Node's reported cpu/memory allocatable and capacity multiplied by a ratio.

One definition, applied to the *real* values the node's kubelet last reported::

    allocatable' = floor(real_allocatable x ratio)
    capacity'    = real_capacity + (allocatable' - real_allocatable)

so ``capacity - allocatable`` (what the node reserves for the system) stays true. CPU is in
integer millicores, memory in integer bytes. ``pods``, ``ephemeral-storage``, hugepages and
extended resources are never touched.

The output is a pure function of (real values, ratio), never of what a writer sent: once stored
allocatable differs from what the kubelet computes, the kubelet re-sends its real values on every
status sync, and other writers send back the oversold values they read, so multiplying whatever
arrives would compound the ratio. The real values live in annotations on the Node itself (the
"record"), read from the *stored* object, and are refreshed only from the node's own kubelet (or
on CREATE) when it sends a value that differs from the stored one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from oversale.annotations import (
    AnnotationKeys,
    AnnotationProblem,
    current_ratio,
    parse_switch,
    read_ratios,
    read_record_text,
    record_text,
)
from oversale.budget import budget_proposal
from oversale.errors import InvalidAnnotation, QuantityError
from oversale.estimator import OversaleEstimator, RatioPlan, UsageStats, oversale_proposal
from oversale.quantity import CPU, RESOURCES, format_amount, parse_amount

FIELDS = ("allocatable", "capacity")


@dataclass(frozen=True)
class OversaleLimits:
    """Inclusive upper bounds of the node oversale ratios; larger annotations are clamped."""

    max_cpu_ratio: Decimal = Decimal(5)
    max_memory_ratio: Decimal = Decimal(2)

    def max_for(self, resource: str) -> Decimal:
        return self.max_cpu_ratio if resource == CPU else self.max_memory_ratio


@dataclass(frozen=True)
class NodePolicy:
    """The ratio per resource a Node's annotations ask for, and what was wrong with them."""

    ratios: Mapping[str, Decimal]
    """Resource -> ratio > 1. A resource absent here is not oversold."""
    keys: AnnotationKeys = field(default_factory=AnnotationKeys)
    problems: tuple[AnnotationProblem, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RealValues:
    """What the kubelet reported, per field (allocatable, capacity) and resource, as it spelled it."""

    allocatable: Mapping[str, str]
    capacity: Mapping[str, str]

    def of(self, name: str) -> Mapping[str, str]:
        return self.allocatable if name == "allocatable" else self.capacity


@dataclass
class NodeResult:
    """The reshaped parts of a Node: annotations and status allocatable/capacity."""

    annotations: dict[str, str]
    allocatable: dict[str, str]
    capacity: dict[str, str]
    real: RealValues
    applied: dict[str, Decimal] = field(default_factory=dict)
    refreshed: list[str] = field(default_factory=list)
    """``field/resource`` whose real value was taken from this write (kubelet or CREATE)."""
    restored: list[str] = field(default_factory=list)
    """Resources that were oversold in the stored Node and are not any more."""
    warnings: list[str] = field(default_factory=list)


def node_policy_from_annotations(
    annotations: Mapping[str, str], keys: AnnotationKeys, limits: OversaleLimits
) -> NodePolicy:
    """Read a Node's oversale annotations. Never raises: a bad value means that resource is not
    oversold. A ``mutate`` value that is not a clear yes/no also turns overselling off, the safe side."""
    switch = annotations.get(keys.mutate)
    if switch is not None:
        try:
            if not parse_switch(switch):
                return NodePolicy({}, keys)
        except InvalidAnnotation as error:
            return NodePolicy({}, keys, (AnnotationProblem(keys.mutate, switch, f"{error}; node not oversold"),))
    reading = read_ratios(annotations, keys.oversale_ratio, limits.max_for, "not oversold")
    return NodePolicy(reading.ratios, keys, tuple(reading.problems), tuple(reading.warnings))


def oversold_allocatable(real_allocatable: int, ratio: Decimal) -> int:
    """``floor(real x ratio)``, exactly (in integers: a Decimal is a ratio of two integers).

    >>> oversold_allocatable(3920, Decimal("1.5")), oversold_allocatable(7, Decimal("1.33"))
    (5880, 9)
    """
    numerator, denominator = ratio.as_integer_ratio()
    return real_allocatable * numerator // denominator


def lowest_safe_ratio(real_allocatable: int, requested: int) -> Decimal:
    """The smallest ratio with two decimals whose oversold allocatable still holds ``requested``."""
    if requested <= real_allocatable:
        return Decimal(1)
    hundredths = math.ceil(Fraction(requested * 100, real_allocatable))
    return Decimal(hundredths) / 100


def read_record(annotations: Mapping[str, str] | None, keys: AnnotationKeys) -> RealValues | None:
    """The real values recorded on a stored Node, or None when there is no usable record."""
    if not annotations or keys.real_allocatable not in annotations:
        return None
    try:
        values = [read_record_text(annotations.get(key, "{}")) for key in (keys.real_allocatable, keys.real_capacity)]
        for value in values:
            if not isinstance(value, dict):
                return None
            for resource, text in value.items():
                parse_amount(resource, text)
    except (ValueError, TypeError, QuantityError):
        return None
    return RealValues(values[0], values[1])


def oversell_node(
    node: Mapping[str, Any], stored: Mapping[str, Any] | None, from_kubelet: bool, policy: NodePolicy
) -> NodeResult:
    """Reshape one write of a Node (CREATE when ``stored`` is None, else a status UPDATE).

    ``from_kubelet``: the writer is this node's own kubelet, whose values may become real.
    """
    keys = policy.keys
    stored_annotations = ((stored or {}).get("metadata") or {}).get("annotations") or {}
    record = read_record(stored_annotations, keys) if stored is not None else None
    result = NodeResult(
        annotations=dict((node.get("metadata") or {}).get("annotations") or {}),
        allocatable=dict(_status(node, "allocatable")),
        capacity=dict(_status(node, "capacity")),
        real=RealValues({}, {}),
    )
    if stored is not None and record is None and keys.real_allocatable in stored_annotations:
        result.warnings.append(f"annotation {keys.real_allocatable} on the stored Node is unreadable; "
                               "stored values taken as real")
    real = _real_values(node, stored, record, from_kubelet, result)
    result.real = RealValues(real["allocatable"], real["capacity"])
    was_applied = applied_ratios(stored_annotations, keys) if stored is not None else {}
    for resource in RESOURCES:
        real_allocatable = real["allocatable"].get(resource)
        if real_allocatable is not None:
            _reshape(result, resource, real_allocatable, real["capacity"].get(resource), policy.ratios.get(resource),
                     resource in was_applied)
    for key in keys.node_record_keys():
        result.annotations.pop(key, None)
    if result.applied:
        result.annotations[keys.real_allocatable] = record_text(real["allocatable"])
        result.annotations[keys.real_capacity] = record_text(real["capacity"])
        result.annotations[keys.applied_oversale_ratio] = record_text({r: str(v) for r, v in result.applied.items()})
    return result


def _real_values(node: Mapping[str, Any], stored: Mapping[str, Any] | None, record: RealValues | None,
                 from_kubelet: bool, result: NodeResult) -> dict[str, dict[str, str]]:
    """The real allocatable and capacity behind this write, field -> resource -> quantity.

    On CREATE, and where this node's kubelet sends a value other than the one stored, the value
    sent is real (listed in ``result.refreshed``). Anywhere else it is the stored value sent back,
    or comes from another writer, which sends the oversold values it read: the record of the real
    values counts, else the value stored. Negative values are dropped with a warning."""
    real: dict[str, dict[str, str]] = {"allocatable": {}, "capacity": {}}
    for name in FIELDS:
        incoming, current = _status(node, name), _status(stored, name) if stored is not None else {}
        for resource in RESOURCES:
            sent, kept = incoming.get(resource), current.get(resource)
            if stored is None or (from_kubelet and sent is not None and not _same(resource, sent, kept)):
                if sent is not None:
                    real[name][resource] = sent
                    result.refreshed.append(f"{name}/{resource}")
                continue
            recorded = record.of(name).get(resource) if record else None
            if recorded is not None:
                real[name][resource] = recorded
            elif kept is not None:
                real[name][resource] = kept
    for name in FIELDS:
        for resource, value in list(real[name].items()):
            if parse_amount(resource, value) < 0:
                # The API server never stores a negative quantity: such a value did not come from
                # a real kubelet, and writing it back would get the whole status write refused.
                del real[name][resource]
                result.warnings.append(f"{name}/{resource} {value!r} is negative; left as sent")
    return real


def _reshape(result: NodeResult, resource: str, real_allocatable: str, real_capacity: str | None,
             ratio: Decimal | None, was_applied: bool) -> None:
    """Write one resource's allocatable and capacity into ``result``: the real values where the
    node is not oversold for it (``restored`` when a ratio was applied before), else allocatable
    times the ratio and capacity raised by as much, so the system reserved stays what it was."""
    if ratio is None:
        _put(result.allocatable, resource, parse_amount(resource, real_allocatable), real_allocatable)
        if real_capacity is not None:
            _put(result.capacity, resource, parse_amount(resource, real_capacity), real_capacity)
        if was_applied:
            result.restored.append(resource)
        return
    base = parse_amount(resource, real_allocatable)
    oversold = oversold_allocatable(base, ratio)
    result.applied[resource] = ratio
    _put(result.allocatable, resource, oversold)
    if real_capacity is not None:
        _put(result.capacity, resource, parse_amount(resource, real_capacity) + oversold - base)


def keep_record(node: Mapping[str, Any], stored: Mapping[str, Any], keys: AnnotationKeys) -> dict[str, str]:
    """Annotations for a main-resource UPDATE of a Node (metadata/spec).

    The node strategy resets ``status`` to the stored one after admission on such an update, so the
    record describing that status must stay exactly as stored, whatever copy the writer sent.
    """
    annotations = dict((node.get("metadata") or {}).get("annotations") or {})
    stored_annotations = (stored.get("metadata") or {}).get("annotations") or {}
    for key in keys.node_record_keys():
        if key in stored_annotations:
            annotations[key] = stored_annotations[key]
        else:
            annotations.pop(key, None)
    return annotations


def applied_ratios(annotations: Mapping[str, str], keys: AnnotationKeys) -> dict[str, str]:
    """Resource -> ratio text from the record of what the webhook applied (empty when none)."""
    try:
        applied = read_record_text(annotations.get(keys.applied_oversale_ratio, "{}"))
    except ValueError:
        return {}
    return applied if isinstance(applied, dict) else {}


def _status(node: Mapping[str, Any] | None, name: str) -> Mapping[str, str]:
    return ((node or {}).get("status") or {}).get(name) or {}


def _same(resource: str, a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return parse_amount(resource, a) == parse_amount(resource, b)
    except QuantityError:
        return a == b


def _put(values: dict[str, str], resource: str, amount: int, spelling: str | None = None) -> None:
    """Set ``resource`` to ``amount``, keeping the present spelling when the amount is unchanged
    (so a write that changes nothing yields no patch)."""
    present = values.get(resource)
    if present is not None and _same(resource, present, format_amount(resource, amount)):
        return
    values[resource] = spelling if spelling is not None else format_amount(resource, amount)


@dataclass(kw_only=True)
class NodePlan(RatioPlan):
    """What the oversale reconciler wants for one node."""

    name: str
    requested: dict[str, int] = field(default_factory=dict)
    real_allocatable: dict[str, int] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    """Other annotations to write with the ratios (the hot-time account), only those that changed."""
    multipliers: dict[str, float] = field(default_factory=dict)
    """The hot-time account's multipliers the proposals were made with (resource -> multiplier)."""


def real_allocatable_of(node: Mapping[str, Any], keys: AnnotationKeys) -> dict[str, int]:
    """The kubelet's real allocatable: the webhook's record when oversold, else the status."""
    record = read_record((node.get("metadata") or {}).get("annotations"), keys)
    values = record.allocatable if record else _status(node, "allocatable")
    return {r: parse_amount(r, values[r]) for r in RESOURCES if r in values}


def plan_node(
    node: Mapping[str, Any],
    requested: Mapping[str, int],
    usage: Mapping[str, UsageStats | None],
    keys: AnnotationKeys,
    estimator: OversaleEstimator,
    budgets: Mapping[str, float] | None = None,
    multipliers: Mapping[str, float] | None = None,
) -> NodePlan:
    """The oversale ratios one opted-in node should carry (``usage``: resource -> stats or None,
    summarising each resource's budget quantile). With ``budgets`` (resource -> hot-time budget)
    the ratio is the budget's, its target scaled by the account's ``multipliers``."""
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    plan = NodePlan(name=str(metadata.get("name", "")), requested=dict(requested),
                    real_allocatable=real_allocatable_of(node, keys), multipliers=dict(multipliers or {}))
    for resource in RESOURCES:
        if resource not in plan.real_allocatable:
            continue
        plan.current[resource] = current_ratio(annotations, keys.oversale_ratio(resource))
        if budgets is not None and resource in budgets:
            plan.proposals[resource] = budget_proposal(
                resource, requested.get(resource, 0), plan.real_allocatable[resource], usage.get(resource),
                plan.current[resource], estimator, budgets[resource], (multipliers or {}).get(resource, 1.0))
        else:
            plan.proposals[resource] = oversale_proposal(
                resource, requested.get(resource, 0), plan.real_allocatable[resource], usage.get(resource),
                plan.current[resource], estimator)
    return plan
