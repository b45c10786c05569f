"""The usage view: what nodes really use, how fresh that is, and what a node will use after a Pod.

Load-aware scheduling (the extender's filter and score) and the replay read the same view. A
node's samples (from ``metrics.k8s.io`` NodeMetrics, which metrics-server refreshes about every
15 s) become two windows, as Tencent TKE's scheduling watermark and Koordinator's LoadAware
plugin use them: the **5-minute average** of cpu (what the node runs now) and the **1-hour
maximum** of cpu (how high it has gone lately), plus the latest memory (memory does not come and
go the way cpu does). Pods bound in the last few minutes are not in those figures yet (the
kubelet starts them, metrics-server scrapes, the poller reads): their estimated usage is added
until they show up in PodMetrics or the settle time passes, as Crane's "hot value" and
Koordinator's estimated usage of just-scheduled Pods do, so a burst of binds cannot all land on
the node that looked coolest a minute ago. Where Prometheus holds the nodes' history, the cpu
maximum can also come from a longer window read there (:func:`with_history_peak`): a restarted
extender has no hour of samples of its own, and a burst six hours ago is worth remembering.

Figures are fractions of the node's **real** allocatable (the kubelet's values, which the node
webhook records): on an oversold node allocatable is a promise, real capacity is the truth.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from oversale.annotations import PLAIN_DECIMAL, AnnotationKeys, AnnotationProblem
from oversale.quantity import CPU, MEMORY, RESOURCES


@dataclass(frozen=True)
class Sample:
    """One NodeMetrics reading."""

    at: float
    """Seconds, when the reading was first seen on this process's clock (see ``first_seen``)."""
    cpu: int
    """Millicores."""
    memory: int
    """Bytes."""


@dataclass(frozen=True)
class NodeLoad:
    """A node's windows over its samples."""

    cpu_average: float
    """Millicores, mean of the samples of the last ``average_seconds``."""
    cpu_peak: float
    """Millicores, highest sample of the last ``peak_seconds``."""
    memory: float
    """Bytes, the latest sample."""
    at: float
    """When the freshest sample was taken (seconds)."""
    peak_window: str = "1-hour maximum"
    """Where ``cpu_peak`` comes from (the filter's reason names it)."""


@dataclass(frozen=True)
class Watermarks:
    """Fractions of real allocatable above which a node takes no new Pods."""

    cpu_average: Decimal = Decimal("0.65")
    cpu_peak: Decimal = Decimal("0.85")
    memory: Decimal = Decimal("0.85")


DEFAULT_WATERMARKS = Watermarks()
"""The peers' defaults: Tencent TKE's and Koordinator's cpu thresholds."""


@dataclass(frozen=True)
class LoadConfig:
    """Knobs of load-aware placement (``oversale.settings.Settings`` reads them)."""

    watermarks: Watermarks = DEFAULT_WATERMARKS
    max_age_seconds: float = 180
    """Older metrics are stale: the node is neither filtered nor favoured by load."""
    average_seconds: float = 300
    peak_seconds: float = 3600
    settle_seconds: float = 300
    """A bound Pod counts by its estimate until it shows up in PodMetrics or this long passed."""
    cpu_estimate: Decimal = Decimal("0.85")
    """A Pod not yet in the metrics, of a workload none of whose Pods is, is expected to use this
    share of its cpu request (see ``pod_estimate``)."""
    memory_estimate: Decimal = Decimal("0.7")
    load_weight: int = 1
    """Weight of the load score (coolest node after placing) against the packing score."""
    packing_weight: int = 1
    history_peak_seconds: float = 3600
    """Window of the cpu maximum read from Prometheus (only with that history source)."""
    history_max_age_seconds: float = 900
    """A maximum read from Prometheus longer ago than this is no longer used (Prometheus has been
    unreachable for a while): the node's own samples alone count again."""


def node_load(samples: Sequence[Sample], config: LoadConfig = LoadConfig()) -> NodeLoad | None:
    """The windows of ``samples`` (oldest first); None without any sample. Computed once per
    poll: only its age changes between polls (see ``stale_reason``)."""
    return windows([s.at for s in samples], [s.cpu for s in samples], [s.memory for s in samples], config)


