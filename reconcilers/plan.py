"""``python -m reconcilers plan``: the whole-system replay on the cluster's own history, before
anything is switched on. It reads Prometheus only (nothing is written to the cluster).

The history is what the usual exporters publish:

- kube-state-metrics: ``kube_pod_container_resource_requests`` (requests; with
  ``kube_pod_init_container_resource_requests`` and ``kube_pod_init_container_info`` where
  exported, init containers' and sidecars' too: :func:`pod_request_query`), ``kube_pod_owner``
  (which workload a Pod belongs to), ``kube_pod_info`` (its node), ``kube_node_status_allocatable``
  (node sizes), optionally ``kube_replicaset_owner`` and ``kube_job_owner`` (a ReplicaSet's
  Deployment, a Job's CronJob), ``kube_horizontalpodautoscaler_info`` and
  ``kube_horizontalpodautoscaler_spec_target_metric`` (workloads scaled on utilization),
  ``kube_pod_overhead_cpu_cores`` and ``kube_pod_overhead_memory_bytes`` (RuntimeClass overhead:
  :func:`add_overhead`) and, where its label allowlist exports them, ``kube_node_labels`` (node
  pools);
- cAdvisor (the kubelet's ``/metrics/cadvisor``): ``container_cpu_usage_seconds_total`` and
  ``container_memory_working_set_bytes``.

Each Pod's containers are summed every ``step``, and each workload's Pods are joined into as
many continuous series as it ran Pods at once (:func:`replica_lanes`, so its history spans its
rollouts as it does live): the replayed workloads. The Pods of each node pool are replayed on
nodes of that pool's size (the most common allocatable among its nodes, less what its
DaemonSet and static Pods hold of each: :func:`node_bound_share`). On a cluster already
oversold the exporters see the oversold sizes: a node whose capacity is more than its machine's
(cAdvisor's ``machine_cpu_cores`` and ``machine_memory_bytes``, kube-state-metrics'
``kube_node_status_capacity``, optional) is planned at its real size (:func:`real_node_sizes`),
and each Pod whose original-requests record kube-state-metrics exports (``kube_pod_annotations``)
at the requests it was created with (:func:`restore_original_requests`); the others at the
requests running, already right-sized where oversale runs. A Pod whose ``vpaUpdates`` annotation
kube-state-metrics exports keeps the requests its VerticalPodAutoscaler set, as it does live.
The report is the backtest's, per pool, plus what our system at the chosen budget would do per
namespace and the ratios it would set.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import re
import statistics
import time
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube.client import first_few
from kube.prometheus import (
    APP_CONTAINERS,
    NO_OWNER,
    OWNER_CONTROLLERS,
    POD_CPU,
    POD_MEMORY,
    RANGE_STEPS,
    PrometheusAPI,
    Series,
    controller_query,
    duration,
    node_name,
)
from oversale.annotations import AnnotationKeys
from oversale.budget import HotTimeBudget
from oversale.compression import VPA_UPDATES, recorded_pod_request, vpa_set_resources
from oversale.estimator import quantile
from oversale.pods import pod_workloads
from oversale.quantity import CPU, RESOURCES
from reconcilers.history import HistoryUnavailable
from reconcilers.prometheus import PrometheusHistory
from simulator.formats import FIXED_COLUMN, GENERIC_COLUMNS
from simulator.report import (
    AT_PEAKS,
    budget_goal_text,
    days_like_these_note,
    hot_time_interval,
    interval_text,
    placement_range,
    placements_note,
)

EXPORTERS = {
    "kube_pod_container_resource_requests": "kube-state-metrics",
    "kube_pod_owner": "kube-state-metrics",
    "kube_pod_info": "kube-state-metrics",
    "kube_node_status_allocatable": "kube-state-metrics",
    "container_cpu_usage_seconds_total": "cAdvisor (the kubelet's /metrics/cadvisor)",
    "container_memory_working_set_bytes": "cAdvisor (the kubelet's /metrics/cadvisor)",
}


def pod_request_query(resource: str) -> str:
    """The PromQL of each Pod's ``resource`` request as kube-scheduler reserves it, from
    kube-state-metrics: its app containers' summed, plus its sidecars' (init containers with
    ``restartPolicy: Always``, Kubernetes 1.29+, which run beside them: Istio's or Linkerd's
    proxy in native sidecar mode), or its largest regular init container's where that is more.
    kube-state-metrics publishes init containers apart (``kube_pod_init_container_resource_requests``),
    and tells a sidecar by ``kube_pod_init_container_info``'s ``restart_policy`` (since its 2.11):
    with an older one every init container counts as a regular one. A regular init container is
    taken alone, not with the sidecars started before it (the order is not exported).

    Each series is taken once per container before the Pod's sum: kube-state-metrics run as two
    replicas for availability, or scraped by two jobs, publishes every series twice."""
    def per_container(metric: str) -> str:
        return f'max by (namespace, pod, container) ({metric}{{resource="{resource}"}})'

    apps = f"sum by (namespace, pod) ({per_container('kube_pod_container_resource_requests')})"
    init = per_container("kube_pod_init_container_resource_requests")
    sidecar = 'max by (namespace, pod, container) (kube_pod_init_container_info{restart_policy="Always"})'
    sidecars = f"sum by (namespace, pod) ({init} * on (namespace, pod, container) {sidecar})"
    regular = f"max by (namespace, pod) ({init} unless on (namespace, pod, container) {sidecar})"
    running = f"({apps} + {sidecars}) or {apps} or {sidecars}"
    # The two sides are told apart by a label so that ``or`` keeps both, then the larger is taken.
    return (f'max by (namespace, pod) (label_replace({running}, "phase", "running", "", "") '
            f'or label_replace({regular}, "phase", "init", "", ""))')


# Usage is taken once per container (cpu: per cgroup, ``id``, as the reconcilers read it) before
# the Pod's sum, as requests are (:func:`pod_request_query`).
QUERIES = {
    "cpu_request": pod_request_query("cpu"),
    "memory_request": pod_request_query("memory"),
    "cpu_usage": f"{POD_CPU} / 1000",
    "memory_usage": POD_MEMORY,
}
CPU_PEAK = ("sum by (namespace, pod) (max by (namespace, pod, container, id) (max_over_time("
            f"irate(container_cpu_usage_seconds_total{APP_CONTAINERS}[$IRATE])[$STEP:$SCRAPE])))")
"""Cores: each Pod's highest rate between two scrapes in each step (``plan --peaks``). Each
container's peak is taken apart, once per cgroup, and the Pod's summed: an upper bound of the
Pod's own peak where its containers do not peak together, as the backtest's summed peaks are of
a node's (an aggregation inside the subquery would be evaluated at every scrape)."""
SOURCE_METRIC = {"cpu_request": "kube_pod_container_resource_requests",
                 "memory_request": "kube_pod_container_resource_requests",
                 "cpu_usage": "container_cpu_usage_seconds_total",
                 "memory_usage": "container_memory_working_set_bytes"}


