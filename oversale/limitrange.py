"""What a namespace's LimitRanges and ResourceQuotas allow a request to become.

The LimitRanger and ResourceQuota admission plugins *validate* Pods after mutating webhooks have
run, so a Pod this service compressed below a ``min`` or past a ``maxLimitRequestRatio`` (limit /
request), or raised above a ``max`` or past the quota's remaining ``requests.cpu``/``requests.memory``,
would be rejected. Defaults never matter: they were applied before the webhook saw the Pod. A
quota with scopes (a PriorityClass, BestEffort, Terminating...) binds only the Pods its scopes
match, so its headroom is matched to each Pod as the API server matches it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from oversale.errors import QuantityError
from oversale.pods import qos_class
from oversale.quantity import RESOURCES, parse_amount, parse_quantity


@dataclass(frozen=True)
class Bound:
    """What one LimitRange type (Container or Pod) says about one resource's request."""

    min: int = 0
    """Smallest allowed request (millicores or bytes); 0 when unbounded."""
    max_limit_request_ratio: Fraction | None = None
    """Largest allowed limit / request, or None when unbounded."""
    max: int | None = None
    """Largest allowed request (a LimitRange ``max`` bounds requests as well as limits)."""

    @property
    def bounds_requests(self) -> bool:
        """Whether this bound can raise a request's floor (a min, or a limit/request ratio)."""
        return bool(self.min or self.max_limit_request_ratio)

    def floor_for(self, limit: int | None) -> int:
        """The smallest request that satisfies this bound for a given limit."""
        floor = self.min
        if limit is not None and self.max_limit_request_ratio:
            floor = max(floor, math.ceil(limit / self.max_limit_request_ratio))
        return floor

    def tighten(self, other: Bound) -> Bound:
        """Both bounds at once (several LimitRanges in a namespace all apply)."""
        ratios = [r for r in (self.max_limit_request_ratio, other.max_limit_request_ratio) if r]
        maxima = [m for m in (self.max, other.max) if m is not None]
        return Bound(max(self.min, other.min), min(ratios) if ratios else None, min(maxima) if maxima else None)


UNBOUNDED = Bound()
"""No LimitRange rule for a resource (shared: a Bound is frozen)."""


@dataclass(frozen=True)
class QuotaRoom:
    """What one ResourceQuota still lets the Pods it binds request, and which Pods it binds."""

    headroom: Mapping[str, int]
    """Resource -> ``hard - used`` of its requests bound (never below 0)."""
    name: str = ""
    scopes: tuple[Mapping[str, Any], ...] = ()
    """Its ``scopes`` (as ``Exists`` requirements) and ``scopeSelector.matchExpressions``: it
    binds a Pod when every one holds (:func:`scope_holds`)."""

    def binds(self, pod: Mapping[str, Any]) -> bool:
        return all(scope_holds(scope, pod) for scope in self.scopes)


@dataclass(frozen=True)
class RequestBounds:
    """Per resource, the Container and Pod bounds of every LimitRange in a namespace, and the
    namespace's ResourceQuotas."""

    container: Mapping[str, Bound] = field(default_factory=dict)
    pod: Mapping[str, Bound] = field(default_factory=dict)
    quota_headroom: Mapping[str, int] = field(default_factory=dict)
    """Resource -> how much more the Pod at hand may request: the tightest ``hard - used`` of the
    quotas that bind it (:meth:`bound_to` fills it from ``quotas``); absent when none bounds it."""
    quota_names: Mapping[str, str] = field(default_factory=dict)
    """Resource -> the name of the quota ``quota_headroom`` is the headroom of (what a user
    looks up with ``kubectl describe resourcequota``)."""
    quotas: tuple[QuotaRoom, ...] = ()
    """The namespace's quotas, not yet matched to a Pod."""

    def for_container(self, resource: str) -> Bound:
        return self.container.get(resource, UNBOUNDED)

    def for_pod(self, resource: str) -> Bound:
        return self.pod.get(resource, UNBOUNDED)

    def with_quotas(self, quotas: Iterable[Mapping[str, Any]]) -> RequestBounds:
        """These bounds plus ResourceQuota objects (with their ``status``)."""
        return RequestBounds(self.container, self.pod, self.quota_headroom, self.quota_names,
                             (*self.quotas, *filter(None, map(quota_room, quotas))))

    def bound_to(self, pod: Mapping[str, Any], held: Mapping[str, int] | None = None) -> RequestBounds:
        """These bounds for ``pod``: ``quota_headroom`` over the quotas whose scopes bind it, as
        the ResourceQuota admission plugin matches them; ``held``: what the Pod already counts in
        their ``used`` (a running Pod's own requests), which it may take again."""
        if not self.quotas and not held:
            return self
        held = held or {}
        headroom: dict[str, int] = {}
        names: dict[str, str] = {}
        given = [QuotaRoom({r: left}, self.quota_names.get(r, "")) for r, left in self.quota_headroom.items()]
        for room in (*given, *(q for q in self.quotas if q.binds(pod))):
            for resource, left in room.headroom.items():
                left += held.get(resource, 0)
                if resource not in headroom or left < headroom[resource]:
                    headroom[resource], names[resource] = left, room.name
        return RequestBounds(self.container, self.pod, headroom, {r: n for r, n in names.items() if n})

    def after_growth(self, pod: Mapping[str, Any], added: Mapping[str, int]) -> RequestBounds:
        """These bounds once ``pod`` grew by ``added`` (resource -> amount): the quotas that bind
        it have that much less left for the next Pod."""
        def less(headroom: Mapping[str, int]) -> dict[str, int]:
            return {r: max(left - added.get(r, 0), 0) for r, left in headroom.items()}

        return RequestBounds(self.container, self.pod, less(self.quota_headroom), self.quota_names,
                             tuple(QuotaRoom(less(q.headroom), q.name, q.scopes) if q.binds(pod) else q
                                   for q in self.quotas))


