"""The ratio policies the reconcilers run, as pure functions."""

from __future__ import annotations

import copy
import dataclasses
import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversale.annotations import AnnotationKeys
from oversale.estimator import (
    CompressionEstimator,
    OversaleEstimator,
    Proposal,
    StabilityConfig,
    UsageStats,
    compression_proposal,
    merge_pods,
    oversale_proposal,
    quantile,
    safe_floor,
    stabilize,
    summarize,
)
from oversale.settings import Settings
from oversale.workloads import (
    describe_change,
    plan_compression,
    template_requests,
    usage_by_container,
    utilization_target,
)

DAY = 86400.0
WEEK = 7 * DAY


# The worked examples below are written for these settings (the arithmetic is what they check);
# the defaults' own figures come from the backtest.
P95 = CompressionEstimator(percentile=0.95, margin=Decimal("0.15"), max_ratio=Decimal(4))
TARGET_07 = OversaleEstimator(percentile=0.99, cpu_target=Decimal("0.7"), cpu_max_ratio=Decimal(3))


def stats(q, peak=None, samples=2016, covered=WEEK, age=60.0):
    return UsageStats(q, peak if peak is not None else q, samples, covered, age)


def test_the_estimators_defaults_are_the_products_but_for_the_quantiles_the_budget_sets():
    """Tests and tools that build ``CompressionEstimator()`` or ``OversaleEstimator()`` run the
    knobs the product ships, but for what Settings derives from the hot-time budget (the
    quantiles, and the budget's calibration): those default to the peak, uncalibrated."""
    settings = Settings.from_env({})
    assert CompressionEstimator() == dataclasses.replace(settings.compression_estimator(), percentile=1.0)
    assert OversaleEstimator() == dataclasses.replace(settings.oversale_estimator(), percentile=1.0,
                                                      memory_percentile=1.0, budget_scale=1.0)


def test_quantile_interpolates_like_promql():
    values = list(range(1, 101))
    assert quantile(values, 0.95) == pytest.approx(95.05)
    assert quantile([5, 1, 3], 0.5) == 3
    assert quantile([], 0.9) is None
    # Between the two highest samples too: where the high quantiles of a node's week fall.
    assert quantile(values, 0.995) == pytest.approx(99.505) and quantile([1, 2, 3, 4], 0.9) == pytest.approx(3.7)
    assert quantile(values, 1.0) == 100


def test_summarize_and_merge_over_pods():
    one = summarize([(1000, 100), (1600, 300), (1300, 200)], 0.5, now=1660)
    assert (one.quantile, one.peak, one.samples, one.covered_seconds, one.age_seconds) == (200, 300, 3, 600, 60)
    other = summarize([(0, 500)], 0.5, now=1000)
    merged = merge_pods([one, other])
    assert (merged.quantile, merged.peak, merged.samples, merged.age_seconds) == (500, 500, 4, 60)
    # No samples (a Pod metrics-server never saw): no figures, and nothing to merge.
    empty = UsageStats(None, None, 0, 0.0, None)
    assert summarize([], 0.5, now=1000) == empty and merge_pods([]) == empty and merge_pods([empty, empty]) == empty
    assert merge_pods([empty, one]) == one


def test_compression_ratio_is_request_over_p95_with_margin():
    proposal = compression_proposal("cpu", {"app": 1000}, {"app": stats(200)}, P95)
    # 1000 / (200 x 1.15) = 4.347.. -> clamped to the maximum 4
    assert proposal.ratio == 4
    proposal = compression_proposal("cpu", {"app": 1000}, {"app": stats(400)}, P95)
    assert proposal.ratio == Decimal("2.17")  # 1000 / 460, rounded down
    assert "demand 460m" in proposal.reason


