"""The annotation vocabulary: every key this service reads or writes, and how values are read.

All keys share one configurable prefix (``OVERSALE_ANNOTATION_PREFIX``, default
``stke.platform``), so the default keys are those of the design this service comes from.
This module is the one annotation reader: webhooks and reconcilers parse values only here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import Any

import orjson

from oversale.errors import InvalidAnnotation, InvalidRatio
from oversale.quantity import CPU, RESOURCES

DEFAULT_PREFIX = "stke.platform"

# A ratio is a plain decimal: no sign, no exponent, no "inf"/"NaN". Decimal keeps the text's
# exact value, so "3.7" is 37/10 and never rounds the wrong way as a binary float would.
_RATIO = re.compile(r"^\d{1,6}(\.\d{1,12})?$", re.ASCII)  # ASCII digits only, as the API server reads them
PLAIN_DECIMAL = _RATIO
"""The form of every number an annotation of ours holds."""

_YES = frozenset({"y", "yes", "true"})
_NO = frozenset({"n", "no", "false"})


@dataclass(frozen=True)
class AnnotationKeys:
    """The full annotation keys for one prefix (each built once: admission reads them many times
    per review)."""

    prefix: str = DEFAULT_PREFIX

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    @cached_property
    def cpu_requests_ratio(self) -> str:
        """Workload/Pod: CPU compression ratio (original request / new request)."""
        return self._key("cpu-requests-ratio")

    @cached_property
    def memory_requests_ratio(self) -> str:
        """Workload/Pod: memory compression ratio; memory is compressed only when set."""
        return self._key("memory-requests-ratio")

    @cached_property
    def enable_resource_compress(self) -> str:
        """Workload/Pod: ``n`` switches compression off, ``y`` opts in to the ratio reconciler."""
        return self._key("enable-resource-compress")

    @cached_property
    def enable_memory_compress(self) -> str:
        """Workload: ``y`` lets the ratio reconciler set memory ratios too (CPU only otherwise)."""
        return self._key("enable-memory-compress")

    @cached_property
    def ratio_last_change(self) -> str:
        """Written on workloads and Nodes by the reconcilers: when and why a ratio last changed."""
        return self._key("ratio-last-change")

    @cached_property
    def original_target_utilization(self) -> str:
        """Written on HPAs the reconciler rescales: the cpu target utilization before any rescaling."""
        return self._key("original-target-utilization")

    @cached_property
    def original_memory_target_utilization(self) -> str:
        """The same for an HPA's memory target."""
        return self._key("original-memory-target-utilization")

    @cached_property
    def oversale_label(self) -> str:
        """Node label (value ``enabled``) that routes a node's writes to the webhook and opts it in
        to the oversale reconciler."""
        return self._key("oversale")

    @cached_property
    def original_requests(self) -> str:
        """Written on Pods: JSON of each container's requests before compression."""
        return self._key("original-requests")

    @cached_property
    def written_requests(self) -> str:
        """Written on Pods whose requests were raised: JSON of the requests this service set (same
        shape as ``original-requests``), so a reinvocation can tell its own raise from another
        webhook's."""
        return self._key("written-requests")

    @cached_property
    def compression(self) -> str:
        """Written on Pods: short audit of the ratios applied and the guards that capped them."""
        return self._key("compression")

    @cached_property
    def inplace_resize(self) -> str:
        """Workload: ``n`` keeps its running Pods as they are (new ratios apply at the next rollout)."""
        return self._key("inplace-resize")

    @cached_property
    def resize_restart(self) -> str:
        """Workload: ``y`` lets in-place resize change a resource whose container ``resizePolicy``
        restarts the container (left alone otherwise)."""
        return self._key("resize-restart")

    @cached_property
    def resized_ratios(self) -> str:
        """Written on Pods resized in place: the ratios the last resize asked for (``cpu=2,memory=1``)."""
        return self._key("resized-ratios")

    @cached_property
    def last_resize(self) -> str:
        """Written on Pods resized in place: when (RFC 3339), for the minimum interval per Pod."""
        return self._key("last-resize")

    @cached_property
    def resize_infeasible(self) -> str:
        """Written on Pods whose resize the kubelet found Infeasible: the ratios it was asked at;
        not retried until they change."""
        return self._key("resize-infeasible")

    @cached_property
    def cpu_oversale_ratio(self) -> str:
        """Node: CPU oversale ratio (allocatable multiplier)."""
        return self._key("cpu-oversale-ratio")

    @cached_property
    def memory_oversale_ratio(self) -> str:
        """Node: memory oversale ratio (allocatable multiplier)."""
        return self._key("memory-oversale-ratio")

    @cached_property
    def mutate(self) -> str:
        """Node: ``false`` switches overselling off (real values are restored on the next write)."""
        return self._key("mutate")

    @cached_property
    def real_allocatable(self) -> str:
        """Written on Nodes: JSON of the cpu/memory allocatable the kubelet last reported."""
        return self._key("real-allocatable")

    @cached_property
    def real_capacity(self) -> str:
        """Written on Nodes: JSON of the cpu/memory capacity the kubelet last reported."""
        return self._key("real-capacity")

    @cached_property
    def applied_oversale_ratio(self) -> str:
        """Written on Nodes: JSON of the ratio applied per resource (absent when not oversold)."""
        return self._key("applied-oversale-ratio")

    @cached_property
    def cpu_scheduling_watermark(self) -> str:
        """Node (annotation or label): share of real cpu (5-min average) above which the extender
        places no new Pods there."""
        return self._key("cpu-scheduling-watermark")

    @cached_property
    def cpu_peak_scheduling_watermark(self) -> str:
        """Node: the same for the 1-hour maximum of cpu."""
        return self._key("cpu-peak-scheduling-watermark")

    @cached_property
    def memory_scheduling_watermark(self) -> str:
        """Node: the same for memory."""
        return self._key("memory-scheduling-watermark")

    @cached_property
    def cpu_runtime_watermark(self) -> str:
        """Node (annotation or label): share of real cpu above which, for several observations in a
        row, the remediator moves Pods off the node."""
        return self._key("cpu-runtime-watermark")

    @cached_property
    def memory_runtime_watermark(self) -> str:
        """Node: the same for memory."""
        return self._key("memory-runtime-watermark")

    @cached_property
    def evictable(self) -> str:
        """Pod (template): ``n`` keeps it where it is; ``y`` lets the remediator evict it despite
        local storage (emptyDir, hostPath)."""
        return self._key("evictable")

    @cached_property
    def reservations(self) -> str:
        """Written on Nodes by the remediator: JSON of room held for the replacement of an evicted
        Pod (``{"ns/Kind/name": {"cpu": "500m", "memory": "1Gi", "until": "..."}}``)."""
        return self._key("reservations")

    @cached_property
    def remediation_cooldowns(self) -> str:
        """Written on Nodes by the remediator when it evicts from them: JSON of when the node's
        cooldown and those of the workloads it moved end (``{"node": "...", "workloads":
        {"ns/Kind/name": "..."}}``), so a replica that takes the Lease over keeps them."""
        return self._key("remediation-cooldowns")

    @cached_property
    def hot_taint(self) -> str:
        """Taint key the remediator puts on a Node it has just evicted from (``PreferNoSchedule``,
        the value the Unix time it lasts until), so replacements placed by any scheduler avoid it."""
        return self._key("hot")

    @cached_property
    def cpu_bind_policy(self) -> str:
        """Pod annotation or Node label: ``FullPCPUs`` or ``SpreadByPCPUs`` asks for exclusive CPUs."""
        return self._key("cpu-bind-policy")

    @cached_property
    def numa_topology_policy(self) -> str:
        """Pod annotation or Node label: ``single-numa-node`` keeps a cpuset inside one NUMA node."""
        return self._key("numa-topology-policy")

    @cached_property
    def numa_allocate_strategy(self) -> str:
        """Node label: ``MostAllocated`` (pack, default) or ``LeastAllocated`` (spread) NUMA zones."""
        return self._key("numa-allocate-strategy")

    @cached_property
    def cpu_topology(self) -> str:
        """Node annotation: CPU topology in Koordinator's JSON shape."""
        return self._key("cpu-topology")

    @cached_property
    def extender_leader(self) -> str:
        """Label the leading extender replica puts on its own Pod (``"true"``): the extender's
        Service selects it, so kube-scheduler reaches the leader alone while every replica is Ready."""
        return self._key("extender-leader")

    @cached_property
    def certificates(self) -> str:
        """Written on a Deployment's Pod template by ``certs restart-on-change``: a digest of the
        certificates its Pods were started with (a new one rolls them)."""
        return self._key("certificates")

    def certificates_from(self, namespace: str, name: str) -> str:
        """Written on a Deployment's Pod template by ``certs ensure --restart``: a digest of the
        certificates its Pods were started with from that one Secret. One key per Secret: the
        ensure runs of two Secrets that restart the same Deployment would otherwise overwrite each
        other's record and restart it on every run."""
        name_part = f"certificates.{namespace}.{name}"
        if len(name_part) > 63:  # the name part of an annotation key is at most 63 characters
            name_part = f"certificates.{hashlib.sha256(f'{namespace}/{name}'.encode()).hexdigest()[:16]}"
        return self._key(name_part)

    @cached_property
    def resource_status(self) -> str:
        """Written on bound Pods by the scheduler extender: ``{"cpuset": "4-7", "numaNode": 1}``."""
        return self._key("resource-status")

    def hot_time_budget(self, resource: str) -> str:
        """Node annotation or label: this node's (pool's) hot-time budget for ``cpu`` or ``memory``,
        a share of time 0..1, overriding the cluster-wide setting."""
        return self._key(f"{resource}-hot-time-budget")

    @cached_property
    def hot_time(self) -> str:
        """Node, written by the reconciler: the observed hot time over 7 days against the budget,
        for ``kubectl describe node``."""
        return self._key("hot-time")

    @cached_property
    def hot_time_account(self) -> str:
        """Node, written by the reconciler: JSON per resource, the account's multiplier of the
        ratio target and when it last backed off."""
        return self._key("hot-time-account")

    @cached_property
    def pool_hot_time_account(self) -> str:
        """Node, written by the reconciler on every node of a pool: the pool's account (the same
        JSON as ``hot-time-account``). A pool is no object of its own, so each member carries it."""
        return self._key("pool-hot-time-account")

    def oversale_ratio(self, resource: str) -> str:
        """The node oversale-ratio key for ``cpu`` or ``memory``."""
        return self.cpu_oversale_ratio if resource == CPU else self.memory_oversale_ratio

    def node_record_keys(self) -> tuple[str, ...]:
        """What the node webhook writes (and restores from the stored Node)."""
        return (self.real_allocatable, self.real_capacity, self.applied_oversale_ratio)

    def requests_ratio(self, resource: str) -> str:
        """The compression-ratio key for ``cpu`` or ``memory``."""
        return self.cpu_requests_ratio if resource == CPU else self.memory_requests_ratio

    def original_target_utilization_of(self, resource: str) -> str:
        """The key that records an HPA's ``cpu`` or ``memory`` target before rescaling."""
        return self.original_target_utilization if resource == CPU else self.original_memory_target_utilization

    def workload_keys(self) -> tuple[str, ...]:
        """The keys read from a Pod's owning workload (what the owner caches keep)."""
        return (self.cpu_requests_ratio, self.memory_requests_ratio, self.enable_resource_compress)

    def ours(self, annotations: Mapping[str, str] | None) -> dict[str, str]:
        """Only the workload keys of ``annotations`` (what a cache needs to remember)."""
        if not annotations:
            return {}
        return {key: annotations[key] for key in self.workload_keys() if key in annotations}


