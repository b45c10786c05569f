"""Ratio estimation from usage history: the policies the reconcilers (and the backtest) run.

Everything here is arithmetic over summaries of history (:class:`UsageStats`), so the live
reconcilers, whatever their metrics source, and an offline replay of a trace share one
implementation.

Compression (two-way right-sizing), per workload and resource::

    demand(container) = Pq(usage) x (1 + margin)           # memory: at least the observed peak
    ratio             = clamp(min over containers(request / demand), min_ratio, max_ratio)

A ratio below 1 raises the request of a workload that uses more than it asked for; a lowering
with less than ``full_confidence_seconds`` of history is pulled toward 1, a raise is not.

Node oversale, per node and resource::

    ratio = clamp(target x requested / Pq(node usage), 1, max_ratio)

The node's usage is the *sum* of its Pods' usage, so its peak is below the sum of their peaks
whenever those do not coincide: that difference is the room overselling hands out. With the
defaults (q = 1, the window's peak; cpu target 1) a node takes Pods until the peak its Pods
reached together over the window would fill its real capacity.
    cover = requested / real_allocatable                       # below it running Pods are underwater
    floor = cover x (1 + floor_margin)                         # a lowering stops here

    A ratio computed below the floor (the node is too hot for what it runs) lowers the current
    ratio no further than the floor, and never raises it, except an underwater node to ``cover``.

Both then pass :func:`stabilize`: changes under 10% are ignored, a raise is at most 25% per
cycle, a lowering happens at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from fractions import Fraction

from oversale.quantity import CPU, format_amount, format_measured

HUNDREDTH = Decimal("0.01")
ONE = Decimal(1)


@dataclass(frozen=True)
class UsageStats:
    """A summary of one container's (all its Pods') or one node's usage over the window."""

    quantile: float | None
    """The configured high percentile of usage (millicores or bytes); None without samples."""
    peak: float | None
    """The highest sample (millicores or bytes)."""
    samples: int
    """How many samples the window holds."""
    covered_seconds: float
    """Time between the first and the last sample."""
    age_seconds: float | None = None
    """Time since the last sample (None when unknown)."""


@dataclass(frozen=True)
class Proposal:
    """A ratio the policy asks for, and why, in words a person reads in a table or an Event."""

    ratio: Decimal
    reason: str
    demand: float | None = None
    """Compression: the binding container's demand. Oversale: the usage peak."""


@dataclass
class RatioPlan:
    """What a reconciler wants for one object: per resource the ratio it carries and the one to write."""

    current: dict[str, Decimal] = field(default_factory=dict)
    proposals: dict[str, Proposal] = field(default_factory=dict)
    """Resource -> the ratio to write (stabilized) and why."""

    def changes(self) -> dict[str, Proposal]:
        return {r: p for r, p in self.proposals.items() if p.ratio != self.current.get(r, ONE)}


@dataclass(frozen=True)
class StabilityConfig:
    min_change: Decimal = Decimal("0.10")
    """Relative changes smaller than this are ignored."""
    max_raise: Decimal = Decimal("0.25")
    """A ratio grows by at most this fraction per cycle; it shrinks at once."""


@dataclass(frozen=True)
class CompressionEstimator:
    percentile: float = 1.0
    margin: Decimal = Decimal("0.05")
    max_ratio: Decimal = Decimal(8)
    min_ratio: Decimal = Decimal("0.5")
    """Below 1 a ratio raises the request (a workload using more than it asked for)."""
    min_coverage_seconds: float = 24 * 3600
    """No ratio other than 1 with less history than this."""
    min_samples: int = 100
    """No ratio above 1 with fewer samples than this."""
    full_confidence_seconds: float = 7 * 24 * 3600
    """With less history the ratio is pulled toward 1 in proportion."""
    stability: StabilityConfig = StabilityConfig()


@dataclass(frozen=True)
class OversaleEstimator:
    """The knobs of the node oversale ratio (the formula is the module docstring's, applied by
    :func:`oversale_proposal`); ``Settings.oversale_estimator`` builds it from the environment."""

    percentile: float = 1.0
    """CPU: the quantile of the node's summed usage taken as its coming peak (from the hot-time
    budget: ``oversale.budget.budget_quantile``)."""
    memory_percentile: float = 1.0
    budget_scale: float = 1.0
    """Calibration of the hot-time budget: the node's quantile is ``1 - budget_scale x budget``."""
    cpu_target: Decimal = Decimal(1)
    memory_target: Decimal = Decimal("0.6")
    cpu_max_ratio: Decimal = Decimal(5)
    memory_max_ratio: Decimal = Decimal("1.2")
    floor_margin: Decimal = Decimal("0.05")
    min_coverage_seconds: float = 24 * 3600
    min_samples: int = 100
    staleness_seconds: float = 3600
    """Metrics older than this count as stale: the ratio decays toward 1 (never below the floor)."""
    decay: Decimal = Decimal("0.5")
    """Each stale cycle keeps this fraction of (ratio - 1)."""
    stability: StabilityConfig = StabilityConfig()

    def target(self, resource: str) -> Decimal:
        return self.cpu_target if resource == CPU else self.memory_target

    def percentile_of(self, resource: str) -> float:
        return self.percentile if resource == CPU else self.memory_percentile

    def max_ratio(self, resource: str) -> Decimal:
        return self.cpu_max_ratio if resource == CPU else self.memory_max_ratio


