"""Does the hot-time budget mean what it says on a cluster's *node* usage? A check on node traces.

  python -m simulator.budget_check --trace machine_usage.csv.gz [--window-days 7] [--json out.json]

The whole-system replay (``python -m reconcilers backtest``) needs each workload's requests and
usage. Many published traces, and many clusters' monitoring, hold only each node's utilisation:
the Alibaba 2018 machine trace is one. This check asks the node half of the budget the one question
such a trace can answer: if each node gets the ratio the budget gives it every day, how much of
the next day's node-time is hot?

It rests on one assumption, the one ``oversale.budget`` states: the node, as the trace shows it,
holds requests up to its real allocatable; at a ratio ``r`` it holds ``r`` times as many requests
of the same mix, whose usage scales with them, so it is hot whenever ``r x`` its utilisation is
above 1. Each day at midnight (trace time) every node's ratio comes from the node reconciler's
own function (``simulator.policies.ours_ratio``: ``oversale.budget.budget_proposal`` on the
node's last ``--window-days`` days, with its caps, at the ``OVERSALE_BUDGET_CALIBRATION`` the
backtest uses), its target scaled by one account for the whole cluster (``BudgetAccount``, as in
the replay: ``keep_account`` over the hot time of the days before). A node-day counts once its
node has the estimator's minimum history (``has_enough_history``), whatever its ratio: the replay
and the live account count every node of the pool, a backed-off one too. The column "estimator
alone" keeps the account at 1, to show the quantile's calibration without the loop.

CPU only: a node's memory ratio has a target of 0.6 of real memory (``OVERSALE_MEMORY_TARGET``),
so a node-level memory check says only whether utilisation stays under 60%.

Formats (``--format``, detected by default): ``alibaba-machines``, the cluster-trace-v2018
``machine_usage`` file (headerless; ``machine_id,time_stamp,cpu_util_percent,...``), and
``node-generic``, a CSV with the header ``node,timestamp_s,cpu_utilisation`` (0..1 of the node's
real allocatable, e.g. from node-exporter).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import itertools
import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from oversale.budget import HotTime, HotTimeBudget, budget_quantile, hot_time
from oversale.errors import SettingsError
from oversale.estimator import has_enough_history
from oversale.quantity import CPU
from oversale.settings import NODE_WINDOW_DAYS, Settings
from simulator.cli import OneLineParser, hot_time_budget, json_file, trace_failed
from simulator.policies import BUDGET_SWEEP, BudgetAccount, ours_ratio, usage_stats
from simulator.report import budget_goal, budget_goal_text, hot_time_interval, interval_text
from simulator.trace import DAY, MILLI, TraceError

NODE_FORMATS = ("alibaba-machines", "node-generic")
GENERIC_HEADER = ("node", "timestamp_s", "cpu_utilisation")
CAPACITY = 100 * MILLI
"""Every node is given the same nominal capacity: only utilisation matters to the check."""


@dataclass
class NodeSeries:
    """One node's utilisation samples (0..1 of its real allocatable), sorted by time."""

    name: str
    times: np.ndarray
    utilisation: np.ndarray


@dataclass
class BudgetResult:
    """The check at one budget, one account variant."""

    budget: float
    oversold_node_days: int
    node_days: int
    hot: HotTime
    mean_ratio: float
    interval: list[float] | None
    days: list[dict[str, Any]]

    def row(self) -> dict[str, Any]:
        return {"hot_time_budget": self.budget, "oversold_node_days": self.oversold_node_days,
                "node_days": self.node_days, "hot_samples": self.hot.hot_samples, "samples": self.hot.samples,
                "cpu_violation_rate": round(self.hot.share, 6), "mean_ratio": round(self.mean_ratio, 3),
                "interval": self.interval}


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")


