"""The cluster model and the day-by-day replay of every system on it.

Each evaluated day, for every system, in the order the live product runs: the compression
reconciler sets each workload's request from history before the day; Pods arrive largest first
and the extender's own filter and score (``oversale.node_table``) choose a node among those open
(load-aware placement reading each node's usage at the Pod's own moment of the day),
a new node being added when none fits (as a cluster autoscaler would); after every arrival the
node oversale reconciler recomputes that node's ratio from its members' summed history, so the
next Pod sees the new oversold allocatable. Then the day's real usage is replayed every 5 minutes
(with remediation, the remediator's policy moves workloads off nodes hot for long enough, from
the next sample on) and every (node, sample) whose summed usage exceeds the node's *real*
capacity is a violation.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import Any

import numpy as np

from oversale.budget import HotTime
from oversale.cpus import Topology
from oversale.node_oversale import oversold_allocatable
from oversale.node_table import NodeTable, rank, screen
from oversale.placement import NodeHeat, NodeUsage, NodeView, PodDemand, load_facts
from oversale.quantity import CPU, MEMORY, RESOURCES
from oversale.remediation import Candidate, RemediationConfig, Target, excess, next_streak, plan_moves
from oversale.settings import COMPRESSION_WINDOW_DAYS, NODE_WINDOW_DAYS
from oversale.usage import (
    LoadConfig,
    NodeLoad,
    Sample,
    Watermarks,
    WorkloadUsage,
    node_load,
    pod_estimate,
    with_history_peak,
)
from simulator.policies import History, System
from simulator.trace import DAY, GIB, MILLI, SLOT, TraceError, Workload

SLOTS_PER_DAY = DAY // SLOT
_REQUESTS_ONLY = LoadConfig(load_weight=0)
SPLITS = ("tuning", "holdout")


@dataclass(frozen=True)
class Config:
    """The replayed cluster: its node size, and how the trace's days split into warm-up (history
    only), tuning and holdout."""

    node_cpu_cores: float = 32
    node_memory_bytes: float = 256 * GIB
    warmup_days: int = 7
    window_days: int = NODE_WINDOW_DAYS
    """History of the node ratios' estimates (``OVERSALE_HISTORY_WINDOW``)."""
    holdout_days: int = 14
    """The last days of the trace, reported apart: nothing may be tuned on them."""
    arrival_seed: int = 0
    """Draws the moment of the day at which each Pod meets the load-aware extender."""
    placement_seed: int | None = None
    """None: a Pod goes to the first of the best-scoring nodes, one placement a rerun repeats. A
    seed: to one of them drawn at random, as kube-scheduler's ``selectHost`` does; each seed is
    another placement the scheduler could equally have made (``--placements`` of ``plan`` and
    ``backtest``)."""
    request_window_days: int = COMPRESSION_WINDOW_DAYS
    """History of the request policies' estimates (``OVERSALE_COMPRESSION_WINDOW``; a peer with a
    window of its own, Crane's 7 days, cuts it shorter)."""

    @property
    def real(self) -> tuple[float, float]:
        return (self.node_cpu_cores * MILLI, self.node_memory_bytes)

    @property
    def history_days(self) -> int:
        """The days of history kept before each replayed day: the longer window."""
        return max(self.window_days, self.request_window_days)


@dataclass
class Window:
    """The history window before a day on one 5-minute grid: usage per workload (0 where absent)."""

    times: np.ndarray
    """Seconds, one per slot."""
    usage: dict[str, np.ndarray]
    """resource -> workloads x slots"""
    present: np.ndarray
    """workloads x slots: the workload has a sample there."""

    def history(self, index: int, slots: np.ndarray | None = None) -> History:
        """One workload's samples in ``slots`` of the window (a mask from :meth:`within`; None: all)."""
        seen = self.present[index] if slots is None else self.present[index] & slots
        return {r: (self.times[seen], self.usage[r][index][seen]) for r in RESOURCES}

    def within(self, days: int | None) -> np.ndarray:
        """The slots of the last ``days`` of the window (None: all of them)."""
        if days is None or not len(self.times):
            return np.ones(len(self.times), dtype=bool)
        return np.asarray(self.times >= self.times[-1] + SLOT - days * DAY)