OVERHEAD_METRICS = {"cpu": "kube_pod_overhead_cpu_cores", "memory": "kube_pod_overhead_memory_bytes"}
"""kube-state-metrics' series of a Pod's RuntimeClass overhead, per resource (cores, bytes)."""


def add_overhead(pod: PodHistory, resource: str, amount: float) -> None:
    """Counts a Pod's RuntimeClass overhead (a Kata Containers VM, gVisor's sandbox: set at
    admission, fixed for the Pod's life) in its request and its use of ``resource``.
    kube-scheduler adds it to the Pod's requests, and the sandbox runs outside the app
    containers whose cAdvisor series are the Pod's use; its use is taken to be what it reserves.
    Right-sizing lowers the containers' requests, never the overhead: replayed as part of both
    request and use, it is sized at about itself again."""
    usage = pod.series.get(f"{resource}_usage")
    if f"{resource}_request" not in pod.series and usage is not None:
        # A Pod whose containers request nothing is still reserved its overhead.
        pod.series[f"{resource}_request"] = (array("d", usage[0]), array("d", [0.0]) * len(usage[0]))
    for key in (f"{resource}_request", f"{resource}_usage", f"{resource}_peak"):
        if (series := pod.series.get(key)) is not None:
            values = series[1]
            for index in range(len(values)):
                values[index] += amount


class PlanError(Exception):
    """The history cannot be planned on (a missing exporter, too little history)."""


@dataclass
class PodHistory:
    namespace: str
    pod: str
    owner: str = ""
    """``Kind/name`` of the workload that runs the Pod: its owner's controller where
    kube-state-metrics names one (a Deployment, a CronJob), else its owner; empty for a bare Pod."""
    node: str = ""
    fixed: frozenset[str] = frozenset()
    """Resources an HPA scales its workload on by utilization: the replay leaves their requests."""
    series: dict[str, Series] = field(default_factory=dict)
    """cpu_request, cpu_usage (cores), memory_request, memory_usage (bytes), cpu_peak (cores, with
    ``plan --peaks``); cleared once written to the pool's export"""

    @property
    def workload(self) -> str:
        return f"{self.namespace}/{self.owner or 'Pod/' + self.pod}"

    def span(self) -> tuple[float, float] | None:
        """First and last time the Pod used cpu (what the export writes rows for)."""
        usage = self.series.get("cpu_usage")
        return (usage[0][0], usage[0][-1]) if usage is not None and len(usage[0]) else None


def replica_lanes(pods: list[PodHistory]) -> list[tuple[str, list[PodHistory]]]:
    """Each workload's Pods joined into as many continuous series ("lanes", named
    ``namespace/Kind/name/<n>``) as it ran Pods at once, each Pod in the first lane free when it
    started: the replayed workloads.

    Live, a workload's ratio comes from the usage of all its Pods over the history window, those
    gone since included. A Deployment rolled out every day has a new Pod, with a new name, every
    day; replayed one Pod each, none would ever have the day of history right-sizing needs. Its
    lanes carry the history across rollouts, evictions and rescheduling, as the live reconciler
    does.

    >>> def pod(name, start, end):
    ...     return PodHistory("shop", name, "Deployment/web", series={"cpu_usage": ((start, end), (1, 1))})
    >>> for lane, members in replica_lanes([pod("web-a", 0, 99), pod("web-b", 0, 99), pod("web-c", 90, 199),
    ...                                         pod("web-d", 100, 199)]):
    ...     print(lane, [p.pod for p in members])
    shop/Deployment/web/0 ['web-a', 'web-d']
    shop/Deployment/web/1 ['web-b']
    shop/Deployment/web/2 ['web-c']

    Pods seen at the same moment ran at once, even for one sample (a rollout's surge):
    >>> [lane for lane, _ in replica_lanes([pod("web-a", 0, 99), pod("web-b", 99, 199)])]
    ['shop/Deployment/web/0', 'shop/Deployment/web/1']
    """
    by_workload: dict[str, list[tuple[tuple[float, float], PodHistory]]] = {}
    for pod in pods:
        span = pod.span()
        if span is not None:
            by_workload.setdefault(pod.workload, []).append((span, pod))
    result = []
    for workload, members in by_workload.items():
        lanes: list[tuple[float, list[PodHistory]]] = []  # (last time used, its Pods)
        for (first, last), pod in sorted(members, key=lambda member: (member[0], member[1].pod)):
            free = next((index for index, (ended, _) in enumerate(lanes) if ended < first), None)
            if free is None:
                lanes.append((last, [pod]))
            else:
                lanes[free] = (last, [*lanes[free][1], pod])
        result += [(f"{workload}/{index}", lane_pods) for index, (_, lane_pods) in enumerate(lanes)]
    return result


@dataclass
class ClusterHistory:
    pods: dict[tuple[str, str], PodHistory]
    node_sizes: dict[str, tuple[float, float]]
    """node -> (allocatable cores, bytes), real (:func:`real_node_sizes`)"""
    node_pools: dict[str, str]
    oversold: set[str] = field(default_factory=set)
    """Nodes whose reported size was more than their machine's, taken at their real size."""
    restored: set[tuple[str, str]] = field(default_factory=set)
    """Pods planned at the requests they were created with (:func:`restore_original_requests`)."""


def read_cluster_history(prometheus: PrometheusHistory, days: float, pool_labels: tuple[str, ...],
                         progress: Callable[[str], None], keys: AnnotationKeys, now: float | None = None,
                         rescale_hpa: bool = False, peaks: bool = False) -> ClusterHistory:
    """Every series the plan needs, over the last ``days``; a required one absent names its
    exporter. ``rescale_hpa``: as ``OVERSALE_RESCALE_HPA``, HPA-scaled workloads are right-sized
    too (their HPA's target is rescaled live), else their HPA's resources are left alone.
    ``keys``: the annotations of ``OVERSALE_ANNOTATION_PREFIX`` (the original-requests record).
    ``peaks``: each Pod's cpu peak in each step too (:data:`CPU_PEAK`)."""
    # The steps fall on multiples of the step since the epoch, where Prometheus evaluates the
    # subqueries the live hot-time account counts with: the plan counts the same samples, and a
    # plan run again within a step reads the same history. A range query's steps are its start
    # and every step after, so the start is a multiple too (``--days 14.01`` is not).
    step = prometheus.resolution
    end = (now if now is not None else time.time()) // step * step
    start = (end - days * 86400) // step * step
    scrape = cadvisor_scrape_interval(prometheus, end)
    pods = _pod_series(prometheus, start, end, days, scrape, progress)
    if peaks:
        read_cpu_peaks(prometheus, pods, scrape, start, end, progress)
    trim_to_whole_days(pods, prometheus.resolution)
    annotated = pod_annotations(prometheus, start, end, pods, (keys.original_requests, VPA_UPDATES))
    restored = restore_original_requests(prometheus, start, end, pods, annotated, keys.original_requests, progress)
    _name_owners(prometheus, pods, start, end, days)
    _add_overheads(prometheus, pods, start, end)
    _mark_fixed(prometheus, pods, annotated, start, end, rescale_hpa, progress)
    _place_on_nodes(prometheus, pods, start, end, days)
    sizes = {node: [cores or 0.0, memory_bytes or 0.0] for node, (cores, memory_bytes) in
             _node_status(prometheus, "kube_node_status_allocatable", start, end, days).items()}
    oversold = real_node_sizes(sizes, _machine_sizes(prometheus, start, end, sizes, progress),
                               _node_status(prometheus, "kube_node_status_capacity", start, end))
    return ClusterHistory(pods, {n: (s[0], s[1]) for n, s in sizes.items()},
                          _node_pools(prometheus, pool_labels, start, end), oversold, restored)


