"""The usage view and load-aware placement as pure functions: windows, staleness, the watermark
filter at and around each watermark, estimates of Pods not yet in the metrics, the score."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from oversale.annotations import AnnotationKeys
from oversale.cpus import Topology
from oversale.disruption import DisruptionBudget, disruption_budget
from oversale.node_table import NodeTable, rank, screen
from oversale.placement import (
    Ask,
    HeldPod,
    NodeHeat,
    NodeUsage,
    NodeView,
    PodDemand,
    Preemption,
    Reservation,
    bound_charge,
    crowded_out,
    fit_on,
    free,
    held_usage,
    load_facts,
    load_shortfall,
    node_score,
    node_view,
    placement_score,
    pod_demand,
    preemption_on,
    score_on,
    shortfall,
    with_nominated,
)
from oversale.pods import pod_workloads
from oversale.usage import (
    DEFAULT_WATERMARKS,
    LoadConfig,
    NodeLoad,
    Sample,
    Watermarks,
    WorkloadUsage,
    combined_score,
    estimated_usage,
    hot_reason,
    load_score_after,
    node_load,
    pod_estimate,
    stale_reason,
    watermark_exceeded,
    watermarks_for,
    with_history_peak,
    workload_history,
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


def test_the_windows_are_as_long_as_configured():
    """The replay and the remediation read windows of the lengths set in Settings."""
    samples = steady(4000)
    samples[-2] = Sample(samples[-2].at, 10000, 8 * GI)  # 30 s before the latest
    samples[-40] = Sample(samples[-40].at, 12000, 8 * GI)  # 19.5 minutes before it
    short = node_load(samples, LoadConfig(average_seconds=60, peak_seconds=600))
    assert (short.cpu_average, short.cpu_peak) == (7000, 10000)  # the latest two samples; the last 10 minutes
    default = node_load(samples)
    assert (default.cpu_average, default.cpu_peak) == (4600, 12000)


def test_a_spike_exactly_an_hour_before_the_latest_sample_is_out_of_the_hour_peak():
    """As the 5-minute average leaves out the sample exactly 5 minutes old, so the hour leaves out
    the one exactly an hour old: each window is as long as it says, never a sample more."""
    samples = steady(4000)
    latest = samples[-1].at
    assert node_load([Sample(latest - 3600, 12000, 8 * GI), *samples]).cpu_peak == 4000
    assert node_load([Sample(latest - 3599, 12000, 8 * GI), *samples]).cpu_peak == 12000


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
    assert hot_reason(full, {}, REAL, Watermarks()) == \
        "memory usage 86% of real capacity (latest) is above the scheduling watermark 85%"
    assert hot_reason(node_load(steady(1000, memory=int(0.85 * 64 * GI))), {}, REAL, Watermarks()) is None
    samples[0] = Sample(samples[0].at, 13600, 8 * GI)
    assert hot_reason(node_load(samples), {}, REAL, Watermarks()) is None  # at the peak watermark


def test_stale_or_missing_metrics_neither_filter_nor_favour():
    config = LoadConfig()
    old = node_load(steady(15000, age=181))
    assert stale_reason(old, NOW, config) == "node metrics 181s old (limit 180s)"
    assert stale_reason(None, NOW, config) == "no node metrics"  # what the extender logs for the node
    assert load_shortfall(view(), NodeHeat(old, NOW), config) is None
    assert load_shortfall(view(), NodeHeat(None, NOW), config) is None
    demand = PodDemand("p", {"cpu": 1000, "memory": GI}, None, False)
    assert placement_score(view(), NodeUsage(), demand, NodeHeat(old, NOW), config) == \
        placement_score(view(), NodeUsage(), demand, None, config), "request-based score"
    cool_but_old = NodeHeat(node_load(steady(1000, age=181)), NOW)
    assert placement_score(view(), NodeUsage(), demand, cool_but_old, config) == \
        placement_score(view(), NodeUsage(), demand, None, config), "a cool node's stale metrics do not favour it"
    fresh = node_load(steady(15000, age=179))
    assert load_shortfall(view(), NodeHeat(fresh, NOW), config) is not None
    # "Older than the limit" is stale: a reading exactly as old as the limit still counts.
    at_limit = node_load(steady(15000, age=180))
    assert stale_reason(at_limit, NOW, config) is None and load_shortfall(view(), NodeHeat(at_limit, NOW), config)


def test_pods_not_yet_in_the_metrics_count_by_their_estimate():
    estimate = estimated_usage({"cpu": 4000, "memory": 10 * GI}, LoadConfig())
    assert estimate == {"cpu": 3400, "memory": 7 * GI}
    load = node_load(steady(4800))  # 30% of real
    assert load_shortfall(view(), NodeHeat(load, NOW, {"cpu": 3400.0}), LoadConfig()) is None  # 51%
    reason = load_shortfall(view(), NodeHeat(load, NOW, {"cpu": 6800.0}), LoadConfig())  # 72.5%
    assert reason == ("cpu usage 72% of real capacity (5-min average, with Pods bound but not yet in the metrics) "
                      "is above the scheduling watermark 65%")
    # They count in the score too: the node a burst was just bound to scores below its twin.
    demand = PodDemand("p", {"cpu": 1000, "memory": GI}, None, False)
    quiet, burst = NodeHeat(load, NOW), NodeHeat(load, NOW, {"cpu": 3400.0, "memory": 7.0 * GI})
    facts = load_facts(view(), burst)
    assert facts is not None and (facts.cpu_used, facts.memory_used) == (load.cpu_average + 3400, load.memory + 7 * GI)
    assert placement_score(view(), NodeUsage(), demand, burst, LoadConfig()) < \
        placement_score(view(), NodeUsage(), demand, quiet, LoadConfig())


def test_the_cooler_node_scores_higher_and_weights_combine_with_packing():
    demand = PodDemand("p", {"cpu": 2000, "memory": GI}, None, False)
    cool = NodeHeat(node_load(steady(2000)), NOW)
    warm = NodeHeat(node_load(steady(9000)), NOW)
    config = LoadConfig()
    assert placement_score(view(), NodeUsage(), demand, cool, config) > \
        placement_score(view(), NodeUsage(), demand, warm, config)
    assert load_score_after(0.0, 0.0, 4000, GI) == 10 and load_score_after(4800.0, 0.1 * GI, 4000, GI) == 0
    light, heavy = {"cpu": 1000.0, "memory": float(GI)}, {"cpu": 1000.0, "memory": 48.0 * GI}
    assert placement_score(view(), NodeUsage(), demand, cool, config, heavy) < \
        placement_score(view(), NodeUsage(), demand, cool, config, light), "8 + 48 of 64 GiB: memory decides"
    packing_only = LoadConfig(load_weight=0)
    assert placement_score(view(), NodeUsage(), demand, cool, packing_only) == \
        placement_score(view(), NodeUsage(), demand, warm, packing_only)


def test_watermarks_per_node_from_annotation_then_label_and_bad_values_are_reported():
    labels = {KEYS.cpu_scheduling_watermark: "0.5", KEYS.memory_scheduling_watermark: "0.9"}
    annotations = {KEYS.cpu_scheduling_watermark: "0.7", KEYS.cpu_peak_scheduling_watermark: "95%"}
    marks, problems = watermarks_for(labels, annotations, KEYS, Watermarks())
    assert marks == Watermarks(Decimal("0.7"), Decimal("0.85"), Decimal("0.9"))
    assert [p.key for p in problems] == [KEYS.cpu_peak_scheduling_watermark]
    # A watermark is a share of real capacity above 0 and at most all of it.
    full, problems = watermarks_for({}, {KEYS.cpu_scheduling_watermark: "1", KEYS.memory_scheduling_watermark: "1.01"},
                                    KEYS, Watermarks())
    assert full.cpu_average == Decimal(1) and full.memory == Watermarks().memory
    assert [p.key for p in problems] == [KEYS.memory_scheduling_watermark]
    nothing, problems = watermarks_for({}, {KEYS.cpu_peak_scheduling_watermark: "0"}, KEYS, Watermarks())
    assert nothing == Watermarks()
    assert [str(p) for p in problems] == [f"annotation {KEYS.cpu_peak_scheduling_watermark}='0' ignored: not a "
                                          "number above 0 and at most 1; default kept"]
    # A Node sent in full by kube-scheduler is JSON nobody checked: a number where text belongs is refused too.
    kept, problems = watermarks_for({}, {KEYS.cpu_scheduling_watermark: 0.7}, KEYS, Watermarks())
    assert kept == Watermarks() and [p.key for p in problems] == [KEYS.cpu_scheduling_watermark]


def test_pods_bound_but_not_in_the_metrics_yet_count_against_each_watermark():
    load = NodeLoad(cpu_average=2000.0, cpu_peak=3000.0, memory=2.0 * GI, at=NOW, peak_window="1-hour maximum")
    real = {"cpu": 4000, "memory": 4 * GI}
    assert watermark_exceeded(load, {}, real, Watermarks()) is None
    assert watermark_exceeded(load, {"cpu": 500.0}, real, Watermarks()) == ("cpu", 0.875, 0.85, "1-hour maximum")
    assert watermark_exceeded(load, {"cpu": 700.0}, real, Watermarks()) == ("cpu", 0.675, 0.65, "5-min average")
    assert watermark_exceeded(load, {"memory": 1.5 * GI}, real, Watermarks()) == ("memory", 0.875, 0.85, "latest")
    # A resource whose real capacity is unknown is no test at all, not a division by zero.
    assert watermark_exceeded(load, {"cpu": 9000.0}, {"memory": 4 * GI}, Watermarks()) is None


def test_a_resource_without_real_capacity_counts_as_full_in_the_load_score():
    assert load_score_after(0.0, 0.0, 0, GI) == 0 and load_score_after(0.0, 0.0, 4000, 0) == 0
    assert load_score_after(1000.0, 0.5 * GI, 4000, GI) == 5, "the hotter resource decides"


def test_the_score_weighs_packing_and_load_and_a_node_without_fresh_metrics_by_packing_alone():
    assert combined_score(9, 3, LoadConfig(packing_weight=2, load_weight=1)) == 7  # (18 + 3) / 3
    assert combined_score(9, 3, LoadConfig(packing_weight=1, load_weight=2)) == 5  # (9 + 6) / 3
    assert combined_score(9, None, LoadConfig(load_weight=2)) == 9
    assert combined_score(9, 3, LoadConfig(load_weight=0)) == 9
    assert combined_score(9, 3, LoadConfig(packing_weight=0, load_weight=0)) == 9  # both 0, as Settings allows


def test_a_history_maximum_names_its_window_and_a_workload_seen_nowhere_counts_by_request():
    own = NodeLoad(cpu_average=900, cpu_peak=1200, memory=2e9, at=0)
    ninety = with_history_peak(own, 3800.0, LoadConfig(history_peak_seconds=90 * 60))
    assert (ninety.cpu_peak, ninety.peak_window) == (3800.0, "90-minute maximum, from Prometheus")
    assert with_history_peak(own, 1200.0, LoadConfig()) == own, "no higher than its own samples: theirs stands"
    assert pod_estimate({"cpu": 1000, "memory": GI}, WorkloadUsage(0.0, 0.0, 0), LoadConfig()) == \
        {"cpu": 850.0, "memory": 0.7 * GI}


def test_one_replica_in_the_metrics_tells_what_the_next_uses_and_a_request_left_out_is_estimated_as_none():
    one = WorkloadUsage(150.0, 2.0**28, 1)
    assert pod_estimate({"cpu": 4000, "memory": GI}, one, LoadConfig()) == {"cpu": 150.0, "memory": 2.0**28}
    # A BestEffort container requests nothing, and a Pod may request memory only.
    assert estimated_usage({"memory": GI}, LoadConfig()) == {"cpu": 0.0, "memory": 0.7 * GI}
    assert estimated_usage({"cpu": 1000}, LoadConfig()) == {"cpu": 850.0, "memory": 0.0}


# -- the batch filter and score (what the extender and the replay call) -----------------------------

TOPOLOGIES = [
    Topology.from_zones({0: 8, 1: 8}),
    Topology.flat(16),
    Topology.from_koordinator(json.dumps({"detail": [  # 2 sockets x 4 cores x 2 threads
        {"id": t * 8 + s * 4 + c, "core": c, "socket": s, "node": s} for t in range(2) for s in range(2)
        for c in range(4)]})),
]


@st.composite
def placements(draw):
    """Nodes (some binding CPUs, some holding reservations, some without fresh metrics), the Pods on
    them, and one Pod to place; some nodes with exactly the room the Pod takes, or one millicore
    more or less."""
    cpu = draw(st.sampled_from([500, 2000, 3000, 4000, 8000]))
    overhead = draw(st.sampled_from([0, 0, 250]))  # a RuntimeClass's, on top of the containers' request
    demand = PodDemand("p", {"cpu": cpu + overhead, "memory": draw(st.integers(0, 8 * GI))},
                       draw(st.sampled_from([None, "FullPCPUs", "SpreadByPCPUs"])), draw(st.booleans()),
                       cpus=cpu // 1000 if cpu % 1000 == 0 else 0,
                       owner=draw(st.sampled_from(["", "ns/Deployment/a"])))
    nodes = []
    for index in range(draw(st.integers(1, 6))):
        allocatable = draw(st.sampled_from([1000, 8000, 16000, 32000]))
        reservations = tuple(Reservation(draw(st.sampled_from(["ns/Deployment/a", "ns/Deployment/b"])),
                                         {"cpu": draw(st.integers(0, 8000)), "memory": draw(st.integers(0, 8 * GI))},
                                         NOW + draw(st.sampled_from([-10, 60])))
                             for _ in range(draw(st.integers(0, 2))))
        ratio = draw(st.sampled_from([Fraction(1), Fraction(3, 2), Fraction(137, 100)]))
        node = NodeView(f"n{index}", {"cpu": allocatable, "memory": 32 * GI},
                        Decimal(ratio.numerator) / ratio.denominator,
                        draw(st.sampled_from(TOPOLOGIES)), ratio=ratio,
                        bind_policy=draw(st.sampled_from([None, "FullPCPUs", "SpreadByPCPUs"])),
                        single_numa=draw(st.booleans()),
                        strategy=draw(st.sampled_from(["MostAllocated", "LeastAllocated"])), real=REAL,
                        reservations=reservations)
        bound = set(draw(st.lists(st.integers(0, 15), max_size=8)))
        if draw(st.booleans()):
            shared = draw(st.integers(0, allocatable))
        else:  # the room left is what the Pod takes shared or bound, give or take a millicore
            taken = draw(st.sampled_from([cpu + overhead, bound_charge(node, demand.cpus) + overhead]))
            left = taken + draw(st.sampled_from([-1, 0, 1]))
            shared = max(0, allocatable - bound_charge(node, len(bound)) - left)
        usage = NodeUsage(shared={"cpu": shared, "memory": draw(st.integers(0, 24 * GI))}, bound_cpus=bound)
        load = NodeLoad(draw(st.floats(0, 16000)), draw(st.floats(0, 16000)), draw(st.floats(0, 64 * GI)),
                        NOW - draw(st.sampled_from([5, 180, 181, 500])))  # 180 s: the default age limit
        heat = NodeHeat(draw(st.sampled_from([load, None])), NOW, {"cpu": draw(st.floats(0, 4000))})
        nodes.append((node, usage, heat))
    # What the Pod is expected to use: by its request, or what its workload's Pods use each.
    observed = draw(st.sampled_from([None, {"cpu": 120.0, "memory": 0.5 * GI}, {"cpu": 7900.0, "memory": 30.0 * GI}]))
    return nodes, demand, observed


def placement_of(demand: PodDemand, topology: Topology, cpu_used: float, memory_used: float,
                 observed: dict[str, float] | None) -> tuple:
    """One free 16-CPU node of real 16 CPUs and 64 GiB, its metrics 5 s old, and the Pod to place."""
    node = NodeView("n0", {"cpu": 16000, "memory": 32 * GI}, Decimal(1), topology, ratio=Fraction(1), real=REAL)
    heat = NodeHeat(NodeLoad(cpu_used, cpu_used, memory_used, NOW - 5), NOW, {})
    return [(node, NodeUsage(shared={"cpu": 0, "memory": 0}), heat)], demand, observed


# Cases the random draws reach too seldom to be relied on (mutation testing found each unasked):
# a node whose memory, not its cpu, is what its load score is made of; a SpreadByPCPUs Pod, which
# the vectors leave to the node-by-node functions since it scores by the zone it would take.
@example(placement_of(PodDemand("p", {"cpu": 500, "memory": 0}, None, False), TOPOLOGIES[0], 1000.0, 40.0 * GI,
                      {"cpu": 120.0, "memory": 8.0 * GI}), True, (1, 3))
@example(placement_of(PodDemand("p", {"cpu": 6000, "memory": 0}, "SpreadByPCPUs", False, cpus=6),
                      TOPOLOGIES[2], 0.0, 0.0, None), False, (1, 1))
@settings(max_examples=500, deadline=None)
@given(placements(), st.booleans(), st.sampled_from([(1, 1), (2, 1), (1, 0), (1, 3), (0, 1), (0, 0)]))
def test_the_batch_filter_and_score_answer_as_the_node_by_node_functions(case, load_aware, weights):
    """``screen`` and ``rank`` decide the common case by vector operations over the node table and
    remember answers per Pod shape; every answer must still be the one ``shortfall``,
    ``node_score`` and the load functions give node by node, on a cold call, a warm one, and
    after a node's view changed; by requests alone where placement is not load-aware. The table
    is built as the extender keeps it: a deleted node's row taken by another, the load facts of
    each row replaced on their own after each metrics poll."""
    nodes, demand, observed = case
    config = LoadConfig(packing_weight=weights[0], load_weight=weights[1])
    estimate = observed if observed is not None else estimated_usage(demand.requests, config)

    def expected(node, usage, heat):
        reason = shortfall(node, usage, demand, NOW)
        facts = load_facts(node, heat)
        fresh = facts is not None and NOW - facts.at <= config.max_age_seconds
        if reason is not None:
            return reason, 0
        if node.reservations and node.holds_for(demand.owner, NOW):
            return (load_shortfall(node, heat, config) if load_aware else None), 10
        packing = node_score(node, usage, demand, NOW)
        if not fresh or not load_aware:
            return None, packing
        return facts.hot, combined_score(packing, load_score_after(facts.cpu_used + estimate["cpu"],
                                                                   facts.memory_used + estimate["memory"],
                                                                   facts.real_cpu, facts.real_memory), config)

    table = NodeTable()
    gone, gone_usage, gone_heat = nodes[0]
    table.put("gone", replace(gone, name="gone"), gone_usage, load_facts(gone, gone_heat))
    table.remove("gone")
    for node, usage, _ in reversed(nodes):  # rows in another order than asked
        table.put(node.name, node, usage, None)
    for node, _, heat in nodes:
        table.put_load(node.name, load_facts(node, heat))
    table.put_load("gone", load_facts(gone, gone_heat))  # metrics of a node with no row: no row made
    slots, unknown = table.slots([node.name for node, _, _ in nodes] + ["gone"])
    assert unknown == ["gone"] and len(table) == len(nodes)
    for _ in range(2):  # cold, then with every answer remembered
        assert list(zip(screen(table, slots, demand, config, NOW, load_aware=load_aware),
                        rank(table, slots, demand, config, NOW, load_aware=load_aware, estimate=observed),
                        strict=True)) == [expected(*node) for node in nodes]
    # The same usage snapshot under a changed view (the node's allocatable was oversold anew).
    grown = [(replace(view, allocatable={"cpu": view.allocatable["cpu"] * 2, "memory": 64 * GI}), usage)
             for view, usage, _ in nodes]
    for view, usage in grown:
        table.put(view.name, view, usage, None)
    assert rank(table, slots, demand, config, NOW, load_aware=True) == [
        0 if shortfall(view, usage, demand, NOW) else 10 if view.reservations and view.holds_for(demand.owner, NOW)
        else node_score(view, usage, demand, NOW) for view, usage in grown]


def test_a_node_view_reads_each_of_the_nodes_labels_and_annotations():
    node = {"metadata": {"name": "n", "labels": {KEYS.cpu_bind_policy: "FullPCPUs",
                                                  KEYS.numa_topology_policy: "single-numa-node",
                                                  KEYS.numa_allocate_strategy: "LeastAllocated",
                                                  KEYS.cpu_scheduling_watermark: "0.5"},
                         "annotations": {KEYS.memory_scheduling_watermark: "0.75",
                                         KEYS.cpu_topology: "0-15",
                                         KEYS.reservations: json.dumps({"ns/Deployment/a": {
                                             "cpu": "2", "until": "2026-12-06T12:00:00Z"}})}},
            "status": {"allocatable": {"cpu": "24", "memory": "64Gi", "pods": "110"}}}
    view = node_view(node, KEYS)
    assert (view.name, view.allocatable, view.bind_policy, view.single_numa, view.strategy) == \
        ("n", {"cpu": 24000, "memory": 64 * GI}, "FullPCPUs", True, "LeastAllocated")
    assert (view.watermarks.cpu_average, view.watermarks.memory) == (Decimal("0.5"), Decimal("0.75"))
    assert [(held.owner, held.requests) for held in view.reservations] == [("ns/Deployment/a", {"cpu": 2000})]
    assert len(view.problems) == 1 and f"annotation {KEYS.cpu_topology}='0-15' ignored" in str(view.problems[0])
    plain = node_view({"metadata": {"name": "m"}, "status": {"allocatable": {"cpu": "8"}}}, KEYS)
    assert (plain.bind_policy, plain.single_numa, plain.strategy, plain.watermarks, plain.reservations,
            plain.problems) == (None, False, "MostAllocated", DEFAULT_WATERMARKS, (), ())
    # No topology anywhere: one zone of the node's real CPUs, without core detail.
    assert (len(plain.topology.cpus), plain.topology.detailed) == (8, False)


def test_a_pods_demand_reads_its_annotations_owner_and_priority():
    pod = {"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                        "annotations": {KEYS.cpu_bind_policy: "SpreadByPCPUs",
                                        KEYS.numa_topology_policy: "single-numa-node"},
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f", "controller": True}]},
           "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {"requests": {
               "cpu": "4", "memory": "1Gi"}}}]}}
    demand = pod_demand(pod, KEYS)
    assert (demand.uid, demand.requests, demand.bind_policy, demand.single_numa, demand.cpus, demand.owner,
            demand.priority) == ("u1", {"cpu": 4000, "memory": GI}, "SpreadByPCPUs", True, 4,
                                 "shop/ReplicaSet/web-5d8f", 1000)
    assert demand.workload
    naked = pod_demand({"metadata": {"name": "p"}, "spec": {"priority": "high", "containers": [
        {"name": "c", "resources": {"requests": {"cpu": "1500m"}}}]}}, KEYS)
    assert (naked.bind_policy, naked.single_numa, naked.cpus, naked.owner, naked.priority) == \
        (None, False, 0, "", 0)


def test_metrics_exactly_as_old_as_the_limit_count_node_by_node_as_in_the_table():
    """The replay scores node by node (``score_on``), the extender over its table (``rank``): at the
    age limit itself (180 s by default) both still count the metrics, and a second later neither."""
    config = LoadConfig(packing_weight=1, load_weight=1)
    node = NodeView("n", {"cpu": 16000, "memory": 32 * GI}, Decimal(1), TOPOLOGIES[0], ratio=Fraction(1), real=REAL)
    usage = NodeUsage(shared={"cpu": 0, "memory": 0})
    demand = PodDemand("p", {"cpu": 1000, "memory": GI}, None, False)
    scores = {}
    for age in (config.max_age_seconds, config.max_age_seconds + 1):
        facts = load_facts(node, NodeHeat(NodeLoad(12000.0, 12000.0, 8.0 * GI, NOW - age), NOW))
        table = NodeTable()
        table.put("n", node, usage, facts)
        slots, _ = table.slots(["n"])
        scores[age] = score_on(node, usage, facts, Ask.of(demand, config), NOW, NOW)
        assert [scores[age]] == rank(table, slots, demand, config, NOW, load_aware=True), age
    assert scores == {config.max_age_seconds: combined_score(node_score(node, usage, demand, NOW), load_score_after(
        12000.0 + 850, 8.0 * GI + 0.7 * GI, 16000, 64 * GI), config),
        config.max_age_seconds + 1: node_score(node, usage, demand, NOW)}
    assert scores[config.max_age_seconds] != scores[config.max_age_seconds + 1]


def test_the_free_room_follows_the_view_of_the_node_it_is_asked_for():
    """One usage snapshot is read under each new view of its node (the node webhook oversold its
    allocatable anew): the room it leaves is remembered per view, never carried over to another."""
    usage = NodeUsage(shared={"cpu": 1000, "memory": GI}, bound_cpus={0, 1})
    small = NodeView("n", {"cpu": 8000, "memory": 8 * GI}, Decimal("1.5"), TOPOLOGIES[0], ratio=Fraction(3, 2),
                     real=REAL)
    assert free(small, usage) == (8000 - 1000 - 3000, 7 * GI)
    grown = replace(small, allocatable={"cpu": 16000, "memory": 16 * GI})
    assert free(grown, usage) == (16000 - 1000 - 3000, 15 * GI)
    assert free(small, usage) == (4000, 7 * GI)


def test_a_nodes_row_holds_its_free_room_and_cores_and_a_removed_nodes_row_goes_to_the_next_node():
    """The columns the vectors read are the node's own figures: the oversold room its Pods leave,
    and per NUMA zone its free CPUs and whole free cores. (A column left at 0 would not change an
    answer, only send every node down the node-by-node path, as slow as before the table.) Nodes
    come and go all day under an autoscaler: a removed node's row goes to the next one, so the
    table does not grow with the churn."""
    view = NodeView("n", {"cpu": 24000, "memory": 64 * GI}, Decimal("1.5"), TOPOLOGIES[2], ratio=Fraction(3, 2),
                    real=REAL)  # 2 zones x 4 cores x 2 threads
    # CPUs 0, 8 (one whole core) and 1 taken in zone 0, 5 in zone 1: each bound CPU costs 1.5.
    usage = NodeUsage(shared={"cpu": 3000, "memory": 8 * GI}, bound_cpus={0, 1, 5, 8})
    table = NodeTable()
    table.put("n", view, usage, None)
    [slot], _ = table.slots(["n"])
    assert (table.free_cpu[slot], table.free_memory[slot], table.allocatable_cpu[slot]) == (15000, 56 * GI, 24000)
    assert (table.cpus[slot], table.threads[slot], table.zones[slot]) == (16, 2, 2)
    assert (table.free_max[slot], table.free_sum[slot]) == (7, 12)
    assert (table.whole_max[slot], table.whole_sum[slot]) == (3, 5)
    removed = []
    for wave in range(3):
        names = [f"wave{wave}-{index}" for index in range(10)]
        for name in names:
            table.put(name, replace(view, name=name), usage, None)
        removed += table.slots(names)[0].tolist()
        for name in names:
            table.remove(name)
    assert len(table) == 1 and len(table.rows) == 11
    with pytest.raises(KeyError, match="vacant"):
        table.row(removed[-1])


def test_a_table_grown_past_its_first_rows_keeps_every_nodes_figures():
    """The columns start with room for 64 nodes and double as nodes join: the nodes already in
    them keep their figures (a hot node stays filtered, a busy one scores low) on a cluster of
    hundreds of nodes."""
    config = LoadConfig()
    pod = PodDemand("p", {"cpu": 1000, "memory": GI}, None, False)
    table = NodeTable()
    names = [f"n{index}" for index in range(200)]
    for index, name in enumerate(names):
        view = NodeView(name, {"cpu": 32000, "memory": 64 * GI}, Decimal(1), Topology.flat(16), real=REAL)
        busy = 12000.0 if index % 50 == 0 else 1600.0  # 75% of the real 16 cores, or 10%
        load = NodeLoad(busy, busy, 8 * GI, NOW - 5)
        table.put(name, view, NodeUsage(), load_facts(view, NodeHeat(load, NOW)))
    slots, _ = table.slots(names)
    hot = "cpu usage 75% of real capacity (5-min average) is above the scheduling watermark 65%"
    assert screen(table, slots, pod, config, NOW, load_aware=True) == [
        hot if index % 50 == 0 else None for index in range(200)]
    scores = rank(table, slots, pod, config, NOW, load_aware=True)
    assert max(scores[index] for index in range(0, 200, 50)) < min(
        score for index, score in enumerate(scores) if index % 50)


@pytest.mark.parametrize("pod_policy", [None, "FullPCPUs", "SpreadByPCPUs"])
def test_the_batch_filter_and_score_answer_as_node_by_node_at_every_edge_of_the_room(pod_policy):
    """The edges the test above draws at random, every one of them: the room a node has left is
    exactly what the Pod takes (shared, or its whole CPUs at the node's ratio plus its RuntimeClass
    overhead), or a millicore less or more; on each topology, with none, some or most of its
    CPUs bound, under each binding policy and strategy of the node."""
    for cpus, overhead, single_numa in itertools.product([1, 2, 4], [0, 250], [False, True]):
        demand = PodDemand("p", {"cpu": cpus * 1000 + overhead, "memory": GI}, pod_policy, single_numa, cpus=cpus)
        nodes = []
        for index, (topology, node_policy, strategy, ratio, bound, left) in enumerate(itertools.product(
                TOPOLOGIES, [None, "FullPCPUs", "SpreadByPCPUs"], ["MostAllocated", "LeastAllocated"],
                [Fraction(1), Fraction(3, 2)], [set(), {0, 1, 8}, set(range(12))], [-1, 0, 1])):
            view = NodeView(f"n{index}", {"cpu": 32000, "memory": 32 * GI},
                            Decimal(ratio.numerator) / ratio.denominator, topology, bind_policy=node_policy,
                            strategy=strategy, ratio=ratio, real=REAL)
            taken = bound_charge(view, cpus) + overhead if demand.binding_on(view) else cpus * 1000 + overhead
            shared = 32000 - bound_charge(view, len(bound)) - taken - left
            nodes.append((view, NodeUsage(shared={"cpu": shared, "memory": 0}, bound_cpus=set(bound))))
        table = NodeTable()
        for view, usage in nodes:
            table.put(view.name, view, usage, None)
        slots, _ = table.slots([view.name for view, _ in nodes])
        reasons = [shortfall(view, usage, demand, NOW) for view, usage in nodes]
        assert screen(table, slots, demand, LoadConfig(), NOW, load_aware=False) == reasons
        assert rank(table, slots, demand, LoadConfig(), NOW, load_aware=False) == [
            0 if reason else node_score(view, usage, demand, NOW)
            for (view, usage), reason in zip(nodes, reasons, strict=True)]


def test_a_node_whose_kubelet_has_not_reported_its_cpu_yet_takes_no_cpu_and_scores_lowest():
    """A Node registers before its kubelet posts allocatable: a missing cpu is none, not an error."""
    table = NodeTable()
    young = NodeView("young", {"memory": 32 * GI}, Decimal(1), Topology.flat(16))
    table.put("young", young, NodeUsage(), None)
    slots, _ = table.slots(["young"])
    asks_cpu = PodDemand("p", {"cpu": 1000, "memory": GI}, None, False)
    assert screen(table, slots, asks_cpu, LoadConfig(), NOW, load_aware=False) == [
        "cpu: 1 requested, 0 free on young (oversold allocatable)"]
    memory_only = PodDemand("p", {"memory": GI}, None, False)
    assert screen(table, slots, memory_only, LoadConfig(), NOW, load_aware=False) == [None]
    assert rank(table, slots, memory_only, LoadConfig(), NOW, load_aware=False) == \
        [node_score(young, NodeUsage(), memory_only, NOW)] == [0]


def test_a_nominated_pod_holds_its_cpuset_or_while_its_victims_stay_what_it_will_cost():
    # 16 real cores oversold 1.5 (24 in all); the victims of a preemption still hold cores 0-9.
    node, usage = view(ratio=Fraction(3, 2)), NodeUsage(bound_cpus=set(range(10)))
    vip = PodDemand("vip", {"cpu": 4000, "memory": GI}, "FullPCPUs", False, cpus=4, priority=100)
    held = with_nominated(node, usage, [vip])
    assert held.bound_cpus == set(range(14)) and held.shared == {} and held.bound_memory == GI
    # It needs 8 and only 6 are free yet: the cores are not its to hold, but 8 x 1.5 of the pool are.
    big = replace(vip, uid="big", requests={"cpu": 8000, "memory": GI}, cpus=8)
    held = with_nominated(node, usage, [big])
    assert held.bound_cpus == set(range(10)) and held.shared == {"cpu": 12000}
    low = PodDemand("low", {"cpu": 2000, "memory": GI}, None, False, priority=0)
    assert crowded_out(node, usage, low, [big], NOW) == (
        "cpu: 2 requested, 0 free on n (oversold allocatable), with room kept for 1 Pod(s) nominated there")
    assert crowded_out(node, usage, replace(low, priority=100), [big], NOW) is not None, "equal priority waits"
    assert crowded_out(node, usage, replace(low, priority=101), [big], NOW) is None, "a higher one does not"


def test_a_preemption_adds_the_fewest_lower_priority_victims_the_extenders_charge_needs():
    # 16 real cores oversold 1.5 (24): a Pod of higher priority holds 4 whole cores (6 charged),
    # five shared Pods 12 more. kube-scheduler counts 4 + 12 of 24 for vip (8 exclusive CPUs) and
    # evicts "a" alone (8 free by its count); the extender charges vip 12 and finds 6 + 4 free.
    node = view(ratio=Fraction(3, 2))
    vip = PodDemand("vip", {"cpu": 8000, "memory": GI}, "FullPCPUs", False, cpus=8, priority=100)

    def pod(uid: str, cpu: int, priority: int = 0, bound_at: float | None = None, cpus: tuple[int, ...] = (),
            evictable: bool = True) -> HeldPod:
        return HeldPod(uid, {"cpu": cpu, "memory": GI}, cpus, priority, bound_at, evictable)

    held = [pod("keeper", 4000, priority=1000, cpus=(0, 1, 2, 3)), pod("a", 4000), pod("old", 2000, bound_at=50),
            pod("new", 2000, bound_at=100), pod("c", 2000, priority=10), pod("binding", 2000, evictable=False)]
    config = LoadConfig()
    # Without "a" vip is 2 short; evicting every other Pod of lower priority frees 6 more. Given back,
    # the most important first: c (priority 10), then of two at priority 0 the one bound earlier.
    # The bind in flight is no victim: kube-scheduler cannot find it on the node.
    assert preemption_on(node, held, ["a"], vip, None, config, NOW, False) == Preemption(added=("new",))
    assert preemption_on(node, held, ["a", "old", "new"], vip, None, config, NOW, False) == Preemption()
    # A node above its scheduling watermark is worth no preemption where placement is load-aware.
    hot = NodeHeat(node_load(steady(12000)), NOW)  # 75% of its 16 real cores
    refused = preemption_on(node, held, ["a"], vip, hot, config, NOW, True).refused
    assert refused is not None and refused.startswith("cpu usage 75% of real capacity")
    assert preemption_on(node, held, ["a"], vip, hot, config, NOW, False) == Preemption(added=("new",))
    # A node where kube-scheduler's own plugins need no victim comes with none (kubernetes#135486):
    # the extender picks them all. "a" (bound at an unknown, earlier time) goes before "old".
    assert preemption_on(node, held, [], vip, None, config, NOW, False) == Preemption(added=("new", "a"))
    # No Pod of lower priority to add, or not enough even with all of them gone: refused, with why.
    assert preemption_on(node, held, ["a"], replace(vip, priority=0), None, config, NOW, False) == Preemption(
        refused="cpu: 12 charged for its exclusive CPUs, 10 free on n (oversold allocatable)")
    bigger = replace(vip, requests={"cpu": 12000, "memory": GI}, cpus=12)
    refused = preemption_on(node, held, ["a"], bigger, None, config, NOW, False).refused
    assert refused == "cpu: 18 charged for its exclusive CPUs, 16 free on n (oversold allocatable), even with its 3 " \
        "other Pod(s) of lower priority evicted too"
    # A Pod nominated there ahead of vip keeps its room: more victims make it, where they can.
    ahead = PodDemand("ahead", {"cpu": 2000, "memory": GI}, None, False, priority=200)
    assert preemption_on(node, held, ["a"], vip, None, config, NOW, False, [ahead]) == Preemption(
        added=("new", "old"))


def test_a_preemption_gives_back_first_the_victims_that_would_break_a_disruption_budget():
    """As kube-scheduler's SelectVictimsOnNode: kube-scheduler's own victims spend the budgets
    first, the Pods that would then break one are given back first, and each added victim that
    still breaks one is counted for kube-scheduler to weigh candidate nodes by."""
    node = view(ratio=Fraction(3, 2))
    vip = PodDemand("vip", {"cpu": 8000, "memory": GI}, "FullPCPUs", False, cpus=8, priority=100)

    def pod(uid: str, priority: int = 0, bound_at: float | None = None, app: str = "web",
            cpus: tuple[int, ...] = (), cpu: int = 2000) -> HeldPod:
        return HeldPod(uid, {"cpu": cpu, "memory": GI}, cpus, priority, bound_at, namespace="shop", name=uid,
                       labels={"app": app})

    # As in the test above: with "a" gone vip is 2 cores' charge short; c, old or new frees it.
    held = [pod("keeper", 1000, app="keeper", cpus=(0, 1, 2, 3), cpu=4000), pod("a", app="a", cpu=4000),
            pod("old", bound_at=50, app="old"), pod("new", bound_at=100, app="new"), pod("c", 10, app="c"),
            replace(pod("binding", app="binding"), evictable=False)]
    config = LoadConfig()

    def budget(allowed: int, *apps: str, disrupted: tuple[str, ...] = ()) -> DisruptionBudget:
        return disruption_budget({"metadata": {"namespace": "shop", "name": "b"},
                                  "spec": {"selector": {"matchExpressions": [
                                      {"key": "app", "operator": "In", "values": list(apps)}]}},
                                  "status": {"disruptionsAllowed": allowed,
                                             "disruptedPods": dict.fromkeys(disrupted, "2026-11-26T00:00:00Z")}})

    def preempt(*budgets: DisruptionBudget) -> Preemption:
        return preemption_on(node, held, ["a"], vip, None, config, NOW, False, budgets=budgets)

    assert preempt() == Preemption(added=("new",))
    # "new" may not go: "old" goes instead, nothing broken.
    assert preempt(budget(0, "new")) == Preemption(added=("old",))
    # Neither may: "c", though more important, breaks nothing.
    assert preempt(budget(0, "old", "new")) == Preemption(added=("c",))
    # One of the two may: the more important ("old") spends it and "new", which would break it, stays.
    assert preempt(budget(1, "old", "new")) == Preemption(added=("old",))
    # kube-scheduler's own victim "a" spends the one disruption first: "new" would break it.
    assert preempt(budget(1, "a", "new")) == Preemption(added=("old",))
    # Every candidate is covered: one must go all the same, and it is counted.
    assert preempt(budget(0, "old", "new", "c")) == Preemption(added=("new",), violations=1)
    # Already being disrupted (status.disruptedPods): not counted again; another namespace's
    # budget, or one in this namespace for other Pods, covers nothing here.
    assert preempt(budget(0, "new", disrupted=("new",))) == Preemption(added=("new",))
    elsewhere = replace(budget(0, "old", "new", "c"), namespace="other")
    assert preempt(elsewhere, budget(0, "keeper")) == Preemption(added=("new",))
    # A Pod without labels is covered by no budget, as kube-scheduler counts them.
    held = [replace(p, labels={}) for p in held]
    assert preempt(budget(0, "old", "new", "c")) == Preemption(added=("new",))


def test_a_disruption_budget_reads_as_kube_scheduler_reads_it():
    shop = {"namespace": "shop", "name": "web"}
    assert disruption_budget({"metadata": shop, "spec": {"selector": {"matchLabels": {"app": "web"}}}}) == \
        DisruptionBudget("shop", {"matchLabels": {"app": "web"}}, 0), "no status yet: nothing allowed"
    # A missing or empty selector covers no Pod in preemption (an eviction reads empty as every Pod).
    for spec in ({}, {"selector": None}, {"selector": {}}, {"selector": {"matchLabels": {}}}, {"selector": "x"}):
        assert disruption_budget({"metadata": shop, "spec": spec}) is None
    for garbage in (None, [], {"metadata": shop}, {"metadata": "x", "spec": {"selector": {"matchLabels": {"a": "b"}}}}):
        assert disruption_budget(garbage) is None
    odd = disruption_budget({"metadata": shop, "spec": {"selector": {"matchLabels": {"a": "b"}}},
                             "status": {"disruptionsAllowed": "2", "disruptedPods": []}})
    assert odd is not None and odd.allowed == 0 and odd.disrupted == frozenset()


def test_the_table_keeps_a_single_numa_node_to_one_zone():
    """A FullPCPUs Pod on a node labelled single-numa-node needs all its cores in one zone, even
    when the zones together have enough (3 + 3 whole cores free, 4 asked)."""
    node = NodeView("n", {"cpu": 32000, "memory": 32 * GI}, Decimal(1), TOPOLOGIES[2], bind_policy="FullPCPUs",
                    single_numa=True, real=REAL)
    usage = NodeUsage(bound_cpus={0, 4})
    table = NodeTable()
    table.put("n", node, usage, None)
    slots, _ = table.slots(["n"])
    demand = PodDemand("p", {"cpu": 8000, "memory": GI}, None, False, cpus=8)
    assert screen(table, slots, demand, LoadConfig(), NOW, load_aware=False) == \
        ["needs 4 full cores in one NUMA node; NUMA node 0 has 3 free, NUMA node 1 has 3 free"]
    assert rank(table, slots, demand, LoadConfig(), NOW, load_aware=False) == [0]
    table.put("n", replace(node, single_numa=False), usage, None)
    assert screen(table, slots, demand, LoadConfig(), NOW, load_aware=False) == [None]


def test_workload_history_names_pods_as_the_extender_names_the_pod_being_placed():
    # kube-state-metrics: each Pod's controller, and the controllers' own controllers.
    owners = {("shop", "web-5d8f9-a"): ("ReplicaSet", "web-5d8f9"), ("shop", "canary-7c9b4-b"): ("ReplicaSet",
              "canary-7c9b4"), ("shop", "db-0"): ("StatefulSet", "db"), ("batch", "nightly-29000000-c"): ("Job",
              "nightly-29000000"), ("batch", "migrate-d"): ("Job", "migrate")}
    controllers = {("shop", "ReplicaSet", "web-5d8f9"): ("Deployment", "web"),
                   ("shop", "ReplicaSet", "canary-7c9b4"): ("Rollout", "canary"),
                   ("batch", "Job", "nightly-29000000"): ("CronJob", "nightly")}
    named = pod_workloads(owners, controllers)
    assert named == {("shop", "web-5d8f9-a"): "shop/Deployment/web", ("shop", "canary-7c9b4-b"): "shop/Rollout/canary",
                     ("shop", "db-0"): "shop/StatefulSet/db", ("batch", "nightly-29000000-c"): "batch/CronJob/nightly",
                     ("batch", "migrate-d"): "batch/Job/migrate"}
    history = {workload: WorkloadUsage(100.0 * n, 2.0**20, 1) for n, workload in enumerate(sorted(named.values()), 1)}
    for live in ("shop/Deployment/web", "shop/Rollout/canary", "shop/StatefulSet/db", "batch/Job/migrate"):
        assert workload_history(live, history) is history[live]
    # A CronJob's next Job is new to the history: known by its CronJob, in its own namespace only.
    assert workload_history("batch/Job/nightly-29000060", history) is history["batch/CronJob/nightly"]
    assert workload_history("other/Job/nightly-29000060", history) is None
    # A Job not named <cronjob>-<minute>, or of no CronJob the history knows, is not known.
    assert workload_history("batch/Job/nightly-manual", history) is None
    assert workload_history("batch/Job/migrate-29000060", history) is None
    assert workload_history("", history) is None


def test_every_pod_nominated_to_a_node_holds_its_room_each_in_its_way():
    """Several Pods nominated to one node, as after two preemptions: a shared one holds its
    requests; one whose cores are still held by its victims holds its charge, its overhead and its
    memory; one that gets its cpuset now holds those cores (after the cores of those before it),
    its memory and its overhead on the shared pool."""
    # 16 real cores oversold 1.5 (24 in all); the victims still hold cores 0-9 and 1 GiB with them.
    node, usage = view(ratio=Fraction(3, 2)), NodeUsage(bound_cpus=set(range(10)), bound_memory=GI)
    shared = PodDemand("shared", {"cpu": 1500, "memory": 2 * GI}, None, False, priority=100)
    waiting = PodDemand("waiting", {"cpu": 8250, "memory": 3 * GI}, "FullPCPUs", False, cpus=8, priority=100)
    pinned = PodDemand("pinned", {"cpu": 4250, "memory": 4 * GI}, "FullPCPUs", False, cpus=4, priority=100)
    held = with_nominated(node, usage, [shared, waiting, pinned])
    assert held.shared == {"cpu": 1500 + 8 * 1500 + 250 + 250, "memory": 2 * GI}
    assert held.bound_cpus == set(range(14)), "pinned takes 4 of the 6 free cores"
    assert held.bound_memory == GI + 3 * GI + 4 * GI
    assert usage == NodeUsage(bound_cpus=set(range(10)), bound_memory=GI), "the node's own usage is left as it was"
    # A Pod asking for one NUMA node holds its cores in one: zone 0 has two cores left, zone 1 all 8.
    zoned, victims = replace(node, topology=Topology.from_zones({0: 8, 1: 8})), NodeUsage(bound_cpus=set(range(6)))
    one_zone = replace(pinned, single_numa=True)
    assert with_nominated(zoned, victims, [one_zone]).bound_cpus == {*range(6), *range(8, 12)}
    assert with_nominated(zoned, victims, [replace(one_zone, single_numa=False)]).bound_cpus == set(range(10)), \
        "any zone: the cores left in zone 0 first"


def test_room_held_for_replacements_counts_every_other_owners_until_it_expires():
    web, api = "shop/ReplicaSet/web-5d8f9", "shop/ReplicaSet/api-6f7c8"
    node = view(reservations=(Reservation(web, {"cpu": 2000, "memory": GI}, NOW + 60),
                              Reservation(web, {"cpu": 1000, "memory": 2 * GI}, NOW + 120),
                              Reservation(api, {"cpu": 500, "memory": 4 * GI}, NOW + 60)))
    assert node.held_for_others("shop/ReplicaSet/batch-1", NOW) == (3500, 7 * GI), "every other owner's, summed"
    assert node.held_for_others(web, NOW) == (500, 4 * GI), "not its own"
    assert node.held_for_others("", NOW + 60) == (1000, 2 * GI), "a reservation held until now has expired"
    assert node.held_for_others("", None) == (3500, 7 * GI), "no time given: every one counts"
    assert node.holds_for(web, NOW + 119) and not node.holds_for(web, NOW + 120)
    assert not node.holds_for("shop/ReplicaSet/batch-1", NOW) and not node.holds_for("", NOW), \
        "a Pod of no owner, or of another one, has nothing held for it"
    replacement = PodDemand("web-5d8f9-new", {"cpu": 1000, "memory": GI}, None, False, owner=web)
    assert placement_score(node, NodeUsage(), replacement, None, LoadConfig(), now=NOW + 119) == 10, "its room"
    assert placement_score(node, NodeUsage(), replacement, None, LoadConfig(), now=NOW + 120) < 10


def test_the_pods_on_a_node_hold_their_cpusets_memory_and_overhead():
    usage = held_usage([({"cpu": 2250, "memory": GI}, (0, 1)), ({"cpu": 4000, "memory": 2 * GI}, (2, 3, 4, 5)),
                        ({"cpu": 500, "memory": 3 * GI}, ())])
    assert usage.bound_cpus == set(range(6)) and usage.bound_memory == 3 * GI
    assert usage.shared == {"cpu": 250 + 500, "memory": 3 * GI}, "the RuntimeClass overhead draws on the shared pool"


def test_a_pod_fits_to_the_last_byte_and_a_bound_pods_overhead_is_charged_with_its_cpus():
    # 24 cpus and 64Gi oversold; Pods take 18 of them, and 56Gi of shared memory and 4Gi with cpusets.
    node, usage = view(ratio=Fraction(3, 2)), NodeUsage(shared={"cpu": 18000, "memory": 56 * GI}, bound_memory=4 * GI)
    exact = PodDemand("p", {"cpu": 1000, "memory": 4 * GI}, None, False)
    assert shortfall(node, usage, exact, NOW) is None, "4 GiB asked, 4 GiB free"
    assert shortfall(node, usage, replace(exact, requests={"cpu": 1000, "memory": 4 * GI + 1}), NOW) is not None
    bound = PodDemand("b", {"cpu": 4000, "memory": GI}, "FullPCPUs", False, cpus=4)
    assert shortfall(node, usage, bound, NOW) is None, "4 CPUs charged 6 at the ratio, 6 free"
    assert shortfall(node, usage, replace(bound, requests={"cpu": 4250, "memory": GI}), NOW) == \
        "cpu: 6250m charged for its exclusive CPUs, 6 free on n (oversold allocatable)", "and its overhead"
    held = replace(node, reservations=(Reservation("shop/ReplicaSet/web-5d8f9", {"memory": GI}, NOW + 60),))
    assert shortfall(held, usage, exact, NOW) == "memory: 4Gi requested, 3Gi free on n (oversold allocatable)", \
        "room held for another owner's replacement"
    # A ratio lowered under Pods already placed leaves less than nothing: the message says none is free.
    overcommitted = NodeUsage(shared={"cpu": 1000, "memory": 62 * GI}, bound_memory=4 * GI)
    assert shortfall(node, overcommitted, exact, NOW) == "memory: 4Gi requested, 0 free on n (oversold allocatable)"


def test_a_nodes_remembered_answers_hold_for_its_view_alone_and_never_across_owners():
    """``fit_on`` remembers a node's answers per Pod shape, for one view of the node and one usage
    snapshot. A new view of the node on the same snapshot (kube-scheduler sent the Node in full, its
    labels newer than the extender's cache) is judged afresh. On a node holding room for one
    owner's replacement, Pods of one shape but other owners are judged each in turn, at the time
    given; and a Pod that does not fit scores 0 there, though the room was made for it."""
    usage, config = NodeUsage(shared={"cpu": 16000, "memory": 0}), LoadConfig()
    api = PodDemand("p", {"cpu": 6000, "memory": GI}, None, False, cpus=6, owner="shop/ReplicaSet/api-6f7c8")
    ask = Ask.of(api, config)
    assert fit_on(view(), usage, ask, NOW)[0] is None, "shared: 6 of the 24 - 16 = 8 free"
    binding = view(ratio=Fraction(3, 2), bind_policy="FullPCPUs")  # its label asks a cpuset of every Pod
    assert fit_on(binding, usage, ask, NOW)[0] == "cpu: 9 charged for its exclusive CPUs, 8 free on n (oversold " \
                                                  "allocatable)"
    assert fit_on(view(), usage, ask, NOW)[0] is None
    assert usage.summary(Topology.flat(16)).free == {0: 16}
    assert usage.summary(Topology.from_zones({0: 8, 1: 8})).free == {0: 8, 1: 8}, "per topology too"

    web = "shop/ReplicaSet/web-5d8f9"
    held = view(reservations=(Reservation(web, {"cpu": 4000}, NOW + 60),))
    replacement = Ask.of(replace(api, owner=web), config)
    assert fit_on(held, usage, ask, NOW)[0] == "cpu: 6 requested, 4 free on n (oversold allocatable)"
    assert fit_on(held, usage, replacement, NOW)[0] is None
    assert fit_on(held, usage, ask, NOW + 60)[0] is None, "the room held has expired"
    too_big = Ask.of(replace(api, owner=web, requests={"cpu": 9000, "memory": GI}), config)
    assert score_on(held, usage, None, too_big, NOW, NOW) == 0


def test_every_pod_shape_gets_its_own_answer_from_one_node_and_a_known_workload_its_own_estimate():
    """A node's answers are remembered per Pod shape for its usage snapshot: the next Pod of
    another shape is judged afresh. The load score counts the Pod's workload's estimate where it
    is known, its requests' otherwise."""
    node, usage, config = view(), NodeUsage(shared={"cpu": 20000, "memory": 0}), LoadConfig()
    small = PodDemand("small", {"cpu": 1000, "memory": GI}, None, False)
    large = replace(small, uid="large", requests={"cpu": 8000, "memory": GI})
    assert fit_on(node, usage, Ask.of(small, config), NOW)[0] is None
    assert fit_on(node, usage, Ask.of(large, config), NOW)[0] == "cpu: 8 requested, 4 free on n (oversold allocatable)"
    heat = NodeHeat(node_load(steady(4000)), NOW)
    busy, idle = {"cpu": 6000.0, "memory": float(GI)}, {"cpu": 10.0, "memory": float(GI)}
    assert placement_score(node, NodeUsage(), small, heat, config, busy) < \
        placement_score(node, NodeUsage(), small, heat, config, idle), "its workload's history, not its request"
    # A BestEffort Pod fits a node that states no cpu, and packs nothing there.
    assert node_score(replace(node, allocatable={"cpu": 0, "memory": 64 * GI}), NodeUsage(),
                      PodDemand("be", {"cpu": 0, "memory": 0}, None, False), NOW) == 0
