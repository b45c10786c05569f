"""The hot-time budget: the one risk a team decides when it oversells, and how it is kept.

*Hot time* is the share of node-time an oversold node spends with real usage above its real
allocatable (per resource). The user sets a budget for it (default cpu 0.1%, about 1.4 minutes a
day; memory 0.01%); everything else follows:

- **Budget -> ratio.** A node packed up to its oversold allocatable ``r x C`` carries requests
  ``r x C``; if its Pods use what they used per requested unit over the window, its usage exceeds
  ``C`` exactly when the window's usage exceeded ``requested / r``. The largest ratio whose
  predicted exceedance is within the budget ``b`` is therefore ``requested / Q(1 - b)`` of the
  node's summed usage: :func:`budget_quantile` gives the quantile level (``1 - c x b``, where the
  calibration ``c``, ``OVERSALE_BUDGET_CALIBRATION``, says by how much a week's exceedance
  over-states the next day's on the tuning days), and the existing estimator
  (``oversale.estimator.oversale_proposal``) applies it with its caps and floor. A budget of 0
  means no overselling (ratio 1): no history rules out a peak it has not seen. The
  idea, judging a predictor by its violation rate against its savings, is the one of Bashir et
  al., "Take it to the limit: peak prediction-driven resource overcommitment in datacenters"
  (EuroSys 2021).
- **The account.** What was predicted is then checked against what happened: observed hot time
  over a short (1 day) and a long (7 days) window. A node or pool that overspends is backed off
  at once (:func:`adjust_multiplier` scales the ratio's target down in proportion to the
  overspend); one that underspends for long rises again slowly, with a dead band between
  ``rise_below x budget`` and the budget where nothing moves (hysteresis).
- **Calibration.** Each prediction of a node's peak is later compared with the peak that came:
  :func:`calibration` is the share of predictions exceeded, which on an honest estimator at
  quantile ``1 - c x b`` stays near ``c x b`` (one sample per prediction).

The compression reconciler takes its percentile from the same budget (:func:`compression_percentile`)
so a container's demand is exceeded no more often than a node may be: the two never pull
against each other. Everything here is arithmetic over plain numbers; the live reconcilers and
the replay call the same functions.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

from oversale.estimator import (
    OversaleEstimator,
    Proposal,
    UsageStats,
    oversale_proposal,
    safe_floor,
)
from oversale.quantity import CPU

DAY_SECONDS = 86400.0


@dataclass(frozen=True)
class HotTimeBudget:
    """Share of node-time (0..1) an oversold node may spend above its real capacity, per resource."""

    cpu: float = 0.001
    memory: float = 0.0001

    def of(self, resource: str) -> float:
        return self.cpu if resource == CPU else self.memory


@dataclass(frozen=True)
class AccountConfig:
    """How the account turns observed hot time into a change of the ratio's target."""

    short_window_seconds: float = DAY_SECONDS
    """A back-off happens at most once per this window (its effect shows in the next one)."""
    long_window_seconds: float = 7 * DAY_SECONDS
    """Overspending here backs the ratio off; underspending here lets it rise again."""
    short_overspend: float = 4.0
    """The short window alone backs off only above this many budgets: one unlucky day is noise,
    four budgets' worth of it is not (chosen on the tuning days: ``python -m simulator.tune``)."""
    rise_below: float = 0.5
    """Rise only when the long window's hot time is below this share of the budget."""
    min_rise_days: float = 3.0
    """...and it holds at least this many days of samples ("underspends for long")."""
    rise_per_day: float = 0.05
    """A rise adds at most this fraction of the multiplier per day."""
    min_multiplier: float = 0.5
    """The account takes at most half off a ratio's target. (A floor of 0.8 scored better on the
    tuning days, +1.7 points freed, but let the holdout run 2.4 times hotter: docs/backtest.md.)"""
    max_multiplier: float = 1.0
    """A rise gives back what a back-off took, never more. A quiet week cannot tell a pool under
    its budget from one between two bursts, and above 1 the account would set ratios past the
    calibrated estimator's. (At 1.2, the July tuning days replayed on 5 placements ran the 0.05%
    budget at up to 15x, after a quiet week had lifted the account past 1; ``python -m
    simulator.tune --placements 5`` scores 1 at 0.870 against 1.155, with the budgets in the
    goal's band 1.5x above weighing as 2x below: docs/backtest.md.)"""
    backoff_exponent: float = 0.5
    """An overspend by a factor k multiplies the target by k ** -exponent (never below
    ``min_multiplier``)."""