def test_the_most_conservative_container_decides():
    proposal = compression_proposal("cpu", {"app": 1000, "sidecar": 100},
                                    {"app": stats(200), "sidecar": stats(80)}, P95)
    assert proposal.ratio == Decimal("1.08")  # 100 / 92, not 1000 / 230
    assert "container sidecar" in proposal.reason
    # Whichever container comes first by name.
    first = compression_proposal("cpu", {"app": 100, "worker": 1000}, {"app": stats(80), "worker": stats(200)}, P95)
    assert first.ratio == Decimal("1.08") and first.reason.startswith("container app: request 100m, demand 92m")


def test_memory_demand_is_never_below_the_peak():
    proposal = compression_proposal("memory", {"app": 2048}, {"app": stats(500, peak=1024)}, P95)
    assert proposal.ratio == 2  # 2048 / max(575, 1024)


def test_a_memory_demand_is_told_rounded_up_to_the_mi_not_in_bytes():
    mi = 2**20
    proposal = compression_proposal("memory", {"app": 1024 * mi}, {"app": stats(300 * mi + 1)}, P95)
    assert proposal.reason == "container app: request 1Gi, demand 346Mi (P95 x 1.15, at least the peak)"
    assert proposal.demand == pytest.approx(345 * mi + 1.15), "only the telling is rounded"
    node = oversale_proposal("memory", 40 * 2**30, 64 * 2**30, stats(21 * 2**30 - 1), Decimal(1), TARGET_07)
    assert node.reason == "P100 usage 21Gi of 40Gi requested, target 0.6", "21Gi less a byte"


def test_no_ratio_above_one_without_enough_history():
    thin = stats(100, samples=50, covered=6 * 3600)
    proposal = compression_proposal("cpu", {"app": 1000}, {"app": thin}, P95)
    assert proposal.ratio == 1 and proposal.reason == "not enough history for container app (6.0 h, 50 samples)"
    assert compression_proposal("cpu", {"app": 1000}, {}, P95).ratio == 1
    # Each minimum alone holds the ratio at 1; at both minima a ratio is proposed.
    day, enough = P95.min_coverage_seconds, P95.min_samples
    for covered, samples, held in ((day - 1, enough, True), (day, enough - 1, True), (day, enough, False)):
        history = {"app": stats(100, samples=samples, covered=covered)}
        assert (compression_proposal("cpu", {"app": 1000}, history, P95).ratio == 1) == held, (covered, samples)
    assert compression_proposal("cpu", {}, {}, P95) == Proposal(Decimal(1), "no cpu requests")


def test_a_container_without_usage_or_with_too_little_is_named_and_its_history_told():
    nothing = UsageStats(None, None, 0, 0.0, None)
    for usage in ({}, {"app": nothing}):
        assert compression_proposal("cpu", {"app": 1000}, usage, P95) == Proposal(
            Decimal(1), "no usage history for container app")
    # 72,184 s is 20.05 h: told to the tenth of an hour.
    thin = stats(100, samples=150, covered=72184)
    assert compression_proposal("cpu", {"app": 1000}, {"app": thin}, P95).reason == \
        "not enough history for container app (20.1 h, 150 samples)"


def test_equally_tight_containers_are_told_by_the_first_name_and_a_memory_peak_unknown_is_not_a_floor():
    twins = compression_proposal("cpu", {"app": 1000, "worker": 1000}, {"app": stats(400), "worker": stats(400)}, P95)
    assert twins.reason.startswith("container app: request 1, demand 460m")
    # No peak read (a source with quantiles only): the demand is the quantile with its margin.
    unpeaked = UsageStats(500.0, None, 2016, WEEK, 60.0)
    proposal = compression_proposal("memory", {"app": 2048}, {"app": unpeaked}, P95)
    assert proposal.ratio == Decimal("3.56") and proposal.demand == pytest.approx(575)  # 2048 / 575


