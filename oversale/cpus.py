"""Exclusive CPU placement on NUMA nodes: which real CPUs a bound Pod gets.

A node's topology is its logical CPUs, each with a physical core, a socket and a NUMA node
(:class:`Topology`). Exclusive CPUs always come from this real topology, never from oversold
capacity. Policies, as Koordinator names them:

- ``FullPCPUs``: only whole physical cores (every hyperthread of each core), so no other workload
  shares a core's caches; the CPU count must be a multiple of the threads per core.
- ``SpreadByPCPUs``: one logical CPU per physical core first, idle cores before those another Pod
  holds a thread of, for the most cores' worth of throughput; a core's siblings are used only
  when every core already gives one.

NUMA zones are chosen by strategy (``MostAllocated`` packs onto the fullest zone that fits,
``LeastAllocated`` spreads onto the emptiest); ties go to the placement that leaves the most whole
free cores. With ``single-numa-node`` every CPU comes from one zone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from oversale.annotations import AnnotationProblem

FULL_PCPUS = "FullPCPUs"
SPREAD_BY_PCPUS = "SpreadByPCPUs"
BIND_POLICIES = (FULL_PCPUS, SPREAD_BY_PCPUS)
MOST_ALLOCATED = "MostAllocated"
LEAST_ALLOCATED = "LeastAllocated"
SINGLE_NUMA_NODE = "single-numa-node"


def bind_policy(value: object) -> str | None:
    """The binding policy a ``cpu-bind-policy`` annotation or label value names, or None: absent,
    or a name nobody serves (such a Pod or node is shared).

    >>> bind_policy("FullPCPUs"), bind_policy("fullpcpus"), bind_policy(None)
    ('FullPCPUs', None, None)
    """
    return value if isinstance(value, str) and value in BIND_POLICIES else None


@dataclass(frozen=True)
class CPU:
    id: int
    core: int
    socket: int
    node: int


@dataclass(frozen=True)
class Topology:
    """A node's CPUs with their core, socket and NUMA node, as the kubelet's CPU manager sees
    them: exclusive CPUs are chosen over it (:func:`place`)."""

    cpus: tuple[CPU, ...]
    detailed: bool = True
    """False when only a CPU count is known (each CPU then counts as its own core)."""

    @classmethod
    def flat(cls, count: int) -> Topology:
        """One NUMA zone of ``count`` CPUs with no core detail."""
        return cls(tuple(CPU(i, i, 0, 0) for i in range(count)), detailed=False)

    @classmethod
    def from_zones(cls, zone_cpus: Mapping[int, int]) -> Topology:
        """NUMA zone id -> CPU count (NodeResourceTopology): contiguous ids per zone, no core detail."""
        cpus: list[CPU] = []
        for zone in sorted(zone_cpus):
            cpus += [CPU(len(cpus) + i, len(cpus) + i, 0, zone) for i in range(zone_cpus[zone])]
        return cls(tuple(cpus), detailed=False)

    @classmethod
    def from_koordinator(cls, text: str) -> Topology:
        """The CPU-topology JSON Koordinator publishes: ``{"detail": [{"id", "core", "socket", "node"}]}``.
        Core numbers are made unique per socket (Linux numbers cores per socket)."""
        return _parsed_topology(text)

    @classmethod
    def _parse(cls, text: str) -> Topology:
        detail = json.loads(text)["detail"]
        cpus = tuple(sorted((CPU(int(c["id"]), int(c["socket"]) * 100000 + int(c["core"]), int(c["socket"]),
                                 int(c["node"])) for c in detail), key=lambda c: c.id))
        if not cpus or len({c.id for c in cpus}) != len(cpus):
            raise ValueError("cpu topology lists no CPUs or the same CPU twice")
        return cls(cpus)

    def zones(self) -> list[int]:
        return sorted({c.node for c in self.cpus})

    def threads_per_core(self) -> int:
        per_core: dict[int, int] = {}
        for cpu in self.cpus:
            per_core[cpu.core] = per_core.get(cpu.core, 0) + 1
        return max(per_core.values()) if per_core else 1


@lru_cache(maxsize=256)
def _parsed_topology(text: str) -> Topology:
    """A fleet has a handful of machine shapes: nodes of one shape share one (immutable) Topology,
    not 64 CPU objects each, which keeps the extender's cache small and its collections short."""
    return Topology._parse(text)