def percentile_name(q: float) -> str:
    """``P99.9`` for 0.999, ``P100`` for the peak."""
    return f"P{round(q * 100, 3):g}"


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile with linear interpolation between closest ranks, as PromQL's
    ``quantile_over_time`` computes it.

    >>> quantile([1, 2, 3, 4], 0.5)
    2.5
    >>> quantile([10], 0.99)
    10.0
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    lower = math.floor(rank)
    upper = min(lower + 1, len(ordered) - 1)
    weight = rank - lower
    return float(ordered[lower] * (1 - weight) + ordered[upper] * weight)


def summarize(samples: Sequence[tuple[float, float]], q: float, now: float | None = None) -> UsageStats:
    """UsageStats of (timestamp seconds, value) samples."""
    if not samples:
        return UsageStats(None, None, 0, 0.0, None)
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    return UsageStats(
        quantile=quantile(values, q),
        peak=float(max(values)),
        samples=len(samples),
        covered_seconds=max(times) - min(times),
        age_seconds=None if now is None else now - max(times),
    )


def merge_pods(stats: Sequence[UsageStats]) -> UsageStats:
    """One container's stats over its Pods: the highest Pod's quantile and peak (conservative:
    the busiest replica decides), samples added, the longest coverage, the freshest sample."""
    present = [s for s in stats if s.samples]
    if not present:
        return UsageStats(None, None, 0, 0.0, None)
    ages = [s.age_seconds for s in present if s.age_seconds is not None]
    quantiles = [s.quantile for s in present if s.quantile is not None]
    peaks = [s.peak for s in present if s.peak is not None]
    return UsageStats(
        quantile=max(quantiles) if quantiles else None,
        peak=max(peaks) if peaks else None,
        samples=sum(s.samples for s in present),
        covered_seconds=max(s.covered_seconds for s in present),
        age_seconds=min(ages) if ages else None,
    )


def compression_proposal(
    resource: str,
    requests: Mapping[str, int],
    usage: Mapping[str, UsageStats],
    estimator: CompressionEstimator,
) -> Proposal:
    """The compression ratio for one resource of a workload.

    ``requests``: container -> request (millicores/bytes) from the pod template; ``usage``: container
    -> UsageStats. The most conservative container decides.
    """
    if not requests:
        return Proposal(ONE, f"no {resource} requests")
    best: tuple[Fraction, str, float] | None = None
    coverage = math.inf
    for container, request in sorted(requests.items()):
        stats = usage.get(container)
        if stats is None or stats.quantile is None:
            return Proposal(ONE, f"no usage history for container {container}")
        if stats.covered_seconds < estimator.min_coverage_seconds or stats.samples < estimator.min_samples:
            return Proposal(ONE, f"not enough history for container {container} "
                                 f"({stats.covered_seconds / 3600:.1f} h, {stats.samples} samples)")
        demand = stats.quantile * (1 + float(estimator.margin))
        if resource != CPU and stats.peak is not None:
            demand = max(demand, stats.peak)  # memory: never below what was actually used
        demand = max(demand, 1.0)
        ratio = Fraction(request) / Fraction(demand)
        if best is None or ratio < best[0]:
            best = (ratio, container, demand)
        coverage = min(coverage, stats.covered_seconds)
    assert best is not None
    ratio, container, demand = best
    clamped = min(max(ratio, Fraction(estimator.min_ratio)), Fraction(estimator.max_ratio))
    # Little history makes a *lowering* uncertain, so it is pulled toward 1; a raise is the safe
    # direction (the workload already uses more than it asked for) and applies in full.
    confidence = Fraction(1) if clamped < 1 else min(
        Fraction(1), Fraction(coverage) / Fraction(estimator.full_confidence_seconds))
    adjusted = 1 + (clamped - 1) * confidence
    proposed = _decimal(adjusted, ROUND_FLOOR)
    shown = format_measured(resource, demand)
    reason = (f"container {container}: request {format_amount(resource, requests[container])}, "
              f"demand {shown} ({percentile_name(estimator.percentile)} x {1 + estimator.margin}"
              f"{', at least the peak' if resource != CPU else ''})")
    if confidence < 1:
        reason += f"; {float(confidence):.0%} confidence ({coverage / 86400:.1f} days of history)"
    return Proposal(proposed, reason, demand)