def test_thin_history_pulls_the_ratio_toward_one():
    two_days = stats(250, samples=576, covered=2 * DAY)
    proposal = compression_proposal("cpu", {"app": 1000}, {"app": two_days}, P95)
    # full ratio 1000 / 287.5 = 3.478; confidence 2/7 -> 1 + 2.478 x 2/7 = 1.708
    assert proposal.ratio == Decimal("1.70")
    assert proposal.reason == "container app: request 1, demand 288m (P95 x 1.15); 29% confidence (2.0 days of history)"
    # Told to the tenth of a day: 177,121 s is just over 2.05 days.
    just_over = compression_proposal("cpu", {"app": 1000}, {"app": stats(250, samples=576, covered=177121)}, P95)
    assert just_over.reason.endswith("; 29% confidence (2.1 days of history)")
    # A small lowering is pulled toward 1 alike: 1000 / 805 = 1.242 -> 1 + 0.242 x 2/7 = 1.069.
    small = compression_proposal("cpu", {"app": 1000}, {"app": stats(700, samples=576, covered=2 * DAY)}, P95)
    assert small.ratio == Decimal("1.06")
    # A month of history is no more than full confidence: the ratio the usage gives, and no more.
    month = compression_proposal("cpu", {"app": 1000}, {"app": stats(250, samples=8640, covered=30 * DAY)}, P95)
    assert month.ratio == Decimal("3.47") and "confidence" not in month.reason
    # A raise applies in full whatever the history.
    raised = compression_proposal("cpu", {"app": 100}, {"app": stats(250, samples=576, covered=2 * DAY)}, P95)
    assert raised.ratio == Decimal("0.5") and "confidence" not in raised.reason


def test_an_idle_container_is_compressed_to_the_maximum_not_divided_by_zero():
    idle = compression_proposal("cpu", {"app": 1000}, {"app": stats(0.0)}, P95)
    assert idle.ratio == P95.max_ratio and idle.demand == 1.0


def test_cpu_demand_is_the_percentile_not_the_peak():
    """A cpu spike only slows the container down (throttling), so cpu is sized at the percentile."""
    spiky = compression_proposal("cpu", {"app": 1000}, {"app": stats(200, peak=900)}, P95)
    assert spiky.demand == pytest.approx(230) and "at least the peak" not in spiky.reason


@pytest.mark.parametrize(("current", "proposed", "result", "why"), [
    ("2", "2.1", "2", "change under 10% ignored"),                  # +5%
    ("2", "1.95", "2", "change under 10% ignored"),                 # -2.5%
    ("2", "2", "2", ""),                                            # no change, nothing to say
    ("2", "2.2", "2.2", ""),                                        # +10%: the minimum change is one
    ("1", "3", "1.25", "raise capped at 25% per cycle (wants 3)"),
    ("1", "1.25", "1.25", ""),                                      # +25%: at the cap is within it
    ("2", "2.3", "2.3", ""),                                        # +15%: taken
    ("3", "1.2", "1.2", ""),                                        # lowering at once
    ("0", "3", "1.25", "raise capped at 25% per cycle (wants 3)"),  # no ratio yet: from 1
])
def test_stability_rules(current, proposed, result, why):
    assert stabilize(Decimal(current), Decimal(proposed), StabilityConfig()) == (Decimal(result), why)


@given(st.decimals(min_value=1, max_value=4, places=2), st.decimals(min_value=1, max_value=4, places=2))
def test_stabilize_never_raises_more_than_a_quarter_and_always_allows_lowering(current, proposed):
    result, _ = stabilize(current, proposed, StabilityConfig())
    assert result <= current * Decimal("1.25")
    if proposed < current * Decimal("0.9"):
        assert result == proposed


def test_oversale_worked_example():
    # 32 cores allocatable, 28 requested, P99 usage 8 cores: 0.7 x 28 / 8 = 2.45
    estimator = TARGET_07
    proposal = oversale_proposal("cpu", 28000, 32000, stats(8000), Decimal(2), estimator)
    assert proposal.ratio == Decimal("2.45")
    # From 1 the first pass raises only 25%.
    first = oversale_proposal("cpu", 28000, 32000, stats(8000), Decimal(1), estimator)
    assert first.ratio == Decimal("1.25")
    assert first.reason == "P99 usage 8 of 28 requested, target 0.7; raise capped at 25% per cycle (wants 2.45)"


