"""The remediator: moves Pods off oversold nodes that stay hot (policy in ``oversale.remediation``).

Each pass is one observation of every node: NodeMetrics and PodMetrics (metrics.k8s.io, the usage
view the extender reads too), the nodes and the running Pods. A node hot for
``OVERSALE_HOT_OBSERVATIONS`` passes in a row gets a plan; each move first reserves room on the
target node (an annotation the extender honours: only the evicted Pod's replacement may take it
until it expires), then asks the Eviction API, so PodDisruptionBudgets hold; a 429 is "not now"
and the reservation is released. Streaks live in memory: a restarted remediator observes K passes
again before acting, which errs on the safe side. Cooldowns are also recorded on the node evicted
from, so the replica that takes the Lease over keeps them.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from kube.background import Told, Trouble
from kube.client import api_refusal, one_line
from kube.metrics_api import MetricsAPI, NodeMetrics, pod_usage
from oversale.node_fit import (
    CsiVolume,
    HostPort,
    Neighbours,
    VolumeAffinity,
    attached_volumes,
    claim_names,
    csi_volume,
    free_resources,
    host_ports,
    other_requests,
    placed_pod,
    replacement,
    volume_affinity,
    volume_limits,
)
from oversale.placement import (
    NodeHeat,
    NodeUsage,
    NodeView,
    PodDemand,
    bound_cpus_of,
    held_reservations,
    hold,
    node_view,
    pod_demand,
    with_nominated,
)
from oversale.pods import controller_of, scheduled_request
from oversale.quantity import RESOURCES, format_amount
from oversale.remediation import (
    HOT_TAINT_EFFECT,
    Candidate,
    Cooldowns,
    Move,
    Target,
    candidate,
    cooldowns_text,
    eviction_exclusion,
    excess,
    hot_reason,
    hot_taint_expired,
    next_streak,
    plan_moves,
    read_cooldowns,
    runtime_watermarks_for,
    serving_replica_of,
    with_hot_taint,
)
from oversale.settings import Settings
from oversale.timestamps import format_timestamp, parse_timestamp
from oversale.usage import Sample, node_load
from reconcilers.cluster import WRITE_TRIES, Cluster, annotations_patch, packed, unpacked
from reconcilers.metrics import ReconcilerMetrics
from reconcilers.runner import COMPONENT, Leadership, NotLeader, Row

log = logging.getLogger(__name__)


class UsageSource(Protocol):
    def nodes(self) -> list[Any]: ...

    def containers(self) -> list[Any]: ...


class Remediator:
    """Remediation of one replica. Each pass (:meth:`run_pass`) observes the usage of every node it
    judges (the opted-in ones, or all with ``OVERSALE_REMEDIATE_ALL_NODES``) and moves Pods off a
    node hot for ``OVERSALE_HOT_OBSERVATIONS`` passes in a row: by eviction, so disruption budgets hold,
    toward targets where their replacements fit, with room held for them there, the node tainted
    for its cooldown (``OVERSALE_HOT_NODE_TAINT``) and Events written. Which Pods and which
    targets is the core's (``oversale.remediation``, ``oversale.node_fit``); writes happen only
    while ``leader`` says this replica holds the Lease."""

    def __init__(self, cluster: Cluster, usage: UsageSource | MetricsAPI, settings: Settings,
                 leader: Leadership | None = None, metrics: ReconcilerMetrics | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.usage = usage
        self.settings = settings
        self.keys = settings.keys
        self.config = settings.remediation_config
        self.leader = leader
        self.metrics = metrics or ReconcilerMetrics()
        self.clock = clock
        self.streaks: dict[str, int] = {}
        """node -> its passes in a row above its runtime watermark."""
        self.node_cooldown: dict[str, float] = {}
        """node -> until when no Pod is moved off it again (also recorded on the node)."""
        self.workload_cooldown: dict[str, float] = {}
        """workload -> until when none of its Pods is moved again (also recorded on the node it left)."""
        self.samples: dict[str, deque[Sample]] = {}
        self.incomplete: list[str] = []
        """What kept the last pass from judging every node (usage or the cluster unreadable, the
        Lease lost): ``remediate`` exits 1 on it rather than report no hot node."""
        self._told = Told(log)
        """What was said of each node's unreadable runtime watermarks (passes run every minute)."""
        self._blind = Trouble(log, "remediation reads usage and the cluster again")
        """Said when passes start observing nothing and when they observe again: ``run`` passes
        every minute, and a metrics-server outage of an hour would be 60 lines of one warning."""

    def run_pass(self, dry_run: bool = False, tidy: bool | None = None) -> list[Row]:
        """Observe every node once; move Pods off those hot long enough. Returns the report rows.

        ``tidy`` (default: not ``dry_run``) removes hot-node taints whose time is up: the running
        loop tidies even with remediation off, so switching it off leaves no taint behind."""
        now = self.clock()
        self.incomplete = []
        try:
            seen = self._observe()
        except Exception as error:  # noqa: BLE001  -- any API trouble: this pass observes nothing
            # No usage, no evictions: a metrics outage must never move Pods.
            why = one_line(error)
            self._blind.failed(f"remediation pass skipped: cannot read usage or the cluster ({why})", kind="blind")
            self.metrics.skips.labels("remediation-no-usage").inc()
            self.incomplete.append(f"cannot read usage or the cluster ({why})")
            # As for a node without fresh metrics: no observation, no utilization reported (the
            # last one would hold an alert on a node nobody sees); OversaleRemediatorBlind tells.
            self.metrics.report(self.metrics.node_utilization, "remediator", {})
            self.metrics.hot_nodes.set(0)
            return []
        self._blind.succeeded()
        self.metrics.last_observation.set_to_current_time()
        nodes = seen.nodes
        self._forget({n["metadata"]["name"] for n in nodes}, now)
        outdated = self._recall_cooldowns(nodes, now)
        views = {n["metadata"]["name"]: node_view(n, self.keys, watermarks=self.settings.load.watermarks)
                 for n in nodes}
        fresh = {name: m for name, m in seen.node_metrics.items()
                 if name in views and now - m.at <= self.settings.metrics_max_age_seconds}
        targets = self._targets(seen, views, self._heats(fresh, now))
        leading = self.leader is None or self.leader.is_leader()
        if not dry_run and leading:
            self._drop_spent_reservations(views, seen.by_node, now)
        if tidy is None:
            tidy = not dry_run
        if tidy and leading:
            for node in nodes:
                if hot_taint_expired((node.get("spec") or {}).get("taints") or (), self.keys.hot_taint, now):
                    self._set_hot_taint(node["metadata"]["name"], None)
            for name in outdated:
                self._record_cooldowns(name, Cooldowns(), now)
        state = _Pass(seen, views, targets, dry_run, now, self.config.max_per_pass)
        try:
            for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
                if self._in_scope(node):
                    self._remediate_node(node, fresh.get(node["metadata"]["name"]), state)
        except NotLeader:
            log.warning("lease lost during the remediation pass: stopped evicting")
            self.incomplete.append("the Lease was lost during the pass")
        # Only nodes observed now: a node deleted, or without fresh metrics, has no utilization.
        self.metrics.report(self.metrics.node_utilization, "remediator", state.utilization)
        self.metrics.hot_nodes.set(state.hot_nodes)
        return state.rows

    def _observe(self) -> _Observed:
        """Usage, nodes and every running Pod, held for the pass packed (reconcilers.cluster.packed),
        with what each node's Pods hold (requests, cpusets, other resources, host ports) and each
        controller's Ready Pods summed as the list streams by."""
        seen = _Observed({m.name: m for m in self.usage.nodes()}, pod_usage(self.usage.containers()),
                         self.cluster.nodes(""))
        for pod in self.cluster.running_pods():
            if (serving := serving_replica_of(pod)) is not None:
                seen.ready[serving] = seen.ready.get(serving, 0) + 1
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name:
                seen.by_node.setdefault(node_name, []).append(packed(pod))
                # As the extender holds it: a Pod's exclusive CPUs are charged at the node's
                # ratio (cpus x ratio), and a cpuset-seeking Pod needs real cores free.
                hold(seen.held.setdefault(node_name, NodeUsage()), {r: scheduled_request(pod, r) for r in RESOURCES},
                     bound_cpus_of(pod, self.keys))
            # A Pod nominated to a node (by a preemption, or since Kubernetes 1.35 for a binding
            # cycle that takes time) will take its room there, and kube-scheduler keeps that room
            # for it: a replacement sent there could find it taken.
            holder = node_name or (pod.get("status") or {}).get("nominatedNodeName")
            if holder and isinstance(holder, str):
                if not node_name:
                    seen.nominated.setdefault(holder, []).append(pod_demand(pod, self.keys))
                taken = seen.others.setdefault(holder, {})
                for resource, amount in other_requests(pod).items():
                    taken[resource] = taken.get(resource, 0) + amount
                seen.ports.setdefault(holder, set()).update(host_ports(pod))
        return seen

    def _heats(self, fresh: dict[str, NodeMetrics], now: float) -> dict[str, NodeHeat]:
        """Each fresh reading added to its node's samples (older than the longest window dropped),
        then the extender's windows over them (5-minute average, 1-hour maximum): a target must
        stay under its scheduling watermarks by both."""
        load_config = self.settings.load
        for name, m in fresh.items():
            window = self.samples.setdefault(name, deque())
            if not window or window[-1].at < m.at:
                window.append(Sample(m.at, m.cpu, m.memory))
            while window and window[0].at <= m.at - load_config.peak_seconds:
                window.popleft()
        return {name: NodeHeat(node_load(list(self.samples[name]), load_config), now) for name in fresh}

    def _targets(self, seen: _Observed, views: dict[str, NodeView], heats: dict[str, NodeHeat]) -> dict[str, Target]:
        """Every node a Pod could move to, as this pass leaves it: a move takes its room before the
        next hot node plans, so two hot nodes never both count on the same free room.
        kube-scheduler will hold the replacement to the Pod's nodeSelector, node affinity,
        tolerations and volumes: a target its labels or taints rule out is no target."""
        targets: dict[str, Target] = {}
        for node in filter(_schedulable, seen.nodes):
            name = node["metadata"]["name"]
            held = seen.held.get(name, NodeUsage())
            # Nominated Pods keep their room as the extender keeps it (``with_nominated``).
            requested = with_nominated(views[name], held, seen.nominated[name]) if name in seen.nominated else held
            targets[name] = Target(views[name], requested, heats.get(name), node["metadata"].get("labels") or {},
                                   tuple((node.get("spec") or {}).get("taints") or ()),
                                   free_resources((node.get("status") or {}).get("allocatable") or {},
                                                  seen.others.get(name, {})),
                                   frozenset(seen.ports.get(name, ())))
        return targets

    def _remediate_node(self, node: dict[str, Any], reading: NodeMetrics | None, state: _Pass) -> None:
        """Observe one node (its utilization, its hot streak) and, once it has been hot long
        enough and no cooldown or eviction budget stops it, plan the moves that cool it and carry
        them out (unless a dry run)."""
        over, why = self._observe_node(node, reading, state)
        if over and self._may_move_off(node["metadata"]["name"], why, state):
            self._move_off(node, over, why, state)

    def _observe_node(self, node: dict[str, Any], reading: NodeMetrics | None, state: _Pass
                      ) -> tuple[dict[str, float], str]:
        """A node's utilization (for the gauges), its hot streak carried on, and what is above its
        runtime watermarks (by resource, and said in words), if anything."""
        name, metadata = node["metadata"]["name"], node["metadata"]
        watermarks, problems = runtime_watermarks_for(metadata.get("labels"), metadata.get("annotations"),
                                                      self.keys, self.config.watermarks)
        self._told.tell(f"Node/{name}", problems)
        real = state.views[name].real
        observed = {"cpu": float(reading.cpu), "memory": float(reading.memory)} if reading else {}
        for resource, used in observed.items():
            if real.get(resource):
                state.utilization[(name, resource)] = used / real[resource]
        over = excess(observed, real, watermarks) if reading else {}
        # A node without fresh metrics is not observed: its streak starts over.
        self.streaks[name] = next_streak(self.streaks.get(name, 0), bool(over))
        if self.streaks[name] >= self.config.observations:
            state.hot_nodes += 1
        return over, (hot_reason(observed, real, watermarks) or "") if over else ""

    def _may_move_off(self, name: str, why: str, state: _Pass) -> bool:
        """Whether a hot node's Pods may be moved this pass: hot long enough, not cooling down
        after an eviction, within the pass's evictions; a row saying why not otherwise."""
        object_name, now, streak = f"Node/{name}", state.now, self.streaks[name]
        if streak < self.config.observations:
            state.rows.append(Row(object_name, "*", "", "", "", f"hot {streak}/{self.config.observations}: {why}"))
            return False
        if self.node_cooldown.get(name, 0) > now:
            state.rows.append(Row(object_name, "*", "", "", "", f"hot, cooling down after an eviction "
                                  f"({self.node_cooldown[name] - now:.0f}s left): {why}"))
            return False
        if state.evictions_left <= 0:
            state.rows.append(Row(object_name, "*", "", "", "", f"hot, over {self.config.max_per_pass} evictions "
                                  "this pass: next pass"))
            return False
        return True

    def _move_off(self, node: dict[str, Any], over: dict[str, float], why: str, state: _Pass) -> None:
        """Plan the moves that cool a hot node and carry them out (unless a dry run)."""
        name, now = node["metadata"]["name"], state.now
        candidates = self._candidates(name, state)
        if state.neighbours is None:
            # Every running Pod as inter-Pod affinity reads it, once a pass, and only once a
            # node has something to plan.
            seen = state.seen
            labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in seen.nodes}
            state.neighbours = Neighbours(labels,
                                          [placed_pod(unpacked(p)) for pods in seen.by_node.values() for p in pods],
                                          self._namespace_labels())
        room = {c.namespace: self.config.max_per_namespace - state.per_namespace.get(c.namespace, 0)
                for c in candidates}
        plan = plan_moves(over, candidates, [t for other, t in state.targets.items() if other != name],
                          self.settings.load, min(self.config.max_per_node, state.evictions_left), state.neighbours,
                          room)
        for kept, reason in plan.kept:
            state.rows.append(Row(f"Pod/{kept.name}", "*", name, "", "", f"not moved: {reason}"))
        if not plan.moves:
            state.rows.append(Row(f"Node/{name}", "*", "", "", "", f"hot: {why}; nothing can move "
                                  f"({len(candidates)} candidates)"))
            return
        for move in plan.moves:
            done = False if state.dry_run else self._move(node, move, now)
            state.rows.append(Row(f"Pod/{move.pod.name}", "*", name, move.target, "",
                                  f"evict from hot {name} ({why}); {move.reason}", done))
            if state.dry_run or done:
                state.targets[move.target] = state.targets[move.target].taking(move.pod)
                state.neighbours.place(replacement(move.pod.constraints, move.target))
                state.evictions_left -= 1
                state.per_namespace[move.pod.namespace] = state.per_namespace.get(move.pod.namespace, 0) + 1
            if done:
                self.node_cooldown[name] = now + self.config.node_cooldown_seconds
                self.workload_cooldown[move.pod.workload] = now + self.config.workload_cooldown_seconds
                self.streaks[name] = 0
                self._record_cooldowns(name, Cooldowns(self.node_cooldown[name], {
                    move.pod.workload: self.workload_cooldown[move.pod.workload]}), now)

    def _candidates(self, name: str, state: _Pass) -> list[Candidate]:
        """The Pods on a hot node that may move, each with its usage, volumes and workload; every
        other Pod gets a row saying why it stays."""
        candidates = []
        now = state.now
        for pod in map(unpacked, state.seen.by_node.get(name, [])):
            pod_name = f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}"
            owner = controller_of(pod["metadata"])
            replicas = state.seen.ready.get((pod["metadata"].get("namespace", ""), *owner), 0) if owner else None
            excluded = eviction_exclusion(pod, self.keys, now, self.config.min_pod_age_seconds, replicas,
                                          self.config.min_replicas)
            usage = state.seen.usage_of.get((pod["metadata"].get("namespace", ""), pod["metadata"]["name"]))
            if excluded is None and usage is None:
                excluded = "no PodMetrics (its usage is unknown)"
            volumes: tuple[VolumeAffinity, ...] = ()
            attachable: tuple[CsiVolume, ...] = ()
            if excluded is None:
                try:
                    volumes, attachable = self._volumes(pod)
                except Exception as error:  # noqa: BLE001  -- any API trouble: the Pod stays
                    excluded = f"its volumes could not be read ({one_line(error)})"
            if excluded is None and attachable and state.volume_room is None:
                state.volume_room = self._volume_room(state.targets)
            if excluded is None and attachable and state.volume_room is False:
                excluded = "the CSI volume limits of other nodes could not be read this pass"
            if excluded is None:
                found = candidate(pod, pod_demand(pod, self.keys), usage or {}, volumes, attachable)
                if self.workload_cooldown.get(found.workload, 0) > now:
                    excluded = f"workload {found.workload} moved recently (cooling down)"
                elif state.per_namespace.get(found.namespace, 0) >= self.config.max_per_namespace:
                    excluded = f"over {self.config.max_per_namespace} evictions in {found.namespace} this pass"
                else:
                    candidates.append(found)
                    continue
            # A row too: `remediate --dry-run` is where an operator asks why a hot node's
            # Pods stay (the long-running loop drops the rows, and logs this at debug).
            log.debug("Node/%s: %s kept: %s", name, pod_name, excluded)
            state.rows.append(Row(f"Pod/{pod_name}", "*", name, "", "", f"kept: {excluded}"))
        return candidates

    def _namespace_labels(self) -> dict[str, dict[str, str]] | None:
        """Every namespace's labels, or None when they cannot be read (a term's namespaceSelector
        is then taken to reach every namespace: anti-affinity keeps more Pods apart, affinity
        finds its partners more easily; said in the log)."""
        try:
            return self.cluster.namespace_labels()
        except Exception as error:  # noqa: BLE001  -- any API trouble: the broader reading
            log.warning("namespaces could not be listed (%s): a pod affinity term's namespaceSelector is taken "
                        "as every namespace this pass", one_line(error))
            return None

    def _volumes(self, pod: dict[str, Any]) -> tuple[tuple[VolumeAffinity, ...], tuple[CsiVolume, ...]]:
        """Where each of a Pod's bound volumes can be reached from, and which of them a CSI driver
        attaches: kube-scheduler's VolumeBinding filter holds the replacement to the first (a
        zonal disk attaches in its zone, a local volume on its one node), its NodeVolumeLimits
        filter to the second. Read only for Pods that may move."""
        namespace = pod["metadata"].get("namespace", "")
        reachable, attachable = [], []
        for claim in claim_names(pod):
            bound = (self.cluster.claim(namespace, claim).get("spec") or {}).get("volumeName")
            volume = self.cluster.persistent_volume(bound) if bound else None
            if (affinity := volume_affinity(claim, volume)) is not None:
                reachable.append(affinity)
            if volume is not None and (attached := csi_volume(volume)) is not None:
                attachable.append(attached)
        return tuple(reachable), tuple(attachable)

    def _volume_room(self, targets: dict[str, Target]) -> bool:
        """Give every target its CSI drivers' volume limits and the volumes attached to it, read
        once a pass; False (said in the log) when they cannot be read: a Pod with such volumes
        then stays, since its replacement could find every node's limit reached."""
        try:
            limits = {str(csi["metadata"]["name"]): volume_limits(csi) for csi in self.cluster.csi_nodes()}
            attached = attached_volumes(self.cluster.volume_attachments())
        except Exception as error:  # noqa: BLE001  -- any API trouble: such Pods stay this pass
            log.warning("CSINodes or VolumeAttachments could not be listed (%s): Pods with CSI volumes are not "
                        "moved this pass", one_line(error))
            return False
        for name, target in targets.items():
            targets[name] = replace(target, attached=attached.get(name, {}), volume_limits=limits.get(name, {}))
        return True

    def _recall_cooldowns(self, nodes: list[dict[str, Any]], now: float) -> list[str]:
        """Take in the cooldowns recorded on the nodes: after a rollout or a crash, the replica
        that takes the Lease over starts with empty memory, and would otherwise judge a node
        minutes after an eviction from it, before its load settled, and could move another
        replica of a workload just moved. Returns the nodes whose record holds cooldowns that
        ended (to be tidied)."""
        outdated = []
        for node in nodes:
            name = node["metadata"]["name"]
            annotations = node["metadata"].get("annotations") or {}
            recorded = read_cooldowns(annotations, self.keys).after(now)
            if recorded.node is not None:
                self.node_cooldown[name] = max(recorded.node, self.node_cooldown.get(name, 0))
            for workload, until in recorded.workloads.items():
                self.workload_cooldown[workload] = max(until, self.workload_cooldown.get(workload, 0))
            text = annotations.get(self.keys.remediation_cooldowns)
            if text is not None and text != cooldowns_text(recorded):
                outdated.append(name)
        return outdated

    def _record_cooldowns(self, node: str, ends: Cooldowns, now: float) -> None:
        """Merge ``ends`` into the node's record of cooldowns, those over dropped (the record
        removed once none runs). Best effort: a record not written only costs the memory of a
        replica taking over, and it says so."""
        def recorded(current: dict[str, Any]) -> dict[str, Any] | None:
            annotations = current["metadata"].get("annotations") or {}
            text = cooldowns_text(read_cooldowns(annotations, self.keys).merged(ends).after(now))
            if text == annotations.get(self.keys.remediation_cooldowns):
                return None
            return annotations_patch({self.keys.remediation_cooldowns: text})

        try:
            self._rewrite_node(node, recorded)
        except ApiException as error:
            log.warning("Node/%s: cooldowns not recorded (%s): a replica taking the Lease over would not know them",
                        node, api_refusal(error))

    def _forget(self, present: set[str], now: float) -> None:
        """Drop what is kept of nodes no longer in the cluster and of cooldowns that ended: with
        nodes coming and going (autoscaling, spot) the remediator would otherwise grow for ever."""
        for table in (self.samples, self.streaks):
            for name in set(table) - present:
                del table[name]
        self._told.retain({f"Node/{name}" for name in present})
        self.node_cooldown = {n: until for n, until in self.node_cooldown.items() if n in present and until > now}
        self.workload_cooldown = {w: until for w, until in self.workload_cooldown.items() if until > now}

    def _drop_spent_reservations(self, views: dict[str, Any], by_node: dict[str, list[bytes]],
                                 now: float) -> None:
        """A hold is spent once its owner has a Pod on the node again (the replacement landed) or it
        expired; the extender would otherwise count the replacement twice until expiry."""
        for name, view in views.items():
            if not view.reservations:
                continue
            owners = {pod_demand(unpacked(p), self.keys).owner for p in by_node.get(name, [])}
            spent = {r.owner for r in view.reservations if r.owner in owners or r.until <= now}
            if spent:
                self._release(name, *spent, now=now)

    def _in_scope(self, node: dict[str, Any]) -> bool:
        labels = node["metadata"].get("labels") or {}
        return self.settings.remediate_all_nodes or labels.get(self.keys.oversale_label) == "enabled"

    def _move(self, source: dict[str, Any], move: Move, now: float) -> bool:
        """Reserve room on the target, then evict; True when the eviction was accepted."""
        if self.leader is not None and not self.leader.is_leader():
            raise NotLeader()
        namespace, name = move.pod.name.split("/", 1)
        reserved = self._reserve(move, now)
        try:
            # The Pod this pass read, by its UID: a StatefulSet recreates its Pods under the same name,
            # and the one there now may be young, elsewhere, and no part of this node's heat.
            self.cluster.evict(namespace, name, move.pod.demand.uid)
        except ApiException as error:
            self._release(move.target, move.pod.workload, now=now)
            if error.status == 429:
                self.metrics.evictions.labels("refused-by-pdb").inc()
                log.info("Pod/%s: eviction refused for now (PodDisruptionBudget); retried next pass", move.pod.name)
            elif error.status in (404, 409):
                self.metrics.evictions.labels("gone").inc()
                log.info("Pod/%s: gone since this pass read it (%s); not evicted", move.pod.name,
                         "another Pod has its name now" if error.status == 409 else "deleted meanwhile")
            else:
                self.metrics.evictions.labels("error").inc()
                log.warning("Pod/%s: eviction failed: %s", move.pod.name, api_refusal(error))
            return False
        self.metrics.evictions.labels("hot-node").inc()
        # From here on, what is written records this eviction, which happened: it is written even
        # when the Lease ran out while the eviction was admitted (a slow webhook, an API server
        # too busy to renew it), or the replica taking over would find no cooldown and no taint,
        # and could move the next Pod off this node before its load settled.
        message = f"evicted from hot node {source['metadata']['name']} toward {move.target}: {move.reason}"
        log.info("Pod/%s: %s", move.pod.name, message)
        # `kubectl describe pod` asks for a Pod's Events by its UID as well as its name.
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "uid": move.pod.demand.uid}}
        self._event(pod, "EvictedFromHotNode", message)
        tainted = self.config.taint_hot_nodes and self._set_hot_taint(source["metadata"]["name"],
                                                                      now + self.config.node_cooldown_seconds)
        self._event(source, "HotNodeRemediated",
                    f"evicted {move.pod.name} toward {move.target}" + (" (room reserved)" if reserved else "")
                    + (f"; tainted {self.keys.hot_taint}:{HOT_TAINT_EFFECT} for its cooldown" if tainted else ""))
        return True

    def _set_hot_taint(self, node: str, until: float | None) -> bool:
        """Set (``until``) or remove (None) the hot-node taint (``with_hot_taint``); True when
        written."""
        def tainted(current: dict[str, Any]) -> dict[str, Any] | None:
            taints = (current.get("spec") or {}).get("taints") or []
            wanted = with_hot_taint(taints, self.keys.hot_taint, until)
            return None if wanted == taints else {"spec": {"taints": wanted or None}}

        try:
            written = self._rewrite_node(node, tainted)
        except ApiException as error:
            log.warning("Node/%s: hot-node taint not %s (%s)", node, "set" if until else "removed", api_refusal(error))
            return False
        if written:
            log.info("Node/%s: hot-node taint %s", node, f"set until {format_timestamp(until)}" if until else "removed")
        return written

    def _reserve(self, move: Move, now: float) -> bool:
        """Hold the Pod's requests on the target for its replacement (expired holds are dropped)."""
        room = {r: format_amount(r, move.pod.demand.requests.get(r, 0)) for r in RESOURCES}
        room["until"] = format_timestamp(now + self.settings.reservation_seconds)
        try:
            self._rewrite_node(move.target, lambda current: self._holding(current, now, {move.pod.workload: room}))
        except ApiException as error:
            log.warning("Node/%s: could not reserve room (%s); the eviction goes ahead, placed by the scheduler",
                        move.target, api_refusal(error))
            return False
        self.metrics.reservations.inc()
        return True

    def _release(self, node: str, *owners: str, now: float) -> None:
        """Drop these owners' holds (and expired ones) from a node."""
        try:
            self._rewrite_node(node, lambda current: self._holding(current, now, dict.fromkeys(owners)))
        except ApiException as error:
            log.warning("Node/%s: could not release a reservation (%s); it expires by itself", node, api_refusal(error))

    def _holding(self, current: dict[str, Any], now: float, changes: dict[str, Any]) -> dict[str, Any] | None:
        """The patch of a node's reservations: its unexpired holds with ``changes`` (owner -> its
        hold, or None to drop it), the annotation removed once none is left; None when that is
        what the node holds already."""
        annotations = current["metadata"].get("annotations") or {}
        held = {owner: value for owner, value in held_reservations(annotations, self.keys).items()
                if (parse_timestamp(value.get("until")) or 0) > now}
        for owner, room in changes.items():
            if room is None:
                held.pop(owner, None)
            else:
                held[owner] = room
        text = json.dumps(held, sort_keys=True) if held else None
        if text == annotations.get(self.keys.reservations):
            return None
        return annotations_patch({self.keys.reservations: text})

    def _rewrite_node(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
        """Send the merge patch ``change`` makes of the node as read now (None: nothing to change),
        only over that version of it: the kubelet, the node lifecycle controller, the node
        reconciler and a replica whose Lease just ran out write nodes too, and a taint list or a
        record merged from an older read would drop what they wrote meanwhile. A node changed
        meanwhile (409) is read again, up to ``WRITE_TRIES`` times in all. True when written; the
        API's refusal (ApiException) otherwise."""
        attempts = WRITE_TRIES
        while True:
            current = self.cluster.node(name)
            patch = change(current)
            if patch is None:
                return False
            try:
                self.cluster.patch_node(name, patch, current["metadata"].get("resourceVersion", ""))
                return True
            except ApiException as error:
                attempts -= 1
                if error.status != 409 or not attempts:
                    raise

    def _event(self, obj: dict[str, Any], reason: str, message: str) -> None:
        try:
            self.cluster.event(obj, reason, message, COMPONENT)
        except ApiException as error:
            log.warning("event %s not written: %s", reason, api_refusal(error))


@dataclass
class _Observed:
    """One pass's reading of the cluster (:meth:`Remediator._observe`)."""

    node_metrics: dict[str, NodeMetrics]
    usage_of: dict[tuple[str, str], dict[str, float]]
    """(namespace, Pod) -> its usage (:func:`~kube.metrics_api.pod_usage`)."""
    nodes: list[dict[str, Any]]
    by_node: dict[str, list[bytes]] = field(default_factory=dict)
    """node -> its running Pods, packed."""
    held: dict[str, NodeUsage] = field(default_factory=dict)
    """node -> what its Pods request and hold (exclusive CPUs)."""
    others: dict[str, dict[str, int]] = field(default_factory=dict)
    """node -> the other resources its Pods, and the Pods nominated to it, request."""
    ports: dict[str, set[HostPort]] = field(default_factory=dict)
    nominated: dict[str, list[PodDemand]] = field(default_factory=dict)
    """node -> the Pods nominated to it and not yet bound."""
    ready: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """(namespace, controller kind, name) -> its Ready Pods."""


@dataclass
class _Pass:
    """What one pass has read, planned and spent so far, node after node: the moves of one hot
    node take their room, evictions and namespaces' shares before the next one plans."""

    seen: _Observed
    views: dict[str, NodeView]
    targets: dict[str, Target]
    dry_run: bool
    now: float
    evictions_left: int
    per_namespace: dict[str, int] = field(default_factory=dict)
    neighbours: Neighbours | None = None
    """Every running Pod as inter-Pod affinity reads it: built once a node has something to plan."""
    volume_room: bool | None = None
    """CSI volume limits read (True), unreadable (False), or not yet needed (None)."""
    rows: list[Row] = field(default_factory=list)
    utilization: dict[tuple[str, ...], float] = field(default_factory=dict)
    hot_nodes: int = 0


def _schedulable(node: dict[str, Any]) -> bool:
    """A node the evicted Pod could land on: Ready and not cordoned."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return all(c.get("status") == "True" for c in conditions if c.get("type") == "Ready")