@dataclass(frozen=True)
class HotTime:
    """Observed hot time of one node (or pool) and resource over a window."""

    hot_samples: int
    samples: int

    @property
    def share(self) -> float:
        return self.hot_samples / self.samples if self.samples else 0.0

    def __add__(self, other: HotTime) -> HotTime:
        return HotTime(self.hot_samples + other.hot_samples, self.samples + other.samples)


NO_HOT_TIME = HotTime(0, 0)


@dataclass(frozen=True)
class Adjustment:
    multiplier: float
    reason: str
    backed_off: bool = False


BUDGET_RULE = "a hot-time budget is a share of node-time from 0 to 1 (0.001 is 0.1%; 0: no overselling)"


def parse_hot_time_budget(text: str) -> float:
    """A budget as a setting, a flag or an annotation gives it; ValueError(``BUDGET_RULE``) for
    anything else (``0.1%`` included: a percent sign would make 0.1% read as 10%).

    >>> parse_hot_time_budget("0.001")
    0.001
    """
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 <= value <= 1:  # NaN fails too
        raise ValueError(BUDGET_RULE)
    return value


def budget_quantile(budget: float, scale: float = 1.0) -> float:
    """The usage quantile whose exceedance the budget allows: ``1 - scale x budget`` (1: the
    peak). ``scale`` calibrates the estimator: a window's exceedance over-states (scale > 1) or
    under-states the exceedance that follows, and the replay's tuning days measure by how much."""
    if not 0 <= budget <= 1:  # NaN fails too
        raise ValueError(f"{budget!r}: {BUDGET_RULE}")
    return max(0.0, 1.0 - scale * budget)


def budget_proposal(resource: str, requested: int, real_allocatable: int, usage: UsageStats | None,
                    current: Decimal, estimator: OversaleEstimator, budget: float,
                    multiplier: float) -> Proposal:
    """The node ratio for one resource under a hot-time budget: the largest whose predicted
    exceedance is within it, i.e. ``target x multiplier x requested / Q(1 - budget)`` of the
    node's summed usage (``usage`` must summarise that quantile), with the estimator's caps,
    floor and stabilisation. A budget of 0 allows no overselling: ratio 1."""
    if budget <= 0:
        # Never below what already runs (the node webhook refuses such a cut), nor above the cap.
        cover = min(safe_floor(requested, real_allocatable, Decimal(0)), estimator.max_ratio(resource))
        return Proposal(cover, "hot-time budget 0: no overselling" + (f" beyond the running requests ({cover})"
                                                                       if cover > 1 else ""))
    quantile = budget_quantile(budget, estimator.budget_scale)
    target = (estimator.target(resource) * Decimal(repr(multiplier))).quantize(Decimal("0.001"), ROUND_FLOOR)
    if resource == CPU:
        shaped = dataclasses.replace(estimator, percentile=quantile, cpu_target=target)
    else:
        shaped = dataclasses.replace(estimator, memory_percentile=quantile, memory_target=target)
    proposal = oversale_proposal(resource, requested, real_allocatable, usage, current, shaped)
    return dataclasses.replace(proposal, reason=f"budget {budget:.3%}: {proposal.reason}"
                               + (f" (account: target x{multiplier:.2f})" if multiplier != 1 else ""))


def compression_percentile(budget: float, scale: float = 1.0, floor: float = 0.9) -> float:
    """A container's demand percentile under the same budget, never below ``floor``: the
    compression reconciler sizes requests so they are exceeded no more often than a node may be
    hot (a lower percentile would hand the node reconciler a risk it did not budget for)."""
    return max(floor, budget_quantile(budget, scale))


def hot_time(values: Iterable[float], capacity: float) -> HotTime:
    """Hot time: samples whose usage is above the real ``capacity``. Observed, over the samples
    that came; predicted, over a window's samples against the usage at which a full node
    reaches its real capacity."""
    hot = total = 0
    for value in values:
        total += 1
        hot += value > capacity
    return HotTime(hot, total)