def _pod_series(prometheus: PrometheusHistory, start: float, end: float, days: float, scrape: float | None,
                progress: Callable[[str], None]) -> dict[tuple[str, str], PodHistory]:
    """Each Pod's usage and requests (:data:`QUERIES`), by namespace and name."""
    pods: dict[tuple[str, str], PodHistory] = {}
    rate = cpu_rate_window(prometheus.resolution, scrape)
    progress(cpu_rate_text(prometheus.resolution, scrape, rate))
    for key, query in QUERIES.items():
        found = _range(prometheus, query.replace("$RATE", duration(rate)), start, end, SOURCE_METRIC[key], days)
        for labels, series in found:
            pod = pods.setdefault((labels.get("namespace", ""), labels.get("pod", "")),
                                  PodHistory(labels.get("namespace", ""), labels.get("pod", "")))
            pod.series[key] = series
        progress(f"read {key}: {len(found)} Pods")
    return pods


def _name_owners(prometheus: PrometheusHistory, pods: dict[tuple[str, str], PodHistory], start: float, end: float,
                 days: float) -> None:
    """Each Pod's workload, from kube-state-metrics' owner references, named as the extender names
    it: ``namespace/Kind/name``, less the namespace (a ReplicaSet's Pods under its Deployment, a
    Job's under its CronJob, where kube-state-metrics publishes those owners)."""
    owners: dict[tuple[str, str], tuple[str, str]] = {}
    for labels, _ in _range(prometheus, "max by (namespace, pod, owner_kind, owner_name) (kube_pod_owner)", start,
                            end, "kube_pod_owner", days):
        if labels.get("owner_kind") not in NO_OWNER:
            owners[(labels.get("namespace", ""), labels.get("pod", ""))] = (labels["owner_kind"],
                                                                           labels.get("owner_name", ""))
    for pod_key, workload in pod_workloads(owners, _controllers(prometheus, start, end)).items():
        if (owned := pods.get(pod_key)) is not None:
            owned.owner = workload.split("/", 1)[1]


def _add_overheads(prometheus: PrometheusHistory, pods: dict[tuple[str, str], PodHistory], start: float,
                   end: float) -> None:
    """Each Pod's RuntimeClass overhead (:data:`OVERHEAD_METRICS`), as last published."""
    for resource, metric in OVERHEAD_METRICS.items():
        for labels, (_, values) in _optional_series(prometheus, f"max by (namespace, pod) ({metric})", start, end):
            overheaded = pods.get((labels.get("namespace", ""), labels.get("pod", "")))
            if overheaded is not None and len(values) and values[-1] > 0:
                add_overhead(overheaded, resource, values[-1])


def _mark_fixed(prometheus: PrometheusHistory, pods: dict[tuple[str, str], PodHistory],
                annotated: dict[tuple[str, str], dict[str, str]], start: float, end: float, rescale_hpa: bool,
                progress: Callable[[str], None]) -> None:
    """The resources each Pod keeps as they are: those a utilization HPA scales on (unless
    ``rescale_hpa``) and those a VerticalPodAutoscaler set."""
    scaled = {} if rescale_hpa else _utilization_autoscaled(prometheus, start, end)
    for pod in pods.values():
        pod.fixed = frozenset(scaled.get((pod.namespace, pod.owner), ()))
        if VPA_UPDATES in (annotations := annotated.get((pod.namespace, pod.pod), {})):
            # Live, the webhook and the reconciler leave what a VerticalPodAutoscaler set.
            pod.fixed |= vpa_set_resources({"metadata": {"annotations": annotations}})
    if vpa_set := sum(VPA_UPDATES in annotations for annotations in annotated.values()):
        progress(f"read {VPA_UPDATES}: {vpa_set} Pods whose requests a VerticalPodAutoscaler set: kept as they are")


def _place_on_nodes(prometheus: PrometheusHistory, pods: dict[tuple[str, str], PodHistory], start: float, end: float,
                    days: float) -> None:
    """The node each Pod ran on (kube_pod_info's ``node``; the last one, for a Pod that moved)."""
    for labels, _ in _range(prometheus, "max by (namespace, pod, node) (kube_pod_info)", start, end, "kube_pod_info",
                            days):
        placed = pods.get((labels.get("namespace", ""), labels.get("pod", "")))
        if placed is not None and labels.get("node"):
            placed.node = labels["node"]


def _node_pools(prometheus: PrometheusHistory, pool_labels: tuple[str, ...], start: float,
                end: float) -> dict[str, str]:
    """node -> its pool: the value of the first of ``pool_labels`` it carries (kube_node_labels);
    a node with none, or no kube_node_labels at all, is in the pool "default"."""
    pools = {}
    for labels in _optional_labels(prometheus, "kube_node_labels", start, end):
        for label in pool_labels:
            value = labels.get(state_metrics_label("label", label))
            if value:
                pools[labels.get("node", "")] = value
                break
    return pools


def cadvisor_scrape_interval(prometheus: PrometheusHistory, at: float) -> float | None:
    """How often cAdvisor's cpu counters are scraped, in seconds (None: unknown)."""
    try:
        return prometheus.scrape_interval("cAdvisor", at)
    except HistoryUnavailable as error:
        raise PlanError(f"{error}, reading how often cAdvisor is scraped: it sets the cpu rate's window; run it "
                        "again") from None


def cpu_rate_window(step: float, scrape: float | None) -> float:
    """The window, in seconds, of the cpu rate the plan reads at each ``step``: the step itself, so
    that each sample is the average use over its own step, the 5-minute averages the live account
    and the backtest count hot time on (a longer window smooths bursts away, in the estimates and
    the hot time alike); but at least 4 scrape intervals, as ``rate()`` needs two samples in its window and four
    survive a missed scrape. Where the scrape interval is unknown, 4 steps (at least 5 minutes).

    >>> cpu_rate_window(300, 30), cpu_rate_window(300, 60), cpu_rate_window(300, 300), cpu_rate_window(60, 30)
    (300, 300, 1200, 120)
    >>> cpu_rate_window(300, None), cpu_rate_window(60, None)
    (1200, 300)
    """
    if scrape is None:
        return max(4 * step, 300)
    return max(step, 4 * scrape)


