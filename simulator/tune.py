"""Choose the hot-time account's knobs on the tuning days only.

  python -m simulator.tune --trace TRACE.csv.gz [--holdout-days 14] [--node-cores 32 --node-memory 256Gi]

The trace and cluster options are the backtest's (``simulator.cli``): tune a pool that ``plan``
exported on the node size ``plan`` printed for it. The trace is cut before its last
``--holdout-days`` days, so nothing here sees the holdout. For each candidate ``AccountConfig``
the whole system runs at every budget of the goal's range (0.05% to 1%), and the candidate is
scored by how far the realised cpu hot time strays from each budget in widths of the goal's band
(``simulator.policies.band_distance``: 0 when a budget is kept exactly, 1 at either edge of
0.5x..1.5x, so a budget over-spent 1.5x weighs as one under-spent 2x), the mean over the
budgets; ``kept`` counts the budgets (times placements) within the band; next to them the mean
capacity freed over those budgets. The printed table is what the defaults in
``oversale.budget.AccountConfig`` and ``OVERSALE_BUDGET_CALIBRATION`` were chosen from;
docs/backtest.md reports the runs.

Only the calibration is a setting: the account's knobs are the product's, and the grid varies
them to show what they do. So the last line names the calibration that scores best with the
account as shipped, beside the score of the one set in ``OVERSALE_BUDGET_CALIBRATION``.

With ``--placements N`` each candidate is also replayed on N-1 other placements (ties among the
best-scoring nodes drawn at random, as kube-scheduler draws them, where the first replay gives
each tie to the first node), and scored over every budget on every placement; a budget's cell
gives the lowest and highest multiple over them. Which workloads share a node can move the hot
time of a small budget more than the knobs do, so a candidate scored on one placement is scored
on that draw's luck.

The table goes to stdout as each candidate is scored; stderr says how far the run is: one line
per candidate with the time left, and with ``--placements`` one per placement replayed.
``--json PATH`` also writes every candidate's figures and the choice there.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from oversale.budget import AccountConfig, HotTimeBudget
from oversale.errors import SettingsError
from oversale.settings import Settings, parse_budget_calibration
from simulator.cli import (
    OneLineParser,
    add_cluster_arguments,
    cluster_config,
    json_file,
    placement_count,
    read_workloads,
    trace_failed,
)
from simulator.policies import (
    GOAL_BAND,
    GOAL_BUDGETS,
    OURS,
    System,
    band_distance,
    budget_name,
    budget_system,
    default_systems,
    within_band,
)
from simulator.replay import SLOTS_PER_DAY, Config, oversized_warning, run
from simulator.trace import TraceError, Workload

SCALES = (1.0, 2.0, 4.0)
"""Candidates of OVERSALE_BUDGET_CALIBRATION."""
GRID = {
    "short_overspend": (2.0, 4.0),
    "min_multiplier": (0.5,),
    "max_multiplier": (1.0, 1.2),
}
"""Candidates of ``AccountConfig``'s knobs (every combination is run)."""


@dataclasses.dataclass(frozen=True)
class Scored:
    """One candidate's row: its calibration and account, and how it kept the goal's budgets."""

    calibration: float
    account: AccountConfig
    score: float
    kept: int
    cells: int
    freed: float
    times_budget: tuple[tuple[float, float], ...]
    """Per goal budget, the lowest and highest realised hot time over the placements, as multiples."""


def best_settable(scored: list[Scored], shipped: AccountConfig) -> Scored | None:
    """The candidate scoring best among those run with the ``shipped`` account (the first of a tie)."""
    return min((row for row in scored if row.account == shipped), key=lambda row: row.score, default=None)


