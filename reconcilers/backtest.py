"""Backtest: how much capacity the ratio policies free on a real trace, and at what risk.

Replays a trace of (workload, time, requested, used) through the *same* estimator functions the
live reconcilers run (``oversale.estimator``), day by day, honestly: each day's ratios come only
from history before that day. Peers run in the same pass with the same packing.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from oversale.compression import compressed_amount
from oversale.estimator import (
    CompressionEstimator,
    OversaleEstimator,
    StabilityConfig,
    UsageStats,
    compression_proposal,
    oversale_proposal,
    quantile,
    summarize,
)
from oversale.quantity import CPU, MEMORY, RESOURCES

SLOT = 300
"""Seconds per sample slot (the traces sample every 5 minutes)."""
DAY = 86400
GIB = 2**30
MILLI = 1000  # cpu amounts are kept in millicores, as everywhere else in oversale


class TraceError(ValueError):
    """The trace cannot be read (wrong format, missing columns, no usable rows)."""


@dataclass
class Workload:
    """One workload's samples, sorted, de-duplicated, powered-off rows dropped."""

    name: str
    slots: np.ndarray
    request: dict[str, np.ndarray]
    usage: dict[str, np.ndarray]


# ---- reading traces -------------------------------------------------------------------------

def read_trace(path: Path, fmt: str, progress: Callable[[str], None] = lambda m: None) -> list[Workload]:
    """``bitbrains-long`` (the GWA-T-12 long CSV) or ``generic`` (workload,timestamp_s,
    cpu_request_cores,cpu_usage_cores,memory_request_bytes,memory_usage_bytes)."""
    rows: dict[str, dict[int, tuple[float, float, float, float]]] = {}
    opener = gzip.open if path.suffix == ".gz" else open
    read = 0
    try:
        with opener(path, "rt", newline="") as handle:
            reader = csv.DictReader(handle)
            parse = _bitbrains_row if fmt == "bitbrains-long" else _generic_row
            for row in reader:
                read += 1
                if read % 500000 == 0:
                    progress(f"read {read:,} rows")
                parsed = parse(row)
                if parsed is None:
                    continue
                name, ts, values = parsed
                rows.setdefault(name, {})[ts // SLOT] = values  # one sample per slot: the last wins
    except (OSError, KeyError, ValueError, csv.Error) as error:
        raise TraceError(f"{path}: not a {fmt} trace ({error})") from None
    if not rows:
        raise TraceError(f"{path}: no usable rows")
    workloads = []
    for name, by_slot in rows.items():
        slots = np.array(sorted(by_slot), dtype=np.int64)
        table = np.array([by_slot[s] for s in slots], dtype=np.float64)
        workloads.append(Workload(name, slots,
                                  {CPU: table[:, 0] * MILLI, MEMORY: table[:, 2]},
                                  {CPU: table[:, 1] * MILLI, MEMORY: table[:, 3]}))
    progress(f"{read:,} rows, {len(workloads)} workloads")
    return workloads


def _bitbrains_row(row: dict[str, str]) -> tuple[str, int, tuple[float, float, float, float]] | None:
    cores = float(row["cpu_cores"])
    capacity_mhz = float(row["cpu_capacity_provisioned_mhz"])
    if cores <= 0 or capacity_mhz <= 0:
        return None  # powered off
    per_core = capacity_mhz / cores
    return (row["vm_id"], int(float(row["timestamp_s"])),
            (cores, float(row["cpu_usage_mhz"]) / per_core,
             float(row["memory_capacity_provisioned_kb"]) * 1024, float(row["memory_usage_kb"]) * 1024))


def _generic_row(row: dict[str, str]) -> tuple[str, int, tuple[float, float, float, float]] | None:
    cpu_request = float(row["cpu_request_cores"])
    if cpu_request <= 0:
        return None
    return (row["workload"], int(float(row["timestamp_s"])),
            (cpu_request, float(row["cpu_usage_cores"]), float(row["memory_request_bytes"]),
             float(row["memory_usage_bytes"])))


# ---- policies -------------------------------------------------------------------------------

History = dict[str, tuple[np.ndarray, np.ndarray]]
"""resource -> (timestamps in seconds, usage) before the evaluated day"""


def _usage_stats(times: np.ndarray, values: np.ndarray, percentile: float, now: float) -> UsageStats:
    """The estimator's own summary of a history given as arrays."""
    return summarize(list(zip(times.tolist(), values.tolist(), strict=True)), percentile, now)


NewRequest = Callable[[str, float, History, float], float]
"""(resource, request, history, day start) -> the request a compression policy would set."""


@dataclass(frozen=True)
class CompressionPolicy:
    name: str
    source: str
    new_request: NewRequest
    family: str = ""
    """Variants of one policy with a different knob share a family (a curve on the frontier plot)."""


def ours_compression(estimator: CompressionEstimator, raise_up_to: float = 1.0) -> NewRequest:
    """This project's compression. ``raise_up_to`` > 1 answers a what-if the product does not
    offer (its webhook never raises a request): a workload whose demand exceeds its request gets
    the demand, at most ``raise_up_to`` x the request."""
    def new_request(resource: str, request: float, history: History, now: float) -> float:
        times, values = history[resource]
        stats = _usage_stats(times, values, estimator.percentile, now)
        original = max(1, round(request))
        proposal = compression_proposal(resource, {"c": original}, {"c": stats}, estimator)
        compressed = compressed_amount(original, proposal.ratio, 1)
        if proposal.demand is not None and proposal.demand > original:
            return float(min(math.ceil(proposal.demand), math.floor(original * raise_up_to)))
        return float(compressed)
    return new_request


def vpa_style(multiplier: float = 1.15) -> NewRequest:
    """P90 of a histogram whose samples decay with a 24 h half-life, x 1.15 (VPA's recommender)."""
    def new_request(resource: str, request: float, history: History, now: float) -> float:
        times, values = history[resource]
        if len(values) == 0:
            return request
        weights = np.power(2.0, (times - now) / DAY)
        order = np.argsort(values)
        cumulative = np.cumsum(weights[order])
        index = int(np.searchsorted(cumulative, 0.9 * cumulative[-1]))
        return float(values[order][min(index, len(values) - 1)] * multiplier)
    return new_request


def crane_style(multiplier: float = 1.15) -> NewRequest:
    """P99 over 7 days x 1.15 (Crane's resource recommendation)."""
    def new_request(resource: str, request: float, history: History, now: float) -> float:
        _, values = history[resource]
        if len(values) == 0:
            return request
        return float((quantile(values.tolist(), 0.99) or 0.0) * multiplier)
    return new_request


def static_compression(ratio: float = 2) -> NewRequest:
    def new_request(resource: str, request: float, history: History, now: float) -> float:
        return request / ratio
    return new_request


def never_above_original(policy: NewRequest) -> NewRequest:
    """A peer as it would act through this project's webhook, which never raises a request."""
    def new_request(resource: str, request: float, history: History, now: float) -> float:
        return min(request, policy(resource, request, history, now))
    return new_request


def no_compression(resource: str, request: float, history: History, now: float) -> float:
    return request


OversaleRatio = Callable[[str, float, float, np.ndarray, np.ndarray, float], float]
"""(resource, node capacity, requested, usage history times, values, current ratio) -> ratio >= 1"""


@dataclass(frozen=True)
class OversalePolicy:
    name: str
    source: str
    ratio: OversaleRatio
    family: str = ""


def ours_oversale(estimator: OversaleEstimator) -> OversaleRatio:
    # The backtest evaluates the steady state: the live reconciler reaches the same ratio within
    # a few passes (raises are capped at 25% per pass), so the cap is lifted here.
    steady = dataclasses.replace(estimator, stability=StabilityConfig(Decimal(0), Decimal(1000)))

    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        now = float(times[-1]) + SLOT if len(times) else 0.0
        stats = _usage_stats(times, values, steady.percentile, now)
        return float(oversale_proposal(resource, round(requested), round(capacity), stats,
                                       Decimal(str(current)), steady).ratio)
    return ratio


def katalyst_realtime(target: float = 0.6, e: float = 0.4) -> OversaleRatio:
    """Katalyst's realtime oversale ratio max(1, ((A*T - U) / max(min(U/R, 1), E) + R) / A), with U
    the latest usage."""
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        if len(values) == 0 or requested <= 0:
            return 1.0
        usage = float(values[-1])
        return max(1.0, ((capacity * target - usage) / max(min(usage / requested, 1.0), e) + requested) / capacity)
    return ratio


def capped_at(policy: OversaleRatio, cpu_max: float, memory_max: float) -> OversaleRatio:
    """A peer's ratio clamped to maxima, as this project's node webhook clamps any ratio."""
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        wanted = policy(resource, capacity, requested, times, values, current)
        return min(wanted, cpu_max if resource == CPU else memory_max)
    return ratio


def static_oversale(value: float = 1.5) -> OversaleRatio:
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        return value
    return ratio


# ---- packing and replay ---------------------------------------------------------------------

def _largest_first(items: list[tuple[float, float]], capacity: tuple[float, float]) -> list[int]:
    """Item indexes by decreasing size, an item's size being its larger share of a node: both
    packers use this order, so compression and overselling are compared on the same footing."""
    return sorted(range(len(items)), key=lambda i: -max(items[i][0] / capacity[0], items[i][1] / capacity[1]))


def first_fit_decreasing(items: list[tuple[float, float]], capacity: tuple[float, float]) -> list[int]:
    """Bin index per item, items placed largest first (by their larger share of a bin), each in
    the first open bin with room for both resources."""
    order = _largest_first(items, capacity)
    free: list[list[float]] = []
    placed = [0] * len(items)
    for index in order:
        cpu, memory = items[index]
        for number, room in enumerate(free):
            if cpu <= room[0] + 1e-9 and memory <= room[1] + 1e-9:
                room[0] -= cpu
                room[1] -= memory
                placed[index] = number
                break
        else:
            free.append([capacity[0] - cpu, capacity[1] - memory])  # an item larger than a bin gets its own
            placed[index] = len(free) - 1
    return placed


@dataclass
class Tally:
    """Accumulated figures of one policy over the evaluated days."""

    node_days: float = 0.0
    node_samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    workload_samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    above_request: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))

    def replay(self, assignment: list[int], usage: dict[str, np.ndarray], real: tuple[float, float]) -> None:
        """Sum usage per node for every slot of the day; count (node, slot) pairs over real capacity."""
        nodes = max(assignment) + 1 if assignment else 0
        self.node_days += nodes
        onehot = np.zeros((nodes, len(assignment)))
        onehot[assignment, np.arange(len(assignment))] = 1.0
        for position, resource in enumerate(RESOURCES):
            per_node = onehot @ usage[resource]  # nodes x slots
            self.violations[resource] += int((per_node > real[position] + 1e-6).sum())
            self.node_samples[resource] += per_node.size


