"""Usage traces: (workload, time, requested, used) rows read into per-workload arrays."""

from __future__ import annotations

import csv
import gzip
import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from oversale.quantity import CPU, MEMORY
from simulator.formats import (
    AZURE_STEP,
    BITBRAINS_COLUMNS,
    BITBRAINS_RAW,
    BITBRAINS_RAW_COLUMNS,
    FIXED_COLUMN,
    FORMATS,
    GENERIC_COLUMNS,
    WIDE_FORMATS,
)

SLOT = 300
"""Seconds per sample slot (the traces sample every 5 minutes)."""
DAY = 86400
GIB = 2**30
MILLI = 1000  # cpu amounts are kept in millicores, as everywhere else in oversale
LATEST_SECONDS = 1e11
"""Past any time in seconds (the year 5138); the epoch in milliseconds has been above it since 1973."""


class TraceError(ValueError):
    """The trace cannot be read (missing file, wrong format, missing columns, no usable rows)."""


@dataclass
class Workload:
    """One workload's samples, sorted, de-duplicated, powered-off rows dropped."""

    name: str
    slots: np.ndarray
    request: dict[str, np.ndarray]
    usage: dict[str, np.ndarray]
    fixed: frozenset[str] = frozenset()
    """Resources whose request no right-sizing changes (the trace's ``fixed_resources``)."""
    peak_cpu: np.ndarray | None = None
    """Per slot, the highest cpu reading within it (:func:`attach_peaks`); None: only averages known."""


def attach_peaks(workloads: list[Workload], peaks: list[Workload]) -> str:
    """Give each workload its cpu peak in each slot from ``peaks``, a trace of the same workloads
    whose cpu readings are each slot's highest (the Azure V1 ``max`` files beside the ``avg``
    ones). A slot ``peaks`` has no reading of, or one below the slot's average (two exports
    rounded apart), keeps the average: a peak is never below it. Returns the line that says how
    many matched; a ``TraceError`` when no workload is in both traces (a wrong file)."""
    by_name = {peak.name: peak for peak in peaks}
    matched = slots = 0
    for workload in workloads:
        average = workload.usage[CPU]
        peak = by_name.get(workload.name)
        if peak is None:
            # Its averages stand: every day of a trace with peaks then counts at the peaks.
            workload.peak_cpu = average
            continue
        at = np.minimum(np.searchsorted(peak.slots, workload.slots), len(peak.slots) - 1)
        found = peak.slots[at] == workload.slots
        workload.peak_cpu = np.maximum(average, np.where(found, peak.usage[CPU][at], average))
        matched += 1
        slots += int(found.sum())
    if not matched:
        raise TraceError(f"the peaks trace names none of the trace's {len(workloads)} workloads (its "
                         f"{len(peaks)} are, for example, {', '.join(sorted(by_name)[:3])})")
    total = sum(len(w.slots) for w in workloads)
    return (f"peaks of {matched} of {len(workloads)} workloads, {slots:,} of {total:,} workload-slots (the rest "
            "count at their averages)")


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")


def detect_format(path: Path) -> str:
    """The format whose columns the file's header holds."""
    try:
        with _open(path) as handle:
            first = handle.readline()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: cannot read it ({error})") from None
    if first.split(";", 1)[0].strip() == BITBRAINS_RAW_COLUMNS[0]:
        return BITBRAINS_RAW
    header = set(next(csv.reader([first]), []))
    for name, columns in FORMATS.items():
        if header.issuperset(columns):
            return name
    for name, leading in WIDE_FORMATS.items():
        if leading in header:
            return name
    raise TraceError(f"{path}: the header matches no known format; bitbrains-long needs {', '.join(BITBRAINS_COLUMNS)}"
                     f"; generic needs {', '.join(GENERIC_COLUMNS)}; azure-wide starts with {AZURE_STEP}; "
                     f"{BITBRAINS_RAW} starts with '{BITBRAINS_RAW_COLUMNS[0]};'")


