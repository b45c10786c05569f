"""Usage history for clusters without Prometheus: the metrics API (metrics-server) sampled on an
interval into a local SQLite file.

Compact: one row per series (kind, namespace, pod, container) and one ``WITHOUT ROWID`` row per
sample with integer millicores and bytes, about 23 bytes a sample as the sampler writes them;
samples older than the retention are deleted on each write pass, series by series along the
primary key (an index on time alone took 40% of the file). The file is also kept under a size:
past it, the oldest samples go first, and the history holds less than the retention (a warning
says how much). The kubelet evicts a Pod whose emptyDir outgrows its ``sizeLimit``, and the
history with it. On a persistent volume the history survives restarts; on an emptyDir it starts
again.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from kubernetes.client.exceptions import ApiException

from kube.client import one_line
from kube.metrics_api import MetricsAPI
from oversale.budget import HotTime, hot_time
from oversale.estimator import summarize
from reconcilers.cluster import API_FAILURES
from reconcilers.history import ContainerKey, HistoryUnavailable, ResourceStats

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,            -- 'container' or 'node'
    namespace TEXT NOT NULL,
    pod TEXT NOT NULL,             -- the node name for kind 'node'
    container TEXT NOT NULL,
    UNIQUE (kind, namespace, pod, container)
);
CREATE TABLE IF NOT EXISTS samples (
    series INTEGER NOT NULL REFERENCES series (id),
    ts INTEGER NOT NULL,           -- seconds
    cpu INTEGER NOT NULL,          -- millicores
    memory INTEGER NOT NULL,       -- bytes
    PRIMARY KEY (series, ts)
) WITHOUT ROWID;
DROP INDEX IF EXISTS samples_by_time;  -- files written before pruning went series by series
"""
TRIM_TO = 0.9
"""Past its size, the history is cut to this share of it: room for several passes before the next cut."""
DAMAGED = ("not a database", "malformed")
"""What SQLite says of a file whose pages are not (or no longer) a database of its own."""


def unusable(path: Path | str, error: sqlite3.Error | OSError) -> str:
    """Why the history file cannot be used, with what to do where the file itself is damaged (a
    volume lost mid-write, another file named by mistake). Never deleted here: it may be some
    other program's file the setting points at."""
    hint = ("; move it away and restart the reconcilers to start the history afresh"
            if any(d in str(error) for d in DAMAGED) else "")
    return f"{error}{hint}"


class SampleLost(Exception):
    """A reading or a sample the history did not get: the metrics API failed (metrics-server
    down, not installed; ``step`` "reading"), or the file refused the write (its disk full, the
    file damaged; "writing"). The history already held stays readable, so a pass can still
    decide on it."""

    def __init__(self, message: str, step: Literal["reading", "writing"]) -> None:
        super().__init__(message)
        self.step = step


