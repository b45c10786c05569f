"""The backtest: a hand-computed case in the generic format, and a slice of the July Bitbrains
trace through the command."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from oversale.estimator import CompressionEstimator, OversaleEstimator
from reconcilers.backtest import (
    Config,
    TraceError,
    default_policies,
    first_fit_decreasing,
    katalyst_realtime,
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
    assert rows_by_policy["oversale"]["nodes_per_day"] == 1
    assert rows_by_policy["oversale"]["capacity_freed"] == 0.5
    assert rows_by_policy["oversale"]["cpu_violation_rate"] == 0
    # ...but the hot workload uses 9 cores above its compressed 2 in every sample of the day: 1/4.
    assert rows_by_policy["oversale"]["cpu_above_request"] == 0.25
    # Static ratio 2: 4 cores each, 16 on one node: also one node.
    assert rows_by_policy["static-2"]["nodes_per_day"] == 1


def test_katalyst_formula_matches_its_definition():
    # A=32, T=0.6, U=8, R=28: ((19.2 - 8) / max(min(8/28, 1), 0.4) + 28) / 32 = (11.2 / 0.4 + 28) / 32 = 1.75
    assert katalyst_realtime("cpu", 32, 28, [0.0], [8.0]) == pytest.approx(1.75)


def test_first_fit_decreasing_packs_largest_first():
    assert first_fit_decreasing([(3, 1), (9, 1), (6, 1), (1, 1)], lambda _: (10, 10)) == [1, 0, 1, 0]


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
    assert 0 < policies["oversale"]["capacity_freed"] < 1
    assert policies["static-1.5"]["capacity_freed"] > 0
    assert "Katalyst" in policies["katalyst-realtime"]["source"]
    report = (out_dir / "report.md").read_text()
    assert "| policy | kind | nodes/day | capacity freed |" in report
    for image in ("savings_vs_violations.png", "node_week.png"):
        assert (out_dir / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