@dataclass
class Day:
    """One evaluated day: the workloads running, their original requests and real usage."""

    number: int
    """Days since the trace's first sample."""
    start: float
    slots: np.ndarray
    requests: dict[str, np.ndarray]
    usage: dict[str, np.ndarray]
    """resource -> workloads x slots of the day"""
    present: np.ndarray
    window: Window
    split: str
    names: list[str] = field(default_factory=list)
    """The workloads' names, in the order of the rows above."""
    fixed: list[frozenset[str]] = field(default_factory=list)
    """Per workload, the resources whose request no right-sizing changes (empty: none)."""
    peak_cpu: np.ndarray | None = None
    """workloads x slots: each slot's highest cpu reading, where the trace came with peaks."""

    @cached_property
    def observed(self) -> np.ndarray:
        """The slots in which the trace holds a sample of any workload. The others (a last day
        the trace ends in, a gap where the monitoring was down) are not node-time: counted, their
        empty usage would read as time below capacity and dilute the hot time."""
        return np.asarray(self.present.any(axis=0))

    @property
    def observed_share(self) -> float:
        """The share of the day's slots observed: what the day counts for in node-days."""
        return float(self.observed.mean())


@dataclass
class Tally:
    """Accumulated figures of one system over the evaluated days of one split."""

    days: float = 0.0
    """Days counted, each by the share of it the trace observed."""
    node_days: float = 0.0
    node_samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    workload_samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    above_request: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    evictions: int = 0
    moved_again: int = 0
    """Workload-days moved more than once."""
    peak_samples: int = 0
    """Node-samples counted at their members' summed cpu peaks (0: the trace has no peaks)."""
    violations_at_peaks: int = 0

    def count(self, day: Day, placed: Placed, real: tuple[float, float]) -> None:
        """Sum usage per node for every slot the trace observed; count (node, slot) pairs over real
        capacity. A node counts for the share of the day observed. With peaks, count the pairs
        whose summed cpu peaks exceed it too: a 5-minute average over capacity means the node was
        hot in that sample, summed peaks over it only that it may have been (its members' highest
        moments need not coincide), so the truth lies between the two counts."""
        self.days += day.observed_share
        self.node_days += placed.nodes * day.observed_share
        self.evictions += placed.evictions
        self.moved_again += placed.moved_again
        if day.peak_cpu is not None:
            at_peaks = placed.per_node(day.peak_cpu)[:, day.observed]
            self.violations_at_peaks += int((at_peaks > real[0] + 1e-6).sum())
            self.peak_samples += at_peaks.size
        for position, resource in enumerate(RESOURCES):
            per_node = placed.per_node(day.usage[resource])[:, day.observed]  # nodes x observed slots
            self.violations[resource] += int((per_node > real[position] + 1e-6).sum())
            self.node_samples[resource] += per_node.size
            over = (day.usage[resource] > placed.requests[resource][:, None] + 1e-6) & day.present
            self.above_request[resource] += int(over.sum())
            self.workload_samples[resource] += int(day.present.sum())

    def add(self, other: Tally) -> Tally:
        total = Tally(self.days + other.days, self.node_days + other.node_days,
                      evictions=self.evictions + other.evictions, moved_again=self.moved_again + other.moved_again,
                      peak_samples=self.peak_samples + other.peak_samples,
                      violations_at_peaks=self.violations_at_peaks + other.violations_at_peaks)
        for name in ("node_samples", "violations", "workload_samples", "above_request"):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(total, name, {r: mine[r] + theirs[r] for r in RESOURCES})
        return total


@dataclass
class Placed:
    """One system's placement of one day."""

    assignment: np.ndarray
    """Node of every workload."""
    requests: dict[str, np.ndarray]
    """resource -> the request the system set for every workload."""
    ratios: list[tuple[float, float]]
    """(cpu, memory) ratio of every node at the end of the day's placement."""
    moved: np.ndarray | None = None
    """workloads x slots: the node of every workload in every slot, when remediation moved some."""
    evictions: int = 0
    moved_again: int = 0

    @property
    def nodes(self) -> int:
        return len(self.ratios)

    def per_node(self, usage: np.ndarray) -> np.ndarray:
        """nodes x slots: summed ``usage`` (workloads x slots) by the node each workload is on."""
        if self.moved is None:
            onehot = np.zeros((self.nodes, len(self.assignment)))
            onehot[self.assignment, np.arange(len(self.assignment))] = 1.0
            summed: np.ndarray = onehot @ usage
            return summed
        totals = np.zeros((self.nodes, usage.shape[1]))
        np.add.at(totals, (self.moved, np.broadcast_to(np.arange(usage.shape[1]), usage.shape)), usage)
        return totals