def windows(times: Sequence[float], cpus: Sequence[float], memories: Sequence[float],
            config: LoadConfig = LoadConfig()) -> NodeLoad | None:
    """``node_load`` over parallel sequences, ``times`` ascending (what a poller keeps compactly:
    each window is a slice, found by bisection, so a poll of 5,000 nodes stays cheap)."""
    if not times:
        return None
    latest = times[-1]
    recent = cpus[bisect_right(times, latest - config.average_seconds):]
    hour = cpus[bisect_right(times, latest - config.peak_seconds):]
    return NodeLoad(sum(recent) / len(recent), float(max(hour)), float(memories[-1]), latest)


def with_history_peak(load: NodeLoad, peak: float | None, config: LoadConfig) -> NodeLoad:
    """A node's windows with its cpu maximum over the longer history window: the higher of its own
    samples' maximum and the history's, named after the window it came from.

    >>> own = NodeLoad(cpu_average=900, cpu_peak=1200, memory=2e9, at=0)
    >>> with_history_peak(own, 3800, LoadConfig(history_peak_seconds=6 * 3600)).peak_window
    '6-hour maximum, from Prometheus'
    >>> with_history_peak(own, 1000, LoadConfig()) == with_history_peak(own, None, LoadConfig()) == own
    True
    """
    if peak is None or peak <= load.cpu_peak:
        return load
    seconds = config.history_peak_seconds
    window = f"{seconds / 3600:g}-hour" if seconds % 3600 == 0 else f"{seconds / 60:g}-minute"
    return replace(load, cpu_peak=peak, peak_window=f"{window} maximum, from Prometheus")


def is_fresh(load: NodeLoad | None, now: float, config: LoadConfig) -> bool:
    """Whether a node's load can be trusted (else placement falls back to requests)."""
    return load is not None and now - load.at <= config.max_age_seconds


def stale_reason(load: NodeLoad | None, now: float, config: LoadConfig) -> str | None:
    """Why a node's load cannot be trusted, or None."""
    if load is None:
        return "no node metrics"
    if not is_fresh(load, now, config):
        return f"node metrics {now - load.at:.0f}s old (limit {config.max_age_seconds:.0f}s)"
    return None


def first_seen(previous: tuple[float, float] | None, stamp: float, now: float) -> tuple[float, float]:
    """``(stamp, seen)``: a node's reading stamped ``stamp`` and when it was first seen, ``seen``
    on this process's clock ``now`` (``previous``: the same pair for the node's last reading).

    A NodeMetrics timestamp is the kubelet's sample time, taken by the **node's** clock. A node
    whose clock runs an hour ahead would keep a reading that stopped changing fresh for an hour,
    and once its clock is set right every new reading would look older than the last and be
    dropped for that hour. So a reading's age counts from when it was first seen here, as leader
    election counts a Lease's: only a change of stamp says metrics-server scraped again. A first
    reading takes the older of the two, so one already old when first seen stays old.

    >>> first_seen(None, 1000.0, 1100.0)               # first reading, 100 s old
    (1000.0, 1000.0)
    >>> first_seen(None, 5000.0, 1100.0)               # the node's clock is an hour ahead
    (5000.0, 1100.0)
    >>> first_seen((5000.0, 1100.0), 5000.0, 1400.0)   # not scraped again: still 300 s old
    (5000.0, 1100.0)
    >>> first_seen((5000.0, 1100.0), 1390.0, 1400.0)   # its clock set right: a new reading
    (1390.0, 1400.0)
    """
    if previous is not None and previous[0] == stamp:
        return previous
    return stamp, (min(now, stamp) if previous is None else now)


def estimated_usage(requests: Mapping[str, int], config: LoadConfig) -> dict[str, float]:
    """What a Pod of a workload with no Pod in the metrics is expected to use: its request x the
    estimate factors (Koordinator's default estimator)."""
    return {CPU: requests.get(CPU, 0) * float(config.cpu_estimate),
            MEMORY: requests.get(MEMORY, 0) * float(config.memory_estimate)}


@dataclass(frozen=True)
class WorkloadUsage:
    """What one workload's Pods use, per Pod: the mean over those in the metrics now, or over
    those the history window holds."""

    cpu: float
    """Millicores."""
    memory: float
    """Bytes."""
    pods: int
    """How many Pods the mean is over."""


