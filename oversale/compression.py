"""Pod request right-sizing: change each container's requests by a per-workload ratio.

A ratio above 1 lowers requests ("compression")::

    new = min(original, max(floor, LimitRange bounds, ceil(original / ratio)))

A ratio below 1 (down to ``OVERSALE_MIN_RATIO``) raises them, for workloads that use more than
they request: the scheduler then stops packing them onto nodes as if they were small, which is
what overloads their neighbours. A raise is bounded by every rule the API server checks after
mutating webhooks ran, so it cannot get a Pod rejected or change how it is treated (but for Pods
created at once near a full quota, each seeing the headroom before the others take it)::

    new = max(original, min(ceil(original / ratio), limit, LimitRange max))
    Pod total <= LimitRange Pod max, and <= the headroom (hard - used) of each quota binding it
    the QoS class is unchanged (a Burstable Pod never becomes Guaranteed)
    pod-level requests still cover the containers' sum

In integer millicores and bytes, for every container, init container and native sidecar, and for
pod-level ``spec.resources.requests``. Limits are never touched. Ratios come from annotations read
by :func:`policy_from_annotations`; :func:`compress_requests` applies one to a Pod dict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

from oversale.annotations import (
    AnnotationKeys,
    AnnotationProblem,
    parse_switch,
    read_ratios,
    read_record_text,
    record_text,
)
from oversale.cpus import bind_policy
from oversale.errors import InvalidAnnotation, QuantityError
from oversale.limitrange import NO_BOUNDS, RequestBounds
from oversale.pods import (
    Pod,
    all_containers,
    effective_limit,
    effective_request,
    is_guaranteed,
    is_mirror_or_static,
    is_sidecar,
    limit_of,
    qos_class,
    request_of,
    requests_of,
)
from oversale.quantity import CPU, RESOURCES, format_amount, parse_amount

# Key of pod-level spec.resources in the original-requests annotation: not a valid container name
# (container names are DNS labels), so it can never collide with one.
POD_LEVEL_KEY = "(pod)"
VPA_UPDATES = "vpaUpdates"
"""Set on a Pod by the VerticalPodAutoscaler's admission controller when it sets its requests."""


@dataclass(frozen=True)
class CompressionConfig:
    """Cluster-wide knobs of the compression policy (see ``oversale.settings.Settings``)."""

    max_ratio: Decimal = Decimal(8)
    """Largest ratio applied; larger annotations are clamped to it with a warning."""
    min_ratio: Decimal = Decimal("0.5")
    """Smallest ratio applied (0.5: a request at most doubles); smaller ones are clamped with a
    warning. 1 switches raising off."""
    cpu_floor_millicores: int = 10
    """No CPU request is lowered below this (unless it was already lower)."""
    memory_floor_bytes: int = 16 * 2**20
    """No memory request is lowered below this (unless it was already lower)."""
    allow_guaranteed_downgrade: bool = False
    """Compress Guaranteed Pods too, which makes them Burstable."""

    def floor(self, resource: str) -> int:
        return self.cpu_floor_millicores if resource == CPU else self.memory_floor_bytes


@dataclass(frozen=True)
class CompressionPolicy:
    """What to do to one Pod: the ratio per resource, and what was noticed while reading it."""

    ratios: Mapping[str, Decimal]
    """Resource -> ratio to apply (> 1 lowers, < 1 raises). A resource absent here is left alone."""
    keys: AnnotationKeys = field(default_factory=AnnotationKeys)
    config: CompressionConfig = field(default_factory=CompressionConfig)
    disabled: bool = False
    """``enable-resource-compress: n`` was set: compress nothing whatever the ratios say."""
    problems: tuple[AnnotationProblem, ...] = ()
    """Invalid annotations, each left that resource uncompressed."""
    warnings: tuple[str, ...] = ()
    """Other things the user should see (a clamped ratio)."""


@dataclass
class CompressionResult:
    """The Pod after compression and an account of what happened."""

    pod: Pod
    applied: dict[str, Fraction] = field(default_factory=dict)
    """Resource -> ratio actually applied (after Pod LimitRange caps)."""
    freed: dict[str, int] = field(default_factory=dict)
    """Resource -> millicores/bytes the scheduler no longer reserves for this Pod (negative: raised)."""
    reasons: list[str] = field(default_factory=list)
    """Human-readable account, also written in the audit annotation."""
    warnings: list[str] = field(default_factory=list)
    """Messages for the AdmissionResponse ``warnings`` (shown by kubectl)."""
    skipped: str | None = None
    """Why the Pod was left as it came, when it was."""