@dataclass
class Result:
    """What :func:`run` measured: per system and split, the nodes needed and the hot time
    (``tallies``), what a clairvoyant bound would need, and each day's figures (``daily``)."""

    days: list[int]
    splits: dict[int, str]
    tallies: dict[str, dict[str, Tally]]
    """system -> split -> tally"""
    clairvoyant_nodes: dict[str, float]
    """split -> node-days a perfect oracle would need (each day's peak of summed usage, divisible)."""
    node_day: dict[str, dict[str, Any]]
    """system -> one node's day (the busiest node of the last day) for the plot."""
    last_day: dict[str, dict[str, Any]] = field(default_factory=dict)
    """system -> what it set on the last day: ``requests`` (workload -> resource -> (original,
    set)) and ``node_ratios`` (one (cpu, memory) pair per node)."""
    daily: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """system -> one entry per evaluated day: ``day``, ``split``, ``nodes`` and, per resource,
    ``{resource}_hot_samples`` out of ``node_samples`` (where the hot time came from); the nodes'
    ``cpu_ratio_mean`` and ``cpu_ratio_max`` at the end of the day's placement; for a system
    with an account, per resource ``{resource}_account_multiplier``, the multiplier of the
    day's ratio targets (why a budget was over- or under-spent: a back-off, a slow rise)."""


def oversized_warning(workloads: list[Workload], config: Config) -> str | None:
    """What to tell of workloads whose request, as written, is larger than a node at some point of
    the trace (placed, they get a node of their own), or None."""
    cpu, memory = config.real
    oversized = [w.name for w in workloads
                 if len(w.slots) and (w.request[CPU].max() > cpu or w.request[MEMORY].max() > memory)]
    if not oversized:
        return None
    return (f"warning: {len(oversized)} of {len(workloads)} workloads request more than a node holds "
            f"({config.node_cpu_cores:g} cores, {config.node_memory_bytes / GIB:g} GiB; e.g. {oversized[0]}): "
            "each such Pod gets a node of its own, above its capacity by requests; a larger --node-cores or "
            "--node-memory fits them")


def trace_days(workloads: list[Workload]) -> int:
    """The days a trace spans, from the day of its first sample (day 0) to that of its last."""
    origin = min(int(w.slots[0]) for w in workloads)
    last = max(int(w.slots[-1]) for w in workloads)
    return (last - origin) // SLOTS_PER_DAY + 1


def day_grid(workloads: list[Workload], config: Config) -> tuple[int, list[int]]:
    """The first slot of day 0 (the trace's first sample: Bitbrains starts at local midnight) and
    the evaluated day numbers."""
    origin = min(int(w.slots[0]) for w in workloads)
    total = trace_days(workloads)
    days = list(range(config.warmup_days, total))
    if not days:
        raise TraceError(f"the trace spans {total} days, not more than the {config.warmup_days}-day warm-up")
    if config.holdout_days >= len(days):
        # Every figure would be a holdout figure with nothing it was tuned on, and the tuning
        # tables would read as 0% freed: refuse rather than print numbers that mean nothing.
        raise TraceError(f"the trace spans {total} days: after the {config.warmup_days}-day warm-up {len(days)} "
                         f"are replayed, and a {config.holdout_days}-day holdout takes them all, leaving no tuning "
                         f"day; pass --holdout-days {len(days) // 2} (half of them) or fewer, or a longer trace")
    return origin, days