def read_trace(path: Path, fmt: str | None = None, progress: Callable[[str], None] = lambda m: None,
               vm_cores: float | None = None, peaks: bool = False) -> list[Workload]:
    """``bitbrains-long`` (the GWA-T-12 long CSV), ``generic`` (workload,timestamp_s,
    cpu_request_cores,cpu_usage_cores,memory_request_bytes,memory_usage_bytes), ``azure-wide``
    (``step_5min`` then one column per VM, each VM requesting ``vm_cores``, which that format
    needs: it has no sizes) or ``bitbrains-raw`` (GWA-T-12's own per-VM files: one, or a
    directory of them); None: from the header, and a directory is ``bitbrains-raw``. With
    ``peaks``, the cpu readings are peaks (:func:`attach_peaks`): a slot's cpu is its highest."""
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        if fmt not in (None, BITBRAINS_RAW):
            raise TraceError(f"{path}: a directory, not a trace file (only {BITBRAINS_RAW} reads a directory: "
                             "GWA-T-12's files, one per VM)")
        fmt = BITBRAINS_RAW
    fmt = fmt or detect_format(path)
    if fmt in WIDE_FORMATS:
        if vm_cores is None:
            raise TraceError(f"{path}: an {fmt} trace has no VM sizes: say how many cores each VM requests")
        return _read_wide(path, vm_cores, progress)
    rows = _Rows()
    if fmt == BITBRAINS_RAW:
        _read_raw(path, rows, progress)
    else:
        _read_long(path, fmt, rows, progress)
    if not rows.columns:
        raise TraceError(f"{path}: no usable rows")
    return _on_the_grid(rows, progress, peaks)


class _Rows:
    """Each workload's rows as columns of machine numbers as they are read (about 40 bytes a row;
    a dict of tuples of floats took many times that: 1.2 GB for the July trace's 4.3 million rows)."""

    def __init__(self) -> None:
        self.columns: dict[str, tuple[array[int], array[float], array[float], array[float], array[float]]] = {}
        self.fixed: dict[str, set[str]] = {}
        self.read = 0

    def add(self, parsed: tuple[str, int, tuple[float, float, float, float]] | None) -> None:
        """One row as a row parser read it (None: a row that is not replayed)."""
        if parsed is None:
            return
        name, ts, values = parsed
        columns = self.columns.get(name)
        if columns is None:
            columns = self.columns[name] = (array("q"), array("d"), array("d"), array("d"), array("d"))
        columns[0].append(ts)
        for column, value in zip(columns[1:], values, strict=True):
            column.append(value)


def _read_long(path: Path, fmt: str, rows: _Rows, progress: Callable[[str], None]) -> None:
    """A long CSV (``bitbrains-long``, ``generic``): one row per workload and time."""
    try:
        with _open(path) as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in FORMATS[fmt] if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: not a {fmt} trace (missing columns: {', '.join(missing)})")
            for row in reader:
                rows.read += 1
                if rows.read % 500000 == 0:
                    progress(f"read {rows.read:,} rows")
                if fmt == "bitbrains-long":
                    rows.add(_bitbrains_row(row["vm_id"], row, BITBRAINS_COLUMNS[1:]))
                    continue
                rows.add(_generic_row(row))
                if row.get(FIXED_COLUMN):
                    rows.fixed.setdefault(row["workload"], set()).update(_fixed_resources(row[FIXED_COLUMN]))
    except (OSError, KeyError, ValueError, csv.Error) as error:
        if isinstance(error, TraceError):
            raise
        raise TraceError(f"{path}: not a {fmt} trace (row {rows.read + 1}: {error})") from None


def _raw_vm(path: Path) -> str | None:
    """The VM a GWA-T-12 file holds: its name without ``.csv`` or ``.csv.gz`` (None: not such a file)."""
    for suffix in (".csv.gz", ".csv"):
        if path.name.endswith(suffix) and not path.name.startswith("."):
            return path.name[:-len(suffix)]
    return None


