"""Usage history from Prometheus's HTTP API.

One pass issues a fixed number of queries (9 for the ratios; for the hot-time account, 1 and 7
days at once whatever the nodes' sizes, 4 on the first pass and 2 or 4 on the next ones, its
settled hours kept), Prometheus doing the per-series work and returning one number per series:
never one query per object. The node quantiles are the exception: each is a range query of the
nodes' usage, its samples kept between passes where a later window may read them
(:mod:`reconcilers.quantile_samples`), so after the first pass it reads only the newest steps,
in one request (the first pass reads the window in parts), and a recent gap where samples came
late in one more (:meth:`PrometheusHistory._late_samples`). Container usage
comes from cAdvisor (``container_cpu_usage_seconds_total``, ``container_memory_working_set_bytes``),
summarized per cgroup before it is aggregated (:meth:`Summaries.per_cgroup`); node usage from
node-exporter (``node_cpu_seconds_total``, ``MemTotal - MemAvailable``, or queries of your own),
aggregated at each step first (:meth:`Summaries.at_each_step`). Queries that wait on no other
answer are sent together, at most ``concurrency`` at once (:meth:`PrometheusHistory._together`).

A query refused for loading too many samples is split into consecutive sub-windows, combined
conservatively (the highest quantile of the parts: never lower than the exact one would be on
smooth data, and the safe side when it is not).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import threading
import time
from array import array
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from kube.client import first_few
from kube.prometheus import (
    APP_CONTAINERS,
    CPU_COUNTERS,
    NODE_MEMORY_REPORTED,
    RANGE_STEPS,
    RATE_WINDOW_RECHECK,
    NodeNaming,
    PrometheusAccess,
    PrometheusAPI,
    PrometheusUnavailable,
    QueryTooLarge,
    RateWindowCheck,
    Series,
    duration,
    explained,
    node_expressions,
    node_matcher,
    node_name,
    scoped,
    scrape_interval,
)
from oversale.budget import HotTime
from oversale.estimator import UsageStats
from oversale.settings import Settings
from reconcilers.account_blocks import LATE_SECONDS, SETTLE_SECONDS, BlockPlan, Kept, KeptCounts, plan_blocks
from reconcilers.history import ContainerKey, HistoryUnavailable, ResourceStats
from reconcilers.quantile_samples import KeptSamples, SampleKeeper, top_needed

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class PrometheusHistory:
    """The reconcilers' usage history from Prometheus (the module docstring says how it queries):
    the containers' and nodes' stats for the ratios and the hot time for the accounts."""

    url: str
    timeout: float = 30.0
    resolution: float = 300.0
    """Subquery step in seconds (one evaluated point per step and series)."""
    node_label: str = "instance"
    """The label carrying the node name on node-exporter series (``:port`` is stripped)."""
    node_memory_query: str | None = None
    """An expression giving used memory in bytes per node (label ``node_label``)."""
    node_cpu_query: str | None = None
    """An expression giving the cpu cores used per node (label ``node_label``), such as a recording
    rule's series; None: node-exporter's counters, rated here."""
    rate_window: float = 300.0
    """Window of the CPU ``rate()``: at least four scrape intervals."""
    access: PrometheusAccess = field(default_factory=PrometheusAccess)
    """Credentials and CA, where Prometheus sits behind authentication."""
    max_splits: int = 8
    part_points: int = 500_000
    """Points a kept node quantile's range request asks for, about, after its first
    (:meth:`_kept_quantiles`): about 15 MB of JSON, read into 8 MB of arrays; a week of 5,000
    nodes at 5-minute steps is 22 requests, the newest hour first."""
    late_seconds: float = LATE_SECONDS
    """How long a gap in the kept history with samples on both sides is read again, for samples
    that reach the store late (:data:`~reconcilers.account_blocks.LATE_SECONDS`); 0: never."""
    rate_window_recheck: float = RATE_WINDOW_RECHECK
    """Seconds between two checks of ``rate_window`` against the scrape intervals (:meth:`check_rate_window`)."""
    concurrency: int = 4
    """Queries in flight at once, over every read of this history (:meth:`_together`)."""
    queries: int = 0
    """Queries sent so far (for the pass report and the benchmark)."""
    query_seconds: float = 0.0
    """Time spent waiting for Prometheus so far, summed over queries (which may overlap)."""
    clock: Callable[[], float] = time.time
    """Now, in seconds since the epoch: every window ends there."""
    api: PrometheusAPI = field(init=False)
    node_naming: NodeNaming = field(init=False)
    _rate_checks: RateWindowCheck = field(init=False)
    _range_times_moved: bool = field(init=False, default=False)
    """A range query was answered at other times than asked (:meth:`_count_kept`)."""
    _kept: KeptCounts = field(init=False, default_factory=dict)
    """The hot-time account's settled hours, counted on an earlier pass (:meth:`_count_kept`)."""
    _peaks: dict[tuple[str, float, float], _KeptQuantile] = field(init=False, default_factory=dict)
    """The node quantiles' settled samples, per expression, window and quantile (:meth:`_kept_quantiles`)."""
    _slots: threading.BoundedSemaphore = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    """Guards the counters and the flag above: the reads run in several threads."""

    def __post_init__(self) -> None:
        self.api = PrometheusAPI(self.url, self.timeout, self.access)
        self.node_naming = NodeNaming(self.node_label, "every node ratio is held")
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._rate_checks = RateWindowCheck(self.rate_window, self.rate_window_recheck)

    @classmethod
    def from_settings(cls, settings: Settings) -> PrometheusHistory:
        return cls(settings.prometheus_url, settings.prometheus_timeout_seconds, settings.prometheus_step_seconds,
                   settings.prometheus_node_label, node_memory_query=settings.prometheus_node_memory_query or None,
                   node_cpu_query=settings.prometheus_node_cpu_query or None,
                   rate_window=settings.prometheus_rate_window_seconds, access=PrometheusAccess.from_settings(settings),
                   concurrency=settings.prometheus_concurrency, late_seconds=settings.prometheus_late_seconds)

    def container_stats(self, window: float, quantile: float) -> dict[ContainerKey, ResourceStats]:
        """Each container's usage over ``window``. Its age is known where it reported in the last
        :data:`RECENT` (:meth:`_freshest_samples`), else None: a container's age serves the
        staleness gauge alone, the freshest of all, where a node's decides its ratio."""
        keys = ("namespace", "pod", "container")
        rate = f"rate(container_cpu_usage_seconds_total{APP_CONTAINERS}[{duration(self.rate_window)}])"
        cpu_queries = Summaries.per_cgroup(f"{rate}[$WINDOW:$STEP]", " * 1000")
        memory_queries = Summaries.per_cgroup(f"container_memory_working_set_bytes{APP_CONTAINERS}[$WINDOW]")
        last_sample = f"max by (namespace, pod, container) ({_last_sample_time(rate)})"
        cpu, memory = self._together(
            lambda: self._summaries(cpu_queries, window, quantile, keys, with_peak=False,
                                    last_samples=lambda now, _: self._freshest_samples(last_sample, window, now, keys)),
            lambda: self._summaries(memory_queries, window, quantile, keys, with_peak=True))
        memory = self._counted_as(memory, cpu)
        return {(key[0], key[1], key[2]): ResourceStats(cpu[key], memory.get(key, _EMPTY)) for key in cpu}

    def node_stats(self, window: float, quantile: float, memory_quantile: float | None = None,
                   counts_from: Mapping[str, ResourceStats] | None = None,
                   steps_counted: Mapping[str, Mapping[str, HotTime]] | None = None) -> dict[str, ResourceStats]:
        """Each node's usage over ``window``: 4 queries, 3 with ``steps_counted`` (the quantiles
        and each node's last sample), 2 with ``counts_from`` (the quantiles alone). The read of one
        resource (:meth:`_counting`) counts each node's samples and finds its last; both resources
        take them."""
        label, (counter, counted_on) = self.node_label, self._counting()
        expressions = self._node_expressions()
        quantiles = {"cpu": quantile, "memory": quantile if memory_quantile is None else memory_quantile}
        counts_itself = counts_from is None and steps_counted is None

        def read(resource: str) -> dict[tuple[str, ...], UsageStats]:
            counting = None if not counts_itself or resource != counter else (
                lambda now, counted: self._last_node_samples(resource, window, now, counted))
            summaries = Summaries.at_each_step(expressions[resource], counted_on if resource == counter else None)
            # A query of the user's own may join series without the node label: read whole.
            select = None if self._own_node_query(resource) else (lambda keys: scoped(
                expressions[resource], node_matcher(label, {node_name(key[0]) for key in keys})))
            kept = _KeptRead(expressions[resource], f"the node {resource} quantile", select)
            return self._summaries(summaries, window, quantiles[resource], (label,), with_peak=False,
                                   last_samples=counting, kept=kept)

        cpu, memory = self._together(lambda: read("cpu"), lambda: read("memory"))
        if counts_from is not None:
            counts = {key: known.cpu for key in cpu if (known := counts_from.get(node_name(key[0]))) is not None}
        elif steps_counted is not None:
            counts = self._counted_already(counter, window, cpu.keys(), steps_counted)
        else:
            counts = {"cpu": cpu, "memory": memory}[counter]
        cpu, memory = self._counted_as(cpu, counts), self._counted_as(memory, counts)
        return {node_name(key[0]): ResourceStats(cpu[key], memory.get(key, _EMPTY)) for key in cpu}

    def _counted_already(self, counter: str, window: float, keys: Collection[tuple[str, ...]],
                         steps_counted: Mapping[str, Mapping[str, HotTime]]) -> dict[tuple[str, ...], UsageStats]:
        """The sample counts of ``keys``' nodes in ``steps_counted`` (of the resource that counts,
        :meth:`_counting`: the account evaluates the same usage at the same steps), with their last
        sample's age read as when counting (:meth:`_last_node_samples`, over the last hour)."""
        now = self.clock()
        samples = {key: spent.samples for key in keys
                   if (spent := steps_counted.get(node_name(key[0]), {}).get(counter)) is not None}
        last = self._last_node_samples(counter, window, now, samples.keys())
        return {key: self._stats(None, None, count, now - last[key] if key in last else None)
                for key, count in samples.items()}

    def _counting(self) -> tuple[str, str]:
        """The resource whose read counts each node's samples, and the expression whose steps it
        counts. Memory where node-exporter gives both, its cpu a counter per cpu and mode (80 a
        node of 16 cpus) rated and summed at every step, its memory two gauges scraped with them,
        so the same steps at a fraction of the cost; and of those one gauge alone
        (:data:`~kube.prometheus.NODE_MEMORY_REPORTED`), the count at half the cost of the usage's
        (7 s against 14 s a week of 5,000 nodes). Cpu, counted on its usage, where a query of the
        user's own reads either (a recording rule's series starts where the rule does, and a
        node's cpu ratio waits for the cpu history it needs)."""
        if self.node_cpu_query or self.node_memory_query:
            return "cpu", self._node_expressions()["cpu"]
        return "memory", NODE_MEMORY_REPORTED.format(label=self.node_label)

    def _last_node_samples(self, resource: str, window: float, now: float,
                           counted: Collection[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
        """Each counted node's last sample time of its ``resource`` usage in ``window``, read over
        the last :data:`RECENT` first: the same steps at the end of the window (a subquery's steps
        are multiples of its step), so the same figure for every node that reported in it, at a
        fraction of the cost (a week's subquery evaluates the usage at 2,016 steps, the hour's at
        12). The nodes silent that long (removed, or their exporter down) are read over the whole
        window, their series alone."""
        label, recent = self.node_label, min(window, RECENT)
        expression = self._node_expressions()[resource]
        last = self._per_window(_last_sample_time(expression), recent, now, (label,), max)
        silent = sorted(key[0] for key in counted if key not in last)
        if silent and recent < window:
            # A query of the user's own may join series without the node label: read whole.
            alone = expression if self._own_node_query(resource) else scoped(expression, node_matcher(
                label, {node_name(instance) for instance in silent}))
            last |= {key: t for key, t in self._per_window(_last_sample_time(alone), window, now,
                                                           (label,), max).items() if key not in last}
        return last

    def _freshest_samples(self, template: str, window: float, now: float,
                          keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        """``template``'s (a last sample's time, :func:`_last_sample_time`) over the last
        :data:`RECENT`: the series that reported in it, each with its own time, and so the
        freshest of all exact. Over the whole window only where none did (Prometheus has scraped
        nothing for an hour), for the age of the freshest then. A week's subquery rated every
        cgroup's counter at 2,016 steps, a tenth of a full-size pass's Prometheus time
        (docs/performance.md), for the ages of containers silent for hours, mostly deleted Pods',
        too many to name in a query as :meth:`_last_node_samples` names silent nodes."""
        recent = min(window, RECENT)
        last = self._per_window(template, recent, now, keys, max)
        if not last and recent < window:
            last = self._per_window(template, window, now, keys, max)
        return last

    def node_hot_time(self, windows: Sequence[float],
                      real: dict[str, dict[str, float]]) -> list[dict[str, dict[str, HotTime]]]:
        """Per resource, each node's samples and those above its real allocatable, for all the
        windows at once, both counts from one evaluation of the usage (:data:`STEP_MARK`). The
        settled hours are counted once and kept between passes, the rest of each window counted
        on every pass (:mod:`reconcilers.account_blocks`, :meth:`_count_kept`): at most 2
        queries a resource, 1 on a pass within the hour of the one before; the number grows
        neither with nodes, nor with their sizes, nor with the windows. The nodes are grouped by
        real allocatable (:func:`threshold_groups`), and the count's expression is the ``or`` of
        each group's usage, its series selected by node name, against the group's. With a node
        query of the user's own (cpu or memory), whose series may lack the node label (a join),
        that resource takes one count per group instead, read over all nodes. Where the hours
        cannot be kept (:meth:`_count_kept` says why), each window is counted whole."""
        if not windows:
            return []
        now = self.clock()
        counts: list[_AccountCount] = []
        for resource, expression in self._node_expressions().items():
            groups = threshold_groups({node: values[resource] for node, values in real.items() if resource in values})
            if self._own_node_query(resource):
                counts += [_AccountCount(resource, expression, self.node_label, [group], own_query=True)
                           for group in groups]
            elif groups:
                counts.append(_AccountCount(resource, expression, self.node_label, groups, own_query=False))
        plan = None if self._range_times_moved else plan_blocks(windows, now, self.resolution, late=self.late_seconds)

        def count(asked: _AccountCount) -> tuple[list[dict[str, float]], KeptCounts]:
            if plan is not None:
                try:
                    return self._count_kept(asked, plan)
                except _NotKept as why:
                    log.info("the hot-time account's %s is counted whole this pass: %s", asked.resource, why)
            template = f"sum_over_time(({asked.marked()})[$WINDOW:$STEP])"
            return [{node_name(key[0]): total for key, total in
                     self._per_window(template, window, now, (self.node_label,), sum).items()}
                    for window in windows], {}

        found = self._together(*(lambda asked=asked: count(asked) for asked in counts))
        # What no count kept this pass is forgotten: removed nodes, and the blocks no window reaches.
        self._kept = {key: kept for _, counted in found for key, kept in counted.items()}
        results: list[dict[str, dict[str, HotTime]]] = [{} for _ in windows]
        for asked, (totals, _) in zip(counts, found, strict=True):
            for result, by_node in zip(results, totals, strict=True):
                for node in asked.nodes():
                    if by_node.get(node):
                        result.setdefault(node, {})[asked.resource] = _hot_time(by_node[node])
        return results

    def _count_kept(self, asked: _AccountCount, plan: BlockPlan) -> tuple[list[dict[str, float]], KeptCounts]:
        """``asked``'s totals per window and node, from the blocks kept for each node, the blocks
        it lacks (one range query at block steps for the nodes that lack the same ones: the
        newest hour on most passes, the whole week for a node new to the account or whose real
        allocatable moved), and the plan's stretches (:meth:`_stretch_counts`). A node's kept
        blocks short of steps with samples on both sides are read again while recent
        (:meth:`~reconcilers.account_blocks.Kept.first_short`). Raises _NotKept where a range is
        answered at other times than asked (a query frontend aligning ranges to their step): from
        then on every pass counts each window whole. Raises HistoryUnavailable where Prometheus
        refuses even an hour."""
        thresholds = {node: threshold for threshold, nodes in asked.groups for node in nodes}
        lacking: dict[int, list[str]] = {}
        for node, threshold in thresholds.items():
            kept = self._kept.get((asked.resource, node))
            lacking.setdefault(plan.first if kept is None else kept.missing_from(threshold, plan), []).append(node)
        counted = self._read_blocks(asked, plan, lacking, thresholds, self._kept)
        by_stretch = self._stretch_counts(asked, plan)
        # The stretch since the last block: whether a node has samples after its blocks.
        since = by_stretch[plan.stretches.index(newest)] if (
            newest := (plan.boundary(plan.last), plan.now)) in plan.stretches else {}
        full, steps_of = round(plan.block / plan.step), lambda count: _hot_time(count).samples
        short = {node: again for (_, node), kept in counted.items() if (again := kept.first_short(
            plan, steps_of, full, steps_of(since.get(node, 0.0)) > 0)) is not None}
        if short:
            # Read again together, from the earliest: their samples arrive late together, if at all.
            reread = self._read_blocks(asked, plan, {min(short.values()): list(short)}, thresholds, counted)
            _told_late(f"the hot-time account's {asked.resource}", [
                node for (_, node), kept in reread.items()
                if steps_of(kept.total(plan.first, plan.last)) > steps_of(counted[asked.resource, node].total(
                    plan.first, plan.last))])
            counted |= reread
        return [{node: kept.total(first, plan.last) + sum(by_stretch[index].get(node, 0.0) for index in indices)
                 for (_, node), kept in counted.items()}
                for first, indices in plan.windows], counted

    def _read_blocks(self, asked: _AccountCount, plan: BlockPlan, lacking: dict[int, list[str]],
                     thresholds: dict[str, float], kept_before: KeptCounts) -> KeptCounts:
        """The counts of the nodes in ``lacking`` (first block read -> nodes), ``kept_before``'s
        blocks before it followed by those read: one range query at block steps a first block."""
        label, step = self.node_label, duration(plan.step)
        counted: KeptCounts = {}
        for first, nodes in sorted(lacking.items()):
            new: dict[str, list[float]] = {node: [0.0] * (plan.last - first) for node in nodes}
            if first < plan.last:
                only = None if len(nodes) == len(thresholds) else set(nodes)
                query = f"sum_over_time(({asked.marked(only)})[{duration(plan.block)}:{step}])"
                # Refused for its size, it is asked in fewer hours down to one; refused even so, no
                # window could be counted whole (a window split in its most parts is longer).
                found = self._range(query, plan.boundary(first + 1), plan.boundary(plan.last), plan.block)
                # Every series checked before any is read: one moved answer leaves the pass unkept.
                ends = [self._steps_asked(times, first + 1, plan.last, plan.block, plan.offset)
                        for _, (times, _) in found]
                for (labels, (_, values)), ended in zip(found, ends, strict=True):
                    if (node := node_name(labels.get(label, ""))) in new:
                        for end, value in zip(ended, values, strict=True):
                            new[node][end - 1 - first] = value  # a point at boundary i counts block i - 1
            for node, counts in new.items():
                kept = kept_before.get((asked.resource, node))
                counted[asked.resource, node] = (kept.extended(plan, first, counts)
                                                 if kept is not None and first > plan.first
                                                 else Kept(thresholds[node], plan.first, array("d", counts)))
        return counted

    def _stretch_counts(self, asked: _AccountCount, plan: BlockPlan) -> list[dict[str, float]]:
        """``asked``'s count of each of the plan's stretches per node: one instant query of them
        all, each labelled with its index."""
        marked, step = asked.marked(), duration(plan.step)
        stretches = " or ".join(
            f'label_replace(sum_over_time(({marked})[{duration(end - start)}:{step}]'
            f'{f" offset {duration(plan.now - end)}" if end < plan.now else ""}), "{STRETCH_LABEL}", "{index}", "", "")'
            for index, (start, end) in enumerate(plan.stretches))
        try:
            partial = self._instant(stretches, plan.now, (self.node_label, STRETCH_LABEL))
        except QueryTooLarge as error:
            raise HistoryUnavailable(f"query too large even in the account's stretches: {error}") from None
        by_stretch: list[dict[str, float]] = [{} for _ in plan.stretches]
        for (instance, index), total in partial.items():
            by_stretch[int(index)][node_name(instance)] = total
        return by_stretch

    def _kept_quantiles(self, read: _KeptRead, window: float, quantile: float, now: float,
                        keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        """Each series' ``quantile`` of ``read``'s expression over ``window`` (its steps up to ``now``), as
        ``quantile_over_time`` of the subquery gives it, from the samples kept from earlier
        passes (:mod:`reconcilers.quantile_samples`) and one range query of the steps since the
        last settled one kept, for every series: on the first pass, or after a change of the
        quantile, the whole window, in parts newest first, each part pruned as it comes. Samples
        that reached the store late are read again in one more (:meth:`_late_samples`). Raises
        _NotKept where the step is not a whole number of seconds or a range is
        answered at other times than asked (:meth:`_moved_range`)."""
        step, expression = self.resolution, read.expression
        if self._range_times_moved or step < 1 or step != round(step):
            raise _NotKept("a range query cannot be answered at its steps")
        last, settled = math.floor(now / step), math.floor((now - SETTLE_SECONDS) / step)
        first = math.floor((now - window) / step) + 1
        needed = top_needed(quantile, last - first + 1)
        state = self._peaks.get((expression, window, quantile))
        if state is not None and (state.needed < needed or state.settled < first - 1):
            state = None
        since = first if state is None else state.settled + 1
        keepers: dict[tuple[str, ...], SampleKeeper] = {}
        fresh: dict[tuple[str, ...], list[tuple[int, float]]] = {}
        with self._asking(query=expression):
            # The first request's size from the series kept, where known, else the newest hour's.
            first_part = FIRST_PART_STEPS if state is None else min(RANGE_STEPS, max(1, self.part_points // max(
                1, len(state.series))))
            for part in self.api.range_parts(expression, since * step, last * step, step, part_steps=first_part,
                                             on_request=self._count_request, newest_first=True,
                                             part_points=self.part_points):
                seen: set[tuple[str, ...]] = set()
                for labels, (times, values) in part:
                    key = tuple(labels.get(name, "") for name in keys)
                    if key in seen:
                        continue  # a query of the user's own that leaves two series one name: one read
                    seen.add(key)
                    steps = self._steps_asked(times, since, last)
                    cut = bisect.bisect_right(steps, settled)
                    keepers.setdefault(key, SampleKeeper(needed)).feed_newest_first(steps[:cut], values[:cut])
                    fresh.setdefault(key, []).extend(zip(steps[cut:], values[cut:], strict=True))
        late = {} if state is None else self._late_samples(read, state, keepers.keys() | fresh.keys(), max(
            first, math.floor((now - self.late_seconds) / step) + 1), needed, keys)
        kept: dict[tuple[str, ...], KeptSamples] = {}
        found: dict[tuple[str, ...], float] = {}
        for key in keepers.keys() | (state.series.keys() if state else set()):
            older = late.get(key, state.series[key]).from_step(first) if state and key in state.series \
                else KeptSamples()
            samples = keepers[key].then(older) if key in keepers else older
            value = samples.quantile(quantile, first, last, fresh.get(key, ()))
            if value is not None:
                found[key] = value
            if samples.count(first, last):
                kept[key] = samples
        with self._lock:
            self._peaks = {asked: other for asked, other in self._peaks.items() if other.settled >= first - 1}
            self._peaks[expression, window, quantile] = _KeptQuantile(max(settled, since - 1), needed, kept)
        return found

    def _late_samples(self, read: _KeptRead, state: _KeptQuantile, read_now: Collection[tuple[str, ...]],
                      recent: int, needed: int, keys: tuple[str, ...]) -> dict[tuple[str, ...], KeptSamples]:
        """The kept series with a gap from step ``recent`` (:attr:`late_seconds` back) on between
        two of its samples (the later one kept, or among ``read_now``, the series with samples
        since), with the gap's steps read again and added (:meth:`KeptSamples.with_late`): one range query from the
        earliest gap to the last settled step, of those series alone where ``read`` can select
        them. A remote-write sender cut off from its store sends its buffer once it reaches it
        again; a gap with no sample after it is a series' end (a node removed, its exporter down)
        until one comes, and is not read."""
        step, gaps = self.resolution, dict[tuple[str, ...], int]()
        for key, samples in state.series.items():
            if samples.runs:
                until = state.settled if key in read_now else samples.runs[-1]
                if (missing := samples.first_missing(max(recent, samples.runs[0]), until)) is not None:
                    gaps[key] = missing
        if not gaps:
            return {}
        start = min(gaps.values())
        found: dict[tuple[str, ...], KeptSamples] = {}
        for labels, (times, values) in self._range(read.expression if read.select is None else read.select(
                gaps.keys()), start * step, state.settled * step, step):
            key = tuple(labels.get(name, "") for name in keys)
            if key not in gaps or key in found:
                continue
            found[key] = state.series[key].with_late(self._steps_asked(times, start, state.settled), values, needed)
        _told_late(read.name, [node_name(key[0]) for key, samples in found.items()
                               if samples.runs != state.series[key].runs])
        return found

    def _steps_asked(self, times: Sequence[float], first: int, last: int, step: float | None = None,
                     origin: float = 0.0) -> list[int]:
        """The step numbers k of a range answer's ``times`` on the grid ``origin + k x step``
        (``step`` the resolution unless given), each one of the steps ``first`` to ``last`` asked
        (to the second); raises _NotKept where one is not (:meth:`_moved_range`). The node
        quantiles count steps from the epoch, the account's blocks from the plan's offset."""
        step = self.resolution if step is None else step
        steps = [round((t - origin) / step) for t in times]
        if any(abs(origin + at * step - t) >= 1.0 or not first <= at <= last
               for at, t in zip(steps, times, strict=True)):
            self._moved_range()
            raise _NotKept("its range was answered at other times than asked")
        return steps

    @property
    def quantile_samples_kept(self) -> int:
        """The samples the node quantiles keep between passes, over every node (see
        :mod:`reconcilers.quantile_samples`)."""
        with self._lock:
            return sum(len(kept.steps) for state in self._peaks.values() for kept in state.series.values())

    def _moved_range(self) -> None:
        with self._lock:
            told, self._range_times_moved = self._range_times_moved, True
        if not told:
            # A point at t counts the block ending at t, and it must stand where it was asked: a
            # query frontend that aligns a range's start and end to its step (Thanos's does by
            # default, for its cache) answers at other times, which would count other hours.
            log.warning("%s answered a range query at other times than asked (a query frontend aligning "
                        "ranges to their step, such as Thanos's --query-range.align-range-with-step): the "
                        "hot-time account is counted whole, one query per window, from now on", self.api.described)

    def node_peaks(self, window: float) -> dict[str, dict[str, float]]:
        label, now = self.node_label, self.clock()
        result: dict[str, dict[str, float]] = {}
        for resource, expression in self._node_expressions().items():
            for key, value in self._per_window(f"max_over_time(({expression})[$WINDOW:$STEP])", window, now,
                                               (label,), max).items():
                result.setdefault(node_name(key[0]), {})[resource] = value
        return result

    def check_node_names(self, found: Collection[str], nodes: Collection[str]) -> None:
        self.node_naming.check(found, nodes)

    def scrape_interval(self, exporter: str, at: float | None = None) -> float | None:
        """How often ``exporter``'s cpu counters (``CPU_COUNTERS``) are scraped, in seconds, as
        ``kube.prometheus.scrape_interval`` reads it; None where unknown."""
        with self._asking(counted=True):
            return scrape_interval(self.api, CPU_COUNTERS[exporter], self.clock() if at is None else at)

    def check_rate_window(self) -> None:
        """Warns where a cpu counter is scraped too seldom for ``rate_window``
        (``kube.prometheus.warn_rate_window``): one query per exporter not checked in the last
        ``rate_window_recheck`` (:class:`kube.prometheus.RateWindowCheck`)."""
        # A node cpu query of the user's own rates nothing here: its rule has its own window.
        read = CPU_COUNTERS.keys() - ({"node-exporter"} if self.node_cpu_query else set())
        now = self.clock()
        for exporter in sorted(read):
            if self._rate_checks.due(exporter, now):
                with self._asking(counted=True):
                    self._rate_checks.run(self.api, exporter, now)

    def _node_expressions(self) -> dict[str, str]:
        return node_expressions(self.node_label, self.rate_window, self.node_memory_query, self.node_cpu_query)

    def _own_node_query(self, resource: str) -> bool:
        return bool(self.node_cpu_query if resource == "cpu" else self.node_memory_query)

    # -- queries -----------------------------------------------------------------------------
    def _summaries(
        self,
        queries: Summaries,
        window: float,
        quantile: float,
        keys: tuple[str, ...],
        with_peak: bool,
        last_samples: Callable[[float, Collection[tuple[str, ...]]], dict[tuple[str, ...], float]] | None = None,
        kept: _KeptRead | None = None,
    ) -> dict[tuple[str, ...], UsageStats]:
        """quantile (and peak) per series, asked at once; with ``last_samples`` (now, the series
        counted -> their last sample's time) the sample count and last sample's age too, else none
        (see :meth:`_counted_as`). With ``kept`` (of the expression ``queries`` summarize at each
        step) the quantile comes from its samples kept between passes (:meth:`_kept_quantiles`)."""
        now = self.clock()
        asked_quantile = queries.quantile.replace("$Q", str(quantile))

        def read_quantiles() -> dict[tuple[str, ...], float]:
            if kept is not None:
                try:
                    return self._kept_quantiles(kept, window, quantile, now, keys)
                except _NotKept as why:
                    log.info("a node quantile is asked of Prometheus whole this pass: %s", why)
            return self._per_window(asked_quantile, window, now, keys, max)

        asked = [read_quantiles]
        if with_peak:
            asked.append(lambda: self._per_window(queries.peak, window, now, keys, max))
        if last_samples:
            asked.append(lambda: self._per_window(queries.count, window, now, keys, sum))
        found = self._together(*asked)
        quantiles, peaks = found[0], found[1] if with_peak else {}
        samples = found[-1] if last_samples else {}
        last = last_samples(now, samples.keys()) if last_samples else {}
        return {key: self._stats(value, peaks.get(key, value) if with_peak else None, int(samples.get(key, 0)),
                                 now - last[key] if key in last else None)
                for key, value in quantiles.items()}

    def _counted_as(self, read: dict[tuple[str, ...], UsageStats],
                    counts: dict[tuple[str, ...], UsageStats]) -> dict[tuple[str, ...], UsageStats]:
        """``read`` (summaries read without counts) with the sample count and age of the same
        series in ``counts``: a container's memory is counted by its cpu's read, a node's by one resource's."""
        return {key: self._stats(stats.quantile, stats.peak, known.samples if known else 0,
                                 known.age_seconds if known else None)
                for key, stats in read.items() for known in (counts.get(key),)}

    def _stats(self, quantile: float | None, peak: float | None, samples: int, age: float | None) -> UsageStats:
        return UsageStats(quantile, peak, samples, max(0.0, (samples - 1) * self.resolution), age)

    def _together(self, *reads: Callable[[], _T]) -> list[_T]:
        """Each read in a thread of its own (the first in this one), their results in order. The
        queries they send wait for one of ``concurrency`` slots (:meth:`_asking`): Prometheus
        evaluates each query on one core, so reads one after another left its other cores idle
        while a pass waited (a week's node reads took 80 s in sequence at 5,000 nodes)."""
        if len(reads) <= 1:
            return [read() for read in reads]
        with ThreadPoolExecutor(len(reads) - 1, thread_name_prefix="prometheus") as pool:
            others = [pool.submit(read) for read in reads[1:]]
            first = reads[0]()
            return [first, *(other.result() for other in others)]

    def _per_window(self, template: str, window: float, now: float, keys: tuple[str, ...],
                    combine: Callable[[list[float]], float]) -> dict[tuple[str, ...], float]:
        """Evaluate over the whole window; if Prometheus refuses the size, over 2, 4, ... parts."""
        parts = 1
        while True:
            try:
                values: dict[tuple[str, ...], list[float]] = {}
                span = window / parts
                for index in range(parts):
                    at = now - index * span
                    query = template.replace("$WINDOW", duration(span)).replace("$STEP", duration(self.resolution))
                    for key, value in self._instant(query, at, keys).items():
                        values.setdefault(key, []).append(value)
                return {key: combine(found) for key, found in values.items()}
            except QueryTooLarge as error:
                if parts >= self.max_splits:
                    raise HistoryUnavailable(f"query too large even in {parts} parts: {error}") from None
                parts *= 2
                log.info("prometheus refused a %s window (%s); splitting in %d", duration(window), error, parts)

    def _instant(self, query: str, at: float, keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        with self._asking(counted=True, splittable=True, query=query):
            return self.api.instant(query, at, keys)

    def _range(self, query: str, start: float, end: float, step: float,
               part_steps: int = RANGE_STEPS) -> list[tuple[dict[str, str], Series]]:
        """A range query, each request it sends counted (it may send several)."""
        with self._asking(query=query):
            return self.api.query_range(query, start, end, step, part_steps, on_request=self._count_request)

    def _count_request(self) -> None:
        with self._lock:
            self.queries += 1

    @contextlib.contextmanager
    def _asking(self, counted: bool = False, splittable: bool = False, query: str = "") -> Iterator[None]:
        """What is asked inside, one query (``counted``) whose time is taken as waiting for
        Prometheus; Prometheus unavailable raised as HistoryUnavailable, except QueryTooLarge where
        the caller can split the query (``splittable``). A ``query`` rating node-exporter's cpu
        counters that timed out says what makes it slow and what to set (:func:`explained`)."""
        if counted:
            self._count_request()
        with self._slots:
            started = time.perf_counter()
            try:
                yield
            except PrometheusUnavailable as error:
                if splittable and isinstance(error, QueryTooLarge):
                    raise
                raise HistoryUnavailable(explained(error, query, (
                    ("OVERSALE_PROMETHEUS_NODE_CPU_QUERY", self.node_cpu_query),
                    ("OVERSALE_PROMETHEUS_NODE_MEMORY_QUERY", self.node_memory_query)))) from None
            finally:
                with self._lock:
                    self.query_seconds += time.perf_counter() - started

    def query_range(self, query: str, start: float, end: float,
                    part_steps: int = RANGE_STEPS) -> list[tuple[dict[str, str], Series]]:
        """A range query at ``resolution``: each series' labels and its points (see
        ``PrometheusAPI.query_range``)."""
        return self._range(query, start, end, self.resolution, part_steps)


_EMPTY = UsageStats(None, None, 0, 0.0, None)


def _told_late(read: str, names: Sequence[str]) -> None:
    """One line saying whose samples ``read`` found late, read again and now counted: the store's
    remote-write senders lag (or were cut off from it) that long."""
    if names:
        log.info("%s: samples of %d node(s) reached the store late and are now read (%s)", read, len(names),
                 first_few(sorted(names)))


def _last_sample_time(expression: str) -> str:
    """The time of ``expression``'s last step with a value in ``$WINDOW``."""
    return f"max_over_time(timestamp({expression})[$WINDOW:$STEP])"


STEP_MARK = 2**-26
"""What every step adds to a hot-time count besides the 1 a step above the real allocatable adds
(:func:`_marked`): the one sum then holds both counts, the hot steps in its whole part and all
steps in its fraction (:func:`_hot_time`), so Prometheus evaluates a node's usage once for the two,
not once each (rating every cpu counter at every step is most of a pass's time on real nodes).
Exact while a window holds fewer than 2**26 steps (776 days at 1-second steps): every partial sum
is a multiple of 2**-26 below 2**27, which a float64 holds exactly. One binary operation more per
step, not two: at 5,000 nodes each costs Prometheus about a third of evaluating the usage itself
(``max by`` over node-exporter's two memory gauges), so ``(above) * 2**26 + 1`` took a fifth longer."""


def _marked(above: str) -> str:
    """``above`` (1 where usage is above the real allocatable, else 0, at each step) plus
    :data:`STEP_MARK`."""
    return f"({above}) + {STEP_MARK!r}"


def _hot_time(total: float) -> HotTime:
    """The steps above the real allocatable and all steps of a sum of :func:`_marked` steps.

    >>> _hot_time(3 * (1 + STEP_MARK) + 2 * STEP_MARK)
    HotTime(hot_samples=3, samples=5)

    A sum rounded on its way (a store answering with fewer digits than a float64's shortest
    form, as Prometheus and VictoriaMetrics give it) is refused, not read as other counts:

    >>> _hot_time(float(f"{3 * (1 + STEP_MARK) + 2 * STEP_MARK:.8g}"))
    Traceback (most recent call last):
    ...
    reconcilers.history.HistoryUnavailable: a hot-time count came back rounded (3.0000001): ...
    """
    hot = math.floor(total)
    steps = (total - hot) / STEP_MARK
    if abs(steps - round(steps)) > 0.01:
        raise HistoryUnavailable(f"a hot-time count came back rounded ({total!r}): the history source answers "
                                 "with fewer digits than a float64 holds, which the account's counts need")
    return HotTime(hot, round(steps))


STRETCH_LABEL = "oversale_stretch"
"""The label telling the account's stretches apart in the one query that counts them all."""


class _NotKept(Exception):
    """The account's hours (:meth:`PrometheusHistory._count_kept`) or a node quantile's samples
    (:meth:`PrometheusHistory._kept_quantiles`) cannot be kept this pass."""


@dataclass(frozen=True)
class _KeptQuantile:
    """One node quantile's samples kept between passes (:meth:`PrometheusHistory._kept_quantiles`)."""

    settled: int
    """The last step read as settled: every series' samples up to it are in ``series``."""
    needed: int
    """The highest samples of a window the quantile reads (:func:`~reconcilers.quantile_samples.top_needed`)."""
    series: dict[tuple[str, ...], KeptSamples]


@dataclass(frozen=True)
class _KeptRead:
    """A node quantile read from its samples kept between passes (:meth:`PrometheusHistory._kept_quantiles`)."""

    expression: str
    """The usage, summarized at each step."""
    name: str
    """What it reads, for the log."""
    select: Callable[[Collection[tuple[str, ...]]], str] | None
    """Series (their label values) -> ``expression`` reading them alone; None: a query of the
    user's own, whose series may lack the node label, read whole."""


FIRST_PART_STEPS = 12
"""The steps of a kept quantile's first range request where no series are kept yet (the newest
hour at 5-minute steps): the next ones hold about ``PrometheusHistory.part_points`` points,
however many series the first answered with."""


@dataclass(frozen=True)
class _AccountCount:
    """One count of the hot-time account: ``resource``'s usage against each group's real
    allocatable (:func:`threshold_groups`)."""

    resource: str
    expression: str
    label: str
    groups: list[tuple[float, list[str]]]
    own_query: bool
    """The usage is a query of the user's own, whose series may lack the node label: one group,
    read over every series, never selected by node name."""

    def nodes(self) -> list[str]:
        return [node for _, nodes in self.groups for node in nodes]

    def marked(self, only: Collection[str] | None = None) -> str:
        """:data:`STEP_MARK` at each step, 1 more above the real allocatable: of ``only``'s nodes,
        where given and the series can be selected by node name, else of all."""
        groups = [(threshold, [node for node in nodes if only is None or self.own_query or node in only])
                  for threshold, nodes in self.groups]
        if self.own_query or (only is None and len(groups) == 1):
            return _marked(f"({self.expression}) > bool {groups[0][0]:.0f}")
        return _marked(" or ".join(
            f"(({scoped(self.expression, node_matcher(self.label, nodes))}) > bool {threshold:.0f})"
            for threshold, nodes in groups if nodes))


RECENT = 3600.0
"""How far back a node's last cpu sample is looked for first (:meth:`PrometheusHistory._last_node_samples`)."""

SIZE_TOLERANCE = 0.01
"""Nodes whose real allocatable is within this share of each other are counted hot against the
lowest of theirs (:func:`threshold_groups`)."""


def threshold_groups(thresholds: dict[str, float],
                     tolerance: float = SIZE_TOLERANCE) -> list[tuple[float, list[str]]]:
    """The nodes (node -> its real allocatable of one resource) in groups, each with the lowest
    real allocatable of its nodes, the others within ``tolerance`` above it. Nodes of one instance
    type report nearly the same memory, not always the same: the kernel and firmware keep
    different amounts (a node image upgrade moves MemTotal by megabytes), so one type can stand
    for several values in a cluster. Counted against the lowest, a node's samples between it and
    its own are counted hot: the safe side, by at most ``tolerance`` of its real allocatable.

    >>> threshold_groups({"a": 16.0e9, "b": 16.1e9, "c": 32e9, "d": 3920.0})
    [(3920.0, ['d']), (16000000000.0, ['a', 'b']), (32000000000.0, ['c'])]
    """
    groups: list[tuple[float, list[str]]] = []
    for node, value in sorted(thresholds.items(), key=lambda item: (item[1], item[0])):
        if groups and value <= groups[-1][0] * (1 + tolerance):
            groups[-1][1].append(node)
        else:
            groups.append((value, [node]))
    return groups


@dataclass(frozen=True)
class Summaries:
    """The PromQL templates (``$WINDOW``, ``$STEP``, ``$Q`` the quantile) of one usage's summaries
    per series over a window: its quantile, peak and sample count."""

    quantile: str
    peak: str
    count: str

    @classmethod
    def at_each_step(cls, expression: str, counted: str | None = None) -> Summaries:
        """Of ``expression``'s value at each step: a node's usage, summed over its cpus at each step
        before any quantile (a quantile of a sum is not the sum of the quantiles). The steps
        counted are those ``counted`` has a value at, where given (a cheaper expression with the
        same steps), else ``expression``'s."""
        over = f"({expression})[$WINDOW:$STEP]"
        return cls(f"quantile_over_time($Q, {over})", f"max_over_time({over})",
                   f"count_over_time(({counted or expression})[$WINDOW:$STEP])")

    @classmethod
    def per_cgroup(cls, samples: str, scale: str = "") -> Summaries:
        """Of each container, from ``samples`` (a range of each of its cgroups' series), with the
        aggregation outside the range: Prometheus evaluates an aggregation inside a subquery at
        every step, which took 3 to 5 times as long for the same figures on 10,000 containers
        (``python -m bench.workload_history``'s data). A container's cgroups are the same cgroup
        scraped by two jobs (the same series twice) and its incarnations before and after a
        restart: the quantile and peak are the highest of theirs (never below those of all its
        samples together, the safe side), the sample count their sum."""
        per_container = "max by (namespace, pod, container)"
        return cls(f"{per_container} (quantile_over_time($Q, {samples})){scale}",
                   f"{per_container} (max_over_time({samples})){scale}",
                   f"sum by (namespace, pod, container) (max by (namespace, pod, container, id) "
                   f"(count_over_time({samples})))")
