"""The nodes as columns: the filter and the score over thousands of nodes in a few vector steps.

A filter or prioritize call reads a handful of figures of every node: free oversold cpu and
memory, free CPUs and whole cores per NUMA zone, the packing strategy, the load verdict and the
summed usage. Read from a few objects per node, 5,000 nodes cost more in memory traffic than in
arithmetic (a call's time grew faster than the node count); held as numpy columns, a shared Pod
or a FullPCPUs Pod is decided for every node by a few vector operations. A row changes only
when its node, the node's Pods or its metrics do (``NodeTable.put``, ``put_load``).

The node-by-node functions of ``oversale.placement`` stay the definition of the filter
(``shortfall``, then ``load_shortfall``) and the score (``score_on``): the vectors repeat their
arithmetic as the same float64 operations in the same order (Python's ``round`` and numpy's
``rint`` both round half to even), and every refusal's wording, every SpreadByPCPUs Pod and
every node holding reservations goes through ``fit_on`` node by node (``tests/test_usage.py``
checks the two agree).

>>> from decimal import Decimal
>>> from oversale.cpus import Topology
>>> from oversale.placement import NodeUsage, NodeView, PodDemand
>>> from oversale.usage import LoadConfig
>>> table = NodeTable()
>>> for name, taken in (("a", 3000), ("b", 1000)):
...     view = NodeView(name, {"cpu": 4000, "memory": 2**33}, Decimal(1), Topology.flat(4))
...     table.put(name, view, NodeUsage(shared={"cpu": taken}), None)
>>> slots, unknown = table.slots(["a", "b", "c"])
>>> pod = PodDemand("p", {"cpu": 2000, "memory": 2**30}, None, False)
>>> screen(table, slots, pod, LoadConfig(), now=0.0, load_aware=False), unknown
(['cpu: 2 requested, 1 free on a (oversold allocatable)', None], ['c'])
>>> rank(table, slots, pod, LoadConfig(), now=0.0, load_aware=False)
[0, 8]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from oversale.cpus import FULL_PCPUS, MOST_ALLOCATED, SPREAD_BY_PCPUS
from oversale.placement import Ask, LoadFacts, NodeUsage, NodeView, PodDemand, fit_on, free
from oversale.quantity import CPU
from oversale.usage import LoadConfig

Row = tuple[NodeView, NodeUsage, LoadFacts | None]
Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
_POLICY_CODES = {None: 0, FULL_PCPUS: 1, SPREAD_BY_PCPUS: 2}
_COLUMNS = {
    "free_cpu": np.int64, "free_memory": np.int64, "allocatable_cpu": np.int64, "holds": np.bool_,
    "spread": np.bool_, "bind": np.int8, "single_numa": np.bool_, "ratio_numerator": np.int64,
    "ratio_denominator": np.int64, "cpus": np.int64, "threads": np.int64, "zones": np.int64, "free_max": np.int64,
    "free_sum": np.int64, "whole_max": np.int64, "whole_sum": np.int64,
    "at": np.float64, "hot": np.bool_, "cpu_used": np.float64, "memory_used": np.float64, "real_cpu": np.int64,
    "real_memory": np.int64,
}


class NodeTable:
    """One row per node: its view, usage and load facts, and the columns the vectors read."""

    free_cpu: Ints
    """Oversold allocatable millicores not yet taken (``oversale.placement.free``)."""
    free_memory: Ints
    allocatable_cpu: Ints
    holds: Flags
    """Holds reservations (for the replacement of an evicted Pod): answered node by node."""
    spread: Flags
    """LeastAllocated (spread) rather than MostAllocated (pack)."""
    bind: npt.NDArray[np.int8]
    """The node's own binding policy: 0 none, 1 FullPCPUs, 2 SpreadByPCPUs."""
    single_numa: Flags
    ratio_numerator: Ints
    ratio_denominator: Ints
    cpus: Ints
    """Real CPUs of the topology; then per NUMA zone of the free ones (``FreeSummary``): the
    threads per core, the zone count, the most free CPUs in one zone and all of them, the most
    whole free cores in one zone and all of them."""
    threads: Ints
    zones: Ints
    free_max: Ints
    free_sum: Ints
    whole_max: Ints
    whole_sum: Ints
    at: Floats
    """When the freshest sample was taken (-inf: no load facts)."""
    hot: Flags
    cpu_used: Floats
    memory_used: Floats
    real_cpu: Ints
    real_memory: Ints

    def __init__(self) -> None:
        self._slot: dict[str, int] = {}
        self._vacant: list[int] = []
        self.rows: list[Row | None] = []
        for column, kind in _COLUMNS.items():
            setattr(self, column, np.zeros(0, kind))

    def __len__(self) -> int:
        return len(self._slot)

    def put(self, name: str, view: NodeView, usage: NodeUsage, facts: LoadFacts | None) -> None:
        """Add or replace a node's row."""
        slot = self._slot.get(name)
        if slot is None:
            slot = self._vacant.pop() if self._vacant else self._append()
            self._slot[name] = slot
        self.rows[slot] = (view, usage, facts)
        self.free_cpu[slot], self.free_memory[slot] = free(view, usage)
        self.allocatable_cpu[slot] = view.allocatable.get(CPU, 0)
        self.holds[slot] = bool(view.reservations)
        self.spread[slot] = view.strategy != MOST_ALLOCATED
        self.bind[slot] = _POLICY_CODES.get(view.bind_policy, 0)
        self.single_numa[slot] = view.single_numa
        self.ratio_numerator[slot], self.ratio_denominator[slot] = view.ratio.numerator, view.ratio.denominator
        summary = usage.summary(view.topology)
        self.cpus[slot], self.threads[slot], self.zones[slot] = summary.total, summary.threads, len(summary.free)
        self.free_max[slot], self.free_sum[slot] = max(summary.free.values(), default=0), sum(summary.free.values())
        self.whole_max[slot] = max(summary.whole_cores.values(), default=0)
        self.whole_sum[slot] = sum(summary.whole_cores.values())
        self._put_load(slot, facts)

    def put_load(self, name: str, facts: LoadFacts | None) -> None:
        """Replace a node's load facts only (after a metrics poll: the node and its Pods are as
        they were, so its other columns stand). A node without a row yet is left to ``put``."""
        slot = self._slot.get(name)
        if slot is None:
            return
        view, usage, _ = self.row(slot)
        self.rows[slot] = (view, usage, facts)
        self._put_load(slot, facts)

    def _put_load(self, slot: int, facts: LoadFacts | None) -> None:
        if facts is None:
            self.at[slot], self.hot[slot] = -math.inf, False
            return
        self.at[slot], self.hot[slot] = facts.at, facts.is_hot
        self.cpu_used[slot], self.memory_used[slot] = facts.cpu_used, facts.memory_used
        self.real_cpu[slot], self.real_memory[slot] = facts.real_cpu, facts.real_memory

    def row(self, slot: int) -> Row:
        """The (view, usage, facts) of a row in use."""
        row = self.rows[slot]
        if row is None:
            raise KeyError(f"row {slot} is vacant")
        return row

    def remove(self, name: str) -> None:
        slot = self._slot.pop(name, None)
        if slot is not None:
            self.rows[slot] = None
            self._vacant.append(slot)

    def slots(self, names: Sequence[str]) -> tuple[Ints, list[str]]:
        """The rows of ``names`` in order, and the names without a row (left out of the rows)."""
        found = list(map(self._slot.get, names))
        if None not in found:
            return np.array(found, np.int64), []
        return (np.array([slot for slot in found if slot is not None], np.int64),
                [name for name, slot in zip(names, found, strict=True) if slot is None])

    def _append(self) -> int:
        slot = len(self.rows)
        self.rows.append(None)
        if slot >= len(self.free_cpu):
            size = max(64, 2 * slot)
            for column in _COLUMNS:
                old = getattr(self, column)
                grown = np.zeros(size, old.dtype)
                grown[:slot] = old[:slot]
                setattr(self, column, grown)
        return slot