def test_a_capped_raise_still_covers_what_the_node_runs():
    # 41 of 32 cores requested (cover 1.29) on a calm node: the 25% cap would leave it underwater.
    proposal = oversale_proposal("cpu", 41000, 32000, stats(8000), Decimal(1), TARGET_07)
    assert proposal.ratio == Decimal("1.29")
    assert proposal.reason == ("P99 usage 8 of 41 requested, target 0.7; raise capped at 25% per cycle (wants 3.00); "
                               "raised to cover the running requests (1.29)")
    # 40 of 32 cores: the capped 1.25 covers them exactly, and no more is said.
    exact = oversale_proposal("cpu", 40000, 32000, stats(8000), Decimal(1), TARGET_07)
    assert exact.ratio == Decimal("1.25") and "cover" not in exact.reason


def test_requests_beyond_the_maximum_hold_and_at_it_are_covered():
    beyond = oversale_proposal("cpu", 100_000, 32000, stats(8000), Decimal(2), TARGET_07)
    assert beyond.ratio == 3
    assert beyond.reason == "P99 usage 8 of 100 requested, target 0.7; requests need 3.13, above the maximum 3: holding"
    at = oversale_proposal("cpu", 96_000, 32000, stats(8000), Decimal(2), TARGET_07)
    assert at.ratio == 3 and at.reason == ("P99 usage 8 of 96 requested, target 0.7; raised only to cover the running "
                                           "requests (3.00), no room for more")


def test_a_ratio_at_the_safe_floor_is_no_hot_node():
    # 0.7 x 32 / 21.2 = 1.0566 -> 1.05, exactly the floor 32 / 32 x 1.05: a ratio, not a hold.
    proposal = oversale_proposal("cpu", 32000, 32000, stats(21200), Decimal("1.05"), TARGET_07)
    assert proposal.ratio == Decimal("1.05") and "floor" not in proposal.reason


def test_a_window_at_the_minimum_history_is_enough():
    day, enough = TARGET_07.min_coverage_seconds, TARGET_07.min_samples
    for covered, samples, held in ((day - 1, enough, True), (day, enough - 1, True), (day, enough, False)):
        proposal = oversale_proposal("cpu", 28000, 32000, stats(8000, samples=samples, covered=covered), Decimal(2),
                                     TARGET_07)
        assert (proposal.reason == "not enough usage history: holding the current ratio") == held, (covered, samples)
    idle = oversale_proposal("cpu", 28000, 32000, stats(0.0), Decimal(3), TARGET_07)
    assert idle.ratio == 3 and idle.reason.startswith("P99 usage 1m of 28 requested")


def test_oversale_never_below_the_safe_floor():
    # Usage rose: 0.7 x 40 / 30 = 0.93 -> 1, but the node already holds 40 cores of requests on 32 real.
    proposal = oversale_proposal("cpu", 40000, 32000, stats(30000), Decimal(2), TARGET_07)
    assert proposal.ratio == safe_floor(40000, 32000, Decimal("0.05")) == Decimal("1.32")
    # A node reporting no allocatable of a resource (a kubelet still starting) has no floor but 1.
    assert safe_floor(40000, 0, Decimal("0.05")) == 1 and safe_floor(3, 1, Decimal(0)) == 3
    assert proposal.reason == ("P99 usage 30 of 40 requested, target 0.7; held at the safe floor 1.32 "
                               "(requests / real allocatable + margin)")
    assert math.floor(32000 * 1.32) >= 40000


def test_a_hot_node_below_the_floor_is_held_not_raised_into_the_margin():
    # 33 of 32 cores requested at ratio 1.05 (floor 1.09): usage 30 cores is far over the target.
    proposal = oversale_proposal("cpu", 33000, 32000, stats(30000), Decimal("1.05"), TARGET_07)
    assert proposal.ratio == Decimal("1.05") and "no room added" in proposal.reason
    # Underwater (ratio 1 holds only 32): lifted just enough to cover the 33 cores that run.
    lifted = oversale_proposal("cpu", 33000, 32000, stats(30000), Decimal(1), TARGET_07)
    assert lifted.ratio == Decimal("1.04") and math.floor(32000 * lifted.ratio) >= 33000
    # Covering exactly what runs already: held where it is.
    covering = oversale_proposal("cpu", 33000, 32000, stats(30000), Decimal("1.04"), TARGET_07)
    assert covering.ratio == Decimal("1.04") and covering.reason == (
        "P99 usage 30 of 33 requested, target 0.7; usage above target: holding, no room added (floor 1.09)")