@dataclass(frozen=True)
class Placement:
    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]

    @property
    def cpuset(self) -> str:
        return format_cpuset(self.cpus)


class NoFit(Exception):
    """The CPUs cannot be placed; the message says why, for FailedNodes."""


def whole_free_cores(topology: Topology, taken: Iterable[int], zone: int | None = None) -> list[list[CPU]]:
    """Physical cores whose every thread is free (optionally in one zone), each as its CPUs."""
    used = set(taken)
    cores: dict[int, list[CPU]] = {}
    for cpu in topology.cpus:
        if zone is None or cpu.node == zone:
            cores.setdefault(cpu.core, []).append(cpu)
    return [cpus for _, cpus in sorted(cores.items()) if all(c.id not in used for c in cpus)]


def place(topology: Topology, taken: Iterable[int], count: int, policy: str, single_numa: bool,
          strategy: str = MOST_ALLOCATED) -> Placement:
    """Choose ``count`` exclusive CPUs. Raises NoFit with a reason a person can act on."""
    if count <= 0:
        raise NoFit("no CPUs asked for")
    used = set(taken)
    shortage = FreeSummary.of(topology, used).shortage(count, policy, single_numa)
    if shortage is not None:
        raise NoFit(shortage)
    zones = topology.zones()
    candidates: list[tuple[tuple[float, ...], Placement]] = []
    if single_numa or len(zones) == 1:
        for zone in zones:
            chosen = _pick(topology, used, count, policy, zone)
            if chosen is not None:
                candidates.append((_rank(topology, used, chosen, zone, strategy), Placement(chosen, (zone,))))
        if not candidates:
            raise NoFit(FreeSummary.of(topology, used).shortage(count, policy, True) or "no NUMA node fits")
    else:
        chosen = _pick_across(topology, used, count, policy, strategy)
        if chosen is None:
            raise NoFit(FreeSummary.of(topology, used).shortage(count, policy, False) or "the CPUs do not fit")
        nodes = tuple(sorted({c.node for c in topology.cpus if c.id in chosen}))
        candidates.append(((0.0,), Placement(chosen, nodes)))
    return min(candidates, key=lambda item: item[0])[1]


def _pick(topology: Topology, used: set[int], count: int, policy: str, zone: int | None) -> tuple[int, ...] | None:
    """CPUs for ``policy`` within ``zone`` (None: anywhere), lowest ids first (contiguous sets)."""
    if policy == FULL_PCPUS:
        cores = whole_free_cores(topology, used, zone)
        needed = count // topology.threads_per_core()
        if len(cores) < needed:
            return None
        return tuple(sorted(c.id for core in cores[:needed] for c in core))
    free = [c for c in topology.cpus if c.id not in used and (zone is None or c.node == zone)]
    if len(free) < count:
        return None
    # One thread per core first, then siblings. Cores with the most free threads come first: a
    # thread whose sibling is idle gets its core's whole throughput, one beside another Pod's
    # exclusive thread shares it (FreeSummary.score counts whole cores taken first, as here).
    by_core: dict[int, list[CPU]] = {}
    for cpu in free:
        by_core.setdefault(cpu.core, []).append(cpu)
    cores = sorted(by_core.values(), key=len, reverse=True)  # stable: lowest ids first among equals
    rounds: list[int] = []
    depth = 0
    while len(rounds) < count:
        layer = [cpus[depth].id for cpus in cores if len(cpus) > depth]
        if not layer:
            break
        rounds += layer
        depth += 1
    return tuple(sorted(rounds[:count]))


def _pick_across(topology: Topology, used: set[int], count: int, policy: str, strategy: str) -> tuple[int, ...] | None:
    """Spanning zones: fill zones in strategy order."""
    order = sorted(topology.zones(), key=lambda z: _zone_key(topology, used, z, strategy))
    summary = FreeSummary.of(topology, used)
    chosen: list[int] = []
    for zone in order:
        remaining = count - len(chosen)
        if remaining <= 0:
            break
        take = min(remaining, summary.available(zone, policy))
        if policy == FULL_PCPUS:
            take -= take % topology.threads_per_core()
        if take:
            picked = _pick(topology, used | set(chosen), take, policy, zone)
            if picked:
                chosen += picked
    return tuple(sorted(chosen)) if len(chosen) == count else None


