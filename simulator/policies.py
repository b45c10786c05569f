"""The systems the replay compares: this project and the peers a user would pick instead.

A system is a request policy (what the compression reconciler, or a peer's recommender, sets
each workload's request to) plus, optionally, a node policy (what the node oversale reconciler,
or a peer's overcommit controller, sets each node's ratio to). A system with only the first is of
kind ``compression``, one with only the second ``node-oversale``, one with both ``system``.
This project's policies call the core estimators, the same ones the live reconcilers run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

from oversale.budget import (
    DAY_SECONDS,
    NO_HOT_TIME,
    AccountConfig,
    HotTime,
    HotTimeBudget,
    NodeAccount,
    budget_proposal,
    budget_quantile,
    compression_percentile,
    keep_account,
)
from oversale.compression import resized_amount
from oversale.estimator import (
    CompressionEstimator,
    OversaleEstimator,
    StabilityConfig,
    UsageStats,
    compression_proposal,
    percentile_name,
    quantile,
    summarize,
)
from oversale.quantity import CPU
from oversale.remediation import RemediationConfig
from oversale.usage import LoadConfig, Watermarks
from simulator.trace import DAY, SLOT

History = dict[str, tuple[np.ndarray, np.ndarray]]
"""resource -> (timestamps in seconds, usage) before the evaluated day"""

RequestPolicy = Callable[[str, float, History, float], float]
"""(resource, original request, history, day start) -> the request the policy sets."""

NodeRatio = Callable[[str, float, float, np.ndarray, np.ndarray, float], float]
"""(resource, real capacity, requested, usage history times, summed values, current ratio) -> ratio >= 1"""


@dataclass(frozen=True)
class System:
    """One system the replay compares: how it sets requests (``request``) and node ratios
    (``ratio``; None: nodes at their real size), and what it adds; ``source`` says what it stands
    for (the report prints it)."""

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
    estimate_from_usage: bool = True
    """With ``load``: a Pod is estimated by what its workload uses where that is known (this
    project's extender); False: by its request x the estimate factors alone (Koordinator's
    default estimator)."""
    remediation: RemediationConfig | None = None
    """Hot-node remediation (the remediator's policy, every 5-minute sample); None: off."""
    account: BudgetAccount | None = None
    """The hot-time account that backs the system's node ratios off (None: no account)."""

    @property
    def kind(self) -> str:
        if self.ratio is None:
            return "compression"
        return "node-oversale" if self.request is no_compression else "system"

    @property
    def adds(self) -> list[str]:
        """The steps this system runs beyond placing by requests ("load-aware", "remediation"):
        a system of ours with any is a variant, judged against our budget curve."""
        return [step for step, config in (("load-aware", self.load), ("remediation", self.remediation)) if config]


@dataclass
class BudgetAccount:
    """The live account of hot time, kept for one replayed system: the simulated cluster is one
    pool, observed once a day (what the reconcilers see of the days before), and its multipliers
    scale every node's ratio target the next day, through ``oversale.budget.adjust_multiplier``."""

    budget: HotTimeBudget
    config: AccountConfig = field(default_factory=AccountConfig)
    accounts: dict[str, NodeAccount] = field(default_factory=dict)
    """Per resource, the account as ``keep_account`` leaves it (times in days)."""
    days: list[dict[str, HotTime]] = field(default_factory=list)

    def reset(self) -> None:
        self.accounts.clear()
        self.days.clear()

    def multiplier(self, resource: str) -> float:
        return self.accounts.get(resource, NodeAccount()).multiplier

    def observe(self, day: int, spent: dict[str, HotTime]) -> None:
        self.days = [*self.days, spent][-max(1, round(self.config.long_window_seconds / DAY_SECONDS)):]
        for resource, short in spent.items():
            long = sum((observed[resource] for observed in self.days), NO_HOT_TIME)
            self.accounts[resource], _ = keep_account(self.accounts.get(resource, NodeAccount()), short, long,
                                                      self.budget.of(resource), day * DAY_SECONDS, self.config)


def usage_stats(times: np.ndarray, values: np.ndarray, percentile: float, now: float) -> UsageStats:
    """The estimator's own summary of a history given as arrays."""
    return summarize(list(zip(times.tolist(), values.tolist(), strict=True)), percentile, now)


# ---- request policies ---------------------------------------------------------------------------

def ours_requests(estimator: CompressionEstimator) -> RequestPolicy:
    """This project's right-sizing: the compression reconciler's ratio for the workload, applied
    by the webhook's own arithmetic (a ratio below 1 raises the request)."""
    def request(resource: str, original: float, history: History, now: float) -> float:
        if original <= 0:
            return 0.0  # a container requesting none keeps none: the webhook scales requests, it adds none
        times, values = history[resource]
        stats = usage_stats(times, values, estimator.percentile, now)
        amount = max(1, round(original))
        proposal = compression_proposal(resource, {"c": amount}, {"c": stats}, estimator)
        return float(resized_amount(amount, proposal.ratio, 1))
    return request


def vpa_style(multiplier: float = 1.15) -> RequestPolicy:
    """P90 of a histogram whose samples decay with a 24 h half-life, x 1.15 (VPA's recommender; it
    has no window, and a sample a week old weighs under 1% of a new one)."""
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


CRANE_WINDOW = 7 * DAY
"""Crane's recommendation reads 7 days, whatever window this project's estimates read."""


def crane_style(multiplier: float = 1.15) -> RequestPolicy:
    """P99 over 7 days x 1.15 (Crane's resource recommendation)."""
    def request(resource: str, original: float, history: History, now: float) -> float:
        times, values = history[resource]
        values = values[times >= now - CRANE_WINDOW]
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

def ours_ratio(estimator: OversaleEstimator, account: BudgetAccount) -> NodeRatio:
    """The node reconciler's ratio at the account's budget (``budget_proposal``), its target
    scaled by the account's multiplier."""
    # The replay evaluates the steady state: the live reconciler reaches the same ratio within
    # a few passes (raises are capped per pass), so the cap is lifted here.
    steady = dataclasses.replace(estimator, stability=StabilityConfig(Decimal(0), Decimal(1000)))

    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        now = float(times[-1]) + SLOT if len(times) else 0.0
        budget = account.budget.of(resource)
        stats = usage_stats(times, values, budget_quantile(budget, steady.budget_scale), now)
        return float(budget_proposal(resource, round(requested), round(capacity), stats, Decimal(str(current)),
                                     steady, budget, account.multiplier(resource)).ratio)
    return ratio


def budget_system(name: str, budget: HotTimeBudget, compression: CompressionEstimator,
                  oversale: OversaleEstimator, family: str, account: AccountConfig | None = None,
                  source: str = "", load: LoadConfig | None = None,
                  remediation: RemediationConfig | None = None) -> System:
    """This project's whole system run at a hot-time budget: requests at the budget's
    percentile, node ratios from the budget, backed off by its own account."""
    kept = BudgetAccount(budget, account or AccountConfig())
    return System(name, source or f"this project at a cpu hot-time budget of {budget.cpu:.3%} (memory "
                  f"{budget.memory:.3%})", ours_requests(budget_sized(compression, budget, oversale)),
                  ours_ratio(oversale, kept), family, ours=True, load=load, remediation=remediation, account=kept)


def budget_sized(compression: CompressionEstimator, budget: HotTimeBudget,
                 oversale: OversaleEstimator) -> CompressionEstimator:
    """The compression estimator at the budget's percentile."""
    return dataclasses.replace(compression, percentile=compression_percentile(budget.cpu, oversale.budget_scale))


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


def koordinator_batch(cpu_threshold: float = 0.6, memory_threshold: float = 0.65) -> NodeRatio:
    """Koordinator's batch overcommit read as a node ratio: its slo-controller publishes
    ``Total - Reserved - System.Used - sum(Pod(Prod/Mid).Used)`` as ``kubernetes.io/batch-cpu`` /
    ``batch-memory`` beside the node's allocatable, with ``Reserved = Allocatable x (1 - T)``
    (``cpuReclaimThresholdPercent`` 60, ``memoryReclaimThresholdPercent`` 65, the default
    ``usage`` policy), so a node takes ``A + max(0, A x T - U)`` of requests: ratio ``1 + max(0,
    T - U/A)``, U the latest usage. The replay has one class of Pod, so the batch room is counted
    for every Pod, as this project's oversold allocatable is; without a reading there is none
    (the node's NodeMetric is missing and batch resources degrade to 0)."""
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        if len(values) == 0 or capacity <= 0:
            return 1.0
        threshold = cpu_threshold if resource == CPU else memory_threshold
        return 1.0 + max(0.0, threshold - float(values[-1]) / capacity)
    return ratio


CRANE_LOAD = LoadConfig(watermarks=Watermarks(cpu_average=Decimal("0.65"), cpu_peak=Decimal("0.75"),
                                             memory=Decimal("0.65")))
"""Crane's dynamic scheduler at its default policy (``predicate``: cpu_usage_avg_5m 0.65,
cpu_usage_max_avg_1h 0.75, mem_usage_avg_5m 0.65, mem_usage_max_avg_1h 0.75), placed by this
project's filter and scores at those watermarks: its memory is held to 65% of the latest sample
here, and its own score (usage windows up to a day, less a "hot value" for recent binds) is this
project's."""
KOORDINATOR_LOAD = LoadConfig(watermarks=Watermarks(cpu_average=Decimal("0.65"), cpu_peak=Decimal("Infinity"),
                                                   memory=Decimal("0.95")))
"""koord-scheduler's LoadAwareScheduling plugin at its defaults (``usageThresholds`` cpu 65, memory
95, over the node's latest NodeMetric, which koordlet averages over 5 minutes; no threshold on a
longer window; ``estimatedScalingFactors`` cpu 85, memory 70 of the request, as this project's
defaults), placed by this project's filter and scores with those watermarks."""


def static_ratio(value: float = 1.5) -> NodeRatio:
    def ratio(resource: str, capacity: float, requested: float, times: np.ndarray, values: np.ndarray,
              current: float) -> float:
        return value
    return ratio


# ---- the systems of a default run ---------------------------------------------------------------

OURS = "oversale"
"""The family of this project's whole system (its variants make its curve)."""


BUDGET_SWEEP = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)
"""The cpu hot-time budgets a backtest sweeps when none is given (0.01% to 5%)."""
GOAL_BUDGETS = (0.0005, 0.001, 0.002, 0.005, 0.01)
"""The budgets the hot-time goal judges (0.05% to 1%): tuned on, and reported against the peers."""
GOAL_BAND = (0.5, 1.5)
"""The goal's band: a budget is kept when the realised hot time is 0.5x to 1.5x of it."""


