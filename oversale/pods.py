"""Facts about Pod dicts (as the API server serialises them) that the policies rely on."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from oversale.quantity import CPU, MEMORY, RESOURCES, parse_amount

Pod = dict[str, Any]
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
RESIZE_PENDING = "PodResizePending"
RESIZE_IN_PROGRESS = "PodResizeInProgress"
TERMINAL_PHASES = ("Succeeded", "Failed")
"""Pods in these phases hold no node resources (finished, or rejected by the kubelet at admission)."""


def shape_problem(pod: Any) -> str | None:
    """The first field the policies read that is not of the type the API server serialises (an
    object where an object belongs, a list of objects for containers), or None. A Pod the API
    server stored always passes; a hand-made request may not, and is refused by name rather than
    failing deep inside a policy."""
    if not isinstance(pod, Mapping):
        return "the Pod is not an object"
    objects: list[tuple[str, Any]] = [("metadata", pod.get("metadata")), ("spec", pod.get("spec")),
                                      ("status", pod.get("status"))]
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if isinstance(metadata, Mapping):
        objects += [("metadata.annotations", metadata.get("annotations")), ("metadata.labels", metadata.get("labels"))]
        owners = metadata.get("ownerReferences")
        if owners is not None and not (isinstance(owners, list) and all(isinstance(o, Mapping) for o in owners)):
            return "metadata.ownerReferences is not a list of objects"
    if isinstance(spec, Mapping):
        objects.append(("spec.resources", spec.get("resources")))
        for field in ("initContainers", "containers"):
            containers = spec.get(field)
            if containers is None:
                continue
            if not isinstance(containers, list):
                return f"spec.{field} is not a list"
            for index, container in enumerate(containers):
                where = f"spec.{field}[{index}]"
                if not isinstance(container, Mapping):
                    return f"{where} is not an object"
                resources = container.get("resources")
                objects.append((f"{where}.resources", resources))
                if isinstance(resources, Mapping):
                    objects += [(f"{where}.resources.{kind}", resources.get(kind)) for kind in ("requests", "limits")]
    for where, value in objects:
        if value is not None and not isinstance(value, Mapping):
            return f"{where} is not an object"
    return None


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def all_containers(pod: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Init containers (native sidecars included) first, then app containers."""
    spec = pod.get("spec") or {}
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A native sidecar is an init container with ``restartPolicy: Always``."""
    return container.get("restartPolicy") == "Always"


def is_mirror_or_static(pod: Mapping[str, Any]) -> bool:
    """Static Pods reach the API server as mirror Pods owned by their Node; the kubelet, not the
    scheduler, runs them, and it rejects any change to a mirror Pod's spec."""
    metadata = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (metadata.get("annotations") or {}):
        return True
    return any(ref.get("kind") == "Node" for ref in metadata.get("ownerReferences") or [])


def controller_of(metadata: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the ownerReference with ``controller: true``, if any."""
    for ref in metadata.get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None


_TEMPLATE_HASH_LABELS = (("pod-template-hash", "Deployment"), ("rollouts-pod-template-hash", "Rollout"))
"""The label each controller that makes ReplicaSets gives their Pods: the hash it names them by."""


def workload_of(metadata: Mapping[str, Any]) -> str:
    """``namespace/Kind/name`` of the workload a Pod belongs to ("" without a controller): its
    controller, except that a ReplicaSet a Deployment (or an Argo Rollout) made stands for it. The
    Deployment controller names each of its ReplicaSets ``<deployment>-<pod-template-hash>`` and
    gives their Pods that hash as the ``pod-template-hash`` label (Argo Rollouts the same, with
    ``rollouts-pod-template-hash``), so the Pods of a rollout's new ReplicaSet, or of a canary,
    are known as the same workload as the old one's.

    >>> workload_of({"namespace": "shop", "labels": {"pod-template-hash": "5d8f9"},
    ...              "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f9", "controller": True}]})
    'shop/Deployment/web'
    """
    controller = controller_of(metadata)
    if controller is None:
        return ""
    kind, name = controller
    labels = metadata.get("labels") or {}
    for label, owner in _TEMPLATE_HASH_LABELS if kind == "ReplicaSet" else ():
        template_hash = labels.get(label)
        if isinstance(template_hash, str) and template_hash and name.endswith(f"-{template_hash}") \
                and len(name) > len(template_hash) + 1:
            kind, name = owner, name[:-len(template_hash) - 1]
            break
    return f"{metadata.get('namespace', '')}/{kind}/{name}"


def pod_workloads(owners: Mapping[tuple[str, str], tuple[str, str]],
                  controllers: Mapping[tuple[str, str, str], tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(namespace, Pod) -> its workload, named as :func:`workload_of` names it, from
    what kube-state-metrics publishes: ``owners`` ((namespace, Pod) -> the controller's (kind,
    name), ``kube_pod_owner``) and ``controllers`` ((namespace, kind, name) -> that controller's own
    controller, ``kube_replicaset_owner`` and ``kube_job_owner``). A ReplicaSet stands for the
    Deployment or Rollout that made it, a Job for its CronJob.

    >>> pod_workloads({("shop", "web-5d8f9-x1"): ("ReplicaSet", "web-5d8f9"), ("shop", "once"): ("Job", "once")},
    ...               {("shop", "ReplicaSet", "web-5d8f9"): ("Deployment", "web")})
    {('shop', 'web-5d8f9-x1'): 'shop/Deployment/web', ('shop', 'once'): 'shop/Job/once'}
    """
    named = {}
    for (namespace, pod), (kind, name) in owners.items():
        kind, name = controllers.get((namespace, kind, name), (kind, name))
        named[(namespace, pod)] = f"{namespace}/{kind}/{name}"
    return named


