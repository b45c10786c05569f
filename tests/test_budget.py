"""The hot-time budget: budget -> ratio, the account, calibration (pure functions)."""

from __future__ import annotations

import dataclasses
import math
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oversale.budget import (
    BUDGET_RULE,
    AccountConfig,
    Adjustment,
    HotTime,
    HotTimeBudget,
    NodeAccount,
    adjust_multiplier,
    budget_of,
    budget_proposal,
    budget_quantile,
    calibration,
    compression_percentile,
    describe_hot_time,
    hot_time,
    keep_account,
    pool_account,
    pool_of,
    read_accounts,
    read_accounts_said,
    write_accounts,
)
from oversale.estimator import OversaleEstimator, StabilityConfig, UsageStats, summarize
from oversale.settings import Settings

STEADY = OversaleEstimator(stability=StabilityConfig(Decimal(0), Decimal(1000)))
REAL = 32_000  # millicores
WEEK = [(i * 300.0, v) for i, v in enumerate(
    8_000 + 4_000 * math.sin(i / 20) + random.Random(7).random() * 3_000 for i in range(2016))]


def week_at(budget: float) -> UsageStats:
    """WEEK summarised at the quantile ``budget`` allows, as the reconciler reads it."""
    return summarize(WEEK, budget_quantile(budget), now=WEEK[-1][0] + 300)


def ratio_at(budget: float, requested: int = 30_000, multiplier: float = 1.0,
             estimator: OversaleEstimator = STEADY) -> Decimal:
    return budget_proposal("cpu", requested, REAL, week_at(budget), Decimal(1), estimator, budget, multiplier).ratio


def test_the_ratio_grows_with_the_budget_and_a_zero_budget_oversells_nothing():
    budgets = [0, 0.0001, 0.001, 0.01, 0.05, 0.2]
    ratios = [ratio_at(b) for b in budgets]
    assert ratios[0] == 1
    assert ratios == sorted(ratios) and ratios[-1] > ratios[1] > 1


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.integers(1_000, 200_000), st.floats(0.5, 2.0))
def test_monotone_and_never_above_the_caps(low, high, requested, multiplier):
    low, high = sorted((low, high))
    assert ratio_at(low, requested, multiplier) <= ratio_at(high, requested, multiplier)
    assert ratio_at(high, requested, multiplier) <= max(STEADY.cpu_max_ratio, Decimal(requested) / REAL + 1)


def test_a_zero_budget_still_covers_what_already_runs():
    stats = week_at(0)
    covering = budget_proposal("cpu", 40_000, REAL, stats, Decimal(1), STEADY, 0.0, 1.0)
    assert covering.ratio == Decimal("1.25")
    assert covering.reason == "hot-time budget 0: no overselling beyond the running requests (1.25)"
    fitting = budget_proposal("cpu", 30_000, REAL, stats, Decimal(1), STEADY, 0.0, 1.0)
    assert (fitting.ratio, fitting.reason) == (1, "hot-time budget 0: no overselling")


def test_memory_is_budgeted_by_the_same_rule_at_its_own_target():
    """Memory's target (0.6 by default) leaves room that cpu's (1) does not: a node out of memory
    kills, one out of cpu only slows down."""
    stats = week_at(0.001)
    uncapped = dataclasses.replace(STEADY, memory_max_ratio=STEADY.cpu_max_ratio)  # memory's cap is 1.2
    memory = budget_proposal("memory", 30_000, REAL, stats, Decimal(1), uncapped, 0.001, 1.0)
    cpu = budget_proposal("cpu", 30_000, REAL, stats, Decimal(1), uncapped, 0.001, 1.0)
    assert 1 < memory.ratio < cpu.ratio and "P99.9 usage" in memory.reason and "target 0.600" in memory.reason
    assert float(memory.ratio / cpu.ratio) == pytest.approx(float(STEADY.memory_target), rel=0.01)


