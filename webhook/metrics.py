"""Prometheus metrics of the webhook.

Under gunicorn each worker is a process; ``python -m webhook`` sets PROMETHEUS_MULTIPROC_DIR before
any worker starts, so every worker writes its samples to files there and ``/metrics`` (served by
whichever worker) aggregates all of them. Without that variable, one in-process registry is used.
"""

from __future__ import annotations

import glob
import json
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict

from kube.cache_metrics import CacheRestarts
from kube.certificate_expiry import CertificateExpiry


class Metrics:
    """The webhook's metrics, registered on their own registry (one per app).

    ``node_series_ttl``: seconds after the last review of a node before its per-node series
    leave the exposition (``OVERSALE_NODE_SERIES_TTL``). No review tells the webhook that a node
    was deleted, so without it a cluster whose autoscaler replaces nodes would show every node
    it ever had, at its last values, until the webhook restarts.
    """

    def __init__(self, node_series_ttl: float = 900.0, certificates: Mapping[str, Path] | None = None) -> None:
        self.node_series_ttl = node_series_ttl
        self.registry = CollectorRegistry()
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        registry = self.registry
        # Read by whichever worker serves the scrape, from the files: no worker writes it.
        self.certificates = CertificateExpiry(certificates or {})
        registry.register(self.certificates)
        self.admissions = Counter(
            "oversale_admissions",
            "Admission reviews answered, by resource and outcome "
            "(mutated, unchanged, skipped, error, malformed).",
            ["resource", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "oversale_admission_duration_seconds",
            "Time to answer one admission review.",
            ["resource"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.freed_millicores = Counter(
            "oversale_requests_freed_millicores",
            "CPU requests removed from admitted Pods by compression, in millicores.",
            ["namespace"],
            registry=registry,
        )
        self.freed_bytes = Counter(
            "oversale_requests_freed_bytes",
            "Memory requests removed from admitted Pods by compression, in bytes.",
            ["namespace"],
            registry=registry,
        )
        self.added_millicores = Counter(
            "oversale_requests_added_millicores",
            "CPU requests added to admitted Pods that use more than they request (ratios below 1), in millicores.",
            ["namespace"],
            registry=registry,
        )
        self.added_bytes = Counter(
            "oversale_requests_added_bytes",
            "Memory requests added to admitted Pods by ratios below 1, in bytes.",
            ["namespace"],
            registry=registry,
        )
        self.invalid_annotations = Counter(
            "oversale_invalid_annotations",
            "Annotations of ours whose value was ignored, by key.",
            ["annotation"],
            registry=registry,
        )
        self.cache_synced = Gauge(
            "oversale_cache_synced",
            "1 when the watch cache of a kind has completed its first list (min over workers).",
            ["kind"],
            multiprocess_mode="livemin",
            registry=registry,
        )
        self.cache_restarts = CacheRestarts(registry)
        self.owner_lookups = Counter(
            "oversale_owner_lookups",
            "Owner lookups by result: hit (cache), miss (one GET made), error (API failed).",
            ["result"],
            registry=registry,
        )

        self.node_allocatable = Gauge(
            "oversale_node_allocatable",
            "Node allocatable per resource (cpu in cores, memory in bytes): value=real as the kubelet "
            "reported it, value=oversold as stored for the scheduler.",
            ["node", "resource", "value"],
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.node_ratio = Gauge(
            "oversale_node_oversale_ratio",
            "Oversale ratio applied to a node's allocatable (1 when not oversold).",
            ["node", "resource"],
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.node_restores = Counter(
            "oversale_node_restores",
            "Node writes that restored a resource's real values after overselling was turned off.",
            ["resource"],
            registry=registry,
        )

        self._per_node = (self.node_allocatable, self.node_ratio)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._last_set: dict[tuple[int, tuple[str, ...]], tuple[float, float]] = {}
        self._last_sweep = time.monotonic()

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: the client's labels() validates and locks on
        every call, and a node heartbeat review uses eight of them."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def set_gauge(self, gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
        """Set a per-node gauge, skipping the multiprocess file write when the value is what this
        worker last wrote a moment ago (at most 30 s, and a quarter of the series' time to live):
        node heartbeats repeat the same values every few seconds. The refresh bounds how long a
        ``mostrecent`` gauge can show another worker's older value after this one skipped a write,
        and keeps the write time of a node still reviewed well within the time to live."""
        key = (id(gauge), labels)
        now = time.monotonic()
        last = self._last_set.get(key)
        if last is not None and last[0] == value and now - last[1] < min(30.0, self.node_series_ttl / 4):
            return
        self.child(gauge, *labels).set(value)
        self._last_set[key] = (value, now)
        if now - self._last_sweep >= self.node_series_ttl:
            self._forget_stale_nodes(now)

    def _forget_stale_nodes(self, now: float) -> None:
        """Drop this worker's per-node children not written for the time to live. In-process they
        leave the exposition with them; in multiprocess mode the client cannot remove a sample from
        the files (it warns that it only forgets its own child), so ``exposition`` filters those."""
        self._last_sweep = now
        stale = [key for key, (_, written) in self._last_set.items() if now - written >= self.node_series_ttl]
        gauges = {id(gauge): gauge for gauge in self._per_node}
        for key in stale:
            del self._last_set[key]
            self._children.pop(key, None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                gauges[key[0]].remove(*key[1])

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every worker's samples; every family is listed (HELP and TYPE)
        from the first scrape, even before any worker wrote a sample of it."""
        if not self.multiprocess:
            self._forget_stale_nodes(time.monotonic())
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        per_node = {family.name for gauge in self._per_node for family in gauge.describe()}
        registry.register(_RecentNodeSeries(os.environ["PROMETHEUS_MULTIPROC_DIR"], per_node, self.node_series_ttl))
        registry.register(self.certificates)
        text = generate_latest(registry)
        # The multiprocess collector knows only families with samples in the files; a fresh
        # webhook would answer an empty body, and a scrape-time alert would see nothing at all.
        seen = {line.split(b" ")[2] for line in text.splitlines() if line.startswith(b"# TYPE ")}
        missing = [family for collector in self._collectors() for family in collector.describe()
                   if family.name.encode() not in seen and (family.name + "_total").encode() not in seen]
        extra = b"".join(f"# HELP {f.name}{'_total' if f.type == 'counter' else ''} {f.documentation}\n"
                         f"# TYPE {f.name}{'_total' if f.type == 'counter' else ''} {f.type}\n".encode()
                         for f in missing)
        return text + extra, CONTENT_TYPE_LATEST

    def _collectors(self) -> list[Any]:
        return [value for value in vars(self).values() if isinstance(value, (Counter, Gauge, Histogram))]


class _RecentNodeSeries:
    """The multiprocess collector's families, less each per-node series that no worker has written
    for ``ttl`` seconds (by the write time a ``mostrecent`` gauge keeps beside each value)."""

    def __init__(self, path: str, names: set[str], ttl: float) -> None:
        self._path = path
        self._names = names
        self._ttl = ttl

    def collect(self) -> Iterator[Metric]:
        files = glob.glob(os.path.join(self._path, "*.db"))
        written: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for name in glob.glob(os.path.join(self._path, "gauge_mostrecent_*.db")):
            for key, _, timestamp, _ in MmapedDict.read_all_values_from_file(name):
                family, _, labels, _ = json.loads(key)
                if family in self._names:
                    series = (family, tuple(sorted(labels.items())))
                    written[series] = max(written.get(series, 0.0), timestamp)
        oldest = time.time() - self._ttl
        for family in multiprocess.MultiProcessCollector.merge(files):
            if family.name in self._names:
                family.samples = [sample for sample in family.samples
                                  if written.get((family.name, tuple(sorted(sample.labels.items()))), 0.0) >= oldest]
            yield family
