"""Ratio reconcilers.

  python -m reconcilers run               loop: sample (SQLite source), reconcile every interval, serve /metrics
  python -m reconcilers once [--dry-run]  one pass; --dry-run prints the table and writes nothing;
                                          exit 1 when the pass could not decide everything (history
                                          unavailable, the API server failing, the Lease lost)
  python -m reconcilers plan --prometheus URL [--days 14]
                                          the whole-system replay on this cluster's own history, for
                                          a range of hot-time budgets; writes nothing to the cluster
  python -m reconcilers remediate [--dry-run]
                                          one remediation pass judged on this one observation
                                          (as if every hot node had been hot long enough); exit 1
                                          when usage or the cluster cannot be read
  python -m reconcilers backtest --trace TRACE.csv.gz [--hot-time-budget 0.001]
                                          a usage trace replayed through the whole system and its
                                          peers; writes a report (docs/backtest.md)

The history source is Prometheus when OVERSALE_PROMETHEUS_URL is set, else metrics-server sampled
into the SQLite file OVERSALE_SQLITE_PATH. Several replicas are safe: only the holder of the Lease
OVERSALE_LEASE_NAME writes. Every setting is an environment variable (docs/settings.md).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import logging
import math
import os
import shlex
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from kube.cli import (
    CliError,
    Parser,
    add_debug_flag,
    check_api_server,
    required_api_client,
    run_cli,
    settings_or_exit,
)
from oversale.settings import Settings
from simulator.cli import add_cluster_arguments, hot_time_budget, placement_count

if TYPE_CHECKING:  # imported where used: `--help` and a bad setting answer before the kubernetes client loads
    from kube.leader import LeaseElector
    from reconcilers.history import History
    from reconcilers.metrics import ReconcilerMetrics
    from reconcilers.plan import PoolExport
    from reconcilers.runner import Reconciler
    from reconcilers.sqlite_history import MetricsSampler
    from simulator.replay import Config
    from simulator.trace import Workload

log = logging.getLogger("reconcilers")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    settings = settings_or_exit(parser)

    if args.command == "backtest":
        return _backtest(args, settings, parser)
    if args.command == "plan":
        return _plan(args, settings, parser)

    from kube.leader import LeaseElector
    from reconcilers.cluster import Cluster
    from reconcilers.metrics import ReconcilerMetrics
    from reconcilers.runner import Reconciler

    api_client = required_api_client("auto", "the reconcilers need")
    log.info("using the cluster at %s", check_api_server(api_client))
    history, sampler = _history(settings, api_client)
    metrics = ReconcilerMetrics()
    identity = f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaseElector(api_client, settings.namespace, settings.lease_name, identity,
                           settings.lease_duration_seconds)
    reconciler = Reconciler(Cluster(api_client), history, settings, leader=elector, metrics=metrics)
    if args.command == "remediate":
        return _remediate(args.dry_run, settings, api_client, elector, metrics)
    if args.command == "once":
        return _once(args.dry_run, sampler, elector, reconciler)
    _run(settings, api_client, sampler, elector, reconciler, metrics)


def _parser() -> Parser:
    parser = Parser(prog="python -m reconcilers", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="reconcile in a loop (leader-elected)")
    once = commands.add_parser("once", help="one pass (exit 1, saying why, when it could not decide everything)")
    once.add_argument("--dry-run", action="store_true", help="print the proposals, write nothing")
    remediate = commands.add_parser("remediate", help="one remediation pass on the current usage")
    remediate.add_argument("--dry-run", action="store_true",
                           help="print the plan (node, Pod, why, where it would go), evict nothing")
    backtest = commands.add_parser(
        "backtest", help="replay a usage trace through the whole system and its peers on one simulated cluster",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_cluster_arguments(backtest)
    backtest.add_argument("--out", type=Path, default=Path("backtest-report"), help="report directory")
    backtest.add_argument("--arrival-seed", type=int, default=0,
                          help="draws the moment of the day each Pod meets the load-aware extender")
    backtest.add_argument("--hot-time-budget", type=hot_time_budget, default=argparse.SUPPRESS, metavar="SHARE",
                          help="run the whole system at this cpu hot-time budget (0..1, e.g. 0.001 for 0.1%%); "
                               "default: OVERSALE_CPU_HOT_TIME_BUDGET, and a sweep of budgets from 0.01%% to 5%%")
    backtest.add_argument("--placements", type=int, default=1, metavar="N",
                          help="also replay our budget curve and its variants on N-1 other placements, ties among "
                               "the best-scoring nodes drawn at random as kube-scheduler draws them: the report's "
                               "budget sweep gives each split's hot time over the N, and each variant its change "
                               "against the curve of each placement (each about 70%% of the report's replay)")
    backtest.add_argument("--frontier", action="store_true",
                          help="also run the peers' variants along their main knob (about 2x longer)")
    backtest.add_argument("--peaks", type=Path, default=argparse.SUPPRESS, metavar="TRACE",
                          help="a trace of the same workloads holding each 5-minute slot's highest cpu reading "
                               "(the Azure V1 max files): the report adds each system's hot time counted at the "
                               "summed peaks, an upper bound of the time a node spent above capacity at some "
                               "moment; estimates and placement still read --trace")
    plan = commands.add_parser(
        "plan", help="replay the cluster's own history (from Prometheus) through the whole system, before "
                     "switching anything on", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    plan.add_argument("--prometheus", required=True, metavar="URL", default=argparse.SUPPRESS,
                      help="the Prometheus that scrapes kube-state-metrics and cAdvisor")
    plan.add_argument("--days", type=float, default=14, help="history to read (the days Prometheus holds, where "
                                                             "fewer); the first --warmup-days only give history, "
                                                             "the last half of the rest is the holdout")
    plan.add_argument("--warmup-days", type=int, default=7, help="days of history before the first replayed day")
    plan.add_argument("--step", default="5m", help="resolution of the history read")
    plan.add_argument("--out", type=Path, default=Path("plan-report"), help="report directory")
    plan.add_argument("--hot-time-budget", type=hot_time_budget, default=argparse.SUPPRESS, metavar="SHARE",
                      help="the budget whose ratios the plan lists (default: OVERSALE_CPU_HOT_TIME_BUDGET)")
    plan.add_argument("--placements", type=int, default=5, metavar="N",
                      help="replay our budget curve on N placements: the report's (ties among the best-scoring "
                           "nodes go to the first) and N-1 with ties drawn at random, as kube-scheduler draws "
                           "them; plan.md gives the hot time's range over them (1: the report's alone)")
    plan.add_argument("--peaks", action="store_true",
                      help="also read each Pod's highest cpu rate between two scrapes in each step (as backtest "
                           "--peaks): the report adds the hot time counted at the summed peaks, an upper bound of "
                           "the time a node spent above capacity at some moment (a heavier query)")
    add_debug_flag(parser)
    return parser


def _remediate(dry_run: bool, settings: Settings, api_client: Any, elector: LeaseElector,
               metrics: ReconcilerMetrics) -> int:
    """``remediate``: one remediation pass on the usage of now (one observation makes a node hot)."""
    from kube.metrics_api import MetricsAPI
    from reconcilers.cluster import Cluster
    from reconcilers.remediation import Remediator
    from reconcilers.runner import format_table

    one = dataclasses.replace(settings, hot_observations=1)
    remediator = Remediator(Cluster(api_client), MetricsAPI(api_client), one, leader=elector, metrics=metrics)
    if dry_run:
        remediator.leader = None
    elif not _lease_for_one_pass(elector):
        return 1
    try:
        rows = remediator.run_pass(dry_run=dry_run)
    finally:
        elector.release()
    if remediator.incomplete:
        if rows:
            print(format_table(rows))
        return _incomplete(remediator.incomplete)
    print(format_table(rows) if rows else "no node above its runtime watermark")
    return 0


def _incomplete(problems: list[str]) -> int:
    """A one-shot command's pass that could not do its whole job: one line saying why, exit 1 (a
    script or CronJob running it learns so; the table before it says what was done all the same)."""
    print(f"pass incomplete: {'; '.join(problems)}", file=sys.stderr)
    return 1


def _once(dry_run: bool, sampler: MetricsSampler | None, elector: LeaseElector, reconciler: Reconciler) -> int:
    """``once``: one pass of the reconcilers (a dry run takes no Lease and writes nothing)."""
    from reconcilers.runner import format_table
    from reconcilers.sqlite_history import SampleLost

    not_sampled = None
    if sampler is not None:
        try:
            sampler.sample()
            not_sampled = sampler.partly_lost
        except SampleLost as error:  # the pass still reads the history already held
            not_sampled = str(error)
        if not_sampled is not None:
            log.warning("%s", not_sampled)
    if dry_run:
        reconciler.leader = None
        rows = reconciler.run_pass(dry_run=True)
    else:
        if not _lease_for_one_pass(elector):
            return 1
        try:
            rows = reconciler.run_pass()
        finally:
            elector.release()
    print(format_table(rows))
    problems = [*([not_sampled] if not_sampled else []), *reconciler.incomplete]
    return _incomplete(problems) if problems else 0


def _run(settings: Settings, api_client: Any, sampler: MetricsSampler | None, elector: LeaseElector,
         reconciler: Reconciler, metrics: ReconcilerMetrics) -> NoReturn:
    """``run``: serve /metrics, sample (the SQLite source), observe nodes (and remediate where
    asked), and pass every interval while this replica holds the Lease, until SIGTERM or Ctrl-C."""
    from prometheus_client import start_http_server

    from kube.background import exit_without_finalizing

    address = settings.reconciler_metrics_address
    listening = f"{f'[{address}]' if ':' in address else address}:{settings.reconciler_metrics_port}"
    try:
        start_http_server(settings.reconciler_metrics_port, addr=address, registry=metrics.registry)
    except OSError as error:
        # Before the first election round: a replica that cannot be scraped leaves without
        # having taken the Lease.
        raise CliError(f"cannot serve /metrics on {listening}: {error.strerror or error} (set "
                       "OVERSALE_RECONCILER_METRICS_ADDRESS to an address of this host, "
                       "OVERSALE_RECONCILER_METRICS_PORT to a free port)") from None
    if sampler is not None:
        _sample_in_background(settings, sampler, metrics)
    # A rollout's SIGTERM: leave through SystemExit, wherever the main thread is, so the Lease is
    # given back and the next replica writes at its next round, not a Lease duration later.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(0))
    atexit.register(elector.release)  # on every way out: exit_without_finalizing runs it too
    try:
        # The first election round before the first pass: left to the elector's thread, it lost
        # the race to the loop's first is_leader() (6 starts of 6 in a test), and a replica
        # holding a free Lease made its first pass a whole interval later.
        elector.elect()
        elector.start()
        _observe_in_background(settings, api_client, elector, metrics)
        log.info("reconciling every %.0fs (metrics on %s)", settings.reconcile_interval_seconds, listening)
        _pass_while_leading(settings, elector, reconciler, metrics)
    except (SystemExit, KeyboardInterrupt) as stopped:
        exit_without_finalizing(130 if isinstance(stopped, KeyboardInterrupt) else stopped.code)


def _sample_in_background(settings: Settings, sampler: MetricsSampler, metrics: ReconcilerMetrics) -> None:
    """Read metrics-server ``OVERSALE_SAMPLE_READS`` times a sample interval into the SQLite history,
    on a thread of its own."""
    from kube.background import Trouble, run_every
    from reconcilers.sqlite_history import SampleLost

    # Readings and writes apart: a file that refuses every sample is not mended by the readings
    # that succeed between its writes.
    lost = {"reading": Trouble(log, "metrics API (metrics.k8s.io) readable again"),
            "writing": Trouble(log, f"usage history {sampler.history.path} written again")}

    def sample() -> None:
        try:
            written = sampler.read()
        except SampleLost as error:
            # One line, no traceback, when the losses start; each counted, as a file or a
            # metrics-server that fails now and then never makes the history stale enough for
            # OversaleHistoryStale.
            lost[error.step].failed(str(error))
            metrics.skips.labels("sample-lost").inc()
            return
        if sampler.partly_lost is not None:
            lost["reading"].failed(sampler.partly_lost)
            metrics.skips.labels("sample-lost").inc()
        else:
            lost["reading"].succeeded()
        if written is not None:
            lost["writing"].succeeded()
        metrics.history_span.set(sampler.history.span_seconds)
        if sampler.window is not None:
            metrics.usage_window.set(sampler.window)

    run_every(settings.sample_interval_seconds / settings.sample_reads, sample, "sampler", log)


def _observe_in_background(settings: Settings, api_client: Any, elector: LeaseElector,
                           metrics: ReconcilerMetrics) -> None:
    """The remediator on a thread of its own, every ``OVERSALE_REMEDIATION_INTERVAL`` while this
    replica leads. It always observes (node utilization and hot-node metrics, which the alerts
    read); it evicts only with ``OVERSALE_REMEDIATION=true``."""
    from kube.background import run_every
    from kube.metrics_api import MetricsAPI
    from reconcilers.cluster import Cluster
    from reconcilers.remediation import Remediator

    remediator = Remediator(Cluster(api_client), MetricsAPI(api_client), settings, leader=elector, metrics=metrics)

    def observe() -> None:
        leading = elector.is_leader()
        metrics.leader.set(1 if leading else 0)
        if leading:
            remediator.run_pass(dry_run=not settings.remediation, tidy=True)
        else:
            # Within a remediation interval of losing the Lease, not a reconcile interval: the
            # pass loop sleeps through its interval after a pass.
            metrics.forget_observations()

    run_every(settings.remediation_interval_seconds, observe, "remediator", log)
    log.info("observing nodes every %.0fs (%s)", settings.remediation_interval_seconds,
             "remediating hot oversold nodes" if settings.remediation else "remediation off: observing only")


def _pass_while_leading(settings: Settings, elector: LeaseElector, reconciler: Reconciler,
                        metrics: ReconcilerMetrics) -> NoReturn:
    """A pass every ``OVERSALE_RECONCILE_INTERVAL`` while this replica holds the Lease; a failed
    pass is logged and the next one comes at the next interval."""
    standing_by = False
    while True:
        started = time.monotonic()
        leading = elector.is_leader()
        metrics.leader.set(1 if leading else 0)
        if not leading:
            if not standing_by:
                log.info("not the leader: passing once this replica takes the Lease %s/%s", settings.namespace,
                         settings.lease_name)
            standing_by = True
            # Checked every election round, not every interval: the replica a rollout stops gives
            # the Lease back, and its successor should pass at once, not minutes later.
            time.sleep(elector.round_seconds)
            continue
        standing_by = False
        try:
            rows = reconciler.run_pass()
            written = sum(r.written for r in rows)
            log.log(logging.WARNING if reconciler.incomplete else logging.INFO,
                    "pass done in %.1fs: %d objects, %d ratios written%s", time.monotonic() - started,
                    len({r.object for r in rows}), written,
                    f"; incomplete: {'; '.join(reconciler.incomplete)}" if reconciler.incomplete else "")
        except Exception:  # a failed pass is retried at the next interval
            log.exception("pass failed")
            metrics.last_pass.labels("failed").set_to_current_time()
        time.sleep(max(1.0, settings.reconcile_interval_seconds - (time.monotonic() - started)))


def _backtest(args: argparse.Namespace, settings: Settings, parser: argparse.ArgumentParser) -> int:
    from simulator.cli import cluster_config, read_workloads, report_directory
    from simulator.policies import System, default_systems
    from simulator.replay import run
    from simulator.report import AT_PEAKS, budget_goal_text, other_placements, summary, write_report
    from simulator.trace import TraceError

    config = cluster_config(args, parser, args.arrival_seed)
    placements = placement_count(args, parser)
    report_directory(args.out, parser)
    budget = _chosen_budget(args, settings, parser)

    def replayed_systems() -> list[System]:
        return default_systems(settings.compression_estimator(), settings.oversale_estimator(), budget,
                               frontier=args.frontier, load=settings.load,
                               sweep=getattr(args, "hot_time_budget", None) is None)

    systems = replayed_systems()
    try:
        workloads = read_workloads(args, _log)
        result = run(workloads, config, systems, _log)
        placed = other_placements(workloads, config, replayed_systems, placements, _log, variants=True)
    except TraceError as error:
        raise CliError(str(error)) from None
    rows = summary(result, systems)
    data = write_report(args.out, rows, result, args.trace, config, placed)
    for split in ("tuning", "holdout"):
        if not data[f"{split}_days"]:
            print(f"{split} days: none (--holdout-days {config.holdout_days})")
            continue
        print(f"{split} days (clairvoyant bound frees {data['clairvoyant_by_split'][split]:.1%}):")
        for row in rows:
            figures = row[split]
            at_peaks = f"  at peaks {figures[AT_PEAKS]:.3%}" if AT_PEAKS in figures else ""
            print(f"  {row['policy']:<34} {row['kind']:<13} freed {figures['capacity_freed']:>6.1%}  cpu violations "
                  f"{figures['cpu_violation_rate']:.3%}{at_peaks}  memory violations "
                  f"{figures['memory_violation_rate']:.3%}")
        goal = data["budget_goal"].get(split)
        if len(data["budget_sweep"]) > 1 and goal and (said := budget_goal_text(goal, f"{split} days")):
            print("  " + said)  # the sweep's verdict, as in report.md
    print(f"report: {args.out / 'report.md'}")
    return 0


def _lease_for_one_pass(elector: LeaseElector) -> bool:
    """The Lease for one pass that writes: a holder that is gone shows as gone only once its
    record has gone unrenewed for a Lease duration on this machine's clock, so wait that long."""
    if elector.elect():
        return True
    wait = elector.duration + elector.round_seconds  # unrenewed that long, then one round to see it
    log.info("lease %s/%s not taken (%s): trying again for up to %.0fs", elector.namespace, elector.name,
             elector.not_leading_because, wait)
    if elector.acquire(wait):
        return True
    print(f"error: lease {elector.namespace}/{elector.name} not taken within {wait:.0f}s: "
          f"{elector.not_leading_because}", file=sys.stderr)
    return False