def test_the_reason_names_the_budget_and_the_accounts_multiplier():
    stats = week_at(0.001)
    plain = budget_proposal("cpu", 30_000, REAL, stats, Decimal(1), STEADY, 0.001, 1.0).reason
    backed = budget_proposal("cpu", 30_000, REAL, stats, Decimal(1), STEADY, 0.001, 0.75).reason
    assert plain.startswith("budget 0.100%: ") and "account" not in plain
    # The account's multiplier scales the target, and is named after the estimator's words.
    assert plain.endswith(", target 1.000")
    assert backed == plain.replace(", target 1.000", ", target 0.750 (account: target x0.75)")


def test_the_chosen_ratio_keeps_the_predicted_exceedance_within_the_budget():
    values = [v for _, v in WEEK]
    for budget in (0.001, 0.01, 0.05):
        ratio = float(ratio_at(budget))
        # A node full at this ratio carries ratio x REAL of requests; usage per request as in the window.
        threshold = 30_000 / ratio  # the window's usage at which the full node reaches REAL
        assert hot_time(values, threshold + 1e-6).share <= budget + 1 / len(values)


def test_budget_zero_and_quantiles():
    assert budget_quantile(0) == 1 and budget_quantile(0.001) == pytest.approx(0.999)
    assert compression_percentile(0.001) == pytest.approx(0.999) and compression_percentile(0.5) == 0.9
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="share of node-time from 0 to 1"):
            budget_quantile(bad)


def test_the_account_counts_known_hot_time():
    # One day of 5-minute samples, 3 of them above a 32-core node's real capacity.
    usage = [20_000.0] * 285 + [33_000.0, 40_000.0, 32_001.0]
    spent = hot_time(usage, REAL)
    assert spent == HotTime(3, 288) and spent.share == pytest.approx(3 / 288)
    assert hot_time([32_000.0], REAL).hot_samples == 0  # at capacity is not above it


CONFIG = AccountConfig()


def test_overspend_backs_off_at_once_in_proportion_and_says_by_how_much():
    day = HotTime(4, 1000)  # 0.4%, four times a 0.1% budget
    wide = AccountConfig(min_multiplier=0.1)
    adjustment = adjust_multiplier(1.0, day, day, 0.001, None, None, wide)
    assert adjustment.backed_off and adjustment.multiplier == pytest.approx(4 ** -wide.backoff_exponent)
    assert "4.0x the budget" in adjustment.reason
    # Within the short window after a back-off the account waits for its effect.
    again = adjust_multiplier(adjustment.multiplier, day, day, 0.001, 3600, 5400, wide)
    assert not again.backed_off and again.multiplier == adjustment.multiplier
    assert again.reason.endswith("4.0x the budget 0.100%; backed off 1.5 h ago: waiting")
    # Never below the floor, however large the overspend.
    assert adjust_multiplier(1.0, HotTime(900, 1000), HotTime(900, 1000), 0.001, None, None, CONFIG).multiplier \
        == CONFIG.min_multiplier


def test_underspending_rises_slowly_and_the_dead_band_holds():
    quiet = HotTime(0, 2016)
    multiplier, days = CONFIG.min_multiplier, 0
    while multiplier < 1.0 and days < 365:
        multiplier = adjust_multiplier(multiplier, HotTime(0, 288), quiet, 0.001, 86400, None, CONFIG).multiplier
        days += 1
    assert multiplier >= 1.0, "a day after the last change, a quiet week rises"
    assert days >= 3, "a rise is slow: at most rise_per_day a day"
    # Within a day of the last change it waits (the account's annotation changes at most daily).
    waiting = adjust_multiplier(0.8, HotTime(0, 288), quiet, 0.001, 3600, None, CONFIG)
    assert waiting.multiplier == 0.8 and waiting.reason.endswith("rising in 23.0 h, a day after the last change")
    # Between rise_below x budget and the budget nothing moves (hysteresis).
    band = HotTime(15, 20_000)  # 0.075% against 0.1%
    held = adjust_multiplier(0.8, HotTime(0, 288), band, 0.001, 86400, None, CONFIG)
    assert held.multiplier == 0.8 and not held.backed_off
    # A rise needs a long window of at least min_rise_days: two days of history are not "long".
    assert adjust_multiplier(0.8, HotTime(0, 288), HotTime(0, 576), 0.001, 86400, None, CONFIG).multiplier == 0.8