def record_text(value: Mapping[str, Any]) -> str:
    """A record (requests, real node values, applied ratios) as annotation text: compact JSON with
    sorted keys, so the same record always gives the same text and an unchanged object no patch.

    >>> record_text({"memory": "1Gi", "cpu": "500m"})
    '{"cpu":"500m","memory":"1Gi"}'
    """
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def read_record_text(text: str) -> Any:
    """The value of a record annotation (``ValueError`` when it is not JSON). orjson: node
    heartbeats read three of these on every status write."""
    return orjson.loads(text)


def parse_ratio(text: str, minimum: Decimal = Decimal(1)) -> Decimal:
    """Read a ratio annotation: a plain decimal, at least ``minimum`` when that is 1 (node ratios);
    any positive value otherwise (compression ratios below 1 *raise* requests; the caller clamps).

    >>> parse_ratio("2.25")
    Decimal('2.25')
    >>> parse_ratio("0.8", minimum=Decimal("0.5"))
    Decimal('0.8')
    >>> parse_ratio("1e3")
    Traceback (most recent call last):
    ...
    oversale.errors.InvalidRatio: '1e3' is not a plain decimal number such as 1, 1.5 or 2.25
    """
    stripped = text.strip() if isinstance(text, str) else ""
    if not _RATIO.match(stripped):
        raise InvalidRatio(f"{text!r} is not a plain decimal number such as 1, 1.5 or 2.25")
    ratio = Decimal(stripped)
    if ratio < 1 and minimum >= 1:
        raise InvalidRatio(f"{text!r} is below 1 (a ratio of 1 means no change)")
    if ratio <= 0:
        raise InvalidRatio(f"{text!r} is not above 0 (a ratio of 1 means no change, 0.5 doubles the request)")
    return ratio


