"""Filter, prioritize and bind over the extender's cluster state (no HTTP here)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from kube.client import one_line, refused_by_server
from oversale.annotations import AnnotationKeys
from oversale.cpus import FULL_PCPUS, NoFit
from oversale.node_table import NodeTable, rank, screen
from oversale.placement import (
    NodeHeat,
    NodeView,
    PodDemand,
    allocate,
    crowded_out,
    load_shortfall,
    nominated_ahead,
    pod_demand,
    preemption_on,
    with_nominated,
)
from scheduler.protocol import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    MetaPod,
    MetaVictims,
)
from scheduler.state import RESERVATION_TTL, ClusterState, PodRecord, Reservation, resource_status

log = logging.getLogger(__name__)
T = TypeVar("T")


class NotSent(Exception):
    """A :class:`Binder` did not send its request, so none of it happened: the bind's time was up
    before it."""


class Binder(Protocol):
    """The API-server side of a bind."""

    def within(self, seconds: float) -> Binder:
        """This binder with its requests sharing one deadline ``seconds`` from now: each waits at
        most what is left of it, and one with nothing left raises :class:`NotSent` unsent."""
        ...

    def pod(self, namespace: str, name: str, fresh: bool = False) -> dict[str, Any]:
        """The Pod; ``fresh``: as the API server holds it now, not as a cache last saw it."""
        ...

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None: ...

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


@dataclass
class _Sent:
    """The nodes of one filter or prioritize call that the extender knows, in the order sent."""

    full: bool
    """Whole Node objects were sent (``nodeCacheCapable`` false), not names."""
    names: list[str]
    objects: list[Any]
    """What goes back for each: the Node object or its name."""
    unknown: list[str]
    """Names sent that are not in the extender's cache (yet)."""


def _answer(args: ExtenderArgs, state: ClusterState,
            decide: Callable[[NodeTable, npt.NDArray[np.int64]], list[T]]) -> tuple[_Sent, list[T]]:
    """``decide`` (a filter or a score over the node table) for the nodes sent, in the order sent."""
    nodes = args.get("Nodes")
    if nodes is not None and nodes.get("items") is not None:
        items = nodes["items"]
        names = [str(n["metadata"]["name"]) for n in items]
        table, slots = state.table_of([(name, state.view_of(n)) for name, n in zip(names, items, strict=True)])
        return _Sent(True, names, items, []), decide(table, slots)
    names = args.get("NodeNames") or []
    with state.locked():  # a watch event must not change a row while it is read
        table, slots, unknown = state.table(names)
        answers = decide(table, slots)
    if unknown:
        missing = set(unknown)
        names = [name for name in names if name not in missing]
    return _Sent(False, names, names, unknown), answers


def filter_nodes(args: ExtenderArgs, state: ClusterState, keys: AnnotationKeys,
                 load_aware: bool = False) -> ExtenderFilterResult:
    """kube-scheduler's ``filter`` call: the nodes of ``args`` where the Pod fits on the reshaped
    capacity (its exclusive CPUs from real cores, NUMA as asked) and, when ``load_aware``, whose
    real usage is below its scheduling watermarks; each other node with the reason, marked
    unresolvable where no preemption can help."""
    demand = pod_demand(args["Pod"], keys)

    def decide(table: NodeTable, slots: npt.NDArray[np.int64]) -> list[tuple[str, bool] | None]:
        """Per node: None (it passes), or why not and whether no preemption can ever help."""
        now = state.wall()
        reasons = screen(table, slots, demand, state.load_config, now, load_aware)
        nominations = state.nominations()  # rare: only while a preemption's victims are leaving
        if nominations:
            for index, slot in enumerate(slots.tolist()):
                view, usage, _ = table.row(slot)
                if reasons[index] is None and (nominated := nominations.get(view.name)):
                    reasons[index] = crowded_out(view, usage, demand, nominated, now)
        return [None if reason is None else (reason, _never_fits(table.row(slot)[0], demand))
                for slot, reason in zip(slots.tolist(), reasons, strict=True)]

    sent, verdicts = _answer(args, state, decide)
    failed = dict.fromkeys(sent.unknown, "node not in the extender's cache yet")
    unresolvable: dict[str, str] = {}
    for name, verdict in zip(sent.names, verdicts, strict=True):
        if verdict is not None:  # too hot cools down, and most shortfalls pass after a preemption
            (unresolvable if verdict[1] else failed)[name] = verdict[0]
    passed = [obj for obj, verdict in zip(sent.objects, verdicts, strict=True) if verdict is None]
    # Only nodes that were sent come back, in the same form. With nodeCacheCapable an empty or
    # missing NodeNames would filter out every node, so the list is always present.
    result: ExtenderFilterResult = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    if sent.full:
        result["Nodes"] = {"metadata": {}, "items": passed}
        result["NodeNames"] = None
    else:
        result["Nodes"] = None
        result["NodeNames"] = passed
    return result