def test_a_rise_gives_back_what_a_back_off_took_and_never_more():
    """A quiet week cannot tell a pool under its budget from one between two bursts, so months
    without a hot sample leave the target where the estimator put it (1), not past it; an account
    written above 1 by an earlier version is read back at 1."""
    quiet, multiplier = HotTime(0, 2016), CONFIG.min_multiplier
    for _ in range(60):
        multiplier = adjust_multiplier(multiplier, HotTime(0, 288), quiet, 0.001, 86400, None, CONFIG).multiplier
    assert multiplier == 1.0
    assert adjust_multiplier(1.2, HotTime(0, 288), quiet, 0.001, 86400, None, CONFIG).multiplier == 1.0


def test_one_unlucky_day_is_noise_a_week_over_budget_is_not():
    week_fine = HotTime(10, 2016)  # 0.5 budgets over the week
    assert not adjust_multiplier(1.0, HotTime(10, 288), week_fine, 0.01, None, None, CONFIG).backed_off  # 3.5 budgets
    assert adjust_multiplier(1.0, HotTime(14, 288), week_fine, 0.01, None, None, CONFIG).backed_off  # 4.9 budgets
    week_over = HotTime(30, 2016)  # 1.5 budgets over the week, a quiet last day
    over = adjust_multiplier(1.0, HotTime(0, 288), week_over, 0.01, None, None, CONFIG)
    assert over.backed_off and "of the long window, 1.5x the budget" in over.reason


def test_the_budget_is_a_limit_spending_it_exactly_is_within_it():
    """"Within the budget" is what the knob promises: a pool hot for exactly its budget keeps its
    ratio; one sample more backs off. Rising needs the long window *below* half the budget."""
    day = HotTime(0, 288)
    exactly = adjust_multiplier(0.8, day, HotTime(2, 2000), 0.001, None, None, CONFIG)
    assert exactly.multiplier == 0.8 and not exactly.backed_off and "within the budget 0.100%" in exactly.reason
    assert adjust_multiplier(0.8, day, HotTime(3, 2000), 0.001, None, None, CONFIG).backed_off
    half = adjust_multiplier(0.8, day, HotTime(1, 2000), 0.001, 86400, None, CONFIG)  # 0.05%: half the budget
    assert half.multiplier == 0.8 and "within the budget" in half.reason
    assert adjust_multiplier(0.8, day, HotTime(1, 2001), 0.001, 86400, None, CONFIG).multiplier > 0.8


def test_a_zero_budget_keeps_the_account_still_whatever_the_hot_time():
    """Budget 0 oversells nothing (the ratio is 1 whatever the multiplier), so hot time there is
    no overspend to back off from, and no division by the budget."""
    hot = HotTime(50, 288)
    adjustment = adjust_multiplier(0.8, hot, hot, 0.0, None, None, CONFIG)
    assert adjustment == adjust_multiplier(0.8, HotTime(0, 288), HotTime(0, 2016), 0.0, 86400, None, CONFIG)
    assert adjustment.multiplier == 0.8 and not adjustment.backed_off
    assert adjustment.reason == "no budget: no overselling"


def test_a_rise_needs_the_last_day_and_a_long_enough_window_as_counted():
    quiet_week = HotTime(0, 2016)
    # No sample in the last day (metrics-server gone, the node drained): old quiet figures say
    # nothing of today, so the ratio does not rise on them.
    assert adjust_multiplier(0.8, HotTime(0, 0), quiet_week, 0.001, 86400, None, CONFIG).multiplier == 0.8
    # A node never seen (no samples at all) has spent nothing, and says so.
    unseen = adjust_multiplier(0.8, HotTime(0, 0), HotTime(0, 0), 0.001, None, None, CONFIG)
    assert unseen == Adjustment(0.8, "hot 0.000% of the long window, within the budget 0.100%")
    # min_rise_days of samples with a tenth missing (a scrape or two lost an hour) still count.
    assert CONFIG.min_rise_days == 3.0
    assert adjust_multiplier(0.8, HotTime(0, 100), HotTime(0, 270), 0.001, 86400, None, CONFIG).multiplier > 0.8
    assert adjust_multiplier(0.8, HotTime(0, 100), HotTime(0, 269), 0.001, 86400, None, CONFIG).multiplier == 0.8
    # One sample is enough for the last day to have been seen.
    assert adjust_multiplier(0.8, HotTime(0, 1), HotTime(0, 3), 0.001, 86400, None, CONFIG).multiplier > 0.8
    # At the top, a quiet week says it is within the budget: there is nothing left to rise to.
    top = adjust_multiplier(CONFIG.max_multiplier, HotTime(0, 288), quiet_week, 0.001, 3600, None, CONFIG)
    assert top.multiplier == CONFIG.max_multiplier and "within the budget" in top.reason


