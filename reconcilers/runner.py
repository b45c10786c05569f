"""One reconcile pass: read history once, plan every opted-in workload and node with the core's
policies, write what changed (only while leader), and report a row per object and resource."""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import Any, Protocol, TypeVar

from kubernetes.client.exceptions import ApiException

from kube.client import api_refusal, first_few, one_line
from oversale.annotations import format_ratio, wants
from oversale.budget import (
    NO_HOT_TIME,
    HotTime,
    NodeAccount,
    budget_of,
    budget_quantile,
    calibration,
    describe_hot_time,
    keep_account,
    pool_account,
    pool_of,
    read_accounts,
    read_accounts_said,
    write_accounts,
)
from oversale.estimator import Proposal, UsageStats
from oversale.limitrange import NO_BOUNDS, RequestBounds, bounds_from_limit_ranges
from oversale.node_oversale import (
    NodePlan,
    node_policy_from_annotations,
    oversell_node,
    plan_node,
    real_allocatable_of,
)
from oversale.pods import controller_of, scheduled_request
from oversale.quantity import RESOURCES, format_amount, format_measured
from oversale.resize import ResizePlan, plan_resize, vpa_controlled, workload_vpa
from oversale.settings import Settings
from oversale.timestamps import format_timestamp
from oversale.workloads import (
    PodIndex,
    WorkloadKey,
    WorkloadPlan,
    describe_change,
    plan_compression,
    usage_by_container,
    workload_hpa,
)
from reconcilers.cluster import API_FAILURES, WRITE_TRIES, Cluster, packed, unpacked
from reconcilers.history import History, HistoryUnavailable, ResourceStats
from reconcilers.metrics import ReconcilerMetrics

log = logging.getLogger(__name__)
COMPONENT = "oversale-reconciler"


_Result = TypeVar("_Result")
_Read = TypeVar("_Read")


class Leadership(Protocol):
    def is_leader(self) -> bool: ...


class NotLeader(Exception):
    """The lease was lost during the pass: no further writes."""


@dataclass(frozen=True)
class VpaListing:
    """The VerticalPodAutoscalers as one pass listed them (none when their CRD is not installed),
    or the error that stopped the list."""

    items: list[dict[str, Any]]
    error: ApiException | None = None


@dataclass
class Row:
    """One line of the pass report."""

    object: str
    resource: str
    current: str
    proposed: str
    demand: str
    reason: str
    written: bool = False


@dataclass(frozen=True)
class ResizeReads:
    """What a pass read before resizing Pods in place: which workloads' resources a VPA sets,
    each namespace's LimitRange bounds and quota room, and the running Pods of the workloads
    with ratios, (namespace, name, workload, packed Pod), in name order."""

    vpa_controlled: dict[WorkloadKey, dict[str, str]]
    bounds: dict[str, RequestBounds]
    owned: list[tuple[str, str, WorkloadKey, bytes]]


_ResizeJob = tuple[dict[str, Any], ResizePlan, Callable[[dict[str, Any]], ResizePlan]]
"""A Pod, its resize, and how to plan it again on the Pod read after a conflict."""


@dataclass(frozen=True)
class NodeReads:
    """What a pass read of its opted-in nodes before deciding their ratios: the nodes, the
    hot-time account's windows (day, week) and their usage summaries, each read or the error that
    stopped it."""

    nodes: list[dict[str, Any]]
    hot_time: list[dict[str, dict[str, HotTime]]] | HistoryUnavailable
    stats: dict[str, ResourceStats] | HistoryUnavailable


@dataclass(frozen=True)
class Overspend:
    """A back-off decided this pass, told (counted, and a Warning Event on ``node``) once an
    account that records it is written: until then the next pass decides it again."""

    scope: str
    """``node`` (its own account) or ``pool`` (recorded by any of the pool's nodes)."""
    pool: str
    resource: str
    node: dict[str, Any]
    """Where the Event goes: the node itself, or the pool's node that spent most."""
    message: str


@dataclass
class _AccountLedger:
    """One pass's hot-time accounts as they are kept, node by node, then pool by pool
    (:meth:`Reconciler._keep_accounts`)."""

    members: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Pool -> its opted-in nodes."""
    hot_time: dict[tuple[str, ...], float] = field(default_factory=dict)
    """(scope, name, resource, window) -> the share of samples hot, for the gauges."""
    totals: dict[tuple[str, ...], HotTime] = field(default_factory=dict)
    """("pool" or "cluster", name, resource, window) -> the hot time of its nodes together."""
    own: dict[str, dict[str, NodeAccount]] = field(default_factory=dict)
    """Node -> resource -> its own account, kept."""
    pooled: dict[str, dict[str, NodeAccount]] = field(default_factory=dict)
    """Pool -> resource -> its account, kept."""
    multipliers: dict[tuple[str, ...], float] = field(default_factory=dict)
    pool_budgets: dict[tuple[str, ...], float] = field(default_factory=dict)
    pool_multipliers: dict[tuple[str, ...], float] = field(default_factory=dict)
    overspends: dict[str, list[Overspend]] = field(default_factory=dict)
    """Node -> the back-offs of its own account this pass."""
    pool_overspends: dict[str, list[Overspend]] = field(default_factory=dict)


@dataclass(frozen=True)
class KeptAccount:
    multipliers: dict[str, float]
    """Resource -> the multiplier of the node's ratio target: the lower of its own account's and
    its pool's."""
    annotations: dict[str, str]
    """The account annotations that changed."""
    overspends: tuple[Overspend, ...] = ()
    """The back-offs that writing ``annotations`` to this node records."""