def screen(table: NodeTable, slots: Ints, demand: PodDemand, config: LoadConfig, now: float,
           load_aware: bool) -> list[str | None]:
    """The filter: for each row, why the Pod cannot go there, or None (``shortfall``, then with
    ``load_aware`` ``load_shortfall``: fresh metrics above a watermark)."""
    reasons, _, _ = _fit(table, slots, Ask.of(demand, config), now)
    if load_aware:
        rows, numbers = table.rows, slots.tolist()
        for index in np.flatnonzero(table.hot[slots] & (now - table.at[slots] <= config.max_age_seconds)).tolist():
            if reasons[index] is None:
                reasons[index] = rows[numbers[index]][2].hot  # a hot row has facts
    return reasons


def rank(table: NodeTable, slots: Ints, demand: PodDemand, config: LoadConfig, now: float,
         load_aware: bool, estimate: Mapping[str, float] | None = None) -> list[int]:
    """The score, 0..10 per row (``score_on``'s answers): packing combined with how cool the node
    stays after placing the Pod (its ``estimate``, default from its requests) where ``load_aware``
    and the node's metrics are fresh."""
    ask = Ask.of(demand, config, estimate)
    _, fits, packing = _fit(table, slots, ask, now)
    scores = packing
    if load_aware and config.load_weight > 0:
        real_cpu, real_memory = table.real_cpu[slots], table.real_memory[slots]
        with np.errstate(divide="ignore", invalid="ignore"):
            cpu_share = np.where(real_cpu > 0, (table.cpu_used[slots] + ask.pod_cpu) / real_cpu, 1.0)
            memory_share = np.where(real_memory > 0, (table.memory_used[slots] + ask.pod_memory) / real_memory, 1.0)
        load = np.clip(np.rint(10 * (1 - np.maximum(cpu_share, memory_share))), 0, 10)
        total = config.packing_weight + config.load_weight
        combined = np.rint((packing * config.packing_weight + load * config.load_weight) / total)
        scores = np.where(now - table.at[slots] <= config.max_age_seconds, combined, packing)
    answers: list[int] = np.where(fits, scores, 0).astype(np.int64).tolist()
    rows, numbers = table.rows, slots.tolist()
    for index in np.flatnonzero(fits & table.holds[slots]).tolist():
        if rows[numbers[index]][0].holds_for(demand.owner, now):  # rows asked for are in use
            answers[index] = 10  # the room was made for this Pod
    return answers


