"""The extender's own view of the cluster: nodes, the Pods on them and the CPUs they hold.

Pods and nodes come from watch caches; a Pod's exclusive CPUs from its ``resource-status``
annotation, so a restarted extender rebuilds every allocation from the Pods themselves. Between a
bind and the watch event that shows it, the extender's reservation counts instead, so its
accounting is right before the scheduler's cache catches up. All changes happen under one lock:
two binds on the same node cannot get the same CPU.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from kube.background import Told
from oversale.annotations import AnnotationKeys
from oversale.disruption import DisruptionBudget
from oversale.node_table import NodeTable
from oversale.placement import (
    HeldPod,
    NodeHeat,
    NodeUsage,
    NodeView,
    PodDemand,
    bound_cpus_of,
    held_usage,
    load_facts,
    node_view,
    pod_demand,
)
from oversale.pods import is_terminal
from oversale.timestamps import parse_timestamp
from oversale.usage import (
    LoadConfig,
    NodeLoad,
    Sample,
    WorkloadUsage,
    pending_usage,
    pod_estimate,
    windows,
    with_history_peak,
    workload_history,
    workload_usage,
)

log = logging.getLogger(__name__)

RESERVATION_TTL = 120.0
"""A bind that has not answered after this long gives its room back (its API call times out well
before). Once the API server took the binding, the room is held until the watch shows the Pod
bound or gone, however late: a watch lagging minutes behind on a loaded API server is how
kube-scheduler's expiring assumed Pods handed their room out twice, and why it stopped expiring
them (kubernetes#106361). Only a relist that may have missed the Pod's deletion starts this clock
again for it."""


@dataclass
class PodRecord:
    uid: str
    node: str
    demand: PodDemand
    cpus: tuple[int, ...] = ()
    namespace: str = ""
    name: str = ""
    bound_at: float | None = None
    """Wall-clock seconds of the bind (None: long ago, or unknown)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Which PodDisruptionBudgets cover it, should a preemption add it as a victim."""


@dataclass(frozen=True)
class PodFacts:
    """What the state takes from a Pod object, read from it once (``pod_facts``): a relist holds
    these for every Pod of the cluster until its last page is in, rather than the objects, tens of
    kilobytes each."""

    uid: str
    terminal: bool
    """Finished, or rejected by the kubelet at admission (TopologyAffinityError,
    UnexpectedAdmissionError: phase Failed): it holds nothing."""
    record: PodRecord | None
    """What it holds on its node, ``bound_at`` its PodScheduled time; None while not bound."""
    nominated: PodRecord | None = None
    """Not bound, but nominated to a node (``status.nominatedNodeName``: by a preemption, or for a
    binding cycle that takes time): the room it will take there."""


@dataclass
class Reservation:
    record: PodRecord
    at: float
    """When the bind began (``ClusterState.clock``)."""
    bound: bool = False
    """The API server took the binding."""
    unlisted_at: float | None = None
    """A bound one's: when a relist began that has not shown its Pod (yet)."""
    answer_lost: bool = False
    """The Binding was sent and no answer came back (a timeout, a 5xx): it may or may not have
    been taken."""
    status: str | None = None
    """The ``resource-status`` annotation that bind wrote on the Pod (None: none, or removed)."""

    def expired(self, now: float) -> bool:
        since = self.unlisted_at if self.bound else self.at
        return since is not None and now - since > RESERVATION_TTL


@dataclass
class ClusterState:
    """Everything the extender decides from, kept by its watches and pollers and read by every
    call: node views, the Pods on each node with their CPUs, reservations of binds not yet seen,
    disruption budgets, and usage samples with their windows. See the module docstring for why
    all of it changes under one lock."""

    keys: AnnotationKeys
    clock: Callable[[], float] = time.monotonic
    load_config: LoadConfig = field(default_factory=LoadConfig)
    wall: Callable[[], float] = time.time
    nodes: dict[str, NodeView] = field(default_factory=dict)
    nrt: dict[str, dict[int, int]] = field(default_factory=dict)
    _raw_nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    _pods: dict[str, PodRecord] = field(default_factory=dict)
    _by_node: dict[str, dict[str, PodRecord]] = field(default_factory=dict)
    _reserved: dict[str, Reservation] = field(default_factory=dict)
    _usage: dict[str, NodeUsage] = field(default_factory=dict)
    """Usage per node, recomputed only after something on that node changed."""
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _samples: dict[str, tuple[array[float], array[float]]] = field(default_factory=dict)
    """Per node, the last hour of (time, cpu) samples as two flat arrays: a deque of objects per
    sample would put hundreds of thousands of objects in front of every garbage collection."""
    _loads: dict[str, NodeLoad] = field(default_factory=dict)
    """Each node's windows as of its latest sample (recomputed per poll, not per call), with the
    history's cpu maximum where it is higher."""
    _own_loads: dict[str, NodeLoad] = field(default_factory=dict)
    """Each node's windows over its own samples alone."""
    _history_peaks: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per node, (cpu maximum over ``history_peak_seconds``, when it was read) from Prometheus."""
    _in_metrics: dict[tuple[str, str], float | None] = field(default_factory=dict)
    """(namespace, name) of the Pods in the last PodMetrics list -> when their reading was taken
    (None: unstated)."""
    _workloads: dict[str, WorkloadUsage] = field(default_factory=dict)
    """Per workload with a bound Pod in the last PodMetrics list, what its Pods use each: cpu as
    the mean of the polls of the last ``average_seconds`` (as the node's 5-minute average, and as
    the replay reads it), memory as of the last poll."""
    _workload_cpu: dict[str, tuple[array[float], array[float]]] = field(default_factory=dict)
    """Per such workload, (poll time, cpu per Pod) over the last ``average_seconds``."""
    _workload_history: dict[str, WorkloadUsage] = field(default_factory=dict)
    """Per workload, what its Pods used each over the workload history window (Prometheus), as of
    ``_workload_history_at``: for workloads with no Pod in the last PodMetrics list."""
    _workload_history_at: float = float("-inf")
    _nominated: dict[str, dict[str, PodRecord]] = field(default_factory=dict)
    """Per node, the Pods nominated to it (``status.nominatedNodeName``): by a preemption, waiting
    for their victims to leave, or for a binding cycle that takes time (KEP-5278)."""
    _settling: dict[str, PodRecord] = field(default_factory=dict)
    """Pods bound within the settle time: the few whose estimates may still count."""
    _pending: dict[str, dict[str, float]] | None = None
    _pending_until: float = 0.0
    _table: NodeTable = field(default_factory=NodeTable)
    """Every node's view, usage and load facts as columns (what filter and prioritize read)."""
    _dirty: set[str] = field(default_factory=set)
    """Nodes whose row is out of date: brought up to date before the table is next read."""
    _load_dirty: set[str] = field(default_factory=set)
    """Nodes whose metrics or pending estimates changed (only the load of their row is rebuilt)."""
    _table_pending: dict[str, dict[str, float]] = field(default_factory=dict)
    """The pending estimates the table's rows were built with."""
    _budgets: dict[tuple[str, str], DisruptionBudget] = field(default_factory=dict)
    """PodDisruptionBudgets by (namespace, name), for the victims a preemption adds."""
    _told: Told = field(default_factory=lambda: Told(log))
    """What was said of each node's ignored annotations."""

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self._lock:
            yield

    # -- nodes -------------------------------------------------------------------------------
    def set_node(self, name: str, node: dict[str, Any] | None) -> None:
        with self._lock:
            if node is None:
                self._drop_node(name)
                self._told.forget(f"Node/{name}")
                return
            self._changed(name)
            self._raw_nodes[name] = node
            self.nodes[name] = self._view(name, node)

    def _drop_node(self, name: str) -> None:
        self._changed(name)
        self.nodes.pop(name, None)
        self._raw_nodes.pop(name, None)

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self.nodes)

    def reset_nodes(self) -> None:
        """Before a relist of Nodes: a node deleted while the watch was away has no DELETED event,
        and the list fills in the others again (under the same lock, so none is missed between).

        What was said of each node's annotations is kept, as the list brings the same ones back:
        a relist follows every 410 Gone, and would otherwise say each ignored annotation again.
        Of a node deleted while away it is dropped at the next relist, once the node is known gone."""
        with self._lock:
            self._told.retain({f"Node/{name}" for name in self.nodes})
            for name in list(self.nodes):
                self._drop_node(name)

    def set_topology(self, name: str, zones: dict[int, int] | None) -> None:
        """NodeResourceTopology zones (id -> CPUs) of a node, or None when its object is gone."""
        with self._lock:
            if zones:
                self.nrt[name] = zones
            else:
                self.nrt.pop(name, None)
            if name in self._raw_nodes:
                self.nodes[name] = self._view(name, self._raw_nodes[name])
            self._changed(name)

    def reset_topologies(self) -> None:
        """Before a relist of NodeResourceTopologies (or once their CRD is gone): none is known."""
        with self._lock:
            for name in list(self.nrt):
                self.set_topology(name, None)

    def view_of(self, node: dict[str, Any]) -> NodeView:
        """A node sent in full (nodeCacheCapable false)."""
        return self._view(str((node.get("metadata") or {}).get("name", "")), node)

    def _view(self, name: str, node: dict[str, Any]) -> NodeView:
        """The node's view; each annotation it ignores is said once, not on every update of the
        node (the kubelet's status every 10 s or so) or every call that sends it whole, and again
        only once mended and broken anew."""
        view = node_view(node, self.keys, self.nrt.get(name), self.load_config.watermarks)
        self._told.tell(f"Node/{name}", view.problems)
        return view

    # -- pods --------------------------------------------------------------------------------
    def set_pod(self, uid: str, pod: PodFacts | None) -> None:
        """A watch event: the Pod as it is now (``pod_facts``), or None when deleted."""
        with self._lock:
            self._forget(uid)
            self._unnominate(uid)
            if pod is not None and pod.nominated is not None:
                self._nominated.setdefault(pod.nominated.node, {})[uid] = pod.nominated
            if pod is None:
                self._unreserve(uid)  # deleted before the watch ever showed it bound
                return
            if pod.record is None:
                if pod.terminal:
                    self._unreserve(uid)
                elif (reservation := self._reserved.get(uid)) is not None:
                    reservation.unlisted_at = None  # it exists: its bind shows up in the watch
                return
            reserved = self._reserved.get(uid)
            self._unreserve(uid)  # the watch shows it bound: the Pod's own record counts now
            record = replace(pod.record, bound_at=reserved.record.bound_at) if reserved else pod.record
            self._pods[uid] = record
            self._by_node.setdefault(record.node, {})[uid] = record
            self._note_settling(record)
            self._changed(record.node)

    def reset_pods(self) -> None:
        with self._lock:
            # A Pod deleted while the watch was away has no DELETED event: a bound reservation the
            # relist does not show again expires like a bind that never answered.
            now = self.clock()
            for reservation in self._reserved.values():
                if reservation.bound:
                    reservation.unlisted_at = now
            self._pods.clear()
            self._by_node.clear()
            self._nominated.clear()
            self._usage.clear()
            self._dirty |= set(self.nodes)

    def _forget(self, uid: str) -> None:
        if uid in self._settling:
            self._pending = None
        record = self._pods.pop(uid, None)
        if record is not None:
            self._by_node.get(record.node, {}).pop(uid, None)
            self._changed(record.node)

    def _unreserve(self, uid: str) -> None:
        if uid in self._settling:
            self._pending = None
        reservation = self._reserved.pop(uid, None)
        if reservation is not None:
            self._changed(reservation.record.node)

    def _unnominate(self, uid: str) -> None:
        for node in [n for n, pods in self._nominated.items() if uid in pods]:
            del self._nominated[node][uid]
            if not self._nominated[node]:
                del self._nominated[node]

    def nominations(self) -> dict[str, list[PodDemand]]:
        """Per node, the Pods nominated to it, waiting for a preemption's victims to leave or for
        their binding cycle (a snapshot; empty, and cheap, when none is).

        Since Kubernetes 1.35 (KEP-5278) kube-scheduler also nominates a Pod at the start of a
        binding cycle whose PreBind takes time, and the API server clears the nomination only at
        the bind: a Pod this extender is binding holds its room as a reservation, and is left out
        here so that it is not counted twice until the watch shows it bound."""
        if not self._nominated:  # the filter's hot path: no lock taken in the common case
            return {}
        with self._lock:
            found: dict[str, list[PodDemand]] = {}
            for node, pods in self._nominated.items():
                waiting = [record.demand for uid, record in pods.items() if uid not in self._reserved]
                if waiting:
                    found[node] = waiting
            return found

    def nominated_on(self, node: str) -> list[PodDemand]:
        return self.nominations().get(node, [])

    def is_bound(self, uid: str) -> bool:
        return uid in self._pods or uid in self._reserved

    # -- accounting --------------------------------------------------------------------------
    def _expire_reservations(self) -> None:
        if self._reserved:
            now = self.clock()
            for uid in [u for u, r in self._reserved.items() if r.expired(now)]:
                self._unreserve(uid)

    def usage(self, node: str) -> NodeUsage:
        """What the node's Pods and in-flight reservations take (cached until something changes)."""
        with self._lock:
            self._expire_reservations()
            cached = self._usage.get(node)
            if cached is not None:
                return cached
            usage = held_usage((r.demand.requests, r.cpus) for r in self._held_on(node))
            self._usage[node] = usage
            return usage

    def held_pods(self, node: str) -> list[HeldPod]:
        """The Pods a preemption on ``node`` would see: those bound there, and the binds in flight
        (which it cannot evict: kube-scheduler names victims from its own cache)."""
        with self._lock:
            self._expire_reservations()
            reserved = {r.record.uid for r in self._reserved.values()}
            return [HeldPod(r.uid, r.demand.requests, r.cpus, r.demand.priority, r.bound_at, r.uid not in reserved,
                            r.namespace, r.name, r.labels)
                    for r in self._held_on(node)]

    # -- disruption budgets --------------------------------------------------------------------
    def set_budget(self, namespace: str, name: str, budget: DisruptionBudget | None) -> None:
        """A watch event: the PodDisruptionBudget as preemption reads it, or None when it is
        deleted or covers no Pod."""
        with self._lock:
            if budget is None:
                self._budgets.pop((namespace, name), None)
            else:
                self._budgets[(namespace, name)] = budget

    def reset_budgets(self) -> None:
        with self._lock:
            self._budgets.clear()

    def budgets(self) -> list[DisruptionBudget]:
        with self._lock:
            return list(self._budgets.values())

    def _held_on(self, node: str) -> list[PodRecord]:
        records = list(self._by_node.get(node, {}).values())
        return records + [r.record for r in self._reserved.values() if r.record.node == node]

    def reserve(self, record: PodRecord) -> None:
        with self._lock:
            self._reserved[record.uid] = Reservation(record, self.clock())
            self._note_settling(record)
            self._changed(record.node)

    def release(self, uid: str) -> None:
        with self._lock:
            self._unreserve(uid)

    def lose_answer(self, uid: str, status: str | None) -> None:
        """The Binding sent for the Pod got no answer (``status``: the cpuset annotation written
        before it): its room stays held, and a retry may send the same Binding again."""
        with self._lock:
            if (reservation := self._reserved.get(uid)) is not None:
                reservation.answer_lost, reservation.status = True, status

    def lost_bind(self, uid: str) -> Reservation | None:
        """The held reservation of the Pod's earlier bind whose answer was lost, if any (one that
        has expired is not held)."""
        with self._lock:
            self._expire_reservations()
            reservation = self._reserved.get(uid)
            return reservation if reservation is not None and reservation.answer_lost else None

    def resend(self, uid: str) -> bool:
        """A retry sends the Pod's lost Binding again: its reservation is a bind in flight once
        more, timed from now. False when the reservation has expired meanwhile (its room may be
        handed out already): nothing may be sent on it."""
        with self._lock:
            self._expire_reservations()
            reservation = self._reserved.get(uid)
            if reservation is None or not reservation.answer_lost:
                return False
            reservation.at, reservation.answer_lost = self.clock(), False
            return True

    def confirm(self, uid: str) -> None:
        """The API server took the Pod's binding: its room is held until the watch shows it."""
        with self._lock:
            if (reservation := self._reserved.get(uid)) is not None:
                reservation.bound, reservation.answer_lost = True, False

    # -- real usage (metrics.k8s.io) ------------------------------------------------------------
    def _note_settling(self, record: PodRecord) -> None:
        if record.bound_at is not None and self.wall() - record.bound_at < self.load_config.settle_seconds:
            self._settling[record.uid] = record
            self._pending = None

    def record_node_samples(self, samples: Mapping[str, Sample]) -> None:
        """One poll of NodeMetrics; each node keeps the last ``peak_seconds`` of samples. Only the
        poller writes samples, so the windows are computed before taking the lock that filter
        and prioritize calls wait on."""
        horizon = self.load_config.peak_seconds
        loads: dict[str, NodeLoad] = {}
        for name, sample in samples.items():
            times, cpus = self._samples.setdefault(name, (array("d"), array("d")))
            if times and sample.at <= times[-1]:
                continue  # metrics-server has not scraped the node again
            times.append(sample.at)
            cpus.append(sample.cpu)
            old = bisect_left(times, sample.at - horizon)
            if old:
                del times[:old], cpus[:old]
            load = windows(times, cpus, (sample.memory,), self.load_config)
            if load is not None:
                loads[name] = load
        with self._lock:
            self._own_loads.update(loads)
            now = self.wall()
            self._loads.update({name: self._with_history(name, load, now) for name, load in loads.items()})
            self._load_dirty.update(loads)
            # A node deleted from the cluster whose last sample has left the window is forgotten:
            # with nodes coming and going (autoscaling, spot), their windows would pile up.
            for name in [n for n, (times, _) in self._samples.items()
                         if n not in samples and n not in self.nodes and (not times or times[-1] < now - horizon)]:
                del self._samples[name]
                self._own_loads.pop(name, None)
                self._loads.pop(name, None)
            # The rows' load is brought up to date here, on the poller's thread, not by the next
            # filter call: a poll changes every node's row at once.
            self._refresh_rows()

    def record_history_peaks(self, peaks: Mapping[str, float], at: float) -> None:
        """One read of each node's cpu maximum over the history window (Prometheus). A node not
        in the answer keeps its last maximum until that is ``history_max_age_seconds`` old."""
        with self._lock:
            now = self.wall()
            # A deleted node's maximum goes once too old to count, as its window does.
            self._history_peaks = {name: held for name, held in self._history_peaks.items()
                                   if name in self.nodes or now - held[1] <= self.load_config.history_max_age_seconds}
            self._history_peaks.update({name: (peak, at) for name, peak in peaks.items()})
            changed = {name: self._with_history(name, own, now) for name, own in self._own_loads.items()}
            changed = {name: load for name, load in changed.items() if load != self._loads.get(name)}
            self._loads.update(changed)
            self._load_dirty.update(changed)
            self._refresh_rows()

    def _with_history(self, name: str, own: NodeLoad, now: float) -> NodeLoad:
        held = self._history_peaks.get(name)
        fresh = held is not None and now - held[1] <= self.load_config.history_max_age_seconds
        return with_history_peak(own, held[0] if held and fresh else None, self.load_config)

    def record_pods_in_metrics(self, pods: Mapping[tuple[str, str], tuple[float, float]],
                               sampled_at: Mapping[tuple[str, str], float | None] | None = None) -> None:
        """One poll of PodMetrics, (namespace, name) -> (cpu millicores, memory bytes) summed over
        the Pod's containers: the Pods whose usage the node figures now include, and what each
        workload's Pods use (``estimate_for``). ``sampled_at``: when each of these readings was
        first seen (``kube.metrics_api.ContainerMetrics.at``, on the wall clock). The workloads are
        worked out before taking the lock filter and prioritize wait on: a cluster may have 100,000
        Pods."""
        with self._lock:
            bound = list(self._pods.values())
        now = self.wall()
        averaged: dict[str, WorkloadUsage] = {}
        kept: dict[str, tuple[array[float], array[float]]] = {}
        # A predecessor's reading under a Pod's name (see ``measured``) still tells what a replica
        # of its workload uses: every reading counts here.
        observed = workload_usage((record.demand.workload, *pods[key]) for record in bound
                                  if (key := (record.namespace, record.name)) in pods)
        taken: dict[tuple[str, str], float | None] = dict.fromkeys(pods)
        taken.update(sampled_at or {})
        for workload, usage in observed.items():
            # Only the poller writes these; a workload with no Pod in this poll is known no more.
            times, cpus = kept[workload] = self._workload_cpu.get(workload, (array("d"), array("d")))
            if times and now <= times[-1]:  # the wall clock stepped back: start the window over
                del times[:], cpus[:]
            times.append(now)
            cpus.append(usage.cpu)
            old = bisect_left(times, now - self.load_config.average_seconds)
            if old:
                del times[:old], cpus[:old]
            load = windows(times, cpus, (usage.memory,), self.load_config)
            averaged[workload] = WorkloadUsage(load.cpu_average, usage.memory, usage.pods) if load else usage
        self._workload_cpu = kept
        with self._lock:
            self._in_metrics = taken
            self._workloads = averaged
            self._pending = None

    def record_workload_history(self, history: Mapping[str, WorkloadUsage], at: float) -> None:
        """One read of what each workload's Pods used each over the history window (Prometheus);
        it replaces the last one, and counts until ``history_max_age_seconds`` old."""
        with self._lock:
            self._workload_history = dict(history)
            self._workload_history_at = at
            self._pending = None

    def estimate_for(self, demand: PodDemand) -> dict[str, float]:
        """What a Pod not in the metrics yet is expected to use (``pod_estimate``): what its
        workload's Pods use each where any is in the metrics, else what they used over the history
        window where Prometheus holds it (read recently enough), else its request x the factors."""
        observed = self._workloads.get(demand.workload)
        if observed is None and self.wall() - self._workload_history_at <= self.load_config.history_max_age_seconds:
            observed = workload_history(demand.workload, self._workload_history)
        return pod_estimate(demand.requests, observed, self.load_config)

    def heats(self, nodes: list[str]) -> list[NodeHeat]:
        """Each node's load windows and the estimates of its Pods not yet in the metrics."""
        now = self.wall()
        config = self.load_config
        with self._lock:
            pending = self._pending_by_node(now, config)
            loads = self._loads
            no_pending: dict[str, float] = {}
            return [NodeHeat(loads.get(node), now, pending.get(node, no_pending)) for node in nodes]

    def table(self, names: list[str]) -> tuple[NodeTable, npt.NDArray[np.int64], list[str]]:
        """The node table with every row up to date, the rows of ``names`` and the names not in it.
        Read it under ``locked()``: a watch event may change a row."""
        with self._lock:
            self._refresh_rows()
            slots, unknown = self._table.slots(names)
            return self._table, slots, unknown

    def _refresh_rows(self) -> None:
        """Rebuild the rows whose node or Pods changed, and the load of those whose metrics or
        pending estimates did (under the lock)."""
        now = self.wall()
        self._expire_reservations()
        pending = self._pending_by_node(now, self.load_config)
        if pending is not self._table_pending:
            # Only the nodes whose estimates changed: a bind changes one node's, not 5,000 rows.
            old = self._table_pending
            self._load_dirty |= {n for n in old.keys() | pending.keys() if old.get(n) != pending.get(n)}
            self._table_pending = pending
        table, loads, no_pending = self._table, self._loads, dict[str, float]()
        # Taken, not iterated in place: counting a node's usage may expire a reservation and mark
        # another node, which the next refresh then takes.
        dirty, self._dirty = self._dirty, set()
        load_dirty, self._load_dirty = self._load_dirty - dirty, set()
        for name in dirty:
            view = self.nodes.get(name)
            if view is None:
                table.remove(name)
            else:
                table.put(name, view, self.usage(name),
                          load_facts(view, NodeHeat(loads.get(name), now, pending.get(name, no_pending))))
        for name in load_dirty:
            view = self.nodes.get(name)
            if view is not None:  # metrics of a node not (yet) in the watch have no row
                table.put_load(name, load_facts(view, NodeHeat(loads.get(name), now, pending.get(name, no_pending))))

    def table_of(self, nodes: list[tuple[str, NodeView]]) -> tuple[NodeTable, npt.NDArray[np.int64]]:
        """A table of nodes sent in full (``nodeCacheCapable`` false): their own views, whose
        labels may carry other watermarks than the cached ones, with the cached usage and load."""
        now = self.wall()
        table = NodeTable()
        with self._lock:
            pending = self._pending_by_node(now, self.load_config)
            for name, view in nodes:
                table.put(name, view, self.usage(name),
                          load_facts(view, NodeHeat(self._loads.get(name), now, pending.get(name, {}))))
        return table, table.slots([name for name, _ in nodes])[0]

    def _changed(self, node: str) -> None:
        """Something on ``node`` changed: its usage is counted again and its row rebuilt."""
        self._usage.pop(node, None)
        self._dirty.add(node)

    def _pending_by_node(self, now: float, config: LoadConfig) -> dict[str, dict[str, float]]:
        """Summed estimates per node of the settling Pods not yet in PodMetrics (cached until a
        Pod changes, PodMetrics are read again, or the first of them settles)."""
        if self._pending is not None and now < self._pending_until:
            return self._pending
        by_node: dict[str, list[PodRecord]] = {}
        until = float("inf")
        for uid, record in list(self._settling.items()):
            assert record.bound_at is not None
            settles = record.bound_at + config.settle_seconds
            if now >= settles or not self.is_bound(uid):
                del self._settling[uid]
            elif not measured(record, self._in_metrics):
                by_node.setdefault(record.node, []).append(record)
                until = min(until, settles)
        self._pending = {node: pending_usage(self.estimate_for(r.demand) for r in records)
                         for node, records in by_node.items()}
        self._pending_until = until
        return self._pending