def build_day(workloads: list[Workload], origin: int, number: int, config: Config, split: str) -> Day:
    first = origin + number * SLOTS_PER_DAY
    slots = np.arange(first, first + SLOTS_PER_DAY)
    active = [w for w in workloads if ((w.slots >= slots[0]) & (w.slots <= slots[-1])).any()]
    usage = {r: np.zeros((len(active), len(slots))) for r in RESOURCES}
    requests = {r: np.zeros(len(active)) for r in RESOURCES}
    present = np.zeros((len(active), len(slots)), dtype=bool)
    peak = np.zeros((len(active), len(slots))) if any(w.peak_cpu is not None for w in active) else None
    for index, workload in enumerate(active):
        today = (workload.slots >= slots[0]) & (workload.slots <= slots[-1])
        columns = workload.slots[today] - slots[0]
        present[index, columns] = True
        for resource in RESOURCES:
            usage[resource][index, columns] = workload.usage[resource][today]
            requests[resource][index] = float(workload.request[resource][today].max())
        if peak is not None:
            peak[index, columns] = (workload.usage[CPU] if workload.peak_cpu is None else workload.peak_cpu)[today]
    window = _window_grid(active, first, config.history_days * SLOTS_PER_DAY)
    return Day(number, float(first * SLOT), slots, requests, usage, present, window, split, [w.name for w in active],
               [w.fixed for w in active], peak)


def _window_grid(active: list[Workload], first_slot: int, length: int) -> Window:
    start = first_slot - length
    usage = {r: np.zeros((len(active), length)) for r in RESOURCES}
    present = np.zeros((len(active), length), dtype=bool)
    for index, workload in enumerate(active):
        past = (workload.slots >= start) & (workload.slots < first_slot)
        columns = workload.slots[past] - start
        present[index, columns] = True
        for resource in RESOURCES:
            usage[resource][index, columns] = workload.usage[resource][past]
    return Window(np.arange(start, first_slot, dtype=np.float64) * SLOT, usage, present)


def largest_first(items: list[tuple[float, float]], capacity: tuple[float, float]) -> list[int]:
    """Item indexes by decreasing size, an item's size being its larger share of a node (the order
    in which a cluster autoscaler's bin packing and kube-scheduler's queue both favour big Pods)."""
    return sorted(range(len(items)), key=lambda i: -max(items[i][0] / capacity[0], items[i][1] / capacity[1]))


@dataclass
class _Node:
    view: NodeView
    usage: NodeUsage
    ratio: list[float]
    requested: list[float]
    history: list[np.ndarray]
    present: np.ndarray
    today: list[np.ndarray] = field(default_factory=list)
    """Its members' summed usage per slot of the day (what the poller reads as the day goes)."""


def _view(number: int, real: tuple[float, float], ratio: list[float], topology: Topology,
          watermarks: Watermarks) -> NodeView:
    cpu_ratio = Decimal(str(ratio[0]))
    return NodeView(name=f"node-{number}",
                    allocatable={CPU: oversold_allocatable(int(real[0]), cpu_ratio),
                                 MEMORY: oversold_allocatable(int(real[1]), Decimal(str(ratio[1])))},
                    cpu_ratio=cpu_ratio, topology=topology, real={CPU: int(real[0]), MEMORY: int(real[1])},
                    watermarks=watermarks)


def heat_at(history: list[np.ndarray], today: list[np.ndarray], times: np.ndarray, day_start: float,
            moment: int, config: LoadConfig) -> NodeHeat:
    """The usage view of a node when a Pod arrives at slot ``moment`` of the day: its members'
    summed usage (``history`` over the window's ``times``, then ``today`` per slot of the day,
    cpu and memory) over the hour before, as the extender's poller would have read it; every
    member counts as already in the metrics. With a history window longer than the hour
    (``config.history_peak_seconds``: the extender reading Prometheus), the cpu maximum over that
    window counts too, as ``with_history_peak`` has it live."""
    hour = 3600 // SLOT
    span = max(hour, round(config.history_peak_seconds / SLOT))
    stamps = np.concatenate([times[-hour:], day_start + SLOT * np.arange(moment)])[-hour:]
    cpus = np.concatenate([history[0][-span:], today[0][:moment]])[-span:]  # the longer window's
    memory = np.concatenate([history[1][-hour:], today[1][:moment]])[-hour:]
    samples = [Sample(float(t), int(c), int(m)) for t, c, m in zip(stamps, cpus[-hour:], memory, strict=True)]
    load = node_load(samples, config)
    if load is not None and span > hour:
        load = with_history_peak(load, float(cpus.max()), config)
    return NodeHeat(load, float(stamps[-1]))  # read as fresh as the poller reads