@dataclass(frozen=True)
class Config:
    node_cpu_cores: float = 32
    node_memory_bytes: float = 256 * GIB
    warmup_days: int = 7
    window_days: int = 7


def run(workloads: list[Workload], config: Config, compression: list[CompressionPolicy],
        oversale: list[OversalePolicy], progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    real = (config.node_cpu_cores * MILLI, config.node_memory_bytes)
    first = min(int(w.slots[0]) for w in workloads) * SLOT
    last = max(int(w.slots[-1]) for w in workloads) * SLOT
    start_day = first // DAY + config.warmup_days
    days = list(range(start_day, last // DAY + 1))
    if not days:
        raise TraceError(f"the trace spans less than the {config.warmup_days}-day warm-up")
    names = [*(p.name for p in compression), *(p.name for p in oversale)]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names must be unique: {sorted(n for n in set(names) if names.count(n) > 1)}")
    tallies = {name: Tally() for name in names}
    node_week: dict[str, Any] = {}
    for number, day in enumerate(days, 1):
        began = time.perf_counter()
        day_start, day_end = day * DAY, (day + 1) * DAY
        slots = np.arange(day_start // SLOT, day_end // SLOT)
        active = [w for w in workloads if ((w.slots >= slots[0]) & (w.slots <= slots[-1])).any()]
        usage = {r: np.zeros((len(active), len(slots))) for r in RESOURCES}
        requests = {r: np.zeros(len(active)) for r in RESOURCES}
        present = np.zeros((len(active), len(slots)), dtype=bool)
        window = _window_grid(active, int(slots[0]), config.window_days * DAY // SLOT)
        histories: list[History] = [{r: (window.times[seen], window.usage[r][index][seen]) for r in RESOURCES}
                                    for index, seen in enumerate(window.present)]
        for index, workload in enumerate(active):
            today = (workload.slots >= slots[0]) & (workload.slots <= slots[-1])
            columns = workload.slots[today] - slots[0]
            present[index, columns] = True
            for resource in RESOURCES:
                usage[resource][index, columns] = workload.usage[resource][today]
                requests[resource][index] = float(workload.request[resource][today].max())
        for squeeze in compression:
            new = {r: np.array([squeeze.new_request(r, float(requests[r][i]), histories[i], float(day_start))
                                for i in range(len(active))]) for r in RESOURCES}
            items = list(zip(new[CPU].tolist(), new[MEMORY].tolist(), strict=True))
            assignment = first_fit_decreasing(items, real)
            tally = tallies[squeeze.name]
            tally.replay(assignment, usage, real)
            for resource in RESOURCES:
                over = (usage[resource] > new[resource][:, None] + 1e-6) & present
                tally.above_request[resource] += int(over.sum())
                tally.workload_samples[resource] += int(present.sum())
        original = list(zip(requests[CPU].tolist(), requests[MEMORY].tolist(), strict=True))
        for oversell in oversale:
            assignment, ratios = pack_oversold(original, window, oversell, real)
            tally = tallies[oversell.name]
            tally.replay(assignment, usage, real)
            if number > len(days) - 7:  # the last week: the busiest node of each day's packing
                _extend_node_week(node_week.setdefault(oversell.name, {}), assignment, usage, ratios, real, slots)
        progress(f"day {number}/{len(days)} ({len(active)} workloads) in {time.perf_counter() - began:.1f}s")
    return {"days": len(days), "tallies": tallies, "node_week": node_week}


@dataclass
class Window:
    """The history window before a day on one 5-minute grid: usage per workload (0 where absent)."""

    times: np.ndarray
    """Seconds, one per slot."""
    usage: dict[str, np.ndarray]
    """resource -> workloads x slots"""
    present: np.ndarray
    """workloads x slots: the workload has a sample there."""


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


@dataclass
class _OversoldNode:
    ratio: list[float]
    requested: list[float]
    usage: list[np.ndarray]
    present: np.ndarray


def pack_oversold(items: list[tuple[float, float]], window: Window, policy: OversalePolicy,
                  real: tuple[float, float]) -> tuple[list[int], list[tuple[float, float]]]:
    """Node overselling as a closed loop: workloads arrive largest first and go to the first node
    whose oversold allocatable (``real x ratio``) has room for both resources; after each arrival
    the policy recomputes that node's ratio from its members' summed history and its new requested
    total, as the reconciler would on its next pass. So each ratio comes from the node's own
    history, and a policy that keeps adding room to a node which is already busy packs it ever
    fuller (and shows it in the violation rate). Returns the node of every item and the final
    (cpu, memory) ratio of every node."""
    order = _largest_first(items, real)
    nodes: list[_OversoldNode] = []
    placed = [0] * len(items)
    for index in order:
        item = items[index]
        number = next((n for n, node in enumerate(nodes)
                       if all(node.requested[k] + item[k] <= real[k] * node.ratio[k] + 1e-6 for k in (0, 1))), None)
        if number is None:  # a new node; an item larger than a node gets one of its own
            nodes.append(_OversoldNode([1.0, 1.0], [0.0, 0.0], [np.zeros(window.present.shape[1]) for _ in RESOURCES],
                                       np.zeros(window.present.shape[1], dtype=bool)))
            number = len(nodes) - 1
        node = nodes[number]
        placed[index] = number
        node.present |= window.present[index]
        for k, resource in enumerate(RESOURCES):
            node.requested[k] += item[k]
            node.usage[k] += window.usage[resource][index]
            node.ratio[k] = policy.ratio(resource, real[k], node.requested[k], window.times[node.present],
                                         node.usage[k][node.present], node.ratio[k])
    return placed, [(node.ratio[0], node.ratio[1]) for node in nodes]


def _extend_node_week(series: dict[str, Any], assignment: list[int], usage: dict[str, np.ndarray],
                      ratios: list[tuple[float, float]], real: tuple[float, float], slots: np.ndarray) -> None:
    """Append one day of the day's busiest node (highest total cpu usage) to ``series``."""
    nodes = max(assignment) + 1
    totals = [sum(float(usage[CPU][i].sum()) for i, n in enumerate(assignment) if n == node) for node in range(nodes)]
    busiest = totals.index(max(totals))
    members = [i for i, n in enumerate(assignment) if n == busiest]
    series.setdefault("slots", []).extend(slots.tolist())
    series.setdefault("cpu_usage", []).extend(usage[CPU][members].sum(axis=0).tolist())
    series.setdefault("oversold_cpu", []).extend([real[0] * ratios[min(busiest, len(ratios) - 1)][0]] * len(slots))
    series["real_cpu"] = real[0]


# ---- report -----------------------------------------------------------------------------------

def summary(result: dict[str, Any], compression: list[CompressionPolicy], oversale: list[OversalePolicy],
            baseline: str = "none") -> list[dict[str, Any]]:
    tallies: dict[str, Tally] = result["tallies"]
    base_nodes = tallies[baseline].node_days
    rows = []
    policies: list[CompressionPolicy | OversalePolicy] = [*compression, *oversale]
    for policy in policies:
        tally = tallies[policy.name]
        row: dict[str, Any] = {
            "policy": policy.name,
            "kind": "compression" if isinstance(policy, CompressionPolicy) else "node oversale",
            "family": policy.family or policy.name,
            "source": policy.source,
            "nodes_per_day": round(tally.node_days / result["days"], 2),
            "capacity_freed": round(1 - tally.node_days / base_nodes, 4) if base_nodes else 0.0,
        }
        for resource in RESOURCES:
            samples = max(tally.node_samples[resource], 1)
            row[f"{resource}_violation_rate"] = round(tally.violations[resource] / samples, 5)
            if isinstance(policy, CompressionPolicy):
                row[f"{resource}_above_request"] = round(
                    tally.above_request[resource] / max(tally.workload_samples[resource], 1), 4)
        rows.append(row)
    return rows


OURS = {"compression": ("oversale-pods", "oversale-pods-if-raising"), "node oversale": ("oversale-nodes",)}
"""kind -> the families of this project's policy (the what-if family is not a product mode)"""


def frontier(rows: list[dict[str, Any]], resource: str = CPU) -> list[dict[str, Any]]:
    """Each peer's point against this project's curve: the capacity our policy frees at the peer's
    violation rate, read off our variants (plus the no-compression point, which is our policy at
    ratio 1) joined by straight lines, i.e. running two of our settings on parts of the fleet.
    A peer is matched when we free at least as much at that violation rate."""
    key = f"{resource}_violation_rate"
    verdicts = []
    for kind, families in OURS.items():
        for ours in families:
            curve = sorted((row[key], row["capacity_freed"]) for row in rows
                           if row["family"] == ours or row["policy"] == "none")
            if len(curve) < 2:
                continue  # that family did not run
            envelope: list[tuple[float, float]] = []  # the most freed at or below each violation rate
            for violation, freed in curve:
                if not envelope or freed > envelope[-1][1]:
                    envelope.append((violation, freed))
            for row in rows:
                if row["kind"] != kind or row["family"] in (*families, "none"):
                    continue
                at = _freed_at(envelope, row[key])
                verdicts.append({"kind": kind, "ours": ours, "peer": row["policy"],
                                 "peer_freed": row["capacity_freed"], "violation_rate": row[key],
                                 "ours_freed": None if at is None else round(at, 4),
                                 "matched": at is not None and at >= row["capacity_freed"]})
    return verdicts


def _freed_at(envelope: list[tuple[float, float]], violation: float) -> float | None:
    below = [point for point in envelope if point[0] <= violation]
    if not below:
        return None  # every setting of ours violates more than this
    left = below[-1]
    above = [point for point in envelope if point[0] > violation]
    if not above:
        return left[1]
    right = above[0]
    return left[1] + (right[1] - left[1]) * (violation - left[0]) / (right[0] - left[0])


def write_report(out: Path, rows: list[dict[str, Any]], result: dict[str, Any], trace: Path, config: Config) -> None:
    out.mkdir(parents=True, exist_ok=True)
    verdicts = frontier(rows)
    (out / "summary.json").write_text(json.dumps({"trace": str(trace), "days_evaluated": result["days"],
                                                  "config": config.__dict__, "policies": rows,
                                                  "frontier_cpu": verdicts}, indent=2) + "\n")
    lines = [
        "# Backtest report", "",
        f"Trace `{trace.name}`, {result['days']} days evaluated after a {config.warmup_days}-day warm-up. Each day's "
        f"requests and ratios come only from history before that day ({config.window_days}-day window). Nodes have "
        f"{config.node_cpu_cores:g} cores and {config.node_memory_bytes / GIB:g} GiB; usage is replayed every 5 "
        "minutes.", "",
        "- **compression** policies set each workload's request; workloads are packed first-fit decreasing (both "
        "resources) by those requests on nodes of real capacity.",
        "- **node oversale** policies keep original requests and pack them, largest first, on the first node whose "
        "oversold allocatable (real x ratio) has room; after each placement the policy recomputes that node's "
        "ratio from its members' summed history, as the reconciler does on its next pass.",
        "- **capacity freed**: 1 - nodes needed / nodes needed without compression or overselling (policy "
        "`none`).",
        "- **violation rate**: share of (node, 5-minute sample) pairs whose summed usage exceeds the node's *real* "
        "capacity.",
        "- **above request**: share of workload samples using more than the request the policy set.", "",
        "| policy | kind | nodes/day | capacity freed | cpu violation rate | memory violation rate | "
        "cpu above request | memory above request | source and parameters |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(f"| {row['policy']} | {row['kind']} | {row['nodes_per_day']} | {row['capacity_freed']:.1%} | "
                     f"{row['cpu_violation_rate']:.3%} | {row['memory_violation_rate']:.3%} | "
                     f"{_pct(row.get('cpu_above_request'))} | {_pct(row.get('memory_above_request'))} | "
                     f"{row['source']} |")
    lines += ["", "## Against each peer (cpu)", "",
              "What this project frees at each peer's cpu violation rate, read off its curve (its variants in this "
              "run and the no-compression point, joined by straight lines: two settings on parts of the fleet). "
              "*Matched* means at least the peer's capacity freed at an equal or lower violation rate. "
              "`oversale-pods-if-raising` is a what-if, not a mode of this project: the same estimate, but a "
              "workload using more than it requested gets its demand (at most 2x the request), as VPA and Crane "
              "do; this project's webhook never raises a request. Run with `--frontier` to add variants of every "
              "policy along its main knob.", "",
              "| kind | our curve | peer | peer frees | at cpu violation rate | we free there | matched |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for verdict in verdicts:
        ours_there = _pct(verdict["ours_freed"], 1) or "no setting is that safe"
        lines.append(f"| {verdict['kind']} | {verdict['ours']} | {verdict['peer']} | {verdict['peer_freed']:.1%} | "
                     f"{verdict['violation_rate']:.3%} | {ours_there} | "
                     f"{'yes' if verdict['matched'] else '**no**'} |")
    lines += ["", "![capacity freed vs violations](savings_vs_violations.png)", "",
              "![one node: usage against real and oversold capacity](node_week.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    _plots(out, rows, result)


def _pct(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}%}"


def _plots(out: Path, rows: list[dict[str, Any]], result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Memory violations are near zero for every policy on the traces at hand (see the table), so
    # both panels plot cpu: one per kind, one line per family through its variants.
    figure, axes = plt.subplots(1, 2, figsize=(13, 5))
    for axis, kind in zip(axes, OURS, strict=True):
        families: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            if row["kind"] == kind:
                families.setdefault(row["family"], []).append(row)
        for family, members in families.items():
            points = sorted((r["cpu_violation_rate"] * 100, r["capacity_freed"] * 100) for r in members)
            ours = family in OURS[kind]
            axis.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=4,
                      linewidth=2.2 if ours else 1, label=family,
                      color={"oversale-pods-if-raising": "darkorange"}.get(family, "crimson") if ours else None)
            for r in members:
                if r["policy"] == family:  # label the published default of each family
                    axis.annotate(family, (r["cpu_violation_rate"] * 100, r["capacity_freed"] * 100), fontsize=7,
                                  xytext=(4, 4), textcoords="offset points")
        axis.set_xlabel("cpu violation rate (% of node-samples over real capacity)")
        axis.set_ylabel("capacity freed (% of nodes)")
        axis.set_title(f"{kind}: savings vs cpu violations (up and left is better)")
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / "savings_vs_violations.png", dpi=110)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(12, 4))
    for name, series in result["node_week"].items():
        days = (np.array(series["slots"]) - series["slots"][0]) * SLOT / DAY
        line = axis.plot(days, np.array(series["cpu_usage"]) / MILLI, label=f"{name}: usage", linewidth=0.6)
        axis.plot(days, np.array(series["oversold_cpu"]) / MILLI, linestyle=":", linewidth=1,
                  color=line[0].get_color(), label=f"{name}: oversold capacity")
        axis.axhline(series["real_cpu"] / MILLI, color="black", linewidth=1)
    axis.set_xlabel("days into the last evaluated week (the busiest node of each day's packing)")
    axis.set_ylabel("cpu cores")
    axis.set_title("One node's cpu usage over a week against its real (black) and oversold (dotted) capacity")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(out / "node_week.png", dpi=110)
    plt.close(figure)


def default_policies(compression_estimator: CompressionEstimator, oversale_estimator: OversaleEstimator,
                     frontier: bool = False) -> tuple[list[CompressionPolicy], list[OversalePolicy]]:
    """This project's policies (as configured) and the peers with their published defaults; with
    ``frontier`` also variants of each along its main knob, so every policy is a curve."""
    ours = compression_estimator
    compression = [
        CompressionPolicy("none", "no compression (baseline)", no_compression, "none"),
        CompressionPolicy("oversale-pods", f"this project: P{round(ours.percentile * 100)} x {1 + ours.margin}, "
                          f"max ratio {ours.max_ratio}, memory at least the peak, confidence over "
                          f"{ours.full_confidence_seconds / DAY:g} days", ours_compression(ours), "oversale-pods"),
        CompressionPolicy("vpa-style", "Kubernetes VPA recommender: P90 of a decaying histogram, 24 h half-life, "
                          "x 1.15", vpa_style(), "vpa-style"),
        CompressionPolicy("crane-style", "Crane: P99 over 7 days x 1.15", crane_style(), "crane-style"),
        CompressionPolicy("vpa-style-capped", "VPA-style, never above the original request (as through this "
                          "project's webhook)", never_above_original(vpa_style()), "vpa-style-capped"),
        CompressionPolicy("crane-style-capped", "Crane-style, never above the original request",
                          never_above_original(crane_style()), "crane-style-capped"),
        CompressionPolicy("static-2", "static compression ratio 2", static_compression(2), "static"),
        CompressionPolicy("oversale-pods-if-raising", "what-if, not a mode of this project: as oversale-pods, but "
                          "a workload whose demand exceeds its request gets the demand (at most 2x the request)",
                          ours_compression(ours, raise_up_to=2), "oversale-pods-if-raising"),
    ]
    nodes = oversale_estimator
    oversale = [
        OversalePolicy("oversale-nodes", f"this project: target {nodes.cpu_target} cpu / {nodes.memory_target} "
                       f"memory x requested / P{round(nodes.percentile * 100)}, max {nodes.cpu_max_ratio} / "
                       f"{nodes.memory_max_ratio}, safe floor", ours_oversale(nodes), "oversale-nodes"),
        OversalePolicy("katalyst-realtime", "Katalyst: max(1, ((A*T - U)/max(min(U/R, 1), E) + R)/A), T=0.6, E=0.4",
                       katalyst_realtime(), "katalyst-realtime"),
        OversalePolicy("katalyst-realtime-capped", f"Katalyst's formula (T=0.6) within this project's maxima "
                       f"({nodes.cpu_max_ratio} cpu / {nodes.memory_max_ratio} memory), as through its webhook",
                       capped_at(katalyst_realtime(), float(nodes.cpu_max_ratio), float(nodes.memory_max_ratio)),
                       "katalyst-realtime-capped"),
        OversalePolicy("static-oversale-1.5", "static oversale ratio 1.5", static_oversale(1.5), "static-oversale"),
    ]
    if not frontier:
        return compression, oversale
    for margin, max_ratio in (("0.4", "4"), ("0", "4"), ("0.15", "10"), ("0.15", "30")):
        squeeze = dataclasses.replace(ours, margin=Decimal(margin), max_ratio=Decimal(max_ratio))
        compression.append(CompressionPolicy(f"oversale-pods margin {margin} max {max_ratio}",
                                             "this project, margin and max ratio varied",
                                             ours_compression(squeeze), "oversale-pods"))
    for percentile, margin, max_ratio in ((0.99, "0.3", "20"), (0.99, "0.15", "4"), (0.95, "0.15", "20")):
        squeeze = dataclasses.replace(ours, percentile=percentile, margin=Decimal(margin), max_ratio=Decimal(max_ratio))
        compression.append(CompressionPolicy(
            f"oversale-pods-if-raising P{round(percentile * 100)} margin {margin} max {max_ratio}",
            "what-if, percentile, margin and max ratio varied", ours_compression(squeeze, raise_up_to=2),
            "oversale-pods-if-raising"))
    for multiplier in (1.0, 1.5, 2.0):
        compression.append(CompressionPolicy(f"vpa-style x{multiplier:g}", "VPA-style, margin varied",
                                             vpa_style(multiplier), "vpa-style"))
        compression.append(CompressionPolicy(f"crane-style x{multiplier:g}", "Crane-style, margin varied",
                                             crane_style(multiplier), "crane-style"))
    for ratio in (1.5, 3, 4):
        compression.append(CompressionPolicy(f"static-{ratio:g}", "static compression ratio", static_compression(ratio),
                                             "static"))
    # This project's node policy along its aggressiveness: cpu target and both maxima (all values
    # the settings accept; memory up to the webhook's default bound of 2, then beyond it).
    for cpu_target, cpu_max, memory_target, memory_max in (
            ("0.5", "3", "0.6", "1.2"), ("0.7", "3", "0.8", "2"), ("0.8", "5", "0.8", "2"),
            ("0.9", "10", "0.8", "2"), ("1", "10", "1", "5")):
        oversell = dataclasses.replace(nodes, cpu_target=Decimal(cpu_target), cpu_max_ratio=Decimal(cpu_max),
                                      memory_target=Decimal(memory_target), memory_max_ratio=Decimal(memory_max))
        oversale.append(OversalePolicy(f"oversale-nodes {cpu_target}/{cpu_max} {memory_target}/{memory_max}",
                                       "this project, cpu target/max and memory target/max varied",
                                       ours_oversale(oversell), "oversale-nodes"))
    for target_utilization in (0.1, 0.2, 0.4):
        oversale.append(OversalePolicy(f"katalyst-realtime T={target_utilization:g}", "Katalyst, T varied",
                                       katalyst_realtime(target_utilization), "katalyst-realtime"))
    for ratio in (1.25, 2, 2.5):
        oversale.append(OversalePolicy(f"static-oversale-{ratio:g}", "static oversale ratio", static_oversale(ratio),
                                       "static-oversale"))
    return compression, oversale


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
