"""The extender's cluster side: watch caches feeding ClusterState, and the bind writes."""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client

from kube.background import Trouble, run_every
from kube.client import decoded, first_few, one_line
from kube.leader import LeaseElector
from kube.metrics_api import MetricsAPI, pod_usage
from kube.prometheus import (
    NO_OWNER,
    OWNER_CONTROLLERS,
    POD_OWNER,
    RATE_WINDOW_RECHECK,
    NodeNaming,
    PrometheusAPI,
    PrometheusUnavailable,
    RateWindowCheck,
    controller_query,
    duration,
    explained,
    node_expressions,
    node_name,
    pod_mean_expressions,
)
from kube.reflector import Reflector
from oversale.disruption import disruption_budget
from oversale.pods import pod_workloads
from oversale.quantity import CPU, MEMORY
from oversale.usage import Sample, stale_reason, workload_usage
from scheduler.extender import NotSent
from scheduler.state import ClusterState, PodFacts, pod_facts, scheduling_part

log = logging.getLogger(__name__)
NRT = ("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")


class ClusterWatch:
    """Nodes, Pods, PodDisruptionBudgets and (when the CRD exists) NodeResourceTopologies, watched
    into ``state``; each relist or new watch told to ``on_restart`` (see :class:`Reflector`)."""

    def __init__(self, api_client: Any, state: ClusterState, watch_timeout: int = 300,
                 on_restart: Callable[[str, str, str], None] = lambda kind, again, cause: None) -> None:
        core, policy = client.CoreV1Api(api_client), client.PolicyV1Api(api_client)
        self._uids: dict[tuple[str, str], str] = {}

        def on_pod(namespace: str, name: str, pod: PodFacts | None) -> None:
            uid = pod.uid if pod else self._uids.pop((namespace, name), "")
            if pod:
                self._uids[(namespace, name)] = uid
            if uid:
                state.set_pod(uid, pod)

        def on_pods_reset() -> None:
            self._uids.clear()
            state.reset_pods()

        # A relist resets an index and fills it again: under the state's lock throughout, or a
        # bind in between would see the Pods of a node half counted and hand out what they hold.
        self.reflectors = [
            Reflector("Node", core.list_node, _nothing, watch_timeout,
                      on_change=lambda _, name, node: state.set_node(name, node), on_reset=state.reset_nodes,
                      digest=scheduling_part, batch=state.locked, on_restart=on_restart),
            Reflector("Pod", core.list_pod_for_all_namespaces, _unbound, watch_timeout,
                      on_change=on_pod, on_reset=on_pods_reset,
                      digest=partial(pod_facts, keys=state.keys), batch=state.locked, on_restart=on_restart),
        ]
        # What a preemption's added victims are weighed by (kube-scheduler reads them for its own).
        # A preference only: the extender serves before they are in (or where it may not list
        # them, said in the log each retry), and adds victims without them meanwhile.
        self._budgets = Reflector("PodDisruptionBudget", policy.list_pod_disruption_budget_for_all_namespaces,
                                  _nothing, watch_timeout, on_change=state.set_budget, on_reset=state.reset_budgets,
                                  digest=disruption_budget, batch=state.locked, on_restart=on_restart)
        self.reflectors.append(self._budgets)
        # NFD's topology-updater publishes NUMA zones where it is installed; without its CRD,
        # topology comes from node annotations.
        self.reflectors.append(Reflector(
            "NodeResourceTopology", partial(client.CustomObjectsApi(api_client).list_cluster_custom_object, *NRT),
            _nothing, watch_timeout, on_change=lambda _, name, zones: state.set_topology(name, zones),
            on_reset=state.reset_topologies, digest=_zones, optional=True, batch=state.locked, on_restart=on_restart))
        self._pods = self.reflectors[1]

    def start(self) -> None:
        for reflector in self.reflectors:
            reflector.start()

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors if r is not self._budgets)

    def resync(self) -> None:
        """List Nodes and Pods again now: a new leader starts from what the API holds, including
        the cpusets its predecessor wrote just before it stopped."""
        for reflector in self.reflectors[:2]:
            reflector.resync()

    def cached_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod: dict[str, Any] | None = self._pods.get(namespace, name)
        return pod