def _fit(table: NodeTable, slots: Ints, ask: Ask, now: float) -> tuple[list[str | None], Flags, Floats]:
    """Per row: why the Pod does not fit by requests (None: it does), whether it fits, and the
    packing score: ``fit_on``'s answers, computed as vectors wherever the Pod is shared or bound
    under FullPCPUs on a node holding no reservation, node by node elsewhere (SpreadByPCPUs
    scores by the zone it would take) and for every refusal's wording."""
    demand = ask.demand
    free_cpu, free_memory = table.free_cpu[slots], table.free_memory[slots]
    if demand.cpus:
        code = _POLICY_CODES.get(demand.bind_policy, 0)
        policy = np.full(len(slots), code, np.int8) if code else table.bind[slots]
    else:
        policy = np.zeros(len(slots), np.int8)  # only a Pod asking whole CPUs is ever bound
    binds, full = policy > 0, policy == 1
    numerator, denominator = table.ratio_numerator[slots], table.ratio_denominator[slots]
    cpu = np.where(binds, -(-demand.cpus * 1000 * numerator // denominator) + demand.overhead_cpu, ask.cpu)  # shortfall
    threads, total = table.threads[slots], table.cpus[slots]
    single = demand.single_numa | table.single_numa[slots] | (table.zones[slots] == 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(full, np.where(single, table.whole_max[slots], table.whole_sum[slots]) * threads,
                        np.where(single, table.free_max[slots], table.free_sum[slots]))
        numa = (room >= demand.cpus) & ~(full & (demand.cpus % np.maximum(threads, 1) != 0))
        fits = (cpu <= free_cpu) & (ask.memory <= free_memory) & np.where(binds, numa, True)
        # node_score: a shared Pod by the oversold allocatable it leaves, a bound one by the CPUs
        allocatable = table.allocatable_cpu[slots]
        after = 1 - (free_cpu - ask.cpu) / allocatable
        shared = np.where(allocatable > 0,
                          np.clip(np.rint(10 * np.where(table.spread[slots], 1 - after, after)), 0, 10), 0.0)
        fullness = (total - table.free_sum[slots] + demand.cpus) / total
        primary = np.where(table.spread[slots], 1 - fullness, fullness)
        whole_left = (table.whole_sum[slots] - demand.cpus // np.maximum(threads, 1)) * threads / total
        bound = np.where(total > 0, np.clip(np.rint(1 + 8 * primary + whole_left), 1, 10), 0.0)
    packing = np.where(binds, bound, shared)
    one_by_one = table.holds[slots] | (binds & ~full)
    reasons: list[str | None] = [None] * len(slots)
    rows, numbers = table.rows, slots.tolist()
    for index in np.flatnonzero(one_by_one | ~fits).tolist():
        view, usage, _ = rows[numbers[index]]  # rows asked for are in use
        reason, packing[index] = fit_on(view, usage, ask, now)
        reasons[index], fits[index] = reason, reason is None
    return reasons, fits, packing