def settable_choice(scored: list[Scored], shipped: AccountConfig, current: float) -> str | None:
    """The line under the table: the calibration scoring best among the candidates run with the
    ``shipped`` account (the one a user cannot change), against the ``current`` calibration's
    score. None when no candidate ran with the shipped account.

    >>> row = lambda c, score: Scored(c, AccountConfig(), score, 3, 5, 0.4, ((1.0, 1.0),) * 5)
    >>> choice = settable_choice([row(4.0, 0.9), row(2.0, 1.1)], AccountConfig(), 4.0)
    >>> choice.startswith("With the account as shipped, calibration 4 scores best (0.900, 3/5 kept, 40.0% freed)")
    True
    >>> settable_choice([row(4.0, 0.9), row(2.0, 1.1)], AccountConfig(), 2.0).split(". ")[0].split(", ")[-1]
    'against 1.100 (3/5 kept) for the 2 OVERSALE_BUDGET_CALIBRATION sets'
    """
    best = best_settable(scored, shipped)
    if best is None:
        return None
    line = (f"With the account as shipped, calibration {best.calibration:g} scores best ({best.score:.3f}, "
            f"{best.kept}/{best.cells} kept, {best.freed:.1%} freed)")
    if best.calibration == current:
        return line + ", the one OVERSALE_BUDGET_CALIBRATION sets."
    mine = next((row for row in scored if row.account == shipped and row.calibration == current), None)
    said = (f"against {mine.score:.3f} ({mine.kept}/{mine.cells} kept) for the {current:g} "
            "OVERSALE_BUDGET_CALIBRATION sets" if mine else
            f"; the {current:g} OVERSALE_BUDGET_CALIBRATION sets was not among the candidates (--scale)")
    return (line + (", " if mine else "") + said + ". Read each budget's range above before changing it: on a "
            "pool of a few nodes one run of the tuner is not enough (docs/reconcilers.md).")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module's docstring as written, and every option's default."""


def _calibration(text: str) -> float:
    """A candidate of OVERSALE_BUDGET_CALIBRATION, read as the setting is."""
    try:
        return parse_budget_calibration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a calibration is a positive factor (the default is 4)") from None


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    json_file(args.json, parser)
    placements = placement_count(args, parser)
    config = dataclasses.replace(cluster_config(args, parser), holdout_days=0)  # the holdout is cut off below
    try:  # the user's OVERSALE_* settings, as the backtest reads them
        settings = Settings.from_env(os.environ)
    except SettingsError as error:
        parser.error(str(error))
    try:
        workloads = read_workloads(args, lambda message: print(message, file=sys.stderr, flush=True))
        tuning = _tuning_days(workloads, args)
    except TraceError as error:
        return trace_failed(error)
    warning = oversized_warning(workloads, config)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    scales = dict.fromkeys(getattr(args, "scale", SCALES))  # a calibration given twice is run once
    scored = _score_all(tuning, config, settings, list(scales), placements)
    choice = settable_choice(scored, settings.account, settings.budget_calibration)
    if choice:
        print(choice, flush=True)
    if args.json is not None:
        _write_json(args.json, args, scored, settings, placements, choice)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m simulator.tune", description=__doc__, formatter_class=_Formatter)
    add_cluster_arguments(parser)
    parser.add_argument("--scale", type=_calibration, action="append", default=argparse.SUPPRESS,
                        help=f"only this calibration (repeatable; default all of {', '.join(map(str, SCALES))})")
    parser.add_argument("--placements", type=int, default=1, metavar="N",
                        help="score each candidate over N placements: the first (ties to the first node) and "
                             "N-1 with ties drawn at random, as kube-scheduler draws them (each a full replay)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write every candidate's figures and the choice here")
    return parser


def _tuning_days(workloads: list[Workload], args: argparse.Namespace) -> list[Workload]:
    """The trace less its last ``--holdout-days``: what the candidates are scored on."""
    origin = min(int(w.slots[0]) for w in workloads)
    last = max(int(w.slots[-1]) for w in workloads)
    days = (last - origin) // SLOTS_PER_DAY + 1
    if days - args.holdout_days <= args.warmup_days:
        raise TraceError(f"{args.trace}: {days} days, of which --holdout-days {args.holdout_days} are cut off "
                         f"and --warmup-days {args.warmup_days} only give history: no day left to tune on")
    return _before(workloads, origin + (days - args.holdout_days) * SLOTS_PER_DAY)


def _score_all(tuning: list[Workload], config: Config, settings: Settings, scales: list[float],
               placements: int) -> list[Scored]:
    """Every candidate of ``scales`` x :data:`GRID` scored, a line printed for each as it is."""
    baseline = [s for s in default_systems(settings.compression_estimator(), settings.oversale_estimator(),
                                           settings.budget, sweep=False) if s.name == "none"]
    print("scale  " + "  ".join(GRID) + "  score  kept   freed  " + "  ".join(f"{b:.2%}" for b in GOAL_BUDGETS),
          flush=True)
    candidates = list(itertools.product(scales, *GRID.values()))
    scored: list[Scored] = []
    began = time.perf_counter()
    for number, (scale, *values) in enumerate(candidates, 1):
        account = AccountConfig(**dict(zip(GRID, values, strict=True)))
        started = time.perf_counter()

        def replayed(seed: int | None, number: int = number) -> None:
            if placements > 1:
                print(f"candidate {number}/{len(candidates)}: placement {1 if seed is None else seed + 1}/"
                      f"{placements} replayed", file=sys.stderr, flush=True)

        row = _score(tuning, config, settings, baseline, scale, account, placements, replayed)
        scored.append(row)
        cells = [f"{low:.2f}x" if placements == 1 else f"{low:.2f}-{high:.2f}x" for low, high in row.times_budget]
        print(f"{scale:>5}  " + "  ".join(f"{value:>{len(knob)}}" for knob, value in zip(GRID, values, strict=True))
              + f"  {row.score:.3f}  {f'{row.kept}/{row.cells}':<5}  {row.freed:.1%}  " + "  ".join(cells)
              + f"   ({time.perf_counter() - started:.0f}s)", flush=True)
        elapsed = time.perf_counter() - began
        print(f"candidate {number}/{len(candidates)} scored in {time.perf_counter() - started:.0f}s; about "
              f"{elapsed / number * (len(candidates) - number):.0f}s left", file=sys.stderr, flush=True)
    return scored


def _before(workloads: list[Workload], cut: float) -> list[Workload]:
    """The workloads' samples before ``cut``: the tuning days, the holdout cut off."""
    tuning = []
    for workload in workloads:
        keep = workload.slots < cut
        if keep.any():
            tuning.append(dataclasses.replace(
                workload, slots=workload.slots[keep], request={r: v[keep] for r, v in workload.request.items()},
                usage={r: v[keep] for r, v in workload.usage.items()}))
    return tuning