def band_distance(realised: float, budget: float) -> float:
    """How far a realised hot time strays from its budget, in widths of the goal's band: the log
    of the ratio over the log of the band's edge on that side (1.5 above, 0.5 below), so each edge
    scores 1 and anything within the band at most 1. A log ratio alone would weigh a budget
    over-spent tenfold as one under-spent tenfold, and score 1.9x (outside the band) better than
    0.5x (inside it); for a knob that bounds overload, spending more than asked is the worse miss.

    >>> band_distance(0.0015, 0.001), band_distance(0.0005, 0.001), band_distance(0.001, 0.001)
    (1.0, 1.0, 0.0)
    """
    low, high = GOAL_BAND
    ratio = max(realised, 1e-6) / budget
    return math.log(ratio) / math.log(high) if ratio >= 1 else math.log(ratio) / math.log(low)


def within_band(realised: float, budget: float) -> bool:
    """Whether a budget was kept: the realised hot time within the goal's band (0.5x..1.5x), edges
    included (:func:`band_distance` at most 1).

    >>> within_band(0.0015, 0.001), within_band(0.0016, 0.001), within_band(0.0, 0.001)
    (True, False, False)
    """
    return band_distance(realised, budget) <= 1


def percent_text(share: float) -> str:
    """A share as the docs write a budget: no trailing zeros (0.0005 -> "0.05%", 0.01 -> "1%")."""
    return f"{share * 100:g}%"