NO_BOUNDS = RequestBounds()


def bounds_from_limit_ranges(limit_ranges: Iterable[Mapping[str, Any]]) -> RequestBounds:
    """Fold LimitRange objects (or just their ``spec``) into the bounds compression must honour.

    Unparseable quantities are ignored: the API server validates LimitRanges on write, so such a
    value cannot come from a real cluster.
    """
    bounds: dict[str, dict[str, Bound]] = {"Container": {}, "Pod": {}}
    for limit_range in limit_ranges:
        spec = limit_range.get("spec", limit_range)
        for item in spec.get("limits") or []:
            kind = item.get("type")
            if kind not in bounds:
                continue
            for resource in RESOURCES:
                bound = _bound_of(item, resource)
                if bound is not None:
                    current = bounds[kind].get(resource, Bound())
                    bounds[kind][resource] = current.tighten(bound)
    return RequestBounds(container=bounds["Container"], pod=bounds["Pod"])


def _bound_of(item: Mapping[str, Any], resource: str) -> Bound | None:
    minimum = (item.get("min") or {}).get(resource)
    maximum = (item.get("max") or {}).get(resource)
    ratio = (item.get("maxLimitRequestRatio") or {}).get(resource)
    if minimum is None and ratio is None and maximum is None:
        return None
    try:
        return Bound(
            min=parse_amount(resource, minimum) if minimum is not None else 0,
            max_limit_request_ratio=parse_quantity(ratio) if ratio is not None else None,
            max=parse_amount(resource, maximum) if maximum is not None else None,
        )
    except QuantityError:
        return None


# ResourceQuota spells a requests bound two ways: ``requests.cpu`` and the older bare ``cpu``.
_QUOTA_KEYS = {resource: (f"requests.{resource}", resource) for resource in RESOURCES}


def quota_room(quota: Mapping[str, Any]) -> QuotaRoom | None:
    """One ResourceQuota's room for more requests, or None when it bounds no cpu or memory request.

    ``used`` is as this copy of the quota was last read: the ResourceQuota plugin adds each Pod
    to it as it admits it, so Pods admitted since are not in it and the headroom is a best
    estimate (see docs/policies.md, raising requests).
    """
    status, spec = quota.get("status") or {}, quota.get("spec") or {}
    hard, used = status.get("hard") or spec.get("hard") or {}, status.get("used") or {}
    headroom: dict[str, int] = {}
    for resource, keys in _QUOTA_KEYS.items():
        for key in keys:
            if key not in hard:
                continue
            try:
                left = max(parse_amount(resource, hard[key]) - parse_amount(resource, used.get(key, "0")), 0)
            except QuantityError:
                continue
            headroom[resource] = min(headroom.get(resource, left), left)
    if not headroom:
        return None
    scopes = [{"scopeName": name, "operator": "Exists"} for name in spec.get("scopes") or []]
    scopes += (spec.get("scopeSelector") or {}).get("matchExpressions") or []
    return QuotaRoom(headroom, str((quota.get("metadata") or {}).get("name") or ""), tuple(scopes))


def scope_holds(scope: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether one scope requirement of a ResourceQuota holds for ``pod``, by the rules of the
    API server's Pod quota evaluator: a scope it does not know for Pods (``VolumeAttributesClass``
    binds claims) never holds. The Priority admission plugin runs before mutating webhooks, so a
    Pod left without a class already carries the cluster's default ``priorityClassName`` here."""
    spec = pod.get("spec") or {}
    name = str(scope.get("scopeName"))
    if name in ("Terminating", "NotTerminating"):
        deadline = spec.get("activeDeadlineSeconds")
        terminating = isinstance(deadline, int) and deadline >= 0
        return bool(terminating == (name == "Terminating"))
    if name in ("BestEffort", "NotBestEffort"):
        return (qos_class(pod) == "BestEffort") == (name == "BestEffort")
    if name == "PriorityClass":
        klass, values = str(spec.get("priorityClassName") or ""), scope.get("values") or []
        # The evaluator matches a label set that always holds the key (the class name, maybe
        # empty): Exists asks for a non-empty name, and DoesNotExist never holds.
        held = {"Exists": bool(klass), "In": klass in values, "NotIn": klass not in values}
        return held.get(str(scope.get("operator")), False)
    if name == "CrossNamespacePodAffinity":
        return _cross_namespace_affinity(spec)
    return False


def _cross_namespace_affinity(spec: Mapping[str, Any]) -> bool:
    """Whether a (anti-)affinity term, required or preferred, names namespaces or selects them."""
    affinity = spec.get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        block = affinity.get(kind) or {}
        terms = [*(block.get("requiredDuringSchedulingIgnoredDuringExecution") or []),
                 *((weighted.get("podAffinityTerm") or {})
                   for weighted in block.get("preferredDuringSchedulingIgnoredDuringExecution") or [])]
        if any(term.get("namespaces") or term.get("namespaceSelector") is not None for term in terms):
            return True
    return False
