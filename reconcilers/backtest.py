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


@dataclass(frozen=True)
class CompressionPolicy:
    name: str
    source: str
    new_request: Callable[[str, float, History, float], float]
    """(resource, request, history, day start) -> the request this policy would set."""


def ours_compression(estimator: CompressionEstimator) -> Callable[[str, float, History, float], float]:
    def new_request(resource: str, request: float, history: History, now: float) -> float:
        times, values = history[resource]
        stats = summarize(list(zip(times.tolist(), values.tolist(), strict=True)), estimator.percentile, now)
        proposal = compression_proposal(resource, {"c": max(1, round(request))}, {"c": stats}, estimator)
        return float(compressed_amount(max(1, round(request)), proposal.ratio, 1))
    return new_request


def vpa_style(resource: str, request: float, history: History, now: float) -> float:
    """P90 of a histogram whose samples decay with a 24 h half-life, x 1.15 (VPA's recommender)."""
    times, values = history[resource]
    if len(values) == 0:
        return request
    weights = np.power(2.0, (times - now) / DAY)
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    index = int(np.searchsorted(cumulative, 0.9 * cumulative[-1]))
    return float(values[order][min(index, len(values) - 1)] * 1.15)


def crane_style(resource: str, request: float, history: History, now: float) -> float:
    """P99 over 7 days x 1.15 (Crane's resource recommendation)."""
    _, values = history[resource]
    if len(values) == 0:
        return request
    return float((quantile(values.tolist(), 0.99) or 0.0) * 1.15)


def static_compression(resource: str, request: float, history: History, now: float) -> float:
    return request / 2


def no_compression(resource: str, request: float, history: History, now: float) -> float:
    return request


@dataclass(frozen=True)
class OversalePolicy:
    name: str
    source: str
    ratio: Callable[[str, float, float, np.ndarray, np.ndarray], float]
    """(resource, node capacity, requested, usage history times, values) -> ratio >= 1"""


def ours_oversale(estimator: OversaleEstimator) -> Callable[[str, float, float, np.ndarray, np.ndarray], float]:
    # The backtest evaluates the steady state: the live reconciler reaches the same ratio within
    # a few passes (raises are capped at 25% per pass), so the cap is lifted here.
    steady = dataclasses.replace(estimator, stability=StabilityConfig(Decimal(0), Decimal(1000)))

    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray) -> float:
        now = float(times[-1]) + SLOT if len(times) else 0.0
        stats = summarize(list(zip(times.tolist(), values.tolist(), strict=True)), steady.percentile, now)
        return float(oversale_proposal(resource, round(requested), round(capacity), stats, Decimal(1), steady).ratio)
    return ratio


def katalyst_realtime(resource: str, capacity: float, requested: float, times: np.ndarray,
                      values: np.ndarray, target: float = 0.6, e: float = 0.4) -> float:
    """Katalyst's realtime oversale ratio max(1, ((A*T - U) / max(min(U/R, 1), E) + R) / A), with U
    the latest usage."""
    if len(values) == 0 or requested <= 0:
        return 1.0
    usage = float(values[-1])
    return max(1.0, ((capacity * target - usage) / max(min(usage / requested, 1.0), e) + requested) / capacity)


def static_oversale(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray) -> float:
    return 1.5


# ---- packing and replay ---------------------------------------------------------------------

