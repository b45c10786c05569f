"""The usage view and load-aware placement as pure functions: windows, staleness, the watermark
filter at and around each watermark, estimates of Pods not yet in the metrics, the score."""

from __future__ import annotations

from decimal import Decimal

import pytest

from oversale.annotations import AnnotationKeys
from oversale.cpus import Topology
from oversale.placement import NodeHeat, NodeUsage, NodeView, PodDemand, load_shortfall, placement_score
from oversale.usage import (
    LoadConfig,
    Sample,
    Watermarks,
    estimated_usage,
    hot_reason,
    load_score,
    node_load,
    stale_reason,
    watermarks_for,
)

KEYS = AnnotationKeys()
GI = 2**30
REAL = {"cpu": 16000, "memory": 64 * GI}
NOW = 10_000.0


def steady(cpu: int, memory: int = 8 * GI, age: float = 10) -> list[Sample]:
    """An hour of 30-second samples ending ``age`` seconds ago."""
    return [Sample(NOW - age - 30 * i, cpu, memory) for i in reversed(range(120))]


def view(**extra) -> NodeView:
    return NodeView("n", {"cpu": 24000, "memory": 64 * GI}, Decimal("1.5"), Topology.flat(16), real=REAL, **extra)


def test_windows_are_the_5_minute_average_the_hour_peak_and_the_latest_memory():
    samples = steady(4000)
    samples[-30] = Sample(samples[-30].at, 12000, 8 * GI)  # a spike 15 minutes ago
    samples[-1] = Sample(samples[-1].at, 6000, 9 * GI)
    load = node_load(samples)
    assert load.cpu_average == pytest.approx((9 * 4000 + 6000) / 10)  # the last 5 minutes: 10 samples
    assert load.cpu_peak == 12000 and load.memory == 9 * GI and load.at == NOW - 10
    assert node_load([]) is None


@pytest.mark.parametrize(("millicores", "hot"), [(10400, False), (10399, False), (10401, True)])
def test_the_cpu_average_watermark_at_just_below_and_just_above(millicores, hot):
    # 65% of 16 cores is 10400m: at the watermark a node still takes Pods, one millicore over it not.
    load = node_load(steady(millicores))
    assert (hot_reason(load, {}, REAL, Watermarks()) is not None) == hot


def test_the_peak_and_memory_watermarks_and_the_exact_reason():
    samples = steady(8000)
    samples[0] = Sample(samples[0].at, 13601, 8 * GI)  # 85% of 16 cores is 13600m
    load = node_load(samples)
    assert hot_reason(load, {}, REAL, Watermarks()) == \
        "cpu usage 85% of real capacity (1-hour maximum) is above the scheduling watermark 85%"
    hot = node_load(steady(11360))
    assert hot_reason(hot, {}, REAL, Watermarks()) == \
        "cpu usage 71% of real capacity (5-min average) is above the scheduling watermark 65%"
    full = node_load(steady(1000, memory=int(0.86 * 64 * GI)))
    assert hot_reason(full, {}, REAL, Watermarks()).startswith("memory usage 86% of real capacity (latest)")
    assert hot_reason(node_load(steady(1000, memory=int(0.85 * 64 * GI))), {}, REAL, Watermarks()) is None


def test_stale_or_missing_metrics_neither_filter_nor_favour():
    config = LoadConfig()
    old = node_load(steady(15000, age=181))
    assert stale_reason(old, NOW, config) == "node metrics 181s old (limit 180s)"
    assert load_shortfall(view(), NodeHeat(old, NOW), config) is None
    assert load_shortfall(view(), NodeHeat(None, NOW), config) is None
    demand = PodDemand("p", {"cpu": 1000, "memory": GI}, None, False)
    assert placement_score(view(), NodeUsage(), demand, NodeHeat(old, NOW), config) == \
        placement_score(view(), NodeUsage(), demand, None, config), "request-based score"
    fresh = node_load(steady(15000, age=179))
    assert load_shortfall(view(), NodeHeat(fresh, NOW), config) is not None


def test_pods_not_yet_in_the_metrics_count_by_their_estimate():
    estimate = estimated_usage({"cpu": 4000, "memory": 10 * GI}, LoadConfig())
    assert estimate == {"cpu": 3400, "memory": 7 * GI}
    load = node_load(steady(4800))  # 30% of real
    assert load_shortfall(view(), NodeHeat(load, NOW, {"cpu": 3400.0}), LoadConfig()) is None  # 51%
    reason = load_shortfall(view(), NodeHeat(load, NOW, {"cpu": 6800.0}), LoadConfig())  # 72.5%
    assert reason == ("cpu usage 72% of real capacity (5-min average, with Pods bound but not yet in the metrics) "
                      "is above the scheduling watermark 65%")


def test_the_cooler_node_scores_higher_and_weights_combine_with_packing():
    demand = PodDemand("p", {"cpu": 2000, "memory": GI}, None, False)
    cool = NodeHeat(node_load(steady(2000)), NOW)
    warm = NodeHeat(node_load(steady(9000)), NOW)
    config = LoadConfig()
    assert placement_score(view(), NodeUsage(), demand, cool, config) > \
        placement_score(view(), NodeUsage(), demand, warm, config)
    assert load_score({"cpu": 0.0, "memory": 0.0}) == 10 and load_score({"cpu": 1.2, "memory": 0.1}) == 0
    packing_only = LoadConfig(load_weight=0)
    assert placement_score(view(), NodeUsage(), demand, cool, packing_only) == \
        placement_score(view(), NodeUsage(), demand, warm, packing_only)


def test_watermarks_per_node_from_annotation_then_label_and_bad_values_are_reported():
    labels = {KEYS.cpu_scheduling_watermark: "0.5", KEYS.memory_scheduling_watermark: "0.9"}
    annotations = {KEYS.cpu_scheduling_watermark: "0.7", KEYS.cpu_peak_scheduling_watermark: "95%"}
    marks, problems = watermarks_for(labels, annotations, KEYS, Watermarks())
    assert marks == Watermarks(Decimal("0.7"), Decimal("0.85"), Decimal("0.9"))
    assert [p.key for p in problems] == [KEYS.cpu_peak_scheduling_watermark]