def read_cpu_peaks(prometheus: PrometheusHistory, pods: dict[tuple[str, str], PodHistory], scrape: float | None,
                   start: float, end: float, progress: Callable[[str], None]) -> None:
    """Each Pod's cpu peak in each step (:data:`CPU_PEAK`) as its ``cpu_peak`` series, in place, for
    the Pods whose use was read. The peak is the highest rate between two consecutive scrapes, so
    it needs the scrape interval (:func:`cadvisor_scrape_interval`)."""
    if scrape is None:
        raise PlanError("--peaks reads the highest rate between two scrapes of cAdvisor's cpu counters, but no "
                        "counter has two samples between an hour and half an hour ago: the scrape interval is "
                        "unknown; run the plan without --peaks")
    step = prometheus.resolution
    query = (CPU_PEAK.replace("$IRATE", duration(4 * scrape)).replace("$STEP", duration(step))
             .replace("$SCRAPE", duration(scrape)))
    read = 0
    for labels, series in _range(prometheus, query, start, end, "container_cpu_usage_seconds_total",
                                 (end - start) / 86400):
        pod = pods.get((labels.get("namespace", ""), labels.get("pod", "")))
        if pod is not None and "cpu_usage" in pod.series:
            pod.series["cpu_peak"] = series
            read += 1
    progress(f"read cpu peaks: {read} Pods, each step's highest rate between two scrapes ({scrape:.0f}s apart)"
             + (": no finer than the step, so the peaks are about the averages" if scrape * 2 > step else ""))


def cpu_rate_text(step: float, scrape: float | None, window: float) -> str:
    """The log line saying over what window the plan's cpu use is averaged, and why.

    >>> cpu_rate_text(300, 30, 300)
    'cpu use read as 5-minute averages (cAdvisor scraped every 30s)'
    >>> cpu_rate_text(300, 300, 1200)[:92]
    'cpu use read as 20-minute averages (cAdvisor scraped every 300s, and a rate needs 4 scrapes)'
    """
    said = f"cpu use read as {window / 60:g}-minute averages"
    if scrape is None:
        said += (" (no cAdvisor cpu counter has two samples between an hour and half an hour ago: the scrape "
                  "interval is unknown)")
    else:
        said += f" (cAdvisor scraped every {scrape:.0f}s" + (", and a rate needs 4 scrapes)" if window > step else ")")
    if window > 300:
        said += (", smoother than the 5-minute averages the live account counts: shorter bursts are averaged "
                 "away, in the estimates and in the hot time alike, and the plan's figures are not those live")
    return said


def trim_to_whole_days(pods: dict[tuple[str, str], PodHistory], step: float) -> None:
    """Drops, in place, the oldest samples short of a whole day, so that the days the history
    spans end with its last sample. The replay counts days from the first sample: read over
    [now - 14 days, now], a 15th day holding the one sample at ``now`` would be one of the
    holdout's three days, leaving it two whole days and one sample: a whole day moved from the
    holdout to the tuning days."""
    spans = [(times[0], times[-1]) for pod in pods.values() for times, _ in pod.series.values() if len(times)]
    if not spans:
        return
    first, last = min(s[0] for s in spans), max(s[1] for s in spans)
    whole = int((last - first + step) // 86400)
    if whole < 1:
        return
    keep_from = last - whole * 86400 + step
    for pod in pods.values():
        for key, (times, values) in list(pod.series.items()):
            if (cut := bisect_left(times, keep_from - step / 2)):
                pod.series[key] = (times[cut:], values[cut:])


def state_metrics_label(kind: str, key: str) -> str:
    """The Prometheus label kube-state-metrics gives a Kubernetes ``label`` or ``annotation``
    (``kind``) its allowlist names: every character but letters, digits and ``_`` made ``_``.

    >>> state_metrics_label("annotation", "stke.platform/original-requests")
    'annotation_stke_platform_original_requests'
    """
    return f"{kind}_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def pod_annotations(prometheus: PrometheusHistory, start: float, end: float,
                    pods: Collection[tuple[str, str]], keys: Collection[str]) -> dict[tuple[str, str], dict[str, str]]:
    """Each Pod's last value of those annotations (``keys``) that kube-state-metrics exports,
    where its allowlist names them (``--metric-annotations-allowlist=pods=[...]``, as
    ``kube_pod_annotations``): (namespace, Pod) -> annotation -> value, for the Pods of ``pods``
    that carry any. None are read where none is exported."""
    labels = {state_metrics_label("annotation", key): key for key in keys}
    carried = " or ".join(f'kube_pod_annotations{{{label}!=""}}' for label in labels)
    latest: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
    for found, (times, _) in _optional_series(prometheus, f"max by (namespace, pod, {', '.join(labels)}) ({carried})",
                                              start, end):
        pod = (found.get("namespace", ""), found.get("pod", ""))
        # An annotation whose value changed in the Pod's life stands as two series: the last one holds.
        if pod in pods and len(times) and (pod not in latest or times[-1] > latest[pod][0]):
            latest[pod] = (times[-1], {key: found[label] for label, key in labels.items() if found.get(label)})
    return {pod: values for pod, (_, values) in latest.items()}


def restore_original_requests(prometheus: PrometheusHistory, start: float, end: float,
                              pods: dict[tuple[str, str], PodHistory],
                              annotated: dict[tuple[str, str], dict[str, str]], record_key: str,
                              progress: Callable[[str], None]) -> set[tuple[str, str]]:
    """Puts back, in place, the requests each Pod right-sized by oversale was created with, read
    from its ``record_key`` annotation (the original-requests record) where kube-state-metrics
    exports it (``annotated``: :func:`pod_annotations`). Without it a cluster where oversale runs
    is planned from requests already right-sized: what they free is read as if never requested.
    The record stands for the Pod's whole life (written at admission, kept by every in-place
    resize); init containers and sidecars are told apart by ``kube_pod_init_container_info``. The
    Pods so restored; a record that cannot be read leaves the Pod's requests as running, and the
    log says how many."""
    records = {pod: annotations[record_key] for pod, annotations in annotated.items() if record_key in annotations}
    if not records:
        return set()
    init: dict[tuple[str, str], set[str]] = {}
    sidecars: dict[tuple[str, str], set[str]] = {}
    for labels in _optional_labels(prometheus, "max by (namespace, pod, container, restart_policy) "
                                               "(kube_pod_init_container_info)", start, end):
        key = (labels.get("namespace", ""), labels.get("pod", ""))
        init.setdefault(key, set()).add(labels.get("container", ""))
        if labels.get("restart_policy") == "Always":
            sidecars.setdefault(key, set()).add(labels.get("container", ""))
    restored, unreadable = set(), 0
    for key, record in records.items():
        try:
            amounts = {resource: recorded_pod_request(record, resource, init.get(key, ()), sidecars.get(key, ()))
                       for resource in RESOURCES}
        except ValueError:
            unreadable += 1
            continue
        for resource, amount in amounts.items():
            series = pods[key].series.get(f"{resource}_request")
            if amount is not None and series is not None:
                series[1][:] = array("d", [amount / 1000 if resource == CPU else float(amount)]) * len(series[1])
                restored.add(key)
    progress(f"read {record_key}: {len(restored)} Pods planned at the requests they were created with"
             + ("; 1 record unreadable, its Pod's requests taken as running" if unreadable == 1 else
                f"; {unreadable} records unreadable, their Pods' requests taken as running" if unreadable else ""))
    return restored