def _chosen_budget(args: argparse.Namespace, settings: Settings, parser: argparse.ArgumentParser) -> Any:
    chosen = getattr(args, "hot_time_budget", None)
    if chosen is None:
        return settings.budget
    return dataclasses.replace(settings.budget, cpu=chosen)


def _plan(args: argparse.Namespace, settings: Settings, parser: argparse.ArgumentParser) -> int:
    from kube.prometheus import PrometheusAccess
    from oversale.settings import parse_base_url, parse_duration
    from reconcilers.history import HistoryUnavailable
    from reconcilers.plan import PlanError, export_pools, read_cluster_history, write_plan
    from reconcilers.prometheus import PrometheusHistory
    from simulator.cli import report_directory

    try:
        step = parse_duration(args.step)
    except ValueError as error:
        parser.error(f"--step {args.step!r}: {error}")
    try:
        url = parse_base_url(args.prometheus)
    except ValueError as error:
        parser.error(f"--prometheus {args.prometheus!r}: {error}")
    if args.warmup_days < 1:
        parser.error(f"--warmup-days {args.warmup_days}: at least 1 day of history comes before the first replayed day")
    placements = placement_count(args, parser)
    if not math.isfinite(args.days):
        parser.error(f"--days {args.days:g}: a number of days")
    if args.days <= args.warmup_days:
        parser.error(f"--days {args.days:g} must exceed --warmup-days {args.warmup_days} (the first days only give "
                     "history)")
    budget = _chosen_budget(args, settings, parser)
    report_directory(args.out, parser)
    prometheus = PrometheusHistory(url, settings.prometheus_timeout_seconds, step,
                                   access=PrometheusAccess.from_settings(settings))
    try:
        history = read_cluster_history(prometheus, args.days, settings.pool_labels, _log, settings.keys,
                                       rescale_hpa=settings.rescale_hpa, peaks=args.peaks)
    except (PlanError, HistoryUnavailable) as error:
        raise CliError(str(error)) from None
    entries = {pool: _replay_pool(pool, pooled, args, settings, budget, placements)
               for pool, pooled in export_pools(history, args.out, args.peaks, _log).items()}
    if not entries:
        raise CliError("no pool with a known node size: kube_node_status_allocatable has no cpu and memory for the "
                       "nodes the Pods ran on")
    write_plan(args.out, entries, budget, args.days, prometheus.api, settings.keys.original_requests)
    print(f"plan: {args.out / 'plan.md'}")
    return 0


