"""The whole-system replay: hand-computed cases in the generic format, the tuning/holdout split,
and a slice of the July Bitbrains trace through the command."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from oversale.budget import HotTimeBudget
from oversale.estimator import CompressionEstimator, OversaleEstimator
from oversale.usage import LoadConfig, WorkloadUsage, pod_estimate
from simulator.policies import (
    band_distance,
    crane_style,
    default_systems,
    katalyst_realtime,
    koordinator_batch,
    ours_requests,
    peer_systems,
    peer_variants,
    vpa_style,
)
from simulator.replay import SLOT, Config, Day, Window, arrival_moments, heat_at, observed_usage, run
from simulator.report import (
    against_peers,
    budget_goal,
    budgets_against_peers,
    hot_days_table,
    hot_time_interval,
    summary,
    variants_against_curve,
    write_report,
)
from simulator.trace import TraceError, attach_peaks, detect_format, read_trace
from tests.conftest import ROOT, SHARED

BITBRAINS = SHARED / "traces" / "bitbrains-rnd-2013-07" / "rnd_2013-07_cpu_mem.csv.gz"
AZURE = SHARED / "traces" / "azure-v1-cpu-100vms"
DAY = 86400
GIB = 2**30


def write_generic(path, rows):
    with path.open("w") as out:
        out.write("workload,timestamp_s,cpu_request_cores,cpu_usage_cores,memory_request_bytes,memory_usage_bytes\n")
        for row in rows:
            out.write(",".join(str(v) for v in row) + "\n")


def replay(tmp_path, rows, **config):
    config.setdefault("holdout_days", 0)  # the hand-computed cases read the whole run, all tuning
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    systems = default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget())
    result = run(read_trace(trace), Config(**config), systems)
    return result, {row["policy"]: row for row in summary(result, systems)}


def no_history(workloads: int) -> Window:
    """A history window with no slots: a day replayed with nothing before it."""
    return Window(np.zeros(0), {"cpu": np.zeros((workloads, 0)), "memory": np.zeros((workloads, 0))},
                  np.zeros((workloads, 0), dtype=bool))


def test_an_over_user_is_raised_and_no_longer_overloads_its_neighbours(tmp_path):
    # Eight days, a sample every 5 minutes. Four workloads each request 8 cores and 32 GiB:
    # three use a steady 1 core and 1 GiB; "hot" uses 9 cores all along, more than it asked for.
    rows = []
    start = 10 * DAY
    for t in range(start, start + 8 * DAY, 300):
        for name in ("a", "b", "c", "hot"):
            rows.append((name, t, 8, 9.0 if name == "hot" else 1.0, 32 * GIB, GIB))
    rows.append(("off", start, 0, 0, GIB, 0))  # a powered-off row is dropped
    result, by_policy = replay(tmp_path, rows, node_cpu_cores=16, node_memory_bytes=256 * GIB)
    assert result.days == [7]

    # No right-sizing: 4 x 8 cores on 16-core nodes -> 2 nodes; hot's node carries 9 + 1 = 10 cores.
    assert by_policy["none"]["nodes_per_day"] == 2
    # Ours: hot's demand is its peak 9 x 1.05 = 9.45 cores, so its request is *raised* (ratio
    # below 1) and it never runs above it; the quiet ones drop to about 1.05 cores. All four
    # (9.5 + 3 x 1.05 = 12.7 cores) fit one node, where they use 12 of 16 cores: no violation.
    pods = by_policy["oversale-pods"]
    assert pods["nodes_per_day"] == 1 and pods["capacity_freed"] == 0.5
    assert pods["cpu_violation_rate"] == 0
    assert pods["cpu_above_request"] == 0, "the over-user got its demand"
    # Static ratio 2 gives hot 4 cores against 9 used: above its request in every sample (1 of 4).
    assert by_policy["static-2"]["cpu_above_request"] == 0.25


def test_requests_after_a_quiet_week_remember_the_busy_week_before_it(tmp_path):
    """Fifteen days of one workload requesting 8 cores: 6 cores used in its first week, 1 core in
    its second, 6 again on the scored day (day 14). At the default window (two weeks,
    OVERSALE_COMPRESSION_WINDOW) its request still covers the busy week and the day never runs above
    it; a one-week window sees only the quiet week and sets it near 1 core, under the day's use in
    every sample. Crane-style reads its own 7 days either way."""
    rows = []
    start = 10 * DAY
    for t in range(start, start + 15 * DAY, 300):
        rows.append(("app", t, 8, 1.0 if start + 7 * DAY <= t < start + 14 * DAY else 6.0, GIB, GIB // 2))
    for window, above in ((None, 0), (7, 1)):
        config = {"warmup_days": 14} | ({} if window is None else {"request_window_days": window})
        result, by_policy = replay(tmp_path, rows, node_cpu_cores=16, node_memory_bytes=256 * GIB, **config)
        assert result.days == [14]
        assert by_policy["oversale-pods"]["cpu_above_request"] == above, f"window {window or 'default'}"
        assert by_policy["crane-style"]["cpu_above_request"] == 1, "Crane: P99 of its last 7 days x 1.15"
    assert result.last_day["crane-style"]["requests"]["app"]["cpu"][1] == pytest.approx(1150, abs=1)


def test_node_ratios_read_their_own_week_of_the_two_the_requests_read(tmp_path):
    """The replay keeps two weeks before each day for the requests; a node policy is handed only
    the last ``window_days`` (OVERSALE_HISTORY_WINDOW, a week), as the live node reconciler reads."""
    from simulator.policies import System, no_compression

    seen: list[float] = []

    def probe(resource, capacity, requested, times, values, current):
        seen.append(float(times.min()))
        return 1.0

    rows = [("app", t, 8, 1.0, GIB, GIB // 2) for t in range(10 * DAY, 25 * DAY, 300)]
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    probing = [System("probe", "", no_compression, probe)]
    result = run(read_trace(trace), Config(warmup_days=14, holdout_days=0), probing)
    assert result.days == [14] and seen
    assert min(seen) == 17 * DAY, "the week before day 14 (the trace starts on day 10), not the two"


def test_a_workload_requesting_no_cpu_still_loads_its_node(tmp_path):
    """A BestEffort Pod (or one requesting memory only) asks the scheduler for no cpu, so it fits
    beside anything, and uses cores there all the same. "app" requests 8 of a 16-core node and
    uses 6; "batch" requests no cpu and uses 12: packed onto app's node, they use 18 cores in
    every sample. No right-sizing of ours gives batch a cpu request (the webhook scales requests,
    it adds none), so ours packs them together too."""
    rows = []
    start = 10 * DAY
    for t in range(start, start + 8 * DAY, 300):
        rows += [("app", t, 8, 6.0, GIB, GIB // 2), ("batch", t, 0, 12.0, GIB, GIB // 2)]
    rows.append(("idle", start, 0, 0.0, 0, 0))  # requests nothing and uses nothing: not running
    result, by_policy = replay(tmp_path, rows, node_cpu_cores=16, node_memory_bytes=256 * GIB)
    assert by_policy["none"]["nodes_per_day"] == 1
    assert by_policy["none"]["cpu_violation_rate"] == 1, "app's node carries batch's 12 cores too"
    assert by_policy["oversale-pods"]["cpu_violation_rate"] == 1
    assert result.last_day["oversale-pods"]["requests"]["batch"]["cpu"][1] == 0
    assert "idle" not in result.last_day["oversale-pods"]["requests"]


def test_node_overselling_closed_loop_hand_computed(tmp_path):
    # Eight days; six workloads each request 8 cores and 1 GiB and use 0.5 GiB. "hot1" and "hot2" use
    # 7 cores (7.6 on the scored day), "q1".."q4" use 1 core. Nodes of 16 cores.
    rows = []
    start = 10 * DAY
    for t in range(start, start + 8 * DAY, 300):
        for name in ("hot1", "hot2", "q1", "q2", "q3", "q4"):
            usage = (7.6 if t >= start + 7 * DAY else 7.0) if name.startswith("hot") else 1.0
            rows.append((name, t, 8, usage, GIB, GIB // 2))
    _, by_policy = replay(tmp_path, rows, node_cpu_cores=16, node_memory_bytes=256 * GIB)

    # Without overselling: 48 cores of requests, two per 16-core node -> 3 nodes.
    assert by_policy["none"]["nodes_per_day"] == 3
    # Ours: hot1 arrives, 1 x 8 / 7 -> ratio 1.14 (18.24 cores). hot2 joins: 16 / 14 -> 1.14, so q1
    # (24 > 18.24) opens a node: 8 / 1 -> the maximum 5; q2..q4 join it. Two nodes; the hot node
    # carries 15.2 <= 16 cores on the scored day.
    nodes = by_policy["oversale-nodes"]
    assert nodes["nodes_per_day"] == 2
    assert nodes["capacity_freed"] == pytest.approx(1 / 3, abs=1e-4)
    assert nodes["cpu_violation_rate"] == 0
    # Static 1.5 gives every node 24 cores: hot1, hot2 and q1 share one, which uses 16.2 cores all
    # day on the scored day: one of the two nodes is over its real capacity in every sample.
    assert by_policy["static-oversale-1.5"]["nodes_per_day"] == 2
    assert by_policy["static-oversale-1.5"]["cpu_violation_rate"] == 0.5
    # Katalyst: hot1 alone gives ((9.6 - 7) / 0.875 + 8) / 16 = 0.69 -> 1, so it packs like ours.
    assert by_policy["katalyst-realtime"]["nodes_per_day"] == 2
    assert by_policy["katalyst-realtime"]["cpu_violation_rate"] == 0


def test_ties_between_equally_scored_nodes_go_to_the_first_or_to_a_seeded_draw(tmp_path):
    """Two workloads of 10 requested cores each open a 16-core node of their own; two of 3 cores
    then score the same on both (6 cores free on each). "a-hot" uses all its 10 cores, "b-cool" 2,
    the small ones 3.5 each: beside a-hot they make 17 cores, one of the two nodes hot all day;
    beside b-cool, 9. The replay's placement gives ties to the first node; a placement seed draws
    among them as kube-scheduler does, so the seeds between them place both ways, each seed the
    same way every time."""
    rows = []
    start = 10 * DAY
    for t in range(start, start + 8 * DAY, 300):
        rows += [("a-hot", t, 10, 10.0, GIB, GIB // 2), ("b-cool", t, 10, 2.0, GIB, GIB // 2),
                 ("c-small", t, 3, 3.5, GIB, GIB // 2), ("d-small", t, 3, 3.5, GIB, GIB // 2)]

    def hot_time(seed):
        _, by_policy = replay(tmp_path, rows, node_cpu_cores=16, node_memory_bytes=256 * GIB, placement_seed=seed)
        assert by_policy["none"]["nodes_per_day"] == 2
        return by_policy["none"]["cpu_violation_rate"]

    assert hot_time(None) == 0.5, "the small ones join the first node, a-hot's"
    drawn = {seed: hot_time(seed) for seed in range(1, 9)}
    assert set(drawn.values()) == {0.0, 0.5}, drawn
    assert all(hot_time(seed) == drawn[seed] for seed in (1, 2, 3))


def test_a_seeded_placement_draws_uniformly_among_the_best_scoring_nodes_only():
    """kube-scheduler's selectHost: each of the nodes tied at the best score equally likely, never
    one scoring less. Pods of 16, 12, 12, 12 and 10 requested cores open a 16-core node each; a
    1-core Pod then fits four of them, and the three at 12 cores tie at the best score (the
    requests-only score packs), the one at 10 scores less. Over 600 placement seeds each of the
    three takes it about a third of the time."""
    from simulator.policies import System, no_compression
    from simulator.replay import place

    slots = DAY // SLOT
    start = 30 * DAY
    cores = [16, 12, 12, 12, 10, 1]
    usage = {"cpu": np.full((len(cores), slots), 100.0), "memory": np.full((len(cores), slots), float(GIB))}
    present = np.ones((len(cores), slots), dtype=bool)
    window = Window(start - SLOT * np.arange(slots, 0, -1), usage, present)
    day = Day(30, start, np.arange(slots), {"cpu": np.array(cores) * 1000.0, "memory": np.full(len(cores), float(GIB))},
              usage, present, window, "tuning")
    system, real = System("requests as written", "", no_compression), (16_000.0, 64.0 * GIB)
    assert place(day, system, real).assignment.tolist() == [0, 1, 2, 3, 4, 1], "unseeded: the first of the best"
    drawn = [int(place(day, system, real, placement_seed=seed).assignment[-1]) for seed in range(600)]
    shares = {node: drawn.count(node) / len(drawn) for node in set(drawn)}
    assert set(shares) == {1, 2, 3} and all(0.2 < share < 0.47 for share in shares.values()), shares


def test_the_last_days_are_the_holdout_and_reported_apart(tmp_path):
    # Ten days; on the last one both workloads go from 2 to 5 cores.
    rows = []
    start = 3 * DAY
    for t in range(start, start + 10 * DAY, 300):
        for name in ("a", "b"):
            rows.append((name, t, 8, 5.0 if t >= start + 9 * DAY else 2.0, GIB, GIB // 2))
    result, by_policy = replay(tmp_path, rows, node_cpu_cores=8, holdout_days=1)
    assert result.days == [7, 8, 9]
    assert result.splits == {7: "tuning", 8: "tuning", 9: "holdout"}
    ours = by_policy["oversale"]
    # Packed onto one 8-core node by the history of 2 + 2 cores, the last day (10 cores) overloads it:
    # in the holdout only.
    assert ours["tuning"]["cpu_violation_rate"] == 0
    assert ours["holdout"]["cpu_violation_rate"] == 1.0
    assert ours["cpu_violation_rate"] == pytest.approx(1 / 3, abs=1e-4)


def test_a_day_the_trace_ends_in_counts_only_the_time_it_observed(tmp_path):
    """A trace that ends at noon (an export cut short, a retention edge): the last day's afternoon
    holds no sample. Counted, its empty slots read as node-time below capacity, and halved the hot
    time of a holdout overloaded in every sample observed."""
    rows = []
    start = 3 * DAY
    for t in range(start, start + 9 * DAY + DAY // 2, 300):
        for name in ("a", "b"):
            rows.append((name, t, 8, 5.0 if t >= start + 9 * DAY else 2.0, GIB, GIB // 2))
    result, by_policy = replay(tmp_path, rows, node_cpu_cores=8, holdout_days=1)
    assert result.days == [7, 8, 9]
    ours = by_policy["oversale"]
    assert ours["holdout"]["cpu_violation_rate"] == 1.0
    # 144 hot node-samples of 288 + 288 + 144.
    assert ours["cpu_violation_rate"] == pytest.approx(144 / 720, abs=1e-4)
    # One node a day, the half day counted as half a node-day: still one node per day.
    assert ours["holdout"]["nodes_per_day"] == 1
    assert [(d["day"], d["node_samples"], d["cpu_hot_samples"]) for d in result.daily["oversale"]] == \
        [(7, 288, 0), (8, 288, 0), (9, 144, 144)]


def test_a_holdout_that_takes_every_replayed_day_is_refused_and_an_empty_split_is_said(tmp_path):
    # Ten days: seven of warm-up leave three to replay. The default 14-day holdout would take all
    # three and leave the tuning tables as rows of 0%, which read like "nothing freed".
    rows = [(name, t, 8, 2.0, GIB, GIB // 2) for t in range(0, 10 * DAY, 300) for name in ("a", "b")]
    with pytest.raises(TraceError) as refused:
        replay(tmp_path, rows, node_cpu_cores=8, holdout_days=14)
    assert str(refused.value) == ("the trace spans 10 days: after the 7-day warm-up 3 are replayed, and a 14-day "
                                  "holdout takes them all, leaving no tuning day; pass --holdout-days 1 (half of "
                                  "them) or fewer, or a longer trace")
    with pytest.raises(TraceError, match="no tuning day"):
        replay(tmp_path, rows, node_cpu_cores=8, holdout_days=3)

    # No holdout (--holdout-days 0): the report says so instead of a table of zeros.
    systems = default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget())
    result, _ = replay(tmp_path, rows, node_cpu_cores=8)
    data = write_report(tmp_path / "report", summary(result, systems), result, tmp_path / "trace.csv",
                        Config(node_cpu_cores=8, holdout_days=0))
    assert data["tuning_days"] == [7, 8, 9] and data["holdout_days"] == []
    report = (tmp_path / "report" / "report.md").read_text()
    # The report says which history each estimate read: two weeks for requests, one for node ratios.
    assert "requests come only from the 14 days before it" in report
    assert "node ratios from the 7 days before it" in report
    holdout = report.split("## Holdout days", 1)[1].split("\n## ", 1)[0]
    assert "None: the replay has no holdout days (`--holdout-days 0`)" in holdout
    assert "| system |" not in holdout
    sweep = report.split("## The budget sweep", 1)[1]
    assert sweep.split("| 0.10% | ", 1)[1].split("\n")[0].endswith("| - | - | - |")
    assert list(data["budget_goal"]) == ["tuning"], "no verdict for the holdout it does not have"
    assert "**The goal on the tuning days**: of the 5 budgets from 0.05% to 1%" in sweep
    assert "The goal on the holdout days" not in sweep


def test_the_goal_says_which_budgets_kept_their_band_on_each_placement():
    """The sweep's goal: 0.05% to 1% each kept within 0.5x..1.5x, read on the report's placement,
    and on how many of the placements replayed; 0.01% and 5% are outside the goal's range."""
    def curve(*rates):
        budgets = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)
        return [{"hot_time_budget": b, "holdout": {"cpu_violation_rate": r}}
                for b, r in zip(budgets, rates, strict=True)]
    report = curve(0.01, 0.0017, 0.0023, 0.0027, 0.0053, 0.0054, 0.04)
    other = curve(0.0, 0.0003, 0.0014, 0.0031, 0.0044, 0.0049, 0.04)
    goal = budget_goal(report, "holdout", [report, other])
    assert goal["kept"] == [0.002, 0.005, 0.01] and goal["missed"] == [0.0005, 0.001]
    by_budget = {v["hot_time_budget"]: v for v in goal["budgets"]}
    assert by_budget[0.0005]["times_budget"] == pytest.approx(3.4)
    # 0.2%: 1.35x here, 1.55x on the other; 1%: 0.54x and 0.49x (just under the band).
    assert [by_budget[b]["kept_on_placements"] for b in goal["kept"] + goal["missed"]] == [1, 2, 1, 1, 1]
    assert {v["placements"] for v in goal["budgets"]} == {2}
    assert "placements" not in budget_goal(report, "holdout")["budgets"][0], "one placement: nothing to count"