def workload_usage(pods: Iterable[tuple[str, float, float]]) -> dict[str, WorkloadUsage]:
    """Per workload, the mean usage of its Pods, from ``(workload, cpu millicores, memory bytes)``
    per Pod in the metrics; Pods of no workload ("") are left out.

    >>> workload_usage([("shop/Deployment/web", 100, 2**20), ("shop/Deployment/web", 300, 3 * 2**20)])
    {'shop/Deployment/web': WorkloadUsage(cpu=200.0, memory=2097152.0, pods=2)}
    """
    sums: dict[str, list[float]] = {}
    for workload, cpu, memory in pods:
        if workload:
            total = sums.setdefault(workload, [0.0, 0.0, 0])
            total[0] += cpu
            total[1] += memory
            total[2] += 1
    return {workload: WorkloadUsage(cpu / count, memory / count, int(count))
            for workload, (cpu, memory, count) in sums.items()}


_CRONJOB_JOB = re.compile(r"(?P<namespace>[^/]*)/Job/(?P<cronjob>.+)-[0-9]+")
"""A CronJob's Job is named ``<cronjob>-<scheduled time in minutes since the epoch>``."""


def workload_history(workload: str, history: Mapping[str, WorkloadUsage]) -> WorkloadUsage | None:
    """What ``workload``'s Pods used each over the history window (``history``: per workload,
    :func:`workload_usage` of the Pods :func:`oversale.pods.pod_workloads` names). A Job's Pods, whose Job the
    CronJob controller has just made and no history knows yet, are known by the Jobs of the CronJob
    its name comes from.

    >>> nightly = WorkloadUsage(2500.0, 2**30, 4)
    >>> workload_history("batch/Job/nightly-29400480", {"batch/CronJob/nightly": nightly}) == nightly
    True
    >>> workload_history("batch/Job/nightly-29400480", {"batch/CronJob/other": nightly}) is None
    True
    """
    found = history.get(workload)
    if found is None and (job := _CRONJOB_JOB.fullmatch(workload)):
        found = history.get(f"{job['namespace']}/CronJob/{job['cronjob']}")
    return found


def pod_estimate(requests: Mapping[str, int], observed: WorkloadUsage | None, config: LoadConfig) -> dict[str, float]:
    """What a Pod not in the metrics yet (one being placed, or bound in the last few minutes) is
    expected to use: what its workload's Pods use each (a replica like the others), where that is
    known (``observed``: any of them in the metrics now, else their history where Prometheus holds
    it); else its request x the estimate factors.

    Requests say little of use where a workload is not right-sized: a BestEffort replica requests
    nothing and may use cores, and one requesting 4 cores may use a tenth of one. A burst of such
    replicas counted by requests would pile onto one node, or be kept off it, before the metrics
    show them.

    >>> pod_estimate({"cpu": 4000, "memory": 2**30}, WorkloadUsage(150.0, 2**28, 3), LoadConfig())
    {'cpu': 150.0, 'memory': 268435456.0}
    >>> pod_estimate({"cpu": 4000, "memory": 0}, None, LoadConfig())
    {'cpu': 3400.0, 'memory': 0.0}
    """
    if observed is None or observed.pods <= 0:
        return estimated_usage(requests, config)
    return {CPU: float(observed.cpu), MEMORY: float(observed.memory)}


def watermark_exceeded(load: NodeLoad, pending: Mapping[str, float], real: Mapping[str, int],
                       watermarks: Watermarks) -> tuple[str, float, float, str] | None:
    """The first scheduling watermark a node with fresh metrics is above, as (resource, share of
    real capacity, watermark, window), or None (the filter's test; ``hot_reason`` words it).

    ``pending``: estimated usage of Pods bound recently and not yet in the metrics.
    """
    checks = (
        (CPU, load.cpu_average + pending.get(CPU, 0.0), watermarks.cpu_average, "5-min average"),
        (CPU, load.cpu_peak + pending.get(CPU, 0.0), watermarks.cpu_peak, load.peak_window),
        (MEMORY, load.memory + pending.get(MEMORY, 0.0), watermarks.memory, "latest"),
    )
    for resource, used, watermark, window in checks:
        capacity = real.get(resource, 0)
        if capacity > 0 and used / capacity > float(watermark):
            return resource, used / capacity, float(watermark), window
    return None