def read_nodes(path: Path, fmt: str | None = None) -> list[NodeSeries]:
    """The node trace as one series per node (read whole into memory); duplicate timestamps keep
    the last row, and a row without a utilisation (the Alibaba trace has some) is skipped."""
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: a directory, not a trace file")
    rows: dict[str, dict[float, float]] = {}
    try:
        with _open(path) as handle:
            reader = csv.reader(handle)
            first = next(reader, None)
            if first is None:
                raise TraceError(f"{path}: empty")
            if fmt is None:
                fmt = "node-generic" if tuple(first[:3]) == GENERIC_HEADER else "alibaba-machines"
            if fmt == "node-generic":
                if tuple(first[:3]) != GENERIC_HEADER:
                    raise TraceError(f"{path}: a node-generic trace starts with the header {','.join(GENERIC_HEADER)}")
                records: Iterator[list[str]] = reader
                start, scale = 2, 1.0
            else:  # headerless: the first line is a sample
                records = itertools.chain([first], reader)
                start, scale = 1, 0.01
            for number, record in enumerate(records, start=start):
                if not record or (len(record) > 2 and not record[2].strip()):
                    continue  # a blank line, or a sample the machine did not report
                try:
                    node, stamp, value = record[0], float(record[1]), float(record[2]) * scale
                except (IndexError, ValueError):
                    raise TraceError(f"{path}: line {number}: {','.join(record)[:80]!r} is not "
                                     + ("node,timestamp_s,cpu_utilisation" if fmt == "node-generic"
                                        else "machine_id,time_stamp,cpu_util_percent,...")
                                     + " (is --format right?)") from None
                if not (math.isfinite(stamp) and math.isfinite(value)) or value < 0:
                    raise TraceError(f"{path}: line {number}: utilisation {value!r} at {stamp!r} is not a "
                                     "non-negative number")
                rows.setdefault(node, {})[stamp] = value
    except (OSError, csv.Error, UnicodeDecodeError, EOFError) as error:
        raise TraceError(f"{path}: cannot read it ({error})") from None
    if not rows:
        raise TraceError(f"{path}: no samples")
    series = []
    for node in sorted(rows):
        stamps = np.array(sorted(rows[node]), dtype=np.float64)
        series.append(NodeSeries(node, stamps, np.array([rows[node][s] for s in stamps.tolist()], dtype=np.float64)))
    return series


def averaged(node: NodeSeries, seconds: float) -> NodeSeries:
    """The node's utilisation averaged over buckets of ``seconds`` (stamped at each bucket's start),
    as a 5-minute trace or a Prometheus ``rate()`` over that window would show it."""
    buckets = np.floor(node.times / seconds)
    starts, index = np.unique(buckets, return_inverse=True)
    sums = np.bincount(index, weights=node.utilisation)
    counts = np.bincount(index)
    return NodeSeries(node.name, starts * seconds, sums / counts)


