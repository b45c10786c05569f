"""The backtest: a hand-computed case in the generic format, and a slice of the July Bitbrains
trace through the command."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from oversale.estimator import CompressionEstimator, OversaleEstimator
from reconcilers.backtest import (
    Config,
    TraceError,
    default_policies,
    first_fit_decreasing,
    frontier,
    katalyst_realtime,
    ours_compression,
    read_trace,
    run,
    summary,
)
from tests.conftest import ROOT, SHARED

BITBRAINS = SHARED / "traces" / "bitbrains-rnd-2013-07" / "rnd_2013-07_cpu_mem.csv.gz"
DAY = 86400
GIB = 2**30


def write_generic(path, rows):
    with path.open("w") as out:
        out.write("workload,timestamp_s,cpu_request_cores,cpu_usage_cores,memory_request_bytes,memory_usage_bytes\n")
        for row in rows:
            out.write(",".join(str(v) for v in row) + "\n")


def test_hand_computed_case(tmp_path):
    # Eight days, a sample every 5 minutes. Four workloads each request 8 cores and 32 GiB:
    # three use a steady 1 core and 1 GiB; one ("hot") uses 9 cores on day 8 only.
    rows = []
    start = 10 * DAY  # a day boundary
    for t in range(start, start + 8 * DAY, 300):
        for name in ("a", "b", "c", "hot"):
            usage = 9.0 if name == "hot" and t >= start + 7 * DAY else 1.0
            rows.append((name, t, 8, usage, 32 * GIB, GIB))
    rows.append(("off", start, 0, 0, GIB, 0))  # a powered-off row is dropped
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    workloads = read_trace(trace, "generic")
    assert sorted(w.name for w in workloads) == ["a", "b", "c", "hot"]

    compression, oversale = default_policies(CompressionEstimator(), OversaleEstimator())
    config = Config(node_cpu_cores=16, node_memory_bytes=256 * GIB, warmup_days=7, window_days=7)
    result = run(workloads, config, compression, oversale)
    rows_by_policy = {row["policy"]: row for row in summary(result, compression, oversale)}
    assert result["days"] == 1

    # No compression: 4 x 8 cores on 16-core nodes -> 2 nodes; the hot workload's node carries
    # 9 + 1 = 10 cores: never over 16, so no violation.
    assert rows_by_policy["none"]["nodes_per_day"] == 2
    assert rows_by_policy["none"]["cpu_violation_rate"] == 0
    # This project: demand = P95(1 core) x 1.15 = 1.15 -> 8 / 1.15 = 6.95, capped at the maximum
    # ratio 4: 2 cores each. 4 x 2 = 8 cores fit one 16-core node, where day 8 sums 9 + 3 = 12.
    assert rows_by_policy["oversale-pods"]["nodes_per_day"] == 1
    assert rows_by_policy["oversale-pods"]["capacity_freed"] == 0.5
    assert rows_by_policy["oversale-pods"]["cpu_violation_rate"] == 0
    # ...but the hot workload uses 9 cores above its compressed 2 in every sample of the day: 1/4.
    assert rows_by_policy["oversale-pods"]["cpu_above_request"] == 0.25
    # Static ratio 2: 4 cores each, 16 on one node: also one node.
    assert rows_by_policy["static-2"]["nodes_per_day"] == 1


def test_hand_computed_oversale_case(tmp_path):
    # Eight days; six workloads each request 8 cores and 1 GiB and use 0.5 GiB. "hot1" and "hot2" use
    # 7 cores (7.6 on the scored day), "q1".."q4" use 1 core. Nodes of 16 cores.
    rows = []
    start = 10 * DAY
    names = ("hot1", "hot2", "q1", "q2", "q3", "q4")
    for t in range(start, start + 8 * DAY, 300):
        for name in names:
            usage = (7.6 if t >= start + 7 * DAY else 7.0) if name.startswith("hot") else 1.0
            rows.append((name, t, 8, usage, GIB, GIB // 2))
    trace = tmp_path / "trace.csv"
    write_generic(trace, rows)
    compression, oversale = default_policies(CompressionEstimator(), OversaleEstimator())
    config = Config(node_cpu_cores=16, node_memory_bytes=256 * GIB, warmup_days=7, window_days=7)
    result = run(read_trace(trace, "generic"), config, compression, oversale)
    by_policy = {row["policy"]: row for row in summary(result, compression, oversale)}

    # Without overselling: 48 cores of requests, two per 16-core node -> 3 nodes.
    assert by_policy["none"]["nodes_per_day"] == 3
    # This project, closed loop. hot1 arrives: 0.7 x 8 / 7 = 0.8 -> ratio 1. hot2 fills the 16
    # cores: 0.7 x 16 / 14 = 0.8, below the floor 16 / 16 x 1.05 = 1.05, so the node is held at 1
    # and gains no room. q1 opens a node: 0.7 x 8 / 1 = 5.6 -> the maximum 3, 48 cores; q2..q4 join
    # it (32 cores requested, 4 used: still 3). Two nodes; the hot node carries 15.2 <= 16 cores.
    assert by_policy["oversale-nodes"]["nodes_per_day"] == 2
    assert by_policy["oversale-nodes"]["capacity_freed"] == pytest.approx(1 / 3, abs=1e-4)
    assert by_policy["oversale-nodes"]["cpu_violation_rate"] == 0
    # Static 1.5 gives every node 24 cores: hot1, hot2 and q1 share one, which uses 16.2 cores all
    # day on the scored day: one of the two nodes is over its real capacity in every sample.
    assert by_policy["static-oversale-1.5"]["nodes_per_day"] == 2
    assert by_policy["static-oversale-1.5"]["cpu_violation_rate"] == 0.5
    # Katalyst: hot1 alone gives ((9.6 - 7) / 0.875 + 8) / 16 = 0.69 -> 1, so it packs like ours.
    assert by_policy["katalyst-realtime"]["nodes_per_day"] == 2
    assert by_policy["katalyst-realtime"]["cpu_violation_rate"] == 0


def test_the_frontier_reads_our_curve_at_each_peers_violation_rate():
    rows = [
        {"policy": "none", "kind": "compression", "family": "none", "capacity_freed": 0.0, "cpu_violation_rate": 0.02},
        {"policy": "oversale-pods", "kind": "compression", "family": "oversale-pods", "capacity_freed": 0.5,
         "cpu_violation_rate": 0.04},
        {"policy": "peer", "kind": "compression", "family": "peer", "capacity_freed": 0.3, "cpu_violation_rate": 0.03},
        {"policy": "greedy", "kind": "compression", "family": "greedy", "capacity_freed": 0.6,
         "cpu_violation_rate": 0.05},
        {"policy": "safe", "kind": "compression", "family": "safe", "capacity_freed": 0.1, "cpu_violation_rate": 0.01},
    ]
    verdicts = {v["peer"]: v for v in frontier(rows)}
    # Halfway between (2%, 0) and (4%, 50%): 25% at 3%, less than the peer's 30%.
    assert verdicts["peer"]["ours_freed"] == pytest.approx(0.25) and not verdicts["peer"]["matched"]
    # Beyond our riskiest point we are credited only with what that point frees.
    assert verdicts["greedy"]["ours_freed"] == 0.5 and not verdicts["greedy"]["matched"]
    # Below our safest point we have nothing to offer.
    assert verdicts["safe"]["ours_freed"] is None and not verdicts["safe"]["matched"]


def test_the_raising_what_if_gives_over_users_their_demand_up_to_twice_the_request():
    times = np.arange(400, dtype=np.float64) * 300  # 33 h: enough history
    history = {"cpu": (times, np.full(400, 10000.0))}  # 10 cores all along, against 8 requested
    now = float(times[-1]) + 300
    assert ours_compression(CompressionEstimator())("cpu", 8000, history, now) == 8000  # never raised
    raising = ours_compression(CompressionEstimator(), raise_up_to=2)
    assert raising("cpu", 8000, history, now) == 11500  # P95 10 cores x 1.15
    assert raising("cpu", 4000, history, now) == 8000  # 11.5 cores wanted, 2 x 4 at most
    assert raising("cpu", 40000, history, now) == ours_compression(CompressionEstimator())("cpu", 40000, history, now)


def test_katalyst_formula_matches_its_definition():
    # A=32, T=0.6, U=8, R=28: ((19.2 - 8) / max(min(8/28, 1), 0.4) + 28) / 32 = (11.2 / 0.4 + 28) / 32 = 1.75
    assert katalyst_realtime()("cpu", 32, 28, np.array([0.0]), np.array([8.0]), 1.0) == pytest.approx(1.75)


def test_first_fit_decreasing_packs_largest_first():
    assert first_fit_decreasing([(3, 1), (9, 1), (6, 1), (1, 1)], (10, 10)) == [1, 0, 1, 0]


def test_bad_traces_are_refused_with_a_message(tmp_path):
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="not a generic trace"):
        read_trace(wrong, "generic")


def test_a_slice_of_the_july_bitbrains_trace_through_the_command(tmp_path):
    # The first 20 VMs (the file is sorted by VM).
    slice_path = tmp_path / "slice.csv"
    with gzip.open(BITBRAINS, "rt") as source, slice_path.open("w") as out:
        out.write(source.readline())
        for line in source:
            if int(line.split(",", 1)[0]) > 20:
                break
            out.write(line)
    out_dir = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "reconcilers", "backtest", "--trace", str(slice_path),
                             "--format", "bitbrains-long", "--out", str(out_dir), "--node-cores", "16"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "day 1/" in result.stderr, "progress is shown"
    data = json.loads((out_dir / "summary.json").read_text())
    policies = {p["policy"]: p for p in data["policies"]}
    assert data["days_evaluated"] >= 20
    assert policies["none"]["capacity_freed"] == 0
    assert 0 < policies["oversale-pods"]["capacity_freed"] < 1
    assert policies["static-oversale-1.5"]["capacity_freed"] > 0
    assert "Katalyst" in policies["katalyst-realtime"]["source"]
    report = (out_dir / "report.md").read_text()
    assert "| policy | kind | nodes/day | capacity freed |" in report
    for image in ("savings_vs_violations.png", "node_week.png"):
        assert (out_dir / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
