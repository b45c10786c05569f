"""In-place resize: what a running Pod's requests should be at its workload's current ratios, as
the ``pods/resize`` subresource (stable since Kubernetes 1.35) accepts them.

The new requests come from :func:`oversale.compression.compress_running_pod`, the webhook's own
policy, so a resized Pod carries what a Pod created now would carry. What in-place resize adds is
what the API and the kubelet allow:

- only app containers and native sidecars can be resized; a finished init container and
  pod-level ``spec.resources`` (alpha to resize) are not touched;
- the QoS class is immutable: the API refuses such a resize, so it is never sent;
- the ResourceQuota admission plugin checks a resize that grows a Pod's requests against the
  ``hard - used`` of each quota whose scopes bind the Pod, as it checks a new Pod: a ratio
  backing off toward 1 grows them as much as a raise does, so a growth the quota has no room for
  waits for a later pass;
- the API refuses any resize of a static Pod's mirror or of a Windows Pod (``spec.os.name:
  windows``): theirs is never sent either, and new ratios reach them at the next rollout;
- the cpu request of a Pod holding (or asking for) exclusive CPUs is their count, and a resize
  cannot change the cpuset it holds, so it is kept (``oversale.compression.exclusive_cpus``);
- a container whose ``resizePolicy`` says ``RestartContainer`` for a resource is restarted to
  apply it, so that resource is resized only where the workload opted in to restarts;
- the kubelet answers asynchronously with Pod conditions: ``PodResizeInProgress``, or
  ``PodResizePending`` with reason ``Deferred`` (it retries when room frees up) or
  ``Infeasible`` (the node can never fit it; it does not retry).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from oversale.annotations import AnnotationKeys, format_ratio, parse_switch, wants
from oversale.compression import (
    CompressionConfig,
    compress_running_pod,
    effective_annotations,
    exclusive_cpus,
    policy_from_annotations,
)
from oversale.errors import InvalidAnnotation
from oversale.limitrange import RequestBounds
from oversale.patch import make_patch
from oversale.pods import (
    RESIZE_IN_PROGRESS,
    RESIZE_PENDING,
    Pod,
    condition_of,
    effective_request,
    has_pod_level_resources,
    is_mirror_or_static,
    is_sidecar,
    qos_class,
)
from oversale.quantity import CPU, MEMORY, RESOURCES, format_amount, parse_amount
from oversale.timestamps import format_timestamp, parse_timestamp


@dataclass(frozen=True)
class ResizeLimits:
    """Rate limits of in-place resize (see ``oversale.settings.Settings``)."""

    max_per_pass: int = 50
    max_per_workload: int = 10
    min_interval_seconds: float = 600.0


@dataclass(frozen=True)
class Change:
    """One container's request of one resource, before and after."""

    container: str
    resource: str
    before: int
    after: int

    def __str__(self) -> str:
        return (f"{self.container}/{self.resource} {format_amount(self.resource, self.before)} -> "
                f"{format_amount(self.resource, self.after)}")


@dataclass
class ResizePlan:
    """What to do with one running Pod."""

    changes: list[Change] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    """JSON patch for ``pods/resize`` (requests only)."""
    annotations: dict[str, str | None] = field(default_factory=dict)
    """Merge patch of the Pod's annotations, written before the resize (or, alone, the record of
    an Infeasible answer)."""
    ratios: str = ""
    """The ratios this resize asks for, as recorded in ``resized-ratios``."""
    added: dict[str, int] = field(default_factory=dict)
    """Resource -> how much the Pod's effective request grows (what a raise takes from quota)."""
    skipped: str | None = None
    code: str = ""
    """Short reason code for metrics when skipped."""
    record_infeasible: bool = False
    """The kubelet found the last resize Infeasible and the Pod does not say so yet."""

    @property
    def resizes(self) -> bool:
        return bool(self.patch)

    def describe(self) -> str:
        return "; ".join(map(str, self.changes))


def _skip(code: str, why: str) -> ResizePlan:
    return ResizePlan(skipped=why, code=code)


