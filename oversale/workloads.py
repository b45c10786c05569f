"""Workloads as the reconcilers see them: their pod template's requests, which Pods (by name, so
Pods gone since still count in history) belong to them, and their ratio plan.

Pod names follow their controller: a Deployment's Pods are ``<name>-<template hash>-<5 chars>``,
a StatefulSet's ``<name>-<ordinal>``, a DaemonSet's ``<name>-<5 chars>``, a CronJob's
``<name>-<scheduled minute>-<5 chars>`` (``<name>-<scheduled minute>-<index>-<5 chars>`` for an
Indexed Job). All but the StatefulSet's are generated names: the API server cuts the prefix a
controller asks for (``generateName``) to 58 characters before it adds the 5 random ones, so a
long-named workload's Pods are 63 characters long and end without the rest of the prefix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from oversale.annotations import AnnotationKeys, current_ratio, format_ratio, parse_switch, read_ratios, wants
from oversale.compression import exclusive_cpus
from oversale.errors import InvalidAnnotation
from oversale.estimator import (
    CompressionEstimator,
    Proposal,
    RatioPlan,
    UsageStats,
    compression_proposal,
    merge_pods,
    stabilize,
)
from oversale.pods import controller_of, requests_of
from oversale.quantity import CPU, MEMORY

KINDS = ("Deployment", "StatefulSet", "DaemonSet", "CronJob")
_SUFFIX = re.compile(r"^[a-z0-9]{5}$")
# A ReplicaSet's pod-template-hash is its uint32 template hash in decimal, each digit mapped by
# apimachinery's SafeEncodeString to one of "4-9bcdf" (plain digits before Kubernetes 1.11): a
# segment with any other letter (``exporter`` in ``node-exporter-x2kqp``) is no hash, and the Pod
# is not the Deployment ``node``'s.
_HASH = re.compile(r"^[0-9bcdf]{1,10}$")
_DIGITS = re.compile(r"^\d+$")
GENERATED_PREFIX_LENGTH = 58
"""The API server's ``maxGeneratedNameLength``: 63 (a Pod name's limit) less 5 random characters."""
# What may follow ``<name>-`` in a cut generated prefix: the start of ``<hash>-`` (a Deployment's)
# or of ``<minute>-`` (a CronJob's Job's). An Indexed Job's Pods keep their ``-<index>-``: the Job
# controller cuts the Job's name before it instead (podGenerateNameWithIndex), down to no digit of
# the minute at all.
_CUT_HASH = re.compile(r"^([0-9bcdf]{0,10}|[0-9bcdf]{1,10}-)$")
_CUT_MINUTE = re.compile(r"^(\d*|\d+-|\d*-\d+-)$")

WorkloadKey = tuple[str, str, str]
"""(kind, namespace, name)"""


def pod_template(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = workload.get("spec") or {}
    if workload.get("kind") == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    template: Mapping[str, Any] = spec.get("template") or {}
    return template


def template_requests(workload: Mapping[str, Any], resource: str) -> dict[str, int]:
    """Container name -> request of ``resource`` in the pod template (init containers included)."""
    spec = pod_template(workload).get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return {str(c["name"]): amount for c in containers if (amount := requests_of(c).get(resource))}


class PodIndex:
    """Finds the workload a Pod name belongs to, in O(1) per Pod."""

    def __init__(self, workloads: Mapping[WorkloadKey, Any]) -> None:
        # A name may stand for workloads of several kinds (a Deployment and a StatefulSet `redis`):
        # their Pods' names tell them apart.
        self._kinds: dict[tuple[str, str], set[str]] = {}
        for kind, ns, name in workloads:
            self._kinds.setdefault((ns, name), set()).add(kind)
        # Names of GENERATED_PREFIX_LENGTH or more: their Pods' names start with the first 58 only.
        self._by_cut_name: dict[tuple[str, str], tuple[str, str]] = {
            (ns, name[:GENERATED_PREFIX_LENGTH]): (kind, name) for kind, ns, name in workloads
            if len(name) >= GENERATED_PREFIX_LENGTH and kind in ("Deployment", "DaemonSet")}

    def owner(self, namespace: str, pod: str) -> WorkloadKey | None:
        """The workload whose Pod is named ``pod``, or None.

        >>> index = PodIndex({("Deployment", "shop", "checkout"): None,
        ...                   ("Deployment", "shop", "payments-reconciliation-worker-europe-west1-canary"): None})
        >>> index.owner("shop", "checkout-5d8f9c7b6-x2kqp")
        ('Deployment', 'shop', 'checkout')
        >>> index.owner("shop", "payments-reconciliation-worker-europe-west1-canary-5d8f9c7x2kqp")
        ('Deployment', 'shop', 'payments-reconciliation-worker-europe-west1-canary')
        """
        parts = pod.split("-")
        if len(parts) >= 3 and _SUFFIX.match(parts[-1]):
            name, middle = "-".join(parts[:-2]), parts[-2]
            kinds = self._kinds.get((namespace, name), ())
            if "Deployment" in kinds and _HASH.match(middle):
                return "Deployment", namespace, name
            if "CronJob" in kinds and _DIGITS.match(middle):
                return "CronJob", namespace, name
        if len(parts) >= 4 and _SUFFIX.match(parts[-1]) and _DIGITS.match(parts[-2]) and _DIGITS.match(parts[-3]):
            name = "-".join(parts[:-3])
            if "CronJob" in self._kinds.get((namespace, name), ()):  # an Indexed Job's Pod
                return "CronJob", namespace, name
        if len(parts) >= 2:
            name, last = "-".join(parts[:-1]), parts[-1]
            kinds = self._kinds.get((namespace, name), ())
            if "StatefulSet" in kinds and _DIGITS.match(last):
                return "StatefulSet", namespace, name
            if "DaemonSet" in kinds and _SUFFIX.match(last):
                return "DaemonSet", namespace, name
        if len(pod) == GENERATED_PREFIX_LENGTH + 5:
            return self._cut_owner(namespace, pod[:GENERATED_PREFIX_LENGTH])
        return None

    def _cut_owner(self, namespace: str, prefix: str) -> WorkloadKey | None:
        """The workload whose generated Pod names start with ``prefix``, a prefix the API server
        cut to 58 characters: ``<name>-`` and the start of what follows it, or a long name's start.
        Where two workloads' cut prefixes are the same (``x``, 57 characters, and ``x-blue``), their
        Pods cannot be told apart: the longer name is taken."""
        if (found := self._by_cut_name.get((namespace, prefix))) is not None:
            return found[0], namespace, found[1]
        dash = len(prefix)
        while (dash := prefix.rfind("-", 0, dash)) > 0:  # the longest name first
            name, rest = prefix[:dash], prefix[dash + 1:]
            kinds = self._kinds.get((namespace, name))
            if kinds is None:
                continue
            for kind, follows in (("Deployment", _CUT_HASH.match(rest)), ("DaemonSet", not rest),
                                  ("CronJob", _CUT_MINUTE.match(rest))):
                if kind in kinds and follows:
                    return kind, namespace, name
        return None


def usage_by_container(per_pod: Mapping[str, Mapping[str, UsageStats]]) -> dict[str, UsageStats]:
    """One resource's stats per container, merged over a workload's Pods (``pod -> container``)."""
    containers: dict[str, list[UsageStats]] = {}
    for by_container in per_pod.values():
        for container, stats in by_container.items():
            containers.setdefault(container, []).append(stats)
    return {container: merge_pods(found) for container, found in containers.items()}


@dataclass(kw_only=True)
class WorkloadPlan(RatioPlan):
    """What the compression reconciler wants for one workload."""

    key: WorkloadKey
    skipped: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Resource -> (reason code for metrics, explanation for people) when it is not reconciled."""
    hpa_name: str = ""
    """The HPA that scales the workload, if any."""
    hpa_targets: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Resource -> (original target utilization, the target now) of the HPA's utilization targets
    it keeps rescaled (see :func:`rescaled_targets`)."""

    def rescaled_targets(self, ratios: Mapping[str, Decimal]) -> dict[str, tuple[int, int]]:
        """Resource -> (original, new target) for each HPA target that differs from
        ``original x ratio`` at ``ratios`` (the ratios in effect on the workload): after a change,
        and also after a rescale that failed, or an HPA added to a workload already right-sized."""
        wanted = {r: (original, round(original * ratios.get(r, Decimal(1))))
                  for r, (original, _) in self.hpa_targets.items()}
        return {r: (original, new) for r, (original, new) in wanted.items() if new != self.hpa_targets[r][1]}


def utilization_target(hpa: Mapping[str, Any], resource: str) -> int | None:
    """The averageUtilization target an autoscaling/v2 HPA sets on ``resource``, if any."""
    for metric in (hpa.get("spec") or {}).get("metrics") or []:
        source = metric.get("resource") or metric.get("containerResource") or {}
        target = source.get("target") or {}
        if metric.get("type") in ("Resource", "ContainerResource") and source.get("name") == resource \
                and target.get("type") == "Utilization":
            value = target.get("averageUtilization")
            return int(value) if value is not None else None
    return None


def workload_hpa(autoscalers: Mapping[WorkloadKey, Mapping[str, Any]], key: WorkloadKey,
                 controller: tuple[str, str] | None) -> Mapping[str, Any] | None:
    """The HorizontalPodAutoscaler that scales the workload ``key`` (``autoscalers``: by their
    ``scaleTargetRef``): one naming it, else one naming its own ``controller``, an operator's
    resource that serves ``scale`` and owns the workload. Either measures utilization against the
    requests of the workload's Pods.

    >>> hpa = {"metadata": {"name": "orders"}, "spec": {"scaleTargetRef": {"kind": "KafkaConnect", "name": "orders"}}}
    >>> workload_hpa({("KafkaConnect", "prod", "orders"): hpa}, ("Deployment", "prod", "orders-connect"),
    ...              ("KafkaConnect", "orders")) is hpa
    True
    >>> web = {"metadata": {"name": "web"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}}}
    >>> workload_hpa({("Deployment", "prod", "web"): web}, ("Deployment", "prod", "web"), None) is web
    True
    """
    if key in autoscalers:
        return autoscalers[key]
    return autoscalers.get((controller[0], key[1], controller[1])) if controller else None


def plan_compression(
    workload: Mapping[str, Any],
    usage: Mapping[str, Mapping[str, UsageStats]],
    hpa: Mapping[str, Any] | None,
    keys: AnnotationKeys,
    estimator: CompressionEstimator,
    rescale_hpa: bool = False,
    vpa: Mapping[str, str] | None = None,
) -> WorkloadPlan:
    """The ratios one opted-in workload should carry. ``usage``: resource -> container -> stats.

    A workload scaled by a utilization HPA is skipped for that resource (lower requests raise the
    measured utilization and make the HPA scale out), unless ``rescale_hpa``: then the HPA's
    target is multiplied by the ratio so the absolute threshold stays where it was. An HPA that
    names the workload's owner (:func:`workload_hpa`) is never rescaled: the owner may scale other
    workloads too, each with its own ratio. A resource
    whose requests a VerticalPodAutoscaler sets (``vpa``: resource -> its name) is skipped.
    """
    metadata = workload.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    plan = WorkloadPlan(key=(str(workload.get("kind")), metadata.get("namespace", ""), metadata.get("name", "")))
    minimum = min(estimator.min_ratio, Decimal(1))
    hpa_metadata = (hpa or {}).get("metadata") or {}
    plan.hpa_name = str(hpa_metadata.get("name", ""))
    scaled = ((hpa or {}).get("spec") or {}).get("scaleTargetRef") or {}
    owner_scaled = (f"{scaled.get('kind', '')} {scaled.get('name', '')}"
                    if scaled and (scaled.get("kind"), scaled.get("name")) != plan.key[::2] else "")
    # A value nobody can read counts as 1, as the webhook counts it; the table says so, or a
    # typo would sit there unseen until the reconciler next writes a ratio over it.
    ignored = {problem.key: f"; {problem}" for problem in
               read_ratios(annotations, keys.requests_ratio, lambda resource: estimator.max_ratio, "read as 1",
                           minimum).problems}
    for resource in (CPU, MEMORY):
        key = keys.requests_ratio(resource)
        plan.current[resource] = current_ratio(annotations, key, minimum)
        left = _left_to_others(resource, workload, annotations, keys, vpa)
        if left is not None:
            plan.skipped[resource] = (left[0], left[1] + ignored.get(key, ""))
            continue
        target = utilization_target(hpa, resource) if hpa else None
        original = None
        if target is not None:
            if (not_rescaled := _hpa_not_rescaled(resource, plan.hpa_name, hpa_metadata, owner_scaled,
                                                  rescale_hpa)) is not None:
                plan.skipped[resource] = not_rescaled
                continue
            record = keys.original_target_utilization_of(resource)
            recorded = (hpa_metadata.get("annotations") or {}).get(record)
            original = _original_target(recorded, target)
            if original is None:
                # Rescaling from the current target would compound every earlier rescale.
                plan.skipped[resource] = ("invalid-annotation", f"HPA {plan.hpa_name}: {record} {recorded!r} is not a "
                                          "whole percentage above 0; not right-sized until it is set to the target "
                                          "before rescaling")
                continue
        proposal = compression_proposal(resource, template_requests(workload, resource), usage.get(resource, {}),
                                        estimator)
        ratio, why = stabilize(plan.current[resource], proposal.ratio, estimator.stability)
        reason = (f"{proposal.reason}; {why}" if why else proposal.reason) + ignored.get(key, "")
        plan.proposals[resource] = Proposal(ratio, reason, proposal.demand)
        if original is not None and target is not None:
            plan.hpa_targets[resource] = (original, target)
    return plan


def _left_to_others(resource: str, workload: Mapping[str, Any], annotations: Mapping[str, str],
                    keys: AnnotationKeys, vpa: Mapping[str, str] | None) -> tuple[str, str] | None:
    """Why ``resource``'s requests of the workload are not right-sized whatever its usage
    (reason code, explanation): a VerticalPodAutoscaler sets them, memory not opted in, or
    exclusive CPUs; None where they may be."""
    if vpa and resource in vpa:
        # Its admission controller sets the Pods' requests to its own recommendation; a ratio
        # on top would divide that (the webhook leaves it alone), and VPA would scale the
        # limits by the compressed request.
        return "vpa", f"its {resource} requests are set by VerticalPodAutoscaler {vpa[resource]}"
    if resource == MEMORY and not wants(annotations, keys.enable_memory_compress):
        return "memory-not-opted-in", _not_opted_in(annotations, keys.enable_memory_compress)
    exclusive = exclusive_cpus(dict(pod_template(workload)), keys) if resource == CPU else None
    if exclusive:
        # The webhook and resize keep such a Pod's cpu request; a ratio would only say otherwise.
        return "exclusive-cpus", f"cpu request kept: {exclusive}"
    return None


def _hpa_not_rescaled(resource: str, hpa_name: str, hpa_metadata: Mapping[str, Any], owner_scaled: str,
                      rescale_hpa: bool) -> tuple[str, str] | None:
    """Why ``resource``, which an HPA scales the workload on by its utilization, is not
    right-sized (reason code, explanation): the HPA's target would have to be rescaled with it,
    and it is not done (``rescale_hpa`` off), or cannot be (the HPA scales the workload's owner,
    ``owner_scaled``, or another controller manages its spec); None where it is."""
    if not rescale_hpa or owner_scaled:
        return "hpa", (f"scaled by HPA {hpa_name} on {resource} utilization"
                       + (f" through {owner_scaled}, the workload's owner: its target is not rescaled"
                          if owner_scaled else ""))
    if manager := controller_of(hpa_metadata):
        # KEDA's ScaledObject (and the like) writes its HPA's spec back from its own on every
        # change: a rescaled target would be put back, and the HPA would scale out.
        return "hpa-managed", (f"scaled by HPA {hpa_name} on {resource} utilization, whose spec {manager[0]} "
                               f"{manager[1]} manages: its target cannot be rescaled")
    return None


def _original_target(recorded: str | None, target: int) -> int | None:
    """The HPA's utilization target before any rescaling: the recorded one, else the current
    one (never rescaled yet); None when the record cannot be read.

    >>> _original_target(None, 60), _original_target("60", 75), _original_target("60%", 75), _original_target("0", 75)
    (60, 60, None, None)
    >>> _original_target("1", 75)
    1
    """
    if recorded is None:
        return target
    try:
        original = int(recorded)
    except ValueError:
        return None
    return original if original > 0 else None


def _not_opted_in(annotations: Mapping[str, str], key: str) -> str:
    try:
        parse_switch(annotations.get(key, "n"))
    except InvalidAnnotation as error:
        return f"memory not opted in: {key} {error}"
    return f"memory not opted in (set {key}: y)"


def describe_change(plan: WorkloadPlan) -> str:
    """One line for the last-change annotation and the Event."""
    return "; ".join(
        f"{resource} {format_ratio(plan.current.get(resource, Decimal(1)))} -> {format_ratio(p.ratio)}: {p.reason}"
        for resource, p in plan.changes().items()
    )