def check_budget(nodes: Sequence[NodeSeries], budget: float, settings: Settings, window_days: int,
                 with_account: bool = True, seed: int = 0) -> BudgetResult:
    """Realised hot time of the nodes' node-days under the budget at one cpu budget (see the module)."""
    account = BudgetAccount(HotTimeBudget(budget, settings.memory_hot_time_budget), settings.account)
    estimator = settings.oversale_estimator()
    ratio_of = ours_ratio(estimator, account)
    quantile_level = budget_quantile(budget, estimator.budget_scale)
    origin = min(float(n.times[0]) for n in nodes)
    last = max(float(n.times[-1]) for n in nodes)
    total = HotTime(0, 0)
    days: list[dict[str, Any]] = []
    ratios: list[float] = []
    for day in range(1, int((last - origin) // DAY) + 1):
        start = origin + day * DAY
        spent = HotTime(0, 0)
        for node in nodes:
            history = (node.times >= start - window_days * DAY) & (node.times < start)
            today = (node.times >= start) & (node.times < start + DAY)
            times, values = node.times[history], node.utilisation[history] * CAPACITY
            if not today.any() or not has_enough_history(usage_stats(times, values, quantile_level, start), estimator):
                continue  # not yet under the budget: the reconciler holds a new node's ratio
            ratio = ratio_of(CPU, CAPACITY, CAPACITY, times, values, 1.0)
            ratios.append(ratio)
            # At ratio r the node holds r times the requests of this mix: hot when r x utilisation > 1.
            spent = spent + hot_time((node.utilisation[today] * ratio).tolist(), 1.0)
        total = total + spent
        if spent.samples:  # the bootstrap draws whole days: nodes run hot together
            days.append({"split": "check", "day": day, "cpu_hot_samples": spent.hot_samples,
                         "node_samples": spent.samples})
        if with_account:  # what the reconcilers' account sees of this day, tomorrow
            account.observe(day, {CPU: spent})
    return BudgetResult(budget, sum(r > 1 for r in ratios), len(ratios), total,
                        float(np.mean(ratios)) if ratios else 1.0, hot_time_interval(days, "check", seed=seed), days)


def format_table(results: Sequence[tuple[BudgetResult, BudgetResult]]) -> str:
    """Markdown: per budget, the check with the account and with the estimator alone."""
    def cell(result: BudgetResult) -> str:
        if not result.hot.samples:
            return "no node-day with a day of history | -"
        return (f"{result.hot.share:.3%} ({result.hot.share / result.budget:.2f}x) | "
                f"{interval_text(result.interval or [0.0, 0.0])}")
    lines = ["| cpu budget | oversold node-days | mean ratio | realised (x budget) | days like these "
             "| estimator alone: realised (x budget) | days like these |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for ours, alone in results:
        lines.append(f"| {ours.budget:.2%} | {ours.oversold_node_days} of {ours.node_days} | {ours.mean_ratio:.2f} | "
                     f"{cell(ours)} | {cell(alone)} |")
    return "\n".join(lines)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _budget(text: str) -> float:
    value = hot_time_budget(text)
    if value == 0:
        raise argparse.ArgumentTypeError("'0': a budget of 0 allows no overselling, so there is nothing to check")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m simulator.budget_check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, required=True, help="node utilisation CSV or CSV.gz")
    parser.add_argument("--format", choices=NODE_FORMATS, default=None, help="default: detected from the first line")
    parser.add_argument("--window-days", type=int, default=NODE_WINDOW_DAYS,
                        help=f"history window of every ratio (default {NODE_WINDOW_DAYS}, OVERSALE_HISTORY_WINDOW's)")
    parser.add_argument("--budget", type=_budget, action="append", default=None,
                        help="a cpu hot-time budget to check (repeatable; default the backtest's sweep, "
                             + ", ".join(f"{b:.2%}" for b in BUDGET_SWEEP).replace("%", "%%") + ")")
    parser.add_argument("--average-seconds", type=float, default=0,
                        help="average each node's samples over windows this long first (300: as the "
                             "backtest's 5-minute traces see usage); default 0, as sampled")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.window_days < 1:
        parser.error("--window-days must be at least 1")
    if not (math.isfinite(args.average_seconds) and args.average_seconds >= 0):
        parser.error(f"--average-seconds {args.average_seconds:g}: a length of time from 0 (as sampled)")
    json_file(args.json, parser)
    try:
        settings = Settings.from_env(os.environ)
        nodes = read_nodes(args.trace, args.format)
    except SettingsError as error:
        parser.error(str(error))
    except TraceError as error:
        return trace_failed(error)
    if args.average_seconds:
        nodes = [averaged(node, args.average_seconds) for node in nodes]
    samples = sum(len(n.times) for n in nodes)
    span = (max(float(n.times[-1]) for n in nodes) - min(float(n.times[0]) for n in nodes)) / DAY
    _say(f"{args.trace}: {len(nodes)} nodes, {samples} samples over {span:.1f} days; calibration "
        f"{settings.budget_calibration:g}, window {args.window_days} days"
        + (f", samples averaged over {args.average_seconds:g} s" if args.average_seconds else ""))
    results = []
    for budget in args.budget or BUDGET_SWEEP:
        results.append((check_budget(nodes, budget, settings, args.window_days),
                        check_budget(nodes, budget, settings, args.window_days, with_account=False)))
        _say(f"budget {budget:.2%}: done")
    print(format_table(results))
    # The goal's verdict on the budgets of 0.05% to 1% among those checked, as the backtest's
    # report gives it under its sweep (with the account: the product's loop).
    goal = budget_goal([{"hot_time_budget": ours.budget, "checked": {"cpu_violation_rate": ours.hot.share}}
                        for ours, _ in results if ours.hot.samples], "checked")
    if said := budget_goal_text(goal, "node-days checked"):
        print("\n" + said)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "trace": str(args.trace), "nodes": len(nodes), "samples": samples, "days": round(span, 2),
            "budget_calibration": settings.budget_calibration, "window_days": args.window_days,
            "average_seconds": args.average_seconds,
            "budgets": [{**ours.row(), "estimator_alone": alone.row()} for ours, alone in results],
            "budget_goal": goal}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