class Reconciler:
    """The ratio reconcilers of one replica. Each pass (:meth:`run_pass`) reads the usage history
    once and sets the ratios of every opted-in workload (compression, with its HPA's targets and
    its running Pods' in-place resize) and every opted-in node (oversale at its hot-time budget,
    with the node and pool accounts), writing only what changed and only while ``leader`` says
    this replica holds the Lease. The decisions are the core's (``oversale.estimator``,
    ``oversale.budget``, ``oversale.node_oversale``, ``oversale.workloads``): this class reads
    their inputs, calls them and writes their answers."""

    def __init__(self, cluster: Cluster, history: History, settings: Settings, leader: Leadership | None = None,
                 metrics: ReconcilerMetrics | None = None, clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.history = history
        self.settings = settings
        self.keys = settings.keys
        self.leader = leader
        self.metrics = metrics or ReconcilerMetrics()
        self.clock = clock
        self._resize_supported: bool | None = None
        self._predictions: dict[str, tuple[float, dict[str, float]]] = {}
        """node -> (when, resource -> the peak predicted for the coming period): calibration."""
        self._budget_problems: dict[str, str] = {}
        """node -> what was wrong with its budget annotation or label, told once per node and value."""
        self.incomplete: list[str] = []
        """What kept the last pass from deciding everything it was to decide (a step the API
        server stopped, a history it could not read, the Lease lost): ``once`` exits 1 on it."""

    def run_pass(self, dry_run: bool = False) -> list[Row]:
        """One pass over workloads, then nodes; a row per object and resource (``dry_run``: decide,
        write nothing). An API failure stops that half of the pass, the other still runs
        (``incomplete`` says which)."""
        rows: list[Row] = []
        self.incomplete = []
        # Before the first pass that can read it (the source checks each counter once): scrape
        # intervals are configured, not something a pass changes, so these queries are not the
        # pass's. An unavailable history is checked next pass; this one says it is unavailable.
        with contextlib.suppress(HistoryUnavailable):
            self.history.check_rate_window()
        queries_before = getattr(self.history, "queries", 0)
        # The containers' and the nodes' history reads start at once: Prometheus evaluates them in
        # parallel while the workloads are listed.
        with ThreadPoolExecutor(2, thread_name_prefix="history") as pool:
            containers = pool.submit(self.history.container_stats, self.settings.compression_window_seconds,
                                     self.settings.compression_percentile)
            nodes = pool.submit(self.read_nodes)
            try:
                rows += self._timed("compression", lambda: self.reconcile_workloads(dry_run, containers))
                rows += self._timed("oversale", lambda: self.reconcile_nodes(dry_run, nodes))
            except NotLeader:
                log.warning("lease lost during the pass: stopped writing")
                self.incomplete.append("the Lease was lost during the pass")
        self.metrics.history_queries.set(getattr(self.history, "queries", 0) - queries_before)
        self.metrics.last_pass.labels("incomplete" if self.incomplete else "complete").set_to_current_time()
        return rows

    def _timed(self, name: str, work: Callable[[], list[Row]]) -> list[Row]:
        started = time.perf_counter()
        try:
            rows = work()
        except API_FAILURES as error:
            # The API server refused, could not be reached or answered no Kubernetes object
            # mid-pass: nothing more is written this pass; what was written stands, and the next
            # pass decides again from scratch.
            why = one_line(error)
            log.warning("%s pass stopped: the API server failed (%s); retried next pass", name, why)
            self.incomplete.append(f"{name}: the API server failed ({why})")
            self.metrics.skips.labels(f"{name}-api-error").inc()
            rows = [Row("*", "*", "", "", "", f"{name}: the API server failed ({why}); retried next pass")]
        self.metrics.pass_duration.labels(name).set(time.perf_counter() - started)
        self.metrics.evaluated.labels(name).set(len({r.object for r in rows}))
        return rows

    def _write_all(self, write: Callable[..., _Result], jobs: list[tuple[Any, ...]]) -> list[_Result]:
        """Run ``write(*job)`` for every job, a few objects at a time; NotLeader stops them all."""
        if len(jobs) <= 1 or self.settings.write_concurrency <= 1:
            return [write(*job) for job in jobs]
        with ThreadPoolExecutor(self.settings.write_concurrency, thread_name_prefix="write") as pool:
            return list(pool.map(lambda job: write(*job), jobs))

    # -- compression ---------------------------------------------------------------------------
    def reconcile_workloads(self, dry_run: bool, history: Future[dict[Any, ResourceStats]] | None = None) -> list[Row]:
        """Compression: each workload that opted in (``enable-resource-compress``) gets the
        requests ratios its containers' usage calls for (``history``: their stats, read by the
        pass in parallel, else here); its HPA's targets follow, then its running Pods' resize."""
        workloads = {
            (w["kind"], w["metadata"]["namespace"], w["metadata"]["name"]): w
            for w in self.cluster.workloads()
            if wants((w.get("metadata") or {}).get("annotations") or {}, self.keys.enable_resource_compress)
        }
        if not workloads:
            self.metrics.report(self.metrics.ratio, "compression", {})
            return []
        current = {key: dict(w["metadata"].get("annotations") or {}) for key, w in workloads.items()}
        controllers = {key: controller_of(w["metadata"]) for key, w in workloads.items()}
        try:
            stats = history.result() if history else self.history.container_stats(
                self.settings.compression_window_seconds, self.settings.compression_percentile)
        except HistoryUnavailable as error:
            self.metrics.staleness.labels("containers").set(-1)
            self.metrics.skips.labels("history-unavailable").inc(len(workloads))
            self.incomplete.append(f"container history unavailable ({error})")
            rows = [Row(_name(k), "*", "", "", "", f"history unavailable, holding: {error}") for k in workloads]
            return rows + self.reconcile_resizes(dry_run, current, controllers=controllers)
        self._staleness("containers", [s.cpu for s in stats.values()])
        usage = self._usage_by_workload(workloads, stats)
        autoscalers = self._autoscalers()
        # Listed once per pass: compression and in-place resize both ask which workloads VPA sets.
        vpas = self._list_vertical_autoscalers()
        vertical = self._vertical_autoscalers(vpas)
        plans = [(workload, plan_compression(workload, usage.get(key, {}),
                                             workload_hpa(autoscalers, key, controllers[key]), self.keys,
                                             self.settings.compression_estimator(), self.settings.rescale_hpa,
                                             workload_vpa(vertical, key, controllers[key])),
                  usage.get(key, {})) for key, workload in sorted(workloads.items())]
        to_write = [job for job in plans if job[1].changes()] if not dry_run else []
        written = {job[1].key: ratios for job, ratios in zip(to_write, self._write_all(self._write_workload, to_write),
                                                             strict=True) if ratios}
        rows = []
        ratios: dict[tuple[str, ...], float] = {}
        for _, plan, _ in plans:
            if plan.hpa_targets and not dry_run:
                # The HPA follows the ratios in effect (those just written, else those carried),
                # every pass: a rescale that failed, or an HPA added later, is caught up.
                in_effect = dict(plan.current)
                for resource in RESOURCES:
                    if (text := (written.get(plan.key) or {}).get(self.keys.requests_ratio(resource))) is not None:
                        in_effect[resource] = Decimal(text)
                hpa = autoscalers.get(plan.key)
                if hpa is not None and (rescaled := plan.rescaled_targets(in_effect)):
                    self._rescale_hpa(hpa, rescaled)
            rows += self._workload_rows(plan, plan.key in written, ratios)
            # In-place resize follows the ratios just written (in a dry run: the ones proposed).
            proposed = {self.keys.requests_ratio(r): format_ratio(p.ratio) for r, p in plan.changes().items()}
            current[plan.key] |= written.get(plan.key) or (proposed if dry_run else {})
        self.metrics.report(self.metrics.ratio, "compression", ratios)
        return rows + self.reconcile_resizes(dry_run, current, vpas, controllers)

    def _usage_by_workload(self, workloads: dict[WorkloadKey, Any], stats: dict[Any, ResourceStats]
                           ) -> dict[WorkloadKey, dict[str, dict[str, UsageStats]]]:
        index = PodIndex(workloads)
        per_pod: dict[WorkloadKey, dict[str, dict[str, dict[str, UsageStats]]]] = {}
        for (namespace, pod, container), resource_stats in stats.items():
            owner = index.owner(namespace, pod)
            if owner is None:
                continue
            for resource in RESOURCES:
                per_pod.setdefault(owner, {}).setdefault(resource, {}).setdefault(pod, {})[container] = \
                    resource_stats.of(resource)
        return {key: {r: usage_by_container(pods) for r, pods in by_resource.items()}
                for key, by_resource in per_pod.items()}

    def _autoscalers(self) -> dict[WorkloadKey, dict[str, Any]]:
        found = {}
        for hpa in self.cluster.autoscalers():
            target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            found[(target.get("kind", ""), hpa["metadata"]["namespace"], target.get("name", ""))] = hpa
        return found

    def _list_vertical_autoscalers(self) -> VpaListing:
        try:
            return VpaListing(self.cluster.vertical_autoscalers() or [])
        except ApiException as error:
            return VpaListing([], error)

    def _vertical_autoscalers(self, vpas: VpaListing) -> dict[WorkloadKey, dict[str, str]]:
        """VPA target -> resource -> the VerticalPodAutoscaler that sets those requests
        (:func:`workload_vpa` reads a workload's); empty (with a warning) when they cannot be
        read: the webhook still leaves what VPA set alone."""
        if vpas.error is not None:
            log.warning("cannot list VerticalPodAutoscalers (%s): workloads they manage are not told apart "
                        "this pass", one_line(vpas.error))
        return vpa_controlled(vpas.items)

    def _write_workload(self, workload: dict[str, Any], plan: WorkloadPlan,
                        usage: dict[str, dict[str, UsageStats]]) -> dict[str, str] | None:
        """Write the plan's ratios (deciding again on a conflict); return what was written."""
        kind, namespace, name = plan.key
        for _ in range(WRITE_TRIES):
            self._require_leader()
            changes = plan.changes()
            if not changes:
                return None
            ratios = {self.keys.requests_ratio(r): format_ratio(p.ratio) for r, p in changes.items()}
            annotations = dict(ratios)
            message = describe_change(plan)
            annotations[self.keys.ratio_last_change] = f"{_now()} {message}"
            try:
                self.cluster.annotate_workload(kind, namespace, name, annotations,
                                               workload["metadata"]["resourceVersion"])
            except ApiException as error:
                if error.status != 409:
                    self.metrics.writes.labels(kind, "error").inc()
                    log.warning("%s: could not write ratios: %s", _name(plan.key), api_refusal(error))
                    return None
                self.metrics.writes.labels(kind, "conflict").inc()
                fresh = self._read_again(_name(plan.key), "ratios not written",
                                         partial(self._decide_again, plan.key, usage))
                if fresh is None:
                    return None
                workload, plan = fresh
                continue
            self.metrics.writes.labels(kind, "ok").inc()
            log.info("%s: %s", _name(plan.key), message)
            self._best_effort(self.cluster.event, workload, "CompressionRatioChanged", message, COMPONENT)
            return ratios
        log.warning("%s: ratios not written: it changed under each of %d tries (another writer of it is "
                    "busy); next pass", _name(plan.key), WRITE_TRIES)
        return None

    def _decide_again(self, key: WorkloadKey,
                      usage: dict[str, dict[str, UsageStats]]) -> tuple[dict[str, Any], WorkloadPlan]:
        """The workload as it is now, and its plan made again on it (its HPA and VPA read again too)."""
        workload = self.cluster.workload(*key)
        controller = controller_of(workload["metadata"])
        return workload, plan_compression(
            workload, usage, workload_hpa(self._autoscalers(), key, controller), self.keys,
            self.settings.compression_estimator(), self.settings.rescale_hpa,
            workload_vpa(self._vertical_autoscalers(self._list_vertical_autoscalers()), key, controller))

    def _rescale_hpa(self, hpa: dict[str, Any], targets: dict[str, tuple[int, int]]) -> None:
        """Set the HPA's utilization target of each resource in ``targets`` (resource -> (original,
        new)) and record the originals (``hpa``: as this pass listed it)."""
        namespace, name = hpa["metadata"]["namespace"], hpa["metadata"]["name"]
        metrics = copy.deepcopy(hpa["spec"]["metrics"])
        for metric in metrics:
            source = metric.get("resource") or metric.get("containerResource") or {}
            if source.get("name") in targets and (source.get("target") or {}).get("type") == "Utilization":
                source["target"]["averageUtilization"] = targets[source["name"]][1]
        originals = {self.keys.original_target_utilization_of(r): str(original) for r, (original, _) in targets.items()}
        body = {"metadata": {"annotations": originals}, "spec": {"metrics": metrics}}
        said = "; ".join(f"{r} target {new}% (the original {original}% x the requests ratio)"
                         for r, (original, new) in sorted(targets.items()))
        try:
            self.cluster.patch_autoscaler(namespace, name, body)
        except ApiException as error:
            # Retried next pass: the HPA is compared with the ratios in effect every pass.
            log.warning("HorizontalPodAutoscaler/%s/%s: could not rescale (%s); until it is, it scales the "
                        "right-sized workload out", namespace, name, api_refusal(error))
            return
        log.info("HorizontalPodAutoscaler/%s/%s: %s", namespace, name, said)
        self._best_effort(self.cluster.event, hpa, "UtilizationTargetRescaled", said, COMPONENT)

    def _workload_rows(self, plan: WorkloadPlan, written: bool, ratios: dict[tuple[str, ...], float]) -> list[Row]:
        """The table's rows of one workload; ``ratios`` gains the ratio it carries per resource."""
        rows = []
        for resource in RESOURCES:
            current = format_ratio(plan.current.get(resource, Decimal(1)))
            if resource in plan.skipped:
                code, why = plan.skipped[resource]
                self.metrics.skips.labels(code).inc()
                rows.append(Row(_name(plan.key), resource, current, current, "", f"skipped: {why}"))
                continue
            proposal = plan.proposals[resource]
            ratios[(*plan.key, resource)] = float(proposal.ratio if written else plan.current.get(resource, 1))
            rows.append(Row(_name(plan.key), resource, current, format_ratio(proposal.ratio),
                            _demand(resource, proposal.demand), proposal.reason,
                            written and resource in plan.changes()))
        return rows

    # -- in-place resize ---------------------------------------------------------------------
    def reconcile_resizes(self, dry_run: bool, ratios: dict[WorkloadKey, dict[str, str]],
                          vpas: VpaListing | None = None,
                          controllers: Mapping[WorkloadKey, tuple[str, str] | None] | None = None) -> list[Row]:
        """Bring the running Pods of these workloads (key -> annotations after this pass) to their
        ratios through ``pods/resize``, within the rate limits (``vpas``: as this pass listed them,
        else listed here; ``controllers``: each workload's own controller, for the VPAs naming it)."""
        if not self.settings.inplace_resize or not ratios:
            return []
        try:
            reads = self._read_for_resize(ratios, vpas)
        except API_FAILURES as error:
            # The ratios this pass wrote stand, and its rows are kept; the Pods follow next pass.
            why = one_line(error)
            log.warning("in-place resize skipped this pass: the API server failed (%s)", why)
            self.metrics.skips.labels("resize-api-error").inc()
            self.incomplete.append(f"in-place resize: the API server failed ({why})")
            return [Row("*", "*", "", "", "", f"in-place resize: the API server failed ({why}); retried next pass")]
        self.metrics.resize_supported.set(0 if reads is None else 1)
        if reads is None:
            if self._resize_supported is not False:
                log.warning("the API server has no pods/resize (Kubernetes before 1.33, or InPlacePodVerticalScaling "
                            "off): new ratios reach running Pods at their next rollout")
            self._resize_supported = False
            return []
        self._resize_supported = True
        rows, jobs = self._plan_resizes(reads, ratios, controllers or {})
        done = self._write_all(self._resize, jobs) if not dry_run else [False] * len(jobs)
        for (pod, plan, _), ok in zip(jobs, done, strict=True):
            namespace, name = pod["metadata"].get("namespace", ""), pod["metadata"]["name"]
            rows += [Row(f"Pod/{namespace}/{name}", c.resource, format_amount(c.resource, c.before),
                         format_amount(c.resource, c.after), "", f"in-place resize of {c.container} ({plan.ratios})",
                         ok) for c in plan.changes]
        return rows

    def _read_for_resize(self, ratios: dict[WorkloadKey, dict[str, str]],
                         vpas: VpaListing | None) -> ResizeReads | None:
        """What resizing the Pods of these workloads needs read; None when the API server has no
        ``pods/resize``."""
        supported = self.cluster.supports_resize()
        vpas = vpas or self._list_vertical_autoscalers()
        if vpas.error is not None:  # resizing a Pod VPA also resizes would start a fight
            raise vpas.error
        if not supported:
            return None
        bounds = self._namespace_bounds()
        index = PodIndex(ratios)
        # Only the Pods of these workloads are kept, packed, as the list streams by: every running
        # Pod of a large cluster parsed at once would take more than the reconciler's memory limit.
        owned = sorted(((pod["metadata"].get("namespace", ""), pod["metadata"]["name"], key, packed(pod))
                        for pod in self.cluster.running_pods()
                        if (key := index.owner(pod["metadata"].get("namespace", ""), pod["metadata"]["name"]))),
                       key=lambda found: found[:2])
        return ResizeReads(vpa_controlled(vpas.items), bounds, owned)

    def _plan_resizes(self, reads: ResizeReads, ratios: dict[WorkloadKey, dict[str, str]],
                      controllers: Mapping[WorkloadKey, tuple[str, str] | None]) -> tuple[list[Row], list[_ResizeJob]]:
        """Each owned Pod's resize, within the rate limits, and the rows of those not resized. A
        growth takes from its namespace's quota what the next Pod can no longer have."""
        limits = self.settings.resize_limits
        bounds = dict(reads.bounds)
        rows: list[Row] = []
        jobs: list[_ResizeJob] = []
        per_workload: dict[WorkloadKey, int] = {}
        noted_vpa: set[WorkloadKey] = set()
        now = self.clock()
        for namespace, name, key, data in reads.owned:
            pod = unpacked(data)
            if vpa := workload_vpa(reads.vpa_controlled, key, controllers.get(key)):
                manager = next(iter(vpa.values()))
                if key not in noted_vpa:
                    noted_vpa.add(key)
                    log.info("%s: managed by VerticalPodAutoscaler %s, its Pods are not resized in place (two "
                             "controllers resizing one Pod fight)", _name(key), manager)
                self.metrics.skips.labels("resize-vpa").inc()
                rows.append(Row(f"Pod/{namespace}/{name}", "*", "", "", "",
                                f"skipped: managed by VerticalPodAutoscaler {manager}"))
                continue
            namespace_bounds = bounds.get(namespace, NO_BOUNDS)
            plan = plan_resize(pod, ratios[key], self.keys, self.settings.compression, namespace_bounds, now, limits)
            if plan.resizes and len(jobs) >= limits.max_per_pass:
                plan = ResizePlan(skipped=f"over {limits.max_per_pass} resizes this pass; next pass",
                                  code="rate-limited")
            elif plan.resizes and per_workload.get(key, 0) >= limits.max_per_workload:
                plan = ResizePlan(skipped=f"over {limits.max_per_workload} resizes of {_name(key)} this pass; "
                                          "next pass", code="rate-limited")
            if plan.resizes or plan.record_infeasible:
                jobs.append((pod, plan, partial(
                    plan_resize, workload_annotations=ratios[key], keys=self.keys,
                    config=self.settings.compression, bounds=namespace_bounds, now=now, limits=limits)))
            if plan.resizes:
                per_workload[key] = per_workload.get(key, 0) + 1
                bounds[namespace] = namespace_bounds.after_growth(pod, plan.added)
            if plan.skipped and plan.code not in ("in-place", "not-running"):
                self.metrics.skips.labels(f"resize-{plan.code}").inc()
                rows.append(Row(f"Pod/{namespace}/{name}", "*", "", "", "", f"not resized: {plan.skipped}"))
        return rows, jobs

    def _namespace_bounds(self) -> dict[str, RequestBounds]:
        """Per namespace, the LimitRange bounds and ResourceQuota headroom a resize must keep, as
        for a new Pod (both admission plugins check resizes too)."""
        limit_ranges: dict[str, list[dict[str, Any]]] = {}
        quotas: dict[str, list[dict[str, Any]]] = {}
        for item in self.cluster.limit_ranges():
            limit_ranges.setdefault(item["metadata"].get("namespace", ""), []).append(item)
        for item in self.cluster.resource_quotas():
            quotas.setdefault(item["metadata"].get("namespace", ""), []).append(item)
        return {namespace: bounds_from_limit_ranges(limit_ranges.get(namespace, [])).with_quotas(
            quotas.get(namespace, [])) for namespace in {*limit_ranges, *quotas}}

    def _resize(self, pod: dict[str, Any], plan: ResizePlan, replan: Callable[[dict[str, Any]], ResizePlan]) -> bool:
        """Record the new requests on the Pod, then resize it; or record that the kubelet found
        the last resize Infeasible. Annotations go first: the record of a raise is what lets the
        next pass, and the webhook, tell our raise from another writer's. ``replan``: the plan
        again, for the Pod as read after a conflict."""
        self._require_leader()
        namespace, name = pod["metadata"].get("namespace", ""), pod["metadata"]["name"]
        recorded_on = self._record_resize(pod, plan, replan)
        if recorded_on is None:
            return False
        pod = recorded_on  # as read again after a conflict: its annotations are what a refusal puts back
        if plan.record_infeasible:
            # Told once, when recorded: an unrecorded answer is recorded (and told) next pass.
            self.metrics.resizes.labels("infeasible").inc()
            self._best_effort(self.cluster.event, pod, "ResizeInfeasible",
                              f"in-place resize to ratios {plan.ratios} is Infeasible on this node; not retried "
                              "until the ratios change", COMPONENT, "Warning")
            return True
        try:
            self.cluster.resize_pod(namespace, name, plan.patch)
        except ApiException as error:
            self.metrics.resizes.labels("error").inc()
            message = api_refusal(error)
            log.warning("Pod/%s/%s: resize refused: %s", namespace, name, message)
            # Put the record back as it was (keeping last-resize, so the retry waits its interval).
            previous = pod["metadata"].get("annotations") or {}
            self._best_effort(self.cluster.annotate_pod, namespace, name,
                              {k: previous.get(k) for k in plan.annotations if k != self.keys.last_resize}, "")
            self._best_effort(self.cluster.event, pod, "ResizeFailed", f"in-place resize refused: {message}",
                              COMPONENT, "Warning")
            return False
        self.metrics.resizes.labels("ok").inc()
        log.info("Pod/%s/%s: resized in place: %s", namespace, name, plan.describe())
        self._best_effort(self.cluster.event, pod, "ResizedInPlace",
                          f"requests resized in place to ratios {plan.ratios}: {plan.describe()}", COMPONENT)
        return True

    def _record_resize(self, pod: dict[str, Any], plan: ResizePlan,
                       replan: Callable[[dict[str, Any]], ResizePlan]) -> dict[str, Any] | None:
        """Write the resize's annotations (or the record of an Infeasible answer), only on the Pod
        as it was planned. A 409 is mostly the kubelet writing the Pod's status (a probe turning
        ready, a container restarting): the Pod is read again and the write retried while its plan
        is still the same. A plan that moved (a resize under way, requests another writer changed)
        waits for the next pass, as the quota room the pass took for this Pod's growth was taken
        for this plan. Returns the Pod as it was when written (None: not written, logged)."""
        namespace, name = pod["metadata"].get("namespace", ""), pod["metadata"]["name"]
        outcome = "Infeasible answer not recorded" if plan.record_infeasible else "not resized"
        for tries in range(1, WRITE_TRIES + 1):
            try:
                self.cluster.annotate_pod(namespace, name, plan.annotations, pod["metadata"]["resourceVersion"])
                return pod
            except ApiException as error:
                self.metrics.resizes.labels("conflict" if error.status == 409 else "error").inc()
                if error.status != 409:
                    log.warning("Pod/%s/%s: %s (%s), next pass", namespace, name, outcome, api_refusal(error))
                    return None
            if tries == WRITE_TRIES:
                log.warning("Pod/%s/%s: %s: it changed under each of %d tries; next pass", namespace, name, outcome,
                            WRITE_TRIES)
                return None
            uid = pod["metadata"].get("uid")
            fresh_pod = self._read_again(f"Pod/{namespace}/{name}", outcome,
                                         partial(self.cluster.pod, namespace, name))
            if fresh_pod is None:
                return None
            pod = fresh_pod
            self._require_leader()
            if pod["metadata"].get("uid") != uid:
                log.info("Pod/%s/%s: %s: another Pod has its name now", namespace, name, outcome)
                return None
            if (fresh := replan(pod)) != plan:
                log.info("Pod/%s/%s: %s: it changed since the pass read it (%s); next pass", namespace, name,
                         outcome, fresh.skipped or f"now {fresh.describe() or 'no change'}")
                return None
        return None

    # -- node oversale -----------------------------------------------------------------------
    def read_nodes(self) -> NodeReads:
        """The opted-in nodes and their history: the hot-time account's first, which needs each
        node's real allocatable from the list, then the usage summaries, which count each node's
        samples over the account's week where that is their window too (the same usage at the
        same steps: about a tenth of a pass's Prometheus time at 5,000 nodes, docs/performance.md)."""
        nodes = self.cluster.nodes(f"{self.keys.oversale_label}=enabled")
        if not nodes:
            return NodeReads([], [], {})
        config, window = self.settings.account, self.settings.history_window_seconds
        real = {n["metadata"]["name"]: {r: float(v) for r, v in real_allocatable_of(n, self.keys).items()}
                for n in nodes}
        hot_time: list[dict[str, dict[str, HotTime]]] | HistoryUnavailable
        try:
            hot_time = self.history.node_hot_time((config.short_window_seconds, config.long_window_seconds), real)
        except HistoryUnavailable as error:
            hot_time = error
        week = hot_time[1] if not isinstance(hot_time, HistoryUnavailable) and config.long_window_seconds == window \
            else None
        stats: dict[str, ResourceStats] | HistoryUnavailable
        try:
            stats = self.history.node_stats(window, self.settings.node_percentile, self.settings.memory_node_percentile,
                                            steps_counted=week)
        except HistoryUnavailable as error:
            stats = error
        return NodeReads(nodes, hot_time, stats)

    def reconcile_nodes(self, dry_run: bool, reads: Future[NodeReads] | None = None) -> list[Row]:
        """Node oversale: each opted-in node gets the ratios its usage quantile at its own hot-time
        budget allows, times its account's back-off (``reads``: its history, read by the pass in
        parallel, else here); the accounts and the calibration are kept on the way."""
        read = reads.result() if reads else self.read_nodes()
        nodes = read.nodes
        if not nodes:
            self.metrics.report(self.metrics.ratio, "oversale", {})
            self._report_accounts({}, {}, {}, {})
            return []
        requested = self._requested_per_node()
        budgets = {n["metadata"]["name"]: self._budgets(n) for n in nodes}
        stats, unavailable = self._node_stats(read, budgets)
        if stats:
            self.history.check_node_names(stats.keys(), {n["metadata"]["name"] for n in nodes} | requested.keys())
        pools = {n["metadata"]["name"]: pool_of(n["metadata"].get("labels") or {}, self.settings.pool_labels)
                 for n in nodes}
        accounts = self._keep_accounts(nodes, read.hot_time, budgets, pools) if stats else {}
        if stats:
            self._calibrate(pools, stats)
        plans = []
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            node_stats = stats.get(name)
            usage = {r: node_stats.of(r) if node_stats else None for r in RESOURCES}
            kept = accounts.get(name)
            plan = plan_node(node, requested.get(name, {}), usage, self.keys, self.settings.oversale_estimator(),
                             budgets[name], kept.multipliers if kept else None)
            if kept:
                plan.annotations = kept.annotations
            plans.append((node, plan, requested.get(name, {}), usage))
        to_write = [job for job in plans if job[1].changes() or job[1].annotations] if not dry_run else []
        written_nodes = {job[1].name for job, ok in zip(to_write, self._write_all(self._write_node, to_write),
                                                        strict=True) if ok}
        self._tell_overspends(accounts, written_nodes)
        rows = []
        ratios: dict[tuple[str, ...], float] = {}
        for _, plan, _, _ in plans:
            name, written = plan.name, plan.name in written_nodes
            for resource, proposal in plan.proposals.items():
                ratios[("Node", "", name, resource)] = float(proposal.ratio if written else plan.current[resource])
                # Said as for workloads: "not enough usage history" would send the reader to the wrong fix.
                held = unavailable and proposal.ratio == plan.current[resource]
                reason = f"history unavailable, holding: {unavailable}" if held else proposal.reason
                rows.append(Row(f"Node/{name}", resource, format_ratio(plan.current[resource]),
                                format_ratio(proposal.ratio), _demand(resource, proposal.demand), reason,
                                written and resource in plan.changes()))
        self.metrics.report(self.metrics.ratio, "oversale", ratios)
        return rows

    def _requested_per_node(self) -> dict[str, dict[str, int]]:
        """Node -> resource -> what the Pods running there request, as the scheduler counts it."""
        requested: dict[str, dict[str, int]] = {}
        for pod in self.cluster.running_pods():
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name:
                totals = requested.setdefault(node_name, {})
                for resource in RESOURCES:
                    totals[resource] = totals.get(resource, 0) + scheduled_request(pod, resource)
        return requested

    def _node_stats(self, read: NodeReads, budgets: dict[str, dict[str, float]]
                    ) -> tuple[dict[str, ResourceStats], HistoryUnavailable | None]:
        """Each opted-in node's usage over the window, its quantiles at its own budget's; none,
        with the error, where the history cannot be read (every node ratio is held)."""
        default = (self.settings.cpu_hot_time_budget, self.settings.memory_hot_time_budget)
        try:
            if isinstance(read.stats, HistoryUnavailable):
                raise read.stats
            stats = dict(read.stats)
            # Of the opted-in nodes' history only: series naming no node of theirs (a wrong
            # OVERSALE_PROMETHEUS_NODE_LABEL) hold every ratio as surely as no history at all.
            self._staleness("nodes", [stats[name].cpu for name in budgets if name in stats])
            # Nodes (pools) with their own budget need their own quantile: one more read per
            # distinct budget, not per node.
            for cpu, memory in sorted({(b["cpu"], b["memory"]) for b in budgets.values()} - {default}):
                scale = self.settings.budget_calibration
                own = self.history.node_stats(self.settings.history_window_seconds, budget_quantile(cpu, scale),
                                              budget_quantile(memory, scale), counts_from=stats)
                stats |= {name: s for name, s in own.items()
                          if (budgets.get(name, {}).get("cpu"), budgets.get(name, {}).get("memory")) == (cpu, memory)}
        except HistoryUnavailable as error:
            log.warning("node history unavailable (%s): holding every node ratio", error)
            self.incomplete.append(f"node history unavailable ({error})")
            self.metrics.staleness.labels("nodes").set(-1)
            return {}, error
        return stats, None

    def _write_node(self, node: dict[str, Any], plan: NodePlan, requested: dict[str, int],
                    usage: dict[str, UsageStats | None]) -> bool:
        for _ in range(WRITE_TRIES):
            self._require_leader()
            changes = plan.changes()
            if not changes and not plan.annotations:
                return False
            message = "; ".join(f"{r} {format_ratio(plan.current[r])} -> {format_ratio(p.ratio)}: {p.reason}"
                                for r, p in changes.items())
            annotations = {self.keys.oversale_ratio(r): format_ratio(p.ratio) for r, p in changes.items()}
            if changes:
                annotations[self.keys.ratio_last_change] = f"{_now()} {message}"
            annotations |= plan.annotations
            try:
                self.cluster.annotate_node(plan.name, annotations, node["metadata"]["resourceVersion"])
            except ApiException as error:
                if error.status != 409:
                    # 403 here is the node validating webhook refusing a cut; it says why.
                    self.metrics.writes.labels("Node", "error").inc()
                    log.warning("Node/%s: could not write ratios: %s", plan.name, api_refusal(error))
                    return False
                self.metrics.writes.labels("Node", "conflict").inc()
                fresh = self._read_again(f"Node/{plan.name}", "ratios not written",
                                         partial(self.cluster.node, plan.name))
                if fresh is None:
                    return False
                node = fresh
                kept = plan.annotations
                plan = plan_node(node, requested, usage, self.keys, self.settings.oversale_estimator(),
                                 self._budgets(node), plan.multipliers)
                plan.annotations = kept
                continue
            self.metrics.writes.labels("Node", "ok").inc()
            if not changes:
                return True
            log.info("Node/%s: %s", plan.name, message)
            self._best_effort(self.cluster.event, node, "OversaleRatioChanged", message, COMPONENT)
            if self.settings.apply_node_status:
                self._apply_at_once(plan.name)
            return True
        log.warning("Node/%s: ratios not written: it changed under each of %d tries (its kubelet, or another "
                    "writer of it, is busy); next pass", plan.name, WRITE_TRIES)
        return False

    def _apply_at_once(self, name: str) -> None:
        """Write the node status with the new ratio now: the same formula the webhook applies, from
        the webhook's record of the real values (the webhook, when installed, recomputes it)."""
        try:
            node = self.cluster.node(name)
        except ApiException as error:
            log.warning("Node/%s: new ratio not applied to its status at once: reading it failed (%s); its "
                        "kubelet's next status write applies it", name, api_refusal(error))
            return
        annotations = node["metadata"].get("annotations") or {}
        policy = node_policy_from_annotations(annotations, self.keys, self.settings.oversale_limits)
        result = oversell_node(node, node, False, policy)
        body = {"metadata": {"annotations": {k: result.annotations.get(k) for k in self.keys.node_record_keys()}},
                "status": {"allocatable": result.allocatable, "capacity": result.capacity}}
        self._best_effort(self.cluster.patch_node_status, name, body)

    # -- the hot-time account ----------------------------------------------------------------
    def _budgets(self, node: dict[str, Any]) -> dict[str, float]:
        metadata = node.get("metadata") or {}
        annotations, labels = metadata.get("annotations") or {}, metadata.get("labels") or {}
        budgets, problems = {}, []
        for resource in RESOURCES:
            budgets[resource], problem = budget_of(annotations, labels, self.keys.hot_time_budget(resource),
                                                   self.settings.budget.of(resource))
            if problem:
                problems.append(f"{problem}; {budgets[resource]:.3%} applies")
        name, told = str(metadata.get("name", "")), "; ".join(problems)
        if not told:
            self._budget_problems.pop(name, None)
        elif self._budget_problems.get(name) != told:
            log.warning("Node/%s: %s", name, told)
            self._budget_problems[name] = told
        return budgets

    def _keep_accounts(self, nodes: list[dict[str, Any]],
                       read: list[dict[str, dict[str, HotTime]]] | HistoryUnavailable,
                       budgets: dict[str, dict[str, float]], pools: dict[str, str]) -> dict[str, KeptAccount]:
        """Observed hot time per node, pool and cluster (gauges, the node's ``hot-time``
        annotation), and each node's multiplier: the lower of its own account's and its pool's,
        each after ``keep_account``. An overspend of the node, or of its pool as a whole (many
        nodes each a little hot), backs off at once, with a Warning Event saying by how much once
        the account is written (``_tell_overspends``)."""
        if isinstance(read, HistoryUnavailable):
            log.warning("hot time unavailable (%s): accounts held at their last multipliers", read)
            self.incomplete.append(f"hot time unavailable ({read})")
            return self._held_accounts(nodes, pools)
        (short, long), now = read, self.clock()
        ledger = _AccountLedger()
        for node in nodes:
            self._keep_node_account(ledger, node, pools[node["metadata"]["name"]], short, long, budgets, now)
        for pool, members in sorted(ledger.members.items()):
            self._keep_pool_account(ledger, pool, members, long, budgets, now)
        kept = {}
        for node in nodes:
            metadata = node["metadata"]
            name, annotations = metadata["name"], metadata.get("annotations") or {}
            pool = pools[name]
            own, pooled = ledger.own[name], ledger.pooled[pool]
            wanted = {self.keys.hot_time: describe_hot_time({r: long.get(name, {}).get(r, NO_HOT_TIME)
                                                             for r in RESOURCES}, budgets[name]) + " over 7d",
                      self.keys.hot_time_account: write_accounts(own),
                      self.keys.pool_hot_time_account: write_accounts(pooled)}
            kept[name] = KeptAccount({r: min(own[r].multiplier, pooled[r].multiplier) for r in RESOURCES},
                                     {k: v for k, v in wanted.items() if annotations.get(k) != v},
                                     (*ledger.overspends.get(name, ()), *ledger.pool_overspends.get(pool, ())))
        ledger.hot_time |= {key: spent.share for key, spent in ledger.totals.items()}
        self._report_accounts(ledger.hot_time, ledger.multipliers, ledger.pool_budgets, ledger.pool_multipliers)
        return kept

    def _keep_node_account(self, ledger: _AccountLedger, node: dict[str, Any], pool: str,
                           short: dict[str, dict[str, HotTime]], long: dict[str, dict[str, HotTime]],
                           budgets: dict[str, dict[str, float]], now: float) -> None:
        """One node's own account kept against its budget, its hot time added to its pool's and
        the cluster's."""
        metadata = node["metadata"]
        name = metadata["name"]
        ledger.members.setdefault(pool, []).append(node)
        accounts, unread = read_accounts_said((metadata.get("annotations") or {}).get(self.keys.hot_time_account))
        if unread:
            # Said here, where the account is written back readable: once, not every pass.
            log.warning("Node/%s: annotation %s unreadable (%s); what it held starts afresh at x1", name,
                        self.keys.hot_time_account, unread)
        ledger.own[name] = {}
        for resource in RESOURCES:
            day = short.get(name, {}).get(resource, NO_HOT_TIME)
            week = long.get(name, {}).get(resource, NO_HOT_TIME)
            for window, spent in (("1d", day), ("7d", week)):
                ledger.hot_time[("node", name, resource, window)] = spent.share
                for aggregate in (("pool", pool), ("cluster", "")):
                    key = (*aggregate, resource, window)
                    ledger.totals[key] = ledger.totals.get(key, NO_HOT_TIME) + spent
            ledger.own[name][resource], adjustment = keep_account(accounts.get(resource, NodeAccount()), day, week,
                                                                  budgets[name][resource], now, self.settings.account)
            ledger.multipliers[(name, resource)] = adjustment.multiplier
            if adjustment.backed_off:
                ledger.overspends.setdefault(name, []).append(
                    self._overspent("node", node, pool, resource, adjustment.reason))

    def _keep_pool_account(self, ledger: _AccountLedger, pool: str, members: list[dict[str, Any]],
                           long: dict[str, dict[str, HotTime]], budgets: dict[str, dict[str, float]],
                           now: float) -> None:
        """A pool's account, kept on the hot time of all its nodes (many nodes each a little hot)
        against the strictest budget among them."""
        copies = [read_accounts_said((n["metadata"].get("annotations") or {}).get(self.keys.pool_hot_time_account))
                  for n in members]
        stored = pool_account(accounts for accounts, _ in copies)
        unread = [f"Node/{n['metadata']['name']}: {said}" for n, (_, said) in zip(members, copies, strict=True) if said]
        if unread and not stored:
            # Every node carries a copy: one unreadable copy is replaced by the others, so only a
            # pool none of whose copies can be read has lost its account (said once: written back).
            log.warning("pool %s: annotation %s unreadable on every node that holds it (%s); the pool's account "
                        "starts afresh at x1", pool, self.keys.pool_hot_time_account, first_few(unread))
        ledger.pooled[pool] = {}
        for resource in RESOURCES:
            # Nodes of one pool share its budget label; where they differ, the strictest holds.
            budget = min(budgets[n["metadata"]["name"]][resource] for n in members)
            ledger.pool_budgets[(pool, resource)] = budget
            ledger.pooled[pool][resource], adjustment = keep_account(
                stored.get(resource, NodeAccount()), ledger.totals.get(("pool", pool, resource, "1d"), NO_HOT_TIME),
                ledger.totals.get(("pool", pool, resource, "7d"), NO_HOT_TIME), budget, now, self.settings.account)
            ledger.pool_multipliers[(pool, resource)] = adjustment.multiplier
            if adjustment.backed_off:
                # One Event, on the node that spent most: every node's own ratio change says
                # "account: target x..." in its OversaleRatioChanged Event already.
                hottest = max(members, key=lambda n: long.get(n["metadata"]["name"], {}).get(
                    resource, NO_HOT_TIME).hot_samples)
                ledger.pool_overspends.setdefault(pool, []).append(self._overspent(
                    "pool", hottest, pool, resource, f"pool {pool} (all {len(members)} nodes backed off): "
                                                     f"{adjustment.reason}"))

    def _held_accounts(self, nodes: list[dict[str, Any]], pools: dict[str, str]) -> dict[str, KeptAccount]:
        """Each node's multipliers as its own and its pool's accounts last recorded them, the
        accounts left as they are: a pass that cannot read the hot time (its counts are a pass's
        heaviest queries, the likeliest to time out) must not lift a back-off in force."""
        def recorded(node: dict[str, Any], key: str) -> dict[str, NodeAccount]:
            return read_accounts((node["metadata"].get("annotations") or {}).get(key))

        members: dict[str, list[dict[str, Any]]] = {}
        for node in nodes:
            members.setdefault(pools[node["metadata"]["name"]], []).append(node)
        pooled = {pool: pool_account(recorded(n, self.keys.pool_hot_time_account) for n in nodes_of_pool)
                  for pool, nodes_of_pool in members.items()}
        held = {}
        for node in nodes:
            own, pool = recorded(node, self.keys.hot_time_account), pooled[pools[node["metadata"]["name"]]]
            held[node["metadata"]["name"]] = KeptAccount(
                {r: min(own.get(r, NodeAccount()).multiplier, pool.get(r, NodeAccount()).multiplier)
                 for r in RESOURCES}, {})
        return held

    def _report_accounts(self, hot_time: dict[tuple[str, ...], float], multipliers: dict[tuple[str, ...], float],
                         pool_budgets: dict[tuple[str, ...], float],
                         pool_multipliers: dict[tuple[str, ...], float]) -> None:
        """The account's gauges for the opted-in nodes and pools of this pass, and no others."""
        self.metrics.report(self.metrics.hot_time, "account", hot_time)
        self.metrics.report(self.metrics.budget_multiplier, "account", multipliers)
        self.metrics.report(self.metrics.hot_time_budget, "account", pool_budgets)
        self.metrics.report(self.metrics.pool_multiplier, "account", pool_multipliers)

    def _overspent(self, scope: str, node: dict[str, Any], pool: str, resource: str, reason: str) -> Overspend:
        overspend = Overspend(scope, pool, resource, node, f"{resource}: {reason}")
        log.warning("Node/%s: %s overspent its hot-time budget: %s", node["metadata"]["name"],
                    "its pool" if scope == "pool" else "it", overspend.message)
        return overspend

    def _tell_overspends(self, accounts: dict[str, KeptAccount], written: set[str]) -> None:
        """Count each back-off and send its Warning Event once an account recording it is written.
        Told before, a node whose writes keep failing (the node validating webhook refusing the
        cut) would get the same Warning every pass, as each pass decides the back-off again."""
        told: set[tuple[str, str, str]] = set()
        for name in sorted(written):
            for overspend in accounts[name].overspends if name in accounts else ():
                key = (overspend.scope, overspend.pool if overspend.scope == "pool" else name, overspend.resource)
                if key in told:
                    continue  # a pool's, recorded by another of its nodes already
                told.add(key)
                self.metrics.overspends.labels(overspend.scope, overspend.pool, overspend.resource).inc()
                self._best_effort(self.cluster.event, overspend.node, "HotTimeOverspent", overspend.message,
                                  COMPONENT, "Warning")

    def _calibrate(self, pools: dict[str, str], stats: dict[str, ResourceStats]) -> None:
        """Calibration: each node's peak predicted at the last pass (its budget quantile) against
        the peak that came since, one batched read; then this pass's predictions are kept. At
        one sample per pass, a node whose usage follows its window exceeds about calibration x
        budget of them, and about the budget where the calibration's premise holds (a window
        over-states what follows by about the calibration)."""
        now = self.clock()
        if self._predictions:
            since = max(now - min(at for at, _ in self._predictions.values()), 1.0)
            try:
                peaks = self.history.node_peaks(since)
            except HistoryUnavailable as error:
                # Checked later against a longer window, these predictions would read as exceeded
                # more often than they were: they are dropped, and counted as not checked.
                checks = sum(len(predicted) for name, (_, predicted) in self._predictions.items() if name in pools)
                log.warning("node peaks unavailable (%s): %d predictions of the last pass not checked "
                            "(calibration)", error, checks)
                self.metrics.skips.labels("calibration-unavailable").inc(checks)
                peaks = {}
            for name, (_, predicted) in self._predictions.items():
                for resource, peak in predicted.items():
                    observed = peaks.get(name, {}).get(resource)
                    if observed is None or name not in pools:
                        continue
                    exceeded, total = calibration([(peak, observed)])
                    self.metrics.predictions.labels(pools[name], resource).inc(total)
                    self.metrics.predictions_exceeded.labels(pools[name], resource).inc(exceeded)
        self._predictions = {name: (now, {r: float(s.of(r).quantile) for r in RESOURCES  # type: ignore[arg-type]
                                          if s.of(r).quantile is not None})
                             for name, s in stats.items()}

    # -- helpers -----------------------------------------------------------------------------
    def _require_leader(self) -> None:
        if self.leader is not None and not self.leader.is_leader():
            raise NotLeader()

    def _staleness(self, scope: str, stats: list[UsageStats]) -> None:
        ages = [s.age_seconds for s in stats if s.age_seconds is not None]
        self.metrics.staleness.labels(scope).set(min(ages) if ages else -1)

    @staticmethod
    def _read_again(what: str, outcome: str, read: Callable[[], _Read]) -> _Read | None:
        """The object as it is now, after a 409; None, logged, when it cannot be read (deleted
        meanwhile, or the API server failing): that object waits for the next pass, and the pass
        goes on with the others."""
        try:
            return read()
        except ApiException as error:
            log.warning("%s: %s: reading it again after a conflict failed (%s); next pass", what, outcome,
                        "it was deleted" if error.status == 404 else api_refusal(error))
            return None

    @staticmethod
    def _best_effort(write: Callable[..., None], *args: Any) -> None:
        """Events and follow-up writes: worth a warning when they fail, not worth failing the pass."""
        try:
            write(*args)
        except ApiException as error:
            log.warning("side write failed: %s", api_refusal(error))


def format_table(rows: list[Row]) -> str:
    """The dry-run report: one line per object and resource."""
    header = Row("OBJECT", "RESOURCE", "CURRENT", "PROPOSED", "DEMAND", "REASON")
    table = [header, *rows]
    widths = [max(len(getattr(r, f)) for r in table) for f in ("object", "resource", "current", "proposed", "demand")]
    lines = []
    for row in table:
        cells = [getattr(row, f).ljust(w) for f, w in
                 zip(("object", "resource", "current", "proposed", "demand"), widths, strict=True)]
        lines.append("  ".join([*cells, row.reason]).rstrip())
    return "\n".join(lines)


def _name(key: WorkloadKey) -> str:
    kind, namespace, name = key
    return f"{kind}/{namespace}/{name}"


def _demand(resource: str, value: float | None) -> str:
    return "" if value is None else format_measured(resource, value)


def _now() -> str:
    return format_timestamp(time.time())


__all__ = ["Proposal", "Reconciler", "Row", "format_table"]
