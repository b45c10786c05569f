"""Prometheus metrics of the webhook.

Under gunicorn each worker is a process; ``python -m webhook`` sets PROMETHEUS_MULTIPROC_DIR before
any worker starts, so every worker writes its samples to files there and ``/metrics`` (served by
whichever worker) aggregates all of them. Without that variable, one in-process registry is used.
"""

from __future__ import annotations

import os
import time
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


class Metrics:
    """The webhook's metrics, registered on their own registry (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        registry = self.registry
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

        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._last_set: dict[tuple[int, tuple[str, ...]], tuple[float, float]] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: the client's labels() validates and locks on
        every call, and a node heartbeat review uses eight of them."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def set_gauge(self, gauge: Gauge, labels: tuple[str, ...], value: float, refresh_seconds: float = 30.0) -> None:
        """Set a per-node gauge, skipping the multiprocess file write when the value is what this
        worker last wrote less than ``refresh_seconds`` ago: node heartbeats repeat the same
        values every few seconds. The refresh bounds how long a ``mostrecent`` gauge can show another
        worker's older value after this one skipped a write."""
        key = (id(gauge), labels)
        now = time.monotonic()
        last = self._last_set.get(key)
        if last is not None and last[0] == value and now - last[1] < refresh_seconds:
            return
        self.child(gauge, *labels).set(value)
        self._last_set[key] = (value, now)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every worker's samples; every family is listed (HELP and TYPE)
        from the first scrape, even before any worker wrote a sample of it."""
        if not self.multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
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