def hot_reason(load: NodeLoad, pending: Mapping[str, float], real: Mapping[str, int],
               watermarks: Watermarks) -> str | None:
    """Why a node with fresh metrics is too hot for new Pods (the filter), or None."""
    exceeded = watermark_exceeded(load, pending, real, watermarks)
    if exceeded is None:
        return None
    resource, share, watermark, window = exceeded
    return (f"{resource} usage {share:.0%} of real capacity ({window}"
            f"{', with Pods bound but not yet in the metrics' if pending.get(resource) else ''}) "
            f"is above the scheduling watermark {watermark:.0%}")


def load_score_after(cpu: float, memory: float, real_cpu: int, real_memory: int) -> int:
    """The load score of a node after placing a Pod, from its predicted usage per resource
    (current usage, 5-min average cpu and latest memory, + Pods not yet in the metrics + this
    Pod's estimate) over real allocatable; a resource without real capacity counts as full.
    10 for an idle node, 0 at or above real capacity; the hotter resource decides. Plain numbers,
    no calls: this runs for every node of every prioritize call.

    >>> load_score_after(0, 0, 4000, 2**30), load_score_after(4800, 0, 4000, 2**30)
    (10, 0)
    """
    cpu_share = cpu / real_cpu if real_cpu > 0 else 1.0
    memory_share = memory / real_memory if real_memory > 0 else 1.0
    score = round(10 * (1 - (cpu_share if cpu_share > memory_share else memory_share)))
    return 0 if score < 0 else 10 if score > 10 else score


def combined_score(packing: int, load: int | None, config: LoadConfig) -> int:
    """The extender's score: packing (requests, NUMA, fragmentation) and load by their weights; a
    node without fresh metrics (``load`` None) is scored by packing alone."""
    if load is None or config.load_weight <= 0:
        return packing
    total = config.packing_weight + config.load_weight
    return round((packing * config.packing_weight + load * config.load_weight) / total)


def watermarks_for(labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None, keys: AnnotationKeys,
                   defaults: Watermarks) -> tuple[Watermarks, list[AnnotationProblem]]:
    """A node's scheduling watermarks: its annotation, else its label, else the defaults; a bad
    value is reported and the default kept."""
    values, problems = read_watermarks(labels, annotations, {
        keys.cpu_scheduling_watermark: defaults.cpu_average,
        keys.cpu_peak_scheduling_watermark: defaults.cpu_peak,
        keys.memory_scheduling_watermark: defaults.memory,
    })
    return Watermarks(*values), problems


def read_watermarks(labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None,
                    defaults: Mapping[str, Decimal]) -> tuple[list[Decimal], list[AnnotationProblem]]:
    """For each key of ``defaults`` (in order): the node's annotation, else its label, else the
    default; the one reader of every node watermark (scheduling and runtime)."""
    problems: list[AnnotationProblem] = []
    values = []
    for key, default in defaults.items():
        text = (annotations or {}).get(key, (labels or {}).get(key))
        value = parse_watermark(text) if text is not None else default
        if value is None:
            problems.append(AnnotationProblem(key, str(text), "not a number above 0 and at most 1; default kept"))
            value = default
        values.append(value)
    return values, problems


def parse_watermark(text: str) -> Decimal | None:
    """A fraction above 0 and at most 1, or None.

    >>> parse_watermark("0.7"), parse_watermark("70%"), parse_watermark("1.5")
    (Decimal('0.7'), None, None)
    """
    stripped = text.strip() if isinstance(text, str) else ""
    if not PLAIN_DECIMAL.match(stripped):
        return None
    value = Decimal(stripped)
    return value if 0 < value <= 1 else None


def pending_usage(estimates: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The summed estimates of Pods bound but not yet in the metrics.

    >>> pending_usage([{"cpu": 850.0, "memory": 2.0**29}, {"cpu": 120.0}])
    {'cpu': 970.0, 'memory': 536870912.0}
    """
    total = dict.fromkeys(RESOURCES, 0.0)
    for estimate in estimates:
        for resource in RESOURCES:
            total[resource] += estimate.get(resource, 0.0)
    return total