def _read_raw(path: Path, rows: _Rows, progress: Callable[[str], None]) -> None:
    """GWA-T-12's own files, one per VM, named by it: one file, or a directory's files and its
    subdirectories' files (no deeper), where files of one name in several subdirectories (the
    archive's months, ``2013-7/1.csv`` and ``2013-8/1.csv``) are one VM. The archive's header
    says ``Timestamp [ms]``, but its values are Unix seconds: read as seconds, a time in
    milliseconds being refused as in every format."""
    # The archive's depth and no deeper: a directory given by mistake (a home, "/") is not walked.
    found = [*path.glob("*"), *path.glob("*/*")] if path.is_dir() else [path]
    files = sorted((vm, p) for p in found if p.is_file() and (vm := _raw_vm(p)))
    if not files:
        raise TraceError(f"{path}: holds no .csv or .csv.gz files (GWA-T-12 has one per VM)")
    for number, (vm, file) in enumerate(files, 1):
        line = 1
        try:
            with _open(file) as handle:
                header = [column.strip() for column in handle.readline().split(";")]
                missing = [c for c in BITBRAINS_RAW_COLUMNS if c not in header]
                if missing:
                    raise TraceError(f"{file}: not a {BITBRAINS_RAW} file (missing columns: {', '.join(missing)})")
                at = [header.index(c) for c in BITBRAINS_RAW_COLUMNS]
                for text in handle:
                    line += 1
                    if not text.strip():
                        continue
                    fields = text.split(";")
                    if len(fields) != len(header):
                        raise ValueError(f"{len(fields)} columns, the header {len(header)}")
                    rows.read += 1
                    rows.add(_bitbrains_row(vm, {c: fields[i] for c, i in zip(BITBRAINS_RAW_COLUMNS, at, strict=True)},
                                            BITBRAINS_RAW_COLUMNS))
        except (OSError, ValueError, UnicodeDecodeError) as error:
            if isinstance(error, TraceError):
                raise
            raise TraceError(f"{file}: not a {BITBRAINS_RAW} file (row {line}: {error})") from None
        if number % 100 == 0:
            progress(f"read {number:,} of {len(files):,} files")


def _on_the_grid(rows: _Rows, progress: Callable[[str], None], peaks: bool) -> list[Workload]:
    """Every workload's rows on the 5-minute grid, by the trace's own sampling interval."""
    # One sampling scheme per trace: a few extra readings of one VM (Bitbrains' July trace has one
    # such VM among 500 sampled every 5 minutes) do not make the trace a finer one.
    intervals = [float(np.median(np.diff(np.unique(np.frombuffer(columns[0], dtype=np.int64)))))
                 for columns in rows.columns.values() if len(columns[0]) > 1]
    interval = float(np.median(intervals)) if intervals else float(SLOT)
    fine = interval < SLOT
    # A coarser trace's reading stands for the slots until the next one (at most its interval, so
    # a gap stays a gap): a node's usage in a slot sums every workload on it, not the few whose
    # readings happen to fall there (a trace's VMs each keep their own clock).
    hold = max(1, round(interval / SLOT))
    end = max(int(np.frombuffer(columns[0], dtype=np.int64).max()) for columns in rows.columns.values()) // SLOT
    cpu_in_slot = "max" if peaks else "mean" if fine else "last"
    workloads = [_into_slots(name, np.frombuffer(time_column, dtype=np.int64),
                             [np.frombuffer(column, dtype=np.float64) for column in value_columns],
                             frozenset(rows.fixed.get(name, ())), cpu_in_slot=cpu_in_slot, hold=hold, end=end)
                 for name, (time_column, *value_columns) in rows.columns.items()]
    rows.columns.clear()
    progress(f"{rows.read:,} rows, {len(workloads)} workloads")
    if hold > 1:
        progress(f"sampled every {interval:g} s (the workloads' median interval): each reading is held over the "
                 f"{SLOT // 60}-minute slots until the next, at most {hold}; a burst shorter than that is not in "
                 "the trace, and the hot time reads low by as much")
    if fine and peaks:
        progress(f"sampled more often than every {SLOT // 60} minutes (the workloads' median interval "
                 f"{interval:g} s): each {SLOT // 60}-minute slot's peak is its highest reading")
    elif fine:
        progress(f"sampled more often than every {SLOT // 60} minutes (the workloads' median interval "
                 f"{interval:g} s): cpu usage is averaged over each {SLOT // 60}-minute slot, as "
                 "rate() over the default 5-minute window reads it live; memory and requests are the slot's "
                 "last reading, as a gauge is read at each step")
    return workloads


