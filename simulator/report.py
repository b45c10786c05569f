"""The replay's report: a table per split, this project's curve against each peer, two plots and
``summary.json`` (machine-readable: one entry per system, figures as fractions 0..1)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from oversale.quantity import RESOURCES
from simulator.policies import GOAL_BAND, GOAL_BUDGETS, GOAL_RANGE_TEXT, OURS, System, within_band
from simulator.replay import SPLITS, Config, Result, Tally, run
from simulator.trace import GIB, MILLI, Workload

BASELINE = "none"
AT_PEAKS = "cpu_violation_rate_at_peaks"
"""The cpu violation rate counted at the members' summed 5-minute peaks (``backtest --peaks``)."""


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
    if tally.peak_samples:
        row[AT_PEAKS] = round(tally.violations_at_peaks / tally.peak_samples, 6)
    return row


def summary(result: Result, systems: list[System]) -> list[dict[str, Any]]:
    """One row per system: the whole evaluated period, and each split apart."""
    base = result.tallies[BASELINE]
    rows = []
    for system in systems:
        tallies = result.tallies[system.name]
        row: dict[str, Any] = {"policy": system.name, "kind": system.kind, "ours": system.ours,
                               "family": system.family or system.name, "source": system.source,
                               "hot_time_budget": system.account.budget.cpu if system.account else None,
                               "adds": system.adds}
        row |= figures(tallies["tuning"].add(tallies["holdout"]), base["tuning"].add(base["holdout"]))
        for split in SPLITS:
            row[split] = figures(tallies[split], base[split])
        rows.append(row)
    return rows


def budget_sweep(rows: list[dict[str, Any]], daily: dict[str, list[dict[str, Any]]] | None = None
                 ) -> list[dict[str, Any]]:
    """Our whole system at each cpu hot-time budget: what it freed and the hot time it realised
    (overall, and each split apart), by budget; with ``daily``, the ``cpu_violation_interval`` of
    every replayed day and of each split apart too (:func:`hot_time_interval`)."""
    def pick(scope: dict[str, Any]) -> dict[str, Any]:
        return {k: scope[k] for k in ("capacity_freed", "cpu_violation_rate", "memory_violation_rate", AT_PEAKS)
                if k in scope}

    sweep = []
    for row in sorted((r for r in rows if r["family"] == OURS and r["hot_time_budget"] is not None),
                      key=lambda r: r["hot_time_budget"]):
        entry = {"hot_time_budget": row["hot_time_budget"], "policy": row["policy"], **pick(row),
                 **{split: pick(row[split]) for split in SPLITS}}
        if daily and row["policy"] in daily:
            entry["cpu_violation_interval"] = hot_time_interval(daily[row["policy"]], None)
            for split in SPLITS:
                entry[split]["cpu_violation_interval"] = hot_time_interval(daily[row["policy"]], split)
        sweep.append(entry)
    return sweep


class OtherPlacement(TypedDict):
    """One of :func:`other_placements`: our budget curve on it and, where asked, each variant of
    ours against that curve (:func:`variants_against_curve`, per split; empty when not asked)."""

    seed: int
    budget_sweep: list[dict[str, Any]]
    variants_against_curve: dict[str, list[dict[str, Any]]]


def other_placements(workloads: list[Workload], config: Config, systems: Callable[[], list[System]],
                     placements: int, progress: Callable[[str], None] = lambda m: None,
                     variants: bool = False) -> list[OtherPlacement]:
    """Our budget curve (:func:`budget_sweep`, without intervals) on ``placements - 1`` other
    placements kube-scheduler could equally have made: ties among the best-scoring nodes drawn
    with seeds 1, 2, ... (:attr:`Config.placement_seed`). Which workloads share a node can
    decide the hot time more than the budget does (on the July backtest's 10-16 nodes too); these say how much.
    ``systems`` builds fresh systems for each (their accounts keep state); only the baseline and
    our curve are replayed, one progress line each (the first replay said the rest). With
    ``variants``, our variants (load-aware placement, remediation) are replayed on each placement
    too and judged against the curve *of that placement*: the report's placement is one draw of
    many, so a variant judged against it alone is judged against that draw's luck."""
    others: list[OtherPlacement] = []
    for seed in range(1, placements):
        began = time.perf_counter()
        chosen = [s for s in systems() if s.name == BASELINE or s.family == OURS
                  or (variants and s.ours and bool(s.adds))]
        result = run(workloads, dataclasses.replace(config, placement_seed=seed), chosen)
        rows = summary(result, chosen)
        others.append({"seed": seed, "budget_sweep": budget_sweep(rows),
                       "variants_against_curve": {split: variants_against_curve(rows, result.daily, split)
                                                  for split in SPLITS} if variants else {}})
        progress(f"placement {seed + 1}/{placements} (ties drawn, seed {seed}) replayed in "
                 f"{time.perf_counter() - began:.1f}s")
    return others


def placement_range(placements: list[list[dict[str, Any]]], budget: float, split: str | None = None
                    ) -> list[float] | None:
    """The lowest and highest realised cpu hot time at ``budget`` over the placements replayed
    (each a :func:`budget_sweep`), over every replayed day or one ``split``; None with one
    placement only (nothing to compare).

    >>> curve = lambda rate: [{"hot_time_budget": 0.001, "cpu_violation_rate": rate}]
    >>> placement_range([curve(0.001), curve(0.014), curve(0.0)], 0.001), placement_range([curve(0.001)], 0.001)
    ([0.0, 0.014], None)
    """
    rates = placement_rates(placements, budget, split)
    return [min(rates), max(rates)] if len(rates) > 1 else None