def oversale_proposal(
    resource: str,
    requested: int,
    real_allocatable: int,
    usage: UsageStats | None,
    current: Decimal,
    estimator: OversaleEstimator,
) -> Proposal:
    """The oversale ratio for one resource of a node (already stabilized: see module docstring)."""
    floor = safe_floor(requested, real_allocatable, estimator.floor_margin)
    if usage is None or usage.quantile is None or not has_enough_history(usage, estimator):
        return Proposal(current, "not enough usage history: holding the current ratio")
    if usage.age_seconds is not None and usage.age_seconds > estimator.staleness_seconds:
        decayed = _decimal(1 + (Fraction(current) - 1) * Fraction(estimator.decay), ROUND_CEILING)
        held = min(current, max(decayed, floor))
        return Proposal(held, f"metrics stale for {usage.age_seconds / 60:.0f} min: decaying toward 1, "
                              f"not below the floor {floor}")
    maximum = estimator.max_ratio(resource)
    peak = max(usage.quantile, 1.0)
    raw = Fraction(estimator.target(resource)) * Fraction(requested) / Fraction(peak)
    computed = _decimal(min(max(raw, Fraction(1)), Fraction(maximum)), ROUND_FLOOR)
    reason = (f"{percentile_name(estimator.percentile_of(resource))} usage "
              f"{format_measured(resource, peak)} of {format_amount(resource, requested)} requested, "
              f"target {estimator.target(resource)}")
    cover = safe_floor(requested, real_allocatable, Decimal(0))
    if cover > maximum:
        reason += f"; requests need {cover}, above the maximum {maximum}: holding"
        return Proposal(max(current, maximum), reason, peak)
    if computed < floor:
        # Too hot for what it already runs. Lowering stops at the floor, so no Pod is pushed
        # underwater; but a node below the floor is not *raised* to it: the margin would be free
        # allocatable the scheduler fills at once, the floor would rise with the new requests, and
        # a hot node would ratchet up to the maximum. Only an underwater node is lifted, to cover.
        proposed = max(min(current, floor), cover)
        if proposed == floor:
            reason += f"; held at the safe floor {floor} (requests / real allocatable + margin)"
        elif proposed == cover and cover > current:
            reason += f"; raised only to cover the running requests ({cover}), no room for more"
        else:
            reason += f"; usage above target: holding, no room added (floor {floor})"
        return Proposal(proposed, reason, peak)
    proposed, why = stabilize(current, computed, estimator.stability)
    if why:
        reason += f"; {why}"
    if proposed < cover:
        reason += f"; raised to cover the running requests ({cover})"
        proposed = cover
    return Proposal(proposed, reason, peak)


def has_enough_history(usage: UsageStats, estimator: OversaleEstimator) -> bool:
    """Whether a node's window is long and full enough for the estimator to set a ratio from it
    (otherwise the ratio holds where it is)."""
    return usage.samples >= estimator.min_samples and usage.covered_seconds >= estimator.min_coverage_seconds


def safe_floor(requested: int, real_allocatable: int, margin: Decimal) -> Decimal:
    """The lowest ratio whose oversold allocatable still holds ``requested``, plus a margin."""
    if real_allocatable <= 0:
        return ONE
    return max(ONE, _decimal(Fraction(requested, real_allocatable) * (1 + Fraction(margin)), ROUND_CEILING))


def stabilize(current: Decimal, proposed: Decimal, config: StabilityConfig) -> tuple[Decimal, str]:
    """The ratio to write: changes under ``min_change`` are ignored, raises are capped at
    ``max_raise`` per cycle, lowerings (toward safety) happen at once."""
    if current <= 0:
        current = ONE
    change = (proposed - current) / current
    if abs(change) < config.min_change:
        return current, "" if proposed == current else f"change under {config.min_change:.0%} ignored"
    if proposed > current:
        capped = _decimal(Fraction(current) * (1 + Fraction(config.max_raise)), ROUND_FLOOR)
        if proposed > capped:
            return capped, f"raise capped at {config.max_raise:.0%} per cycle (wants {proposed})"
    return proposed, ""


def _decimal(value: Fraction, rounding: str) -> Decimal:
    """A ratio with two decimals, rounded in the safe direction asked for."""
    exact = Decimal(value.numerator) / Decimal(value.denominator)
    return exact.quantize(HUNDREDTH, rounding=rounding)
