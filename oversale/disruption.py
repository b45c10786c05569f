"""PodDisruptionBudgets as kube-scheduler's preemption counts them.

kube-scheduler's preemption honours PodDisruptionBudgets only as a preference: on each candidate
node it gives victims back whose eviction would break a budget before the others, and among the
candidates it picks the node whose victims break the fewest (``NumPDBViolations``). A preemption
deletes its victims rather than evicting them, so nothing else holds a budget there. An extender
that adds victims of its own therefore has to do the same, or kube-scheduler would prefer a node
where the extender's victims break budgets it never counted.

The rules are kube-scheduler's own (``filterPodsWithPDBViolation``): a budget covers the Pods of
its namespace its selector matches; a missing or empty selector matches none (where an eviction
would treat an empty one as every Pod), nor is a Pod without labels covered; a Pod already in the
budget's ``status.disruptedPods`` is being disrupted and is not counted again. Each Pod covered
spends one of the budget's ``status.disruptionsAllowed``; a Pod that takes any budget below zero
breaks it, and counts once however many budgets it breaks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oversale.node_fit import selector_matches


@dataclass(frozen=True)
class DisruptionBudget:
    """What preemption reads of one PodDisruptionBudget."""

    namespace: str
    selector: Mapping[str, Any]
    """Its ``spec.selector``: never empty (an empty one matches no Pod here)."""
    allowed: int
    """``status.disruptionsAllowed``."""
    disrupted: frozenset[str] = frozenset()
    """Names of Pods in ``status.disruptedPods``: their disruption has been counted already."""

    def covers(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        return (bool(labels) and namespace == self.namespace and name not in self.disrupted
                and selector_matches(self.selector, labels))


def disruption_budget(pdb: Mapping[str, Any] | None) -> DisruptionBudget | None:
    """A PodDisruptionBudget object as preemption reads it, or None where it covers no Pod (no
    selector, an empty one, or one that cannot be read).

    >>> budget = disruption_budget({"metadata": {"namespace": "shop", "name": "web"},
    ...     "spec": {"selector": {"matchLabels": {"app": "web"}}}, "status": {"disruptionsAllowed": 1}})
    >>> budget.covers("shop", "web-1", {"app": "web"}), budget.covers("shop", "db-0", {"app": "db"})
    (True, False)
    >>> disruption_budget({"metadata": {"namespace": "shop"}, "spec": {"selector": {}}}) is None
    True
    """
    if not isinstance(pdb, Mapping):
        return None
    metadata, spec, status = (pdb.get(part) for part in ("metadata", "spec", "status"))
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    if not isinstance(metadata, Mapping) or not isinstance(selector, Mapping):
        return None
    labels, expressions = selector.get("matchLabels") or {}, selector.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not isinstance(expressions, list) or not (labels or expressions):
        return None
    status = status if isinstance(status, Mapping) else {}
    allowed = status.get("disruptionsAllowed") or 0
    disrupted = status.get("disruptedPods") or {}
    # Before the disruption controller first writes its status, nothing is allowed: the API's default.
    return DisruptionBudget(str(metadata.get("namespace") or ""), selector,
                            allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
                            frozenset(map(str, disrupted)) if isinstance(disrupted, Mapping) else frozenset())


class Allowances:
    """What is left of each budget's allowed disruptions as victims are counted, one by one."""

    def __init__(self, budgets: Sequence[DisruptionBudget]) -> None:
        self._budgets = list(budgets)
        self._left = [budget.allowed for budget in self._budgets]

    def copy(self) -> Allowances:
        other = Allowances(())
        other._budgets, other._left = self._budgets, list(self._left)
        return other

    def spend(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Count one more victim; True when it breaks a budget (takes one below zero)."""
        broken = False
        for index, budget in enumerate(self._budgets):
            if budget.covers(namespace, name, labels):
                self._left[index] -= 1
                broken = broken or self._left[index] < 0
        return broken