def _never_fits(view: NodeView, demand: PodDemand) -> bool:
    """No preemption can help: the node does not have the CPUs at all."""
    policy = demand.binding_on(view)
    if not policy:
        return False
    threads = view.topology.threads_per_core()
    return demand.cpus > len(view.topology.cpus) or (policy == FULL_PCPUS and demand.cpus % threads != 0)


def prioritize(args: ExtenderArgs, state: ClusterState, keys: AnnotationKeys,
               load_aware: bool = False) -> list[HostPriority]:
    demand = pod_demand(args["Pod"], keys)
    estimate = state.estimate_for(demand) if load_aware else None
    sent, scores = _answer(args, state, lambda table, slots: rank(table, slots, demand, state.load_config,
                                                                  state.wall(), load_aware, estimate))
    priorities: list[HostPriority] = [{"Host": name, "Score": score}
                                      for name, score in zip(sent.names, scores, strict=True)]
    priorities += [{"Host": name, "Score": 0} for name in sent.unknown]
    return priorities


def preempt(args: ExtenderPreemptionArgs, state: ClusterState, keys: AnnotationKeys,
            load_aware: bool = False) -> ExtenderPreemptionResult:
    """The candidates of kube-scheduler's preemption where its victims, or they and the fewest more
    Pods of lower priority, let the Pod pass this extender's filter (``preemption_on``), with those
    victims; every other candidate is left out (an empty victim list would fail the whole
    preemption of a non-ignorable extender)."""
    pod = args["Pod"]
    demand = pod_demand(pod, keys)
    kept: dict[str, MetaVictims] = {}
    refused: dict[str, str] = {}
    added: dict[str, str] = {}
    # Each node as it stands, read under the lock; the victims are worked out after it is released,
    # since adding some may take milliseconds a node and filter and bind wait on the lock.
    with state.locked():
        now = state.wall()
        known = [node for node in args["NodeNameToMetaVictims"] if node in state.nodes]
        refused.update((node, "node not in the extender's cache") for node in args["NodeNameToMetaVictims"]
                       if node not in state.nodes)
        heats: list[NodeHeat | None] = list(state.heats(known)) if load_aware else [None] * len(known)
        nominations = state.nominations()
        budgets = state.budgets()
        candidates = [(node, args["NodeNameToMetaVictims"][node], state.nodes[node], state.held_pods(node), heat,
                       nominations.get(node, [])) for node, heat in zip(known, heats, strict=True)]
    for node, victims, view, held, heat, nominated in candidates:
        uids = [victim["UID"] for victim in victims["Pods"]]
        answer = preemption_on(view, held, uids, demand, heat, state.load_config, now, load_aware, nominated, budgets)
        if answer.refused is not None:
            refused[node] = f"still refused after evicting {len(uids)} Pod(s): {answer.refused}"
            continue
        # kube-scheduler prefers the candidate whose victims break the fewest PodDisruptionBudgets:
        # its count for its own victims, and the extender's for those it adds.
        more: list[MetaPod] = [{"UID": uid} for uid in answer.added]
        kept[node] = {"Pods": [*victims["Pods"], *more],
                      "NumPDBViolations": victims["NumPDBViolations"] + answer.violations}
        if answer.added:
            added[node] = (f"{len(answer.added)} more Pod(s) of lower priority evicted than kube-scheduler chose"
                           + (f" ({answer.violations} breaking a PodDisruptionBudget)" if answer.violations else ""))
    if refused or added:
        metadata = pod.get("metadata") or {}
        log.info("preemption for %s/%s: %d of %d candidate nodes kept%s%s", metadata.get("namespace", ""),
                 metadata.get("name", ""), len(kept), len(kept) + len(refused),
                 "".join(f"; {node}: {more}, for the room the extender charges"
                         for node, more in sorted(added.items())),
                 "".join(f"; {node}: {reason}" for node, reason in sorted(refused.items())))
    return {"NodeNameToMetaVictims": kept}


