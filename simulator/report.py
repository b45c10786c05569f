"""The replay's report: a table per split, this project's curve against each peer, two plots and
``summary.json`` (machine-readable: one entry per system, figures as fractions 0..1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oversale.quantity import RESOURCES
from simulator.policies import OURS, System
from simulator.replay import SPLITS, Config, Result, Tally
from simulator.trace import GIB, MILLI

BASELINE = "none"


def figures(tally: Tally, baseline: Tally) -> dict[str, Any]:
    """Capacity freed against the baseline and violation rates of one tally."""
    row: dict[str, Any] = {
        "nodes_per_day": round(tally.node_days / tally.days, 2) if tally.days else 0.0,
        "capacity_freed": round(1 - tally.node_days / baseline.node_days, 4) if baseline.node_days else 0.0,
    }
    row["evictions_per_node_day"] = round(tally.evictions / tally.node_days, 4) if tally.node_days else 0.0
    row["workload_days_moved_twice"] = tally.moved_again
    for resource in RESOURCES:
        row[f"{resource}_violation_rate"] = round(tally.violations[resource] / max(tally.node_samples[resource], 1), 6)
        row[f"{resource}_above_request"] = round(
            tally.above_request[resource] / max(tally.workload_samples[resource], 1), 5)
    return row


def summary(result: Result, systems: list[System]) -> list[dict[str, Any]]:
    """One row per system: the whole evaluated period, and each split apart."""
    base = result.tallies[BASELINE]
    rows = []
    for system in systems:
        tallies = result.tallies[system.name]
        row: dict[str, Any] = {"policy": system.name, "kind": system.kind, "ours": system.ours,
                               "family": system.family or system.name, "source": system.source}
        row |= figures(tallies["tuning"].add(tallies["holdout"]), base["tuning"].add(base["holdout"]))
        for split in SPLITS:
            row[split] = figures(tallies[split], base[split])
        rows.append(row)
    return rows


def clairvoyant_freed(result: Result, split: str | None = None) -> float:
    base = result.tallies[BASELINE]
    splits = SPLITS if split is None else (split,)
    nodes = sum(result.clairvoyant_nodes[s] for s in splits)
    baseline = sum(base[s].node_days for s in splits)
    return round(1 - nodes / baseline, 4) if baseline else 0.0


def against_peers(rows: list[dict[str, Any]], split: str, resource: str = "cpu") -> list[dict[str, Any]]:
    """Each peer's point against this project's curve: the capacity the whole system frees at the
    peer's violation rate, read off its variants (plus the baseline point, ratio 1 everywhere)
    joined by straight lines, i.e. two of its settings on parts of the fleet. A peer is matched
    when we free at least as much at that violation rate."""
    key = f"{resource}_violation_rate"
    curve = sorted((row[split][key], row[split]["capacity_freed"]) for row in rows
                   if row["family"] in (OURS, BASELINE))
    envelope: list[tuple[float, float]] = []  # the most freed at or below each violation rate
    for violation, freed in curve:
        if not envelope or freed > envelope[-1][1]:
            envelope.append((violation, freed))
    verdicts = []
    for row in rows:
        if row["ours"] or row["family"] == BASELINE:
            continue
        at = _freed_at(envelope, row[split][key])
        peer = row[split]["capacity_freed"]
        verdicts.append({"peer": row["policy"], "peer_freed": peer, "violation_rate": row[split][key],
                         "ours_freed": None if at is None else round(at, 4),
                         "ratio": None if at is None or peer <= 0 else round(at / peer, 3),
                         "matched": at is not None and at >= peer})
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


def write_report(out: Path, rows: list[dict[str, Any]], result: Result, trace: Path, config: Config) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    tuning = [d for d in result.days if result.splits[d] == "tuning"]
    holdout = [d for d in result.days if result.splits[d] == "holdout"]
    clairvoyant = {split: clairvoyant_freed(result, split) for split in SPLITS}
    data: dict[str, Any] = {
        "trace": str(trace), "days_evaluated": len(result.days),
        "tuning_days": tuning, "holdout_days": holdout,
        "config": config.__dict__, "policies": rows,
        "clairvoyant_capacity_freed": clairvoyant_freed(result),
        "clairvoyant_by_split": clairvoyant,
        "against_peers": {split: against_peers(rows, split) for split in SPLITS},
    }
    (out / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        "# Backtest report: the whole system on one simulated cluster", "",
        f"Trace `{trace.name}`: days {tuning[0] if tuning else '-'}..{tuning[-1] if tuning else '-'} are the "
        f"**tuning** days (defaults were chosen on them), days {holdout[0] if holdout else '-'}.."
        f"{holdout[-1] if holdout else '-'} the **holdout** (the last {config.holdout_days} days, never used to "
        f"choose anything); day 0 is the trace's first, days 0..{config.warmup_days - 1} only give history. Each "
        f"day's requests and ratios come only from the {config.window_days} days before it. Nodes have "
        f"{config.node_cpu_cores:g} cores and {config.node_memory_bytes / GIB:g} GiB; usage is replayed every 5 "
        "minutes.", "",
        "- Every system runs on the same cluster model: its request policy sets each workload's request; Pods "
        "arrive largest first and the extender's own filter and score (`oversale.placement`) choose among open "
        "nodes, a node being added when none fits; after each arrival the system's node policy recomputes that "
        "node's ratio from its members' summed history.",
        "- **capacity freed**: 1 - node-days needed / node-days of `none` (original requests, no overselling).",
        "- **violation rate**: share of (node, 5-minute sample) pairs whose summed usage exceeds the node's *real* "
        "capacity.",
        "- **above request**: share of workload samples using more than the request the system set (throttled "
        "beyond the request under contention).",
        "- **evictions/node-day**: Pods the remediation step moved, per node-day (only systems with remediation).",
        f"- **clairvoyant bound**: each day's real peak of summed usage, perfectly divisible: "
        f"{clairvoyant['tuning']:.1%} freed on the tuning days, {clairvoyant['holdout']:.1%} on the holdout.", "",
    ]
    for split in SPLITS:
        lines += [f"## {split.capitalize()} days", "",
                  "| system | kind | ours | nodes/day | capacity freed | cpu violation rate | memory violation rate | "
                  "cpu above request | memory above request | evictions/node-day | source and parameters |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            f = row[split]
            lines.append(f"| {row['policy']} | {row['kind']} | {'yes' if row['ours'] else ''} | {f['nodes_per_day']} | "
                         f"{f['capacity_freed']:.1%} | {f['cpu_violation_rate']:.3%} | "
                         f"{f['memory_violation_rate']:.3%} | {f['cpu_above_request']:.2%} | "
                         f"{f['memory_above_request']:.2%} | {f['evictions_per_node_day']:.3f} | {row['source']} |")
        lines += ["", f"### Against each peer ({split}, cpu)", "",
                  f"What `{OURS}` frees at each peer's cpu violation rate, read off its curve (its cpu-target "
                  "variants and the baseline, joined by straight lines). *Matched*: at least the peer's capacity "
                  "at an equal or lower violation rate.", "",
                  "| peer | peer frees | at cpu violation rate | we free there | ours / peer | matched |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for verdict in data["against_peers"][split]:
            there = "no setting is that safe" if verdict["ours_freed"] is None else f"{verdict['ours_freed']:.1%}"
            ratio = "" if verdict["ratio"] is None else f"{verdict['ratio']:.2f}x"
            lines.append(f"| {verdict['peer']} | {verdict['peer_freed']:.1%} | {verdict['violation_rate']:.3%} | "
                         f"{there} | {ratio} | {'yes' if verdict['matched'] else '**no**'} |")
        lines.append("")
    lines += ["![capacity freed against cpu violations](savings_vs_violations.png)", "",
              "![the busiest node of the last day, per system](node_day.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    _plots(out, rows, result, data)
    return data


def _plots(out: Path, rows: list[dict[str, Any]], result: Result, data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = "os^vD<>pP*Xh"
    families = list(dict.fromkeys(row["family"] for row in rows))
    palette = [plt.get_cmap("tab10")(i) for i in (0, 1, 2, 4, 5, 6, 7, 8, 9)]  # no red: red is ours
    colours: dict[str, Any] = {family: palette[i % len(palette)]
                               for i, family in enumerate(f for f in families if f != OURS)}
    colours[OURS] = "crimson"
    figure, axes = plt.subplots(1, 2, figsize=(14, 5.5), sharey=True)
    floor = 1e-3  # % of node-samples: a zero violation rate is drawn here on the log axis
    for axis, split in zip(axes, SPLITS, strict=True):
        for number, family in enumerate(families):
            members = [r for r in rows if r["family"] == family]
            points = sorted((max(r[split]["cpu_violation_rate"] * 100, floor), r[split]["capacity_freed"] * 100)
                            for r in members)
            ours = family == OURS
            axis.plot([x for x, _ in points], [y for _, y in points], marker=markers[number % len(markers)],
                      markersize=7 if ours else 5, linewidth=(2.5 if ours else 1) if len(points) > 1 else 0,
                      color=colours[family], zorder=3 if ours else 2)
            label = next(r for r in members if r["policy"] == family) if any(
                r["policy"] == family for r in members) else members[0]  # the published default
            x = max(label[split]["cpu_violation_rate"] * 100, floor)
            y = label[split]["capacity_freed"] * 100
            # Our own variants (load-aware) sit next to our curve: their labels go below it.
            below = members[0]["ours"] and not ours
            axis.annotate(family, (x, y), fontsize=8, xytext=(5, -11 if below else 3), textcoords="offset points",
                          color=colours[family], fontweight="bold" if ours else "normal",
                          ha="right" if x > 8 else "left")
        axis.axhline(data["clairvoyant_by_split"][split] * 100, color="grey", linestyle="--", linewidth=1)
        axis.annotate("clairvoyant bound", (0.01, data["clairvoyant_by_split"][split] * 100), fontsize=8,
                      xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points", color="grey")
        axis.set_xscale("log")
        axis.set_xlabel("cpu violation rate, % of node-samples over real capacity (log; 0 drawn at 0.001)")
        axis.set_title(f"{split} days: capacity freed vs cpu violations (up and left is better)", fontsize=10)
        axis.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("capacity freed (% of the baseline's node-days)")
    figure.tight_layout()
    figure.savefig(out / "savings_vs_violations.png", dpi=110)
    plt.close(figure)

    shown = [name for name in (OURS, "crane-style", "vpa-style", "crane-style+katalyst") if name in result.node_day]
    figure, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 4), squeeze=False)
    for axis, name in zip(axes[0], shown, strict=True):
        node = result.node_day[name]
        real = node["cpu_real"] / MILLI
        axis.plot(node["hours"], [u / MILLI for u in node["cpu_usage"]], color="tab:blue", linewidth=0.9,
                  label="usage")
        axis.axhline(real, color="black", linewidth=1.2, label="real capacity")
        axis.axhline(node["cpu_requested"] / MILLI, color="tab:green", linestyle="--", linewidth=1,
                     label="requested")
        axis.axhline(node["cpu_oversold"] / MILLI, color="tab:orange", linestyle=":", linewidth=1.5,
                     label="oversold allocatable")
        axis.set_ylim(0, max(real, node["cpu_oversold"] / MILLI, node["cpu_requested"] / MILLI,
                             max(node["cpu_usage"]) / MILLI) * 1.1)
        axis.set_title(f"{name}: node {node['node']} ({node['workloads']} workloads)", fontsize=9)
        axis.set_xlabel("hour of the last evaluated day")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("cpu cores")
    axes[0][0].legend(fontsize=7, loc="lower left")
    figure.suptitle("The busiest node (by cpu usage) of each system on the last day", fontsize=10)
    figure.tight_layout()
    figure.savefig(out / "node_day.png", dpi=110)
    plt.close(figure)