def test_memory_is_capped_lower():
    # 0.6 x 60 / 10 = 3.6, but memory stops at 1.2
    proposal = oversale_proposal("memory", 60 * 2**30, 64 * 2**30, stats(10 * 2**30), Decimal(1),
                                 TARGET_07)
    assert proposal.ratio == Decimal("1.2")


def test_memory_has_its_own_target_and_percentile():
    """Memory is sized against memory_target at memory_percentile, not the cpu knobs: 0.6 x 40 /
    21 = 1.14 (the cpu target 0.7 would give 1.33, capped at 1.2)."""
    estimator = OversaleEstimator(percentile=0.99, memory_percentile=0.999, cpu_target=Decimal("0.7"))
    proposal = oversale_proposal("memory", 40 * 2**30, 64 * 2**30, stats(21 * 2**30), Decimal(1), estimator)
    assert proposal.ratio == Decimal("1.14")
    assert proposal.reason == "P99.9 usage 21Gi of 40Gi requested, target 0.6"


def test_missing_metrics_hold_and_stale_metrics_decay_to_the_floor():
    estimator = TARGET_07
    held = oversale_proposal("cpu", 10000, 32000, None, Decimal(2), estimator)
    assert held.ratio == 2 and "holding" in held.reason
    stale = stats(4000, age=3 * 3600)
    decayed = oversale_proposal("cpu", 10000, 32000, stale, Decimal(2), estimator)
    assert decayed.ratio == Decimal("1.5")
    assert decayed.reason == "metrics stale for 180 min: decaying toward 1, not below the floor 1"
    # An hour old is not stale yet, nor is a window whose age is unknown.
    assert "stale" not in oversale_proposal("cpu", 10000, 32000, stats(4000, age=3600), Decimal(2), estimator).reason
    unaged = UsageStats(4000.0, 4000.0, 2016, WEEK, None)
    assert oversale_proposal("cpu", 10000, 32000, unaged, Decimal(2), estimator).reason.startswith("P99 usage 4 of 10")
    # Samples enough but no quantile (a source that answered none): held like no history.
    unread = UsageStats(None, None, 2016, WEEK, 60.0)
    assert oversale_proposal("cpu", 10000, 32000, unread, Decimal(2), estimator) == Proposal(
        Decimal(2), "not enough usage history: holding the current ratio")
    near_floor = oversale_proposal("cpu", 40000, 32000, stale, Decimal("1.4"), estimator)
    assert near_floor.ratio == Decimal("1.32")  # decays to 1.2, but not below the floor


@given(st.integers(1000, 100000), st.integers(1000, 64000), st.integers(1, 64000),
       st.decimals(min_value=1, max_value=3, places=2))
def test_oversale_with_data_never_goes_below_the_floor_nor_above_the_max(requested, allocatable, peak, current):
    estimator = TARGET_07
    proposal = oversale_proposal("cpu", requested, allocatable, stats(peak), current, estimator)
    floor = safe_floor(requested, allocatable, estimator.floor_margin)
    assert proposal.ratio >= min(floor, estimator.cpu_max_ratio) or proposal.ratio >= current
    assert proposal.ratio <= max(estimator.cpu_max_ratio, current)
    # Covering the running requests (safety) takes precedence over the 25% raise cap.
    cover = safe_floor(requested, allocatable, Decimal(0))
    assert proposal.ratio <= current * Decimal("1.25") or proposal.ratio == min(cover, estimator.cpu_max_ratio)


@given(st.integers(1000, 100000), st.integers(1000, 64000), st.integers(1, 64000),
       st.decimals(min_value=1, max_value=3, places=2))