MACHINE_METRICS = {"cpu": "machine_cpu_cores", "memory": "machine_memory_bytes"}
"""cAdvisor's size of each node's machine (the kubelet's ``/metrics/cadvisor``): what the kubelet
reports as the node's capacity, before any webhook reshapes it."""
MACHINE_NODE_LABELS = ("node", "kubernetes_io_hostname", "instance")
"""Where scrape configurations put the node's name on the kubelet's series: ``node`` (the
Prometheus Operator's, from the endpoint's target), ``kubernetes_io_hostname`` (a node role's
labels mapped), ``instance`` (a node role's target, ``:port`` cut)."""


def real_node_sizes(sizes: dict[str, list[float]], machines: dict[str, list[float | None]],
                    capacity: dict[str, list[float | None]]) -> set[str]:
    """Takes each node whose reported capacity is more than its machine (oversold: by oversale's
    node webhook, which reports ``allocatable x ratio`` and the capacity that keeps the kubelet's
    reservation) back to its real allocatable, the machine less that reservation, in place
    (``sizes``: node -> [allocatable cores, bytes]); the nodes so taken back. A node without a
    machine or capacity series is left as reported.

    >>> sizes = {"a": [11.25, 32.0], "b": [7.5, 32.0]}
    >>> real_node_sizes(sizes, {"a": [8.0, 34.0], "b": [8.0, 34.0]}, {"a": [11.75, 34.0], "b": [8.0, 34.0]})
    {'a'}
    >>> sizes
    {'a': [7.5, 32.0], 'b': [7.5, 32.0]}
    >>> real_node_sizes({"c": [11.25, 32.0]}, {"c": [8.0, 34.0]}, {})  # no capacity series: as reported
    set()
    """
    oversold = set()
    for node, size in sizes.items():
        for index in (0, 1):
            machine = machines.get(node, [None, None])[index]
            reported = capacity.get(node, [None, None])[index]
            if machine is not None and reported is not None and reported > machine * (1 + 1e-9):
                size[index] = max(0.0, machine - (reported - size[index]))
                oversold.add(node)
    return oversold


def _machine_sizes(prometheus: PrometheusHistory, start: float, end: float, nodes: Collection[str],
                   progress: Callable[[str], None]) -> dict[str, list[float | None]]:
    """node -> [cores, bytes] of its machine (optional: none without cAdvisor's machine series or a
    label naming one of ``nodes``, which ``progress`` is told)."""
    found: dict[str, list[float | None]] = {}
    by = ", ".join(MACHINE_NODE_LABELS)
    for index, metric in enumerate(MACHINE_METRICS.values()):
        series = _optional_series(prometheus, f"max by ({by}) ({metric})", start, end)
        for labels, (_, values) in series:
            node = next((name for label in MACHINE_NODE_LABELS if (name := node_name(labels.get(label, ""))) in nodes),
                        None)
            if node is not None and len(values):
                found.setdefault(node, [None, None])[index] = values[-1]
        if series and not any(machine[index] is not None for machine in found.values()):
            names = sorted({labels.get("instance", "") for labels, _ in series})
            progress(f"{metric}: no series names a node by {', '.join(MACHINE_NODE_LABELS)} "
                     f"(instance {first_few(names, 3)}): "
                     "node sizes taken as kube-state-metrics reports them")
    return found


def _node_status(prometheus: PrometheusHistory, metric: str, start: float, end: float,
                 days: float | None = None) -> dict[str, list[float | None]]:
    """node -> [cores, bytes], the last of kube-state-metrics' ``metric`` (a Node's
    ``kube_node_status_allocatable`` or ``kube_node_status_capacity``, as it reports them):
    required with ``days`` (none is a :class:`PlanError` naming it), else optional."""
    found: dict[str, list[float | None]] = {}
    for index, resource in enumerate(("cpu", "memory")):
        query = f'max by (node) ({metric}{{resource="{resource}"}})'
        series = (_range(prometheus, query, start, end, metric, days) if days is not None
                  else _optional_series(prometheus, query, start, end))
        for labels, (_, values) in series:
            if len(values):
                found.setdefault(labels.get("node", ""), [None, None])[index] = values[-1]
    return found


def _controllers(prometheus: PrometheusHistory, start: float,
                 end: float) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(namespace, ``ReplicaSet``, name) -> (``Deployment``, name), and each Job's CronJob. Optional:
    without them a Deployment's ReplicaSets (one per rollout) replay as workloads of their own."""
    found = {}
    for kind, (metric, label) in OWNER_CONTROLLERS.items():
        for labels in _optional_labels(prometheus, controller_query(metric, label), start, end):
            if labels.get("owner_kind") not in NO_OWNER:
                found[(labels.get("namespace", ""), kind, labels.get(label, ""))] = (labels["owner_kind"],
                                                                                    labels.get("owner_name", ""))
    return found


def _utilization_autoscaled(prometheus: PrometheusHistory, start: float, end: float) -> dict[tuple[str, str], set[str]]:
    """(namespace, ``Kind/name``) -> the resources a HorizontalPodAutoscaler scales it on by
    utilization, from kube-state-metrics (optional: without it no workload is taken as scaled)."""
    resources: dict[tuple[str, str], set[str]] = {}
    for labels in _optional_labels(prometheus, "max by (namespace, horizontalpodautoscaler, metric_name) "
                                   '(kube_horizontalpodautoscaler_spec_target_metric{metric_target_type="utilization"})',
                                   start, end):
        if labels.get("metric_name") in ("cpu", "memory"):
            resources.setdefault((labels.get("namespace", ""), labels.get("horizontalpodautoscaler", "")),
                                 set()).add(labels["metric_name"])
    scaled: dict[tuple[str, str], set[str]] = {}
    for labels in _optional_labels(prometheus, "max by (namespace, horizontalpodautoscaler, scaletargetref_kind, "
                                   "scaletargetref_name) (kube_horizontalpodautoscaler_info)", start, end):
        hpa = (labels.get("namespace", ""), labels.get("horizontalpodautoscaler", ""))
        if hpa in resources:
            workload = f"{labels.get('scaletargetref_kind', '')}/{labels.get('scaletargetref_name', '')}"
            scaled.setdefault((hpa[0], workload), set()).update(resources[hpa])
    return scaled