def test_against_peers_reads_our_curve_at_each_peers_violation_rate():
    def row(policy, family, freed, violation, ours=False):
        figures = {"capacity_freed": freed, "cpu_violation_rate": violation}
        return {"policy": policy, "family": family, "ours": ours, "tuning": figures}
    rows = [row("none", "none", 0.0, 0.02), row("oversale", "oversale", 0.5, 0.04, ours=True),
            row("peer", "peer", 0.3, 0.03), row("greedy", "greedy", 0.6, 0.05), row("safe", "safe", 0.1, 0.01)]
    verdicts = {v["peer"]: v for v in against_peers(rows, "tuning")}
    # Halfway between (2%, 0) and (4%, 50%): 25% at 3%, less than the peer's 30%.
    assert verdicts["peer"]["ours_freed"] == pytest.approx(0.25) and not verdicts["peer"]["matched"]
    # Beyond our riskiest point we are credited only with what that point frees.
    assert verdicts["greedy"]["ours_freed"] == 0.5 and not verdicts["greedy"]["matched"]
    # Below our safest point we have nothing to offer.
    assert verdicts["safe"]["ours_freed"] is None and not verdicts["safe"]["matched"]


def test_at_each_budget_every_peer_family_is_read_at_the_hot_time_we_realised():
    def row(policy, family, freed, violation, budget=None, ours=False):
        figures = {"capacity_freed": freed, "cpu_violation_rate": violation}
        return {"policy": policy, "family": family, "ours": ours, "hot_time_budget": budget, "holdout": figures}
    rows = [row("none", "none", 0.0, 0.02),
            row("oversale budget 0.05%", "oversale", 0.40, 0.001, 0.0005, ours=True),
            row("oversale", "oversale", 0.50, 0.003, 0.001, ours=True),
            row("oversale budget 5.00%", "oversale", 0.70, 0.06, 0.05, ours=True),  # outside the goal's range
            row("oversale-pods", "oversale-pods", 0.45, 0.002, ours=True),  # ours, not a peer
            row("vpa", "vpa", 0.20, 0.002), row("vpa x1", "vpa", 0.60, 0.004),
            row("katalyst", "katalyst", 0.9, 0.1)]
    verdicts = budgets_against_peers(rows, "holdout")
    assert [v["hot_time_budget"] for v in verdicts] == [0.0005, 0.001]
    cool, default = verdicts
    # At 0.1% realised no peer setting is that cool: nobody beats us there.
    assert [(p["family"], p["peer_freed"], p["beaten"]) for p in cool["peers"]] == [("katalyst", None, True),
                                                                                    ("vpa", None, True)]
    assert cool["matched"]
    # At 0.3%: VPA's two settings joined by a line give 40%, less than our 50%; Katalyst is too hot.
    vpa = next(p for p in default["peers"] if p["family"] == "vpa")
    assert vpa["peer_freed"] == pytest.approx(0.40) and vpa["beaten"] and default["matched"]
    rows[2]["holdout"]["capacity_freed"] = 0.35
    assert not budgets_against_peers(rows, "holdout")[1]["matched"]


def test_our_requests_raise_an_over_user_at_most_to_the_minimum_ratio():
    times = np.arange(400, dtype=np.float64) * 300  # 33 h: enough history
    now = float(times[-1]) + 300
    over = {"cpu": (times, np.full(400, 10000.0))}  # 10 cores all along
    request = ours_requests(CompressionEstimator())
    raised = request("cpu", 8000, over, now)
    assert 10000 < raised <= 16000
    assert request("cpu", 4000, over, now) == 8000, "at most 2x (OVERSALE_MIN_RATIO 0.5)"
    week = np.arange(7 * 288 + 1, dtype=np.float64) * 300  # a lowering needs 7 days for full confidence
    idle = {"cpu": (week, np.full(len(week), 100.0))}
    assert request("cpu", 8000, idle, float(week[-1]) + 300) == 1000, "at most 8x lower (OVERSALE_MAX_RATIO 8)"
    assert request("cpu", 8000, {"cpu": (times, np.full(400, 100.0))}, now) > 1000, "33 h: pulled toward 1"


def test_vpa_style_is_the_p90_of_a_histogram_halving_each_day_times_its_margin():
    """The VPA recommender's decaying histogram: ten samples of 1,000m a week ago weigh 2 ** -7
    each, under 1% of one sample of 100m now, so the P90 is the new sample's (x 1.15); with the
    week's samples an hour old instead, they are 90% of the weight and the P90 lands on them."""
    now = 30 * DAY
    week_ago = np.concatenate([np.full(10, now - 7 * DAY), [now - SLOT]])
    hour_ago = np.concatenate([np.full(10, now - 3600.0), [now - SLOT]])
    values = np.concatenate([np.full(10, 1000.0), [100.0]])
    vpa = vpa_style()
    assert vpa("cpu", 4000, {"cpu": (week_ago, values)}, now) == pytest.approx(115.0)
    assert vpa("cpu", 4000, {"cpu": (hour_ago, values)}, now) == pytest.approx(1150.0)
    assert vpa_style(2.0)("cpu", 4000, {"cpu": (week_ago, values)}, now) == pytest.approx(200.0)
    assert vpa("cpu", 4000, {"cpu": (np.zeros(0), np.zeros(0))}, now) == 4000, "no history: the request stands"


def test_crane_style_is_the_p99_of_its_own_seven_days_times_its_margin():
    """P99 with PromQL's interpolation over the last 7 days, whatever the replay keeps: 0..100m
    over the week give 99m (x 1.15); a burst 7 days and 5 minutes ago is not in it, one exactly
    7 days ago is."""
    now = 30 * DAY
    times = now - np.linspace(SLOT, 7 * DAY - SLOT, 101)
    values = np.arange(101, dtype=np.float64)
    crane = crane_style()
    burst = np.full(2, 50_000.0)
    older = {"cpu": (np.append(times, np.full(2, now - 7 * DAY - SLOT)), np.append(values, burst))}
    assert crane("cpu", 4000, older, now) == pytest.approx(99 * 1.15)
    # 103 samples: rank 0.99 x 102 = 100.98, between 100m and the first burst.
    edge = {"cpu": (np.append(times, np.full(2, now - 7 * DAY)), np.append(values, burst))}
    assert crane("cpu", 4000, edge, now) == pytest.approx((100 * 0.02 + 50_000 * 0.98) * 1.15)
    assert crane_style(1.0)("cpu", 4000, older, now) == pytest.approx(99.0)
    only_old = {"cpu": (np.array([now - 8 * DAY]), np.array([50_000.0]))}
    assert crane("cpu", 4000, only_old, now) == 4000, "nothing in its week: the request stands"


def test_katalyst_formula_matches_its_definition():
    # A=32, T=0.6, U=8, R=28: ((19.2 - 8) / max(min(8/28, 1), 0.4) + 28) / 32 = (11.2 / 0.4 + 28) / 32 = 1.75
    assert katalyst_realtime()("cpu", 32, 28, np.array([0.0]), np.array([8.0]), 1.0) == pytest.approx(1.75)
    # No reading yet, or nothing requested on the node: no overselling.
    assert katalyst_realtime()("cpu", 32, 28, np.array([]), np.array([]), 1.0) == 1.0
    assert katalyst_realtime()("cpu", 32, 0, np.array([0.0]), np.array([8.0]), 1.0) == 1.0
    assert katalyst_realtime()("cpu", 32, 0.5, np.array([0.0]), np.array([0.1]), 1.0) > 1


def test_a_budget_system_says_its_budget_unless_told_what_it_stands_for():
    from simulator.policies import budget_system

    def source(**given):
        return budget_system("b", HotTimeBudget(0.002, 0.0001), CompressionEstimator(), OversaleEstimator(), "f",
                             **given).source

    assert source() == "this project at a cpu hot-time budget of 0.200% (memory 0.010%)"
    assert source(source="the default, as shipped") == "the default, as shipped"