def test_a_node_over_its_target_never_gains_room_for_more_pods(requested, allocatable, peak, current):
    # The ratchet this rules out: floor = requested x 1.05 / real leaves 5% free allocatable; the
    # scheduler fills it, the floor rises with the new requests, and a hot node climbs to the max.
    estimator = TARGET_07
    proposal = oversale_proposal("cpu", requested, allocatable, stats(peak), current, estimator)
    hot = Decimal("0.7") * requested / peak < safe_floor(requested, allocatable, estimator.floor_margin)
    if hot and proposal.ratio > current:
        assert math.floor(allocatable * proposal.ratio) - requested < allocatable / 100  # only covers what runs
        assert "no room for more" in proposal.reason or "above the maximum" in proposal.reason


def test_a_workload_whose_pods_ask_for_exclusive_cpus_gets_no_cpu_ratio():
    keys = AnnotationKeys()
    stats = UsageStats(quantile=200.0, peak=250.0, samples=2016, covered_seconds=7 * 86400.0)
    workload = {"kind": "Deployment", "metadata": {"name": "db", "namespace": "shop", "annotations": {
        keys.enable_resource_compress: "y"}}, "spec": {"template": {
            "metadata": {"annotations": {keys.cpu_bind_policy: "FullPCPUs"}},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]}}}}
    plan = plan_compression(workload, {"cpu": {"app": stats}}, None, keys, CompressionEstimator())
    assert "cpu" not in plan.proposals
    assert plan.skipped["cpu"] == ("exclusive-cpus", "cpu request kept: it asks for exclusive CPUs "
                                   "(stke.platform/cpu-bind-policy: FullPCPUs), as many as its cpu request")
    del workload["spec"]["template"]["metadata"]
    assert plan_compression(workload, {"cpu": {"app": stats}}, None, keys, CompressionEstimator()).proposals["cpu"]


def test_an_unreadable_ratio_or_memory_switch_is_said_in_the_reconcilers_reasons():
    keys = AnnotationKeys()
    day = 86400.0
    stats = UsageStats(quantile=200.0, peak=250.0, samples=2016, covered_seconds=7 * day)
    workload = {"kind": "Deployment", "metadata": {"name": "web", "namespace": "shop", "annotations": {
        keys.enable_resource_compress: "y", keys.cpu_requests_ratio: "2x", keys.enable_memory_compress: "yes please"}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}}
    plan = plan_compression(workload, {"cpu": {"app": stats}}, None, keys, CompressionEstimator())
    assert plan.key == ("Deployment", "shop", "web")
    # The typo reads as 1, as the webhook reads it, and the table says so next to the new ratio:
    # the reason of a workload with no ratio at all, and what was ignored.
    assert plan.current["cpu"] == 1
    assert plan.proposals["cpu"].ratio > 1
    unset = copy.deepcopy(workload)
    del unset["metadata"]["annotations"][keys.cpu_requests_ratio]
    unset_reason = plan_compression(unset, {"cpu": {"app": stats}}, None, keys, CompressionEstimator()) \
        .proposals["cpu"].reason
    assert plan.proposals["cpu"].reason == (
        f"{unset_reason}; annotation {keys.cpu_requests_ratio}='2x' ignored: '2x' is not a plain decimal number "
        "such as 1, 1.5 or 2.25; cpu read as 1")
    assert plan.skipped["memory"] == ("memory-not-opted-in", (
        f"memory not opted in: {keys.enable_memory_compress} 'yes please' is not one of y, yes, true, n, no, false"))
    # Valid annotations add nothing; an absent switch says how to opt in.
    workload["metadata"]["annotations"] = {keys.enable_resource_compress: "y", keys.cpu_requests_ratio: "2"}
    plan = plan_compression(workload, {"cpu": {"app": stats}}, None, keys, CompressionEstimator())
    assert "ignored" not in plan.proposals["cpu"].reason
    assert plan.skipped["memory"][1] == f"memory not opted in (set {keys.enable_memory_compress}: y)"