def _nothing(obj: dict[str, Any]) -> None:
    """The reflector's own cache keeps nothing of a kind the state indexes (Nodes, topologies)."""
    return None


def _unbound(pod: dict[str, Any]) -> dict[str, Any] | None:
    """What the Pod cache keeps: Pods not bound yet, which bind may be asked for (the reflector
    has dropped their managedFields; a batch cluster may have thousands pending). A bound Pod
    lives on as its record in the state (what it holds on which node); its whole object (spec,
    status), kept for every Pod of the cluster, cost memory in proportion to the cluster for
    nothing (bench.extender_memory)."""
    return None if (pod.get("spec") or {}).get("nodeName") else pod


def _zones(nrt: dict[str, Any] | None) -> dict[int, int] | None:
    """NUMA zone id -> allocatable CPUs from a NodeResourceTopology (zones named ``node-<id>``)."""
    if not nrt:
        return None
    zones: dict[int, int] = {}
    for zone in nrt.get("zones") or []:
        name = str(zone.get("name", ""))
        if zone.get("type") not in (None, "Node") or not name.startswith("node-"):
            continue
        for resource in zone.get("resources") or []:
            if resource.get("name") == "cpu":
                try:
                    zones[int(name.removeprefix("node-"))] = int(str(resource.get("allocatable",
                                                                                   resource.get("capacity", 0))))
                except ValueError:
                    continue
    return zones or None