def test_the_account_remembers_when_it_backed_off_and_when_it_moved():
    """keep_account, which the reconciler and the replay both call: a back-off is recorded, a
    second look within the short window waits for its effect and records nothing, a look a day
    later backs off again from where it stands, and a rise moves the change time alone."""
    over, wide, start = HotTime(4, 1000), AccountConfig(min_multiplier=0.1), 1_700_000_000.0
    account, first = keep_account(NodeAccount(), over, over, 0.001, start, wide)
    assert first.backed_off and account == NodeAccount(first.multiplier, start, start)
    assert first.reason.endswith("target x0.50")
    waited, waiting = keep_account(account, over, over, 0.001, start + 3600, wide)
    assert waited == account and not waiting.backed_off
    assert waiting.reason.endswith("backed off 1.0 h ago: waiting")
    # Exactly one short window on, the effect of the back-off is in the figures: it may act again.
    again, second = keep_account(account, over, over, 0.001, start + wide.short_window_seconds, wide)
    assert second.backed_off and again.multiplier == pytest.approx(0.25) and second.reason.endswith("target x0.50")
    assert again.backed_off_at == again.changed_at == start + wide.short_window_seconds
    quiet_day, quiet_week, later = HotTime(0, 288), HotTime(0, 2016), start + 2 * wide.short_window_seconds
    risen, rise = keep_account(again, quiet_day, quiet_week, 0.001, later, wide)
    assert rise.reason.endswith("rising slowly")
    assert risen == NodeAccount(pytest.approx(0.25 * (1 + wide.rise_per_day)), again.backed_off_at, later)
    held, holding = keep_account(risen, quiet_day, quiet_week, 0.001, later + 3600, wide)
    assert held == risen and "rising in 23.0 h, a day after the last change" in holding.reason


def test_calibration_counts_known_exceedances():
    rng = random.Random(3)
    values = [rng.random() for _ in range(100_000)]
    predicted = 0.99  # the 99th percentile of uniform noise: exceeded 1% of the time
    exceeded, total = calibration((predicted, v) for v in values)
    assert total == 100_000 and exceeded / total == pytest.approx(0.01, abs=0.002)
    assert calibration([(5.0, 6.0), (5.0, 5.0), (5.0, 4.0)]) == (1, 3)


def test_the_hot_time_a_person_reads_on_the_node():
    spent = {"cpu": HotTime(1, 2016), "memory": HotTime(0, 2016), "ephemeral-storage": HotTime(5, 10)}
    assert describe_hot_time(spent, {"cpu": 0.001, "memory": 0.0001}) == \
        "cpu 0.05% (budget 0.10%), memory 0.00% (budget 0.01%)"