def _optional_labels(prometheus: PrometheusHistory, query: str, start: float, end: float) -> list[dict[str, str]]:
    """The label sets of a series the plan can do without (:func:`_optional_series`)."""
    return [labels for labels, _ in _optional_series(prometheus, query, start, end)]


def _optional_series(prometheus: PrometheusHistory, query: str, start: float,
                     end: float) -> list[tuple[dict[str, str], Series]]:
    """The series the plan can do without: none where they are not exported. A query Prometheus
    does not answer (it timed out, a proxy in front of it failed) stops the plan: where exported,
    the series change the plan (pools, HPAs, node sizes, requests), and without them it would
    come out different with nothing said."""
    try:
        return prometheus.query_range(query, start, end, part_steps=_day_steps(prometheus))
    except HistoryUnavailable as error:
        raise PlanError(f"{error}, for {query}: the plan stops rather than go on without it (where exported, it "
                        "changes the plan); run it again") from None


def _day_steps(prometheus: PrometheusHistory) -> int:
    return min(RANGE_STEPS, max(1, int(86400 // prometheus.resolution)))


def _range(prometheus: PrometheusHistory, query: str, start: float, end: float, metric: str,
           days: float) -> list[tuple[dict[str, str], Series]]:
    # A day per request: what is held is each series' arrays, never a whole cluster's answer.
    found = prometheus.query_range(query, start, end, part_steps=_day_steps(prometheus))
    if not found:
        selector = prometheus.api.access.selector
        matching = f" matching {{{selector}}} (OVERSALE_PROMETHEUS_SELECTOR)" if selector else ""
        raise PlanError(f"no {metric} series{matching} in the last {days:g} days at {prometheus.api.shown}: is "
                        f"{EXPORTERS[metric]} scraped by this Prometheus?")
    return found


def write_export(history: ClusterHistory, pods: list[PodHistory], path: Path, peaks: Path | None = None) -> int:
    """The pool's history as a ``generic`` trace, the backtest's own input format (kept in the
    report folder, so the plan can be re-run offline: ``backtest --trace``); with ``peaks``, the
    same rows with each step's cpu peak for its use there (``backtest --peaks``; a step without
    a peak read keeps its average)."""
    rows = 0
    with gzip.open(path, "wt", newline="") as handle, \
            (gzip.open(peaks, "wt", newline="") if peaks else contextlib.nullcontext()) as peaks_handle:
        out = csv.writer(handle)
        out.writerow((*GENERIC_COLUMNS, FIXED_COLUMN))
        peaks_out = csv.writer(peaks_handle) if peaks_handle else None
        if peaks_out:
            peaks_out.writerow((*GENERIC_COLUMNS, FIXED_COLUMN))
        for lane, members in replica_lanes(pods):
            for pod in members:
                # One Pod's lookups at a time: the points of the whole cluster stay in arrays.
                cpu_request, memory_request, memory_usage, cpu_peak = (
                    dict(zip(*pod.series.get(key, ((), ())), strict=True))
                    for key in ("cpu_request", "memory_request", "memory_usage", "cpu_peak"))
                # Every moment it used cpu, whatever it requested: a Pod requesting no cpu (BestEffort,
                # or memory only) still loads its node.
                for t, used in sorted(zip(*pod.series.get("cpu_usage", ((), ())), strict=True)):
                    row = [lane, int(t), f"{cpu_request.get(t, 0):.6g}", f"{used:.6g}",
                           f"{memory_request.get(t, 0):.0f}", f"{memory_usage.get(t, 0):.0f}",
                           " ".join(sorted(pod.fixed))]
                    out.writerow(row)
                    if peaks_out:
                        row[3] = f"{cpu_peak.get(t, used):.6g}"
                        peaks_out.writerow(row)
                    rows += 1
    return rows


NODE_BOUND_OWNERS = ("DaemonSet/", "Node/")
"""The owners whose Pods belong to a node, not to the workloads placed on it: a DaemonSet's, and
a static Pod's mirror (kube-state-metrics names its node as its owner)."""


@dataclass
class PoolExport:
    """One node pool's history written as a generic trace for the replay (:func:`export_pools`)."""

    folder: Path
    export: Path
    peaks_export: Path | None
    allocatable: tuple[float, float]
    """A node's cores and memory bytes."""
    bound: tuple[float, float]
    """What Pods bound to their node (DaemonSets, static Pods) take of it (:func:`node_bound_share`)."""
    size: tuple[float, float]
    """The node the replay packs: ``allocatable`` less ``bound``."""
    pods: int
    oversold: int
    """Nodes of the pool oversold when the history was read (their allocatable restored)."""
    restored: int
    """Pods whose requests were read from the record annotation (compressed when read)."""


def export_pools(history: ClusterHistory, out: Path, peaks: bool, log: Callable[[str], None]) -> dict[str, PoolExport]:
    """Write each pool's Pods to ``out/POOL/history.csv.gz`` (and ``peaks.csv.gz``), each line
    said in ``log``; a pool with no known node size, or whose nodes' Pods bound to them take it
    all, is skipped with the reason. The Pods' series are cleared once written: the replay reads
    the export, and a cluster's fortnight is not held twice."""
    exports = {}
    for pool, pods in sorted(by_pool(history).items()):
        allocatable = pool_size(history, pool)
        if allocatable is None:
            log(f"pool {pool}: no node size in kube_node_status_allocatable: skipped")
            continue
        bound = node_bound_share(history, pool)
        size = (allocatable[0] - bound[0], allocatable[1] - bound[1])
        if size[0] <= 0 or size[1] <= 0:
            log(f"pool {pool}: {node_bound_text(bound)}, all of its nodes' {allocatable[0]:g} cores or "
                f"{allocatable[1] / 2**30:g} GiB: skipped")
            continue
        folder = out / pool
        folder.mkdir(parents=True, exist_ok=True)
        export = folder / "history.csv.gz"
        peaks_export = folder / "peaks.csv.gz" if peaks else None
        rows_written = write_export(history, pods, export, peaks_export)
        for pod in pods:
            pod.series.clear()
        oversold = sum(history.node_pools.get(node, "default") == pool for node in history.oversold)
        restored = sum((pod.namespace, pod.pod) in history.restored for pod in pods)
        exports[pool] = PoolExport(folder, export, peaks_export, allocatable, bound, size, len(pods), oversold,
                                   restored)
        held = f" ({node_bound_text(bound)})" if any(bound) else ""
        log(f"pool {pool}: {len(pods)} Pods, {rows_written:,} samples, nodes of {allocatable[0]:g} cores{held}"
            + (f"; {oversold_text(oversold)}" if oversold else ""))
    return exports


def by_pool(history: ClusterHistory) -> dict[str, list[PodHistory]]:
    """The Pods each node pool ran, but those bound to their node (:func:`node_bound_share`)."""
    pools: dict[str, list[PodHistory]] = {}
    for pod in history.pods.values():
        if not pod.owner.startswith(NODE_BOUND_OWNERS):
            pools.setdefault(history.node_pools.get(pod.node, "default"), []).append(pod)
    return pools


NODE_BOUND_USAGE_QUANTILE = 0.99
"""The share of its samples a node-bound Pod's use is held for, where it uses more than it requests."""


def node_bound_share(history: ClusterHistory, pool: str) -> tuple[float, float]:
    """The cores and bytes a node of ``pool`` holds for its DaemonSets' Pods and its static Pods:
    the median over the pool's nodes of what the last Pod of each (one per DaemonSet: a rollout's
    new Pod replaces the old; a static Pod keeps its name) held there, its request, or the 99th
    percentile of its use where that is more.

    A DaemonSet runs one Pod on every node it selects, however many nodes there are, and a static
    Pod runs on the node whose kubelet reads its manifest. Replayed as workloads, N of them would
    be packed onto the fewer nodes right-sizing leaves, as if the cluster kept every node's
    agents; so they are not replayed, and what they hold is taken off each node's size instead.
    Their use counts where it is more than their request: a log shipper or monitoring agent that
    requests nothing (BestEffort) still uses cores on every node, which the replay would otherwise
    never see, and a node's hot time would be read too low."""
    latest: dict[tuple[str, str], tuple[float, float, float]] = {}  # (node, its Pod) -> (at, cores, bytes)
    for pod in history.pods.values():
        if not pod.owner.startswith(NODE_BOUND_OWNERS):
            continue
        cpu_request, memory_request, cpu_usage, memory_usage = (
            pod.series.get(key) for key in ("cpu_request", "memory_request", "cpu_usage", "memory_usage"))
        seen = [times[-1] for times, _ in pod.series.values() if len(times)]
        if not seen:
            continue
        key = (pod.node, pod.namespace + "/" + (pod.owner if pod.owner.startswith("DaemonSet/") else pod.pod))
        held = (max(_last(cpu_request), _high(cpu_usage)), max(_last(memory_request), _high(memory_usage)))
        if key not in latest or max(seen) > latest[key][0]:
            latest[key] = (max(seen), *held)
    per_node = {node: [0.0, 0.0] for node in history.node_sizes if history.node_pools.get(node, "default") == pool}
    for (node, _), (_, cores, memory_bytes) in latest.items():
        if node in per_node:
            per_node[node][0] += cores
            per_node[node][1] += memory_bytes
    if not per_node:
        return 0.0, 0.0
    return statistics.median(c for c, _ in per_node.values()), statistics.median(m for _, m in per_node.values())


def _last(series: Series | None) -> float:
    return series[1][-1] if series is not None and len(series[1]) else 0.0


def _high(series: Series | None) -> float:
    """The ``NODE_BOUND_USAGE_QUANTILE`` of a series' values (0 for none)."""
    return (quantile(series[1], NODE_BOUND_USAGE_QUANTILE) if series is not None else None) or 0.0


def node_bound_text(share: tuple[float, float]) -> str:
    """The share :func:`node_bound_share` found, in words (for the log and ``plan.md``)."""
    return f"DaemonSet and static Pods hold {share[0]:.3g} cpu and {share[1] / 2**30:.3g} GiB of each node"


def oversold_text(count: int) -> str:
    """The nodes :func:`real_node_sizes` took back, in words (for the log and ``plan.md``)."""
    nodes = "1 node reported more than its machine holds" if count == 1 else \
        f"{count} nodes reported more than their machines hold"
    return f"{nodes} (oversold already): planned at the real size, the machine less the kubelet's reservation"


def pool_size(history: ClusterHistory, pool: str) -> tuple[float, float] | None:
    sizes = Counter(size for node, size in history.node_sizes.items()
                    if history.node_pools.get(node, "default") == pool and size[0] > 0 and size[1] > 0)
    return sizes.most_common(1)[0][0] if sizes else None


def per_namespace(last_day: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Requests before and after, per namespace, on the last replayed day."""
    totals: dict[str, dict[str, float]] = {}
    for name, resources in last_day["requests"].items():
        namespace = name.split("/", 1)[0]
        entry = totals.setdefault(namespace, {"cpu_requested_cores": 0.0, "cpu_set_cores": 0.0,
                                              "memory_requested_bytes": 0.0, "memory_set_bytes": 0.0})
        entry["cpu_requested_cores"] += resources["cpu"][0] / 1000
        entry["cpu_set_cores"] += resources["cpu"][1] / 1000
        entry["memory_requested_bytes"] += resources["memory"][0]
        entry["memory_set_bytes"] += resources["memory"][1]
    return totals


def ratios_set(last_day: dict[str, Any]) -> dict[str, Any]:
    """The ratios our system would set at the chosen budget: per workload (the compression ratio,
    original / set cpu request, over its lanes) and per node (oversale ratios of the last replayed
    day)."""
    totals: dict[str, list[float]] = {}
    for lane, r in last_day["requests"].items():
        total = totals.setdefault(lane.rsplit("/", 1)[0], [0.0, 0.0])
        total[0] += r["cpu"][0]
        total[1] += r["cpu"][1]
    workloads = {name: round(original / set_, 3) for name, (original, set_) in totals.items() if set_ > 0}
    nodes = [{"cpu": round(c, 3), "memory": round(m, 3)} for c, m in last_day["node_ratios"]]
    return {"workloads": workloads, "nodes": nodes}


def requests_text(oversold: int, restored: int, record_key: str) -> str:
    """What a pool's sizes and requests were taken from where oversale runs already (empty where
    nothing says it does), for ``plan.md``.

    >>> requests_text(0, 0, "stke.platform/original-requests")
    ''
    >>> requests_text(2, 0, "k/r").rsplit(": ", 1)[1]
    '`--metric-annotations-allowlist=pods=[k/r]`.'
    """
    said = [oversold_text(oversold)] if oversold else []
    if restored:
        said.append(f"{restored} Pods planned at the requests they were created with, read from their `{record_key}` "
                    "record")
    elif oversold:
        said.append("the requests are those running now, right-sized already where oversale runs; kube-state-metrics "
                    "exports the requests each Pod was created with when its allowlist names the record: "
                    f"`--metric-annotations-allowlist=pods=[{record_key}]`")
    return "; ".join(said) + "." if said else ""


def placement_curves(curves: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Our budget curve on each placement replayed (the report's first, then
    :func:`simulator.report.other_placements`), as ``plan.json`` lists them."""
    keep = ("hot_time_budget", "capacity_freed", "cpu_violation_rate")
    return [{"placement": number, "ties": "to the first node" if number == 1 else f"drawn, seed {number - 1}",
             "budget_sweep": [{k: entry[k] for k in keep} for entry in curve]}
            for number, curve in enumerate(curves, 1)]


def write_plan(out: Path, pools: dict[str, dict[str, Any]], budget: HotTimeBudget, days: float,
               source: PrometheusAPI, record_key: str) -> None:
    """The top-level report: one section per pool, linking its backtest-style report, and where
    the history was read (the URL without its credentials, and the selector if one was set).
    ``record_key``: the original-requests annotation (:func:`requests_text`)."""
    lines = ["# Plan: oversale on this cluster's own history", "",
             f"The last {days:g} days of this cluster's history (read from {source.described}), replayed through "
             "the whole system and the peers "
             "(nothing was written to the cluster). Each pool's full report (capacity freed against realised hot "
             "time for a range of budgets, the peers, plots, `summary.json`) is linked below.", ""]
    for pool, entry in pools.items():
        lines += _pool_section(pool, entry, budget, days, record_key)
    (out / "plan.md").write_text("\n".join(lines))
    (out / "plan.json").write_text(json.dumps(
        {"budget": {"cpu": budget.cpu, "memory": budget.memory}, "days": days,
         "source": {"prometheus": source.shown, "selector": source.access.selector},
         "pools": {pool: {k: v for k, v in entry.items() if k != "summary"} for pool, entry in pools.items()}},
        indent=2) + "\n")


def _pool_section(pool: str, entry: dict[str, Any], budget: HotTimeBudget, days: float,
                  record_key: str) -> list[str]:
    """One pool's section of ``plan.md``: its nodes, how much history it had, the figures at the
    chosen budget and how far they move, the budget sweep, the namespaces' requests before and
    after, the tuner's command for it and the node ratios it would set."""
    data = entry["summary"]
    lines: list[str] = []
    ours = next((row for row in data["policies"] if row["policy"] == "oversale"), None)
    held, bound = (entry["node_bound_cores"], entry["node_bound_memory_bytes"]), ""
    if any(held):
        bound = f"; {node_bound_text(held)} (not replayed: the other Pods are replayed on what they leave)"
    lines += [f"## Pool `{pool}`: {entry['pods']} Pods on nodes of {entry['node_cores']:g} cores, "
              f"{entry['node_memory_bytes'] / 2**30:g} GiB{bound}", ""]
    if entry["history_days"] < int(days):
        lines += [f"Planned on the {entry['history_days']} days of history Prometheus holds, of the {days:g} "
                  "asked (its retention, or the pool is younger).", ""]
    if text := requests_text(entry["oversold_nodes"], entry["original_requests_pods"], record_key):
        lines += [text, ""]
    at_peaks = bool(data["budget_sweep"]) and AT_PEAKS in data["budget_sweep"][0]
    # A pool of a few nodes has its hot time in a handful of events: how far it moves with one
    # event more or less is part of the figure (a one-minute shift of the 5-minute steps moved
    # the worked example's 0.1% from 0.105% to 1.444%, docs/reconcilers.md).
    ours_interval = hot_time_interval(data["daily"].get("oversale", []), None) if ours else None
    placements = data.get("placements") or []
    ours_range = placement_range(placements, budget.cpu)
    lines += [f"[Full report]({pool}/report.md). " + (
                  f"At the chosen budget ({budget.cpu:.3%}) our system frees {ours['capacity_freed']:.1%} of the "
                  f"node-days at a realised cpu hot time of {ours['cpu_violation_rate']:.3%}" + (
                      f" ({ours[AT_PEAKS]:.3%} counted at the summed peaks, an upper bound)"
                      if AT_PEAKS in ours else "")
                  + (f"; on days like these, {interval_text(ours_interval)}" if ours_interval else "")
                  + (f"; over {len(placements)} placements, {interval_text(ours_range)}" if ours_range else "")
                  + "." if ours else ""),
              "", days_like_these_note("the replayed days") + " On a few nodes it is wide: read the "
                  "figures as that interval, not to the last digit."]
    if len(placements) > 1:
        lines += ["", placements_note(len(placements), "the report's placement") + " Which workloads share a "
                      "node can move a few nodes' hot time more than the budget does; the capacity freed "
                      "moves too, less (`plan.json` lists each placement's)."]
    lines += ["", *_sweep_table(data["budget_sweep"], placements, at_peaks)]
    if said := budget_goal_text(entry["budget_goal"], "replayed days"):
        lines += ["", said]
    lines += ["", *_namespaces_table(entry["namespaces"])]
    lines += ["", "Before changing `OVERSALE_BUDGET_CALIBRATION` for this pool, choose it on this history (the "
                  "tuner cuts the holdout off, see docs/backtest.md):", "", f"    {entry['retune']}"]
    node_ratios = [n["cpu"] for n in entry["ratios"]["nodes"]]
    if node_ratios:
        lines += ["", f"Node cpu ratios it would set: {min(node_ratios):g} to {max(node_ratios):g} "
                      f"(mean {sum(node_ratios) / len(node_ratios):.2f}) over {len(node_ratios)} nodes; "
                      "per workload ratios are in `plan.json`."]
    lines.append("")
    return lines


def _sweep_table(sweep: list[dict[str, Any]], placements: list[Any], at_peaks: bool) -> list[str]:
    """The budget sweep as a table, with the range over the placements and the hot time at the
    summed peaks where the plan has them."""
    several = len(placements) > 1
    lines = ["| budget | capacity freed | realised cpu hot time | days like these |"
             + (f" over {len(placements)} placements |" if several else "")
             + (" at the summed peaks |" if at_peaks else "") + " realised memory hot time |",
             "| --- | --- | --- | --- | --- |" + (" --- |" if several else "") + (" --- |" if at_peaks else "")]
    for entry in sweep:
        spread = placement_range(placements, entry["hot_time_budget"])
        lines.append(f"| {entry['hot_time_budget']:.2%} | {entry['capacity_freed']:.1%} | "
                     f"{entry['cpu_violation_rate']:.3%} | {interval_text(entry.get('cpu_violation_interval'))} |"
                     + (f" {interval_text(spread)} |" if several else "")
                     + (f" {entry[AT_PEAKS]:.3%} |" if at_peaks else "")
                     + f" {entry['memory_violation_rate']:.3%} |")
    return lines


def _namespaces_table(namespaces: dict[str, dict[str, float]]) -> list[str]:
    """Each namespace's requests as written and as the plan would set them."""
    lines = ["| namespace | cpu requested | cpu set | memory requested | memory set |",
             "| --- | --- | --- | --- | --- |"]
    for namespace, totals in sorted(namespaces.items()):
        lines.append(f"| {namespace} | {totals['cpu_requested_cores']:.2f} | {totals['cpu_set_cores']:.2f} | "
                     f"{totals['memory_requested_bytes'] / 2**30:.2f} GiB | "
                     f"{totals['memory_set_bytes'] / 2**30:.2f} GiB |")
    return lines