def _zone_key(topology: Topology, used: set[int], zone: int, strategy: str) -> tuple[int, int]:
    free = sum(1 for c in topology.cpus if c.node == zone and c.id not in used)
    return (free, zone) if strategy == MOST_ALLOCATED else (-free, zone)


def _rank(topology: Topology, used: set[int], chosen: tuple[int, ...], zone: int, strategy: str) -> tuple[float, ...]:
    """Lower is better: strategy first, then keep whole free cores and zones for later Pods."""
    free_before = sum(1 for c in topology.cpus if c.node == zone and c.id not in used)
    after = used | set(chosen)
    whole_cores_left = len(whole_free_cores(topology, after))
    empty_zones_left = sum(1 for z in topology.zones() if all(c.id not in after for c in topology.cpus if c.node == z))
    primary = free_before if strategy == MOST_ALLOCATED else -free_before
    return (primary, -empty_zones_left, -whole_cores_left, zone)


@dataclass(frozen=True)
class FreeSummary:
    """Per NUMA zone, the free CPUs and the whole free cores of a node: enough to decide whether a
    bound Pod fits and how well, without choosing its CPUs (that happens once, at bind)."""

    free: Mapping[int, int]
    whole_cores: Mapping[int, int]
    threads: int
    total: int
    detailed: bool
    _shortages: dict[tuple[int, str, bool], str | None] = field(default_factory=dict, compare=False, repr=False)
    _scores: dict[tuple[int, str, bool, str], int] = field(default_factory=dict, compare=False, repr=False)
    """``shortage`` and ``score`` answered per Pod shape: replicas of one workload ask the same question of
    every node, and a summary lives only as long as its node's Pods do not change."""

    @classmethod
    def of(cls, topology: Topology, taken: Iterable[int]) -> FreeSummary:
        used = set(taken)
        free: dict[int, int] = dict.fromkeys(topology.zones(), 0)
        cores: dict[int, tuple[int, bool]] = {}
        for cpu in topology.cpus:
            is_free = cpu.id not in used
            free[cpu.node] += is_free
            node, whole = cores.get(cpu.core, (cpu.node, True))
            cores[cpu.core] = (node, whole and is_free)
        whole_cores: dict[int, int] = dict.fromkeys(free, 0)
        for node, whole in cores.values():
            whole_cores[node] += whole
        return cls(free, whole_cores, topology.threads_per_core(), len(topology.cpus), topology.detailed)

    def available(self, zone: int, policy: str) -> int:
        return self.whole_cores[zone] * self.threads if policy == FULL_PCPUS else self.free[zone]

    def shortage(self, count: int, policy: str, single_numa: bool) -> str | None:
        """None when ``count`` CPUs fit under ``policy``, else why not (the message NoFit carries)."""
        key = (count, policy, single_numa)
        if key not in self._shortages:
            self._shortages[key] = self._shortage(count, policy, single_numa)
        return self._shortages[key]

    def _shortage(self, count: int, policy: str, single_numa: bool) -> str | None:
        if policy == FULL_PCPUS and count % self.threads:
            return f"FullPCPUs needs a multiple of {self.threads} CPUs (threads per core); {count} asked"
        per_zone = self.whole_cores if policy == FULL_PCPUS else self.free
        scale = self.threads if policy == FULL_PCPUS else 1
        if single_numa or len(per_zone) == 1:
            if max(per_zone.values(), default=0) * scale >= count:
                return None
        elif sum(per_zone.values()) * scale >= count:
            return None
        zones = sorted(self.free)
        unit = "full cores" if policy == FULL_PCPUS and self.detailed else "CPUs"
        per = self.threads if unit == "full cores" else 1
        where = " in one NUMA node" if single_numa else ""
        zone_text = ", ".join(f"NUMA node {z} has {self.available(z, policy) // per} free" for z in zones) \
            or "the node has no CPU"
        return f"needs {count // per} {unit}{where}; {zone_text}"

    def score(self, count: int, policy: str, single_numa: bool, strategy: str) -> int:
        """0..10 for a Pod known to fit (:meth:`shortage` said None), by the strategy (pack or
        spread the zones), fragmentation breaking ties: placements that leave more whole free
        cores score higher."""
        key = (count, policy, single_numa, strategy)
        if key not in self._scores:
            self._scores[key] = self._score(count, policy, single_numa, strategy)
        return self._scores[key]

    def _score(self, count: int, policy: str, single_numa: bool, strategy: str) -> int:
        if not self.total:
            return 0
        zones = [z for z in self.free if self.available(z, policy) >= count] if single_numa else list(self.free)
        pick = min(zones, key=lambda z: (self.free[z], z)) if strategy == MOST_ALLOCATED \
            else max(zones, key=lambda z: (self.free[z], -z))
        used_after = self.total - sum(self.free.values()) + count
        fullness = used_after / self.total
        primary = fullness if strategy == MOST_ALLOCATED else 1 - fullness
        cores_used = count // self.threads if policy == FULL_PCPUS else min(count, self.whole_cores[pick])
        whole_left = (sum(self.whole_cores.values()) - cores_used) * self.threads / self.total
        return max(1, min(10, round(1 + 8 * primary + whole_left)))


