"""Pod CREATE admission: which reviews to leave alone, and the compression of the rest.

Everything here is glue: the decisions are made by ``oversale.compression``; this module only
fetches the owner's annotations and LimitRanges and turns the result into a response.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from oversale.annotations import AnnotationProblem
from oversale.compression import (
    CompressionPolicy,
    CompressionResult,
    compress_requests,
    effective_annotations,
    policy_from_annotations,
)
from oversale.limitrange import RequestBounds
from oversale.patch import make_patch, map_patch
from oversale.settings import Settings
from webhook.memo import Memo
from webhook.owners import OwnerAnnotations
from webhook.reviews import AdmissionRequest, AdmissionReview, allow

log = logging.getLogger(__name__)


class Owners(Protocol):
    """Where admission reads cluster state from (OwnerCache, or NoCluster without an API server)."""

    def owner_annotations(self, pod: Any, namespace: str) -> OwnerAnnotations: ...

    def bounds_for(self, namespace: str) -> RequestBounds: ...


@dataclass
class PodDecision:
    """The answer to one review, with what the metrics and logs need to know about it."""

    review: AdmissionReview
    outcome: str
    """mutated, unchanged or skipped."""
    namespace: str = ""
    result: CompressionResult | None = None
    problems: tuple[AnnotationProblem, ...] = ()
    dry_run: bool = False
    reasons: list[str] = field(default_factory=list)


def admit_pod(request: AdmissionRequest, settings: Settings, owners: Owners,
              policies: Memo[CompressionPolicy] | None = None) -> PodDecision:
    """Answer a Pod review; ``policies``, when given, remembers the policy read from each set of
    compression annotations (built with the same ``settings``: a workload's Pods repeat them)."""
    uid = request["uid"]
    pod = request.get("object")
    namespace = request.get("namespace") or ((pod or {}).get("metadata") or {}).get("namespace", "")
    skip = _skip_reason(request, settings, namespace)
    if skip is not None or pod is None:
        return PodDecision(allow(uid), "skipped", namespace, reasons=[skip or "review has no object"])

    owner = owners.owner_annotations(pod, namespace)
    warnings = []
    if owner.problem:
        warnings.append(f"{owner.problem}; only the Pod's own annotations were used")
        log.warning("pod %s/%s: %s", namespace, _pod_name(pod), owner.problem)
    pod_annotations = (pod.get("metadata") or {}).get("annotations")
    annotations = effective_annotations(owner.annotations, pod_annotations, settings.keys)
    def read_policy() -> CompressionPolicy:
        return policy_from_annotations(annotations, settings.keys, settings.compression)

    policy = policies.get(tuple(annotations.items()), read_policy) if policies is not None else read_policy()
    for problem in policy.problems:
        log.warning("pod %s/%s (owner %s): %s", namespace, _pod_name(pod), owner.workload or "none", problem)
    result = compress_requests(pod, policy, owners.bounds_for(namespace))
    patch = pod_patch(pod, result.pod)
    review = allow(uid, patch, [*warnings, *result.warnings])
    outcome = "mutated" if patch else ("skipped" if result.skipped else "unchanged")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("pod %s/%s: %s %s", namespace, _pod_name(pod), outcome, result.skipped or result.reasons)
    return PodDecision(
        review,
        outcome,
        namespace,
        result,
        policy.problems,
        dry_run=bool(request.get("dryRun")),
        reasons=[result.skipped] if result.skipped else result.reasons,
    )


def pod_patch(original: dict[str, Any], mutated: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch from ``original`` to ``mutated``, diffing only what compression may change
    (annotations, each container's resources, pod-level resources): a whole-Pod diff costs more
    than everything else in the review together."""
    if original is mutated:
        return []
    before, after = original.get("metadata") or {}, mutated.get("metadata") or {}
    operations = make_patch(before.get("annotations"), after.get("annotations"), "/metadata/annotations")
    spec_before, spec_after = original.get("spec") or {}, mutated.get("spec") or {}
    for kind in ("initContainers", "containers"):
        pairs = zip(spec_before.get(kind) or [], spec_after.get(kind) or [], strict=True)
        for index, (old, new) in enumerate(pairs):
            path = f"/spec/{kind}/{index}/resources"
            old_resources, new_resources = old.get("resources"), new.get("resources")
            if old_resources == new_resources:
                continue
            if _only_requests_changed(old_resources, new_resources):
                operations += map_patch(old_resources["requests"], new_resources["requests"], f"{path}/requests")
            else:
                operations += make_patch(old_resources, new_resources, path)
    operations += make_patch(spec_before.get("resources"), spec_after.get("resources"), "/spec/resources")
    return operations


def _only_requests_changed(old: Any, new: Any) -> bool:
    """Both are resources maps with a requests map, and nothing but the requests differ."""
    return (isinstance(old, dict) and isinstance(new, dict) and isinstance(old.get("requests"), dict)
            and isinstance(new.get("requests"), dict) and old.keys() == new.keys()
            and all(key == "requests" or old[key] == new[key] for key in old))


def _skip_reason(request: AdmissionRequest, settings: Settings, namespace: str) -> str | None:
    if request["kind"].get("kind") != "Pod" or request["resource"].get("resource") != "pods":
        return f"not a Pod ({request['kind'].get('kind')})"
    if request.get("subResource"):
        return f"subresource {request.get('subResource')}"
    if request["operation"] != "CREATE":
        # Pod resources are immutable after creation (outside in-place resize, which users drive
        # themselves), so only CREATE is ever compressed.
        return f"operation {request['operation']}"
    if settings.skips_namespace(namespace):
        return f"namespace {namespace} is excluded"
    return None


def _pod_name(pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("name") or f"{metadata.get('generateName', '')}*")