def first_fit_decreasing(items: list[tuple[float, float]], capacities: Callable[[int], tuple[float, float]]
                         ) -> list[int]:
    """Bin index per item, items placed largest first (by their larger share of a bin), each in
    the first open bin with room for both resources. ``capacities(i)`` is bin i's (cpu, memory)."""
    unit_cpu, unit_memory = capacities(0)
    order = sorted(range(len(items)), key=lambda i: -max(items[i][0] / unit_cpu, items[i][1] / unit_memory))
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
            cap_cpu, cap_memory = capacities(len(free))
            free.append([cap_cpu - cpu, cap_memory - memory])  # an item larger than a bin gets its own
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
    tallies = {name: Tally() for name in [*(p.name for p in compression), *(p.name for p in oversale)]}
    node_week: dict[str, Any] = {}
    for number, day in enumerate(days, 1):
        began = time.perf_counter()
        day_start, day_end = day * DAY, (day + 1) * DAY
        slots = np.arange(day_start // SLOT, day_end // SLOT)
        active = [w for w in workloads if ((w.slots >= slots[0]) & (w.slots <= slots[-1])).any()]
        usage = {r: np.zeros((len(active), len(slots))) for r in RESOURCES}
        requests = {r: np.zeros(len(active)) for r in RESOURCES}
        present = np.zeros((len(active), len(slots)), dtype=bool)
        histories: list[History] = []
        for index, workload in enumerate(active):
            today = (workload.slots >= slots[0]) & (workload.slots <= slots[-1])
            columns = workload.slots[today] - slots[0]
            present[index, columns] = True
            past = (workload.slots < slots[0]) & (workload.slots >= slots[0] - config.window_days * DAY // SLOT)
            histories.append({r: ((workload.slots[past] * SLOT).astype(np.float64), workload.usage[r][past])
                              for r in RESOURCES})
            for resource in RESOURCES:
                usage[resource][index, columns] = workload.usage[resource][today]
                requests[resource][index] = float(workload.request[resource][today].max())
        for squeeze in compression:
            new = {r: np.array([squeeze.new_request(r, float(requests[r][i]), histories[i], float(day_start))
                                for i in range(len(active))]) for r in RESOURCES}
            items = list(zip(new[CPU].tolist(), new[MEMORY].tolist(), strict=True))
            assignment = first_fit_decreasing(items, lambda _: real)
            tally = tallies[squeeze.name]
            tally.replay(assignment, usage, real)
            for resource in RESOURCES:
                over = (usage[resource] > new[resource][:, None] + 1e-6) & present
                tally.above_request[resource] += int(over.sum())
                tally.workload_samples[resource] += int(present.sum())
        baseline_items = list(zip(requests[CPU].tolist(), requests[MEMORY].tolist(), strict=True))
        baseline = first_fit_decreasing(baseline_items, lambda _: real)
        for oversell in oversale:
            ratios = _node_ratios(oversell, baseline, requests, histories, real)

            def oversold(node: int, ratios: list[tuple[float, float]] = ratios) -> tuple[float, float]:
                # Bins beyond the baseline's count take the last node's ratio.
                cpu_ratio, memory_ratio = ratios[min(node, len(ratios) - 1)]
                return real[0] * cpu_ratio, real[1] * memory_ratio

            assignment = first_fit_decreasing(baseline_items, oversold)
            tally = tallies[oversell.name]
            tally.replay(assignment, usage, real)
            if number > len(days) - 7:  # the last week: the busiest node of each day's packing
                _extend_node_week(node_week.setdefault(oversell.name, {}), assignment, usage, ratios, real, slots)
        progress(f"day {number}/{len(days)} ({len(active)} workloads) in {time.perf_counter() - began:.1f}s")
    return {"days": len(days), "tallies": tallies, "node_week": node_week}


def _node_ratios(policy: OversalePolicy, baseline: list[int], requests: dict[str, np.ndarray],
                 histories: list[History], real: tuple[float, float]) -> list[tuple[float, float]]:
    """Per baseline node: the policy's ratio from that node's own history (its workloads' usage summed)."""
    nodes = max(baseline) + 1
    ratios = []
    for node in range(nodes):
        members = [i for i, n in enumerate(baseline) if n == node]
        pair = []
        for position, resource in enumerate(RESOURCES):
            requested = float(sum(requests[resource][i] for i in members))
            series: dict[float, float] = {}
            for i in members:
                times, values = histories[i][resource]
                for t, v in zip(times.tolist(), values.tolist(), strict=True):
                    series[t] = series.get(t, 0.0) + v
            times_sorted = np.array(sorted(series))
            values_sorted = np.array([series[t] for t in times_sorted])
            pair.append(policy.ratio(resource, real[position], requested, times_sorted, values_sorted))
        ratios.append((pair[0], pair[1]))
    return ratios or [(1.0, 1.0)]


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
            "kind": "compression" if policy in compression else "oversale",
            "source": policy.source,
            "nodes_per_day": round(tally.node_days / result["days"], 2),
            "capacity_freed": round(1 - tally.node_days / base_nodes, 4) if base_nodes else 0.0,
        }
        for resource in RESOURCES:
            samples = max(tally.node_samples[resource], 1)
            row[f"{resource}_violation_rate"] = round(tally.violations[resource] / samples, 5)
            if policy in compression:
                row[f"{resource}_above_request"] = round(
                    tally.above_request[resource] / max(tally.workload_samples[resource], 1), 4)
        rows.append(row)
    return rows


def write_report(out: Path, rows: list[dict[str, Any]], result: dict[str, Any], trace: Path, config: Config) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"trace": str(trace), "days_evaluated": result["days"],
                                                  "config": config.__dict__, "policies": rows}, indent=2) + "\n")
    lines = [
        "# Backtest report", "",
        f"Trace `{trace.name}`, {result['days']} days evaluated after a {config.warmup_days}-day warm-up. Each day's "
        f"requests come only from history before that day ({config.window_days}-day window). Workloads are packed "
        f"first-fit decreasing on nodes of {config.node_cpu_cores:g} cores and "
        f"{config.node_memory_bytes / GIB:g} GiB; usage is replayed every 5 minutes.", "",
        "- **capacity freed**: 1 - nodes needed / nodes needed without compression or overselling.",
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
    lines += ["", "![capacity freed vs violations](savings_vs_violations.png)", "",
              "![one node: usage against real and oversold capacity](node_week.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    _plots(out, rows, result)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.2%}"


def _plots(out: Path, rows: list[dict[str, Any]], result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for axis, resource in zip(axes, RESOURCES, strict=True):
        for row in rows:
            marker = "o" if row["kind"] == "compression" else "s"
            axis.scatter(row[f"{resource}_violation_rate"] * 100, row["capacity_freed"] * 100, marker=marker)
            axis.annotate(row["policy"], (row[f"{resource}_violation_rate"] * 100, row["capacity_freed"] * 100),
                          fontsize=8, xytext=(4, 4), textcoords="offset points")
        axis.set_xlabel(f"{resource} violation rate (% of node-samples over real capacity)")
        axis.set_ylabel("capacity freed (% of nodes)")
        axis.set_title(f"Savings vs {resource} violations (o compression, s oversale)")
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


def default_policies(compression_estimator: CompressionEstimator, oversale_estimator: OversaleEstimator
                     ) -> tuple[list[CompressionPolicy], list[OversalePolicy]]:
    compression = [
        CompressionPolicy("none", "no compression (baseline)", no_compression),
        CompressionPolicy("oversale", f"this project: P{round(compression_estimator.percentile * 100)} x "
                          f"{1 + compression_estimator.margin}, memory at least the peak, confidence over "
                          f"{compression_estimator.full_confidence_seconds / DAY:g} days",
                          ours_compression(compression_estimator)),
        CompressionPolicy("vpa-style",
                          "Kubernetes VPA recommender: P90 of a decaying histogram, 24 h half-life, x 1.15", vpa_style),
        CompressionPolicy("crane-style", "Crane: P99 over 7 days x 1.15", crane_style),
        CompressionPolicy("static-2", "static compression ratio 2", static_compression),
    ]
    oversale = [
        OversalePolicy("oversale-nodes", f"this project: target {oversale_estimator.cpu_target} cpu / "
                       f"{oversale_estimator.memory_target} memory x requested / P"
                       f"{round(oversale_estimator.percentile * 100)}, max {oversale_estimator.cpu_max_ratio} / "
                       f"{oversale_estimator.memory_max_ratio}, safe floor", ours_oversale(oversale_estimator)),
        OversalePolicy("katalyst-realtime", "Katalyst: max(1, ((A*T - U)/max(min(U/R, 1), E) + R)/A), T=0.6, E=0.4",
                       katalyst_realtime),
        OversalePolicy("static-1.5", "static oversale ratio 1.5", static_oversale),
    ]
    return compression, oversale


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