GOAL_RANGE_TEXT = f"{percent_text(GOAL_BUDGETS[0])} to {percent_text(GOAL_BUDGETS[-1])}"
"""The goal's budgets as a range in words ("0.05% to 1%")."""


def budget_name(cpu_budget: float) -> str:
    return f"{OURS} budget {cpu_budget:.2%}"


def default_systems(compression: CompressionEstimator, oversale: OversaleEstimator, budget: HotTimeBudget,
                    frontier: bool = False, load: LoadConfig | None = None,
                    remediation: RemediationConfig | None = None, sweep: bool = True,
                    account: AccountConfig | None = None) -> list[System]:
    """This project at ``budget`` (the whole system, each half alone, with load-aware placement,
    with remediation), its curve along the hot-time budget (``sweep``), and the peers with their
    published defaults; with ``frontier`` also the peers' variants along their main knob, so
    every peer is a curve too."""
    source = _ours_source(compression, oversale, budget)

    def whole(name: str, load: LoadConfig | None = None, remediation: RemediationConfig | None = None,
              placed: str = "") -> System:
        return budget_system(name, budget, compression, oversale, name, account, source + placed, load,
                             remediation)

    nodes_only = BudgetAccount(budget, account or AccountConfig())
    systems = [
        System("none", "no right-sizing, no overselling (baseline)", no_compression, family="none"),
        whole(OURS),
        System("oversale-pods", "this project's right-sizing alone (no node overselling)",
               ours_requests(budget_sized(compression, budget, oversale)), family="oversale-pods", ours=True),
        System("oversale-nodes", "this project's node overselling alone (requests as written)", no_compression,
               ours_ratio(oversale, nodes_only), "oversale-nodes", ours=True, account=nodes_only),
        *peer_systems(),
    ]
    load = load or LoadConfig()
    window = (f", the cpu maximum over the last {load.history_peak_seconds / 3600:g} h as read from Prometheus "
              "(OVERSALE_LOAD_HISTORY=prometheus)" if load.history_peak_seconds > 3600 else "")
    systems.append(whole(f"{OURS}+load-aware", load=load,
                         placed=f"; load-aware placement (scheduling watermarks {load.watermarks.cpu_average}/"
                                f"{load.watermarks.cpu_peak}{window})"))
    systems.append(whole(f"{OURS}+remediation", remediation=remediation or RemediationConfig()))
    if sweep:
        systems.extend(budget_system(budget_name(cpu), HotTimeBudget(cpu, budget.memory), compression, oversale, OURS,
                                     account) for cpu in BUDGET_SWEEP if cpu != budget.cpu)
    if frontier:
        systems.extend(peer_variants())
    return systems