def requests_of(container: Mapping[str, Any], *, default_from_limits: bool = True) -> dict[str, int]:
    """A container's cpu/memory requests in millicores/bytes. The API server copies limits into
    missing requests before admission webhooks run, so a limit-only resource counts as requested."""
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    amounts: dict[str, int] = {}
    for resource in RESOURCES:
        if resource in requests:
            amounts[resource] = parse_amount(resource, requests[resource])
        elif default_from_limits and resource in limits:
            amounts[resource] = parse_amount(resource, limits[resource])
    return amounts


def request_of(container: Mapping[str, Any], resource: str, *, default_from_limits: bool = True) -> int | None:
    """One resource of ``requests_of`` (only that one parsed: this runs several times per
    container of every admitted Pod)."""
    resources = container.get("resources")
    if not resources:
        return None
    requests = resources.get("requests")
    if requests and resource in requests:
        return parse_amount(resource, requests[resource])
    limits = resources.get("limits") if default_from_limits else None
    if limits and resource in limits:
        return parse_amount(resource, limits[resource])
    return None


def limit_of(container: Mapping[str, Any], resource: str) -> int | None:
    """One resource of ``limits_of``."""
    limits = (container.get("resources") or {}).get("limits")
    return parse_amount(resource, limits[resource]) if limits and resource in limits else None


def limits_of(container: Mapping[str, Any]) -> dict[str, int]:
    """A container's (or a pod-level ``spec.resources``) cpu/memory limits."""
    limits = (container.get("resources") or {}).get("limits") or {}
    return {r: parse_amount(r, limits[r]) for r in RESOURCES if r in limits}


def has_pod_level_resources(pod: Mapping[str, Any]) -> bool:
    resources = (pod.get("spec") or {}).get("resources") or {}
    return any(r in (resources.get(kind) or {}) for kind in ("requests", "limits") for r in RESOURCES)


def effective_request(pod: Mapping[str, Any], resource: str) -> int:
    """What the scheduler reserves for ``resource`` by the Pod's spec (without overhead, which
    compression never changes): pod-level requests when set, else the sidecar-aware rule of
    kube-scheduler's PodRequests: each regular init container runs alongside the sidecars started
    before it, and the app containers run alongside all sidecars."""
    return _aggregate_requests(pod, resource, lambda container, _: request_of(container, resource) or 0)


def held_request(pod: Mapping[str, Any], resource: str) -> int:
    """What a Pod holds of ``resource`` on its node while an in-place resize may be under way, as
    kube-scheduler counts a Pod already there (KEP 1287; component-helpers' PodRequests with
    status resources): per app container and sidecar, the largest of its spec request, the request
    the runtime applies (``status.containerStatuses[].resources``) and what the kubelet admitted
    (``allocatedResources``); the spec request is left out while the resize is ``Infeasible``, as
    the kubelet will never apply it. A downsize in flight thus still holds its old request, and a
    Pod not started yet (no such status) holds its spec. Pod-level requests, when set, decide
    alone (their in-place resize is alpha).

    >>> pod = {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]},
    ...        "status": {"containerStatuses": [{"name": "app", "allocatedResources": {"cpu": "3"},
    ...                                          "resources": {"requests": {"cpu": "3"}}}]}}
    >>> held_request(pod, "cpu"), effective_request(pod, "cpu")
    (3000, 1000)
    """
    status = pod.get("status") or {}
    statuses = {s.get("name"): s for kind in ("initContainerStatuses", "containerStatuses")
                for s in status.get(kind) or [] if isinstance(s, Mapping)}
    if not statuses:
        return effective_request(pod, resource)
    infeasible = resize_infeasible(pod)

    def held(container: Mapping[str, Any], resizable: bool) -> int:
        spec = request_of(container, resource) or 0
        own = statuses.get(container.get("name")) if resizable else None
        applied = own.get("resources") if own else None
        # kube-scheduler reads the status only once the kubelet has reported applied resources.
        if own is None or not isinstance(applied, Mapping):
            return spec
        amounts = [_amount(resource, (applied.get("requests") or {}).get(resource)),
                   _amount(resource, (own.get("allocatedResources") or {}).get(resource))]
        return max(amounts + ([] if infeasible else [spec]))

    return _aggregate_requests(pod, resource, held)