def format_cpuset(cpus: Iterable[int]) -> str:
    """Linux cpuset list syntax: ``0-3,8,10-11``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = previous = None
    for cpu in ordered:
        if start is None:
            start = previous = cpu
        elif cpu == previous + 1:  # type: ignore[operator]
            previous = cpu
        else:
            parts.append(f"{start}-{previous}" if start != previous else str(start))
            start = previous = cpu
    if start is not None:
        parts.append(f"{start}-{previous}" if start != previous else str(start))
    return ",".join(parts)


def parse_cpuset(text: str) -> list[int]:
    """The CPUs of a cpuset in the kernel's list format (``cpuset.cpus``, ``format_cpuset``'s
    output); ValueError for anything else, as the kernel refuses it: an open or reversed range
    would otherwise read as some CPUs or none.

    >>> parse_cpuset("0-2,8, 10-11")
    [0, 1, 2, 8, 10, 11]
    >>> parse_cpuset("")
    []
    >>> parse_cpuset("3-1")
    Traceback (most recent call last):
    ...
    ValueError: not a cpuset: '3-1' (want e.g. 0-3,8)
    """
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise ValueError(f"not a cpuset: {text!r} (want e.g. 0-3,8)")
        cpus += list(range(int(low), int(high or low) + 1))
    return cpus


def topology_from_node(node: Mapping[str, Any], annotation_keys: Iterable[str], real_cpus: int,
                       nrt_zones: Mapping[int, int] | None = None) -> tuple[Topology, list[AnnotationProblem]]:
    """NodeResourceTopology zones when present; else the CPU-topology annotation (ours, then
    Koordinator's); else one zone of the node's real CPU count. With it, each annotation that was
    there but could not be read: an annotation written by hand or by a broken agent would
    otherwise leave the node's exclusive CPUs chosen without its cores and NUMA nodes, unsaid.

    >>> topology, problems = topology_from_node({"metadata": {"annotations": {"t": "{}"}}}, ["t"], 4)
    >>> len(topology.cpus), [str(p) for p in problems]
    (4, ["annotation t='{}' ignored: not a CPU topology (no 'detail'); the next source of the topology counts"])
    """
    if nrt_zones:
        return Topology.from_zones(nrt_zones), []
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    problems: list[AnnotationProblem] = []
    for key in annotation_keys:
        if key in annotations:
            try:
                return Topology.from_koordinator(annotations[key]), problems
            except (ValueError, KeyError, TypeError) as error:
                why = f"no {error.args[0]!r}" if isinstance(error, KeyError) else str(error)
                text = str(annotations[key])
                problems.append(AnnotationProblem(key, text if len(text) <= 60 else text[:57] + "...",
                                                  f"not a CPU topology ({why}); the next source of the topology "
                                                  "counts"))
    return Topology.flat(real_cpus), problems