def placement_rates(placements: list[list[dict[str, Any]]], budget: float, split: str | None = None) -> list[float]:
    """The realised cpu hot time at ``budget`` on each placement replayed (each a
    :func:`budget_sweep`), over every replayed day or one ``split``, in the placements' order."""
    return [(entry if split is None else entry[split])["cpu_violation_rate"] for curve in placements
            for entry in curve if entry["hot_time_budget"] == budget]


def budget_goal(sweep: list[dict[str, Any]], split: str | None,
                placements: list[list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The hot-time goal over every replayed day (``split`` None, as the plan reads it) or one
    split: which of the goal's budgets (0.05% to 1%) in ``sweep`` kept the realised cpu hot time
    within the band (0.5x..1.5x), each budget's multiple, and with ``placements`` (each a
    :func:`budget_sweep`, the report's first) on how many placements it was kept. The sentence a
    reader otherwise works out from the sweep's table by hand.

    >>> at = lambda rates: [{"hot_time_budget": b, "tuning": {"cpu_violation_rate": r}} for b, r in rates]
    >>> goal = budget_goal(at([(0.001, 0.0023), (0.002, 0.0027), (0.05, 0.04)]), "tuning")
    >>> goal["kept"], goal["missed"]
    ([0.002], [0.001])
    """
    verdicts = []
    for entry in sweep:
        budget = entry["hot_time_budget"]
        if budget not in GOAL_BUDGETS:
            continue
        realised = (entry if split is None else entry[split])["cpu_violation_rate"]
        verdict = {"hot_time_budget": budget, "times_budget": realised / budget,
                   "kept": within_band(realised, budget)}
        if placements and len(placements) > 1:
            rates = placement_rates(placements, budget, split)
            verdict["kept_on_placements"] = sum(within_band(r, budget) for r in rates)
            verdict["placements"] = len(rates)
        verdicts.append(verdict)
    return {"band": list(GOAL_BAND), "budgets": verdicts,
            "kept": [v["hot_time_budget"] for v in verdicts if v["kept"]],
            "missed": [v["hot_time_budget"] for v in verdicts if not v["kept"]]}


def budget_goal_text(goal: dict[str, Any], days: str) -> str | None:
    """One line of :func:`budget_goal` for the report: kept and missed budgets with their multiples;
    None where it checked none (a sweep without a budget of 0.05% to 1%): no line to print.

    >>> one = budget_goal([{"hot_time_budget": 0.001, "checked": {"cpu_violation_rate": 0.0012}}], "checked")
    >>> budget_goal_text(one, "days checked").split(": ", 1)[1]
    'of the 1 budget from 0.05% to 1%, 1 kept within 0.5x..1.5x: 0.10% (1.20x); missed: none.'
    >>> budget_goal_text(budget_goal([{"hot_time_budget": 0.05, "checked": {}}], "checked"), "days checked") is None
    True
    """
    if not goal["budgets"]:
        return None

    def listed(budgets: list[dict[str, Any]]) -> str:
        return ", ".join(f"{v['hot_time_budget']:.2%} ({v['times_budget']:.2f}x"
                         + (f"; on {v['kept_on_placements']} of {v['placements']} placements" if "placements" in v
                            else "") + ")" for v in budgets) or "none"
    low, high = goal["band"]
    kept = [v for v in goal["budgets"] if v["kept"]]
    missed = [v for v in goal["budgets"] if not v["kept"]]
    count = len(goal["budgets"])
    return (f"**The goal on the {days}**: of the {count} budget{'' if count == 1 else 's'} from {GOAL_RANGE_TEXT}, "
            f"{len(kept)} kept within {low:g}x..{high:g}x: {listed(kept)}; missed: {listed(missed)}.")


def days_like_these_note(days: str) -> str:
    """What *days like these* means, in the words the report and the plan both print (``days``:
    which days are drawn again, e.g. "the split's days")."""
    return (f"*Days like these*: the 90% interval of the realised cpu hot time when {days} are drawn again "
            "with replacement (one hot event more or less).")


def placements_note(count: int, report: str, measure: str = "realised cpu hot time") -> str:
    """What *over N placements* means, in the words the report and the plan both print
    (``report``: the document whose own placement gives each tie to the first node; ``measure``:
    what ranges over the placements)."""
    return (f"*Over {count} placements*: the lowest and highest {measure} when the Pods are placed "
            "again with ties among the best-scoring nodes drawn at random, as kube-scheduler draws them "
            f"({report} gives each tie to the first node).")


def hot_time_interval(days: list[dict[str, Any]], split: str | None, resource: str = "cpu", level: float = 0.9,
                      resamples: int = 2000, seed: int = 0) -> list[float] | None:
    """How far a split's realised hot time (``split`` None: every day's) could have fallen on
    other days like these: the ``level`` interval of the hot time over the split's days drawn
    again with replacement (a bootstrap over days, seeded, so a rerun prints the same). Hot time
    comes in events that last hours and hit one or two days, so a budget of 0.1% over two weeks is
    a handful of node-hours: this interval says how much one event more or less moves the figure.
    None without days."""
    chosen = [d for d in days if split is None or d["split"] == split]
    if not chosen:
        return None
    hot = np.array([d[f"{resource}_hot_samples"] for d in chosen], dtype=np.float64)
    samples = np.array([d["node_samples"] for d in chosen], dtype=np.float64)
    draws = _day_draws(len(chosen), resamples, seed)
    return _interval(hot[draws].sum(axis=1) / np.maximum(samples[draws].sum(axis=1), 1), level)


def _day_draws(days: int, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` rows of ``days`` day indices drawn with replacement (a bootstrap over days),
    seeded so a rerun prints the same."""
    return np.random.default_rng(seed).integers(0, days, size=(resamples, days))


def _interval(drawn: np.ndarray, level: float) -> list[float]:
    """The central ``level`` interval of the figures of the draws."""
    low, high = np.quantile(drawn, [(1 - level) / 2, (1 + level) / 2])
    return [round(float(low), 6), round(float(high), 6)]


def interval_text(interval: list[float] | None) -> str:
    """An interval of :func:`hot_time_interval` as the reports print it.

    >>> interval_text([0.0, 0.01799]), interval_text(None)
    ('0.000%..1.799%', '-')
    """
    return "-" if interval is None else f"{interval[0]:.3%}..{interval[1]:.3%}"


def variants_against_curve(rows: list[dict[str, Any]], daily: dict[str, list[dict[str, Any]]], split: str,
                           resource: str = "cpu", level: float = 0.9, resamples: int = 2000, seed: int = 0
                           ) -> list[dict[str, Any]]:
    """Each variant of our whole system (load-aware placement, remediation: what it ``adds``)
    against our own budget curve at the same capacity freed: the hot time the curve runs at the
    variant's capacity freed (the sweep's budgets joined by straight lines, as the plot draws it
    and :func:`against_peers` reads it), and by how
    much the variant is hotter (``change`` > 0) or cooler. A variant that frees more or less than
    every budget has no such point (``curve_violation_rate`` None, ``off_the_curve`` says which).

    ``difference`` is the same in share of node-time (variant minus curve), and
    ``difference_interval``, ``cooler_share`` and ``hotter_share`` come from the split's days drawn
    again with replacement, the same draws for every system (a paired bootstrap over days, seeded):
    how far the verdict could have moved on other days like these, and in what share of the draws
    the variant is the cooler or the hotter one (``draws_on_the_curve``: the share of draws in which
    its capacity freed is within the curve's range; the rest are left out). A difference carried
    by one or two hot days shows as an interval on both sides of 0."""
    key = f"{resource}_hot_samples"
    curve = sorted((r for r in rows if r["family"] == OURS and r.get("hot_time_budget") is not None
                    and not r.get("adds") and r["policy"] in daily), key=lambda r: r[split]["capacity_freed"])
    variants = [r for r in rows if r["ours"] and r.get("adds") and r["policy"] in daily]
    if len(curve) < 2 or not variants or BASELINE not in daily:
        return []

    def per_day(name: str, field: str) -> np.ndarray:
        return np.array([d[field] for d in daily[name] if d["split"] == split], dtype=np.float64)

    base_nodes = per_day(BASELINE, "nodes")
    if not len(base_nodes):
        return []
    # Row 0 is the split itself, as measured; the rest are the draws.
    picks = np.vstack([np.arange(len(base_nodes)), _day_draws(len(base_nodes), resamples, seed)])
    base = base_nodes[picks].sum(axis=1)

    def measured(name: str) -> tuple[np.ndarray, np.ndarray]:
        freed = 1 - per_day(name, "nodes")[picks].sum(axis=1) / np.maximum(base, 1)
        hot = per_day(name, key)[picks].sum(axis=1) / np.maximum(per_day(name, "node_samples")[picks].sum(axis=1), 1)
        return freed, hot

    curve_points = [measured(r["policy"]) for r in curve]
    verdicts = []
    for row in variants:
        freed, hot = measured(row["policy"])
        at = np.array([_curve_hot_at([(f[i], h[i]) for f, h in curve_points], freed[i])
                       for i in range(len(freed))], dtype=np.float64)
        difference = hot - at  # NaN where the variant's capacity freed is off the curve
        drawn = difference[1:][~np.isnan(difference[1:])]
        verdict: dict[str, Any] = {
            "system": row["policy"], "adds": row["adds"], "capacity_freed": row[split]["capacity_freed"],
            "violation_rate": row[split][f"{resource}_violation_rate"],
            "curve_violation_rate": None if np.isnan(at[0]) else round(float(at[0]), 6),
            "off_the_curve": None if not np.isnan(at[0]) else
            "frees more than any budget" if freed[0] > max(f[0] for f, _ in curve_points) else
            "frees less than any budget",
            "change": None if np.isnan(at[0]) or at[0] <= 0 else round(float(hot[0] / at[0] - 1), 3),
            "difference": None if np.isnan(difference[0]) else round(float(difference[0]), 6),
            "difference_interval": None, "cooler_share": None, "hotter_share": None,
            "draws_on_the_curve": round(len(drawn) / resamples, 3)}
        if len(drawn):
            verdict["difference_interval"] = _interval(drawn, level)
            verdict["cooler_share"] = round(float((drawn < 0).mean()), 3)
            verdict["hotter_share"] = round(float((drawn > 0).mean()), 3)
        verdicts.append(verdict)
    return verdicts


def _curve_hot_at(points: list[tuple[float, float]], freed: float) -> float:
    """The hot time of a curve of (freed, hot time) points at ``freed``, straight lines between
    neighbours; NaN outside the points' range."""
    points = sorted(points)
    if not points or freed < points[0][0] or freed > points[-1][0]:
        return math.nan
    for (f0, h0), (f1, h1) in itertools.pairwise(points):
        if f0 <= freed <= f1:
            return h0 if f1 == f0 else h0 + (h1 - h0) * (freed - f0) / (f1 - f0)
    return points[-1][1]


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
    envelope = _envelope((row[split][key], row[split]["capacity_freed"]) for row in rows
                         if row["family"] in (OURS, BASELINE))
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


def budgets_against_peers(rows: list[dict[str, Any]], split: str, resource: str = "cpu",
                          budgets: tuple[float, ...] = GOAL_BUDGETS) -> list[dict[str, Any]]:
    """The other reading of "more than every peer at the same hot time": at each of our budgets,
    the hot time we realised and what each peer family frees there, read off the family's own
    settings (its default, and with ``--frontier`` its variants) joined by straight lines, as our
    curve is read in :func:`against_peers`. A family none of whose settings is that cool has
    nothing to offer there (``peer_freed`` None) and does not beat us."""
    key = f"{resource}_violation_rate"
    families: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if not row["ours"] and row["family"] != BASELINE:
            families.setdefault(row["family"], []).append((row[split][key], row[split]["capacity_freed"]))
    envelopes = {family: _envelope(points) for family, points in families.items()}
    verdicts = []
    for row in sorted((r for r in rows if r["family"] == OURS and r.get("hot_time_budget") in budgets),
                      key=lambda r: r["hot_time_budget"]):
        realised, ours = row[split][key], row[split]["capacity_freed"]
        peers = []
        for family, envelope in sorted(envelopes.items()):
            there = _freed_at(envelope, realised)
            peers.append({"family": family, "peer_freed": None if there is None else round(there, 4),
                          "beaten": there is None or ours >= there})
        verdicts.append({"hot_time_budget": row["hot_time_budget"], "violation_rate": realised, "ours_freed": ours,
                         "peers": peers, "matched": all(p["beaten"] for p in peers)})
    return verdicts


def _envelope(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """(violation rate, freed) points reduced to the most freed at or below each violation rate."""
    envelope: list[tuple[float, float]] = []
    for violation, freed in sorted(points):
        if not envelope or freed > envelope[-1][1]:
            envelope.append((violation, freed))
    return envelope


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


def write_report(out: Path, rows: list[dict[str, Any]], result: Result, trace: Path, config: Config,
                 placements: list[OtherPlacement] | None = None) -> dict[str, Any]:
    """``report.md``, its plots and ``summary.json``; with ``placements`` (:func:`other_placements`),
    the budget sweep's hot time over them too (``summary.json``'s ``placements``: the report's
    placement first), and where they judged our variants, each variant's change against the curve
    over them (``placement_variants``, in the same order)."""
    out.mkdir(parents=True, exist_ok=True)
    data = _summary(rows, result, trace, config, placements)
    (out / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = _introduction(trace, config, data)
    for split in SPLITS:
        lines += _split_tables(split, rows, data, config)
    lines += _sweep_table(data)
    lines += peaks_table(rows, data)
    lines += variants_table(data["variants_against_curve"], data.get("placement_variants"))
    lines += hot_days_table(result.daily)
    lines += ["![capacity freed against cpu violations](savings_vs_violations.png)", "",
              "![the busiest node of the last day, per system](node_day.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    _plots(out, rows, result, data)
    return data


def _summary(rows: list[dict[str, Any]], result: Result, trace: Path, config: Config,
             placements: list[OtherPlacement] | None) -> dict[str, Any]:
    """What ``summary.json`` holds, from which the report's text and plots are written."""
    data: dict[str, Any] = {
        "trace": str(trace), "days_evaluated": len(result.days),
        "tuning_days": [d for d in result.days if result.splits[d] == "tuning"],
        "holdout_days": [d for d in result.days if result.splits[d] == "holdout"],
        "config": config.__dict__, "policies": rows,
        "clairvoyant_capacity_freed": clairvoyant_freed(result),
        "clairvoyant_by_split": {split: clairvoyant_freed(result, split) for split in SPLITS},
        "against_peers": {split: against_peers(rows, split) for split in SPLITS},
        "budgets_against_peers": {split: budgets_against_peers(rows, split) for split in SPLITS},
        "budget_sweep": budget_sweep(rows, result.daily),
        "variants_against_curve": {split: variants_against_curve(rows, result.daily, split) for split in SPLITS},
        "daily": result.daily,
    }
    if placements:
        data["placements"] = [budget_sweep(rows), *(p["budget_sweep"] for p in placements)]
        if any(p["variants_against_curve"] for p in placements):
            data["placement_variants"] = [data["variants_against_curve"],
                                          *(p["variants_against_curve"] for p in placements)]
    data["budget_goal"] = {split: budget_goal(data["budget_sweep"], split, data.get("placements"))
                           for split in SPLITS if data[f"{split}_days"]}
    return data


def _introduction(trace: Path, config: Config, data: dict[str, Any]) -> list[str]:
    """The report's title, which days are which, and what each figure means."""
    tuning, holdout = data["tuning_days"], data["holdout_days"]
    clairvoyant = data["clairvoyant_by_split"]
    return [
        "# Backtest report: the whole system on one simulated cluster", "",
        f"Trace `{trace.name}`: days {tuning[0] if tuning else '-'}..{tuning[-1] if tuning else '-'} are the "
        f"**tuning** days (the ones a setting may be chosen on), days {holdout[0] if holdout else '-'}.."
        f"{holdout[-1] if holdout else '-'} the **holdout** (the last {config.holdout_days} days, to judge a "
        f"choice on days it was not made on); day 0 is the trace's first, days 0..{config.warmup_days - 1} only "
        f"give history. Each "
        f"day's requests come only from the {config.request_window_days} days before it (shorter where a peer "
        f"has a window of its own) and its node ratios from the {config.window_days} days before it. Nodes have "
        f"{config.node_cpu_cores:g} cores and {config.node_memory_bytes / GIB:g} GiB; usage is replayed every 5 "
        "minutes.", "",
        "- Every system runs on the same cluster model: its request policy sets each workload's request; Pods "
        "arrive largest first and the extender's own filter and score (`oversale.node_table`) choose among open "
        "nodes, a node being added when none fits; after each arrival the system's node policy recomputes that "
        "node's ratio from its members' summed history. With load-aware placement each Pod meets the extender at "
        f"its own moment of the day (drawn with `--arrival-seed {config.arrival_seed}`), the node's usage of "
        "the hour before, and its workload's own 5-minute average cpu and latest memory as the Pod's estimate.",
        "- **capacity freed**: 1 - node-days needed / node-days of `none` (original requests, no overselling).",
        "- **violation rate**: share of (node, 5-minute sample) pairs whose summed usage exceeds the node's *real* "
        "capacity.",
        "- **above request**: share of workload samples using more than the request the system set (throttled "
        "beyond the request under contention).",
        "- **evictions/node-day**: Pods the remediation step moved, per node-day (only systems with remediation).",
        f"- **clairvoyant bound**: each day's real peak of summed usage, perfectly divisible: "
        f"{clairvoyant['tuning']:.1%} freed on the tuning days, {clairvoyant['holdout']:.1%} on the holdout.", "",
    ]


def _split_tables(split: str, rows: list[dict[str, Any]], data: dict[str, Any], config: Config) -> list[str]:
    """One split's section: every system's figures, then ours against each peer, both ways round."""
    if not data[f"{split}_days"]:
        return [f"## {split.capitalize()} days", "", f"None: the replay has no {split} days "
                f"(`--holdout-days {config.holdout_days}`), so no figure below is about them.", ""]
    lines = [f"## {split.capitalize()} days", "",
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
              f"What `{OURS}` frees at each peer's cpu violation rate, read off its curve (its budget sweep "
              "and the baseline, joined by straight lines). *Matched*: at least the peer's capacity "
              "at an equal or lower violation rate.", "",
              "| peer | peer frees | at cpu violation rate | we free there | ours / peer | matched |",
              "| --- | --- | --- | --- | --- | --- |"]
    for verdict in data["against_peers"][split]:
        there = "no setting is that safe" if verdict["ours_freed"] is None else f"{verdict['ours_freed']:.1%}"
        ratio = "" if verdict["ratio"] is None else f"{verdict['ratio']:.2f}x"
        lines.append(f"| {verdict['peer']} | {verdict['peer_freed']:.1%} | {verdict['violation_rate']:.3%} | "
                     f"{there} | {ratio} | {'yes' if verdict['matched'] else '**no**'} |")
    lines.append("")
    at_budgets = data["budgets_against_peers"][split]
    if at_budgets:
        families = [p["family"] for p in at_budgets[0]["peers"]]
        lines += [f"### At each budget, against every peer ({split}, cpu)", "",
                  f"The same question read from our side: at each budget of the goal's range, what `{OURS}` "
                  "frees at the hot time it realised, and what each peer family frees at that hot time "
                  "(its settings joined by straight lines; `-`: none of its settings is that cool). "
                  "**Bold**: the peer frees more.", "",
                  "| budget | realised | we free | " + " | ".join(families) + " |",
                  "| --- | --- | --- | " + " | ".join("---" for _ in families) + " |"]
        for verdict in at_budgets:
            cells = ["-" if p["peer_freed"] is None else
                     (f"{p['peer_freed']:.1%}" if p["beaten"] else f"**{p['peer_freed']:.1%}**")
                     for p in verdict["peers"]]
            lines.append(f"| {verdict['hot_time_budget']:.2%} | {verdict['violation_rate']:.3%} | "
                         f"{verdict['ours_freed']:.1%} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _sweep_table(data: dict[str, Any]) -> list[str]:
    """The budget sweep: at each budget, what we freed and the hot time realised, on each split."""
    sweep = data["budget_sweep"]
    if len(sweep) <= 1:
        return []
    placed = data.get("placements") or []
    columns = ["freed", "realised (x budget)", "days like these",
               *([f"over {len(placed)} placements"] if placed else [])]
    lines = ["## The budget sweep", "",
             f"`{OURS}` at each cpu hot-time budget: the realised hot time (cpu violation rate) should stay "
             "within 0.5x to 1.5x of the budget, on the holdout days above all.", "",
             days_like_these_note("the split's days")
             + (" " + placements_note(len(placed), "this report's placement") if placed else ""),
             "",
             "| budget | " + " | ".join(f"{split}: {column}" for split in SPLITS for column in columns) + " |",
             "| --- |" + " --- |" * (len(SPLITS) * len(columns))]
    for entry in sweep:
        cells = []
        for split in SPLITS:
            if not data[f"{split}_days"]:
                cells += ["-"] * len(columns)
                continue
            realised = entry[split]["cpu_violation_rate"]
            times = f"{realised / entry['hot_time_budget']:.2f}x" if entry["hot_time_budget"] else "-"
            interval = entry[split].get("cpu_violation_interval")
            cells += [f"{entry[split]['capacity_freed']:.1%}", f"{realised:.3%} ({times})",
                      interval_text(interval)]
            if placed:
                cells.append(interval_text(placement_range(placed, entry["hot_time_budget"], split)))
        lines.append(f"| {entry['hot_time_budget']:.2%} | " + " | ".join(cells) + " |")
    lines += [""] + [f"{said}\n" for split, goal in data["budget_goal"].items()
                     if (said := budget_goal_text(goal, f"{split} days"))]
    lines += ["![realised hot time against the budget](budget_kept.png)", ""]
    return lines


def peaks_table(rows: list[dict[str, Any]], data: dict[str, Any]) -> list[str]:
    """With ``--peaks``: each system's cpu hot time at the 5-minute averages and at the peaks."""
    splits = [split for split in SPLITS if data[f"{split}_days"] and AT_PEAKS in rows[0][split]]
    if not splits:
        return []
    lines = ["## Hot time at the 5-minute peaks", "",
             "Every system estimated and was placed on the trace's 5-minute averages, as the live system reads "
             "`rate()` over 5 minutes; the peaks trace gave each workload's highest reading of each 5 minutes. A "
             "node-sample whose members' summed averages exceed the node's real cpu *was* hot; one whose summed "
             "peaks exceed it *may* have been (its members' highest moments need not coincide). The time a node "
             "spent above its real capacity at some moment lies between the two.", "",
             "| system | " + " | ".join(f"{split}: averages | {split}: peaks" for split in splits) + " |",
             "| --- | " + " | ".join("--- | ---" for _ in splits) + " |"]
    for row in rows:
        cells = [f"{row[split]['cpu_violation_rate']:.3%} | {row[split][AT_PEAKS]:.3%}" for split in splits]
        lines.append(f"| {row['policy']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def variants_table(verdicts: dict[str, list[dict[str, Any]]],
                   placed: list[dict[str, list[dict[str, Any]]]] | None = None) -> list[str]:
    """Load-aware placement and remediation against our budget curve (:func:`variants_against_curve`);
    with ``placed`` (``summary.json``'s ``placement_variants``), each one's change over those
    placements too (:func:`change_over_placements`)."""
    if not any(verdicts.values()):
        return []
    over = [f"over {len(placed)} placements"] if placed else []
    lines = ["## Our variants against our curve", "",
             f"Each variant of `{OURS}` against its budget curve (the sweep, straight lines) at the same "
             "capacity freed: the hot time the curve runs there, and the variant's difference. *Days like these*: "
             "the 90% interval of the difference over the split's days drawn again (the same draws for every "
             "system), and in what share of those draws the variant is cooler or hotter."
             + (" " + placements_note(len(placed), "this report's placement",
                                      "difference from the curve replayed on the same placement (in points, and "
                                      "the change where the curve there is above 0)")
                + " The count is of the placements where the variant is hotter." if placed else ""), "",
             "| split | variant | freed | cpu hot time | curve there | change | difference | "
             "days like these (points) | cooler / hotter in |" + "".join(f" {c} |" for c in over),
             "|" + " --- |" * (9 + len(over))]
    for split, rows in verdicts.items():
        for v in rows:
            curve = v["off_the_curve"] if v["curve_violation_rate"] is None else f"{v['curve_violation_rate']:.3%}"
            change = "-" if v["change"] is None else f"{v['change']:+.0%}"
            difference = "-" if v["difference"] is None else f"{v['difference'] * 100:+.3f} points"
            interval = "-" if v["difference_interval"] is None else \
                f"{v['difference_interval'][0] * 100:+.3f}..{v['difference_interval'][1] * 100:+.3f}"
            shares = "-" if v["cooler_share"] is None else \
                f"{v['cooler_share']:.0%} / {v['hotter_share']:.0%} of {v['draws_on_the_curve']:.0%} on the curve"
            lines.append(f"| {split} | {v['system']} | {v['capacity_freed']:.1%} | {v['violation_rate']:.3%} | "
                         f"{curve} | {change} | {difference} | {interval} | {shares} |"
                         + (f" {change_over_placements(placed, split, v['system'])} |" if placed else ""))
    return [*lines, ""]


def change_over_placements(placed: list[dict[str, list[dict[str, Any]]]], split: str, system: str) -> str:
    """A variant against the curve over the placements, each judged against the curve of its own
    placement: the lowest and highest difference (and change, where the curve there is above 0),
    and on how many the variant is hotter; a placement where the variant frees more or less than
    any budget has no difference and is counted apart.

    >>> verdict = lambda difference, change: {"holdout": [{"system": "v", "difference": difference,
    ...                                                    "change": change}]}
    >>> placed = [verdict(0.0001, 0.04), verdict(-0.002, -0.5), verdict(None, None)]
    >>> change_over_placements(placed, "holdout", "v")
    '-0.200..+0.010 points (-50%..+4%), hotter on 1 of 3 (1 off the curve)'
    """
    verdicts = [v for placement in placed for v in placement.get(split, []) if v["system"] == system]
    known = [v for v in verdicts if v["difference"] is not None]
    if not known:
        return f"off the curve on all {len(verdicts)}"
    differences = [v["difference"] * 100 for v in known]
    changes = [v["change"] for v in known if v["change"] is not None]
    return (f"{min(differences):+.3f}..{max(differences):+.3f} points"
            + (f" ({min(changes):+.0%}..{max(changes):+.0%})" if len(changes) == len(known) else "")
            + f", hotter on {sum(d > 0 for d in differences)} of {len(verdicts)}"
            + (f" ({len(verdicts) - len(known)} off the curve)" if len(known) < len(verdicts) else ""))


DAILY_SYSTEMS = (BASELINE, OURS, "oversale-pods", "crane-style", "vpa-style")


def hot_days_table(daily: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Where the hot time came from: cpu hot node-samples and nodes, day by day, for the baseline,
    our default and the two request-only peers (the rest are in ``summary.json`` ``daily``)."""
    shown = [name for name in DAILY_SYSTEMS if daily.get(name)]
    if not shown:
        return []
    lines = ["## Where the hot time came from", "",
             "cpu hot node-samples (5 minutes each) / nodes, day by day: a few days with a burst carry most "
             "of a split's hot time. With a hot-time account, *x0.50* is its cpu multiplier of that day's "
             "node ratio targets: a burst backs it off the next day, and it rises again slowly.", "",
             "| day | split | " + " | ".join(shown) + " |", "| --- | --- | " + " | ".join("---" for _ in shown) + " |"]

    def cell(entry: dict[str, Any]) -> str:
        multiplier = entry.get("cpu_account_multiplier")
        return f"{entry['cpu_hot_samples']} / {entry['nodes']}" + (f" x{multiplier:.2f}" if multiplier is not None
                                                                    else "")

    for index, entry in enumerate(daily[shown[0]]):
        cells = [cell(daily[name][index]) for name in shown]
        lines.append(f"| {entry['day']} | {entry['split']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


# One colour per family, distinguishable in print and by most colour-blind readers (no red: red is ours).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
           "#393b79", "#637939", "#8c6d31", "#843c39")
MARKERS = "osD^v<>pP*Xh"
FLOOR = 1e-3
"""% of node-samples: a zero violation rate is drawn here on the log axis."""


def _plots(out: Path, rows: list[dict[str, Any]], result: Result, data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    frontier_plot(out, rows, data)
    budget_plot(out, data)
    node_plot(out, result)


def frontier_plot(out: Path, rows: list[dict[str, Any]], data: dict[str, Any]) -> None:
    """Capacity freed against cpu hot time, one panel per split: every family a colour and a
    marker, ours a thick line along the budgets, names written beside the points."""
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(row["family"] for row in rows))
    others = [f for f in families if f != OURS]
    colours: dict[str, Any] = {family: PALETTE[i % len(PALETTE)] for i, family in enumerate(others)}
    colours[OURS] = "crimson"
    markers = {family: MARKERS[i % len(MARKERS)] for i, family in enumerate(families)}
    shown = [split for split in SPLITS if data[f"{split}_days"]]  # a split with no days has no figure
    figure, axes = plt.subplots(1, len(shown), figsize=(7.5 * len(shown), 6.5), sharey=True, squeeze=False)
    for axis, split in zip(axes[0], shown, strict=True):
        labels: list[tuple[str, float, float, Any, bool]] = []
        budget_labels: list[tuple[str, float, float, Any, bool]] = []
        points_drawn: list[tuple[float, float]] = []
        for family in families:
            members = [r for r in rows if r["family"] == family]
            points = sorted(((max(r[split]["cpu_violation_rate"] * 100, FLOOR), r[split]["capacity_freed"] * 100, r)
                             for r in members), key=lambda point: (point[0], point[1]))
            ours = family == OURS
            axis.plot([x for x, _, _ in points], [y for _, y, _ in points], marker=markers[family],
                      markersize=8 if ours else 6, linestyle="-" if len(points) > 1 else "none",
                      linewidth=2.5 if ours else 1.2, color=colours[family], zorder=4 if ours else 3)
            points_drawn += [(x, y) for x, y, _ in points]
            if ours:  # our curve is the budget sweep: each point says its budget
                budget_labels += [(f"{row['hot_time_budget']:.2%}", x, y, "crimson", False) for x, y, row in points
                                  if row["hot_time_budget"] is not None]
            head = next((r for r in members if r["policy"] == family), members[0])  # the published default
            labels.append((family, max(head[split]["cpu_violation_rate"] * 100, FLOOR),
                           head[split]["capacity_freed"] * 100, colours[family], ours))
        bound = data["clairvoyant_by_split"][split] * 100
        axis.axhline(bound, color="grey", linestyle="--", linewidth=1)
        axis.annotate("clairvoyant bound (knows the future)", (0.01, bound), fontsize=8, color="grey",
                      xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points")
        axis.set_xscale("log")
        axis.set_xlim(FLOOR / 2, 50)
        axis.set_ylim(-3, max(bound, max(y for _, _, y, _, _ in labels)) + 8)
        axis.set_xlabel("cpu hot time: % of node-samples above real capacity (log scale; 0 drawn at 0.001)")
        axis.set_title(f"{split} days: capacity freed against hot time (up and left is better)", fontsize=10)
        axis.grid(alpha=0.3, which="both")
        _direct_labels(figure, axis, sorted(labels, key=lambda label: not label[4]) + budget_labels, points_drawn)
    axes[0][0].set_ylabel("capacity freed (% of the baseline's node-days)")
    figure.tight_layout()
    figure.savefig(out / "savings_vs_violations.png", dpi=110)
    plt.close(figure)



def budget_plot(out: Path, data: dict[str, Any]) -> None:
    """Realised hot time against the budget, tuning and holdout, with the 0.5x..1.5x band."""
    import matplotlib.pyplot as plt

    sweep = data.get("budget_sweep") or []
    if len(sweep) > 1:
        figure, axis = plt.subplots(figsize=(6.5, 5.5))
        budgets = [entry["hot_time_budget"] * 100 for entry in sweep]
        edges = [min(budgets) / 2, max(budgets) * 2]
        low, high = GOAL_BAND
        axis.fill_between(edges, [e * low for e in edges], [e * high for e in edges], color="grey", alpha=0.15)
        axis.plot([min(budgets) / 2, max(budgets) * 2], [min(budgets) / 2, max(budgets) * 2], color="grey",
                  linewidth=1)
        axis.annotate("realised = budget (band: 0.5x to 1.5x)", (min(budgets), min(budgets)), fontsize=8,
                      color="grey", xytext=(8, -4), textcoords="offset points")
        for split, colour, marker in (("tuning", "#1f77b4", "o"), ("holdout", "crimson", "s")):
            if not data[f"{split}_days"]:
                continue
            realised = [max(entry[split]["cpu_violation_rate"] * 100, FLOOR) for entry in sweep]
            axis.plot(budgets, realised, marker=marker, color=colour, linewidth=1.8)
            axis.annotate(f"{split} days", (budgets[-1], realised[-1]), color=colour, fontsize=9,
                          xytext=(6, 0), textcoords="offset points", va="center")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlim(min(budgets) / 2, max(budgets) * 4)
        axis.set_xlabel("cpu hot-time budget (% of node-time, log)")
        axis.set_ylabel("realised cpu hot time (% of node-samples, log)")
        axis.set_title(f"Does the budget mean what it says? ({OURS})", fontsize=10)
        axis.grid(alpha=0.3, which="both")
        figure.tight_layout()
        figure.savefig(out / "budget_kept.png", dpi=110)
        plt.close(figure)



def node_plot(out: Path, result: Result) -> None:
    """The busiest node of four systems on the last day, on one y axis."""
    import matplotlib.pyplot as plt

    shown = [name for name in (OURS, "crane-style", "vpa-style", "crane-style+katalyst") if name in result.node_day]
    figure, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 4.4), squeeze=False, sharey=True)
    top = 0.0
    for axis, name in zip(axes[0], shown, strict=True):
        node = result.node_day[name]
        usage = [u / MILLI for u in node["cpu_usage"]]
        # Each line's label at its own place along the x axis: lines often coincide (a node full to
        # its allocatable has requests = oversold allocatable; a peer that does not oversell has
        # oversold = real).
        lines = {"real capacity": (node["cpu_real"] / MILLI, "black", "-", 0.01),
                 "oversold allocatable": (node["cpu_oversold"] / MILLI, "tab:orange", ":", 0.27),
                 "requested": (node["cpu_requested"] / MILLI, "tab:green", "--", 0.68)}
        axis.plot(node["hours"], usage, color="tab:blue", linewidth=0.9)
        axis.annotate("usage", (node["hours"][-1], usage[-1]), color="tab:blue", fontsize=7, xytext=(2, 0),
                      textcoords="offset points", va="center")
        for label, (value, colour, style, where) in lines.items():
            axis.axhline(value, color=colour, linestyle=style, linewidth=1.3)
            axis.annotate(label, (where, value), xycoords=("axes fraction", "data"), color=colour, fontsize=7,
                          xytext=(0, 2), textcoords="offset points")
        top = max(top, max(usage), *(value for value, _, _, _ in lines.values()))
        axis.set_title(f"{name}: node {node['node']}, {node['workloads']} workloads", fontsize=9)
        axis.set_xlabel("hour of the last replayed day")
        axis.set_xlim(0, 24)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylim(0, top * 1.1)
    axes[0][0].set_ylabel("cpu cores")
    figure.suptitle("The busiest node (by cpu usage) of each system on the last replayed day, one y axis for all",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(out / "node_day.png", dpi=110)
    plt.close(figure)


def _direct_labels(figure: Any, axis: Any, labels: list[tuple[str, float, float, Any, bool]],
                   points: list[tuple[float, float]]) -> None:
    """Each label beside its point, at the first of a few offsets where it overlaps no marker and
    no label placed before it, and stays inside the axes (labels are placed in the order given)."""
    from matplotlib.transforms import Bbox

    renderer = figure.canvas.get_renderer()
    frame = axis.get_window_extent(renderer)
    placed: list[Any] = []
    for x, y in points:  # the markers themselves, about 8 px across
        px, py = axis.transData.transform((x, y))
        placed.append(Bbox.from_extents(px - 4, py - 4, px + 4, py + 4))
    offsets = ((6, 4), (6, -12), (-6, 4), (-6, -12), (0, 10), (0, -18), (12, 16), (12, -26), (-12, 16), (-12, -26),
               (20, 0), (-20, 0), (0, 24), (0, -32))
    for family, x, y, colour, ours in labels:
        text = None
        size = 8 if family[0].isalpha() else 7
        for dx, dy in offsets:
            text = axis.annotate(family, (x, y), fontsize=size, color=colour, xytext=(dx, dy),
                                 textcoords="offset points", fontweight="bold" if ours else "normal",
                                 ha="left" if dx > 0 else "right" if dx < 0 else "center")
            box = text.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in placed):
                break
            text.remove()
            text = None
        if text is None:  # nowhere free: the first place, drawn anyway
            text = axis.annotate(family, (x, y), fontsize=size, color=colour, xytext=offsets[0],
                                 textcoords="offset points", fontweight="bold" if ours else "normal")
        placed.append(text.get_window_extent(renderer))
