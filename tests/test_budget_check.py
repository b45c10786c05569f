"""The node-trace check of the hot-time budget (``python -m simulator.budget_check``): a
hand-computed node, the Alibaba machine trace through the command, and bad input."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from oversale.settings import Settings
from simulator.budget_check import NodeSeries, averaged, check_budget, format_table, read_nodes
from simulator.trace import TraceError
from tests.conftest import ROOT, SHARED

ALIBABA = SHARED / "traces" / "alibaba-2018-machines" / "machine_usage_first100k_rows.csv.gz"
DAY = 86400
STEP = 300


def spiky_node(path, start=0):
    """Five-minute samples over four days from ``start`` at utilisation 0.5, except ten samples of
    0.6 on day 2."""
    with path.open("w") as out:
        out.write("node,timestamp_s,cpu_utilisation\n")
        for step in range(4 * DAY // STEP):
            spike = step * STEP // DAY == 2 and step % 20 == 0 and step % (DAY // STEP) < 200
            out.write(f"n1,{start + step * STEP},{0.6 if spike else 0.5}\n")
    return path


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simulator.budget_check", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=None if env is None else {**os.environ, **env})


def test_a_node_over_its_quantile_is_hot_for_exactly_those_samples_and_the_account_backs_it_off(tmp_path):
    nodes = read_nodes(spiky_node(tmp_path / "n.csv"))
    assert [n.name for n in nodes] == ["n1"] and len(nodes[0].times) == 4 * 288
    settings = Settings.from_env({})
    # Day 1's window (day 0) covers less than the estimator's one day: not yet under the budget.
    # Day 2: the window's quantile is 0.5, so the ratio is 2 and each 0.6 sample is hot (1.2 > 1).
    # Day 3: the quantile of days 0-2 at 1 - 4 x 0.1% is 0.6 (ten samples above rank 859.5 of
    # 864): ratio 1/0.6, nothing hot.
    alone = check_budget(nodes, 0.001, settings, window_days=7, with_account=False)
    assert alone.node_days == 2 and alone.oversold_node_days == 2
    assert (alone.hot.hot_samples, alone.hot.samples) == (10, 576)
    assert alone.mean_ratio == pytest.approx((2 + 1.666) / 2, abs=0.01)
    # The account sees day 2 at 10/288 = 3.5% against 0.1%: it halves the target, and day 3 at
    # 0.5 / 0.6 is not oversold at all.
    kept = check_budget(nodes, 0.001, settings, window_days=7)
    assert kept.node_days == 2 and kept.oversold_node_days == 1
    assert (kept.hot.hot_samples, kept.hot.samples) == (10, 576) and kept.mean_ratio == pytest.approx(1.5)
    assert [(d["day"], d["cpu_hot_samples"]) for d in kept.days] == [(2, 10), (3, 0)]
    # A budget that allows it (5%: the node's P80) keeps the ratio at 2 on day 3 too.
    loose = check_budget(nodes, 0.05, settings, window_days=7)
    assert loose.oversold_node_days == 2 and loose.mean_ratio == pytest.approx(2.0)



def test_the_command_checks_the_budgets_asked_and_says_what_it_read(tmp_path):
    # The hand-computed node above, stamped in Unix seconds as a real trace is: days count from
    # its first sample, not from 0.
    trace = spiky_node(tmp_path / "n.csv", start=1_700_000_000)
    out = tmp_path / "check.json"
    result = run("--trace", str(trace), "--budget", "0.001", "--budget", "0.05", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"{trace}: 1 nodes, 1152 samples over 4.0 days; calibration 4, window 7 days",
                                          "budget 0.10%: done", "budget 5.00%: done"]
    # Both counted days hold 288 samples, 10 of them hot: 1.736% of 576. A bootstrap over those two
    # days draws from none hot (0%) to day 2 twice (10 of 288 = 3.472%).
    assert [line for line in result.stdout.splitlines() if line.startswith("|")][2:] == [
        "| 0.10% | 1 of 2 | 1.50 | 1.736% (17.36x) | 0.000%..3.472% | 1.736% (17.36x) | 0.000%..3.472% |",
        "| 5.00% | 2 of 2 | 2.00 | 1.736% (0.35x) | 0.000%..3.472% | 1.736% (0.35x) | 0.000%..3.472% |"]
    # The goal counts the budgets of 0.05% to 1% only: 5% is not one.
    assert "of the 1 budget from 0.05% to 1%, 0 kept within 0.5x..1.5x" in result.stdout
    data = json.loads(out.read_text())
    assert {key: data[key] for key in ("trace", "nodes", "samples", "days", "budget_calibration", "window_days",
                                       "average_seconds")} == {
        "trace": str(trace), "nodes": 1, "samples": 1152, "days": 4.0, "budget_calibration": 4, "window_days": 7,
        "average_seconds": 0}
    assert [(b["hot_time_budget"], b["oversold_node_days"], b["node_days"], b["hot_samples"], b["samples"],
             b["cpu_violation_rate"], b["mean_ratio"], b["interval"]) for b in data["budgets"]] == [
        (0.001, 1, 2, 10, 576, 0.017361, 1.5, [0.0, 0.034722]), (0.05, 2, 2, 10, 576, 0.017361, 2.0, [0.0, 0.034722])]
    # Alone, day 3's ratio is 1 / 0.6 to two decimals down: 1.66 beside day 2's 2.
    assert data["budgets"][0]["estimator_alone"]["mean_ratio"] == 1.83
    # Without --json the figures are printed only; averaged samples and the window are said.
    averaged_run = run("--trace", str(trace), "--budget", "0.05", "--window-days", "1", "--average-seconds", "600")
    assert averaged_run.returncode == 0, averaged_run.stderr
    assert averaged_run.stderr.splitlines()[0] == (f"{trace}: 1 nodes, 576 samples over 4.0 days; calibration 4, "
                                                   "window 1 days, samples averaged over 600 s")
    assert [line[:9] for line in averaged_run.stdout.splitlines() if line.startswith("|")][2:] == ["| 5.00% |"]


def test_a_trace_too_short_for_any_ratio_says_so_in_its_row(tmp_path):
    one_day = tmp_path / "day.csv"
    one_day.write_text("node,timestamp_s,cpu_utilisation\n" + "".join(f"n1,{t},0.5\n" for t in range(0, DAY, STEP)))
    nodes = read_nodes(one_day)
    settings = Settings.from_env({})
    result = check_budget(nodes, 0.001, settings, window_days=7)
    assert (result.node_days, result.hot.samples, result.mean_ratio, result.days) == (0, 0, 1.0, [])
    row = format_table([(result, check_budget(nodes, 0.001, settings, window_days=7, with_account=False))])
    assert row.splitlines()[2] == ("| 0.10% | 0 of 0 | 1.00 | no node-day with a day of history | - "
                                   "| no node-day with a day of history | - |")


def test_a_node_day_counts_only_with_history_behind_it_and_samples_in_it(tmp_path):
    # "a" arrives on day 2 (one day of history at most by day 3: not enough); "b" is the
    # hand-computed node; "c" reports on days 0 and 1 only, so days 2 and 3 have history but no
    # samples of it. Only b's days 2 and 3 count, exactly as b alone.
    trace = spiky_node(tmp_path / "b.csv")
    with trace.open("a") as out:
        out.writelines(f"a,{t},0.9\n" for t in range(2 * DAY, 4 * DAY, STEP))
        out.writelines(f"c,{t},0.1\n" for t in range(0, 2 * DAY, STEP))
    trace.write_text(trace.read_text().replace("n1,", "b,"))
    settings = Settings.from_env({})
    both = check_budget(read_nodes(trace), 0.001, settings, window_days=7, with_account=False)
    alone = check_budget(read_nodes(spiky_node(tmp_path / "alone.csv")), 0.001, settings, window_days=7,
                         with_account=False)
    assert (both.node_days, both.hot.hot_samples, both.hot.samples) == (2, 10, 576)
    assert (both.mean_ratio, both.days) == (alone.mean_ratio, alone.days)


def test_the_days_run_to_the_last_sample_and_each_window_holds_its_first_second(tmp_path):
    # A sample at the very start of day 4 makes day 4 a node-day of one sample. The window is
    # [start - window, start): with one day of window and 23 h 55 min of history asked, day 1 sees
    # day 0's first sample (at 0 s) and so 23 h 55 min; a window open at its start sees 23 h 50 min.
    trace = spiky_node(tmp_path / "n.csv")
    with trace.open("a") as out:
        out.write(f"n1,{4 * DAY},0.5\n")
    settings = Settings.from_env({"OVERSALE_MIN_HISTORY": f"{DAY - STEP}s"})
    result = check_budget(read_nodes(trace), 0.001, settings, window_days=1, with_account=False)
    assert [(d["day"], d["node_samples"]) for d in result.days] == [(1, 288), (2, 288), (3, 288), (4, 1)]
    assert (result.node_days, result.hot.samples) == (4, 3 * 288 + 1)


def test_averaging_buckets_the_samples():
    node = NodeSeries("n", np.array([0.0, 100.0, 200.0, 300.0, 650.0]), np.array([0.2, 0.4, 0.6, 1.0, 0.5]))
    five = averaged(node, 300)
    assert five.times.tolist() == [0.0, 300.0, 600.0]
    assert five.utilisation.tolist() == pytest.approx([0.4, 1.0, 0.5])


@pytest.mark.shared
def test_the_alibaba_machine_trace_through_the_command(tmp_path):
    with gzip.open(ALIBABA, "rt") as source:
        rows = sum(1 for _ in source)
    out = tmp_path / "check.json"
    result = run("--trace", str(ALIBABA), "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "16 nodes" in result.stderr and "budget 0.10%: done" in result.stderr, "progress is shown"
    data = json.loads(out.read_text())
    assert data["nodes"] == 16 and data["samples"] == rows and data["budget_calibration"] == 4
    budgets = data["budgets"]
    assert [b["hot_time_budget"] for b in budgets] == [0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05]
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(budgets)
    # Under the table, which of the goal's budgets (0.05% to 1%) kept 0.5x..1.5x, as the backtest says it.
    goal = [line for line in result.stdout.splitlines() if line.startswith("**The goal on the node-days checked**")]
    kept = [b["hot_time_budget"] for b in budgets if 0.0005 <= b["hot_time_budget"] <= 0.01
            and 0.5 <= b["cpu_violation_rate"] / b["hot_time_budget"] <= 1.5]
    assert data["budget_goal"]["kept"] == kept and len(data["budget_goal"]["budgets"]) == 5
    assert len(goal) == 1 and f"of the 5 budgets from 0.05% to 1%, {len(kept)} kept within 0.5x..1.5x" in goal[0]
    for row, line in zip(budgets, table[2:], strict=True):
        for figures in (row, row["estimator_alone"]):
            assert figures["cpu_violation_rate"] == pytest.approx(figures["hot_samples"] / figures["samples"],
                                                                  abs=1e-6)
            low, high = figures["interval"]
            assert low <= figures["cpu_violation_rate"] <= high
            assert 0 < figures["node_days"] <= 16 * 7
        assert f"{row['oversold_node_days']} of {row['node_days']}" in line
        assert f"{row['cpu_violation_rate']:.3%}" in line
        # Without the account the quantile alone sets every ratio: every counted node is oversold.
        assert row["estimator_alone"]["oversold_node_days"] == row["estimator_alone"]["node_days"]


def test_bad_input_is_named(tmp_path):
    no_trace = run()
    assert no_trace.returncode == 2 and "the following arguments are required: --trace" in no_trace.stderr
    missing = run("--trace", str(tmp_path / "none.csv"))
    assert missing.returncode == 2 and "none.csv: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr
    workloads = tmp_path / "w.csv"
    workloads.write_text("workload,timestamp_s,cpu_request_cores\nvm1,0,4\n")
    wrong = run("--trace", str(workloads))
    assert wrong.returncode == 2 and "line 1" in wrong.stderr and "is --format right?" in wrong.stderr
    header = run("--trace", str(workloads), "--format", "node-generic")
    assert header.returncode == 2 and "node,timestamp_s,cpu_utilisation" in header.stderr
    negative = tmp_path / "neg.csv"
    negative.write_text("node,timestamp_s,cpu_utilisation\nn1,0,-0.5\n")
    assert "line 2" in run("--trace", str(negative)).stderr
    for args, said in ((["--budget", "0.5%"], "--budget: '0.5%'"), (["--budget", "0"], "nothing to check"),
                       (["--window-days", "0"], "--window-days"), (["--average-seconds", "nan"], "--average-seconds"),
                       (["--average-seconds", "-1"], "--average-seconds -1"),
                       (["--average-seconds", "inf"], "--average-seconds inf"), (["--json", str(tmp_path)], "--json")):
        bad = run("--trace", str(negative), *args)
        assert bad.returncode == 2 and said in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1, "one line, no usage block before it"
        assert bad.stderr.startswith("python -m simulator.budget_check: error: "), bad.stderr
    setting = run("--trace", str(negative), env={"OVERSALE_BUDGET_CALIBRATION": "-2"})
    assert setting.returncode == 2 and "OVERSALE_BUDGET_CALIBRATION" in setting.stderr, setting.stderr
    assert len(setting.stderr.strip().splitlines()) == 1 and "Traceback" not in setting.stderr
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(TraceError, match="empty"):
        read_nodes(tmp_path / "empty.csv")


def test_a_sample_the_machine_did_not_report_is_skipped_and_the_last_duplicate_kept(tmp_path):
    trace = tmp_path / "machines.csv"  # the Alibaba layout: headerless, percent
    trace.write_text("m_2,20,40,90,,,1,1,5\nm_1,10,,88,,,1,1,5\nm_1,0,50,88,,,1,1,5\nm_1,0,55,88,,,1,1,5\n")
    nodes = read_nodes(trace)
    assert [(n.name, n.times.tolist(), n.utilisation.tolist()) for n in nodes] == [
        ("m_1", [0.0], [0.55]), ("m_2", [20.0], [0.4])]


def test_each_unreadable_trace_is_refused_with_its_whole_reason_and_odd_rows_are_read(tmp_path):
    def refusal(name: str, text: str | None, fmt: str | None = None) -> str:
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(TraceError) as refused:
            read_nodes(path, fmt)
        return str(refused.value).removeprefix(f"{path}: ")

    header = "node,timestamp_s,cpu_utilisation\n"
    (tmp_path / "folder").mkdir()
    assert refusal("folder", None) == "a directory, not a trace file"
    assert refusal("empty.csv", "") == "empty"
    assert refusal("header-only.csv", header) == "no samples"
    assert refusal("w.csv", "workload,timestamp_s,cpu_request_cores\nvm1,0,4\n") == (
        "line 1: 'workload,timestamp_s,cpu_request_cores' is not machine_id,time_stamp,cpu_util_percent,... "
        "(is --format right?)")
    assert refusal("w.csv", None, "node-generic") == (
        "a node-generic trace starts with the header node,timestamp_s,cpu_utilisation")
    assert refusal("two.csv", header + "n1,5\n") == (
        "line 2: 'n1,5' is not node,timestamp_s,cpu_utilisation (is --format right?)")
    long = "n1," + "9" * 100 + ",x"
    assert refusal("long.csv", header + long + "\n") == (
        f"line 2: {long[:80]!r} is not node,timestamp_s,cpu_utilisation (is --format right?)")
    assert refusal("neg.csv", header + "n1,0,-0.5\n") == "line 2: utilisation -0.5 at 0.0 is not a non-negative number"
    assert refusal("nan.csv", header + "n1,nan,0.5\n") == "line 2: utilisation 0.5 at nan is not a non-negative number"
    assert refusal("inf.csv", header + "n1,0,inf\n") == "line 2: utilisation inf at 0.0 is not a non-negative number"
    unreadable = refusal("not.csv.gz", "not gzip\n")
    assert unreadable.startswith("cannot read it (") and unreadable.endswith(")") and "gzip" in unreadable
    # A column more after the three, a blank line and a sample not reported are read as they are.
    odd = tmp_path / "odd.csv"
    odd.write_text("node,timestamp_s,cpu_utilisation,pool\nn1,0,0.5,a\n\nn1,30,,a\nn1,60,0.25,a\n")
    assert [(n.name, n.times.tolist(), n.utilisation.tolist()) for n in read_nodes(odd)] == [
        ("n1", [0.0, 60.0], [0.5, 0.25])]
    odd.write_text(header + "n1,0,0.5\nn1,30,\nn1,60,0\n")
    assert [n.utilisation.tolist() for n in read_nodes(odd)] == [[0.5, 0.0]], "an idle node is a sample"