def effective_annotations(
    workload: Mapping[str, str] | None, pod: Mapping[str, str] | None, keys: AnnotationKeys
) -> dict[str, str]:
    """The workload's compression annotations, each overridden by the Pod's own (template) value."""
    return keys.ours(workload) | keys.ours(pod)


def policy_from_annotations(
    annotations: Mapping[str, str], keys: AnnotationKeys, config: CompressionConfig
) -> CompressionPolicy:
    """Read the compression annotations. Never raises: a bad value leaves its resource alone and
    is reported in ``problems``; the other resource still follows its own annotation."""
    problems: list[AnnotationProblem] = []
    disabled = False
    switch = annotations.get(keys.enable_resource_compress)
    if switch is not None:
        try:
            disabled = not parse_switch(switch)
        except InvalidAnnotation as error:
            problems.append(AnnotationProblem(keys.enable_resource_compress, switch, str(error)))
    reading = read_ratios(annotations, keys.requests_ratio, lambda resource: config.max_ratio, "not compressed",
                          minimum=config.min_ratio)
    return CompressionPolicy(
        reading.ratios, keys, config, disabled, (*problems, *reading.problems), tuple(reading.warnings)
    )


def exclusive_cpus(pod: Pod, keys: AnnotationKeys) -> str | None:
    """Why the Pod's cpu request must stay as it is because it sizes exclusive CPUs, or None.

    The extender gives a Pod that asks for binding (``cpu-bind-policy``) as many whole CPUs as its
    cpu request when that is an integer, and a cpuset bounds the cores its containers may run on,
    whatever their limit: a lower request would take cores away, a fractional one the binding
    itself, and a raised one would ask for cores the cpuset it holds does not have. A Pod that
    holds a cpuset (``resource-status``) keeps it until it is recreated.

    >>> keys = AnnotationKeys()
    >>> exclusive_cpus({"metadata": {"annotations": {keys.cpu_bind_policy: "FullPCPUs"}}}, keys)
    'it asks for exclusive CPUs (stke.platform/cpu-bind-policy: FullPCPUs), as many as its cpu request'
    >>> exclusive_cpus({"metadata": {"annotations": {keys.cpu_bind_policy: "Sometimes"}}}, keys) is None
    True
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if keys.resource_status in annotations:
        return f"it holds exclusive CPUs ({keys.resource_status}), as many as its cpu request"
    policy = bind_policy(annotations.get(keys.cpu_bind_policy))
    if policy:
        return f"it asks for exclusive CPUs ({keys.cpu_bind_policy}: {policy}), as many as its cpu request"
    return None


def compress_requests(pod: Pod, policy: CompressionPolicy, bounds: RequestBounds = NO_BOUNDS,
                      vpa_resources: frozenset[str] = frozenset()) -> CompressionResult:
    """Compress ``pod``'s requests by ``policy``, within LimitRange ``bounds``; ``vpa_resources``:
    those a VerticalPodAutoscaler of its workload sets (:func:`oversale.resize.vpa_controlled`),
    left as they are, as are those its ``vpaUpdates`` annotation names.

    Returns a new Pod; ``pod`` is not modified. Only ``metadata.annotations``, the containers'
    ``resources`` and ``spec.resources`` ever change (the webhook's patch covers exactly those).
    Idempotent: a Pod that already carries the original-requests annotation is first restored
    from it, so applying the result again gives the same Pod. Raises QuantityError only for
    quantities the API server itself would refuse.
    """
    result = CompressionResult(pod=pod, warnings=[*policy.warnings, *map(str, policy.problems)])
    if is_mirror_or_static(pod):
        result.skipped = "mirror/static Pod (run by the kubelet, not the scheduler)"
        return result
    # VPA's requests are its recommendation, already near the usage: a ratio on top would divide
    # them again. They are kept as VPA set them, not restored from our record (which a call of
    # ours before VPA's may have left); the other resource is compressed as usual. Known before
    # VPA's admission runs (``vpa_resources``), they are not compressed at all: VPA scales each
    # limit by recommendation / request, and from a request we had lowered it would raise the
    # limit by our ratio.
    by_vpa = vpa_set_resources(pod) | vpa_resources
    if (contested := by_vpa & set(policy.ratios)) and not policy.disabled:
        result.warnings.append(f"{' and '.join(sorted(contested))} requests set by a "
                               "VerticalPodAutoscaler not compressed: two controllers would set "
                               "them; remove the ratio or the VPA")
    if by_vpa and not set(policy.ratios) - by_vpa:
        result.skipped = "requests set by a VerticalPodAutoscaler"
        if _has_our_annotations(pod, policy.keys):
            result.pod = _without_our_annotations(_writable_copy(pod), policy.keys)  # it no longer holds
        return result
    if by_vpa:
        policy = dataclasses.replace(policy, ratios={r: v for r, v in policy.ratios.items() if r not in by_vpa})
    restored, restore_warning = _restore_originals(pod, policy.keys, kept=by_vpa)
    if restore_warning:
        result.warnings.append(restore_warning)
    originals = _recorded_requests(restored)
    if not originals:
        result.skipped = "no cpu or memory requests"
        return result
    exclusive = exclusive_cpus(restored, policy.keys) if CPU in policy.ratios else None
    result.skipped = _reason_to_leave(restored, policy, exclusive, result.warnings)
    if result.skipped:
        return _left_as_it_came(result, pod, restored, policy.keys)
    compressed = _apply_ratios(restored, policy, bounds.bound_to(restored), exclusive, result)
    if compressed == restored:
        result.skipped = "requests already at their floors"
        return _left_as_it_came(result, pod, restored, policy.keys)
    _record_compression(compressed, originals, policy.keys, result)
    result.pod = compressed
    return result


def _reason_to_leave(restored: Pod, policy: CompressionPolicy, exclusive: str | None,
                     warnings: list[str]) -> str | None:
    """Why the policy leaves the (restored) Pod's requests as they are, or None; what the user
    should hear about it goes to ``warnings``."""
    if policy.disabled:
        return f"disabled by {policy.keys.enable_resource_compress}"
    if not policy.ratios:
        return "no compression ratio set"
    if not policy.config.allow_guaranteed_downgrade and is_guaranteed(restored):
        warnings.append(
            "Guaranteed Pod not compressed: lower requests would make it Burstable "
            "(set OVERSALE_ALLOW_GUARANTEED_DOWNGRADE=true to allow)"
        )
        return "Guaranteed Pod"
    if exclusive:
        warnings.append(f"cpu request not compressed: {exclusive}")
        if set(policy.ratios) == {CPU}:
            return f"cpu request kept: {exclusive}"
    return None


def _left_as_it_came(result: CompressionResult, pod: Pod, restored: Pod, keys: AnnotationKeys) -> CompressionResult:
    # Restoring matters only when something left our annotation behind; otherwise the Pod goes
    # back exactly as it came.
    if restored is not pod:
        result.pod = _without_our_annotations(restored, keys)
    return result


def _apply_ratios(restored: Pod, policy: CompressionPolicy, bounds: RequestBounds, exclusive: str | None,
                  result: CompressionResult) -> Pod:
    """A copy of ``restored`` with each ratio of ``policy`` applied, within ``bounds`` and the
    guards; what each resource got goes to ``result`` (applied, freed, reasons)."""
    compressed = _writable_copy(restored)
    guards: list[str] = []
    for resource, ratio in policy.ratios.items():
        before = effective_request(restored, resource)
        if before == 0 or (resource == CPU and exclusive):
            continue
        if ratio < 1:
            applied = _raise_resource(compressed, restored, resource, Fraction(ratio), before, bounds, guards)
        else:
            applied = _compress_resource(compressed, resource, Fraction(ratio), before, policy.config, bounds, guards)
        if applied is None:
            continue
        result.applied[resource] = applied
        after = effective_request(compressed, resource)
        result.freed[resource] = before - after
        result.reasons.append(_ratio_line(resource, ratio, applied, before, after))
    if guards:
        result.reasons.append("guards: " + ", ".join(guards))
    return compressed


def _ratio_line(resource: str, asked: Decimal, applied: Fraction, before: int, after: int) -> str:
    """One resource's line of the audit annotation: ``cpu ratio 2: 1 -> 500m``."""
    guard = "a guard" if asked < 1 else "Pod LimitRange"
    capped = "" if applied == asked else f" (asked {asked}, capped by {guard})"
    return (f"{resource} ratio {_show_ratio(applied)}{capped}: "
            f"{format_amount(resource, before)} -> {format_amount(resource, after)}")


def _record_compression(compressed: Pod, originals: dict[str, dict[str, str]], keys: AnnotationKeys,
                        result: CompressionResult) -> None:
    """Write the annotations that let a later call restore the Pod and a user read what was done."""
    annotations = compressed.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[keys.original_requests] = record_text(originals)
    if any(amount < 0 for amount in result.freed.values()):
        # Only a raise leaves a request above its original, which is what a reinvocation cannot
        # tell from another webhook's raise without this record.
        annotations[keys.written_requests] = record_text(_recorded_requests(compressed))
    else:
        annotations.pop(keys.written_requests, None)
    annotations[keys.compression] = "; ".join(result.reasons)


def compress_running_pod(
    pod: Pod, policy: CompressionPolicy, bounds: RequestBounds, resizable: frozenset[str]
) -> CompressionResult:
    """:func:`compress_requests` for a Pod that already runs, limited to what in-place resize can
    change: only the resources in ``resizable``, and only in app containers and native sidecars.
    A regular init container has finished (the API refuses to resize it) and keeps its requests,
    as do the resources left out.

    ``bounds`` must already count this Pod's own requests as quota headroom (it holds them now).
    The record and audit annotations describe the Pod as it will be, so the next pass, like a webhook
    reinvocation, restores the same originals.
    """
    result = compress_requests(pod, policy, bounds)
    if result.pod is pod:
        return result
    final = result.pod
    admitted = {resource: effective_request(final, resource) for resource in result.applied}
    for container, current in zip(all_containers(final), all_containers(pod), strict=True):
        kept = RESOURCES if _is_finished_init(pod, current) else tuple(r for r in RESOURCES if r not in resizable)
        now = (current.get("resources") or {}).get("requests") or {}
        requests = container.setdefault("resources", {}).setdefault("requests", {})
        for resource in kept:
            if resource in now:
                requests[resource] = now[resource]
            else:
                requests.pop(resource, None)
    annotations = (final.get("metadata") or {}).get("annotations")
    if annotations is not None and policy.keys.original_requests in annotations:
        originals = read_record_text(annotations[policy.keys.original_requests])
        raised = any(
            parse_amount(resource, value) > parse_amount(resource, originals.get(name, {}).get(resource, value))
            for name, values in _recorded_requests(final).items() for resource, value in values.items())
        if raised:
            annotations[policy.keys.written_requests] = record_text(_recorded_requests(final))
        else:
            annotations.pop(policy.keys.written_requests, None)
    _audit_in_place(result, final, admitted, policy)
    for resource in list(result.freed):
        result.freed[resource] = effective_request(pod, resource) - effective_request(final, resource)
    return result


def _audit_in_place(result: CompressionResult, final: Pod, admitted: dict[str, int],
                    policy: CompressionPolicy) -> None:
    """Make the audit annotation say what the resize leaves, not what admission would give.

    Where kept requests hold a resource above or below what a new Pod would be admitted with (a
    resource not resized in place, or a finished init container whose request still counts in
    the Pod's effective one), its line reads ``memory ratio 0.5: 1Gi -> 1Gi in place (2Gi at the
    next rollout)``. ``admitted``: each applied resource's effective request before they were kept.
    """
    # _apply_ratios writes one line per applied resource, in order, before the guards' line.
    for line, (resource, applied) in enumerate(result.applied.items()):
        now = effective_request(final, resource)
        if now != admitted[resource]:
            before = admitted[resource] + result.freed[resource]
            result.reasons[line] = (_ratio_line(resource, policy.ratios[resource], applied, before, now)
                                    + f" in place ({format_amount(resource, admitted[resource])} at the next rollout)")
    annotations = (final.get("metadata") or {}).get("annotations")
    if annotations is not None and policy.keys.compression in annotations:
        annotations[policy.keys.compression] = "; ".join(result.reasons)


def _is_finished_init(pod: Pod, container: dict[str, Any]) -> bool:
    init = (pod.get("spec") or {}).get("initContainers") or []
    return any(c is container for c in init) and not is_sidecar(container)


def compressed_amount(original: int, ratio: Fraction | Decimal, floor: int) -> int:
    """One request after compression: ``min(original, max(floor, ceil(original / ratio)))``."""
    return min(original, max(floor, _ceil_divide(original, ratio)))


def resized_amount(original: int, ratio: Fraction | Decimal, floor: int) -> int:
    """One request at ``ratio`` before the Pod's own guards: compressed (ratio above 1, not below
    ``floor``) or raised (ratio below 1, ``ceil(original / ratio)``).

    >>> resized_amount(1000, Decimal("1.5"), 10), resized_amount(1000, Decimal("0.75"), 10)
    (667, 1334)
    >>> resized_amount(15, Decimal(4), 10), resized_amount(5, Decimal(4), 10)
    (10, 5)
    """
    if ratio < 1:
        return max(original, _ceil_divide(original, ratio))
    return compressed_amount(original, ratio, floor)


def _ceil_divide(amount: int, ratio: Fraction | Decimal) -> int:
    """``ceil(amount / ratio)`` exactly, in integers (no Fraction built per container: this runs on
    every admitted Pod)."""
    exact = ratio if isinstance(ratio, Fraction) else Fraction(ratio)
    return -(-amount * exact.denominator // exact.numerator)


def _compress_resource(
    pod: Pod,
    resource: str,
    ratio: Fraction,
    total: int,
    config: CompressionConfig,
    bounds: RequestBounds,
    guards: list[str],
) -> Fraction | None:
    """Lower one resource's requests in ``pod`` in place; return the ratio applied (None if none).
    ``total`` is the Pod's effective request of ``resource`` as it came (not 0)."""
    pod_bound = bounds.for_pod(resource)
    # Requests only round up (ceil, floors), so the Pod's total never falls below total / ratio;
    # capping the ratio at total / bound keeps the Pod-level LimitRange satisfied.
    pod_floor = pod_bound.floor_for(effective_limit(pod, resource)) if pod_bound.bounds_requests else 0
    if pod_floor:
        ratio = min(ratio, Fraction(total, pod_floor))
    if ratio <= 1:
        guards.append(f"{resource} kept by Pod LimitRange")
        return None
    container_bound = bounds.for_container(resource)
    floor = config.floor(resource)
    for container in all_containers(pod):
        original = request_of(container, resource)
        if original is None:
            continue
        new = compressed_amount(original, ratio, 0)
        if new < floor:
            new = min(floor, original)
            guards.append(f"{container.get('name')}/{resource} floor {format_amount(resource, floor)}")
        if container_bound.bounds_requests:
            lower = container_bound.floor_for(limit_of(container, resource))
            if new < lower:
                new = min(lower, original)
                guards.append(f"{container.get('name')}/{resource} LimitRange")
        _set_request(container.setdefault("resources", {}), resource, new, original)
    # requests_of reads a dict's "resources", which for pod-level resources is the spec itself.
    spec = pod.get("spec") or {}
    original = request_of(spec, resource, default_from_limits=False)
    if original is not None:
        new = max(config.floor(resource), pod_floor, _ceil_divide(original, ratio))
        _set_request(spec["resources"], resource, min(new, original), original)
    return ratio


def _raise_resource(
    pod: Pod, restored: Pod, resource: str, ratio: Fraction, before: int, bounds: RequestBounds, guards: list[str]
) -> Fraction | None:
    """Raise one resource's requests in ``pod`` in place, within every guard; return the ratio
    applied (None when a guard leaves nothing to raise). ``restored`` is the Pod as it came and
    ``before`` its effective request of ``resource`` (not 0)."""
    # The Pod's total may grow to the Pod LimitRange max and to what the namespace quota has left:
    # the ResourceQuota plugin admits the Pod only if its whole request fits in hard - used.
    caps: list[tuple[int, str]] = []
    pod_max = bounds.for_pod(resource).max
    if pod_max is not None:
        caps.append((pod_max, "Pod LimitRange max"))
    if resource in bounds.quota_headroom:
        name = bounds.quota_names.get(resource)
        caps.append((bounds.quota_headroom[resource], f"ResourceQuota headroom ({name})" if name
                     else "ResourceQuota headroom"))
    total_cap, total_guard = min(caps) if caps else (None, "")
    qos = qos_class(restored)
    noted = len(guards)
    wanted, target = ratio, None
    while True:
        after = _apply_raise(pod, restored, resource, wanted, bounds, guards, strictly_below_limit=False)
        if qos_class(pod) != qos:
            # Reaching every limit would make a Burstable Pod Guaranteed (and the kubelet would
            # then treat it differently): stop one unit short of the limits instead.
            after = _apply_raise(pod, restored, resource, wanted, bounds, guards, strictly_below_limit=True)
            _note(guards, f"{resource} kept {qos}")
        if total_cap is None or after <= total_cap:
            break
        _note(guards, f"{resource} {total_guard}")
        # Aim at the cap; rounding up per container can still overshoot it by a few units, then
        # aim that much lower.
        target = total_cap if target is None else target - (after - total_cap)
        if target <= before:
            after = before  # no room at all: restored below
            break
        wanted = max(ratio, Fraction(before, target))
    if after <= before:
        _note(guards, f"{resource} not raised")
        _restore_resource(pod, restored, resource)
        return None
    return wanted if len(guards) == noted else Fraction(before, after)


def _note(guards: list[str], guard: str) -> None:
    if guard not in guards:
        guards.append(guard)


def _apply_raise(
    pod: Pod, restored: Pod, resource: str, ratio: Fraction, bounds: RequestBounds, guards: list[str],
    strictly_below_limit: bool,
) -> int:
    """Set each unit's raised request in ``pod`` from the originals in ``restored``; return the
    Pod's new effective request."""
    # Start from the Pod as it came: a second application (one unit short of the limits, after
    # the first made the Pod Guaranteed) must not keep the first one's value where it now
    # computes the original amount (an unchanged amount keeps whatever spelling it finds).
    _restore_resource(pod, restored, resource)
    container_max = bounds.for_container(resource).max
    for container, original_container in zip(all_containers(pod), all_containers(restored), strict=True):
        original = request_of(original_container, resource)
        if original is None:
            continue
        new = resized_amount(original, ratio, 0)
        limit = limit_of(original_container, resource)
        for upper, guard in ((limit, "limit"), (container_max, "LimitRange max")):
            if upper is None:
                continue
            if guard == "limit" and strictly_below_limit:
                upper -= 1
            if new > upper:
                new = upper
                _note(guards, f"{container.get('name')}/{resource} {guard}")
        _set_request(container.setdefault("resources", {}), resource, max(new, original), original)
    spec = pod.get("spec") or {}
    original_spec = restored.get("spec") or {}
    original = request_of(original_spec, resource, default_from_limits=False)
    if original is not None:
        new = resized_amount(original, ratio, 0)
        limit = limit_of(original_spec, resource)
        if limit is not None:
            new = min(new, limit - 1 if strictly_below_limit else limit)
        # Pod-level requests must still cover the containers' sum, or the API server refuses the Pod.
        containers = sum(request_of(c, resource) or 0 for c in spec.get("containers") or [])
        if containers > new:
            _restore_resource(pod, restored, resource)
            _note(guards, f"{resource} containers kept within pod-level requests")
        _set_request(spec["resources"], resource, max(new, original), original)
    return effective_request(pod, resource)


def _restore_resource(pod: Pod, restored: Pod, resource: str) -> None:
    """Put one resource's requests back as they came."""
    for container, original_container in zip(all_containers(pod), all_containers(restored), strict=True):
        requests = (original_container.get("resources") or {}).get("requests") or {}
        current = (container.get("resources") or {}).get("requests")
        if resource in requests:
            container.setdefault("resources", {}).setdefault("requests", {})[resource] = requests[resource]
        elif current:
            current.pop(resource, None)
    spec_requests = ((restored.get("spec") or {}).get("resources") or {}).get("requests") or {}
    if resource in spec_requests:
        (pod.get("spec") or {})["resources"]["requests"][resource] = spec_requests[resource]


def _writable_copy(pod: Pod) -> Pod:
    """A copy of ``pod`` in which everything compression writes (annotations, containers'
    resources, pod-level resources) is new, and everything else is shared with ``pod``: a full
    deep copy costs more than the rest of the review."""
    copied = dict(pod)
    metadata = copied["metadata"] = dict(pod.get("metadata") or {})
    if "annotations" in metadata:
        metadata["annotations"] = dict(metadata["annotations"] or {})
    spec = copied["spec"] = dict(pod.get("spec") or {})
    for kind in ("initContainers", "containers"):
        if spec.get(kind):
            spec[kind] = [_with_own_resources(container) for container in spec[kind]]
    if spec.get("resources"):
        spec["resources"] = {key: dict(value) if isinstance(value, dict) else value
                             for key, value in spec["resources"].items()}
    return copied


def _with_own_resources(container: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``container`` with its own resources and requests maps (limits are never
    written, so they stay shared)."""
    copied = dict(container)
    if "resources" in copied:
        resources = copied["resources"] = dict(copied["resources"] or {})
        requests = resources.get("requests")
        if isinstance(requests, dict):
            resources["requests"] = dict(requests)
    return copied


def _set_request(resources: dict[str, Any], resource: str, new: int, original: int) -> None:
    requests = resources.setdefault("requests", {})
    if new == original and resource in requests:
        return  # keep the user's own spelling of an unchanged value
    requests[resource] = format_amount(resource, new)


def _recorded_requests(pod: Pod) -> dict[str, dict[str, str]]:
    """Each container's cpu/memory requests as written (what the annotation records); a request
    the API server defaulted from the limit is recorded as that limit."""
    recorded: dict[str, dict[str, str]] = {}
    for container in all_containers(pod):
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        kept = {r: requests[r] if r in requests else limits[r] for r in RESOURCES if r in requests or r in limits}
        if kept:
            recorded[str(container.get("name"))] = kept
    pod_requests = ((pod.get("spec") or {}).get("resources") or {}).get("requests") or {}
    kept = {r: pod_requests[r] for r in RESOURCES if r in pod_requests}
    if kept:
        recorded[POD_LEVEL_KEY] = kept
    return recorded


def _restore_originals(pod: Pod, keys: AnnotationKeys, kept: frozenset[str] = frozenset()) -> tuple[Pod, str | None]:
    """Put back the requests recorded by an earlier pass of this webhook.

    A recorded value is used only where the current request is not above it, or is exactly what
    this service wrote (its own raise): a request another mutating webhook raised after us is a
    new original, not ours to undo. Resources in ``kept`` (set by a VerticalPodAutoscaler) stay.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(keys.original_requests)
    if text is None:
        return pod, None
    try:
        recorded = read_record_text(text)
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
        written, written_warning = _written_requests(annotations.get(keys.written_requests), keys)
        restored = _writable_copy(pod)
        # Each unit is a dict whose "resources" holds the requests: a container, or the spec
        # itself for pod-level resources.
        units: dict[str, dict[str, Any]] = {str(c.get("name")): c for c in all_containers(restored)}
        spec = restored.get("spec") or {}
        if spec.get("resources"):
            units[POD_LEVEL_KEY] = spec
        for name, values in recorded.items():
            unit = units.get(name)
            if unit is None or not isinstance(values, dict):
                continue
            current = requests_of(unit)
            ours = written.get(name) or {}
            for resource, original in values.items():
                if resource not in RESOURCES or resource in kept:
                    continue
                now = current.get(resource, 0)
                if now <= parse_amount(resource, original) or (
                        resource in ours and now == parse_amount(resource, ours[resource])):
                    unit.setdefault("resources", {}).setdefault("requests", {})[resource] = original
    except (ValueError, TypeError, AttributeError, QuantityError) as error:
        return pod, f"annotation {keys.original_requests} ignored ({error}); current requests taken as original"
    return restored, written_warning


def _written_requests(text: str | None, keys: AnnotationKeys) -> tuple[dict[str, dict[str, str]], str | None]:
    """The ``written-requests`` record, and a warning when it is unreadable. Absent or unreadable,
    it is empty: only values at or below the originals are taken as ours, as before raises
    existed, so a raise of ours is kept as another webhook's and raised again."""
    try:
        written = read_record_text(text) if text else {}
        if not isinstance(written, dict):
            raise ValueError("not a JSON object")
    except ValueError as error:
        return {}, (f"annotation {keys.written_requests} ignored ({error}); a request above its recorded "
                    "original is taken as another webhook's raise")
    return {str(k): v for k, v in written.items() if isinstance(v, dict)}, None


def recorded_pod_request(record: str, resource: str, init_containers: Collection[str] = (),
                         sidecars: Collection[str] = ()) -> int | None:
    """What kube-scheduler reserved of ``resource`` for a Pod before this webhook right-sized it,
    read from the Pod's ``original-requests`` record (``record``: the annotation's value) by the
    rule of :func:`oversale.pods.effective_request`; None when the record holds no ``resource``.
    The record names containers only: ``init_containers`` says which of them are init containers,
    ``sidecars`` which init containers run beside the app (``restartPolicy: Always``). Their order
    is not known, so a regular init container is taken alone, as if before the sidecars. Raises
    ValueError (QuantityError for a bad quantity) when the record cannot be read.

    ``python -m reconcilers plan`` reads it on a cluster where oversale runs already:
    kube-state-metrics exports the requests running, already right-sized, and the record (as
    ``kube_pod_annotations``, where its allowlist names it).

    >>> record = '{"app": {"cpu": "2", "memory": "2Gi"}, "proxy": {"cpu": "100m"}, "migrate": {"cpu": "3"}}'
    >>> recorded_pod_request(record, "cpu", {"proxy", "migrate"}, {"proxy"})
    3000
    >>> recorded_pod_request(record, "cpu", {"proxy"}, {"proxy"})
    5100
    >>> recorded_pod_request(record, "memory")
    2147483648
    >>> recorded_pod_request('{"app": {"memory": "1Gi"}}', "cpu") is None
    True
    >>> recorded_pod_request('{"app": {"cpu": "1"}, "(pod)": {"cpu": "2"}}', "cpu")  # pod-level requests decide
    2000
    """
    recorded = read_record_text(record)
    if not isinstance(recorded, dict) or not all(isinstance(values, dict) for values in recorded.values()):
        raise ValueError("not a JSON object of each container's requests")
    if not any(resource in values for values in recorded.values()):
        return None
    init = set(init_containers) | set(sidecars)

    def container(name: str) -> dict[str, Any]:
        value = recorded[name].get(resource)
        return {"name": name, "resources": {"requests": {resource: str(value)} if value is not None else {}}}

    names = [name for name in recorded if name != POD_LEVEL_KEY]
    spec: dict[str, Any] = {
        "containers": [container(name) for name in names if name not in init],
        "initContainers": [container(name) for name in names if name in init and name not in sidecars]
                          + [{**container(name), "restartPolicy": "Always"} for name in names if name in sidecars]}
    if resource in recorded.get(POD_LEVEL_KEY, {}):
        spec["resources"] = {"requests": {resource: str(recorded[POD_LEVEL_KEY][resource])}}
    return effective_request({"spec": spec}, resource)


def vpa_set_resources(pod: Pod) -> frozenset[str]:
    """The resources whose requests the VerticalPodAutoscaler's admission controller set on
    ``pod``, read from its ``vpaUpdates`` annotation; both when it names neither (read to be safe).

    >>> vpa_set_resources({"metadata": {"annotations": {
    ...     "vpaUpdates": "Pod resources updated by web: container 0: memory request, memory limit"}}})
    frozenset({'memory'})
    >>> sorted(vpa_set_resources({"metadata": {"annotations": {"vpaUpdates": "updated"}}}))
    ['cpu', 'memory']
    >>> vpa_set_resources({"metadata": {}})
    frozenset()
    """
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(VPA_UPDATES)
    if text is None:
        return frozenset()
    return frozenset(r for r in RESOURCES if f"{r} request" in str(text)) or frozenset(RESOURCES)


def _our_keys(keys: AnnotationKeys) -> tuple[str, str, str]:
    """The annotations the webhook writes on a Pod it compressed: its record and its audit."""
    return keys.original_requests, keys.written_requests, keys.compression


def _has_our_annotations(pod: Pod, keys: AnnotationKeys) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return any(key in annotations for key in _our_keys(keys))


def _without_our_annotations(pod: Pod, keys: AnnotationKeys) -> Pod:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for key in _our_keys(keys):
        annotations.pop(key, None)
    return pod


@lru_cache(maxsize=256)
def _show_ratio(ratio: Fraction) -> str:
    """A ratio for humans: exact when it is a short decimal, else 3 decimals."""
    shown = Decimal(ratio.numerator) / Decimal(ratio.denominator)
    rounded = shown.quantize(Decimal("0.001")).normalize()
    return f"{shown.normalize()}" if rounded == shown else f"~{rounded}"