def adjust_multiplier(current: float, short: HotTime, long: HotTime, budget: float,
                      since_change_seconds: float | None, since_backoff_seconds: float | None,
                      config: AccountConfig) -> Adjustment:
    """The ratio target's multiplier after one look at the account.

    Overspend backs off at once, by ``(spent / budget) ** -backoff_exponent``: the long window
    above the budget, or the last day alone above ``short_overspend`` budgets; unless a back-off
    happened within the short window already (its effect is not in the figures yet). A long
    window of at least ``min_rise_days`` below ``rise_below x budget`` rises by ``rise_per_day``,
    at most once per short window (``since_change_seconds``: since the last rise or back-off, None
    if never), so the account's annotation changes at most daily. In between, nothing moves
    (hysteresis)."""
    current = min(max(current, config.min_multiplier), config.max_multiplier)
    if budget <= 0:
        return Adjustment(current, "no budget: no overselling")
    # The more telling window: each against its own tolerance (the last day's is wider).
    window, spent, tolerance = max((("the last day", short, config.short_overspend), ("the long window", long, 1.0)),
                                   key=lambda seen: seen[1].share / seen[2])
    limit = budget * tolerance
    if spent.samples and spent.share > limit:
        overspend = spent.share / budget
        said = f"hot {spent.share:.3%} of {window}, {overspend:.1f}x the budget {budget:.3%}"
        if since_backoff_seconds is not None and since_backoff_seconds < config.short_window_seconds:
            return Adjustment(current, f"{said}; backed off {since_backoff_seconds / 3600:.1f} h ago: waiting")
        backed = max(config.min_multiplier, current * overspend ** -config.backoff_exponent)
        return Adjustment(backed, f"{said}: target x{backed / current:.2f}", backed_off=True)
    long_enough = short.samples > 0 and long.samples >= short.samples * config.min_rise_days * 0.9
    if long_enough and long.share < config.rise_below * budget and current < config.max_multiplier:
        if since_change_seconds is not None and since_change_seconds < config.short_window_seconds:
            wait = (config.short_window_seconds - since_change_seconds) / 3600
            return Adjustment(current, f"hot {long.share:.3%} of the long window, under {config.rise_below:g}x the "
                                       f"budget {budget:.3%}: rising in {wait:.1f} h, a day after the last change")
        risen = min(config.max_multiplier, current * (1 + config.rise_per_day))
        return Adjustment(risen, f"hot {long.share:.3%} of the long window, under {config.rise_below:g}x the "
                                 f"budget {budget:.3%}: rising slowly")
    return Adjustment(current, f"hot {long.share:.3%} of the long window, within the budget {budget:.3%}")


def calibration(predictions: Iterable[tuple[float, float]]) -> tuple[int, int]:
    """(exceeded, total) over (predicted peak, observed peak) pairs: a prediction is exceeded when
    the peak that came was higher."""
    exceeded = total = 0
    for predicted, observed in predictions:
        total += 1
        exceeded += observed > predicted
    return exceeded, total


@dataclass(frozen=True)
class NodeAccount:
    """One node's account for one resource, as the reconciler keeps it between passes."""

    multiplier: float = 1.0
    backed_off_at: float | None = None
    """Epoch seconds of the last back-off."""
    changed_at: float | None = None
    """Epoch seconds of the last back-off or rise."""


def keep_account(account: NodeAccount, short: HotTime, long: HotTime, budget: float, now: float,
                 config: AccountConfig) -> tuple[NodeAccount, Adjustment]:
    """One look at an account at ``now`` (seconds): ``adjust_multiplier``'s adjustment, and the
    account as kept after it (when it last backed off, when it last moved). The live reconciler
    and the replay (its ``now``: the day number x a day's seconds) keep their accounts with this."""
    since = None if account.backed_off_at is None else now - account.backed_off_at
    changed = None if account.changed_at is None else now - account.changed_at
    adjustment = adjust_multiplier(account.multiplier, short, long, budget, changed, since, config)
    moved = adjustment.multiplier != account.multiplier
    return NodeAccount(adjustment.multiplier, now if adjustment.backed_off else account.backed_off_at,
                       now if moved else account.changed_at), adjustment