# ---- a workload's plan beside its autoscalers ----------------------------------------------------

KEYS = AnnotationKeys()


def web(*, memory: bool = False) -> dict:
    annotations = {KEYS.enable_resource_compress: "y", **({KEYS.enable_memory_compress: "y"} if memory else {})}
    return {"kind": "Deployment", "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": {"template": {"spec": {"containers": [
                {"name": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}}


def hpa(metrics: list, *, target: tuple[str, str] = ("Deployment", "web"), annotations: dict | None = None,
        owners: list | None = None) -> dict:
    return {"metadata": {"name": "web", "annotations": annotations or {}, "ownerReferences": owners or []},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": target[0], "name": target[1]},
                     "metrics": metrics}}


def utilization(resource: str, percent: int | None, *, kind: str = "Resource", target: str = "Utilization") -> dict:
    source = {"name": resource, "target": {"type": target,
                                           **({"averageUtilization": percent} if percent is not None else {})}}
    return {"type": kind, "resource" if kind == "Resource" else "containerResource": source}


LOW_USE = {"cpu": {"app": stats(200.0, 250.0)}, "memory": {"app": stats(2.0**28, 2.0**28)}}


@pytest.mark.parametrize(("metrics", "cpu"), [
    ([utilization("cpu", 60)], 60),
    ([utilization("memory", 80), utilization("cpu", 70, kind="ContainerResource")], 70),
    ([utilization("cpu", None, target="AverageValue")], None),   # an absolute target: requests do not matter
    ([utilization("cpu", None)], None),
    ([{"type": "External", "external": {"metric": {"name": "queue"}}}], None),
])
def test_the_utilization_target_is_read_from_resource_and_container_resource_metrics(metrics, cpu):
    assert utilization_target(hpa(metrics), "cpu") == cpu


def test_a_resource_an_hpa_scales_on_is_skipped_unless_its_target_is_rescaled():
    scaled = hpa([utilization("cpu", 60)])
    plan = plan_compression(web(memory=True), LOW_USE, scaled, KEYS, CompressionEstimator())
    assert plan.skipped == {"cpu": ("hpa", "scaled by HPA web on cpu utilization")}
    assert "cpu" not in plan.proposals and not plan.hpa_targets, "no ratio, and no target to rescale"
    assert plan.proposals["memory"].ratio > 1, "memory is no target of the HPA: right-sized as usual"
    rescaled = plan_compression(web(), LOW_USE, scaled, KEYS, CompressionEstimator(), rescale_hpa=True)
    assert rescaled.proposals["cpu"].ratio > 1 and rescaled.hpa_targets == {"cpu": (60, 60)}
    ratio = rescaled.proposals["cpu"].ratio
    assert rescaled.rescaled_targets({"cpu": ratio}) == {"cpu": (60, round(60 * ratio))}
    assert rescaled.rescaled_targets({"cpu": Decimal(1)}) == {}, "the target already fits the ratio in effect"
    assert rescaled.rescaled_targets({}) == {}, "no ratio in effect is a ratio of 1"


def test_a_rescaled_hpa_is_planned_from_its_recorded_original_target():
    record = KEYS.original_target_utilization_of("cpu")
    rescaled = hpa([utilization("cpu", 75)], annotations={record: "60"})
    plan = plan_compression(web(), LOW_USE, rescaled, KEYS, CompressionEstimator(), rescale_hpa=True)
    assert plan.hpa_targets == {"cpu": (60, 75)}
    assert plan.rescaled_targets({"cpu": Decimal("1.25")}) == {}
    broken = hpa([utilization("cpu", 75)], annotations={record: "60%"})
    plan = plan_compression(web(memory=True), LOW_USE, broken, KEYS, CompressionEstimator(), rescale_hpa=True)
    assert "cpu" not in plan.proposals and plan.proposals["memory"].ratio > 1
    assert plan.skipped["cpu"] == ("invalid-annotation", f"HPA web: {record} '60%' is not a whole percentage above "
                                   "0; not right-sized until it is set to the target before rescaling")


def test_an_hpa_on_the_owner_or_managed_by_another_controller_is_never_rescaled():
    through_owner = hpa([utilization("cpu", 60)], target=("KafkaConnect", "orders"))
    plan = plan_compression(web(), LOW_USE, through_owner, KEYS, CompressionEstimator(), rescale_hpa=True)
    assert plan.skipped["cpu"] == ("hpa", "scaled by HPA web on cpu utilization through KafkaConnect orders, the "
                                   "workload's owner: its target is not rescaled")
    keda = hpa([utilization("cpu", 60)], owners=[{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                                                 "name": "web", "controller": True}])
    plan = plan_compression(web(), LOW_USE, keda, KEYS, CompressionEstimator(), rescale_hpa=True)
    assert plan.skipped["cpu"] == ("hpa-managed", "scaled by HPA web on cpu utilization, whose spec ScaledObject "
                                   "web manages: its target cannot be rescaled")


def test_a_resource_a_vpa_sets_or_exclusive_cpus_keep_is_left_the_other_planned():
    plan = plan_compression(web(memory=True), LOW_USE, None, KEYS, CompressionEstimator(), vpa={"memory": "web-vpa"})
    assert plan.skipped == {"memory": ("vpa", "its memory requests are set by VerticalPodAutoscaler web-vpa")}
    assert plan.proposals["cpu"].ratio > 1
    plan = plan_compression(web(memory=True), LOW_USE, None, KEYS, CompressionEstimator(), vpa={"cpu": "web-vpa"})
    assert set(plan.skipped) == {"cpu"} and plan.proposals["memory"].ratio > 1
    pinned = web(memory=True)
    pinned["spec"]["template"]["metadata"] = {"annotations": {KEYS.cpu_bind_policy: "FullPCPUs"}}
    plan = plan_compression(pinned, LOW_USE, None, KEYS, CompressionEstimator())
    assert plan.skipped["cpu"][0] == "exclusive-cpus" and plan.proposals["memory"].ratio > 1


def test_a_plan_starts_from_the_ratio_in_effect_and_says_why_a_change_is_held_back():
    workload = web(memory=True)
    workload["metadata"]["annotations"][KEYS.cpu_requests_ratio] = "0.8"  # a raise, read as it is
    plan = plan_compression(workload, LOW_USE, None, KEYS, CompressionEstimator())
    assert plan.current == {"cpu": Decimal("0.8"), "memory": Decimal(1)}
    wanted = compression_proposal("cpu", template_requests(workload, "cpu"), LOW_USE["cpu"], CompressionEstimator())
    cpu, memory = plan.proposals["cpu"], plan.proposals["memory"]
    assert cpu.ratio == Decimal("1.00"), "a raise is held to 25% of the ratio in effect per cycle"
    assert cpu.reason == f"{wanted.reason}; raise capped at 25% per cycle (wants {wanted.ratio})"
    assert cpu.demand == wanted.demand
    assert describe_change(plan) == f"cpu 0.8 -> 1: {cpu.reason}; memory 1 -> 1.25: {memory.reason}"


def test_a_cronjobs_requests_are_read_from_its_job_template_init_containers_included():
    cronjob = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {
        "initContainers": [{"name": "fetch", "resources": {"requests": {"cpu": "2"}}}],
        "containers": [{"name": "report", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}}}}}
    assert template_requests(cronjob, "cpu") == {"fetch": 2000, "report": 500}
    assert template_requests(cronjob, "memory") == {"report": 2**30}


def test_usage_is_merged_per_container_over_a_workloads_pods():
    first, second, proxy = stats(100.0, 300.0, samples=100), stats(200.0, 250.0, samples=50), stats(5.0)
    merged = usage_by_container({"web-1": {"app": first, "proxy": proxy}, "web-2": {"app": second}})
    assert merged == {"app": merge_pods([first, second]), "proxy": merge_pods([proxy])}
    assert merged["app"].peak == 300.0 and merged["app"].samples == 150