def plan_resize(
    pod: Pod,
    workload_annotations: Mapping[str, str],
    keys: AnnotationKeys,
    config: CompressionConfig,
    bounds: RequestBounds,
    now: float,
    limits: ResizeLimits,
) -> ResizePlan:
    """The resize that brings ``pod`` to its workload's ratios, or why there is none.

    ``bounds``: the namespace's LimitRange bounds and quota headroom (``hard - used``, in which
    this Pod's current requests are already counted).
    """
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    if unresizable := _unresizable(pod, workload_annotations, keys):
        return unresizable
    resizable = _resizable(pod, workload_annotations, keys)
    exclusive = exclusive_cpus(pod, keys) if CPU in resizable else None
    if exclusive:
        if resizable == {CPU}:
            return _skip("exclusive-cpus", f"cpu request kept: {exclusive}")
        resizable -= {CPU}
    policy = policy_from_annotations(effective_annotations(workload_annotations, annotations, keys), keys, config)
    asked = ",".join(f"{r}={format_ratio(policy.ratios.get(r, Decimal(1)))}" for r in RESOURCES if r in resizable)
    if waiting := _waiting(pod, asked, keys, now, limits):
        return waiting

    own = {r: effective_request(pod, r) for r in RESOURCES}
    result = compress_running_pod(pod, policy, bounds.bound_to(pod, held=own), resizable)
    target = result.pod
    if qos_class(target) != qos_class(pod):
        return _skip("qos", f"would change the QoS class from {qos_class(pod)} to {qos_class(target)} "
                            "(the API refuses that)")
    if beyond := _beyond_quota(own, target, bounds.bound_to(pod)):
        return _skip("quota", beyond)
    plan = ResizePlan(ratios=asked)
    _add_container_changes(plan, pod, target)
    if not plan.patch:
        return _skip("in-place", "requests already at the workload's ratios")
    written = (target.get("metadata") or {}).get("annotations") or {}
    for key in (keys.original_requests, keys.written_requests, keys.compression):
        plan.annotations[key] = written.get(key)
    plan.annotations[keys.resized_ratios] = asked
    plan.annotations[keys.last_resize] = format_timestamp(now)
    plan.annotations[keys.resize_infeasible] = None
    plan.added = {r: grown for r in RESOURCES if (grown := effective_request(target, r) - own[r]) > 0}
    return plan