def test_accounts_round_trip_and_bad_text_starts_afresh():
    accounts = {"cpu": NodeAccount(0.7071, 1_700_000_000.0, 1_700_000_000.0), "memory": NodeAccount()}
    assert read_accounts(write_accounts(accounts)) == accounts
    # The annotation is written only when its text changes, so the text is canonical: sorted keys,
    # whole seconds, the multiplier to 4 places.
    assert write_accounts({"cpu": NodeAccount(0.707106, 1_700_000_000.4, 1_700_000_100.6)}) == \
        '{"cpu":{"backedOffAt":1700000000,"changedAt":1700000101,"multiplier":0.7071}}'
    assert read_accounts("not json") == {} and read_accounts('{"cpu": {"multiplier": "x"}}') == {}
    assert read_accounts_said("not json") == ({}, "not JSON")
    assert read_accounts_said("[1]") == ({}, "not a JSON object")
    assert read_accounts_said('{"cpu": 3, "memory": {"multiplier": 0.5}}') == ({"memory": NodeAccount(0.5)}, "cpu: 3")
    assert read_accounts_said(write_accounts(accounts)) == (accounts, None)
    # A copy without a multiplier, or with one no arithmetic can use, starts from the estimator's own.
    assert read_accounts('{"cpu": {"changedAt": 5}}') == {"cpu": NodeAccount(1.0, None, 5.0)}
    assert read_accounts('{"cpu": {"multiplier": NaN}, "memory": {"multiplier": -Infinity}}') == \
        {"cpu": NodeAccount(), "memory": NodeAccount()}


def test_budget_and_pool_of_a_node():
    key = "stke.platform/cpu-hot-time-budget"
    assert budget_of({key: "0.01"}, {key: "0.02"}, key, 0.001) == (0.01, None)
    assert budget_of({}, {key: "0.02"}, key, 0.001) == (0.02, None)
    # Both ends are budgets: 0 oversells nothing, 1 lets the node run hot all the time.
    assert budget_of({key: "0"}, {}, key, 0.001) == (0.0, None) and budget_of({key: "1"}, {}, key, 0.001) == (1.0, None)
    assert budget_of({key: "lots"}, {}, key, 0.001) == (
        0.001, f"annotation {key}='lots' ignored: a hot-time budget is a share of node-time from 0 to 1 (0.001 is "
               "0.1%; 0: no overselling)")
    # A bad annotation falls back to the pool's label, not past it, and says so.
    value, problem = budget_of({key: "2"}, {key: "0.02"}, key, 0.001)
    assert value == 0.02 and problem is not None and problem.startswith(f"annotation {key}='2' ignored")
    value, problem = budget_of({key: "5%"}, {key: "nan"}, key, 0.001)
    assert value == 0.001 and problem is not None and "'5%'" in problem and f"label {key}='nan'" in problem
    assert pool_of({"cloud.google.com/gke-nodepool": "batch"}, ("cloud.google.com/gke-nodepool",)) == "batch"
    assert pool_of({}, ("cloud.google.com/gke-nodepool",)) == "default"


def test_a_pools_account_is_the_copy_its_nodes_changed_last():
    old, new = NodeAccount(0.8, 100.0, 100.0), NodeAccount(0.5, 200.0, 200.0)
    # A node that joined after the last change carries no copy, or an older one.
    assert pool_account([{"cpu": old}, {}, {"cpu": new, "memory": NodeAccount()}, {"cpu": old}]) == \
        {"cpu": new, "memory": NodeAccount()}
    assert pool_account([{"cpu": new}, {"cpu": old}])["cpu"] == new
    assert pool_account([]) == {}


def test_the_cores_defaults_are_the_settings_and_the_windows_the_metrics_name():
    """The replay builds ``HotTimeBudget()`` and ``AccountConfig()`` where the live reconciler reads
    Settings: both must run the product's defaults (cpu 0.1%, memory 0.01%). The account's windows
    are the ones its gauges and the node annotation are labelled with, 1d and 7d."""
    assert HotTimeBudget() == Settings.from_env({}).budget
    assert HotTimeBudget(0.002, 0.0003).of("cpu") == 0.002 and HotTimeBudget(0.002, 0.0003).of("memory") == 0.0003
    assert (CONFIG.short_window_seconds, CONFIG.long_window_seconds) == (86400, 7 * 86400)


def test_hot_time_adds_up_over_nodes_and_windows():
    """A pool's hot time is the sum of its nodes': hot samples over samples, not a mean of shares."""
    pooled = HotTime(1, 288) + HotTime(3, 2016)
    assert pooled == HotTime(4, 2304) and pooled.share == pytest.approx(4 / 2304)


