"""Usage history behind one interface, whichever source keeps it.

A source answers two batched questions over a window, each with a fixed number of queries
whatever the number of objects: per (namespace, pod, container) usage summaries, and per node
usage summaries (see ``oversale.estimator.UsageStats``). CPU is in millicores, memory in bytes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from oversale.budget import HotTime
from oversale.estimator import UsageStats

ContainerKey = tuple[str, str, str]
"""(namespace, pod, container)"""


class HistoryUnavailable(Exception):
    """The source cannot be read now (unreachable, timed out, refused the query)."""


@dataclass(frozen=True)
class ResourceStats:
    cpu: UsageStats
    memory: UsageStats

    def of(self, resource: str) -> UsageStats:
        return self.cpu if resource == "cpu" else self.memory


class History(Protocol):
    """What the reconcilers read. ``window`` in seconds, ``quantile`` in (0, 1)."""

    def container_stats(self, window: float, quantile: float) -> dict[ContainerKey, ResourceStats]: ...

    def node_stats(self, window: float, quantile: float, memory_quantile: float | None = None,
                   counts_from: Mapping[str, ResourceStats] | None = None,
                   steps_counted: Mapping[str, Mapping[str, HotTime]] | None = None) -> dict[str, ResourceStats]:
        """``counts_from``: a read of the same window whose sample counts and ages serve for this
        one's (a pool with its own budget needs its own quantiles, not its samples counted again).
        ``steps_counted``: each node's samples of the same window per resource, counted already
        (the hot-time account's week, :meth:`node_hot_time`), so not counted again; the nodes
        not in it have no count, and their ratios wait as for too little history."""
        ...

    def node_hot_time(self, windows: Sequence[float],
                      real: dict[str, dict[str, float]]) -> list[dict[str, dict[str, HotTime]]]:
        """For each window (seconds back from now), per node and resource: the samples above the
        node's real allocatable (``real``: node -> resource -> millicores or bytes) and all its
        samples."""
        ...

    def node_peaks(self, window: float) -> dict[str, dict[str, float]]:
        """Per node and resource, the highest sample of the window."""
        ...

    def check_node_names(self, found: Collection[str], nodes: Collection[str]) -> None:
        """Warns where the nodes the history names (``found``) are none of the cluster's ``nodes``
        and the source can name them wrong (Prometheus: by the wrong label)."""
        ...

    def check_rate_window(self) -> None:
        """Warns where the source's usage rates hold too few samples of their counters (Prometheus:
        a rate window shorter than 4 scrape intervals), once a day: a later call checks only what
        an earlier one could not read or checked a day before. Raises HistoryUnavailable."""
        ...
