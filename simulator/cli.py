"""The command-line options every replay command shares: which trace, and what cluster it runs on.

``python -m reconcilers backtest`` and ``python -m simulator.tune`` both take them, so a pool that
``plan`` exported (``history.csv.gz``, nodes of the size ``plan`` printed) is tuned on the nodes it
has, not on the backtest's default ones.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from oversale.budget import parse_hot_time_budget
from oversale.errors import QuantityError
from oversale.quantity import parse_bytes
from oversale.settings import COMPRESSION_WINDOW_DAYS, NODE_WINDOW_DAYS
from simulator.formats import FORMAT_NAMES

if TYPE_CHECKING:  # the replay needs numpy: imported when a replay runs, not when a parser is built
    from simulator.replay import Config
    from simulator.trace import Workload

DEFAULT_VM_CORES = 4.0
"""The request of an Azure VM, as ``azure-wide`` traces have no VM sizes."""


class OneLineParser(argparse.ArgumentParser):
    """argparse telling a bad option in one line and exit code 2, as every entry point of the
    project does (the adapters' ``kube.cli.Parser``, which the simulator may not import)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists every option)\n")


def trace_failed(problem: object) -> int:
    """A trace the command cannot use (a ``TraceError`` or its message): one line, exit code 2,
    as a bad option is."""
    print(f"error: {problem}", file=sys.stderr)
    return 2


def hot_time_budget(text: str) -> float:
    """``--hot-time-budget``/``--budget``: read as OVERSALE_CPU_HOT_TIME_BUDGET is."""
    try:
        return parse_hot_time_budget(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--trace`` and its format, the node size and the replay's days (defaults: the backtest's)."""
    parser.add_argument("--trace", type=Path, required=True, default=argparse.SUPPRESS,
                        help="CSV or CSV.gz trace, or a directory of GWA-T-12's per-VM files")
    parser.add_argument("--format", choices=FORMAT_NAMES, default=argparse.SUPPRESS,
                        help="bitbrains-long (GWA-T-12 long CSV), generic (workload,timestamp_s,"
                             "cpu_request_cores,cpu_usage_cores,memory_request_bytes,memory_usage_bytes), "
                             "azure-wide (Azure V1 cpu readings: step_5min, one column per VM) or "
                             "bitbrains-raw (GWA-T-12 as the archive ships it: a file per VM, or a directory of "
                             "them, months in subdirectories); default: detected from the header, and a "
                             "directory is bitbrains-raw")
    parser.add_argument("--vm-cores", type=float, default=DEFAULT_VM_CORES,
                        help="azure-wide only: the cores each VM requests, as that trace has no VM sizes")
    parser.add_argument("--node-cores", type=float, default=32, help="node size in cores")
    parser.add_argument("--node-memory", default="256Gi", help="node memory")
    parser.add_argument("--warmup-days", type=int, default=7, help="days of history before the first scored day")
    parser.add_argument("--window-days", type=int, default=NODE_WINDOW_DAYS,
                        help="history window of the node ratios (OVERSALE_HISTORY_WINDOW's default)")
    parser.add_argument("--request-window-days", type=int, default=COMPRESSION_WINDOW_DAYS,
                        help="history window of the requests (OVERSALE_COMPRESSION_WINDOW's default; Crane-style "
                             "keeps its own 7 days)")
    parser.add_argument("--holdout-days", type=int, default=14,
                        help="the last days, reported apart as the holdout (nothing is tuned on them)")


def cluster_config(args: argparse.Namespace, parser: argparse.ArgumentParser, arrival_seed: int = 0) -> Config:
    """The replay's ``Config`` from the options; a bad one ends the command with a usage error."""
    from simulator.replay import Config

    try:
        memory = parse_bytes(args.node_memory)
    except QuantityError as error:
        parser.error(f"--node-memory: {error}")
    if not (math.isfinite(args.node_cores) and args.node_cores > 0):
        parser.error(f"--node-cores {args.node_cores:g}: a node's cores must be a positive number")
    if memory <= 0:
        parser.error(f"--node-memory {args.node_memory}: a node's memory must be above 0")
    for option, days, least in (("--warmup-days", args.warmup_days, 1), ("--window-days", args.window_days, 1),
                                ("--request-window-days", args.request_window_days, 1),
                                ("--holdout-days", args.holdout_days, 0)):
        if days < least:
            parser.error(f"{option} {days}: at least {least} " + ("day" if least == 1 else "days (0: no holdout)"))
    if not (math.isfinite(args.vm_cores) and args.vm_cores > 0):
        parser.error(f"--vm-cores {args.vm_cores:g}: a VM's cores must be a positive number")
    if arrival_seed < 0:
        parser.error(f"--arrival-seed {arrival_seed}: a seed is a whole number from 0")
    return Config(args.node_cores, memory, args.warmup_days, args.window_days, args.holdout_days, arrival_seed,
                  request_window_days=args.request_window_days)


def placement_count(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``--placements``: how many placements a replay command runs (at least the one that gives
    each tie among the best-scoring nodes to the first node); a bad one ends the command."""
    if args.placements < 1:
        parser.error(f"--placements {args.placements}: at least 1 (the one that gives each tie to the first node)")
    return int(args.placements)


def read_workloads(args: argparse.Namespace, progress: Callable[[str], None]) -> list[Workload]:
    """The trace the options name, with the ``--peaks`` trace's cpu peaks where the command has
    that option and it is given (``TraceError`` when either cannot be read)."""
    from simulator.trace import TraceError, attach_peaks, read_trace

    workloads = read_trace(args.trace, getattr(args, "format", None), progress, args.vm_cores)
    if getattr(args, "peaks", None) is not None:
        progress(f"peaks: {args.peaks}")
        peaks = read_trace(args.peaks, getattr(args, "format", None), progress, args.vm_cores, peaks=True)
        try:
            progress(attach_peaks(workloads, peaks))
        except TraceError as error:
            raise TraceError(f"{args.peaks}: {error}") from None
    return workloads


def json_file(path: Path | None, parser: argparse.ArgumentParser) -> None:
    """``--json``, checked before the work as ``--out`` is: a path that cannot be written is told
    at once, not after minutes of replay."""
    if path is not None and (path.is_dir() or not os.access(path.absolute().parent, os.W_OK)):
        parser.error(f"--json {path}: not a file that can be written")


def report_directory(path: Path, parser: argparse.ArgumentParser) -> Path:
    """``--out``, checked before a replay that may take minutes, so a path that cannot hold the
    report is told at once rather than after the work is done and lost; nothing is created here
    (a command that then fails leaves no empty folder behind)."""
    if path.exists() and not path.is_dir():
        parser.error(f"--out {path}: a file, not a directory")
    existing = next(parent for parent in (path, *path.absolute().parents) if parent.exists())
    if not existing.is_dir():
        parser.error(f"--out {path}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        parser.error(f"--out {path}: {existing} is not writable")
    return path
