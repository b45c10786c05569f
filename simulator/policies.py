"""The systems the replay compares: this project and the peers a user would pick instead.

A system is a request policy (what the compression reconciler, or a peer's recommender, sets
each workload's request to) plus, optionally, a node policy (what the node oversale reconciler,
or a peer's overcommit controller, sets each node's ratio to). A system with only the first is of
kind ``compression``, one with only the second ``node-oversale``, one with both ``system``.
This project's policies call the core estimators, the same ones the live reconcilers run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from oversale.compression import resized_amount
from oversale.estimator import (
    CompressionEstimator,
    OversaleEstimator,
    StabilityConfig,
    UsageStats,
    compression_proposal,
    oversale_proposal,
    quantile,
    summarize,
)
from oversale.quantity import CPU
from oversale.remediation import RemediationConfig
from oversale.usage import LoadConfig
from simulator.trace import DAY, SLOT

History = dict[str, tuple[np.ndarray, np.ndarray]]
"""resource -> (timestamps in seconds, usage) before the evaluated day"""

RequestPolicy = Callable[[str, float, History, float], float]
"""(resource, original request, history, day start) -> the request the policy sets."""

NodeRatio = Callable[[str, float, float, np.ndarray, np.ndarray, float], float]
"""(resource, real capacity, requested, usage history times, summed values, current ratio) -> ratio >= 1"""


@dataclass(frozen=True)
class System:
    name: str
    source: str
    request: RequestPolicy
    ratio: NodeRatio | None = None
    family: str = ""
    """Variants of one system along a knob share a family (a curve on the frontier plot)."""
    ours: bool = False
    load: LoadConfig | None = None
    """Load-aware placement (the extender's watermark filter and load score) with these knobs;
    None: by requests alone."""
    remediation: RemediationConfig | None = None
    """Hot-node remediation (the remediator's policy, every 5-minute sample); None: off."""

    @property
    def kind(self) -> str:
        if self.ratio is None:
            return "compression"
        return "node-oversale" if self.request is no_compression else "system"


def usage_stats(times: np.ndarray, values: np.ndarray, percentile: float, now: float) -> UsageStats:
    """The estimator's own summary of a history given as arrays."""
    return summarize(list(zip(times.tolist(), values.tolist(), strict=True)), percentile, now)


# ---- request policies ---------------------------------------------------------------------------

def ours_requests(estimator: CompressionEstimator) -> RequestPolicy:
    """This project's right-sizing: the compression reconciler's ratio for the workload, applied
    by the webhook's own arithmetic (a ratio below 1 raises the request)."""
    def request(resource: str, original: float, history: History, now: float) -> float:
        times, values = history[resource]
        stats = usage_stats(times, values, estimator.percentile, now)
        amount = max(1, round(original))
        proposal = compression_proposal(resource, {"c": amount}, {"c": stats}, estimator)
        return float(resized_amount(amount, proposal.ratio, 1))
    return request


def vpa_style(multiplier: float = 1.15) -> RequestPolicy:
    """P90 of a histogram whose samples decay with a 24 h half-life, x 1.15 (VPA's recommender)."""
    def request(resource: str, original: float, history: History, now: float) -> float:
        times, values = history[resource]
        if len(values) == 0:
            return original
        weights = np.power(2.0, (times - now) / DAY)
        order = np.argsort(values)
        cumulative = np.cumsum(weights[order])
        index = int(np.searchsorted(cumulative, 0.9 * cumulative[-1]))
        return float(values[order][min(index, len(values) - 1)] * multiplier)
    return request


def crane_style(multiplier: float = 1.15) -> RequestPolicy:
    """P99 over 7 days x 1.15 (Crane's resource recommendation)."""
    def request(resource: str, original: float, history: History, now: float) -> float:
        _, values = history[resource]
        if len(values) == 0:
            return original
        return float((quantile(values.tolist(), 0.99) or 0.0) * multiplier)
    return request


def static_compression(ratio: float = 2) -> RequestPolicy:
    def request(resource: str, original: float, history: History, now: float) -> float:
        return original / ratio
    return request


def no_compression(resource: str, original: float, history: History, now: float) -> float:
    return original


# ---- node policies ------------------------------------------------------------------------------

def ours_ratio(estimator: OversaleEstimator) -> NodeRatio:
    # The replay evaluates the steady state: the live reconciler reaches the same ratio within
    # a few passes (raises are capped per pass), so the cap is lifted here.
    steady = dataclasses.replace(estimator, stability=StabilityConfig(Decimal(0), Decimal(1000)))

    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        now = float(times[-1]) + SLOT if len(times) else 0.0
        stats = usage_stats(times, values, steady.percentile, now)
        return float(oversale_proposal(resource, round(requested), round(capacity), stats,
                                       Decimal(str(current)), steady).ratio)
    return ratio


def katalyst_realtime(target: float = 0.6, e: float = 0.4) -> NodeRatio:
    """Katalyst's realtime oversale ratio max(1, ((A*T - U) / max(min(U/R, 1), E) + R) / A), with U
    the latest usage."""
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        if len(values) == 0 or requested <= 0:
            return 1.0
        usage = float(values[-1])
        return max(1.0, ((capacity * target - usage) / max(min(usage / requested, 1.0), e) + requested) / capacity)
    return ratio


def capped_at(policy: NodeRatio, cpu_max: float, memory_max: float) -> NodeRatio:
    """A peer's ratio clamped to maxima, as this project's node webhook clamps any ratio."""
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        wanted = policy(resource, capacity, requested, times, values, current)
        return min(wanted, cpu_max if resource == CPU else memory_max)
    return ratio


def static_ratio(value: float = 1.5) -> NodeRatio:
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        return value
    return ratio


# ---- the systems of a default run ---------------------------------------------------------------

OURS = "oversale"
"""The family of this project's whole system (its variants make its curve)."""


def default_systems(compression: CompressionEstimator, oversale: OversaleEstimator,
                    frontier: bool = False, load: LoadConfig | None = None,
                    remediation: RemediationConfig | None = None) -> list[System]:
    """This project as configured (the whole system, and each half alone), its curve along the
    node cpu target, and the peers with their published defaults; with ``frontier`` also the
    peers' variants along their main knob, so every peer is a curve too."""
    ours_source = (f"this project: requests P{round(compression.percentile * 100)} x {1 + compression.margin} "
                   f"within ratios {compression.min_ratio}..{compression.max_ratio}; node ratio "
                   f"{oversale.cpu_target} x requested / P{round(oversale.percentile * 100)} of the node's summed "
                   f"usage (cpu), {oversale.memory_target} (memory), at most {oversale.cpu_max_ratio} / "
                   f"{oversale.memory_max_ratio}")
    systems = [
        System("none", "no right-sizing, no overselling (baseline)", no_compression, family="none"),
        System(OURS, ours_source, ours_requests(compression), ours_ratio(oversale), OURS, ours=True),
        System("oversale-pods", "this project's right-sizing alone (no node overselling)", ours_requests(compression),
               family="oversale-pods", ours=True),
        System("oversale-nodes", "this project's node overselling alone (requests as written)", no_compression,
               ours_ratio(oversale), "oversale-nodes", ours=True),
        System("vpa-style", "Kubernetes VPA recommender: P90 of a decaying histogram, 24 h half-life, x 1.15",
               vpa_style(), family="vpa-style"),
        System("crane-style", "Crane: P99 over 7 days x 1.15", crane_style(), family="crane-style"),
        System("katalyst-realtime", "Katalyst: max(1, ((A*T - U)/max(min(U/R, 1), E) + R)/A), T=0.6, E=0.4",
               no_compression, katalyst_realtime(), "katalyst-realtime"),
        System("crane-style+katalyst", "Crane-style requests on nodes Katalyst oversells (T=0.6)", crane_style(),
               katalyst_realtime(), "crane-style+katalyst"),
        System("static-2", "static compression ratio 2", static_compression(2), family="static"),
        System("static-oversale-1.5", "static oversale ratio 1.5", no_compression, static_ratio(1.5),
               "static-oversale"),
    ]
    systems.append(System(f"{OURS}+load-aware", "this project with load-aware placement (OVERSALE_LOAD_AWARE=true): "
                          "the extender's watermark filter and load score on each node's last hour of usage",
                          ours_requests(compression), ours_ratio(oversale), f"{OURS}+load-aware", ours=True,
                          load=load or LoadConfig()))
    systems.append(System(f"{OURS}+remediation", "this project with hot-node remediation (OVERSALE_REMEDIATION=true): "
                          "Pods moved off nodes above the runtime watermark, to nodes the extender's filter accepts",
                          ours_requests(compression), ours_ratio(oversale), f"{OURS}+remediation", ours=True,
                          remediation=remediation or RemediationConfig()))
    for target in ("0.7", "0.8", "0.9"):
        variant = dataclasses.replace(oversale, cpu_target=Decimal(target))
        systems.append(System(f"{OURS} cpu target {target}", "this project, node cpu target varied",
                              ours_requests(compression), ours_ratio(variant), OURS, ours=True))
    if not frontier:
        return systems
    for multiplier in (1.0, 1.5, 2.0):
        systems.append(System(f"vpa-style x{multiplier:g}", "VPA-style, margin varied", vpa_style(multiplier),
                              family="vpa-style"))
        systems.append(System(f"crane-style x{multiplier:g}", "Crane-style, margin varied", crane_style(multiplier),
                              family="crane-style"))
    for target_utilization in (0.2, 0.4, 0.8):
        systems.append(System(f"katalyst-realtime T={target_utilization:g}", "Katalyst, T varied", no_compression,
                              katalyst_realtime(target_utilization), "katalyst-realtime"))
        systems.append(System(f"crane-style+katalyst T={target_utilization:g}", "Crane-style on Katalyst, T varied",
                              crane_style(), katalyst_realtime(target_utilization), "crane-style+katalyst"))
    for ratio in (1.5, 3, 4):
        systems.append(System(f"static-{ratio:g}", "static compression ratio", static_compression(ratio),
                              family="static"))
    for value in (1.25, 2, 2.5):
        systems.append(System(f"static-oversale-{value:g}", "static oversale ratio", no_compression,
                              static_ratio(value), "static-oversale"))
    return systems