def test_a_budget_that_is_no_number_names_itself():
    with pytest.raises(ValueError) as raised:
        budget_quantile(float("nan"))
    assert str(raised.value) == f"nan: {BUDGET_RULE}"


def test_the_accounts_multiplier_scales_the_ratios_target_and_the_budget_sets_cpus_quantile():
    """The account backs a node off by scaling the target the ratio is computed for: half the
    target, half the oversold ratio (here nowhere near a cap or the floor). The cpu ratio reads
    the budget's quantile of the node's usage, and says so."""
    full, halved = ratio_at(0.01), ratio_at(0.01, multiplier=0.5)
    assert 2 < full < STEADY.cpu_max_ratio
    assert float(halved) == pytest.approx(float(full) / 2, abs=0.01)  # each floored to 0.01
    assert "P99 usage" in budget_proposal("cpu", 30_000, REAL, week_at(0.01), Decimal(1), STEADY, 0.01, 1.0).reason


def test_the_account_says_which_window_it_acted_on_and_when_it_will_act_again():
    """The reasons land in Events and logs word for word, so they are checked whole; the hours to
    one decimal (83,350 s is 23.15 h: 23.2)."""
    day, week, quiet_day, quiet_week = HotTime(6, 1000), HotTime(6, 7000), HotTime(0, 288), HotTime(0, 2016)
    # The last day 6x over, the week under: the last day alone, being over 4 budgets, backs off
    # (to the floor: 6 ** -0.5 is below it).
    assert adjust_multiplier(1.0, day, week, 0.001, None, None, CONFIG) == Adjustment(
        0.5, "hot 0.600% of the last day, 6.0x the budget 0.100%: target x0.50", backed_off=True)
    assert adjust_multiplier(1.0, day, week, 0.001, None, 83_350, CONFIG).reason == \
        "hot 0.600% of the last day, 6.0x the budget 0.100%; backed off 23.2 h ago: waiting"
    assert adjust_multiplier(0.8, quiet_day, quiet_week, 0.001, 86_400 - 83_350, None, CONFIG).reason == \
        "hot 0.000% of the long window, under 0.5x the budget 0.100%: rising in 23.2 h, a day after the last change"
    # An account that never moved (a node's first quiet week) rises without waiting for a change.
    assert adjust_multiplier(0.8, quiet_day, quiet_week, 0.001, None, None, CONFIG) == Adjustment(
        pytest.approx(0.84), "hot 0.000% of the long window, under 0.5x the budget 0.100%: rising slowly")


def test_every_problem_is_said_and_a_clean_read_says_none():
    assert read_accounts_said('{"cpu": 3, "memory": "x"}') == ({}, "cpu: 3; memory: 'x'")
    assert read_accounts_said(None) == read_accounts_said("") == ({}, None)  # a node never accounted
    key = "stke.platform/cpu-hot-time-budget"
    assert budget_of({}, {}, key, 0.001) == (0.001, None)
    assert budget_of({key: "2"}, {key: "-1"}, key, 0.001)[1] == (
        f"annotation {key}='2' ignored: {BUDGET_RULE}; label {key}='-1' ignored: {BUDGET_RULE}")


def test_a_pools_account_keeps_the_first_of_equally_recent_copies_and_never_an_unchanged_one():
    """Nodes that carry the same change carry equal copies; the first is kept (the pool's figure
    does not hop between them from pass to pass). A copy never changed (a node that joined with
    the account at 1) does not replace one that moved."""
    moved, same_time = NodeAccount(0.5, 200.0, 200.0), NodeAccount(0.6, 150.0, 200.0)
    assert pool_account([{"cpu": moved}, {"cpu": same_time}])["cpu"] == moved
    assert pool_account([{"cpu": NodeAccount(0.9)}, {"cpu": NodeAccount()}])["cpu"] == NodeAccount(0.9)
    assert pool_account([{"cpu": moved}, {"cpu": NodeAccount()}])["cpu"] == moved
    assert pool_account([{"cpu": NodeAccount()}, {"cpu": moved}])["cpu"] == moved