def refusal(pod: dict[str, Any], uid: str, schedulers: frozenset[str]) -> str | None:
    """Why this Pod must not be bound by this extender, or None. kube-scheduler only asks to bind
    Pods of its own profile that it has just placed; anything else came from somewhere else."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if uid and str(metadata.get("uid", "")) != uid:
        return f"PodUID {uid} is not the Pod's ({metadata.get('uid')}): it was replaced"
    if spec.get("schedulerName", "default-scheduler") not in schedulers:
        return f"schedulerName {spec.get('schedulerName', 'default-scheduler')!r} is not served by this extender"
    if spec.get("nodeName"):
        return f"already bound to {spec['nodeName']}"
    if metadata.get("deletionTimestamp"):
        return "being deleted"
    return None


class LostLease(Exception):
    """This replica stopped leading while a bind was under way."""


_LOST_LEASE = "this extender replica stopped leading mid-bind"


def _before_binding(binder: Binder, keys: AnnotationKeys, namespace: str, name: str, cpuset: str | None,
                    write: bool, leading: Callable[[], bool]) -> None:
    """What goes before a Binding: the Pod's cpuset annotation (``cpuset``; None removes it) when
    ``write``, with the Lease asked before it and again after it. Raises LostLease once this
    replica no longer leads: a replica paused past its Lease (a long GC, a frozen VM) must not
    write a cpuset, nor a Binding, the new leader may be handing out meanwhile."""
    if not leading():
        raise LostLease()
    if write:
        binder.annotate(namespace, name, {keys.resource_status: cpuset})
    if not leading():
        raise LostLease()


def bind(args: ExtenderBindingArgs, state: ClusterState, binder: Binder, keys: AnnotationKeys,
         schedulers: frozenset[str] = frozenset({"oversale"}), load_aware: bool = False,
         leading: Callable[[], bool] = lambda: True) -> ExtenderBindingResult:
    """Bind the Pod to the node kube-scheduler chose, with its cpuset where it asks for exclusive
    CPUs. ``leading`` is asked again before each write (:func:`_before_binding`)."""
    namespace, name, node = args["PodNamespace"], args["PodName"], args["Node"]
    try:
        pod = binder.pod(namespace, name)
    except Exception as error:  # noqa: BLE001  -- reported to the scheduler, which retries
        return {"Error": f"cannot read pod {namespace}/{name}: {one_line(error)}"}
    uid = args.get("PodUID") or str(pod["metadata"].get("uid", ""))
    refused = refusal(pod, args.get("PodUID") or "", schedulers)
    if refused:
        return {"Error": f"not binding pod {namespace}/{name}: {refused}"}
    demand = pod_demand(pod, keys)
    if (earlier := state.lost_bind(uid)) is not None:
        return _bind_again(args, uid, earlier, demand, state, binder, keys, schedulers, leading)
    with state.locked():
        view = state.nodes.get(node)
        if view is None:
            return {"Error": f"node {node} is not in the extender's cache"}
        if state.is_bound(uid):
            return {"Error": f"pod {namespace}/{name} is already bound"}
        hot = load_shortfall(view, state.heats([node])[0], state.load_config) if load_aware else None
        if hot is not None:
            return {"Error": f"pod {namespace}/{name} no longer fits {node}: {hot}"}
        usage = state.usage(node)
        nominated = nominated_ahead(demand, state.nominated_on(node))
        try:
            placement = allocate(view, with_nominated(view, usage, nominated) if nominated else usage, demand,
                                 state.wall())
        except NoFit as reason:
            return {"Error": f"pod {namespace}/{name} no longer fits {node}: {reason}"}
        # Reserved before any API call, under the lock: a concurrent bind sees these CPUs taken.
        state.reserve(PodRecord(uid, node, demand, placement.cpus if placement else (), namespace, name,
                                state.wall()))
    bind_sent = False
    status = resource_status(placement.cpuset, placement.numa_nodes) if placement is not None else None
    # Without a cpuset of its own, a cpuset from an earlier bind of this Pod that did not happen is
    # taken off: bound here with it, the Pod would be read as holding those CPUs.
    leftover = keys.resource_status in ((pod.get("metadata") or {}).get("annotations") or {})
    try:
        _before_binding(binder, keys, namespace, name, status, status is not None or leftover, leading)
        bind_sent = True
        binder.bind(namespace, name, uid, node)
    except LostLease:
        # The cpuset written stays: on a Pod that is not bound it counts for no one, and the new
        # leader writes its own at the bind kube-scheduler asks it for (removing ours could remove
        # that one).
        state.release(uid)
        return {"Error": f"not binding pod {namespace}/{name}: {_LOST_LEASE}"}
    except Exception as error:  # noqa: BLE001  -- reported to kube-scheduler, which retries
        if bind_sent and not refused_by_server(error) and not isinstance(error, NotSent):
            # A timeout or a 5xx may hide a bind that happened: the room stays held until the
            # watch shows the Pod bound (then its record counts) or RESERVATION_TTL passes, and
            # the cpuset stays with it (an unbound Pod's counts for no one).
            log.warning("bind of %s/%s to %s may or may not have happened (%s); its room is held until the "
                        "watch tells", namespace, name, node, one_line(error))
            state.lose_answer(uid, status)
        else:
            state.release(uid)
        return {"Error": f"binding {namespace}/{name} to {node} failed: {one_line(error)}"}
    state.confirm(uid)
    if placement is not None:
        log.info("bound %s/%s to %s with cpuset %s", namespace, name, node, placement.cpuset)
    return {"Error": ""}


def _bind_again(args: ExtenderBindingArgs, uid: str, earlier: Reservation, demand: PodDemand, state: ClusterState,
                binder: Binder, keys: AnnotationKeys, schedulers: frozenset[str],
                leading: Callable[[], bool]) -> ExtenderBindingResult:
    """kube-scheduler retries a bind whose Binding got no answer (``earlier``, its room held).

    Asked for the same node, the same Binding goes again, on the same CPUs, after a fresh read of
    the Pod: the API server takes at most one Binding of a Pod (a second is a 409 Conflict), so
    whichever of the two it takes, the Pod ends on this node with the cpuset already written. A
    Pod the fresh read shows bound there was bound by the first: that is the answer that was lost.
    Asked for another node, the first Binding may still land on its own: the retry is refused until
    the watch tells, or the room expires (``RESERVATION_TTL``). Nothing is sent on a room that has
    expired: its CPUs may have been handed out since."""
    namespace, name, node = args["PodNamespace"], args["PodName"], args["Node"]
    if earlier.record.node != node or earlier.record.demand != demand:
        return {"Error": f"not binding pod {namespace}/{name} to {node}: an earlier bind of it to "
                         f"{earlier.record.node} got no answer and may still land; its room there is held until "
                         f"the watch tells (at most {RESERVATION_TTL:.0f} s)"}
    try:
        pod = binder.pod(namespace, name, fresh=True)
    except Exception as error:  # noqa: BLE001  -- reported to the scheduler, which retries
        return {"Error": f"cannot read pod {namespace}/{name}: {one_line(error)}"}
    if (pod.get("spec") or {}).get("nodeName") == node and str(pod["metadata"].get("uid", "")) == uid:
        state.confirm(uid)
        log.info("bind of %s/%s to %s had happened: its answer was lost", namespace, name, node)
        return {"Error": ""}
    refused = refusal(pod, uid, schedulers)
    if refused:
        return {"Error": f"not binding pod {namespace}/{name}: {refused}"}
    if not state.resend(uid):
        return {"Error": f"not binding pod {namespace}/{name}: the room held for its earlier bind has just expired; "
                         "kube-scheduler's next try places it afresh"}
    try:
        written = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.resource_status)
        _before_binding(binder, keys, namespace, name, earlier.status, written != earlier.status, leading)
        binder.bind(namespace, name, uid, node)
    except LostLease:
        # Unlike a first bind's, this room is not given back: the first Binding may still land on
        # it, and this replica may lead again before the watch tells.
        state.lose_answer(uid, earlier.status)
        return {"Error": f"not binding pod {namespace}/{name}: {_LOST_LEASE}"}
    except Exception as error:  # noqa: BLE001  -- reported to kube-scheduler, which retries
        # Either Binding may have been taken (a 409 here is the first one landing): the room stays
        # held, and the next retry reads the Pod again.
        state.lose_answer(uid, earlier.status)
        return {"Error": f"binding {namespace}/{name} to {node} failed again: {one_line(error)}"}
    state.confirm(uid)
    log.info("bound %s/%s to %s at the retry of a bind whose answer was lost", namespace, name, node)
    return {"Error": ""}