def _unresizable(pod: Pod, workload_annotations: Mapping[str, str], keys: AnnotationKeys) -> ResizePlan | None:
    """Why the API, the kubelet or the user rules out resizing ``pod`` in place at all, or None."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return _skip("not-running", f"phase {status.get('phase')}, not running")
    if is_mirror_or_static(pod):
        return _skip("static", "static Pod (the kubelet rejects changes to it)")
    if ((pod.get("spec") or {}).get("os") or {}).get("name") == "windows":
        return _skip("windows", "Windows Pod (the API refuses to resize one); new ratios apply at the next rollout")
    switch = workload_annotations.get(keys.inplace_resize)
    try:
        if switch is not None and not parse_switch(switch):
            return _skip("disabled", f"in-place resize switched off by {keys.inplace_resize}")
    except InvalidAnnotation as error:
        return _skip("invalid-annotation", f"annotation {keys.inplace_resize} ignored: {error}; not resized")
    if has_pod_level_resources(pod):
        return _skip("pod-level", "pod-level resources are not resized in place; new ratios apply at the next "
                                  "rollout")
    return None


def _waiting(pod: Pod, asked: str, keys: AnnotationKeys, now: float, limits: ResizeLimits) -> ResizePlan | None:
    """Why a resize to the ratios ``asked`` must wait (on the kubelet, a past Infeasible answer or
    the minimum interval), or None."""
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    pending = condition_of(pod, RESIZE_PENDING)
    if condition_of(pod, RESIZE_IN_PROGRESS):
        return _skip("in-progress", "the kubelet is applying the last resize")
    same_ratios = annotations.get(keys.resized_ratios) == asked
    if pending and same_ratios:
        reason = pending.get("reason", "")
        if reason == "Infeasible":
            plan = _skip("infeasible", f"the last resize is Infeasible on this node ({pending.get('message', '')}); "
                                       "not retried until the ratios change")
            plan.record_infeasible = annotations.get(keys.resize_infeasible) != asked
            plan.ratios = asked
            if plan.record_infeasible:
                plan.annotations = {keys.resize_infeasible: asked}
            return plan
        return _skip("deferred", f"the last resize is {reason or 'pending'}: left to the kubelet")
    if annotations.get(keys.resize_infeasible) == asked:
        return _skip("infeasible", "the resize was Infeasible at these ratios; not retried until they change")
    last = parse_timestamp(annotations.get(keys.last_resize))
    if last is not None and now - last < limits.min_interval_seconds:
        return _skip("rate-limited", f"resized {int(now - last)}s ago (minimum interval "
                                     f"{int(limits.min_interval_seconds)}s)")
    return None


def _beyond_quota(own: Mapping[str, int], target: Pod, bounds: RequestBounds) -> str | None:
    """Why the namespace's ResourceQuota would refuse growing the Pod's requests from ``own`` to
    ``target``'s, or None (``bounds``: matched to this Pod). The raise of a ratio below 1 is
    capped at the headroom already (:func:`~oversale.compression.compress_running_pod`); a ratio
    backing off toward 1 brings requests back toward the original ones, which the quota's
    ``used`` no longer holds room for once other Pods took what compression freed."""
    for resource in RESOURCES:
        grown = effective_request(target, resource) - own[resource]
        left = bounds.quota_headroom.get(resource)
        if left is not None and grown > left:
            name = bounds.quota_names.get(resource)
            return (f"{resource} would grow by {format_amount(resource, grown)}, and the namespace's ResourceQuota"
                    f"{f' {name}' if name else ''} has {format_amount(resource, left)} left; next pass")
    return None


def _add_container_changes(plan: ResizePlan, pod: Pod, target: Pod) -> None:
    """Each request that differs between ``pod`` and ``target``, in ``plan.changes`` and its
    ``plan.patch``; regular init containers have finished (the API refuses to resize them)."""
    for kind in ("initContainers", "containers"):
        now_list = (pod.get("spec") or {}).get(kind) or []
        target_list = (target.get("spec") or {}).get(kind) or []
        for index, (current, wanted) in enumerate(zip(now_list, target_list, strict=True)):
            if kind == "initContainers" and not is_sidecar(current):
                continue
            before = (current.get("resources") or {}).get("requests") or {}
            after = (wanted.get("resources") or {}).get("requests") or {}
            for resource in RESOURCES:
                old, new = before.get(resource), after.get(resource)
                if old is not None and new is not None and parse_amount(resource, old) != parse_amount(resource, new):
                    plan.changes.append(Change(str(current.get("name")), resource, parse_amount(resource, old),
                                               parse_amount(resource, new)))
            if any(c.container == current.get("name") for c in plan.changes):
                plan.patch += make_patch(before, after, f"/spec/{kind}/{index}/resources/requests")


def _resizable(pod: Pod, workload_annotations: Mapping[str, str], keys: AnnotationKeys) -> frozenset[str]:
    """CPU always; memory where the workload opted in to memory compression; either only where no
    container restarts to apply it, unless the workload accepts restarts."""
    wanted = {CPU} | ({MEMORY} if wants(workload_annotations, keys.enable_memory_compress) else set())
    if wants(workload_annotations, keys.resize_restart):
        return frozenset(wanted)
    spec = pod.get("spec") or {}
    restarting = {policy.get("resourceName")
                  for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
                  for policy in container.get("resizePolicy") or []
                  if policy.get("restartPolicy") == "RestartContainer"}
    return frozenset(wanted - restarting)


def vpa_controlled(vpas: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, str]]:
    """(kind, namespace, name) -> resource -> VPA name, for each resource whose requests a
    VerticalPodAutoscaler sets on the workload's Pods: ``updateMode`` other than ``Off`` (that one
    only recommends), and the ``controlledResources`` of its container policies (both by default;
    a container no policy names, when there is no ``"*"`` policy, gets both; ``mode: Off`` sets
    none)."""
    controlled: dict[tuple[str, str, str], dict[str, str]] = {}
    for vpa in vpas:
        spec = vpa.get("spec") or {}
        mode = (spec.get("updatePolicy") or {}).get("updateMode", "Auto")
        target = spec.get("targetRef") or {}
        if mode == "Off" or not target.get("kind"):
            continue
        policies = [p for p in (spec.get("resourcePolicy") or {}).get("containerPolicies") or []
                    if isinstance(p, Mapping)]
        resources: set[str] = set() if any(p.get("containerName") == "*" for p in policies) else set(RESOURCES)
        for policy in policies:
            if policy.get("mode") != "Off":
                resources |= set(policy.get("controlledResources") or RESOURCES) & set(RESOURCES)
        if resources:
            metadata = vpa.get("metadata") or {}
            key = (str(target["kind"]), str(metadata.get("namespace", "")), str(target.get("name", "")))
            controlled[key] = dict.fromkeys(sorted(resources), str(metadata.get("name", "")))
    return controlled


VPA_WELL_KNOWN_KINDS = frozenset({"DaemonSet", "Deployment", "ReplicaSet", "StatefulSet", "ReplicationController",
                                   "Job", "CronJob"})
"""The owner kinds VPA's controller fetcher reads itself; any other owner counts for it only when
it serves a ``scale`` subresource (an Argo Rollout does)."""


def vpa_targets(owners: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (kind, name) a VerticalPodAutoscaler's ``targetRef`` may name to act on a Pod whose
    controller chain, from its own controller upward, is ``owners``, as far as it can be read.

    VPA acts on a Pod when its ``targetRef`` is the top-most owner that is of a kind VPA knows or
    serves ``scale`` (its controller fetcher's ``FindTopMostWellKnownOrScalable``): the Deployment
    over a ReplicaSet, the CronJob over a Job, an Argo Rollout over its ReplicaSet. Whether a custom
    owner serves ``scale`` is not known here, so the last well-known owner and every owner above it
    are returned: a VPA naming any of them is taken to act (the safe side).

    >>> vpa_targets([("ReplicaSet", "web-1"), ("Deployment", "web")])
    [('Deployment', 'web')]
    >>> vpa_targets([("Job", "backup-29012345"), ("CronJob", "backup")])
    [('CronJob', 'backup')]
    >>> vpa_targets([("ReplicaSet", "web-1"), ("Rollout", "web")])
    [('ReplicaSet', 'web-1'), ('Rollout', 'web')]
    >>> vpa_targets([("CloneSet", "web")])  # an OpenKruise CloneSet owns its Pods itself
    [('CloneSet', 'web')]
    """
    known = [index for index, (kind, _) in enumerate(owners) if kind in VPA_WELL_KNOWN_KINDS]
    return list(owners[known[-1] if known else 0:])


