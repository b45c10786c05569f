"""What a namespace's LimitRanges and ResourceQuotas allow a request to become.

The LimitRanger and ResourceQuota admission plugins *validate* Pods after mutating webhooks have
run, so a Pod this service compressed below a ``min`` or past a ``maxLimitRequestRatio`` (limit /
request), or raised above a ``max`` or past the quota's remaining ``requests.cpu``/``requests.memory``,
would be rejected. Defaults never matter: they were applied before the webhook saw the Pod.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from oversale.errors import QuantityError
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
class RequestBounds:
    """Per resource, the Container and Pod bounds of every LimitRange in a namespace."""

    container: Mapping[str, Bound] = field(default_factory=dict)
    pod: Mapping[str, Bound] = field(default_factory=dict)
    quota_headroom: Mapping[str, int] = field(default_factory=dict)
    """Resource -> how much more the namespace's ResourceQuotas let Pods request (``hard - used``,
    the tightest quota); absent when no quota bounds it."""
    unscoped_quota_headroom: Mapping[str, int] = field(default_factory=dict)
    """The same over the quotas without scopes, which bind every Pod of the namespace: a scoped
    quota (a PriorityClass, BestEffort, Terminating...) may not bind a given Pod, so it can make a
    raise smaller but must not hold back a Pod's way back to its own requests."""

    def for_container(self, resource: str) -> Bound:
        return self.container.get(resource, UNBOUNDED)

    def for_pod(self, resource: str) -> Bound:
        return self.pod.get(resource, UNBOUNDED)

    def with_quotas(self, quotas: Iterable[Mapping[str, Any]]) -> RequestBounds:
        """These bounds plus the headroom of ResourceQuota objects (with their ``status``)."""
        quotas = list(quotas)
        return RequestBounds(self.container, self.pod, quota_headroom(quotas),
                             quota_headroom(q for q in quotas if not _scoped(q)))

    def after_growth(self, added: Mapping[str, int]) -> RequestBounds:
        """These bounds once a Pod of the namespace grew by ``added`` (resource -> amount): the
        quotas have that much less left for the next one."""
        def less(headroom: Mapping[str, int]) -> dict[str, int]:
            return {r: max(left - added.get(r, 0), 0) for r, left in headroom.items()}

        return RequestBounds(self.container, self.pod, less(self.quota_headroom), less(self.unscoped_quota_headroom))


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


def _scoped(quota: Mapping[str, Any]) -> bool:
    spec = quota.get("spec") or {}
    return bool(spec.get("scopes") or (spec.get("scopeSelector") or {}).get("matchExpressions"))


def quota_headroom(quotas: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Resource -> the smallest ``hard - used`` over the quotas that bound its requests.

    Every quota counts, whatever its scopes: a scoped quota that does not match the Pod can only
    make a raise smaller than it could be, never get a Pod rejected. ``used`` is the quota
    controller's last figure; Pods created since are not in it, so the headroom is a best
    estimate (see docs/policies.md, raising requests).
    """
    headroom: dict[str, int] = {}
    for quota in quotas:
        hard = ((quota.get("status") or {}).get("hard") or (quota.get("spec") or {}).get("hard") or {})
        used = (quota.get("status") or {}).get("used") or {}
        for resource, keys in _QUOTA_KEYS.items():
            for key in keys:
                if key not in hard:
                    continue
                try:
                    left = parse_amount(resource, hard[key]) - parse_amount(resource, used.get(key, "0"))
                except QuantityError:
                    continue
                headroom[resource] = min(headroom.get(resource, left), max(left, 0))
    return headroom