def _replay_pool(pool: str, pooled: PoolExport, args: argparse.Namespace, settings: Settings, budget: Any,
                 placements: int) -> dict[str, Any]:
    """Replay one pool's exported history as ``backtest`` replays a trace; its entry of the plan."""
    from reconcilers.plan import per_namespace, placement_curves, ratios_set
    from simulator.policies import OURS, System, default_systems
    from simulator.replay import Config, run, trace_days
    from simulator.report import budget_goal, other_placements, summary, write_report
    from simulator.trace import TraceError

    workloads = _pool_workloads(pool, pooled)
    held_days = trace_days(workloads)
    replayed = _replayed_days(pool, held_days, args)
    # The windows the live reconcilers would read; the first replayed days hold less, as a
    # cluster's first weeks under the reconcilers do.
    config = Config(pooled.size[0], int(pooled.size[1]), args.warmup_days, _days(settings.history_window_seconds),
                    replayed // 2, request_window_days=_days(settings.compression_window_seconds))

    def replayed_systems() -> list[System]:
        return default_systems(settings.compression_estimator(), settings.oversale_estimator(), budget,
                               load=settings.load)

    systems = replayed_systems()
    try:
        result = run(workloads, config, systems, _log)
        placed = other_placements(workloads, config, replayed_systems, placements, _log)
    except TraceError as error:
        raise CliError(f"pool {pool}: {error}") from None
    data = write_report(pooled.folder, summary(result, systems), result, pooled.export, config, placed)
    ours = result.last_day[OURS]
    return {"pods": pooled.pods, "node_cores": pooled.allocatable[0],
            "node_memory_bytes": pooled.allocatable[1], "node_bound_cores": pooled.bound[0],
            "node_bound_memory_bytes": pooled.bound[1], "oversold_nodes": pooled.oversold,
            "original_requests_pods": pooled.restored, "history_days": held_days,
            "summary": data,
            "retune": shlex.join(_retune_command(pooled, config, placements)),
            "namespaces": per_namespace(ours), "ratios": ratios_set(ours),
            "placements": placement_curves(data.get("placements") or [data["budget_sweep"]]),
            # The goal's verdict over every replayed day, as the plan's table reads them.
            "budget_goal": budget_goal(data["budget_sweep"], None, data.get("placements"))}


def _pool_workloads(pool: str, pooled: PoolExport) -> list[Workload]:
    """The pool's exported history read back as the replay's workloads, with their peaks where exported."""
    from simulator.trace import TraceError, attach_peaks, read_trace

    try:
        workloads = read_trace(pooled.export, "generic")
        if pooled.peaks_export is not None:
            _log(f"pool {pool}: " + attach_peaks(workloads, read_trace(pooled.peaks_export, "generic", peaks=True)))
    except TraceError as error:
        raise CliError(f"pool {pool}: {error}") from None
    return workloads


def _replayed_days(pool: str, held_days: int, args: argparse.Namespace) -> int:
    """The days replayed after the warm-up, of the ``held_days`` Prometheus holds of the pool."""
    # Prometheus may hold fewer days than asked (its retention: 15 by default, often set lower),
    # or the pool is younger: the holdout is half of the days replayed, not of those asked.
    if held_days <= args.warmup_days:
        raise CliError(f"pool {pool}: Prometheus holds {held_days} day{'' if held_days == 1 else 's'} of its history, "
                       "not more than the "
                       f"{args.warmup_days}-day warm-up: " + (
                           f"pass --warmup-days {max(1, held_days - 2)} or fewer" if held_days >= 2 else
                           "the plan needs 2 days at least (1 of warm-up)"))
    if held_days < int(args.days):
        _log(f"pool {pool}: Prometheus holds {held_days} of the {args.days:g} days asked (its retention, or the "
             f"pool is younger): {held_days - args.warmup_days} replayed after the {args.warmup_days}-day warm-up")
    return min(held_days, int(args.days)) - int(args.warmup_days)


def _retune_command(pooled: PoolExport, config: Config, placements: int) -> list[str]:
    """The tuner on the pool as it was just replayed (same nodes, warm-up, window and holdout)."""
    retune = ["python", "-m", "simulator.tune", "--trace", str(pooled.export), "--node-cores",
              f"{pooled.size[0]:g}", "--node-memory", str(int(pooled.size[1])),
              "--warmup-days", str(config.warmup_days), "--window-days", str(config.window_days),
              "--request-window-days", str(config.request_window_days), "--holdout-days", str(config.holdout_days)]
    if placements > 1:  # the tuner then scores each candidate on as many placements as the plan drew
        retune += ["--placements", str(placements)]
    return retune


def _days(seconds: float) -> int:
    """A window setting in the replay's whole days (at least one)."""
    return max(1, round(seconds / 86400))


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _history(settings: Settings, api_client: Any) -> tuple[History, MetricsSampler | None]:
    if settings.prometheus_url:
        from reconcilers.prometheus import PrometheusHistory

        prometheus = PrometheusHistory.from_settings(settings)
        log.info("usage history from %s", prometheus.api.described)
        return prometheus, None
    from reconcilers.sqlite_history import MetricsSampler, SqliteHistory, unusable

    try:
        history = SqliteHistory(Path(settings.sqlite_path), settings.history_retention_seconds,
                                settings.history_max_bytes)
    except (sqlite3.Error, OSError) as error:
        raise CliError(f"OVERSALE_SQLITE_PATH={settings.sqlite_path!r} cannot hold the usage history: "
                       f"{unusable(settings.sqlite_path, error)}") from None
    return history, MetricsSampler(api_client, history, settings.sample_reads, settings.sample_interval_seconds)


if __name__ == "__main__":
    sys.exit(run_cli(main))