def measured(record: PodRecord, in_metrics: Mapping[tuple[str, str], float | None]) -> bool:
    """Whether PodMetrics (``in_metrics``: (namespace, name) -> when each reading was first seen,
    None if unstamped) hold a reading of this Pod: one first seen since its bind. metrics-server
    pairs readings with Pods by namespace and name, so a Pod made again under its old name (a
    StatefulSet's, after an eviction) is served its predecessor's last reading until the next
    scrape (every 15 to 60 s): that reading is not of this Pod, and the node's figures do not
    include it yet. First seen, not stamped: the stamp is the node's clock, which may be off."""
    key = (record.namespace, record.name)
    if key not in in_metrics:
        return False
    sampled = in_metrics[key]
    return sampled is None or record.bound_at is None or sampled >= record.bound_at


def scheduling_part(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the state keeps of a watched Node: its name, labels and annotations (ratios, real
    allocatable, topology, watermarks, reservations) and its allocatable and capacity, all
    ``node_view`` reads. A Node's status is mostly images, conditions and volumes (10 of a real
    GKE Node's 12.6 KB), which the extender never reads.

    >>> scheduling_part({"metadata": {"name": "n", "uid": "u"}, "status": {"images": [], "capacity": {"cpu": "4"}}})
    {'metadata': {'name': 'n'}, 'status': {'capacity': {'cpu': '4'}}}
    """
    metadata, status = node.get("metadata") or {}, node.get("status") or {}
    return {"metadata": {k: metadata[k] for k in ("name", "labels", "annotations") if k in metadata},
            "status": {k: status[k] for k in ("allocatable", "capacity") if k in status}}


def pod_facts(pod: Mapping[str, Any], keys: AnnotationKeys) -> PodFacts:
    metadata = pod.get("metadata") or {}
    uid = str(metadata.get("uid", ""))
    node = (pod.get("spec") or {}).get("nodeName")
    terminal = is_terminal(pod)
    if not node or terminal:
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if terminal or not nominated or not isinstance(nominated, str):
            return PodFacts(uid, terminal, None)
        return PodFacts(uid, False, None, PodRecord(uid, nominated, pod_demand(pod, keys), (),
                                                    str(metadata.get("namespace", "")), str(metadata.get("name", ""))))
    return PodFacts(uid, False, PodRecord(uid, str(node), pod_demand(pod, keys), bound_cpus_of(pod, keys),
                                          str(metadata.get("namespace", "")), str(metadata.get("name", "")),
                                          _scheduled_at(pod), _labels(metadata.get("labels"))))


def _labels(labels: Any) -> Mapping[str, str]:
    """A Pod's labels as held for every bound Pod of the cluster: the Pods of one workload share
    their keys and most values, so each string is kept once (``sys.intern``), not once a Pod."""
    if not isinstance(labels, Mapping) or not labels:
        return _NO_LABELS
    return {sys.intern(str(key)): sys.intern(str(value)) for key, value in labels.items()}


_NO_LABELS: Mapping[str, str] = MappingProxyType({})


def _scheduled_at(pod: Mapping[str, Any]) -> float | None:
    """When the Pod was bound: its ``PodScheduled`` condition's transition time."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return parse_timestamp(condition.get("lastTransitionTime"))
    return None


def resource_status(cpuset: str, numa_nodes: tuple[int, ...]) -> str:
    """The annotation written on a bound Pod: its CPUs, and its NUMA node, or nodes when they span
    several.

    >>> resource_status("0-3", (0,)), resource_status("0-1,8-9", (0, 1))
    ('{"cpuset":"0-3","numaNode":0}', '{"cpuset":"0-1,8-9","numaNode":[0,1]}')
    """
    status: dict[str, Any] = {"cpuset": cpuset}
    status["numaNode"] = numa_nodes[0] if len(numa_nodes) == 1 else list(numa_nodes)
    return json.dumps(status, separators=(",", ":"))