class KubeBinder:
    """The extender's reads of a Pod (:meth:`pod`) and its writes: the Binding of a Pod to its
    node, the Pod's ``resource-status`` annotation with the CPUs it was given, and the leader label
    on the extender's own Pod."""

    def __init__(self, api_client: Any, watch: ClusterWatch | None = None, timeout: float = 10.0) -> None:
        self._core: Any = client.CoreV1Api(api_client)
        self._watch = watch
        self._timeout = timeout
        self._deadline: tuple[float, float] | None = None
        """(monotonic deadline, the seconds it was set for) of :meth:`within`."""

    def within(self, seconds: float) -> KubeBinder:
        """A binder for one bind: its requests share ``seconds`` (kube-scheduler waits for the
        extender's answer only its ``httpTimeout``). Each waits at most what is left, and one with
        nothing left is not sent (:class:`NotSent`)."""
        bounded = copy.copy(self)
        bounded._deadline = (time.monotonic() + seconds, seconds)
        return bounded

    def _request_timeout(self) -> float:
        if self._deadline is None:
            return self._timeout
        deadline, seconds = self._deadline
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotSent(f"not sent: the bind's {seconds:g} s were up")
        return min(self._timeout, left)

    def pod(self, namespace: str, name: str, fresh: bool = False) -> dict[str, Any]:
        """The Pod from the watch cache (kept for Pods not bound yet), else, or when ``fresh``,
        from the API server: a GET without a resourceVersion is read from etcd by quorum."""
        cached = self._watch.cached_pod(namespace, name) if self._watch and not fresh else None
        if cached is not None:
            return cached
        response: Any = self._core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                       _request_timeout=self._request_timeout())
        return decoded(response)

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self._patch_metadata(namespace, name, {"annotations": annotations})

    def label(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        """Sets the labels given, and removes those given as None (the leader label on the
        extender's own Pod)."""
        self._patch_metadata(namespace, name, {"labels": labels})

    def _patch_metadata(self, namespace: str, name: str, metadata: dict[str, Any]) -> None:
        self._core.patch_namespaced_pod(name, namespace, {"metadata": metadata},
                                        _content_type="application/merge-patch+json", _preload_content=False,
                                        _request_timeout=self._request_timeout())

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._core.create_namespaced_binding(namespace, body, _preload_content=False,
                                             _request_timeout=self._request_timeout())


class UsagePoller:
    """Reads NodeMetrics and PodMetrics every ``interval`` seconds into ``state``.

    A failed read changes nothing: the samples already held age, and once older than the limit
    the nodes are placed by requests alone (logged when they turn, and counted), so a metrics-server
    outage never blocks scheduling. When NodeMetrics read and PodMetrics do not (on a large
    cluster the Pod list is the one that times out), the node figures still count: the Pods bound
    since the last PodMetrics read count their estimates on top until they settle, though the
    node figures may hold them already. Counting a Pod twice for a few minutes keeps a node off
    that could have taken a Pod; dropping the node figures would leave every node placed by
    requests alone once the figures held grow old.

    Each failure is logged when it starts and its end when reads succeed again, not every poll:
    an outage of an hour would otherwise be 120 lines of the same warning. The polls count it.
    """

    def __init__(self, api_client: Any, state: ClusterState, interval: float,
                 on_poll: Callable[[str, dict[str, int]], None] = lambda result, stale: None) -> None:
        self._api = MetricsAPI(api_client, timeout=min(interval, 30))
        self._state = state
        self._interval = interval
        self._on_poll = on_poll
        self._stale: dict[str, str] = {}
        self._trouble = Trouble(log, "metrics API readable again")

    def poll_once(self) -> bool:
        """One read of NodeMetrics, then of PodMetrics; True when both were read. PodMetrics
        only once NodeMetrics are read: a Pod just bound and marked as in the metrics while the
        node figures are old would be counted nowhere."""
        try:
            nodes = self._api.nodes()
        except Exception as error:  # noqa: BLE001  -- any API trouble: keep what we had
            self._trouble.failed(f"metrics API not readable ({one_line(error)}); nodes fall back to request-based "
                                 "placement as their metrics age past the limit", kind="error")
            return self._polled("error")
        self._state.record_node_samples({n.name: Sample(n.at, n.cpu, n.memory) for n in nodes})
        try:
            containers = self._api.containers()
        except Exception as error:  # noqa: BLE001  -- the node figures read still count
            self._trouble.failed(f"PodMetrics not readable ({one_line(error)}); node figures still count, and Pods "
                                 "bound since the last PodMetrics read count their estimates until they settle",
                                 kind="partial")
            return self._polled("partial")
        self._state.record_pods_in_metrics({pod: (usage[CPU], usage[MEMORY])
                                            for pod, usage in pod_usage(containers).items()},
                                           sampled_at={(c.namespace, c.pod): c.at for c in containers})
        self._trouble.succeeded()
        return self._polled("ok")

    def _polled(self, result: str) -> bool:
        self._on_poll(result, self._staleness())
        return result == "ok"

    def _staleness(self) -> dict[str, int]:
        """Count the nodes without fresh metrics by reason; say which turned stale or fresh since
        the last poll, in one line a poll: a metrics-server outage turns every node at once, and
        a line a node would be 5,000 lines twice on a large cluster."""
        names = sorted(self._state.nodes)
        counts = {"missing": 0, "old": 0}
        stale: dict[str, str] = {}
        for name, heat in zip(names, self._state.heats(names), strict=True):
            reason = stale_reason(heat.load, heat.now, self._state.load_config)
            if reason is None:
                continue
            stale[name] = reason
            counts["missing" if heat.load is None else "old"] += 1
        turned = [f"node {name}: {reason}" for name, reason in stale.items() if name not in self._stale]
        if turned:
            log.info("%s; placed by requests until fresh metrics arrive", first_few(turned))
        fresh = [f"node {name}" for name in sorted(set(self._stale) - set(stale))]
        if fresh:
            log.info("%s: fresh metrics again; load-aware placement resumes", first_few(fresh))
        self._stale = stale
        return counts

    def start(self) -> None:
        run_every(self._interval, self.poll_once, "usage-poller", log)


class _PrometheusPoller:
    """Reads Prometheus every ``interval`` seconds into the state (``_read``). A failed read changes
    nothing and is logged once until a read succeeds again: what was read last counts until it is
    ``history_max_age_seconds`` old, so a Prometheus outage never blocks scheduling."""

    name = "prometheus-poller"
    what = "history"
    meanwhile = ""
    """What counts while the reads fail (said once, when they start failing)."""

    def __init__(self, prometheus: PrometheusAPI, state: ClusterState, interval: float,
                 on_poll: Callable[[str], None] = lambda result: None) -> None:
        self._prometheus = prometheus
        self._state = state
        self._interval = interval
        self._on_poll = on_poll
        self._trouble = Trouble(log, f"{self.what} readable from Prometheus again")
        self._rate_check: tuple[str, RateWindowCheck] | None = None
        """The exporter whose cpu counters the poller rates, and the check of its rate window
        against how often they are scraped, after the first read that succeeds and then every
        ``rate_window_recheck`` seconds (a day; a subclass's argument)."""

    def _read(self, now: float) -> None:
        raise NotImplementedError

    def _explained(self, error: PrometheusUnavailable) -> str:
        return str(error)

    def poll_once(self) -> bool:
        try:
            self._read(time.time())
        except PrometheusUnavailable as error:
            # Said once until a read succeeds: Prometheus's message may differ from read to read.
            self._trouble.failed(f"{self.what} not readable from Prometheus ({self._explained(error)}); "
                                 f"{self.meanwhile}", kind="unreadable")
            self._on_poll("error")
            return False
        self._trouble.succeeded()
        self._on_poll("ok")
        if self._rate_check is not None:
            exporter, check = self._rate_check
            now = time.time()
            if check.due(exporter, now):
                with contextlib.suppress(PrometheusUnavailable):  # else checked after a later read
                    check.run(self._prometheus, exporter, now)
        return True

    def start(self) -> None:
        run_every(self._interval, self.poll_once, self.name, log)


class HistoryPeakPoller(_PrometheusPoller):
    """Each node's cpu maximum over ``LoadConfig.history_peak_seconds`` (node-exporter's series,
    or the node cpu query configured): one query a read, however many nodes."""

    name = "history-peak-poller"
    what = "node history"
    meanwhile = "the peak watermark reads the extender's own samples once the last read is too old"

    def __init__(self, prometheus: PrometheusAPI, state: ClusterState, interval: float, node_label: str,
                 rate_window: float, step: float,
                 on_poll: Callable[[str], None] = lambda result: None, cpu_query: str | None = None,
                 rate_window_recheck: float = RATE_WINDOW_RECHECK) -> None:
        super().__init__(prometheus, state, interval, on_poll)
        self._label = node_label
        self._naming = NodeNaming(node_label, "the peak watermark reads the extender's own samples")
        # A node cpu query of the user's own (a recording rule) rates nothing here.
        self._rate_check = None if cpu_query else ("node-exporter",
                                                   RateWindowCheck(rate_window, rate_window_recheck))
        self._cpu_query = cpu_query
        cpu = node_expressions(node_label, rate_window, cpu_query=cpu_query)["cpu"]
        self.query = (f"max_over_time(({cpu})[{duration(state.load_config.history_peak_seconds)}:"
                      f"{duration(step)}])")

    def _explained(self, error: PrometheusUnavailable) -> str:
        return explained(error, self.query, [("OVERSALE_PROMETHEUS_NODE_CPU_QUERY", self._cpu_query)])

    def _read(self, now: float) -> None:
        read = self._prometheus.instant(self.query, now, (self._label,))
        peaks = {node_name(key[0]): value for key, value in read.items()}
        self._state.record_history_peaks(peaks, now)
        self._naming.check(peaks, self._state.node_names())


class WorkloadHistoryPoller(_PrometheusPoller):
    """What each workload's Pods used each over ``window`` (cAdvisor's series, tied to workloads by
    kube-state-metrics' owner series): the estimate of a Pod whose workload has no Pod in PodMetrics
    now (a scale from zero, a Recreate rollout, a CronJob's next Job). Five queries a read, however
    many Pods; each Pod's mean is over the steps it ran, so a Pod that ran an hour of the day counts
    what it used in that hour."""

    name = "workload-history-poller"
    what = "workload history"
    meanwhile = ("Pods of workloads with none in the metrics are estimated by their requests once the last read "
                 "is too old")

    def __init__(self, prometheus: PrometheusAPI, state: ClusterState, interval: float, window: float,
                 rate_window: float, step: float,
                 on_poll: Callable[[str], None] = lambda result: None,
                 rate_window_recheck: float = RATE_WINDOW_RECHECK) -> None:
        super().__init__(prometheus, state, interval, on_poll)
        self.queries = {**pod_mean_expressions(window, rate_window, step),
                        "owner": POD_OWNER.replace("$WINDOW", duration(window))}
        for kind, (metric, label) in OWNER_CONTROLLERS.items():
            self.queries[kind] = controller_query(metric, label, window)
        self._said_no_owners = False
        self._rate_check = ("cAdvisor", RateWindowCheck(rate_window, rate_window_recheck))

    def _read(self, now: float) -> None:
        pod = ("namespace", "pod")
        cpu = self._prometheus.instant(self.queries["cpu"], now, pod)
        memory = self._prometheus.instant(self.queries["memory"], now, pod)
        owned = self._prometheus.instant(self.queries["owner"], now, (*pod, "owner_kind", "owner_name"))
        controllers = {}
        for kind, (_, label) in OWNER_CONTROLLERS.items():
            for (namespace, name, owner_kind, owner_name) in self._prometheus.instant(
                    self.queries[kind], now, ("namespace", label, "owner_kind", "owner_name")):
                if owner_kind not in NO_OWNER:
                    controllers[(namespace, kind, name)] = (owner_kind, owner_name)
        owners = {(namespace, name): (kind, owner) for namespace, name, kind, owner in owned if kind not in NO_OWNER}
        if cpu and not owners and not self._said_no_owners:
            log.warning("Prometheus holds container usage but no kube_pod_owner series (kube-state-metrics): "
                        "no workload is known by its history")
        self._said_no_owners = bool(cpu and not owners)
        workloads = pod_workloads(owners, controllers)
        self._state.record_workload_history(
            workload_usage((workloads[key], used, memory.get(key, 0.0)) for key, used in cpu.items()
                           if key in workloads), now)


class Leadership:
    """Active/standby over a Lease: this replica serves (binds) only while it holds the Lease, and
    only after listing Nodes and Pods again once it took it, so a CPU its predecessor handed out is
    never handed out twice. A standby keeps its watches synced meanwhile.

    Every synced replica is Ready; the leader labels its own Pod (``label(True)``) and the Service
    selects that label, so kube-scheduler reaches the leader alone. Readiness cannot say who leads:
    a Deployment whose standby never became Ready would stall every rolling update (the new Pod
    never becomes available, so the old leader is never replaced), and a PodDisruptionBudget would
    count one healthy Pod and refuse to let a drain evict the leader."""

    def __init__(self, elector: LeaseElector, watch: ClusterWatch, interval: float = 0.5,
                 label: Callable[[bool], None] | None = None) -> None:
        self._elector = elector
        self._watch = watch
        self._interval = interval
        self._label = label
        self._labelled: bool | None = None
        """What the Pod's label says (None: not known; a restarted container may find its old one)."""
        self.serving = False
        self._stopped = False
        # Tried again every check (twice a second): a label refused for an hour would be 7,200 lines.
        self._unlabelled = Trouble(log, "the leader label on this Pod is right again")

    def check(self) -> None:
        if self._stopped:
            return  # stopping: the loop must not take the label or the Lease up again
        if self._elector.is_leader():
            if not self.serving and self._watch.synced:
                self._watch.resync()
                self.serving = True
                log.info("leading: serving kube-scheduler")
        elif self.serving:
            self.serving = False
            log.warning("lost the lease: binding nothing until it is taken again")
        self._mark(self.serving)

    def leading(self) -> bool:
        """Serving, and holding the Lease by this replica's clock now, not only at the last check
        (a process paused past its Lease resumes with ``serving`` still set)."""
        return self.serving and bool(self._elector.is_leader())

    def stop(self) -> None:
        """A graceful stop: unlabelled first (the Service stops sending kube-scheduler here), then the
        Lease given back, so the standby takes over at its next round, not a Lease duration later."""
        self._stopped = True
        self.serving = False
        self._mark(False)
        self._elector.release()

    def _mark(self, leading: bool) -> None:
        if self._label is None or self._labelled == leading or (leading and self._stopped):
            return
        try:
            self._label(leading)
            self._labelled = leading
        except Exception as error:  # noqa: BLE001  -- tried again at the next round
            action = "set" if leading else "remove"
            self._unlabelled.failed(f"could not {action} the leader label on this Pod: {one_line(error)}", kind=action)
            return
        self._unlabelled.succeeded()

    def start(self) -> None:
        self._elector.start()
        run_every(self._interval, self.check, "leadership", log)