def test_koordinator_formula_matches_its_definition():
    # Batch room = A - A x (1 - T) - U = A x T - U beside allocatable A: A=32, U=8, T=0.6 cpu -> (32 + 11.2) / 32.
    koordinator = koordinator_batch()
    assert koordinator("cpu", 32, 28, np.array([0.0]), np.array([8.0]), 1.0) == pytest.approx(1.35)
    # Memory's threshold is 0.65: 64 GiB with 16 used leaves 25.6 GiB of batch room.
    assert koordinator("memory", 64, 60, np.array([0.0]), np.array([16.0]), 1.0) == pytest.approx(1.4)
    # A node used beyond A x T has no batch room; one without a reading has none either.
    assert koordinator("cpu", 32, 28, np.array([0.0]), np.array([25.0]), 1.0) == 1.0
    assert koordinator("cpu", 32, 28, np.array([]), np.array([]), 1.0) == 1.0


@pytest.mark.shared
def test_bad_traces_are_refused_with_a_message(tmp_path):
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="matches no known format"):
        read_trace(wrong)
    with pytest.raises(TraceError, match="missing columns: workload"):
        read_trace(wrong, "generic")
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.csv")
    assert detect_format(BITBRAINS) == "bitbrains-long"
    # An export in milliseconds: refused by its row (the file's line 2), not replayed as a trace 1,000 times as long.
    millis = tmp_path / "millis.csv"
    write_generic(millis, [("w", 1372629804000 + k * 300000, 1, 0.5, GIB, GIB) for k in range(3)])
    with pytest.raises(TraceError) as refused:
        read_trace(millis)
    assert str(refused.value) == (f"{millis}: not a generic trace (row 2: timestamp_s '1372629804000' is not a time "
                                  "in seconds (since the epoch or the trace's start; milliseconds?))")


def test_rows_are_sorted_one_sample_per_slot_the_last_read_wins(tmp_path):
    # Exporters and concatenated files give rows out of order and twice; a powered-off VM (no
    # request) places nothing.
    trace = tmp_path / "trace.csv"
    write_generic(trace, [("w", 2 * SLOT, 1, 0.2, GIB, 1), ("v", SLOT, 2, 1.5, GIB, 7), ("w", 0, 1, 0.1, GIB, 2),
                          ("w", 2 * SLOT + 10, 1, 0.3, GIB, 3), ("w", SLOT, 0, 0.0, 0, 0), ("w", 0, 4, 0.4, GIB, 4)])
    w, v = read_trace(trace)
    assert (w.name, w.slots.tolist(), v.name, v.slots.tolist()) == ("w", [0, 2], "v", [1])
    assert w.request["cpu"].tolist() == [4000, 1000] and w.usage["cpu"].tolist() == [400, 300]
    assert w.usage["memory"].tolist() == [4, 3] and v.usage["memory"].tolist() == [7]


def test_a_trace_sampled_every_minute_replays_each_slots_mean_cpu_and_last_memory(tmp_path):
    """A 1-minute export: each 5-minute slot's cpu is the mean of its five readings, as the live
    account's rate() over 5 minutes reads it, not the last reading alone (one minute in five
    replayed as the slot's load); memory and requests are the slot's last reading, as a gauge is
    read at each step. The command says so."""
    rows = []
    for minute in range(10):
        # One burst minute in each slot, the last one of the first: 4 cores against 0.5 otherwise.
        cpu = 4.0 if minute in (4, 7) else 0.5
        rows.append(("w", minute * 60, 2 if minute < 9 else 3, cpu, GIB, (minute + 1) * 1000))
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    said: list[str] = []
    (w,) = read_trace(trace, progress=said.append)
    assert w.slots.tolist() == [0, 1]
    assert w.usage["cpu"].tolist() == pytest.approx([1200.0, 1200.0])  # (4 x 0.5 + 4) / 5 cores
    assert w.usage["memory"].tolist() == [5000, 10000]
    assert w.request["cpu"].tolist() == [2000, 3000]
    assert any("sampled more often than every 5 minutes" in line and "median interval 60 s" in line
               for line in said), said
    # Read as a trace of peaks (backtest --peaks), each slot's cpu is its highest minute.
    said.clear()
    (peaks,) = read_trace(trace, progress=said.append, peaks=True)
    assert peaks.usage["cpu"].tolist() == [4000.0, 4000.0] and peaks.usage["memory"].tolist() == [5000, 10000]
    assert any("each 5-minute slot's peak is its highest reading" in line for line in said), said