def condition_of(pod: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The Pod's condition of type ``kind`` when its status is ``True``, else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def resize_infeasible(pod: Mapping[str, Any]) -> bool:
    """The kubelet has found the Pod's in-place resize Infeasible: condition ``PodResizePending``
    with reason ``Infeasible`` (Kubernetes 1.33+), or ``status.resize: Infeasible`` before."""
    if (pod.get("status") or {}).get("resize") == "Infeasible":
        return True
    pending = condition_of(pod, RESIZE_PENDING)
    return pending is not None and pending.get("reason") == "Infeasible"


def _amount(resource: str, value: Any) -> int:
    return parse_amount(resource, value) if value is not None else 0


def _aggregate_requests(pod: Mapping[str, Any], resource: str,
                        amount: Callable[[Mapping[str, Any], bool], int]) -> int:
    """The sidecar-aware sum of ``amount(container, resizable)`` (resizable: an app container or a
    sidecar, the containers in-place resize may change)."""
    spec = pod.get("spec") or {}
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    if resource in pod_level:
        return parse_amount(resource, pod_level[resource])
    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers") or []:
        if is_sidecar(container):
            sidecars += amount(container, True)
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, amount(container, False) + sidecars)
    apps = sum(amount(c, True) for c in spec.get("containers") or [])
    return max(init_peak, apps + sidecars)


def effective_limit(pod: Mapping[str, Any], resource: str) -> int | None:
    """Pod-level limit for LimitRange's Pod rules (same aggregation as the requests), or None when
    some container has no limit for ``resource`` (then the Pod as a whole is unbounded)."""
    spec = pod.get("spec") or {}
    pod_level = (spec.get("resources") or {}).get("limits") or {}
    if resource in pod_level:
        return parse_amount(resource, pod_level[resource])
    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers") or []:
        limits = limits_of(container)
        if resource not in limits:
            return None
        if is_sidecar(container):
            sidecars += limits[resource]
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, limits[resource] + sidecars)
    apps = 0
    for container in spec.get("containers") or []:
        limits = limits_of(container)
        if resource not in limits:
            return None
        apps += limits[resource]
    return max(init_peak, apps + sidecars)


def qos_class(pod: Mapping[str, Any]) -> str:
    """The Pod's QoS class, computed as the kubelet does (sums over all containers, zero amounts
    ignored; pod-level resources decide when set)."""
    # requests_of reads a unit's "resources": for pod-level resources that unit is the spec.
    units = [pod.get("spec") or {}] if has_pod_level_resources(pod) else list(all_containers(pod))
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for unit in units:
        for resource, amount in requests_of(unit).items():
            if amount:
                requests[resource] = requests.get(resource, 0) + amount
        unit_limits = {r: a for r, a in limits_of(unit).items() if a}
        for resource, amount in unit_limits.items():
            limits[resource] = limits.get(resource, 0) + amount
        if set(unit_limits) != set(RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


def is_guaranteed(pod: Mapping[str, Any]) -> bool:
    """``qos_class(pod) == "Guaranteed"``, answered at the first container without both limits
    (most Pods: this runs on every admission)."""
    if not has_pod_level_resources(pod):
        for container in all_containers(pod):
            limits = (container.get("resources") or {}).get("limits")
            if not limits or CPU not in limits or MEMORY not in limits:
                return False
    return qos_class(pod) == "Guaranteed"


def scheduled_request(pod: Mapping[str, Any], resource: str) -> int:
    """What a Pod takes from its node's allocatable, as kube-scheduler and kubelet admission count
    it: what it holds (:func:`held_request`; its spec request for a Pod not yet running) plus the
    RuntimeClass overhead."""
    overhead = (pod.get("spec") or {}).get("overhead") or {}
    extra = parse_amount(resource, overhead[resource]) if resource in overhead else 0
    return held_request(pod, resource) + extra