def format_ratio(ratio: Decimal) -> str:
    """A ratio as annotation text: plain decimal, no exponent, no trailing zeros.

    >>> format_ratio(Decimal("1.50")), format_ratio(Decimal("2.00")), format_ratio(Decimal("10"))
    ('1.5', '2', '10')
    """
    text = format(ratio, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def current_ratio(annotations: Mapping[str, str], key: str, minimum: Decimal = Decimal(1)) -> Decimal:
    """The ratio an object carries now (1 when absent or invalid: the webhooks treat it so too);
    a value below ``minimum`` reads as ``minimum``, as the webhook clamps it."""
    try:
        return max(parse_ratio(annotations[key], minimum), minimum) if key in annotations else Decimal(1)
    except InvalidRatio:
        return Decimal(1)


def wants(annotations: Mapping[str, str], key: str) -> bool:
    """Whether a yes/no annotation is set to yes (absent or invalid: no)."""
    try:
        return key in annotations and parse_switch(annotations[key])
    except InvalidAnnotation:
        return False


def parse_switch(text: str) -> bool:
    """Read a yes/no annotation: ``y``/``yes``/``true`` or ``n``/``no``/``false``, any case."""
    value = text.strip().lower() if isinstance(text, str) else ""
    if value in _YES:
        return True
    if value in _NO:
        return False
    raise InvalidAnnotation(f"{text!r} is not one of y, yes, true, n, no, false")


@dataclass(frozen=True)
class AnnotationProblem:
    """An annotation of ours whose value was ignored."""

    key: str
    value: str
    reason: str

    def __str__(self) -> str:
        return f"annotation {self.key}={self.value!r} ignored: {self.reason}"


@dataclass
class RatioReading:
    """Ratios read from annotations: resource -> ratio other than 1, and what was wrong on the way."""

    ratios: dict[str, Decimal] = field(default_factory=dict)
    problems: list[AnnotationProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def read_ratios(
    annotations: Mapping[str, str],
    key_of: Callable[[str], str],
    maximum_of: Callable[[str], Decimal],
    otherwise: str,
    minimum: Decimal = Decimal(1),
) -> RatioReading:
    """Read one ratio annotation per resource (``key_of(resource)``). An invalid value leaves that
    resource out and becomes a problem ("... ; cpu {otherwise}"); a value above ``maximum_of``
    or below ``minimum`` is clamped to it with a warning; a ratio of 1 means "leave alone".
    With ``minimum`` 1 (node ratios) a value below 1 is invalid, not clamped."""
    reading = RatioReading()
    for resource in RESOURCES:
        key = key_of(resource)
        if key not in annotations:
            continue
        text = annotations[key]
        try:
            ratio = parse_ratio(text, minimum)
        except InvalidRatio as error:
            reading.problems.append(AnnotationProblem(key, text, f"{error}; {resource} {otherwise}"))
            continue
        maximum = maximum_of(resource)
        if ratio > maximum:
            reading.warnings.append(f"{key}={text} is above the maximum {maximum}; using {maximum}")
            ratio = maximum
        if ratio < minimum:
            reading.warnings.append(f"{key}={text} is below the minimum {minimum}; using {minimum}")
            ratio = minimum
        if ratio != 1:
            reading.ratios[resource] = ratio
    return reading