def _into_slots(name: str, times: np.ndarray, columns: list[np.ndarray], fixed: frozenset[str],
                cpu_in_slot: str, hold: int, end: int) -> Workload:
    """One workload's rows (cpu request, cpu usage, memory request, memory usage, in file order)
    on the 5-minute grid. Rows twice for one time (concatenated exports): the last read wins. In a
    trace sampled every 5 minutes, a slot holding two readings (a clock drifting across a slot's
    edge) keeps the last (``cpu_in_slot`` "last"): each reading is already a 5-minute figure. In
    one sampled finer ("mean": a 1-minute or 30-second export), the slot's cpu is the mean of its
    readings, which the live account's ``rate()`` over 5 minutes sees; the last reading alone
    would replay one minute in five as the whole slot's load. A trace of peaks ("max") keeps a
    slot's highest cpu reading, whatever its sampling. In one sampled coarser, each
    reading is held over the slots until the next, at most ``hold``, and never past ``end``, the
    slot of the trace's last reading (held further, the trace would grow a sliver of a day in
    which only some of its workloads run)."""
    # A stable sort keeps the file's order among rows of one time.
    order = np.argsort(times, kind="stable")
    times = times[order]
    once = np.append(times[1:] != times[:-1], True)
    times = times[once]
    cpu_request, cpu_usage, memory_request, memory_usage = (column[order][once] for column in columns)
    slots = times // SLOT
    edges = slots[1:] != slots[:-1]
    last = np.append(edges, True)
    if cpu_in_slot == "last":
        cpu_used = cpu_usage[last]
    else:
        first = np.flatnonzero(np.append(True, edges))
        cpu_used = (np.maximum.reduceat(cpu_usage, first) if cpu_in_slot == "max" else
                    np.add.reduceat(cpu_usage, first) / np.diff(np.append(first, len(slots))))
    slots, values = slots[last], [cpu_request[last], memory_request[last], cpu_used, memory_usage[last]]
    if hold > 1:
        spans = np.minimum(np.diff(np.append(slots, min(slots[-1] + hold, end + 1))), hold)
        slots = np.repeat(slots, spans) + (np.arange(int(spans.sum())) - np.repeat(np.cumsum(spans) - spans, spans))
        values = [np.repeat(column, spans) for column in values]
    cpu_request, memory_request, cpu_used, memory_used = values
    return Workload(name, slots, {CPU: cpu_request * MILLI, MEMORY: memory_request},
                    {CPU: cpu_used * MILLI, MEMORY: memory_used}, fixed)


