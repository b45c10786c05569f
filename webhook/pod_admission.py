"""Pod CREATE admission: which reviews to leave alone, and the compression of the rest.

Everything here is glue: the decisions are made by ``oversale.compression``; this module only
fetches the owner's annotations and LimitRanges and turns the result into a response.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import orjson

from oversale.annotations import AnnotationProblem
from oversale.compression import (
    VPA_UPDATES,
    CompressionPolicy,
    CompressionResult,
    compress_requests,
    effective_annotations,
    policy_from_annotations,
)
from oversale.limitrange import NO_BOUNDS, RequestBounds
from oversale.patch import make_patch, map_patch
from oversale.pods import MIRROR_ANNOTATION
from oversale.settings import Settings
from webhook.memo import Memo
from webhook.owners import OwnerAnnotations
from webhook.reviews import AdmissionRequest, AdmissionReview, allow, encode_patch

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
    freed: Mapping[str, int] = field(default_factory=dict)
    """Resource -> request removed (negative: added), in millicores or bytes."""
    problems: tuple[AnnotationProblem, ...] = ()
    dry_run: bool = False
    reasons: list[str] = field(default_factory=list)


def admit_pod(request: AdmissionRequest, settings: Settings, owners: Owners,
              answers: PodAnswers | None = None) -> PodDecision:
    """Answer a Pod review; ``answers``, when given, remembers policies and compressions (built
    with the same ``settings``)."""
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
    answers = answers or PodAnswers(settings, size=0)
    policy = answers.policy(annotations)
    for problem in policy.problems:
        log.warning("pod %s/%s (owner %s): %s", namespace, _pod_name(pod), owner.workload or "none", problem)
    answer = answers.compression(pod, annotations, policy, owners.bounds_for(namespace), owner.vpa)
    review = allow(uid, warnings=[*warnings, *answer.warnings], encoded_patch=answer.patch)
    outcome = "mutated" if answer.patch else ("skipped" if answer.skipped else "unchanged")
    reasons = [answer.skipped] if answer.skipped else list(answer.reasons)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("pod %s/%s: %s %s", namespace, _pod_name(pod), outcome, reasons)
    return PodDecision(review, outcome, namespace, dict(answer.freed), policy.problems,
                       dry_run=bool(request.get("dryRun")), reasons=reasons)


class PodAnswer(NamedTuple):
    """A compression as admission uses it: immutable, strings and numbers only, so a remembered
    one gives the garbage collector next to nothing to traverse (see webhook.memo)."""

    patch: str
    """The JSON patch, base64-encoded as the AdmissionResponse carries it ("" for none)."""
    warnings: tuple[str, ...]
    freed: tuple[tuple[str, int], ...]
    skipped: str | None
    reasons: tuple[str, ...]

    @classmethod
    def of(cls, pod: dict[str, Any], result: CompressionResult) -> PodAnswer:
        return cls(encode_patch(pod_patch(pod, result.pod)), tuple(result.warnings), tuple(result.freed.items()),
                   result.skipped, tuple(result.reasons))


class PodAnswers:
    """Policies and compressions of recent Pod reviews, by everything each depends on.

    A workload's Pods reach admission alike (their names are generated after admission), so a
    rollout asks the same question once per replica. A compression is keyed on exactly what
    :func:`compress_requests` and :func:`pod_patch` read: each container's name, restart policy and
    resources, pod-level resources, this service's record annotations and exclusive-CPU ones (and
    whether the Pod has an annotations map), whether it is a mirror Pod, the compression annotations
    in effect, the namespace's bounds as they bind this Pod and the resources a
    VerticalPodAutoscaler sets. ``size=0`` remembers nothing.
    """

    def __init__(self, settings: Settings, size: int = 4096) -> None:
        self.settings = settings
        self.size = size
        self._policies: Memo[CompressionPolicy] = Memo(size)
        self._compressions: Memo[PodAnswer] = Memo(size)
        keys = settings.keys
        # Every Pod annotation compress_requests reads: its records, the mirror mark, the
        # exclusive-CPU request or holding that keeps the cpu request (exclusive_cpus), and VPA's.
        self._record_keys = (keys.original_requests, keys.written_requests, keys.compression, MIRROR_ANNOTATION,
                             keys.cpu_bind_policy, keys.resource_status, VPA_UPDATES)

    def policy(self, annotations: dict[str, str]) -> CompressionPolicy:
        settings = self.settings
        return self._policies.get(
            tuple(annotations.items()) if self.size else None,
            lambda: policy_from_annotations(annotations, settings.keys, settings.compression))

    def compression(self, pod: dict[str, Any], annotations: dict[str, str], policy: CompressionPolicy,
                    bounds: RequestBounds, vpa: frozenset[str] = frozenset()) -> PodAnswer:
        # Matched to the Pod first: the key then holds the quota headroom that binds it, not the
        # scopes (priority class, deadline, affinity...) a quota matches Pods by.
        bounds = bounds.bound_to(pod)
        return self._compressions.get(self._key(pod, annotations, bounds, vpa) if self.size else None,
                                      lambda: PodAnswer.of(pod, compress_requests(pod, policy, bounds, vpa)))

    def _key(self, pod: dict[str, Any], annotations: dict[str, str], bounds: RequestBounds,
             vpa: frozenset[str]) -> Hashable | None:
        # One bytes object rather than nested tuples (see webhook.memo).
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        kept = metadata.get("annotations")
        if not isinstance(metadata, dict) or not isinstance(spec, dict) or not isinstance(kept, dict | None):
            return None
        try:
            return orjson.dumps([
                kept is None,
                {key: kept[key] for key in self._record_keys if key in kept} if kept else {},
                any(ref.get("kind") == "Node" for ref in metadata.get("ownerReferences") or []),
                _containers(spec.get("initContainers")),
                _containers(spec.get("containers")),
                spec.get("resources"),
                annotations,
                None if bounds is NO_BOUNDS else bounds,
                sorted(vpa),
            ], default=str)
        except (AttributeError, TypeError):  # a malformed Pod: compressed (and failed open) without the memo
            return None


def _containers(containers: Any) -> Any:
    """What compression reads of each container."""
    if not isinstance(containers, list):
        return containers
    return [(c.get("name"), c.get("restartPolicy"), c.get("resources")) for c in containers]


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