class SqliteHistory:
    """The usage history where no Prometheus is configured: metrics-server's readings, sampled by
    :class:`MetricsSampler` into one SQLite file, kept ``retention_seconds`` (and under
    ``max_bytes``), and read back as the same stats :class:`~reconcilers.prometheus.PrometheusHistory` gives."""

    def __init__(self, path: Path, retention_seconds: float, max_bytes: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.retention = retention_seconds
        self.max_bytes = max_bytes
        self.span_seconds = 0.0
        """From the oldest sample to the newest, after the last write: up to the retention, less
        while the history is young or once its size cut the oldest samples."""
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.executescript("PRAGMA journal_mode=WAL;" + SCHEMA)

    def close(self) -> None:
        self._db.close()

    # -- writing -----------------------------------------------------------------------------
    def record(self, ts: float, containers: Iterable[tuple[ContainerKey, int, int]],
               nodes: Iterable[tuple[str, int, int]]) -> int:
        """Store one sampling pass; returns how many samples were written. Prunes old ones."""
        rows = [("container", *key, cpu, memory) for key, cpu, memory in containers]
        rows += [("node", "", name, "", cpu, memory) for name, cpu, memory in nodes]
        try:
            self._record(ts, rows)
        except sqlite3.Error as error:
            raise SampleLost(f"usage history {self.path} not written, this sample is lost: "
                             f"{unusable(self.path, error)}", "writing") from error
        return len(rows)

    def _record(self, ts: float, rows: list[tuple[str, str, str, str, int, int]]) -> None:
        # One transaction: a write the file refuses leaves the history as it was.
        with self._lock, self._db:
            for kind, namespace, pod, container, cpu, memory in rows:
                series = self._series_id(kind, namespace, pod, container)
                self._db.execute("INSERT OR REPLACE INTO samples VALUES (?, ?, ?, ?)", (series, int(ts), cpu, memory))
            self._prune(int(ts - self.retention))
            used = self.used_bytes()
            if self.max_bytes is not None and used > self.max_bytes:
                # Samples are spread evenly over time, so cutting the oldest share of the span
                # frees about that share of the file.
                kept = (ts - self._oldest(ts)) * TRIM_TO * self.max_bytes / used
                self._prune(int(ts - kept))
                log.warning("usage history at %.1f MiB, over its %.1f MiB (OVERSALE_HISTORY_MAX_SIZE): the oldest "
                            "samples deleted, %.1f days kept of the %.1f days of OVERSALE_HISTORY_RETENTION (give it "
                            "more room, sample less often, or use Prometheus)", used / 2**20, self.max_bytes / 2**20,
                            kept / 86400, self.retention / 86400)
            self.span_seconds = ts - self._oldest(ts)

    def _oldest(self, otherwise: float) -> float:
        """The time of the oldest sample (each series' first, one lookup of its primary key)."""
        oldest = self._db.execute("SELECT min((SELECT min(ts) FROM samples WHERE samples.series = s.id)) "
                                  "FROM series AS s").fetchone()[0]
        return float(oldest) if oldest is not None else otherwise

    def used_bytes(self) -> int:
        """The bytes the history's pages hold (the file never shrinks: freed pages are reused)."""
        pages = [int(self._db.execute(f"PRAGMA {name}").fetchone()[0])
                 for name in ("page_size", "page_count", "freelist_count")]
        return pages[0] * (pages[1] - pages[2])

    def _prune(self, before: int) -> None:
        """Delete the samples older than ``before``: each series' as one range of the primary
        key, then the series left without samples."""
        series = [row[0] for row in self._db.execute("SELECT id FROM series")]
        self._db.executemany("DELETE FROM samples WHERE series = ? AND ts < ?", ((s, before) for s in series))
        self._db.execute("DELETE FROM series WHERE NOT EXISTS (SELECT 1 FROM samples WHERE samples.series = series.id)")

    def _series_id(self, kind: str, namespace: str, pod: str, container: str) -> int:
        found = self._db.execute("SELECT id FROM series WHERE kind=? AND namespace=? AND pod=? AND container=?",
                                 (kind, namespace, pod, container)).fetchone()
        if found:
            return int(found[0])
        cursor = self._db.execute("INSERT INTO series (kind, namespace, pod, container) VALUES (?, ?, ?, ?)",
                                  (kind, namespace, pod, container))
        return int(cursor.lastrowid or 0)

    # -- reading -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _readable(self) -> Iterator[None]:
        """A read the file fails (damaged since it was opened, its disk failing) is a history
        unavailable, as an unreachable Prometheus is: the pass holds the ratios and says why."""
        try:
            yield
        except sqlite3.Error as error:
            raise HistoryUnavailable(f"usage history {self.path} unreadable: {unusable(self.path, error)}") \
                from error

    def container_stats(self, window: float, quantile: float) -> dict[ContainerKey, ResourceStats]:
        with self._readable():
            return {(n, p, c): stats for (n, p, c), stats in self._stats("container", window, quantile).items()}

    def node_stats(self, window: float, quantile: float, memory_quantile: float | None = None,
                   counts_from: Mapping[str, ResourceStats] | None = None,
                   steps_counted: Mapping[str, Mapping[str, HotTime]] | None = None) -> dict[str, ResourceStats]:
        # Neither counts_from nor steps_counted is needed: the rows read for the quantiles are the
        # samples counted.
        with self._readable():
            return {pod: stats for (_, pod, _), stats in self._stats("node", window, quantile, memory_quantile).items()}

    def node_hot_time(self, windows: Sequence[float],
                      real: dict[str, dict[str, float]]) -> list[dict[str, dict[str, HotTime]]]:
        # One read of the longest window; the shorter ones are its tails.
        now = time.time()
        results: list[dict[str, dict[str, HotTime]]] = [{} for _ in windows]
        with self._readable():
            for (_, node, _), samples in self._each_series("node", max(windows) if windows else 0.0, now):
                if node not in real or not windows:
                    continue
                for result, window in zip(results, windows, strict=True):
                    recent = [s for s in samples if s[0] >= int(now - window)]
                    result[node] = {resource: hot_time((s[position] for s in recent), real[node][resource])
                                    for position, resource in ((1, "cpu"), (2, "memory")) if resource in real[node]}
        return results

    def node_peaks(self, window: float) -> dict[str, dict[str, float]]:
        with self._readable():
            return {node: {"cpu": float(max(s[1] for s in samples)), "memory": float(max(s[2] for s in samples))}
                    for (_, node, _), samples in self._each_series("node", window, time.time())}

    def check_node_names(self, found: Collection[str], nodes: Collection[str]) -> None:
        """Nothing to check: sampled from NodeMetrics, which the metrics API names after the nodes."""

    def check_rate_window(self) -> None:
        """Nothing to check: each sample averages readings the sampler takes itself (the sampler logs
        metrics-server's window)."""

    def _each_series(self, kind: str, window: float, now: float
                     ) -> Iterator[tuple[ContainerKey, list[tuple[int, int, int]]]]:
        """Each series' samples over the window, oldest first, one series at a time: a cluster's
        whole history as Python tuples would take gigabytes (8 days of 1,000 containers at 5
        minutes are 2.3 million rows). Read on a connection of its own, which in WAL mode never
        blocks the sampler's writes (a sample written meanwhile may or may not be read)."""
        # Read-only: a file moved away meanwhile is "unable to open", never made again empty here.
        reader = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            series = reader.execute("SELECT id, namespace, pod, container FROM series WHERE kind = ? ORDER BY id",
                                    (kind,)).fetchall()
            for number, namespace, pod, container in series:
                # The primary key (series, ts) answers this as one range, already in order.
                samples = reader.execute("SELECT ts, cpu, memory FROM samples WHERE series = ? AND ts >= ? "
                                         "ORDER BY ts", (number, int(now - window))).fetchall()
                if samples:
                    yield (namespace, pod, container), samples
        finally:
            reader.close()

    def _stats(self, kind: str, window: float, quantile: float,
               memory_quantile: float | None = None) -> dict[ContainerKey, ResourceStats]:
        now = time.time()
        return {key: ResourceStats(
                    cpu=summarize([(t, c) for t, c, _ in samples], quantile, now),
                    memory=summarize([(t, m) for t, _, m in samples],
                                     quantile if memory_quantile is None else memory_quantile, now))
                for key, samples in self._each_series(kind, window, now)}


class MetricsSampler:
    """Sampling of ``metrics.k8s.io`` (PodMetrics and NodeMetrics, all namespaces) into the history.

    metrics-server's cpu is a rate between its last two scrapes of each kubelet (the readings'
    ``window``, 15 s at its default ``--metric-resolution``): one reading per sample would make
    each sample about 15 seconds of usage, a burstier signal than the 5-minute rate a Prometheus
    history and the backtest count. So a sample is the mean cpu of ``reads`` readings taken
    over ``interval`` (and the last memory reading, a gauge's value)."""

    def __init__(self, api_client: Any, history: SqliteHistory, reads: int = 1, interval: float = 300.0) -> None:
        self._api = MetricsAPI(api_client)
        self.history = history
        self.reads = reads
        self.interval = interval
        self.window: float | None = None
        """Seconds the last reading's cpu figures are rates over (the nodes' median ``window``)."""
        self._taken = 0
        self._containers: dict[ContainerKey, list[int]] = {}
        self._nodes: dict[str, list[int]] = {}
        self.partly_lost: str | None = None
        """What the last reading lost when one of its two lists failed and the other did not
        (its Pods', or its nodes'), or None."""

    def read(self, now: float | None = None) -> int | None:
        """Take one reading; once ``reads`` are in, record them as one sample. The rows written
        (None until then)."""
        self._take()
        return self.record(now) if self._taken >= self.reads else None

    def sample(self, now: float | None = None) -> int:
        """Take one reading and record it at once, with any taken since the last sample (a
        single pass, ``once``, has no time to wait for more)."""
        self._take()
        return self.record(now)

    def record(self, now: float | None = None) -> int:
        """The readings taken so far as one sample: each series' mean cpu and last memory."""
        containers = [(key, round(cpu / count), memory) for key, (cpu, count, memory) in self._containers.items()]
        node_rows = [(name, round(cpu / count), memory) for name, (cpu, count, memory) in self._nodes.items()]
        self._taken, self._containers, self._nodes = 0, {}, {}
        return self.history.record(now if now is not None else time.time(), containers, node_rows)

    def _take(self) -> None:
        """One reading of PodMetrics and NodeMetrics into the sample being made. The two lists
        are read apart: on a large cluster the Pods' can time out while the nodes' answers, and
        the nodes' half alone keeps the node history and its hot-time account going
        (``partly_lost`` says which half is missing). Both failing: SampleLost."""
        self.partly_lost = None
        containers, pods_failed = _listed(self._api.containers)
        nodes, nodes_failed = _listed(self._api.nodes)
        if pods_failed is not None and nodes_failed is not None:
            # The readings taken before this one still make the sample.
            hint = (" (is metrics-server installed? Or set OVERSALE_PROMETHEUS_URL)"
                    if isinstance(pods_failed, ApiException) and pods_failed.status == 404 else "")
            raise SampleLost(f"metrics API (metrics.k8s.io) not readable, this reading is skipped: "
                             f"{one_line(pods_failed)}{hint}", "reading") from pods_failed
        self.partly_lost = (
            f"metrics API (metrics.k8s.io) PodMetrics not readable, this reading holds the nodes alone: "
            f"{one_line(pods_failed)}" if pods_failed is not None else
            f"metrics API (metrics.k8s.io) NodeMetrics not readable, this reading holds the Pods alone: "
            f"{one_line(nodes_failed)}" if nodes_failed is not None else None)
        self._note_window([n.window for n in nodes if n.window is not None])
        for c in containers:
            _accumulate(self._containers, (c.namespace, c.pod, c.container), c.cpu, c.memory)
        for n in nodes:
            _accumulate(self._nodes, n.name, n.cpu, n.memory)
        self._taken += 1

    def _note_window(self, windows: list[float]) -> None:
        # Said when first known and when it changes, not every reading.
        if not windows:
            return
        window = sorted(windows)[len(windows) // 2]
        if self.window is None or round(window) != round(self.window):
            if self.reads > 1:
                log.info("metrics-server reads cpu over %.0fs windows: each sample of the SQLite history averages "
                         "%d of them, one every %.0fs, so it sees %.0f of each %.0fs interval (the backtest and a "
                         "Prometheus history count the whole interval)", window, self.reads,
                         self.interval / self.reads, min(window * self.reads, self.interval), self.interval)
            else:
                log.info("metrics-server reads cpu over %.0fs windows: with OVERSALE_SAMPLE_READS=1 each sample of "
                         "the SQLite history is %.0f seconds of usage, and its cpu quantiles and hot time are of "
                         "that window (the backtest and a Prometheus history count 5-minute rates, a looser "
                         "reading of the same budget)", window, window)
        self.window = window


def _listed(read: Callable[[], list[T]]) -> tuple[list[T], Exception | None]:
    """What ``read`` lists, or nothing and why it could not."""
    try:
        return read(), None
    except API_FAILURES as error:
        return [], error


def _accumulate(series: dict[Any, list[int]], key: Any, cpu: int, memory: int) -> None:
    """Add one reading to a series' [cpu sum, readings, last memory]."""
    found = series.get(key)
    if found is None:
        series[key] = [cpu, 1, memory]
    else:
        found[0] += cpu
        found[1] += 1
        found[2] = memory