def observed_usage(window: Window, day: Day, index: int, moment: int, config: LoadConfig) -> WorkloadUsage | None:
    """What workload ``index``'s Pods use at slot ``moment`` of the day as PodMetrics would show
    the extender: its 5-minute average cpu and latest memory before that moment (the trace has one
    Pod per workload, so its own usage stands for its replicas'); None where it did not run just
    before (no replica in the metrics: placed by its request)."""
    if not (day.present[index][moment - 1] if moment else window.present[index][-1]):
        return None
    heat = heat_at([window.usage[r][index] for r in RESOURCES], [day.usage[r][index] for r in RESOURCES],
                   window.times, day.start, moment, config)
    return None if heat.load is None else WorkloadUsage(heat.load.cpu_average, heat.load.memory, 1)


def arrival_moments(day: Day, seed: int = 0) -> np.ndarray:
    """The slot of the day at which each workload's Pod meets the load-aware extender: uniform
    over the day and the same for every system (seeded by ``seed`` and the day), as rollouts and
    restarts come at any hour. Placement order is unchanged (largest first); only what the
    load-aware filter and score see depends on the moment."""
    workloads, slots = day.usage[CPU].shape
    return np.asarray(np.random.default_rng((seed, day.number)).integers(0, slots, size=workloads))