def workload_vpa(controlled: Mapping[tuple[str, str, str], Mapping[str, str]], key: tuple[str, str, str],
                 controller: tuple[str, str] | None) -> dict[str, str]:
    """Resource -> the VerticalPodAutoscaler that sets its requests on the Pods of workload ``key``
    (``controlled``: :func:`vpa_controlled`'s answer). ``controller`` is the workload's own
    controller, if any: an operator's resource that serves ``scale`` and owns a Deployment or a
    StatefulSet is the top-most owner VPA acts through (:func:`vpa_targets`), so a VPA naming it
    sets the workload's Pods as surely as one naming the workload (the webhook reads the same).

    >>> controlled = {("Database", "prod", "orders"): {"cpu": "orders-vpa", "memory": "orders-vpa"}}
    >>> workload_vpa(controlled, ("StatefulSet", "prod", "orders-db"), ("Database", "orders"))
    {'cpu': 'orders-vpa', 'memory': 'orders-vpa'}
    >>> workload_vpa(controlled, ("StatefulSet", "prod", "orders-db"), None)
    {}
    """
    kind, namespace, name = key
    found: dict[str, str] = {}
    for target_kind, target_name in vpa_targets([(kind, name), *([controller] if controller else [])]):
        for resource, vpa in controlled.get((target_kind, namespace, target_name), {}).items():
            found.setdefault(resource, vpa)
    return found