def test_a_trace_sampled_every_15_minutes_holds_each_reading_until_the_next(tmp_path):
    """Two VMs, each with its own clock, read every 15 minutes: "a" at :00, "b" at :05. Both
    request 4 cores and use 5, together on one 8-core node: it is over its capacity all day. Read
    slot by slot, no 5-minute slot held both readings and the node never read hot; each reading
    now stands for the slots until the next, and the command says so."""
    rows = []
    start = 10 * DAY
    for t in range(start, start + 8 * DAY, 900):
        rows += [("a", t, 4, 5.0, GIB, GIB), ("b", t + 300, 4, 5.0, GIB, GIB)]
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    said: list[str] = []
    a, _ = read_trace(trace, progress=said.append)
    assert a.slots[:4].tolist() == [start // SLOT + k for k in range(4)]
    assert any("sampled every 900 s" in line and "held" in line for line in said), said
    _, by_policy = replay(tmp_path, rows, node_cpu_cores=8, node_memory_bytes=64 * GIB)
    assert by_policy["none"]["nodes_per_day"] == 1
    assert by_policy["none"]["cpu_violation_rate"] == 1.0


def test_fixed_resources_name_cpu_or_memory_or_the_row_is_refused(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("workload,timestamp_s,cpu_request_cores,cpu_usage_cores,memory_request_bytes,"
                     "memory_usage_bytes,fixed_resources\n"
                     f"w,0,1,0.5,{GIB},1,cpu\nw,{SLOT},1,0.5,{GIB},1,\nv,0,1,0.5,{GIB},1,cpu memory\n")
    w, v = read_trace(trace)
    assert (w.fixed, v.fixed) == ({"cpu"}, {"cpu", "memory"})
    with trace.open("a") as out:
        out.write(f"u,0,1,0.5,{GIB},1,gpu\n")
    with pytest.raises(TraceError, match=r"row 5: fixed_resources 'gpu' names no resource but cpu and memory"):
        read_trace(trace)


@pytest.mark.parametrize(("usage", "said"), [("nan", "'nan'"), ("-0.5", "'-0.5'"), ("inf", "'inf'"),
                                           ("", "could not convert")])
def test_a_row_with_an_amount_no_machine_reports_is_refused_by_its_number(tmp_path, usage, said):
    trace = tmp_path / "trace.csv"
    write_generic(trace, [("w", slot * SLOT, 1, 0.5, GIB, GIB // 2) for slot in range(3)])
    with trace.open("a") as out:
        out.write(f"w,{3 * SLOT},1,{usage},{GIB},{GIB // 2}\n")
    with pytest.raises(TraceError, match=r"not a generic trace \(row 5: ") as refused:  # the header is row 1
        read_trace(trace)
    assert said in str(refused.value)


@pytest.mark.shared
def test_the_azure_readings_are_percent_of_each_vms_cores():
    path = AZURE / "microsoft_avg_100.csv.gz"
    with gzip.open(path, "rt") as source:
        header = source.readline().strip().split(",")
        first = source.readline().strip().split(",")
        rows = 1 + sum(1 for _ in source)
    assert detect_format(path) == "azure-wide"
    workloads = read_trace(path, vm_cores=2)
    assert [w.name for w in workloads] == header[1:] and rows == 8004
    vm = workloads[0]
    assert vm.slots[0] == 0 and vm.slots[-1] == rows - 1 and len(vm.slots) == rows
    assert vm.usage["cpu"][0] == pytest.approx(float(first[1]) / 100 * 2 * 1000)
    assert set(vm.request["cpu"]) == {2000.0} and not vm.request["memory"].any() and not vm.usage["memory"].any()
    periodic = read_trace(AZURE / "periodic_avg_78.csv.gz", vm_cores=4)
    assert len(periodic) == 78 and all(" " not in w.name for w in periodic), "the period is not part of the name"


def peaks_case(tmp_path):
    """Two workloads requesting 4 cores each, using 3 on average in every slot: the baseline
    packs both on one 8-core node, whose summed averages (6) are never above it. Each peaks at 5
    cores in the first slot of every hour: "a" always, "b" in even hours only (in odd hours its
    peak is the next slot). Summed, the peaks reach 10 cores in 12 slots a day and 8 (not above)
    in the rest of the peak slots. Each hour, the peaks trace has one reading of b below its
    slot's average, and none for another of b's slots."""
    start = 10 * DAY
    rows, peaks = [], []
    for t in range(start, start + 8 * DAY, SLOT):
        hour_slot, even = (t - start) % 3600 // SLOT, (t - start) // 3600 % 2 == 0
        rows += [("a", t, 4, 3.0, GIB, GIB), ("b", t, 4, 3.0, GIB, GIB)]
        peaks.append(("a", t, 4, 5.0 if hour_slot == 0 else 3.0, GIB, GIB))
        if hour_slot != 6:  # no reading: the average stands
            b_peak = 5.0 if hour_slot == (0 if even else 1) else 1.0 if hour_slot == 5 else 3.0
            peaks.append(("b", t, 4, b_peak, GIB, GIB))  # 1.0 is below the average: the average stands
    write_generic(tmp_path / "trace.csv", rows)
    write_generic(tmp_path / "peaks.csv", peaks)
    return tmp_path / "trace.csv", tmp_path / "peaks.csv"


def test_peaks_count_the_hot_time_the_five_minute_averages_hide(tmp_path):
    trace, peaks = peaks_case(tmp_path)
    workloads = read_trace(trace)
    said = attach_peaks(workloads, read_trace(peaks))
    assert said == ("peaks of 2 of 2 workloads, 4,416 of 4,608 workload-slots (the rest count at their "
                    "averages)"), "b has no peak reading in one slot an hour"
    a, b = workloads
    assert a.peak_cpu.max() == 5000 and b.peak_cpu.min() == 3000, "a peak below the average keeps the average"
    assert (b.peak_cpu == 5000).sum() == 8 * 24, "every hour of the 8 days, in one slot"
    systems = default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget())
    result = run(workloads, Config(node_cpu_cores=8, node_memory_bytes=64 * GIB, holdout_days=0), systems)
    by_policy = {row["policy"]: row for row in summary(result, systems)}
    none = by_policy["none"]
    assert none["nodes_per_day"] == 1 and none["cpu_violation_rate"] == 0
    assert none["cpu_violation_rate_at_peaks"] == round(12 / 288, 6), "the even hours' peak slots, 12 of 288"
    for row in by_policy.values():
        assert row["cpu_violation_rate_at_peaks"] >= row["cpu_violation_rate"], row["policy"]
    assert all(day["cpu_hot_samples_at_peaks"] == 12 for day in result.daily["none"])


def test_the_command_reports_the_hot_time_at_the_peaks_and_refuses_peaks_of_other_workloads(tmp_path):
    trace, peaks = peaks_case(tmp_path)
    out = tmp_path / "report"
    command = [sys.executable, "-m", "reconcilers", "backtest", "--trace", str(trace), "--node-cores", "8",
               "--node-memory", "64Gi", "--holdout-days", "0", "--out", str(out)]
    result = subprocess.run([*command, "--peaks", str(peaks)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "peaks of 2 of 2 workloads" in result.stderr
    assert "at peaks 4.167%" in result.stdout
    assert re.search(r"^tuning days \(clairvoyant bound frees \d+\.\d%\):$", result.stdout, re.MULTILINE)
    # No holdout: no figures for it; the last line says where to read the report.
    assert result.stdout.splitlines()[-2:] == ["holdout days: none (--holdout-days 0)", f"report: {out / 'report.md'}"]
    data = json.loads((out / "summary.json").read_text())
    policies = {row["policy"]: row for row in data["policies"]}
    assert policies["none"]["tuning"]["cpu_violation_rate_at_peaks"] == round(12 / 288, 6)
    assert all("cpu_violation_rate_at_peaks" in entry["tuning"] for entry in data["budget_sweep"])
    report = (out / "report.md").read_text()
    # The terminal gets the sweep's verdict on the goal as report.md gives it, for the one split.
    goal = [line.strip() for line in result.stdout.splitlines() if "The goal on the" in line]
    assert len(goal) == 1 and goal[0].startswith("**The goal on the tuning days**: of the 5 budgets")
    assert goal[0] in report.splitlines()
    assert "## Hot time at the 5-minute peaks" in report and "| none | 0.000% | 4.167% |" in report
    # Without --peaks, nothing about them.
    plain = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "at peaks" not in plain.stdout
    assert "Hot time at the 5-minute peaks" not in (out / "report.md").read_text()
    other = tmp_path / "other.csv"
    write_generic(other, [("z", 10 * DAY, 4, 5.0, GIB, GIB)])
    refused = subprocess.run([*command, "--peaks", str(other)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {other}: the peaks trace names none of the trace's 2 workloads (its 1 are, for example, z)")


@pytest.mark.shared
def test_the_azure_maxima_are_the_peaks_of_the_averages_vm_for_vm():
    workloads = read_trace(AZURE / "microsoft_avg_100.csv.gz", vm_cores=4)
    said = attach_peaks(workloads, read_trace(AZURE / "microsoft_max_100.csv.gz", vm_cores=4))
    assert said.startswith("peaks of 100 of 100 workloads, 800,400 of 800,400 workload-slots")
    assert all((w.peak_cpu >= w.usage["cpu"]).all() for w in workloads)
    assert sum((w.peak_cpu > w.usage["cpu"]).sum() for w in workloads) > 0.9 * 800400


def test_a_broken_azure_trace_is_refused_with_its_row(tmp_path):
    broken = tmp_path / "azure.csv"
    broken.write_text("step_5min,vm1,vm2\n1,10.0,20.0\n2,10.0\n")
    with pytest.raises(TraceError, match="row 3 has 2 columns, the header 3"):
        read_trace(broken, vm_cores=4)
    with pytest.raises(TraceError, match="no VM sizes: say how many cores each VM requests"):
        read_trace(broken)
    broken.write_text("step_5min,vm1\n1,ten\n")
    with pytest.raises(TraceError, match="not an azure-wide trace"):
        read_trace(broken, vm_cores=4)
    with pytest.raises(TraceError, match="cores must be positive"):
        read_trace(broken, vm_cores=0)


def test_the_command_sizes_azure_vms_by_vm_cores(tmp_path):
    """Two VMs at a steady 50% for 9 days on 8-core nodes: at 8 cores each they need two nodes as
    written, at 4 cores one; at 12 cores neither fits a node, and the command says so."""
    trace = tmp_path / "azure.csv"
    trace.write_text("step_5min,vm1,vm2\n" + "".join(f"{step},50.0,50.0\n" for step in range(1, 9 * 288 + 1)))
    nodes = {}
    for cores in ("8", "4", "12"):
        out_dir = tmp_path / cores
        result = subprocess.run([sys.executable, "-m", "reconcilers", "backtest", "--trace", str(trace),
                                 "--vm-cores", cores, "--node-cores", "8", "--node-memory", "64Gi",
                                 "--holdout-days", "1", "--hot-time-budget", "0.001", "--out", str(out_dir)],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        summary = json.loads((out_dir / "summary.json").read_text())
        assert [point["hot_time_budget"] for point in summary["budget_sweep"]] == [0.001], "that budget, no sweep"
        policies = {p["policy"]: p for p in summary["policies"]}
        nodes[cores] = policies["none"]["nodes_per_day"]
        assert policies["oversale"]["cpu_violation_rate"] == 0
        warned = "warning: 2 of 2 workloads request more than a node holds (8 cores, 64 GiB" in result.stderr
        assert warned == (cores == "12"), result.stderr
    assert nodes == {"8": 2, "4": 1, "12": 2}


def tune(trace, *options):
    """``python -m simulator.tune`` at the calibration 4: its exit code, stderr and one row per
    candidate as (capacity freed, realised hot time as a multiple of each goal budget, budgets
    kept within the goal's band as "k/n")."""
    result = subprocess.run([sys.executable, "-m", "simulator.tune", "--trace", str(trace), "--scale", "4",
                             "--warmup-days", "7", *options], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    freed = lines[0].split().index("freed") if lines else 0
    rows = [line.split() for line in lines if line.split()[:1] == ["4.0"]]
    return result.returncode, result.stderr, [(row[freed], row[freed + 1:freed + 6], row[freed - 1]) for row in rows]


def test_the_tuner_scores_a_budget_over_spent_as_the_worse_miss():
    """The goal's band is 0.5x..1.5x: both edges score 1 and the inside less, and spending 1.9x
    the budget (outside) scores worse than 0.5x (inside), tenfold over worse than tenfold under."""
    budget = 0.001
    assert band_distance(budget * 1.5, budget) == pytest.approx(1) == band_distance(budget * 0.5, budget)
    assert band_distance(budget * 1.49, budget) < 1 and band_distance(budget * 0.51, budget) < 1
    assert band_distance(budget * 1.9, budget) > 1 == pytest.approx(band_distance(budget * 0.5, budget))
    assert band_distance(budget * 10, budget) > band_distance(budget / 10, budget) > 1
    over = [band_distance(budget * m, budget) for m in (1, 1.2, 2, 5, 20)]
    under = [band_distance(budget * m, budget) for m in (1, 0.8, 0.4, 0.1, 0)]
    assert over == sorted(over) and under == sorted(under) and over[0] == under[0] == 0


def test_the_tuner_runs_on_the_node_size_it_is_given_and_never_sees_the_holdout(tmp_path):
    """Two workloads requesting 8 cores and using 2, for 10 days; on the last day both use 8. As
    written they need two 8-core nodes or one 16-core node; right-sized (2.1 cores) both fit on one
    node of either size. The last day is the holdout: cut off, its burst is never seen."""
    rows = [(f"w{w}", day * DAY + slot * SLOT, 8, 8 if day == 9 else 2, GIB, GIB // 2)
            for w in range(2) for day in range(10) for slot in range(288)]
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    code, err, small = tune(trace, "--node-cores", "8", "--node-memory", "64Gi", "--holdout-days", "1")
    assert code == 0, err
    assert len(small) == 4, "one row per candidate of the account's grid"
    assert {freed for freed, *_ in small} == {"50.0%"}
    assert all(multiple == "0.00x" for _, multiples, _ in small for multiple in multiples), "the burst day is cut off"
    assert {kept for *_, kept in small} == {"0/5"}, "a budget not spent at all is not kept"
    code, err, again = tune(trace, "--node-cores", "8", "--node-memory", "64Gi", "--holdout-days", "1", "--scale", "4")
    assert code == 0 and again == small, "a calibration given twice is run once"
    code, err, large = tune(trace, "--node-cores", "16", "--node-memory", "128Gi", "--holdout-days", "1")
    assert code == 0, err
    assert "warning" not in err
    code, err, _ = tune(trace, "--node-cores", "4", "--node-memory", "32Gi", "--holdout-days", "1")
    assert code == 0 and "warning: 2 of 2 workloads request more than a node holds (4 cores, 32 GiB" in err, err
    assert {freed for freed, *_ in large} == {"0.0%"}
    code, err, seen = tune(trace, "--node-cores", "8", "--node-memory", "64Gi", "--holdout-days", "0")
    assert code == 0, err
    assert all(multiple != "0.00x" for _, multiples, _ in seen for multiple in multiples), "with no holdout it is hot"


def test_the_tuner_scores_each_candidate_over_the_placements_it_is_asked_for(tmp_path):
    """Two workloads of 10 requested cores, using 9 for a week, each open a 16-core node of their
    own; two small ones then score the same on both. On the tuning days "a-hot" rises to 10 cores
    and the small ones to 3.5 each: beside a-hot they make 17 cores, beside "b-cool" 16. So the hot
    time depends on how ties fall. ``--placements 5`` replays each candidate five times, says so
    on stderr, and gives each budget's realised hot time as the range over them; the first
    placement's figure, the one ``--placements 1`` gives, is inside it."""
    rows = []
    for day in range(10):
        for slot in range(288):
            t, late = day * DAY + slot * SLOT, day >= 7
            rows += [("a-hot", t, 10, 10 if late else 9, GIB, GIB // 2), ("b-cool", t, 10, 9, GIB, GIB // 2),
                     ("c-small", t, 3, 3.5 if late else 1, GIB, GIB // 2),
                     ("d-small", t, 3, 3.5 if late else 1, GIB, GIB // 2)]
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    options = ("--node-cores", "16", "--node-memory", "128Gi", "--holdout-days", "1")
    code, err, one = tune(trace, *options)
    assert code == 0, err
    code, err, five = tune(trace, *options, "--placements", "5")
    assert code == 0, err
    assert [line for line in err.splitlines() if "replayed" in line] == [
        f"candidate {c}/4: placement {p}/5 replayed" for c in (1, 2, 3, 4) for p in range(1, 6)]
    assert len(five) == len(one) == 4
    assert {kept.split("/")[1] for *_, kept in one} == {"5"} and {kept.split("/")[1] for *_, kept in five} == {"25"}
    for (_, single, _), (_, ranged, _) in zip(one, five, strict=True):
        bounds = [tuple(float(x) for x in cell.rstrip("x").split("-")) for cell in ranged]
        assert all(low <= float(alone.rstrip("x")) <= high for alone, (low, high) in zip(single, bounds, strict=True))
        assert all(low == 0 < high for low, high in bounds), "some placements keep the small ones off a-hot's node"


def test_the_tuner_names_the_best_calibration_with_the_account_as_shipped(tmp_path):
    """Only the calibration is a setting: the last line names the one scoring best among the rows
    run with the shipped account (short_overspend 4, min_multiplier 0.5, max_multiplier 1), and
    how the user's OVERSALE_BUDGET_CALIBRATION scored, or that it was not among the candidates.
    Six workloads of 4 requested cores whose use is drawn from one gamma distribution, so the
    calibrations set different ratios."""
    use = np.random.default_rng(1).gamma(2.0, 0.4, size=(6, 10 * 288)).clip(max=4)
    write_generic(tmp_path / "trace.csv", [(f"w{w}", (i // 288) * DAY + (i % 288) * SLOT, 4, float(x), GIB, GIB // 2)
                                           for w, row in enumerate(use) for i, x in enumerate(row)])

    def tuned(calibration, *extra):
        result = subprocess.run([sys.executable, "-m", "simulator.tune", "--trace", str(tmp_path / "trace.csv"),
                                 "--scale", "1", "--scale", "4", "--warmup-days", "7", "--node-cores", "8",
                                 "--node-memory", "64Gi", "--holdout-days", "1", *extra], cwd=ROOT,
                                capture_output=True, text=True, timeout=300,
                                env={**os.environ, "OVERSALE_BUDGET_CALIBRATION": calibration})
        assert result.returncode == 0, result.stderr
        header, *lines = result.stdout.splitlines()
        progress = [line for line in result.stderr.splitlines() if " scored in " in line]
        assert [line.split(" scored")[0] for line in progress] == [f"candidate {n}/8" for n in range(1, 9)]
        assert progress[-1].endswith("; about 0s left"), "progress on stderr, with the time left"
        return [dict(zip(header.split(), line.split(), strict=False)) for line in lines[:-1]], lines[-1]

    table, line = tuned("4", "--json", str(tmp_path / "tune.json"))
    assert len(table) == 8
    shipped = {row["scale"]: row for row in table
               if (row["short_overspend"], row["min_multiplier"], row["max_multiplier"]) == ("4.0", "0.5", "1.0")}
    assert len(shipped) == 2 and shipped["1.0"]["score"] != shipped["4.0"]["score"], "the calibrations score apart"
    best, other = sorted(shipped, key=lambda scale: float(shipped[scale]["score"]))
    said = (f"With the account as shipped, calibration {float(best):g} scores best ({shipped[best]['score']}, "
            f"{shipped[best]['kept']} kept, {shipped[best]['freed']} freed)")
    for calibration in ("1", "4"):
        _, line = tuned(calibration)
        if float(calibration) == float(best):
            assert line == said + ", the one OVERSALE_BUDGET_CALIBRATION sets."
        else:
            assert line.startswith(said + f", against {shipped[other]['score']} ({shipped[other]['kept']} kept) "
                                   f"for the {calibration} OVERSALE_BUDGET_CALIBRATION sets. Read each budget's "
                                   "range above before changing it")
    _, line = tuned("3")
    assert line.startswith(said + "; the 3 OVERSALE_BUDGET_CALIBRATION sets was not among the candidates (--scale).")
    # --json: every row's figures as the table gives them, and the same choice.
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["budgets"] == [0.0005, 0.001, 0.002, 0.005, 0.01] and data["placements"] == 1
    assert data["best_calibration"] == float(best) and data["current_calibration"] == 4.0
    assert data["choice"].startswith(said)
    assert len(data["candidates"]) == len(table)
    for row, candidate in zip(table, data["candidates"], strict=True):
        account = candidate["account"]
        assert (row["scale"], row["short_overspend"], row["min_multiplier"], row["max_multiplier"]) == (
            str(candidate["calibration"]), str(account["short_overspend"]), str(account["min_multiplier"]),
            str(account["max_multiplier"]))
        assert row["score"] == f"{candidate['score']:.3f}" and row["kept"] == f"{candidate['kept']}/5"
        assert row["freed"] == f"{candidate['capacity_freed']:.1%}"
        assert [row[f"{b:.2%}"] for b in data["budgets"]] == [f"{t['lowest']:.2f}x" for t in candidate["times_budget"]]


def test_the_tuner_refuses_a_trace_with_no_day_to_tune_on(tmp_path):
    trace = tmp_path / "trace.csv"
    write_generic(trace, [("w", day * DAY, 1, 0.5, GIB, GIB // 2) for day in range(20)])
    code, err, rows = tune(trace)
    assert code == 2 and rows == []
    assert err.strip().endswith("20 days, of which --holdout-days 14 are cut off and --warmup-days 7 only give "
                                "history: no day left to tune on")
    code, err, _ = tune(tmp_path / "absent.csv")
    assert code == 2 and "no such file" in err
    refused = subprocess.run([sys.executable, "-m", "simulator.tune", "--trace", str(trace)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "OVERSALE_CPU_HOT_TIME_BUDGET": "2"})
    assert refused.returncode == 2 and "OVERSALE_CPU_HOT_TIME_BUDGET" in refused.stderr, "the user's settings count"
    for scale in ("0", "-1", "inf", "four"):
        bad = subprocess.run([sys.executable, "-m", "simulator.tune", "--trace", str(trace), "--scale", scale],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and f"--scale: '{scale}': a calibration is a positive factor" in bad.stderr, scale
        assert len(bad.stderr.strip().splitlines()) == 1, "one line, no usage block before it"


def july_slice(path, last_vm):
    """The July long CSV's VMs 1 to ``last_vm`` (the file is sorted by VM), written to ``path``."""
    with gzip.open(BITBRAINS, "rt") as source, path.open("w") as out:
        out.write(source.readline())
        for line in source:
            if int(line.split(",", 1)[0]) > last_vm:
                break
            out.write(line)
    return path


def write_raw(path, rows):
    """A GWA-T-12 per-VM file as the archive ships it: ``;`` and a tab between columns, times in seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["Timestamp [ms];\tCPU cores;\tCPU capacity provisioned [MHZ];\tCPU usage [MHZ];\tCPU usage [%];\t"
             "Memory capacity provisioned [KB];\tMemory usage [KB];\tDisk read throughput [KB/s]"]
    lines += [f"{t};\t{cores};\t{cores * 2600.0};\t{used * 2600.0};\t0.0;\t{kb};\t{kb / 2};\t0.0"
              for t, cores, used, kb in rows]
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


@pytest.mark.shared
def test_the_archives_own_per_vm_files_read_as_the_long_csv_reads_them(tmp_path):
    """GWA-T-12 as a user downloads it: one file per VM. The three original files in the shared
    corpus hold VMs 1 to 3 of the long CSV; read from either, they are the same arrays, and the
    command replays the directory with its format detected."""
    long_slice = july_slice(tmp_path / "slice.csv", last_vm=3)
    raw = BITBRAINS.parent / "raw_sample"
    assert detect_format(raw / "2013-7_1.csv.gz") == "bitbrains-raw"
    from_files = read_trace(raw)
    assert [w.name for w in from_files] == ["2013-7_1", "2013-7_2", "2013-7_3"], "each VM is named by its file"
    for long_vm, file_vm in zip(read_trace(long_slice), from_files, strict=True):
        assert len(file_vm.slots) > 8000 and np.array_equal(long_vm.slots, file_vm.slots)
        for resource in ("cpu", "memory"):
            assert np.array_equal(long_vm.request[resource], file_vm.request[resource]), (file_vm.name, resource)
            assert np.array_equal(long_vm.usage[resource], file_vm.usage[resource]), (file_vm.name, resource)
    out_dir = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "reconcilers", "backtest", "--trace", str(raw), "--out",
                             str(out_dir), "--node-cores", "8"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "24,776 rows, 3 workloads" in result.stderr
    assert json.loads((out_dir / "summary.json").read_text())["days_evaluated"] == 23


def test_a_directory_of_months_holds_one_vm_per_file_name(tmp_path):
    """The archive's layout, ``rnd/2013-7/1.csv`` and ``rnd/2013-8/1.csv``: one VM over both
    months. Files that are no VM's, or deeper than a month, are not read."""
    july, august = 1372629600, 1375308000
    write_raw(tmp_path / "2013-7" / "1.csv", [(july + k * SLOT, 2, 1.0, 4096) for k in range(3)])
    write_raw(tmp_path / "2013-8" / "1.csv.gz", [(august + k * SLOT, 4, 3.0, 8192) for k in range(2)])
    write_raw(tmp_path / "2013-7" / "2.csv", [(july, 1, 0.5, 1024), (july + SLOT, 0, 0.0, 1024)])
    write_raw(tmp_path / "2013-7" / "old" / "3.csv", [(july, 1, 0.5, 1024)])
    (tmp_path / "README.txt").write_text("Bitbrains\n")
    said: list[str] = []
    one, two = read_trace(tmp_path, progress=said.append)
    assert (one.name, two.name) == ("1", "2")
    assert one.slots.tolist() == [july // SLOT + k for k in range(3)] + [august // SLOT + k for k in range(2)]
    assert one.request["cpu"].tolist() == [2000] * 3 + [4000] * 2
    assert one.usage["cpu"].tolist() == pytest.approx([1000] * 3 + [3000] * 2)
    assert one.request["memory"].tolist() == [4096 * 1024] * 3 + [8192 * 1024] * 2
    assert two.slots.tolist() == [july // SLOT], "a powered-off reading (0 cores) is dropped"
    assert said[-1] == "7 rows, 2 workloads", "the deeper file's row is not read"


def test_a_broken_per_vm_file_is_refused_by_its_name_and_row(tmp_path):
    write_raw(tmp_path / "7.csv", [(1372629804 + k * SLOT, 1, 0.5, 1024) for k in range(3)])
    with (tmp_path / "7.csv").open("a") as out:
        out.write("1372630704;\t1;\t2600.0\n")
    with pytest.raises(TraceError) as refused:
        read_trace(tmp_path)
    assert str(refused.value) == (f"{tmp_path / '7.csv'}: not a bitbrains-raw file (row 5: 3 columns, the header 8)")
    write_raw(tmp_path / "7.csv", [(1372629804000, 1, 0.5, 1024)])
    with pytest.raises(TraceError, match=r"7.csv: not a bitbrains-raw file \(row 2: Timestamp \[ms\] '1372629804000' "
                                         r"is not a time in seconds"):
        read_trace(tmp_path / "7.csv")
    (tmp_path / "7.csv").write_text("Timestamp [ms];\tCPU cores\n1372629804;\t1\n")
    with pytest.raises(TraceError, match=r"missing columns: CPU capacity provisioned \[MHZ\], CPU usage \[MHZ\]"):
        read_trace(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match=r"empty: holds no \.csv or \.csv\.gz files"):
        read_trace(empty)
    with pytest.raises(TraceError, match="a directory, not a trace file"):
        read_trace(empty, "generic")


@pytest.mark.shared
def test_a_slice_of_the_july_bitbrains_trace_through_the_command(tmp_path):
    # The first 20 VMs; the format is detected from the header.
    slice_path = july_slice(tmp_path / "slice.csv", last_vm=20)
    out_dir = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "reconcilers", "backtest", "--trace", str(slice_path),
                             "--out", str(out_dir), "--node-cores", "16", "--placements", "3"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "day 1/" in result.stderr, "progress is shown"
    assert "placement 3/3 (ties drawn, seed 2) replayed in" in result.stderr
    data = json.loads((out_dir / "summary.json").read_text())
    policies = {p["policy"]: p for p in data["policies"]}
    assert data["days_evaluated"] >= 20 and len(data["holdout_days"]) == 14
    assert set(data["tuning_days"]).isdisjoint(data["holdout_days"])
    assert 0 < data["clairvoyant_capacity_freed"] < 1
    for entry in data["policies"]:
        assert entry["kind"] in ("compression", "node-oversale", "system")
        for key in ("capacity_freed", "cpu_violation_rate", "memory_violation_rate"):
            assert 0 <= entry[key] <= 1 or key == "capacity_freed", (entry["policy"], key)
        assert isinstance(entry["ours"], bool) and entry["nodes_per_day"] >= 0
    assert policies["none"]["capacity_freed"] == 0
    assert policies["oversale"]["kind"] == "system" and policies["oversale"]["ours"]
    assert 0 < policies["oversale"]["capacity_freed"] < 1
    assert policies["crane-style"]["ours"] is False
    assert "Katalyst" in policies["katalyst-realtime"]["source"]
    assert "LoadAwareScheduling" in policies["koordinator-batch+load-aware"]["source"]
    assert policies["koordinator-batch+load-aware"]["family"] == "koordinator-batch"
    assert "dynamic scheduler" in policies["crane-style+load-aware"]["source"]
    # Day by day, each system's hot samples add up to its split's violation rate.
    for split in ("tuning", "holdout"):
        days = [d for d in data["daily"]["oversale"] if d["split"] == split]
        assert [d["day"] for d in days] == data[f"{split}_days"]
        rate = sum(d["cpu_hot_samples"] for d in days) / sum(d["node_samples"] for d in days)
        assert rate == pytest.approx(policies["oversale"][split]["cpu_violation_rate"], abs=1e-6)
        low, high = data["budget_sweep"][0][split]["cpu_violation_interval"]
        assert low <= data["budget_sweep"][0][split]["cpu_violation_rate"] <= high
        at_budgets = data["budgets_against_peers"][split]
        assert [v["hot_time_budget"] for v in at_budgets] == [0.0005, 0.001, 0.002, 0.005, 0.01]
        assert {p["family"] for p in at_budgets[0]["peers"]} >= {"vpa-style", "crane-style", "katalyst-realtime",
                                                                 "koordinator-batch"}
        variants = {v["system"]: v for v in data["variants_against_curve"][split]}
        assert set(variants) == {"oversale+load-aware", "oversale+remediation"}
        assert variants["oversale+remediation"]["adds"] == ["remediation"]
    # And over every replayed day, the figure the plan shows.
    low, high = data["budget_sweep"][0]["cpu_violation_interval"]
    assert low <= data["budget_sweep"][0]["cpu_violation_rate"] <= high
    report = (out_dir / "report.md").read_text()
    # Our curve on 3 placements, the report's first: the sweep's table gives each split's hot time
    # over them, a range that holds the report's own figure.
    placements = data["placements"]
    figures = ("hot_time_budget", "capacity_freed", "cpu_violation_rate")
    assert len(placements) == 3 and [{k: e[k] for k in figures} for e in placements[0]] == \
        [{k: e[k] for k in figures} for e in data["budget_sweep"]]
    assert "| holdout: over 3 placements |" in report
    for entry in data["budget_sweep"]:
        for split in ("tuning", "holdout"):
            rates = [e[split]["cpu_violation_rate"] for curve in placements for e in curve
                     if e["hot_time_budget"] == entry["hot_time_budget"]]
            assert len(rates) == 3 and min(rates) <= entry[split]["cpu_violation_rate"] <= max(rates)
            assert f"| {min(rates):.3%}..{max(rates):.3%} |" in report
    # Each variant is judged on every placement against the curve replayed on that placement: the
    # report's placement first (its verdicts are the report's own), then the two with ties drawn.
    judged = data["placement_variants"]
    assert len(judged) == 3 and judged[0] == data["variants_against_curve"]
    assert "| over 3 placements |" in report
    for split in ("tuning", "holdout"):
        for verdict in data["variants_against_curve"][split]:
            on_each = [v for placement in judged for v in placement[split] if v["system"] == verdict["system"]]
            row = next(line for line in report.splitlines()
                       if line.startswith(f"| {split} | {verdict['system']} |"))
            assert len(on_each) == 3
            differences = [v["difference"] * 100 for v in on_each if v["difference"] is not None]
            hotter = sum(d > 0 for d in differences)
            cell = (f"{min(differences):+.3f}..{max(differences):+.3f} points" if differences
                    else "off the curve on all 3")
            assert (f", hotter on {hotter} of 3" in row.split("|")[-2]) == bool(differences)
            assert cell in row.split("|")[-2], row
    assert "## Holdout days" in report and "## Tuning days" in report
    assert "## Where the hot time came from" in report and "### At each budget, against every peer" in report
    assert "## Our variants against our curve" in report
    for image in ("savings_vs_violations.png", "node_day.png"):
        assert (out_dir / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.shared
def test_with_frontier_every_peer_frees_more_or_less_as_its_knob_says(tmp_path):
    # --frontier draws each peer as a curve along its main knob, read at our budgets. A variant
    # whose knob were lost would sit on its default's point and shift that reading unseen. 40 July
    # VMs on 4-core nodes, where one node more or less is a few percent of the fleet.
    plain = default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget())
    curves = default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget(), frontier=True)
    assert [s.name for s in curves[:len(plain)]] == [s.name for s in plain]
    assert [s.name for s in curves[len(plain):]] == [s.name for s in peer_variants()]
    assert len({s.name for s in curves}) == len(curves)
    systems = [plain[0], *peer_systems(), *peer_variants()]
    result = run(read_trace(july_slice(tmp_path / "slice.csv", last_vm=40)), Config(node_cpu_cores=4), systems)
    freed = {row["policy"]: row["tuning"]["capacity_freed"] for row in summary(result, systems)}
    knobs = {  # each family's settings, from the one that should free least to the one that should free most
        "vpa-style": ["vpa-style x2", "vpa-style x1.5", "vpa-style", "vpa-style x1"],
        "crane-style": ["crane-style x2", "crane-style x1.5", "crane-style", "crane-style x1"],
        "katalyst-realtime": ["katalyst-realtime T=0.2", "katalyst-realtime T=0.4", "katalyst-realtime",
                              "katalyst-realtime T=0.8"],
        "crane-style+katalyst": ["crane-style+katalyst T=0.2", "crane-style+katalyst T=0.4", "crane-style+katalyst",
                                 "crane-style+katalyst T=0.8"],
        "koordinator-batch": ["koordinator-batch T=0.4", "koordinator-batch", "koordinator-batch T=0.8",
                              "koordinator-batch T=1"],
        "static": ["static-1.5", "static-2", "static-3", "static-4"],
        "static-oversale": ["static-oversale-1.25", "static-oversale-1.5", "static-oversale-2", "static-oversale-2.5"],
    }
    assert {s.name for s in peer_variants()} <= {name for names in knobs.values() for name in names}
    for family, names in knobs.items():
        along = [freed[name] for name in names]
        assert along == sorted(along) and along[0] < along[-1], (family, along)


def test_the_command_names_a_missing_trace(tmp_path):
    result = subprocess.run([sys.executable, "-m", "reconcilers", "backtest", "--trace", str(tmp_path / "nope.csv")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'nope.csv'}: no such file"


def test_remediation_moves_the_surging_workload_off_the_hot_node():
    """Hand-computed: two 16-core nodes. Node 0 runs w0 (10 cores) and w1, which surges from 1 to 7
    cores at sample 10 (17 cores: over real capacity); node 1 runs w2 (2 cores)."""
    from oversale.remediation import RemediationConfig
    from simulator.replay import Day, Placed, Tally, remediate

    slots = 288
    cpu = np.zeros((3, slots))
    cpu[0, :] = 10_000
    cpu[1, :10], cpu[1, 10:] = 1_000, 7_000
    cpu[2, :] = 2_000
    usage = {"cpu": cpu, "memory": np.full((3, slots), float(GIB))}
    empty = no_history(3)
    day = Day(7, 0.0, np.arange(slots), {}, usage, np.ones((3, slots), dtype=bool), empty, "tuning")
    real = (16_000.0, 64.0 * GIB)

    def placed() -> Placed:
        return Placed(np.array([0, 0, 1]), {"cpu": np.array([8_000.0, 2_000.0, 8_000.0]),
                                            "memory": np.full(3, float(GIB))}, [(1.0, 1.0), (1.0, 1.0)])

    alone, moved = Tally(), Tally()
    alone.count(day, placed(), real)
    remediated = placed()
    # Ten observations a minute apart are two 5-minute samples.
    remediate(day, remediated, real, RemediationConfig(), LoadConfig())
    moved.count(day, remediated, real)

    assert alone.violations["cpu"] == slots - 10, "node 0 at 17 cores from sample 10 on"
    # Samples 10 and 11 see node 0 at 106% (> 95%): w1 runs 5 cores above its request, w0 only 2,
    # so w1 goes (its 7 cores cover the 1.8 above the watermark); node 1 then runs 9 of 16 cores
    # (56%, under the 65% scheduling watermark). It moves from the next sample on.
    assert remediated.evictions == 1 and remediated.moved_again == 0
    assert list(remediated.moved[1, 10:13]) == [0, 0, 1]
    assert moved.violations["cpu"] == 2


def test_two_hot_nodes_in_one_sample_do_not_both_move_onto_the_one_cool_node():
    """As the live remediator: nodes 0 and 1 each run a 10-core workload and one that surges from 1
    to 7 cores at sample 10; node 2 runs 3 cores. Node 2 can take one surging workload (10 of 16
    cores, 62%, under the 65% scheduling watermark), not both (17 cores: over real capacity)."""
    from oversale.remediation import RemediationConfig
    from simulator.replay import Day, Placed, Tally, remediate

    slots = 288
    cpu = np.zeros((5, slots))
    cpu[[0, 2], :] = 10_000
    cpu[[1, 3], :10], cpu[[1, 3], 10:] = 1_000, 7_000
    cpu[4, :] = 3_000
    usage = {"cpu": cpu, "memory": np.full((5, slots), float(GIB))}
    empty = no_history(5)
    day = Day(7, 0.0, np.arange(slots), {}, usage, np.ones((5, slots), dtype=bool), empty, "tuning")
    real = (16_000.0, 64.0 * GIB)
    placed = Placed(np.array([0, 0, 1, 1, 2]), {"cpu": np.array([8_000.0, 2_000.0, 8_000.0, 2_000.0, 4_000.0]),
                                                 "memory": np.full(5, float(GIB))}, [(1.0, 1.0)] * 3)
    remediate(day, placed, real, RemediationConfig(), LoadConfig())
    tally = Tally()
    tally.count(day, placed, real)
    assert placed.evictions == 1, "the second surging workload has nowhere cool to go"
    assert int((placed.moved[:, -1] == 2).sum()) == 2, "node 2 ends with its own workload and one moved"
    # Node 0 is over for the two samples before its move; node 1 keeps its surge; node 2 never is.
    assert tally.violations["cpu"] == 2 + (slots - 10)


def test_a_pod_meets_the_load_its_node_has_at_the_pods_moment_of_the_day():
    """Load-aware placement in the replay sees what the extender's poller would have read when the
    Pod arrived: the hour before its moment, from the end of the history window into the day."""
    slots = DAY // SLOT
    start = 30 * DAY
    times = start - SLOT * np.arange(slots, 0, -1)
    history = [np.full(slots, 1000.0), np.full(slots, 4.0 * GIB)]
    busy = (np.arange(slots) >= 100) & (np.arange(slots) < 160)  # 08:20 to 13:20
    today = [np.where(busy, 20000.0, 1000.0), np.where(busy, 8.0 * GIB, 4.0 * GIB)]
    at_midnight = heat_at(history, today, times, start, 0, LoadConfig())
    assert (at_midnight.load.cpu_average, at_midnight.load.at) == (1000.0, times[-1])
    midday = heat_at(history, today, times, start, 130, LoadConfig())
    assert (midday.load.cpu_average, midday.load.memory, midday.load.at) == (20000.0, 8.0 * GIB, start + 129 * SLOT)
    assert midday.now == start + 129 * SLOT, "read as fresh as the poller reads: at the last sample"
    just_before = heat_at(history, today, times, start, 100, LoadConfig())
    assert just_before.load.cpu_peak == 1000.0  # the busy hours have not begun
    # Reading Prometheus over 6 hours, the extender remembers the morning's peak in the evening.
    evening = heat_at(history, today, times, start, 200, LoadConfig(history_peak_seconds=6 * 3600))
    assert (evening.load.cpu_peak, evening.load.peak_window) == (20000.0, "6-hour maximum, from Prometheus")
    own_hour = heat_at(history, today, times, start, 200, LoadConfig()).load
    assert (own_hour.cpu_peak, own_hour.peak_window) == (1000.0, "1-hour maximum")  # metrics API, not Prometheus
    moments = arrival_moments(Day(3, start, np.arange(slots), {}, {"cpu": np.zeros((50, slots))}, np.ones((50, slots)),
                                  None, "tuning"))  # type: ignore[arg-type]
    assert len(moments) == 50 and moments.min() >= 0 and moments.max() < slots and len(set(moments)) > 25
    # Over many Pods every slot of the day is someone's moment, midnight's and the last included.
    many = arrival_moments(Day(3, start, np.arange(slots), {}, {"cpu": np.zeros((5000, slots))},
                               np.ones((5000, slots)), None, "tuning"))  # type: ignore[arg-type]
    assert set(many.tolist()) == set(range(slots))


def test_the_replays_load_aware_placement_keeps_the_watermarks_it_is_given():
    """Two workloads of 4 requested cores each use 6 on 16-core nodes: the second meets the first's
    node at 37.5% of its real cpu. The default watermark (65%) lets it join; one of 30%, as an
    operator may set with OVERSALE_CPU_SCHEDULING_WATERMARK for the backtest, sends it to a new
    node, as the live extender would."""
    from decimal import Decimal

    from oversale.usage import Watermarks
    from simulator.policies import System, no_compression
    from simulator.replay import place

    slots = DAY // SLOT
    start = 30 * DAY
    times = start - SLOT * np.arange(slots, 0, -1)
    usage = {"cpu": np.full((2, slots), 6000.0), "memory": np.full((2, slots), float(GIB))}
    window = Window(times, usage, np.ones((2, slots), dtype=bool))
    day = Day(30, start, np.arange(slots), {"cpu": np.full(2, 4000.0), "memory": np.full(2, float(GIB))}, usage,
              np.ones((2, slots), dtype=bool), window, "tuning")
    real = (16000.0, 64.0 * GIB)

    def nodes_used(load: LoadConfig) -> list[int]:
        return place(day, System("s", "", no_compression, load=load), real).assignment.tolist()

    assert nodes_used(LoadConfig()) == [0, 0]
    assert nodes_used(LoadConfig(watermarks=Watermarks(cpu_average=Decimal("0.3")))) == [0, 1]


def test_a_pods_estimate_in_the_replay_is_its_workloads_usage_just_before_its_moment():
    """As live, where the extender reads it from the workload's Pods in PodMetrics: its 5-minute
    average cpu and latest memory before the moment; by its request where it did not run then."""
    slots = DAY // SLOT
    start = 30 * DAY
    times = start - SLOT * np.arange(slots, 0, -1)
    window = Window(times, {"cpu": np.full((2, slots), 500.0), "memory": np.full((2, slots), float(GIB))},
                    np.ones((2, slots), dtype=bool))
    cpu = np.tile(np.arange(slots, dtype=float) * 10, (2, 1))  # 0, 10, 20 ... millicores through the day
    present = np.ones((2, slots), dtype=bool)
    present[1, 50:] = False  # the second workload stopped at slot 50
    day = Day(3, start, np.arange(slots), {}, {"cpu": cpu, "memory": np.full((2, slots), 2.0 * GIB)}, present,
              window, "tuning")
    config = LoadConfig()
    assert observed_usage(window, day, 0, 0, config) == WorkloadUsage(500.0, float(GIB), 1)  # the window's end
    # Slot 100: the 5 minutes before are slot 99 alone (990m), and its memory.
    assert observed_usage(window, day, 0, 100, config) == WorkloadUsage(990.0, 2.0 * GIB, 1)
    assert observed_usage(window, day, 1, 100, config) is None
    # At midnight, what tells is the window's last slot.
    gone = Window(times, window.usage, np.concatenate([window.present[:, :-1], [[True], [False]]], axis=1))
    assert observed_usage(gone, day, 0, 0, config) is not None and observed_usage(gone, day, 1, 0, config) is None
    # Only the slot just before the moment tells whether it ran: at slot 50 it had (slot 49), at 51 not.
    assert observed_usage(window, day, 1, 50, config) == WorkloadUsage(490.0, 2.0 * GIB, 1)
    assert observed_usage(window, day, 1, 51, config) is None
    assert pod_estimate({"cpu": 4000, "memory": GIB}, observed_usage(window, day, 1, 100, config), config) == {
        "cpu": 3400.0, "memory": 0.7 * GIB}


def test_our_extender_estimates_a_pod_by_its_workloads_usage_koordinators_by_its_request():
    """Two 12-core Pods fill a node each on 16-core, 64 GiB nodes: one runs its node's cpu at 60%,
    the other its node's memory at 60%. The third asks 0.1 core and 32 GiB but uses 5.6 cores and
    half a GiB. Estimated by its workload's usage (our extender), it goes where cpu is cool;
    estimated by request x 0.85 cpu / 0.7 memory (Koordinator's default estimator, the
    ``estimate_from_usage=False`` peers), where memory is cool, and that node's cpu then runs
    at 95%."""
    from simulator.policies import System, no_compression
    from simulator.replay import place

    slots = DAY // SLOT
    start = 30 * DAY
    times = start - SLOT * np.arange(slots, 0, -1)
    usage = {"cpu": np.array([[9600.0], [800.0], [5600.0]]).repeat(slots, axis=1),
             "memory": np.array([[3.0 * GIB], [38.4 * GIB], [0.5 * GIB]]).repeat(slots, axis=1)}
    window = Window(times, usage, np.ones((3, slots), dtype=bool))
    day = Day(30, start, np.arange(slots), {"cpu": np.array([12000.0, 12000.0, 100.0]),
                                            "memory": np.array([8.0 * GIB, 8.0 * GIB, 32.0 * GIB])},
              usage, np.ones((3, slots), dtype=bool), window, "tuning")
    real = (16000.0, 64.0 * GIB)
    ours = place(day, System("ours", "", no_compression, load=LoadConfig()), real).assignment.tolist()
    by_request = place(day, System("by request", "", no_compression, load=LoadConfig(), estimate_from_usage=False),
                       real).assignment.tolist()
    assert ours[0] != ours[1] and by_request[0] != by_request[1]
    assert ours[2] == ours[1], "beside the memory-hot Pod: 6.4 cores used of 16"
    assert by_request[2] == by_request[0], "beside the cpu-hot Pod: its 32 GiB request read as 22.4 GiB of use"


def test_a_variant_is_read_against_our_curve_at_its_own_capacity_freed():
    """Ten holdout days; `none` needs 10 nodes a day. Our budgets 0.05% and 1% need 6 and 4 (40%
    and 60% freed) and are hot 10 and 50 samples of 1,000 a day on every day (1% and 5%). A variant
    needing 5 nodes (50% freed) sits where the curve runs 3%; it is hot 10 samples a day on nine
    days and 200 on the tenth (2.9%): cooler as measured, but the burst day decides it."""
    def row(policy, budget=None, adds=(), family="oversale"):
        return {"policy": policy, "family": family, "ours": family != "none", "hot_time_budget": budget,
                "adds": list(adds), "holdout": {"capacity_freed": 0.0, "cpu_violation_rate": 0.0}}

    def days(nodes, hot):
        return [{"split": "holdout", "nodes": nodes, "node_samples": 1000, "cpu_hot_samples": h} for h in hot]
    rows = [row("none", family="none"), row("oversale budget 0.05%", 0.0005), row("oversale budget 1.00%", 0.01),
            row("oversale budget 5.00%", 0.05),
            row("oversale+load-aware", 0.001, ["load-aware"], "oversale+load-aware")]
    rows[-1]["holdout"] = {"capacity_freed": 0.5, "cpu_violation_rate": 0.029}
    daily = {"none": days(10, [0] * 10), "oversale budget 0.05%": days(6, [10] * 10),
             "oversale budget 1.00%": days(4, [50] * 10), "oversale budget 5.00%": days(2, [900] * 10),
             "oversale+load-aware": days(5, [10] * 9 + [200])}
    [verdict] = variants_against_curve(rows, daily, "holdout")
    assert verdict["system"] == "oversale+load-aware" and verdict["adds"] == ["load-aware"]
    # The curve at 50% freed is halfway between the budgets 0.05% and 1%: 3% hot.
    assert verdict["curve_violation_rate"] == pytest.approx(0.03) and verdict["off_the_curve"] is None
    assert verdict["change"] == pytest.approx(0.029 / 0.03 - 1, abs=1e-3)
    assert verdict["difference"] == pytest.approx(-0.001)
    low, high = verdict["difference_interval"]
    # Drawn without the burst day it is 2 points cooler; with it twice, about 1.9 points hotter.
    assert low == pytest.approx(-0.02) and 0 < high < 0.04
    assert verdict["cooler_share"] + verdict["hotter_share"] == pytest.approx(1)
    assert 0.2 < verdict["cooler_share"] < 0.8 and verdict["draws_on_the_curve"] == 1
    assert variants_against_curve(rows, daily, "holdout") == [verdict]  # seeded: a rerun prints the same
    # Freeing more than any budget of the range: no point on the curve to compare with.
    daily["oversale+load-aware"] = days(1, [0] * 10)
    beyond = variants_against_curve(rows, daily, "holdout")[0]
    assert beyond["curve_violation_rate"] is None and beyond["off_the_curve"] == "frees more than any budget"
    daily["oversale+load-aware"] = days(8, [0] * 10)
    assert variants_against_curve(rows, daily, "holdout")[0]["off_the_curve"] == "frees less than any budget"
    assert variants_against_curve(rows[:1] + rows[4:], daily, "holdout") == [], "no curve, no verdict"


def test_the_hot_time_interval_spans_the_days_with_and_without_a_burst():
    quiet = {"split": "holdout", "node_samples": 1000, "cpu_hot_samples": 0}
    burst = {"split": "holdout", "node_samples": 1000, "cpu_hot_samples": 40}
    days = [quiet] * 13 + [burst] + [{"split": "tuning", "node_samples": 1000, "cpu_hot_samples": 900}]
    low, high = hot_time_interval(days, "holdout")
    # Realised: 40 / 14,000 = 0.29%; drawn again, the burst day falls out often and comes twice sometimes.
    assert low == 0.0 and 40 / 14000 < high <= 120 / 14000
    assert hot_time_interval(days, "holdout") == [low, high]  # seeded: a rerun prints the same
    assert hot_time_interval([quiet] * 5, "holdout") == [0.0, 0.0]
    assert hot_time_interval(days, "nowhere") is None
    # Every day (the split None): the tuning day, 90% hot, counts too.
    every_low, every_high = hot_time_interval(days, None)
    assert every_low <= 940 / 15000 < every_high and every_high > 2 * high


def test_each_day_says_the_accounts_multiplier_and_the_ratios_so_a_back_off_after_a_burst_shows(tmp_path):
    # hot1 and hot2 request 8 cores and use 7 (q1..q4 use 1); on day 8 both burst to 9.5 cores for
    # six hours: 19 cores on the 16 real cores of the node they share (with overselling or without).
    rows = []
    start = 10 * DAY
    for t in range(start, start + 10 * DAY, 300):
        burst = start + 8 * DAY <= t < start + 8 * DAY + 6 * 3600
        for name in ("hot1", "hot2", "q1", "q2", "q3", "q4"):
            usage = (9.5 if burst else 7.0) if name.startswith("hot") else 1.0
            rows.append((name, t, 8, usage, GIB, GIB // 2))
    result, _ = replay(tmp_path, rows, node_cpu_cores=16, node_memory_bytes=256 * GIB)
    ours = result.daily["oversale"]
    burst_days = [i for i, entry in enumerate(ours) if entry["cpu_hot_samples"]]
    assert burst_days and burst_days[0] + 1 < len(ours), ours
    before, after = ours[burst_days[0]], ours[burst_days[0] + 1]
    # The account had seen nothing hot: its multiplier was 1; the burst backs the next day's targets off.
    assert before["cpu_account_multiplier"] == 1.0 and before["memory_account_multiplier"] == 1.0
    assert 0.5 <= after["cpu_account_multiplier"] < 1.0 and after["memory_account_multiplier"] == 1.0
    assert after["cpu_ratio_mean"] < before["cpu_ratio_mean"] and before["cpu_ratio_max"] > 1
    assert 1 <= before["cpu_ratio_mean"] <= before["cpu_ratio_max"]
    # A system without an account has no multiplier; without overselling every ratio is 1.
    assert "cpu_account_multiplier" not in result.daily["none"][0]
    assert result.daily["none"][0]["cpu_ratio_mean"] == result.daily["none"][0]["cpu_ratio_max"] == 1.0
    # The report's table shows the multiplier beside our hot samples and nodes.
    row = next(line for line in hot_days_table(result.daily) if line.startswith(f"| {after['day']} | "))
    assert f"{after['cpu_hot_samples']} / {after['nodes']} x{after['cpu_account_multiplier']:.2f}" in row
    # The clairvoyant bound: each day's peak of summed usage over a node, 18 cores on days 7 and 9
    # and 23 on the burst day, of 16.
    assert result.clairvoyant_nodes == {"tuning": pytest.approx((18 + 23 + 18) / 16), "holdout": 0.0}
    # What the last day set, as `plan` prints it: one ratio pair per node of that day.
    last_ratios = [cpu for cpu, _ in result.last_day["oversale"]["node_ratios"]]
    assert len(last_ratios) == ours[-1]["nodes"] and round(max(last_ratios), 3) == ours[-1]["cpu_ratio_max"]
    # The same systems run again (another placement, the tuner's next candidate) start their
    # accounts afresh: the same days, the same figures.
    systems = default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget(), sweep=False)
    config, said = Config(node_cpu_cores=16, node_memory_bytes=256 * GIB, holdout_days=0), []
    first = run(read_trace(tmp_path / "trace.csv"), config, systems, said.append)
    assert run(read_trace(tmp_path / "trace.csv"), config, systems).daily == first.daily
    assert [line.split(" in ")[0] for line in said] == [
        f"day {n}/3 (tuning, 6 workloads, {len(systems)} systems)" for n in (1, 2, 3)]
    assert said[-1].endswith("; about 0s left")


def test_a_node_at_its_capacity_is_not_hot_and_a_workload_at_its_request_not_above_it():
    """Hot time and above-request count usage strictly above the line, as the live account does
    (``oversale.budget.hot_time``): a node running exactly its real capacity is full, not over."""
    from simulator.replay import Placed, Tally

    slots = 4
    cpu = np.array([[10_000.0, 10_000.0, 10_000.0, 10_001.0], [6_000.0, 6_000.0, 6_001.0, 6_000.0]])
    usage = {"cpu": cpu, "memory": np.full((2, slots), float(GIB))}
    empty = no_history(2)
    # The peaks: as the averages but for a half core more in the first slot (over, where the
    # average was full) and the second at exactly 16 cores (full).
    peaks = cpu + np.array([[500.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    day = Day(7, 0.0, np.arange(slots), {}, usage, np.ones((2, slots), dtype=bool), empty, "tuning", peak_cpu=peaks)
    placed = Placed(np.array([0, 0]), {"cpu": np.array([10_000.0, 6_000.0]), "memory": np.full(2, float(GIB))},
                    [(1.0, 1.0)])
    tally = Tally()
    tally.count(day, placed, (16_000.0, 64.0 * GIB))
    assert tally.violations == {"cpu": 2, "memory": 0} and tally.node_samples == {"cpu": 4, "memory": 4}
    assert tally.above_request == {"cpu": 2, "memory": 0} and tally.workload_samples == {"cpu": 8, "memory": 8}
    assert (tally.violations_at_peaks, tally.peak_samples) == (3, 4)
    assert tally.evictions == 0 and tally.moved_again == 0, "nothing was moved: a placement without remediation"
    # A remediated day's moves add up day by day.
    placed.evictions, placed.moved_again = 2, 1
    tally.count(day, placed, (16_000.0, 64.0 * GIB))
    tally.count(day, placed, (16_000.0, 64.0 * GIB))
    assert (tally.evictions, tally.moved_again, tally.days, tally.node_days) == (4, 2, 3.0, 3.0)


def test_a_splits_tally_is_the_sum_of_its_days_every_figure_of_them():
    from simulator.replay import Tally

    first = Tally(1.0, 12.0, {"cpu": 3456, "memory": 3456}, {"cpu": 5, "memory": 1}, {"cpu": 9, "memory": 9},
                  {"cpu": 2, "memory": 0}, evictions=4, moved_again=1, peak_samples=3456, violations_at_peaks=7)
    second = Tally(0.5, 5.0, {"cpu": 1440, "memory": 1440}, {"cpu": 0, "memory": 2}, {"cpu": 4, "memory": 4},
                   {"cpu": 1, "memory": 1}, evictions=2, moved_again=2, peak_samples=1440, violations_at_peaks=3)
    assert first.add(second) == Tally(1.5, 17.0, {"cpu": 4896, "memory": 4896}, {"cpu": 5, "memory": 3},
                                      {"cpu": 13, "memory": 13}, {"cpu": 3, "memory": 1}, evictions=6, moved_again=3,
                                      peak_samples=4896, violations_at_peaks=10)


def test_the_command_warns_of_workloads_larger_than_a_node_and_of_nothing_else():
    """A request above the node's size (not one equal to it) at any moment of the trace, cpu or
    memory, is told with the count and one name, and how to fit them."""
    from simulator.replay import oversized_warning
    from simulator.trace import Workload

    def workload(name, cpu_cores, memory_gib, slots=3):
        return Workload(name, np.arange(slots), {"cpu": np.full(slots, cpu_cores * 1000.0),
                                                 "memory": np.full(slots, memory_gib * GIB)},
                        {"cpu": np.zeros(slots), "memory": np.zeros(slots)})

    config = Config(node_cpu_cores=32, node_memory_bytes=256 * GIB)
    # A workload left with no sample (every row of it powered off) requests nothing.
    fitting = [workload("a", 32, 256), workload("b", 4, 16), workload("off", 0, 0, slots=0)]
    assert oversized_warning(fitting, config) is None
    assert oversized_warning([*fitting, workload("big-cpu", 33, 16)], config) == (
        "warning: 1 of 4 workloads request more than a node holds (32 cores, 256 GiB; e.g. big-cpu): each such Pod "
        "gets a node of its own, above its capacity by requests; a larger --node-cores or --node-memory fits them")
    assert oversized_warning([workload("big-memory", 4, 511), workload("big-cpu", 40, 1)], config).startswith(
        "warning: 2 of 2 workloads request more than a node holds (32 cores, 256 GiB; e.g. big-memory): ")


def test_a_day_holds_the_samples_of_its_first_and_last_slot_and_its_window_the_history_before_it():
    """Day 0 starts at the trace's first sample; a workload seen only in the first or only in the
    last 5 minutes of a day runs that day; the window before it begins exactly ``history_days``
    before the day, and a workload's history within the last days keeps only its own samples."""
    from simulator.replay import build_day, day_grid, trace_days
    from simulator.trace import Workload

    per_day = DAY // SLOT
    origin = 1000

    def workload(name, slots):
        slots = np.asarray(slots)
        ones = np.ones(len(slots))
        return Workload(name, slots, {"cpu": ones * 1000, "memory": ones * GIB},
                        {"cpu": ones * 500, "memory": ones * GIB})

    day8 = origin + 8 * per_day
    steady = workload("steady", np.arange(origin + 2, origin + 10 * per_day))
    first = workload("first-slot", [origin, day8])  # day 0's first slot and day 8's
    last = workload("last-slot", [day8 + per_day - 1])
    window_start = day8 - 7 * per_day
    edge = workload("window-edge", [window_start - 1, window_start, day8 + 5])
    workloads = [steady, first, last, edge]
    config = Config(warmup_days=8, holdout_days=1, window_days=7, request_window_days=7)
    assert trace_days(workloads) == 10 and day_grid(workloads, config) == (origin, [8, 9])
    with pytest.raises(TraceError) as short:
        day_grid(workloads, Config(warmup_days=10))
    assert str(short.value) == "the trace spans 10 days, not more than the 10-day warm-up"
    day = build_day(workloads, origin, 8, config, "tuning")
    assert day.names == ["steady", "first-slot", "last-slot", "window-edge"]
    assert day.present[1].tolist() == [True] + [False] * (per_day - 1)
    assert day.present[2].tolist() == [False] * (per_day - 1) + [True]
    # The window: 7 days of slots ending just before the day; the sample one slot earlier is not in it.
    assert len(day.window.times) == 7 * per_day and day.window.times[0] == window_start * SLOT
    assert day.window.present[3].tolist() == [True] + [False] * (7 * per_day - 1)
    # The last day of the window: only the steady workload's own samples, none of the edge's.
    last_day = day.window.within(1)
    assert int(last_day.sum()) == per_day
    assert len(day.window.history(0, last_day)["cpu"][0]) == per_day
    assert len(day.window.history(3, last_day)["cpu"][0]) == 0
    assert len(day.window.history(3)["cpu"][0]) == 1
    # A window with no slots at all (no history kept) has no last days either.
    assert no_history(1).within(7).tolist() == []


def test_pods_are_placed_largest_first_by_their_larger_share_of_a_node():
    """A Pod's size is the larger of its cpu and memory shares of a node, so a memory-heavy Pod
    with little cpu goes before a cpu-heavy one that takes less of the node."""
    from simulator.replay import largest_first

    node = (16_000.0, 64.0 * GIB)
    pods = [(8_000.0, 1.0 * GIB), (1_000.0, 60.0 * GIB), (500.0, 0.5 * GIB), (12_000.0, 2.0 * GIB)]
    assert largest_first(pods, node) == [1, 3, 0, 2]


def test_the_replays_account_backs_off_after_a_hot_day_and_rises_once_its_week_is_quiet():
    """The replay's account sees each day once, the next morning, over the last 7 days it saw: a
    day 2.17 budgets hot backs cpu off at once (memory, unspent, stays), the week still over the
    budget the day after backs it off again, a week under the budget but above half of it holds,
    and under half it rises."""
    from oversale.budget import HotTime
    from simulator.policies import BudgetAccount

    account = BudgetAccount(HotTimeBudget(0.001, 0.0001))
    quiet, day_samples = HotTime(0, 4608), 4608  # 16 nodes x 288
    account.observe(8, {"cpu": HotTime(10, day_samples), "memory": quiet})
    first = account.multiplier("cpu")
    assert first == pytest.approx((10 / day_samples / 0.001) ** -0.5) and account.multiplier("memory") == 1.0
    multipliers = []
    for day in range(9, 17):
        account.observe(day, {"cpu": quiet, "memory": quiet})
        multipliers.append(account.multiplier("cpu"))
    # Day 9: 10 hot of 9,216 is over the budget still; days 10 and 11: between half of it and it;
    # from day 12 (10 of 23,040) under half: a rise a day.
    assert multipliers[0] < first and multipliers[1] == multipliers[2] == multipliers[0]
    assert multipliers[3] == pytest.approx(multipliers[0] * 1.05) and multipliers[3:] == sorted(multipliers[3:])
    assert len(account.days) == 7
    account.reset()
    assert account.multiplier("cpu") == 1.0 and account.days == []


def replay_remediation(cores_per_node: list[list[float | list[float]]], config, slots: int = 12):
    """Replay the remediator over a day on 16-core nodes (node n runs the workloads of
    ``cores_per_node[n]``, each using the cores given, the same in every sample or one figure a
    sample, and requesting its first); the placement it leaves."""
    from simulator.replay import Day, Placed, remediate

    cores = [c for node in cores_per_node for c in node]
    owners = np.array([n for n, node in enumerate(cores_per_node) for _ in node])
    count = len(cores)
    used = np.array([c if isinstance(c, list) else [c] * slots for c in cores], dtype=float) * 1000.0
    usage = {"cpu": used, "memory": np.full((count, slots), float(GIB))}
    empty = no_history(count)
    day = Day(7, 0.0, np.arange(slots), {}, usage, np.ones((count, slots), dtype=bool), empty, "tuning")
    placed = Placed(owners, {"cpu": used[:, 0].copy(), "memory": np.full(count, float(GIB))},
                    [(1.0, 1.0)] * len(cores_per_node))
    remediate(day, placed, (16_000.0, 64.0 * GIB), config, LoadConfig())
    assert placed.moved is not None
    return placed


def remediated(cores_per_node: list[list[float]], config) -> np.ndarray:
    """The number of workloads on each node in each sample after :func:`replay_remediation` over
    a day of constant usage."""
    moved = replay_remediation(cores_per_node, config).moved
    return np.array([[int((moved[:, slot] == node).sum()) for slot in range(moved.shape[1])]
                     for node in range(len(cores_per_node))])


def test_the_replayed_remediator_keeps_its_per_pass_limit_and_leaves_a_node_alone_for_its_cooldown():
    """As live, at 60 s a look: ten hot looks are two samples, a node's cooldown of 600 s two more.
    Three nodes run 16.5 of 16 cores (over the 95% runtime watermark) from the first sample; with
    at most two evictions a pass, two move one workload each in the second sample (cool from the
    third on) and the third waits a sample. A node of five 4-core workloads (20 cores) is still hot
    after its first move, and moves again only when it has been hot long enough again and its
    cooldown is over."""
    from oversale.remediation import RemediationConfig

    hot, cool = [5.5, 5.5, 5.5], [1.0]
    counts = remediated([hot, hot, hot, cool, cool, cool], RemediationConfig(max_per_pass=2))
    assert counts[:3, :4].tolist() == [[3, 3, 2, 2], [3, 3, 2, 2], [3, 3, 3, 2]]
    assert counts[3:, -1].tolist() == [2, 2, 2], "each cool node took one"
    counts = remediated([[4.0] * 5, cool, cool, cool], RemediationConfig())
    assert counts[0].tolist() == [5, 5, 4, 4, 3] + [3] * 7
    # Five hot looks are one sample: the node acts at once, then waits out its cooldown (two
    # samples) though hot again after one.
    counts = remediated([[4.0] * 5, cool, cool, cool], RemediationConfig(observations=5))
    assert counts[0].tolist() == [5, 4, 4, 3] + [3] * 8
    # With no cooldown, a node that acted still waits to be hot long enough again (two samples).
    counts = remediated([[4.0] * 5, cool, cool, cool], RemediationConfig(node_cooldown_seconds=0))
    assert counts[0].tolist() == [5, 5, 4, 4, 3] + [3] * 7


def test_a_workload_moved_off_one_hot_node_is_moved_again_only_after_its_own_cooldown():
    """A workload of 4 cores beside one of 13 makes node 0 hot (17 of 16 cores, over the 95%
    runtime watermark): two samples on (ten looks at 60 s), it moves to the coolest node, node 1.
    Node 1's other workload rises from 1 core to 13 in the sixth sample, and node 1 has been hot
    long enough in the seventh; but the 4-core workload is in its 30-minute cooldown (six samples,
    to the eighth) and the 13-core one fits nowhere below the scheduling watermark, so nothing
    moves until the cooldown ends. Then the 4-core workload moves again, to node 2: two
    evictions, one workload moved more than once."""
    from oversale.remediation import RemediationConfig

    rising = [1.0] * 5 + [13.0] * 9
    placed = replay_remediation([[4.0, 13.0], [rising], [2.0]], RemediationConfig(), slots=14)
    assert placed.moved[0].tolist() == [0, 0] + [1] * 6 + [2] * 6
    assert placed.moved[1:].tolist() == [[0] * 14, [1] * 14, [2] * 14], "the others stay"
    assert (placed.evictions, placed.moved_again) == (2, 1)
    # Without a workload cooldown it moves as soon as node 1 has been hot long enough.
    placed = replay_remediation([[4.0, 13.0], [rising], [2.0]], RemediationConfig(workload_cooldown_seconds=0),
                                slots=14)
    assert placed.moved[0].tolist() == [0, 0] + [1] * 5 + [2] * 7
    assert (placed.evictions, placed.moved_again) == (2, 1)


def test_a_run_says_first_what_will_not_fit_and_refuses_two_systems_of_one_name(tmp_path):
    from simulator.policies import System, no_compression

    rows = [(name, t, cores, 1.0, GIB, GIB // 2) for t in range(10 * DAY, 18 * DAY, 300)
            for name, cores in (("big", 12), ("small", 2))]
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    plain = System("none", "", no_compression)
    said: list[str] = []
    run(read_trace(trace), Config(node_cpu_cores=8, holdout_days=0), [plain], said.append)
    assert said[0].startswith("warning: 1 of 2 workloads request more than a node holds (8 cores, 256 GiB; e.g. big)")
    assert said[1].startswith("day 1/1 (tuning, 2 workloads, 1 system) in ")
    with pytest.raises(ValueError, match=r"^system names must be unique: \['none'\]$"):
        run(read_trace(trace), Config(holdout_days=0), [plain, System("other", "", no_compression), plain])


def test_each_system_says_its_kind_and_what_it_adds_as_summary_json_reports_them():
    """``kind``: requests only (compression), node ratios only (node-oversale) or both (system);
    ``adds``: the steps beyond placing by requests, which make one of ours a variant."""
    from decimal import Decimal

    from oversale.budget import AccountConfig
    from oversale.remediation import RemediationConfig
    from oversale.usage import Watermarks
    from simulator.policies import BUDGET_SWEEP, GOAL_RANGE_TEXT, budget_name

    systems = {s.name: s for s in default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget(),
                                                   sweep=False)}
    kinds = {name: system.kind for name, system in systems.items()}
    assert {name: kinds[name] for name in ("none", "oversale-pods", "oversale-nodes", "oversale", "vpa-style",
                                           "katalyst-realtime", "crane-style+katalyst", "static-2")} == {
        "none": "compression", "oversale-pods": "compression", "oversale-nodes": "node-oversale",
        "oversale": "system", "vpa-style": "compression", "katalyst-realtime": "node-oversale",
        "crane-style+katalyst": "system", "static-2": "compression"}
    adds = {name: system.adds for name, system in systems.items() if system.adds}
    assert adds == {"oversale+load-aware": ["load-aware"], "oversale+remediation": ["remediation"],
                    "crane-style+load-aware": ["load-aware"], "koordinator-batch+load-aware": ["load-aware"]}
    # Our extender estimates a Pod by its workload's usage; Crane's and Koordinator's by its request.
    assert [name for name, system in systems.items() if system.load and system.estimate_from_usage] == \
        ["oversale+load-aware"]
    # What the report prints beside our system: the defaults docs/backtest.md gives.
    assert systems["oversale"].source == (
        "this project at a cpu hot-time budget of 0.100% (memory 0.010%): requests P99.9 x 1.05 within ratios "
        "0.5..8; node ratio 1 x requested / P99.9 of the node's summed usage (cpu), 0.6 x requested / P99.99 "
        "(memory), at most 5 / 1.2, backed off by the hot-time account")
    # A family is a curve on the plot and a peer read at our hot time: a peer placed load-aware
    # belongs to its own family, a static ratio to the static family; anything else is its own.
    assert {name: s.family for name, s in systems.items() if s.family != name} == {
        "crane-style+load-aware": "crane-style", "koordinator-batch+load-aware": "koordinator-batch",
        "static-2": "static", "static-oversale-1.5": "static-oversale"}
    # The peers' variants along their knobs only with --frontier.
    assert not [name for name in systems if name.startswith("vpa-style x")]
    assert "vpa-style x1.5" in [s.name for s in default_systems(CompressionEstimator(), OversaleEstimator(),
                                                                HotTimeBudget(), frontier=True, sweep=False)]
    # By default the budget sweep runs too, each budget of our curve but the one the system runs at.
    swept = [s.name for s in default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget())]
    assert [name for name in swept if name.startswith("oversale budget")] == [
        budget_name(b) for b in BUDGET_SWEEP if b != 0.001] == [
        "oversale budget 0.01%", "oversale budget 0.05%", "oversale budget 0.20%", "oversale budget 0.50%",
        "oversale budget 1.00%", "oversale budget 5.00%"]
    assert {s.family for s in default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget())
            if s.name.startswith("oversale budget")} == {"oversale"}, "one curve with the default budget's point"
    assert GOAL_RANGE_TEXT == "0.05% to 1%"
    # The load-aware and remediation knobs given reach the variants, and their sources say so.
    load = LoadConfig(watermarks=Watermarks(cpu_average=Decimal("0.5"), cpu_peak=Decimal("0.7")),
                      history_peak_seconds=6 * 3600)
    remediation = RemediationConfig(max_per_pass=2)
    given = {s.name: s for s in default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget(),
                                                 load=load, remediation=remediation, sweep=False)}
    assert given["oversale+load-aware"].load is load and given["oversale+remediation"].remediation is remediation
    assert given["oversale+load-aware"].source.endswith(
        "; load-aware placement (scheduling watermarks 0.5/0.7, the cpu maximum over the last 6 h as read from "
        "Prometheus (OVERSALE_LOAD_HISTORY=prometheus))")
    watermarks = LoadConfig().watermarks
    assert systems["oversale+load-aware"].source.endswith(
        f"; load-aware placement (scheduling watermarks {watermarks.cpu_average}/{watermarks.cpu_peak})")
    # An account's knobs given (the tuner's grid) reach every account of ours, nodes alone included.
    knobs = AccountConfig(min_multiplier=0.8)
    tuned = default_systems(CompressionEstimator(), OversaleEstimator(), HotTimeBudget(), account=knobs)
    assert {s.name: s.account.config for s in tuned if s.account} == dict.fromkeys(
        [s.name for s in tuned if s.ours and s.name != "oversale-pods"], knobs)


def test_the_commands_defaults_are_the_replays():
    """``backtest`` and ``simulator.tune`` with no cluster option replay what ``Config()`` says
    (32-core, 256 GiB nodes, a 7-day warm-up, a 14-day holdout, the settings' two windows), so a
    test or a script building ``Config()`` runs the cluster the docs describe."""
    import argparse

    from simulator.cli import add_cluster_arguments, cluster_config

    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    assert cluster_config(parser.parse_args(["--trace", "t.csv"]), parser) == Config()