def read_accounts(text: str | None) -> dict[str, NodeAccount]:
    """The node's ``hot-time-account`` annotation; anything unreadable starts afresh (at 1)."""
    return read_accounts_said(text)[0]


def read_accounts_said(text: str | None) -> tuple[dict[str, NodeAccount], str | None]:
    """:func:`read_accounts`, and what of the annotation could not be read (None: all of it).

    >>> read_accounts_said('{"cpu": {"multiplier": 0.5}, "memory": {"multiplier": "half"}}')
    ({'cpu': NodeAccount(multiplier=0.5, backed_off_at=None, changed_at=None)}, "memory: {'multiplier': 'half'}")
    """
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return {}, "not JSON"
    if not isinstance(data, dict):
        return {}, "not a JSON object"
    accounts, unread = {}, []
    for resource, entry in data.items():
        try:
            if not isinstance(entry, dict):
                raise TypeError(entry)
            multiplier = float(entry.get("multiplier", 1.0))
            at, changed = entry.get("backedOffAt"), entry.get("changedAt")
            accounts[str(resource)] = NodeAccount(multiplier if math.isfinite(multiplier) else 1.0,
                                                  float(at) if at is not None else None,
                                                  float(changed) if changed is not None else None)
        except (TypeError, ValueError):
            unread.append(f"{resource}: {entry!r}")
    return accounts, "; ".join(unread) or None


def pool_account(copies: Iterable[Mapping[str, NodeAccount]]) -> dict[str, NodeAccount]:
    """A pool's account from the copies its nodes carry: per resource, the most recently changed
    (a node that joined since the last change carries an older copy, or none)."""
    latest: dict[str, NodeAccount] = {}
    for copy in copies:
        for resource, account in copy.items():
            held = latest.get(resource)
            if held is None or (account.changed_at or 0.0) > (held.changed_at or 0.0):
                latest[resource] = account
    return latest


def write_accounts(accounts: dict[str, NodeAccount]) -> str:
    return json.dumps({r: {"multiplier": round(a.multiplier, 4),
                           **({"backedOffAt": round(a.backed_off_at)} if a.backed_off_at is not None else {}),
                           **({"changedAt": round(a.changed_at)} if a.changed_at is not None else {})}
                       for r, a in sorted(accounts.items())}, separators=(",", ":"), sort_keys=True)


def budget_of(annotations: Mapping[str, str], labels: Mapping[str, str], key: str,
              default: float) -> tuple[float, str | None]:
    """A node's budget: its annotation, else its label (set on a whole pool by the node group's
    labels), else the cluster-wide setting; and what was wrong with a value that could not be used
    (it falls back to the next source, never to an unbudgeted node), or None.

    >>> budget_of({}, {"b": "0.005"}, "b", 0.001)
    (0.005, None)
    >>> budget_of({"b": "0.5%"}, {}, "b", 0.001)[1].startswith("annotation b='0.5%' ignored: " + BUDGET_RULE[:20])
    True

    Neither usable: the cluster-wide setting, and what was wrong with each, in one line:
    >>> budget_of({"b": "lots"}, {"b": "2"}, "b", 0.001)
    (0.001, "annotation b='lots' ignored: ... no overselling); label b='2' ignored: ... no overselling)")
    """
    problems: list[str] = []
    for kind, source in (("annotation", annotations), ("label", labels)):
        text = source.get(key)
        if text is None:
            continue
        try:
            return parse_hot_time_budget(text), "; ".join(problems) or None
        except ValueError as error:
            problems.append(f"{kind} {key}={text!r} ignored: {error}")
    return default, "; ".join(problems) or None


def pool_of(labels: Mapping[str, str], pool_labels: Sequence[str]) -> str:
    return next((labels[label] for label in pool_labels if labels.get(label)), "default")


def describe_hot_time(spent: dict[str, HotTime], budgets: dict[str, float]) -> str:
    """The node annotation a person reads: ``cpu 0.05% (budget 0.10%), memory ...``. To 0.01%
    and without sample counts, so it changes only when hot samples enter or leave the window
    (the reconciler writes it only when it changes: one write per node per pass would not do)."""
    return ", ".join(f"{r} {spent[r].share:.2%} (budget {budgets[r]:.2%})" for r in sorted(spent) if r in budgets)
