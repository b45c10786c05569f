"""The parts of a namespace's LimitRanges that bound how far requests may be lowered.

The LimitRanger admission plugin *validates* Pods after mutating webhooks have run, so a Pod this
service compressed below a ``min``, or past a ``maxLimitRequestRatio`` (limit / request), would be
rejected. ``max`` and defaults never matter: lowering a request cannot exceed a max, and defaults
were applied before the webhook saw the Pod.
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

    def floor_for(self, limit: int | None) -> int:
        """The smallest request that satisfies this bound for a given limit."""
        floor = self.min
        if limit is not None and self.max_limit_request_ratio:
            floor = max(floor, math.ceil(limit / self.max_limit_request_ratio))
        return floor

    def tighten(self, other: Bound) -> Bound:
        """Both bounds at once (several LimitRanges in a namespace all apply)."""
        ratios = [r for r in (self.max_limit_request_ratio, other.max_limit_request_ratio) if r]
        return Bound(max(self.min, other.min), min(ratios) if ratios else None)


@dataclass(frozen=True)
class RequestBounds:
    """Per resource, the Container and Pod bounds of every LimitRange in a namespace."""

    container: Mapping[str, Bound] = field(default_factory=dict)
    pod: Mapping[str, Bound] = field(default_factory=dict)

    def for_container(self, resource: str) -> Bound:
        return self.container.get(resource, Bound())

    def for_pod(self, resource: str) -> Bound:
        return self.pod.get(resource, Bound())


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
    ratio = (item.get("maxLimitRequestRatio") or {}).get(resource)
    if minimum is None and ratio is None:
        return None
    try:
        return Bound(
            min=parse_amount(resource, minimum) if minimum is not None else 0,
            max_limit_request_ratio=parse_quantity(ratio) if ratio is not None else None,
        )
    except QuantityError:
        return None