def place(day: Day, system: System, real: tuple[float, float], arrival_seed: int = 0,
          placement_seed: int | None = None, request_days: int | None = None,
          ratio_days: int | None = None) -> Placed:
    """One system's day: its requests, then Pods placed one by one with the extender's filter and
    score, every node's ratio recomputed by the system's node policy after each arrival; ties
    among the best-scoring nodes go to the first, or with ``placement_seed`` to one drawn at
    random (:attr:`Config.placement_seed`). The requests read the last ``request_days`` of the
    day's window, the node ratios its last ``ratio_days`` (None: all of it)."""
    window = day.window
    ratio_slots = window.within(ratio_days)
    requests = _system_requests(day, system, window.within(request_days))
    items = list(zip(requests[CPU].tolist(), requests[MEMORY].tolist(), strict=True))
    topology = Topology.flat(max(1, int(real[0] // MILLI)))
    nodes: list[_Node] = []
    table = NodeTable()
    config, now, load_aware = system.load or _REQUESTS_ONLY, float(window.times[-1]), system.load is not None
    moments = arrival_moments(day, arrival_seed)
    # Scores are whole numbers 0..10, so several nodes often tie at the best; kube-scheduler then
    # picks one of them uniformly at random (selectHost's reservoir sampling).
    ties = None if placement_seed is None else np.random.default_rng((placement_seed, day.number, 1))
    assignment = np.zeros(len(items), dtype=np.int64)
    for index in largest_first(items, real):
        cpu, memory = items[index]
        demand = PodDemand(uid=str(index), requests={CPU: math.ceil(cpu), MEMORY: math.ceil(memory)},
                           bind_policy=None, single_numa=False)
        estimate = None
        if load_aware:  # every node's load as the extender reads it at this Pod's moment
            moment = int(moments[index])
            now = day.start + SLOT * (moment - 1) if moment else float(window.times[-1])
            for node in nodes:
                heat = heat_at(node.history, node.today, window.times, day.start, moment, config)
                table.put_load(node.view.name, load_facts(node.view, heat))
            observed = observed_usage(window, day, index, moment, config) if system.estimate_from_usage else None
            estimate = pod_estimate(demand.requests, observed, config)
        chosen = _chosen_node(table, len(nodes), demand, config, now, load_aware, estimate, ties)
        if chosen is None:  # a new node; a Pod larger than a node gets one of its own
            nodes.append(_Node(_view(len(nodes), real, [1.0, 1.0], topology, config.watermarks), NodeUsage(),
                               [1.0, 1.0], [0.0, 0.0],
                               [np.zeros(window.present.shape[1]) for _ in RESOURCES],
                               np.zeros(window.present.shape[1], dtype=bool),
                               [np.zeros(day.usage[r].shape[1]) for r in RESOURCES]))
            chosen = len(nodes) - 1
        assignment[index] = chosen
        node = nodes[chosen]
        _take(node, index, demand, day, system, real, ratio_slots)
        node.view = _view(chosen, real, node.ratio, topology, config.watermarks)
        table.put(node.view.name, node.view, node.usage, None)  # its load is read at the next Pod's moment
    return Placed(assignment, requests, [(n.ratio[0], n.ratio[1]) for n in nodes])


def _system_requests(day: Day, system: System, request_slots: np.ndarray) -> dict[str, np.ndarray]:
    """Each workload's requests as ``system`` sets them from the day's window (its slots
    ``request_slots``), by resource."""
    histories = [day.window.history(i, request_slots) for i in range(len(day.present))]
    # A workload an HPA scales on a resource's utilization keeps that request (the live reconciler
    # leaves it alone: lower requests would read as higher utilization and scale it out).
    return {r: np.array([float(day.requests[r][i]) if day.fixed and r in day.fixed[i]
                         else system.request(r, float(day.requests[r][i]), histories[i], day.start)
                         for i in range(len(day.requests[r]))]) for r in RESOURCES}


def _chosen_node(table: NodeTable, count: int, demand: PodDemand, config: LoadConfig, now: float, load_aware: bool,
                 estimate: dict[str, float] | None, ties: np.random.Generator | None) -> int | None:
    """The extender's own filter and score over the ``count`` open nodes (node n is the table's
    row n): the first of the best, or with ``ties`` one of the best drawn uniformly; None where
    none fits."""
    chosen, best, tied = None, -1, 0
    slots = np.arange(count, dtype=np.int64)
    for number, (reason, score) in enumerate(zip(screen(table, slots, demand, config, now, load_aware),
                                                 rank(table, slots, demand, config, now, load_aware, estimate),
                                                 strict=True)):
        if reason is None and score > best:
            chosen, best, tied = number, score, 1
        elif reason is None and score == best and ties is not None:
            tied += 1
            if ties.integers(tied) == 0:
                chosen = number
    return chosen


def _take(node: _Node, index: int, demand: PodDemand, day: Day, system: System, real: tuple[float, float],
          ratio_slots: np.ndarray) -> None:
    """``node`` taking workload ``index``: its requests and usage added, and its ratio recomputed by
    the system's node policy over the slots ``ratio_slots`` its workloads were present."""
    window = day.window
    node.present |= window.present[index]
    for k, resource in enumerate(RESOURCES):
        node.requested[k] += demand.requests[resource]
        node.history[k] += window.usage[resource][index]
        node.today[k] += day.usage[resource][index]
        if system.ratio is not None:
            recent = node.present & ratio_slots
            node.ratio[k] = system.ratio(resource, real[k], node.requested[k], window.times[recent],
                                         node.history[k][recent], node.ratio[k])
    node.usage = NodeUsage(shared={CPU: int(node.requested[0]), MEMORY: int(node.requested[1])})


def remediate(day: Day, placed: Placed, real: tuple[float, float], config: RemediationConfig,
              load: LoadConfig) -> None:
    """Replay the remediator over the day: every 5-minute sample is an observation of every node
    (so K observations at the live interval are ceil(K x interval / 5 min) samples); a node hot
    for that long moves workloads, chosen and placed by ``oversale.remediation``, from the next
    sample on. Fills ``placed.moved``, ``evictions`` and ``moved_again``."""
    slots = day.usage[CPU].shape[1]
    needed = max(1, math.ceil(config.observations * config.interval_seconds / SLOT))
    node_rest = math.ceil(config.node_cooldown_seconds / SLOT)
    workload_rest = math.ceil(config.workload_cooldown_seconds / SLOT)
    capacity = {CPU: int(real[0]), MEMORY: int(real[1])}
    topology = Topology.flat(max(1, int(real[0] // MILLI)))
    views = [_view(n, real, list(ratio), topology, load.watermarks) for n, ratio in enumerate(placed.ratios)]
    current = placed.assignment.copy()
    where = np.empty((len(current), slots), dtype=np.int64)
    requests = {r: placed.requests[r] for r in RESOURCES}
    streak = [0] * placed.nodes
    node_free_at = [0] * placed.nodes
    workload_free_at = np.zeros(len(current), dtype=np.int64)
    moves = np.zeros(len(current), dtype=np.int64)
    peaks: list[deque[float]] = [deque(maxlen=3600 // SLOT) for _ in range(placed.nodes)]
    for slot in range(slots):
        where[:, slot] = current
        used = {r: np.bincount(current, weights=day.usage[r][:, slot], minlength=placed.nodes) for r in RESOURCES}
        targets: dict[int, Target] | None = None  # built only in a sample where some node acts
        budget = config.max_per_pass
        for node in range(placed.nodes):
            peaks[node].append(float(used[CPU][node]))
        for node in range(placed.nodes):
            observed = {r: float(used[r][node]) for r in RESOURCES}
            over = excess(observed, capacity, config.watermarks)
            streak[node] = next_streak(streak[node], bool(over))
            if streak[node] < needed or node_free_at[node] > slot or budget <= 0:
                continue
            members = np.flatnonzero((current == node) & day.present[:, slot] & (workload_free_at <= slot))
            if targets is None:
                targets = _targets(views, current, requests, used, peaks, float(day.slots[slot] * SLOT))
            plan = plan_moves(over, _candidates(day, members, requests, slot),
                              [t for n, t in targets.items() if n != node], load, min(config.max_per_node, budget))
            for move in plan.moves:
                workload, target = int(move.pod.name), int(move.target.removeprefix("node-"))
                # As live: the room a move takes is gone for the next hot node of this sample.
                targets[target] = targets[target].taking(move.pod)
                current[workload] = target
                moves[workload] += 1
                workload_free_at[workload] = slot + workload_rest
                budget -= 1
            if plan.moves:
                node_free_at[node] = slot + node_rest
                streak[node] = 0
    placed.moved = where
    placed.evictions = int(moves.sum())
    placed.moved_again = int((moves > 1).sum())


def _candidates(day: Day, members: np.ndarray, requests: dict[str, np.ndarray], slot: int) -> list[Candidate]:
    """The workloads on a hot node at ``slot`` as the remediator sees its Pods: their requests
    and this sample's usage, each its own owner."""
    return [Candidate(str(w), "", str(w), "Burstable",
                      PodDemand(str(w), {r: math.ceil(requests[r][w]) for r in RESOURCES}, None, False, owner=str(w)),
                      {r: float(day.usage[r][w, slot]) for r in RESOURCES}) for w in members]


def _targets(views: list[NodeView], current: np.ndarray, requests: dict[str, np.ndarray],
             used: dict[str, np.ndarray], peaks: list[deque[float]], at: float) -> dict[int, Target]:
    """Every node as a place to move to at this sample: its requests as placed now and the
    extender's windows of its usage, this sample as the 5-minute average and the highest of the
    last hour's samples (this day's) as the 1-hour maximum."""
    nodes = len(views)
    requested = {r: np.bincount(current, weights=requests[r], minlength=nodes) for r in RESOURCES}
    return {n: Target(views[n], NodeUsage(shared={r: int(requested[r][n]) for r in RESOURCES}),
                      NodeHeat(NodeLoad(float(used[CPU][n]), float(max(peaks[n])), float(used[MEMORY][n]), at), at))
            for n in range(nodes)}


def clairvoyant_nodes(day: Day, real: tuple[float, float]) -> float:
    """Nodes an oracle needs: the day's real peak of summed usage, perfectly divisible."""
    return max(float(day.usage[r].sum(axis=0).max()) / real[k] for k, r in enumerate(RESOURCES))


def run(workloads: list[Workload], config: Config, systems: list[System],
        progress: Callable[[str], None] = lambda m: None) -> Result:
    """Replay ``workloads`` day by day through every system of ``systems``, each on a cluster of
    its own, in the order the module docstring gives: ratios from the history so far, Pods placed
    by the extender's filter and score (a node added when none fits), the day's usage, and where
    the system has it, remediation."""
    names = [s.name for s in systems]
    if len(set(names)) != len(names):
        raise ValueError(f"system names must be unique: {sorted(n for n in set(names) if names.count(n) > 1)}")
    origin, days = day_grid(workloads, config)
    warning = oversized_warning(workloads, config)
    if warning:
        progress(warning)
    first_holdout = days[-1] + 1 - config.holdout_days
    splits = {d: "holdout" if d >= first_holdout else "tuning" for d in days}
    tallies = {name: {split: Tally() for split in SPLITS} for name in names}
    clairvoyant = dict.fromkeys(SPLITS, 0.0)
    node_day: dict[str, dict[str, Any]] = {}
    last_day: dict[str, dict[str, Any]] = {}
    daily: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    began_all = time.perf_counter()
    for system in systems:
        if system.account is not None:
            system.account.reset()
    for count, number in enumerate(days, 1):
        began = time.perf_counter()
        day = build_day(workloads, origin, number, config, splits[number])
        clairvoyant[day.split] += clairvoyant_nodes(day, config.real) * day.observed_share
        for system in systems:
            # The account's multipliers as the day's node ratios read them: what it kept of the days before.
            multipliers = {r: system.account.multiplier(r) for r in RESOURCES} if system.account is not None else {}
            placed = place(day, system, config.real, config.arrival_seed, config.placement_seed,
                           config.request_window_days, config.window_days)
            if system.remediation is not None:
                remediate(day, placed, config.real, system.remediation, system.load or LoadConfig())
            today = Tally()
            today.count(day, placed, config.real)
            tallies[system.name][day.split] = tallies[system.name][day.split].add(today)
            cpu_ratios = [cpu for cpu, _ in placed.ratios] or [1.0]
            daily[system.name].append({"day": number, "split": day.split, "nodes": placed.nodes,
                                       "node_samples": today.node_samples[CPU],
                                       **{f"{r}_hot_samples": today.violations[r] for r in RESOURCES},
                                       "cpu_ratio_mean": round(sum(cpu_ratios) / len(cpu_ratios), 3),
                                       "cpu_ratio_max": round(max(cpu_ratios), 3),
                                       **{f"{r}_account_multiplier": round(m, 3) for r, m in multipliers.items()},
                                       **({"cpu_hot_samples_at_peaks": today.violations_at_peaks}
                                          if today.peak_samples else {})})
            if system.account is not None:  # what the reconcilers' account sees of this day, tomorrow
                system.account.observe(number, {r: HotTime(today.violations[r], today.node_samples[r])
                                                for r in RESOURCES})
            if number == days[-1]:
                node_day[system.name] = busiest_node(day, placed, config.real)
                last_day[system.name] = {
                    "requests": {name: {r: (float(day.requests[r][i]), float(placed.requests[r][i])) for r in RESOURCES}
                                 for i, name in enumerate(day.names)},
                    "node_ratios": placed.ratios}
        elapsed = time.perf_counter() - began_all
        systems_said = f"{len(systems)} system{'s' if len(systems) != 1 else ''}"
        progress(f"day {count}/{len(days)} ({day.split}, {len(day.present)} workloads, {systems_said}) "
                 f"in {time.perf_counter() - began:.1f}s; about {elapsed / count * (len(days) - count):.0f}s left")
    return Result(days, splits, tallies, clairvoyant, node_day, last_day, daily)


def busiest_node(day: Day, placed: Placed, real: tuple[float, float]) -> dict[str, Any]:
    """The day of the system's node with the highest summed cpu usage: usage, requests, real and
    oversold capacity, for the node plot."""
    totals = [float(day.usage[CPU][placed.assignment == n].sum()) for n in range(placed.nodes)]
    busiest = int(np.argmax(totals))
    members = placed.assignment == busiest
    return {"node": busiest, "hours": ((day.slots - day.slots[0]) * SLOT / 3600).tolist(),
            "cpu_usage": day.usage[CPU][members].sum(axis=0).tolist(),
            "cpu_requested": float(placed.requests[CPU][members].sum()),
            "cpu_oversold": real[0] * placed.ratios[busiest][0], "cpu_real": real[0],
            "workloads": int(members.sum())}