def _ours_source(compression: CompressionEstimator, oversale: OversaleEstimator, budget: HotTimeBudget) -> str:
    """What this project's whole system does at ``budget``, in the report's words."""
    return (f"this project at a cpu hot-time budget of {budget.cpu:.3%} (memory {budget.memory:.3%}): "
            f"requests {percentile_name(compression_percentile(budget.cpu, oversale.budget_scale))} x "
            f"{1 + compression.margin} within "
            f"ratios {compression.min_ratio}..{compression.max_ratio}; node ratio {oversale.cpu_target} x "
            f"requested / {percentile_name(budget_quantile(budget.cpu, oversale.budget_scale))} of the node's "
            f"summed usage (cpu), {oversale.memory_target} x requested / "
            f"{percentile_name(budget_quantile(budget.memory, oversale.budget_scale))} (memory), "
            f"at most {oversale.cpu_max_ratio} / {oversale.memory_max_ratio}, backed off by the hot-time "
            "account")


def peer_systems() -> list[System]:
    """The peers a user would pick instead, each at its published defaults, and the static ratios."""
    return [
        System("vpa-style", "Kubernetes VPA recommender: P90 of a decaying histogram, 24 h half-life, x 1.15",
               vpa_style(), family="vpa-style"),
        System("crane-style", "Crane: P99 over 7 days x 1.15", crane_style(), family="crane-style"),
        System("crane-style+load-aware", "Crane-style requests placed by Crane's dynamic scheduler at its default "
               "policy (nodes above cpu 65% of real capacity over 5 minutes or 75% at the hour's peak, or memory "
               "65%, refused)", crane_style(), family="crane-style", load=CRANE_LOAD, estimate_from_usage=False),
        System("katalyst-realtime", "Katalyst: max(1, ((A*T - U)/max(min(U/R, 1), E) + R)/A), T=0.6, E=0.4",
               no_compression, katalyst_realtime(), "katalyst-realtime"),
        System("crane-style+katalyst", "Crane-style requests on nodes Katalyst oversells (T=0.6)", crane_style(),
               katalyst_realtime(), "crane-style+katalyst"),
        System("koordinator-batch", "Koordinator: batch room A x T - U beside allocatable, T=0.6 cpu / 0.65 "
               "memory (requests as written)", no_compression, koordinator_batch(), "koordinator-batch"),
        System("koordinator-batch+load-aware", "Koordinator's batch room as above, placed by koord-scheduler's "
               "LoadAwareScheduling at its defaults (usage thresholds cpu 65% / memory 95% of the node, Pods "
               "estimated at 85% / 70% of their requests)", no_compression, koordinator_batch(), "koordinator-batch",
               load=KOORDINATOR_LOAD, estimate_from_usage=False),
        System("static-2", "static compression ratio 2", static_compression(2), family="static"),
        System("static-oversale-1.5", "static oversale ratio 1.5", no_compression, static_ratio(1.5),
               "static-oversale"),
    ]


def peer_variants() -> list[System]:
    """The peers along their main knob (``--frontier``), so every peer is a curve, not a point."""
    systems: list[System] = []
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
    for threshold in (0.4, 0.8, 1.0):
        systems.append(System(f"koordinator-batch T={threshold:g}", "Koordinator, reclaim threshold varied",
                              no_compression, koordinator_batch(threshold, threshold), "koordinator-batch"))
    for ratio in (1.5, 3, 4):
        systems.append(System(f"static-{ratio:g}", "static compression ratio", static_compression(ratio),
                              family="static"))
    for value in (1.25, 2, 2.5):
        systems.append(System(f"static-oversale-{value:g}", "static oversale ratio", no_compression,
                              static_ratio(value), "static-oversale"))
    return systems