def _score(tuning: list[Workload], config: Config, settings: Settings, baseline: list[System], scale: float,
           account: AccountConfig, placements: int, replayed: Callable[[int | None], None]) -> Scored:
    """One candidate (calibration ``scale``, ``account``) replayed at every budget of the goal on
    ``placements`` placements of the tuning days: how often each realised hot time kept its band."""
    oversale = dataclasses.replace(settings.oversale_estimator(), budget_scale=scale)
    # Per budget, the realised cpu hot time on each placement; and capacity freed.
    realised: list[list[float]] = [[] for _ in GOAL_BUDGETS]
    freed: list[float] = []
    for seed in [None, *range(1, placements)]:
        systems = baseline + [budget_system(budget_name(b), HotTimeBudget(b, settings.memory_hot_time_budget),
                                            settings.compression_estimator(), oversale, OURS, account)
                              for b in GOAL_BUDGETS]  # fresh systems: their accounts keep state
        result = run(tuning, dataclasses.replace(config, placement_seed=seed), systems)
        base = result.tallies["none"]["tuning"].node_days
        for index, budget in enumerate(GOAL_BUDGETS):
            tally = result.tallies[budget_name(budget)]["tuning"]
            realised[index].append(tally.violations["cpu"] / max(tally.node_samples["cpu"], 1))
            freed.append(1 - tally.node_days / base)
        replayed(seed)
    pairs = [(r, b) for rates, b in zip(realised, GOAL_BUDGETS, strict=True) for r in rates]
    times = tuple((min(rates) / b, max(rates) / b) for rates, b in zip(realised, GOAL_BUDGETS, strict=True))
    return Scored(scale, account, sum(band_distance(r, b) for r, b in pairs) / len(pairs),
                  sum(within_band(r, b) for r, b in pairs), len(pairs), sum(freed) / len(freed), times)


def _write_json(path: Path, args: argparse.Namespace, scored: list[Scored], settings: Settings, placements: int,
                choice: str | None) -> None:
    """``--json``: every candidate's figures and the choice."""
    best = best_settable(scored, settings.account)
    path.write_text(json.dumps({
        "trace": str(args.trace), "holdout_days": args.holdout_days, "placements": placements,
        "budgets": list(GOAL_BUDGETS), "band": list(GOAL_BAND),
        "candidates": [{"calibration": row.calibration, "account": dataclasses.asdict(row.account),
                        "score": round(row.score, 6), "kept": row.kept, "cells": row.cells,
                        "capacity_freed": round(row.freed, 6),
                        "times_budget": [{"hot_time_budget": b, "lowest": round(low, 6), "highest": round(high, 6)}
                                         for b, (low, high) in zip(GOAL_BUDGETS, row.times_budget, strict=True)]}
                       for row in scored],
        "current_calibration": settings.budget_calibration,
        "best_calibration": best.calibration if best else None, "choice": choice}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