def _read_wide(path: Path, vm_cores: float, progress: Callable[[str], None]) -> list[Workload]:
    """The Azure V1 readings: step ``n`` is ``(n - 1) x 5`` minutes after the trace's start (it
    has no absolute time), usage is ``percent / 100 x vm_cores``. The trace has no VM sizes and no
    memory: every VM requests ``vm_cores`` and no memory, so only cpu is evaluated."""
    if vm_cores <= 0:
        raise TraceError(f"{path}: a VM's cores must be positive, not {vm_cores}")
    steps: list[int] = []
    values: list[list[float]] = []
    try:
        with _open(path) as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            if not header or header[0] != AZURE_STEP:
                raise TraceError(f"{path}: not an azure-wide trace (its first column must be {AZURE_STEP})")
            for number, row in enumerate(reader, 2):
                if len(row) != len(header):
                    raise TraceError(f"{path}: not an azure-wide trace (row {number} has {len(row)} columns, "
                                     f"the header {len(header)})")
                steps.append(int(row[0]))
                values.append([float(v) if v not in ("", "NA") else math.nan for v in row[1:]])
    except (OSError, ValueError, csv.Error) as error:
        if isinstance(error, TraceError):
            raise
        raise TraceError(f"{path}: not an azure-wide trace ({error})") from None
    if not steps:
        raise TraceError(f"{path}: no usable rows")
    slots = np.array(steps, dtype=np.int64) - 1
    table = np.array(values, dtype=np.float64)
    workloads = []
    for column, name in enumerate(header[1:]):
        known = ~np.isnan(table[:, column])
        if known.any():
            used = table[known, column] / 100 * vm_cores * MILLI
            workloads.append(Workload(name.split()[0], slots[known],  # periodic files add "<period h>"
                                      {CPU: np.full(len(used), vm_cores * MILLI), MEMORY: np.zeros(len(used))},
                                      {CPU: used, MEMORY: np.zeros(len(used))}))
    progress(f"{len(steps):,} steps, {len(workloads)} VMs of {vm_cores:g} cores")
    return workloads


def _fixed_resources(text: str) -> set[str]:
    """The ``fixed_resources`` column's resources, or the ValueError that names the row."""
    named = set(text.split())
    if not named <= {CPU, MEMORY}:
        raise ValueError(f"{FIXED_COLUMN} {text!r} names no resource but cpu and memory")
    return named


def _amount(row: dict[str, str], column: str) -> float:
    """A column's amount: finite and not negative (a NaN or a negative usage would pass every
    comparison the replay makes unnoticed), else the ValueError that names the row."""
    value = float(row[column])
    if not 0 <= value < math.inf:
        raise ValueError(f"{column} {row[column]!r} is not a finite amount of at least 0")
    return value


def _seconds(row: dict[str, str], column: str = "timestamp_s") -> int:
    """Seconds since the epoch or since the trace's start. An export in milliseconds would read
    as a trace a thousand times as long, each reading held or spread over slots it does not
    cover: refused by its row instead."""
    value = float(row[column])
    if not 0 <= value < LATEST_SECONDS:
        raise ValueError(f"{column} {row[column]!r} is not a time in seconds (since the epoch or the "
                         "trace's start; milliseconds?)")
    return int(value)


def _bitbrains_row(vm: str, row: dict[str, str],
                   columns: tuple[str, ...]) -> tuple[str, int, tuple[float, float, float, float]] | None:
    """A GWA-T-12 reading; ``columns`` name its time, cores, provisioned MHz, used MHz,
    provisioned KB and used KB (the long CSV's names or the archive's own)."""
    time, cores_column, capacity_column, usage_column, memory_column, memory_usage_column = columns
    cores = _amount(row, cores_column)
    capacity_mhz = _amount(row, capacity_column)
    if cores <= 0 or capacity_mhz <= 0:
        return None  # powered off
    per_core = capacity_mhz / cores
    return (vm, _seconds(row, time),
            (cores, _amount(row, usage_column) / per_core,
             _amount(row, memory_column) * 1024, _amount(row, memory_usage_column) * 1024))


def _generic_row(row: dict[str, str]) -> tuple[str, int, tuple[float, float, float, float]] | None:
    values = (_amount(row, "cpu_request_cores"), _amount(row, "cpu_usage_cores"), _amount(row, "memory_request_bytes"),
              _amount(row, "memory_usage_bytes"))
    # No cpu requested and nothing used: not running (a powered-off VM). A workload requesting
    # no cpu that uses some (BestEffort, or memory requests only) runs, and loads its node.
    if values[0] <= 0 and values[1] <= 0 and values[3] <= 0:
        return None
    return row["workload"], _seconds(row), values
