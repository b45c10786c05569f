"""``python -m reconcilers plan`` against a real Prometheus whose history is backfilled with
promtool, with series named and labelled as kube-state-metrics and cAdvisor publish them."""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube.prometheus import PrometheusAPI
from reconcilers.plan import ClusterHistory, PodHistory, export_pools, node_bound_share
from tests.conftest import ROOT, free_port
from tests.prometheus_server import (
    Family,
    PrometheusServer,
    VictoriaMetricsServer,
    garbage_prometheus,
    refusing_proxy,
    write_openmetrics,
)

DAYS = 9
STEP = 300
# namespace, pod, ReplicaSet, node, cpu request (cores), memory request (bytes), cpu usage (cores) at time t
PODS = [
    ("shop", "web-7d9f8-aaaaa", "web-7d9f8", "node-a", 2.0, 2 * 2**30, lambda t: 0.3 + 0.2 * math.sin(t / 7200)),
    ("shop", "web-7d9f8-bbbbb", "web-7d9f8", "node-b", 2.0, 2 * 2**30, lambda t: 0.35 + 0.2 * math.sin(t / 7000)),
    ("shop", "api-5c6b7-ccccc", "api-5c6b7", "node-a", 1.0, 1 * 2**30, lambda t: 0.2 + 0.1 * math.cos(t / 5000)),
    ("batch", "etl-8e9f0-ddddd", "etl-8e9f0", "node-b", 4.0, 4 * 2**30, lambda t: 1.0 + 0.8 * math.sin(t / 9000)),
    ("batch", "etl-8e9f0-eeeee", "etl-8e9f0", "node-c", 4.0, 4 * 2**30, lambda t: 0.9 + 0.7 * math.sin(t / 8000)),
]
NODES = ("node-a", "node-b", "node-c")


def exporter_families() -> list[Family]:
    requests = Family("kube_pod_container_resource_requests", "gauge")
    owner = Family("kube_pod_owner", "gauge")
    info = Family("kube_pod_info", "gauge")
    cpu = Family("container_cpu_usage_seconds_total", "counter")
    memory = Family("container_memory_working_set_bytes", "gauge")
    for namespace, pod, replicaset, node, cpu_request, memory_request, usage in PODS:
        kept = {"namespace": namespace, "pod": pod}
        # kube-state-metrics: one series per container and resource, with its unit; run as two
        # replicas for availability, so every series stands twice (``instance`` differs).
        for instance in ("10.2.0.7:8080", "10.2.0.8:8080"):
            state = {**kept, "container": "app", "node": node, "uid": f"uid-{pod}", "instance": instance}
            requests.series.append(({**state, "resource": "cpu", "unit": "core"}, lambda t, v=cpu_request: v))
            requests.series.append(({**state, "resource": "memory", "unit": "byte"}, lambda t, v=memory_request: v))
        owner.series.append(({**kept, "owner_kind": "ReplicaSet", "owner_name": replicaset,
                              "owner_is_controller": "true", "uid": f"uid-{pod}"}, lambda t: 1))
        info.series.append(({**kept, "node": node, "host_ip": "10.0.0.1", "pod_ip": "10.1.0.1", "uid": f"uid-{pod}",
                             "created_by_kind": "ReplicaSet", "created_by_name": replicaset}, lambda t: 1))
        # cAdvisor: the app container, and the pause container (container="POD") and the Pod's
        # cgroup (container="") which the plan must not count twice.
        # The app container is scraped by two jobs (the kubelet's and a standalone cAdvisor's).
        for job in ("kubelet", "cadvisor"):
            cadvisor = {**kept, "container": "app", "id": f"/kubepods/{pod}/app", "image": "app:1", "name": "k8s_app",
                        "job": job}
            cpu.series.append((cadvisor, usage))
            memory.series.append((cadvisor, lambda t, f=usage: f(t) * 2**30))
        cpu.series.append(({**kept, "container": "", "id": f"/kubepods/{pod}"}, usage))
        memory.series.append(({**kept, "container": "POD", "id": f"/kubepods/{pod}/pause"}, lambda t: 2**20))
    allocatable = Family("kube_node_status_allocatable", "gauge")
    labels = Family("kube_node_labels", "gauge")
    for node in NODES:
        allocatable.series.append(({"node": node, "resource": "cpu", "unit": "core"}, lambda t: 8))
        allocatable.series.append(({"node": node, "resource": "memory", "unit": "byte"}, lambda t: 32 * 2**30))
        allocatable.series.append(({"node": node, "resource": "pods", "unit": "integer"}, lambda t: 110))
        labels.series.append(({"node": node, "label_cloud_google_com_gke_nodepool": "general",
                               "label_kubernetes_io_hostname": node}, lambda t: 1))
    return [requests, owner, info, cpu, memory, allocatable, labels]


def history_file(directory: Path, families: list[Family], days: float) -> Path:
    end = time.time() - 120
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "history.om"
    write_openmetrics(path, families, end - days * 86400, end, STEP)
    return path


def backfilled(directory: Path, families: list[Family], days: float, max_samples: int = 50_000_000) -> PrometheusServer:
    return PrometheusServer(directory, history_file(directory, families, days), max_samples)


@pytest.fixture(scope="module")
def cluster_history(tmp_path_factory) -> Path:
    """The exporters' history of the module's cluster, written once: a store that serves it
    beside ``cluster_prometheus`` holds the same samples at the same times."""
    return history_file(tmp_path_factory.mktemp("plan-history"), exporter_families(), DAYS)


@pytest.fixture(scope="module")
def cluster_prometheus(tmp_path_factory, cluster_history) -> Iterator[PrometheusServer]:
    server = PrometheusServer(tmp_path_factory.mktemp("plan-prometheus"), cluster_history)
    yield server
    server.stop()


def plan(url: str, out: Path, *extra: str, settings: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSALE_")} | (settings or {})
    return subprocess.run([sys.executable, "-m", "reconcilers", "plan", "--prometheus", url, "--days", str(DAYS),
                           "--out", str(out), *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_plan_replays_the_clusters_own_history_per_pool_and_namespace(cluster_prometheus, tmp_path):
    result = plan(cluster_prometheus.url, tmp_path / "plan", "--hot-time-budget", "0.01")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"plan: {tmp_path / 'plan' / 'plan.md'}", "where to read it"
    summary = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert summary["budget"]["cpu"] == 0.01
    pool = summary["pools"]["general"]  # from kube_node_labels' GKE node-pool label
    assert pool["pods"] == 5 and pool["node_cores"] == 8 and pool["node_memory_bytes"] == 32 * 2**30
    # Requests as kube-state-metrics reported them, summed per namespace (the last replayed day).
    namespaces = pool["namespaces"]
    assert namespaces["shop"]["cpu_requested_cores"] == pytest.approx(5.0)
    assert namespaces["batch"]["cpu_requested_cores"] == pytest.approx(8.0)
    assert namespaces["shop"]["memory_requested_bytes"] == pytest.approx(5 * 2**30)
    assert namespaces["batch"]["memory_requested_bytes"] == pytest.approx(8 * 2**30)
    ratios = pool["ratios"]
    # What each namespace is set to is what its workloads' ratios set (ratio = requested / set),
    # and right-sizing frees most of it: usage is well below the requests.
    for namespace, requested in (("shop", {"web-7d9f8": 4.0, "api-5c6b7": 1.0}), ("batch", {"etl-8e9f0": 8.0})):
        cpu_set = sum(cores / ratios["workloads"][f"{namespace}/ReplicaSet/{rs}"] for rs, cores in requested.items())
        assert namespaces[namespace]["cpu_set_cores"] == pytest.approx(cpu_set, rel=5e-4)  # ratios: 3 decimals
        assert 0 < namespaces[namespace]["cpu_set_cores"] < sum(requested.values()) / 2
        assert 0 < namespaces[namespace]["memory_set_bytes"] <= namespaces[namespace]["memory_requested_bytes"]
    # Without kube_replicaset_owner a Pod's workload is its ReplicaSet; its two Pods are one workload.
    assert set(ratios["workloads"]) == {f"{ns}/ReplicaSet/{rs}" for ns, pod, rs, *_ in PODS}
    assert all(ratio > 1 for ratio in ratios["workloads"].values()) and ratios["nodes"]
    # The pool's report is the backtest's: the budget sweep, plots and the export it replayed.
    report = tmp_path / "plan" / "general"
    data = json.loads((report / "summary.json").read_text())
    sweep = data["budget_sweep"]
    assert [entry["hot_time_budget"] for entry in sweep] == sorted(entry["hot_time_budget"] for entry in sweep)
    assert len(sweep) >= 5 and {"capacity_freed", "cpu_violation_rate", "memory_violation_rate"} <= set(sweep[0])
    assert {"savings_vs_violations.png", "node_day.png", "report.md", "history.csv.gz"} <= \
        {p.name for p in report.iterdir()}
    # The progress line counts the samples the export holds: one row each, under its header.
    with gzip.open(report / "history.csv.gz", "rt") as export:
        samples = sum(1 for _ in export) - 1
    assert f"pool general: 5 Pods, {samples:,} samples, nodes of 8 cores" in result.stderr
    text = (tmp_path / "plan" / "plan.md").read_text()
    assert "## Pool `general`: 5 Pods on nodes of 8 cores, 32 GiB" in text.splitlines(), "no DaemonSets to take off"
    assert "(general/report.md)" in text
    for namespace, totals in namespaces.items():  # plan.md's table says what plan.json holds
        assert (f"| {namespace} | {totals['cpu_requested_cores']:.2f} | {totals['cpu_set_cores']:.2f} | "
                f"{totals['memory_requested_bytes'] / 2**30:.2f} GiB | {totals['memory_set_bytes'] / 2**30:.2f} GiB |"
                ) in text.splitlines()
    assert pool["history_days"] == DAYS and "days of history Prometheus holds" not in text, "all the days asked"
    # Each budget's hot time with how far one hot event more or less moves it (over every replayed
    # day, as the figure itself), and the chosen budget's in the headline.
    for entry in sweep:
        low, high = entry["cpu_violation_interval"]
        assert low <= entry["cpu_violation_rate"] <= high
        assert (f"| {entry['hot_time_budget']:.2%} | {entry['capacity_freed']:.1%} | "
                f"{entry['cpu_violation_rate']:.3%} | {low:.3%}..{high:.3%} |") in text
    # The curve replayed on 5 placements (the report's, then 4 with ties drawn at random): each
    # budget's row gives the range of its hot time over them, which holds the report's figure.
    placements = pool["placements"]
    assert [p["placement"] for p in placements] == [1, 2, 3, 4, 5]
    assert [p["ties"] for p in placements] == ["to the first node", *(f"drawn, seed {n}" for n in range(1, 5))]
    retune = shlex.split(pool["retune"])
    assert retune[retune.index("--placements") + 1] == "5", "the tuner scores on as many placements as the plan"
    assert "placement 5/5 (ties drawn, seed 4) replayed in" in result.stderr
    assert placements[0]["budget_sweep"] == [{k: entry[k] for k in ("hot_time_budget", "capacity_freed",
                                                                    "cpu_violation_rate")} for entry in sweep]
    assert all([e["hot_time_budget"] for e in p["budget_sweep"]] == [e["hot_time_budget"] for e in sweep]
               for p in placements)
    spreads = {}
    for entry in sweep:
        rates = [e["cpu_violation_rate"] for p in placements for e in p["budget_sweep"]
                 if e["hot_time_budget"] == entry["hot_time_budget"]]
        spreads[entry["hot_time_budget"]] = (min(rates), max(rates))
        low, high = entry["cpu_violation_interval"]
        assert (f"| {entry['cpu_violation_rate']:.3%} | {low:.3%}..{high:.3%} | "
                f"{min(rates):.3%}..{max(rates):.3%} |") in text
    chosen = next(entry for entry in sweep if entry["hot_time_budget"] == 0.01)
    low, high = chosen["cpu_violation_interval"]
    assert (f"our system frees {chosen['capacity_freed']:.1%} of the node-days "
            f"at a realised cpu hot time of {chosen['cpu_violation_rate']:.3%}; on days like these, "
            f"{low:.3%}..{high:.3%}; over 5 placements, {spreads[0.01][0]:.3%}..{spreads[0.01][1]:.3%}.") in text
    assert f"history (read from Prometheus at {cluster_prometheus.url})" in text
    node_ratios = [node["cpu"] for node in ratios["nodes"]]
    assert (f"Node cpu ratios it would set: {min(node_ratios):g} to {max(node_ratios):g} "
            f"(mean {sum(node_ratios) / len(node_ratios):.2f}) over {len(node_ratios)} nodes; per workload ratios "
            "are in `plan.json`.") in text.splitlines()
    # Under the table, the goal's verdict over every replayed day, as the table reads them: which
    # of the budgets 0.05%..1% kept their hot time within 0.5x..1.5x, and on how many placements.
    goal = {entry["hot_time_budget"]: entry["cpu_violation_rate"] / entry["hot_time_budget"] for entry in sweep
            if 0.0005 <= entry["hot_time_budget"] <= 0.01}
    kept = sorted(b for b, times in goal.items() if 0.5 <= times <= 1.5)
    assert pool["budget_goal"]["kept"] == kept and len(pool["budget_goal"]["budgets"]) == len(goal) == 5
    line = next(line for line in text.splitlines() if line.startswith("**The goal on the replayed days**"))
    assert f"of the 5 budgets from 0.05% to 1%, {len(kept)} kept within 0.5x..1.5x: " in line
    for budget, times in goal.items():
        on = sum(0.5 <= p["budget_sweep"][[e["hot_time_budget"] for e in sweep].index(budget)]["cpu_violation_rate"]
                 / budget <= 1.5 for p in placements)
        assert f"{budget:.2%} ({times:.2f}x; on {on} of 5 placements)" in line


def test_a_plan_on_victoria_metrics_sets_what_a_plan_on_prometheus_sets(cluster_prometheus, cluster_history,
                                                                        tmp_path):
    """The same exporters' history kept in VictoriaMetrics instead (its Prometheus API, MetricsQL):
    the plan reads the same Pods, pools and requests and would set the same ratios (MetricsQL's
    ``rate`` does not extrapolate: node ratios within 0.02)."""
    victoria = VictoriaMetricsServer(tmp_path, cluster_history)
    try:
        plans = {}
        for store, url in (("prometheus", cluster_prometheus.url), ("victoria", victoria.url)):
            result = plan(url, tmp_path / store)
            assert result.returncode == 0, result.stderr
            plans[store] = json.loads((tmp_path / store / "plan.json").read_text())["pools"]
    finally:
        victoria.stop()
    ours, theirs = plans["prometheus"]["general"], plans["victoria"]["general"]
    assert plans["victoria"].keys() == {"general"} and theirs["pods"] == ours["pods"] == 5
    assert theirs["namespaces"].keys() == ours["namespaces"].keys()
    for namespace, totals in ours["namespaces"].items():
        assert theirs["namespaces"][namespace] == pytest.approx(totals, rel=0.01)
    assert theirs["ratios"]["workloads"] == pytest.approx(ours["ratios"]["workloads"], rel=0.01)
    assert [node["cpu"] for node in theirs["ratios"]["nodes"]] == pytest.approx(
        [node["cpu"] for node in ours["ratios"]["nodes"]], abs=0.02)


def test_the_export_is_re_tuned_on_the_pools_own_nodes(cluster_prometheus, tmp_path):
    """docs/reconcilers.md's recipe: plan, then the simulator.tune command plan printed for the
    pool, on its export and its nodes (13 requested cores on 8-core nodes: two nodes as written,
    one right-sized). With ``--placements 1`` the report's placement alone is replayed."""
    assert plan(cluster_prometheus.url, tmp_path / "plan", "--placements", "1").returncode == 0
    pool = json.loads((tmp_path / "plan" / "plan.json").read_text())["pools"]["general"]
    command = pool["retune"]
    text = (tmp_path / "plan" / "plan.md").read_text()
    assert f"    {command}" in text.splitlines()
    assert [p["placement"] for p in pool["placements"]] == [1] and "placements" not in text
    assert "--placements" not in command, "one placement is the tuner's default"
    python, *arguments = shlex.split(command)
    assert python == "python" and arguments[:2] == ["-m", "simulator.tune"]
    assert arguments[arguments.index("--node-cores") + 1] == "8"
    # The reconcilers' own windows, as they run by default: 7 days of a node's history, 14 of a workload's.
    assert (arguments[arguments.index("--window-days") + 1],
            arguments[arguments.index("--request-window-days") + 1]) == ("7", "14")
    tuned = subprocess.run([sys.executable, *arguments, "--scale", "4"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert tuned.returncode == 0, tuned.stderr
    header, *lines = tuned.stdout.splitlines()
    rows = [line.split() for line in lines if line.startswith("  4.0")]
    assert len(rows) == 4 and {row[header.split().index("freed")] for row in rows} == {"50.0%"}


def test_the_plan_replays_with_the_windows_the_reconcilers_are_set_to(cluster_prometheus, tmp_path):
    """OVERSALE_HISTORY_WINDOW and OVERSALE_COMPRESSION_WINDOW, as the reconcilers' Deployment sets
    them, are the windows the plan replays with, in whole days: a window under a day is one day."""
    result = plan(cluster_prometheus.url, tmp_path / "plan", "--placements", "1",
                  settings={"OVERSALE_HISTORY_WINDOW": "2d", "OVERSALE_COMPRESSION_WINDOW": "6h"})
    assert result.returncode == 0, result.stderr
    retune = shlex.split(json.loads((tmp_path / "plan" / "plan.json").read_text())["pools"]["general"]["retune"])
    assert (retune[retune.index("--window-days") + 1], retune[retune.index("--request-window-days") + 1]) == ("2", "1")


def test_cadvisor_pause_pod_cgroup_and_twice_scraped_series_count_once(cluster_prometheus, tmp_path):
    result = plan(cluster_prometheus.url, tmp_path / "plan")
    assert result.returncode == 0, result.stderr
    with gzip.open(tmp_path / "plan" / "general" / "history.csv.gz", "rt") as handle:
        # The ReplicaSet's two Pods started together: web-7d9f8-aaaaa, first by name, is lane 0.
        rows = [r for r in csv.DictReader(handle) if r["workload"] == "shop/ReplicaSet/web-7d9f8/0"]
    assert rows
    peak = max(float(r["cpu_usage_cores"]) for r in rows)
    assert 0.45 < peak < 0.55, "the app container's usage once (0.3 + 0.2 peak), not the Pod cgroup's again"
    memory_peak = max(float(r["memory_usage_bytes"]) for r in rows) / 2**30
    assert 0.45 < memory_peak < 0.55, "the app container's working set once, not the pause container's too"
    assert float(rows[0]["cpu_request_cores"]) == 2.0, "once, though both kube-state-metrics replicas report it"
    assert float(rows[0]["memory_request_bytes"]) == 2 * 2**30


def test_a_prometheus_holding_several_clusters_is_planned_for_the_one_selected(tmp_path):
    """A Thanos querier or VictoriaMetrics holding two clusters whose Pods, namespaces and nodes
    share names, told apart by a ``cluster`` label: the other cluster runs everything three times
    as large. With OVERSALE_PROMETHEUS_SELECTOR the plan is this cluster's alone; without it the
    two are mixed; a selector matching no series is named in the error."""
    families = []
    for family in exporter_families():
        series = []
        for labels, value_at, *bounds in family.series:
            series.append(({**labels, "cluster": "eu"}, value_at, *bounds))
            series.append(({**labels, "cluster": "us"}, lambda t, f=value_at: 3 * f(t), *bounds))
        families.append(Family(family.name, family.kind, series))
    server = backfilled(tmp_path / "two-clusters", families, DAYS)
    try:
        selected = plan(server.url, tmp_path / "eu", settings={"OVERSALE_PROMETHEUS_SELECTOR": 'cluster="eu"'})
        mixed = plan(server.url, tmp_path / "both")
        nothing = plan(server.url, tmp_path / "none", settings={"OVERSALE_PROMETHEUS_SELECTOR": 'cluster="ap"'})
    finally:
        server.stop()
    assert selected.returncode == 0, selected.stderr
    pool = json.loads((tmp_path / "eu" / "plan.json").read_text())["pools"]["general"]
    assert pool["pods"] == 5 and pool["node_cores"] == 8 and pool["node_memory_bytes"] == 32 * 2**30
    assert pool["namespaces"]["shop"]["cpu_requested_cores"] == pytest.approx(5.0)
    assert pool["namespaces"]["batch"]["cpu_requested_cores"] == pytest.approx(8.0)
    assert pool["namespaces"]["shop"]["cpu_set_cores"] < 2.5
    source = json.loads((tmp_path / "eu" / "plan.json").read_text())["source"]
    assert source == {"prometheus": server.url, "selector": 'cluster="eu"'}
    read = f'(read from Prometheus at {server.url}, series matching {{cluster="eu"}})'
    assert read in (tmp_path / "eu" / "plan.md").read_text()
    assert mixed.returncode == 0, mixed.stderr
    assert json.loads((tmp_path / "both" / "plan.json").read_text())["pools"]["general"]["node_cores"] == 24
    assert nothing.returncode == 2 and "Traceback" not in nothing.stderr
    assert 'no kube_pod_container_resource_requests series matching {cluster="ap"}' in nothing.stderr


def test_fewer_days_than_asked_are_planned_on_what_prometheus_holds(cluster_prometheus, tmp_path):
    """Asked for 14 days, this Prometheus holds 9 (its retention is often less than 14): the plan
    replays the 2 days after the 7-day warm-up (one tuning, one holdout) and says so, where it
    stopped on advice to pass an option plan does not have. Too few for the warm-up, the line
    names the --warmup-days that would do."""
    result = plan(cluster_prometheus.url, tmp_path / "plan", "--days", "14")
    assert result.returncode == 0, result.stderr
    assert ("pool general: Prometheus holds 9 of the 14 days asked (its retention, or the pool is younger): 2 "
            "replayed after the 7-day warm-up") in result.stderr
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["pools"]["general"]["history_days"] == 9
    assert "Planned on the 9 days of history Prometheus holds, of the 14 asked" in \
        (tmp_path / "plan" / "plan.md").read_text()
    summary = json.loads((tmp_path / "plan" / "general" / "summary.json").read_text())
    assert (summary["tuning_days"], summary["holdout_days"]) == ([7], [8])
    short = plan(cluster_prometheus.url, tmp_path / "short", "--days", "14", "--warmup-days", "9")
    assert short.returncode == 2 and "Traceback" not in short.stderr
    assert ("error: pool general: Prometheus holds 9 days of its history, not more than the 9-day warm-up: pass "
            "--warmup-days 7 or fewer") in short.stderr


@pytest.mark.parametrize(("days", "said"), [
    (0.5, "Prometheus holds 1 day of its history, not more than the 7-day warm-up: the plan needs 2 days at least "
          "(1 of warm-up)"),
    (1.5, "Prometheus holds 1 day of its history, not more than the 7-day warm-up: the plan needs 2 days at least "
          "(1 of warm-up)"),
    (2.5, "Prometheus holds 2 days of its history, not more than the 7-day warm-up: pass --warmup-days 1 or fewer"),
])
def test_a_cluster_younger_than_the_warm_up_is_told_what_the_plan_needs(tmp_path, days, said):
    """A Prometheus installed this morning holds half a day: the plan keeps it as one day (less
    than a whole day is not trimmed away, or nothing would be left) and says it needs two, one of
    warm-up, not a traceback or an empty export. One installed yesterday morning holds one whole
    day and the half before it, which is trimmed: still one day. Two whole days are enough for a
    1-day warm-up, which the line names."""
    server = backfilled(tmp_path / "young", exporter_families(), days)
    try:
        result = plan(server.url, tmp_path / "plan")
    finally:
        server.stop()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: pool general: {said}" in result.stderr, result.stderr


def test_the_days_replayed_are_whole_days_ending_with_the_last_sample(cluster_prometheus, tmp_path):
    """Read over [now - 8 days, now] from a Prometheus holding more (8.01 days asked, as
    ``bench.plan_example`` asks a little more than whole days), the history has a sample at both
    ends: 8 days and one step, or more. The replay counts days from the first sample and each as a
    whole, so a 9th day of one sample was replayed as a whole day, its empty slots counted as
    node-time below capacity (the hot time of a 3-day holdout read a third too low). The oldest
    step is dropped: 8 whole days, 1 replayed after the 7-day warm-up. The steps are multiples of
    the step since the epoch, the moments the live account's subqueries count at, whenever the
    plan runs."""
    result = plan(cluster_prometheus.url, tmp_path / "plan", "--days", "8.01")
    assert result.returncode == 0, result.stderr
    with gzip.open(tmp_path / "plan" / "general" / "history.csv.gz", "rt") as handle:
        times = sorted({int(row["timestamp_s"]) for row in csv.DictReader(handle)})
    assert times[-1] - times[0] == 8 * 86400 - STEP and times[1] - times[0] == STEP
    assert all(t % STEP == 0 for t in times) and time.time() - times[-1] < STEP + 60
    summary = json.loads((tmp_path / "plan" / "general" / "summary.json").read_text())
    assert summary["days_evaluated"] == 1 and summary["tuning_days"] == [7]


def burst_history(directory: Path, scrape: float, burst_seconds: float = 600, node_cores: float = 8,
                  requested: float = 4.0) -> PrometheusServer:
    """3 days of one Pod (shop/web, ``requested`` cores) on one node, using 1 core but for
    ``burst_seconds`` of 4 cores on its third day, scraped every ``scrape`` seconds."""
    end = time.time() - 120
    start = end - 3 * 86400
    burst = start + 2 * 86400 + 6 * 3600
    kept, node = {"namespace": "shop", "pod": "web-7d9f8-aaaaa"}, {"node": "node-a"}
    families = [
        Family("kube_pod_container_resource_requests", "gauge", [
            ({**kept, **node, "container": "app", "resource": "cpu", "unit": "core"}, lambda t: requested),
            ({**kept, **node, "container": "app", "resource": "memory", "unit": "byte"}, lambda t: 4 * 2**30)]),
        Family("kube_pod_owner", "gauge", [({**kept, "owner_kind": "ReplicaSet", "owner_name": "web-7d9f8",
                                             "owner_is_controller": "true"}, lambda t: 1)]),
        Family("kube_pod_info", "gauge", [({**kept, **node}, lambda t: 1)]),
        Family("container_cpu_usage_seconds_total", "counter", [
            ({**kept, "container": "app", "id": "/kubepods/web/app"},
             lambda t: 4.0 if burst <= t < burst + burst_seconds else 1.0)]),
        Family("container_memory_working_set_bytes", "gauge", [
            ({**kept, "container": "app", "id": "/kubepods/web/app"}, lambda t: 2**30)]),
        Family("kube_node_status_allocatable", "gauge", [
            ({**node, "resource": "cpu", "unit": "core"}, lambda t: node_cores),
            ({**node, "resource": "memory", "unit": "byte"}, lambda t: 32 * 2**30)]),
    ]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "history.om"
    write_openmetrics(path, families, start, end, scrape)
    return PrometheusServer(directory, path)


def test_cpu_use_is_read_as_the_5_minute_averages_hot_time_is_counted_on(tmp_path):
    """The live account and the backtest count hot time on 5-minute averages. The plan read each
    step's cpu as a rate over 4 steps (20 minutes), whatever the scrape interval: a ten-minute
    burst of 4 cores over 1 came out as at most 2.6 cores, a smoother use than the live account
    counts, in the estimates and in the hot time alike. Scraped every minute, a 5-minute rate has
    its samples: a step's cpu is its own 5-minute average, and the burst reads 4 cores. Scraped
    every 5 minutes, a rate needs 20 minutes, and the log says the plan's averages are smoother
    for it."""
    result = planned(burst_history(tmp_path / "every-minute", 60), tmp_path / "plan", ["--days", "3",
                                                                                        "--warmup-days", "1"])
    with gzip.open(tmp_path / "plan" / "default" / "history.csv.gz", "rt") as handle:
        cpu = [float(row["cpu_usage_cores"]) for row in csv.DictReader(handle)]
    assert 3.8 <= max(cpu) <= 4.2 and sorted(cpu)[len(cpu) // 2] == pytest.approx(1.0, abs=0.02)
    assert "cpu use read as 5-minute averages (cAdvisor scraped every 60s)" in result.stderr

    result = planned(burst_history(tmp_path / "every-5-minutes", 300), tmp_path / "coarse", ["--days", "3",
                                                                                           "--warmup-days", "1"])
    assert ("cpu use read as 20-minute averages (cAdvisor scraped every 300s, and a rate needs 4 scrapes), smoother "
            "than the 5-minute averages the live account counts") in result.stderr


def test_plan_peaks_count_hot_time_at_each_steps_highest_rate_between_scrapes(tmp_path):
    """Hot time is counted on 5-minute averages; a burst shorter than 5 minutes hardly shows in
    them. With ``--peaks`` the plan also reads each step's highest rate between two scrapes and
    reports the hot time counted at those peaks, as ``backtest --peaks`` does. A Pod using 1
    core of its node's 3 bursts to 4 for two minutes: its 5-minute rate reaches 2.2 to 2.5,
    so no node is hot by the averages, but the Pod's node is at its peak."""
    server = burst_history(tmp_path / "history", 60, burst_seconds=120, node_cores=3, requested=2.0)
    result = planned(server, tmp_path / "plan", ["--days", "3", "--warmup-days", "1", "--peaks"])
    assert "read cpu peaks: 1 Pods, each step's highest rate between two scrapes (60s apart)" in result.stderr
    folder = tmp_path / "plan" / "default"
    with gzip.open(folder / "history.csv.gz", "rt") as averages, gzip.open(folder / "peaks.csv.gz", "rt") as peaks:
        rows = list(zip(csv.DictReader(averages), csv.DictReader(peaks), strict=True))
    assert all(a["workload"] == p["workload"] and a["timestamp_s"] == p["timestamp_s"] for a, p in rows)
    assert max(float(a["cpu_usage_cores"]) for a, _ in rows) <= 2.6
    assert 3.8 <= max(float(p["cpu_usage_cores"]) for _, p in rows) <= 4.2
    assert all(float(p["cpu_usage_cores"]) >= float(a["cpu_usage_cores"]) - 0.01 for a, p in rows)
    summary = json.loads((folder / "summary.json").read_text())
    unchanged = next(row for row in summary["policies"] if row["policy"] == "none")["holdout"]
    assert unchanged["cpu_violation_rate"] == 0 and unchanged["cpu_violation_rate_at_peaks"] > 0
    assert all("cpu_violation_rate_at_peaks" in row for row in summary["budget_sweep"])
    assert "at the summed peaks |" in (tmp_path / "plan" / "plan.md").read_text()


@pytest.mark.parametrize("missing, exporter", [
    ("kube_pod_container_resource_requests", "kube-state-metrics"), ("kube_pod_owner", "kube-state-metrics"),
    ("kube_pod_info", "kube-state-metrics"), ("kube_node_status_allocatable", "kube-state-metrics"),
    ("container_cpu_usage_seconds_total", "cAdvisor (the kubelet's /metrics/cadvisor)"),
    ("container_memory_working_set_bytes", "cAdvisor (the kubelet's /metrics/cadvisor)")], ids=lambda v: v.split()[0])
def test_a_missing_exporter_is_named_not_a_traceback(tmp_path, missing, exporter):
    """Each series the plan cannot go without, missing (its exporter not scraped, or the one
    metric left out by kube-state-metrics' --metric-denylist), is named with what publishes it."""
    server = backfilled(tmp_path / "history", [family for family in exporter_families() if family.name != missing], 1)
    try:
        result = plan(server.url, tmp_path / "plan")
    finally:
        server.stop()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    said = result.stderr.strip().splitlines()[-1]
    assert said.startswith(f"error: no {missing} series in the last") and f"is {exporter} scraped" in said, said
    assert not (tmp_path / "plan").exists()


def test_an_unreachable_prometheus_is_one_line(tmp_path):
    result = plan(f"http://127.0.0.1:{free_port()}", tmp_path / "plan")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unreachable" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_series_prometheus_does_not_answer_stops_the_plan_not_left_out(cluster_prometheus, tmp_path):
    """kube_node_labels is optional (without it every node is in one pool), but it is exported
    here: a query of it that times out stops the plan with one line naming it, and no report is
    written, where the plan went on with every node in pool ``default`` and nothing said."""
    proxy = refusing_proxy(cluster_prometheus.url, "kube_node_labels")
    try:
        url = proxy.url
        result = plan(url, tmp_path / "plan")
    finally:
        proxy.shutdown()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (f"error: prometheus at {url} answered 503: query timed out in query execution, for kube_node_labels: the "
            "plan stops rather than go on without it") in result.stderr
    assert not (tmp_path / "plan").exists()


NOT_PROMETHEUS = "{url} answered {content_type}, not the Prometheus HTTP API's JSON"


@pytest.mark.parametrize(("body", "content_type", "raw", "named"), [
    (b"<html><body>Sign in to Grafana</body></html>", "text/html", False, NOT_PROMETHEUS),
    (b"[]", "application/json", False, NOT_PROMETHEUS),
    # A port that speaks another protocol.
    (b"SSH-2.0-OpenSSH_9.2\r\n", "", True,
     "prometheus at {url} sent no complete HTTP answer: BadStatusLine: SSH-2.0-OpenSSH_9.2"),
])
def test_a_url_that_is_not_prometheus_is_named_as_such(tmp_path, body, content_type, raw, named):
    server = garbage_prometheus(body, content_type, raw=raw)
    try:
        url = server.url
        result = plan(url, tmp_path / "plan")
    finally:
        server.shutdown()
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert named.format(url=url, content_type=content_type) in result.stderr
    assert "unreachable" not in result.stderr and not (tmp_path / "plan").exists()


def test_a_range_longer_than_prometheus_allows_is_read_in_parts(cluster_prometheus):
    # 45 days at 5 minutes is 12,960 steps; Prometheus refuses more than 11,000 per series.
    api = PrometheusAPI(cluster_prometheus.url)
    query = 'kube_node_status_allocatable{resource="cpu"}'
    end = time.time()
    start = end - 45 * 86400
    long = {labels["node"]: points for labels, points in api.query_range(query, start, end, STEP)}
    # The last 9 days asked in one part, on the same grid of steps: the same points.
    recent = start + math.ceil(36 * 86400 / STEP) * STEP
    short = {labels["node"]: points for labels, points in api.query_range(query, recent, end, STEP)}
    assert set(long) == set(NODES) == set(short)
    for node, (times, values) in long.items():
        assert list(times) == sorted(set(times)), "no point twice where the parts meet"
        recent_points = [(t, v) for t, v in zip(times, values, strict=True) if t > recent - 1]
        assert recent_points == list(zip(*short[node], strict=True))  # Prometheus keeps milliseconds
        assert len(times) >= DAYS * 86400 // STEP - 2, "the whole backfilled history, not one part"
    # Asked a day at a time (what the plan does, to bound memory): the same series, the same points.
    daily = {labels["node"]: series for labels, series in api.query_range(query, start, end, STEP, part_steps=288)}
    assert daily == long


def test_a_range_prometheus_refuses_for_its_samples_is_read_in_smaller_parts(tmp_path):
    # --query.max-samples: a large cluster's day of usage can load more samples than Prometheus
    # allows in one query. This one allows 3,000: a node gauge's 9 days (3 nodes x 2,592 steps)
    # are refused in one part, and the plan used to stop there.
    strict = backfilled(tmp_path, exporter_families(), DAYS, max_samples=3000)
    try:
        query = 'kube_node_status_allocatable{resource="cpu"}'
        end = time.time()
        start = end - DAYS * 86400
        whole_range = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": STEP})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{strict.url}/api/v1/query_range?{whole_range}", timeout=30)
        assert "too many samples" in json.load(refused.value)["error"]
        api = PrometheusAPI(strict.url)
        whole = {labels["node"]: series for labels, series in api.query_range(query, start, end, STEP)}
        small = {labels["node"]: series for labels, series in api.query_range(query, start, end, STEP, part_steps=50)}
        assert whole == small and set(whole) == set(NODES)
        assert all(len(times) >= DAYS * 86400 // STEP - 2 for times, _ in whole.values())
        result = plan(strict.url, tmp_path / "plan")
        assert result.returncode == 0, result.stderr
        assert json.loads((tmp_path / "plan" / "plan.json").read_text())["pools"]["general"]["pods"] == len(PODS)
    finally:
        strict.stop()


def rolled_deployment(directory: Path, autoscaled_on: str | None = None) -> PrometheusServer:
    """The exporters' history of PODS plus ci/Deployment/app, rolled out every day: a new
    ReplicaSet and a new Pod (4 cores, 4 GiB requested; 0.4 cores, 0.5 GiB used) each day; with
    ``autoscaled_on``, an HPA scales it on that resource's utilization."""
    families = {family.name: family for family in exporter_families()}
    owners = Family("kube_replicaset_owner", "gauge")
    end = time.time() - 120
    start = end - DAYS * 86400
    for day in range(DAYS):
        replicaset, pod = f"app-{day}c8f5d9b", f"app-{day}c8f5d9b-x{day}k2p"
        first, last = start + day * 86400, start + (day + 1) * 86400 - STEP
        kept = {"namespace": "ci", "pod": pod}
        families["kube_pod_container_resource_requests"].series += [
            ({**kept, "container": "app", "node": "node-c", "resource": "cpu", "unit": "core"}, lambda t: 4.0, first,
             last),
            ({**kept, "container": "app", "node": "node-c", "resource": "memory", "unit": "byte"},
             lambda t: 4 * 2**30, first, last)]
        families["kube_pod_owner"].series.append(
            ({**kept, "owner_kind": "ReplicaSet", "owner_name": replicaset, "owner_is_controller": "true"},
             lambda t: 1, first, last))
        families["kube_pod_info"].series.append(({**kept, "node": "node-c"}, lambda t: 1, first, last))
        families["container_cpu_usage_seconds_total"].series.append(
            ({**kept, "container": "app"}, lambda t: 0.4 + 0.05 * math.sin(t / 3600), first, last))
        families["container_memory_working_set_bytes"].series.append(
            ({**kept, "container": "app"}, lambda t: 2**29, first, last))
        owners.series.append(({"namespace": "ci", "replicaset": replicaset, "owner_kind": "Deployment",
                               "owner_name": "app", "owner_is_controller": "true"}, lambda t: 1, first, last))
    extra = [owners]
    if autoscaled_on:
        hpa = {"namespace": "ci", "horizontalpodautoscaler": "app"}
        info = Family("kube_horizontalpodautoscaler_info", "gauge", [(
            {**hpa, "scaletargetref_api_version": "apps/v1", "scaletargetref_kind": "Deployment",
             "scaletargetref_name": "app"}, lambda t: 1)])
        target = Family("kube_horizontalpodautoscaler_spec_target_metric", "gauge", [(
            {**hpa, "metric_name": autoscaled_on, "metric_target_type": "utilization"}, lambda t: 70)])
        extra += [info, target]
    directory.mkdir(exist_ok=True)
    history = directory / "history.om"
    write_openmetrics(history, [*families.values(), *extra], start, end, STEP)
    return PrometheusServer(directory, history)


def planned(server: PrometheusServer, out: Path, extra: list[str] | None = None,
            settings: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The plan on ``server``'s history, which is then stopped; the plan succeeded."""
    try:
        result = plan(server.url, out, *(extra or ()), settings=settings)
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    return result


def planned_pool(server: PrometheusServer, out: Path, settings: dict[str, str] | None = None) -> dict:
    planned(server, out, settings=settings)
    return json.loads((out / "plan.json").read_text())["pools"]["general"]


def test_sidecars_and_init_containers_count_in_a_pods_requests_as_kube_scheduler_reserves_them(tmp_path):
    """kube-state-metrics publishes init containers apart from app containers. A native sidecar
    (an init container with restartPolicy Always, as Istio's proxy runs in native sidecar mode)
    runs beside the app, so its request adds to the app's; a regular init container runs before
    them, so the Pod reserves the larger of the two. The plan counts both as kube-scheduler does,
    and replays a Pod that requests nothing by what it uses."""
    families = {family.name: family for family in exporter_families()}
    init_requests = Family("kube_pod_init_container_resource_requests", "gauge")
    init_info = Family("kube_pod_init_container_info", "gauge")
    # pod, ReplicaSet, app (cores, GiB), init containers: (name, restart policy, cores, GiB)
    meshed = [("svc-6d7e8-fffff", "svc-6d7e8", (0.5, 0.5), [("proxy", "Always", 0.5, 0.25),
                                                           ("istio-init", "", 0.1, 0.0625)]),
              ("warm-7e8f9-ggggg", "warm-7e8f9", (0.5, 0.25), [("seed", "", 2.0, 1.0)])]
    for pod, replicaset, (cpu, memory), inits in meshed:
        kept = {"namespace": "mesh", "pod": pod}
        state = {**kept, "node": "node-c", "uid": f"uid-{pod}"}
        families["kube_pod_container_resource_requests"].series += [
            ({**state, "container": "app", "resource": "cpu", "unit": "core"}, lambda t, v=cpu: v),
            ({**state, "container": "app", "resource": "memory", "unit": "byte"}, lambda t, v=memory: v * 2**30)]
        for name, policy, init_cpu, init_memory in inits:
            init_requests.series += [
                ({**state, "container": name, "resource": "cpu", "unit": "core"}, lambda t, v=init_cpu: v),
                ({**state, "container": name, "resource": "memory", "unit": "byte"},
                 lambda t, v=init_memory: v * 2**30)]
            init_info.series.append(({**kept, "uid": f"uid-{pod}", "container": name, "image": f"{name}:1",
                                      "image_spec": f"{name}:1", "image_id": "", "container_id": "",
                                      "restart_policy": policy}, lambda t: 1))
        families["kube_pod_owner"].series.append(({**kept, "owner_kind": "ReplicaSet", "owner_name": replicaset,
                                                   "owner_is_controller": "true"}, lambda t: 1))
        families["kube_pod_info"].series.append(({**kept, "node": "node-c"}, lambda t: 1))
        for container in ("app", *(name for name, policy, *_ in inits if policy == "Always")):
            families["container_cpu_usage_seconds_total"].series.append(
                ({**kept, "container": container}, lambda t: 0.1 + 0.02 * math.sin(t / 3600)))
            families["container_memory_working_set_bytes"].series.append(
                ({**kept, "container": container}, lambda t: 2**27))
    # A BestEffort Pod requests nothing, and uses 1.5 cores beside the others all the same.
    best_effort = {"namespace": "mesh", "pod": "crawl-8f9a0-hhhhh"}
    families["kube_pod_owner"].series.append(({**best_effort, "owner_kind": "ReplicaSet", "owner_name": "crawl-8f9a0",
                                               "owner_is_controller": "true"}, lambda t: 1))
    families["kube_pod_info"].series.append(({**best_effort, "node": "node-c"}, lambda t: 1))
    families["container_cpu_usage_seconds_total"].series.append(({**best_effort, "container": "app"}, lambda t: 1.5))
    families["container_memory_working_set_bytes"].series.append(({**best_effort, "container": "app"},
                                                                  lambda t: 2**29))
    server = backfilled(tmp_path / "mesh", [*families.values(), init_requests, init_info], DAYS)
    mesh = planned_pool(server, tmp_path / "plan")["namespaces"]["mesh"]
    # svc: its app and its proxy, 0.5 + 0.5 cores (istio-init's 0.1 runs before them);
    # warm: its seed init container's 2 cores, more than its app's 0.5; crawl: none.
    assert mesh["cpu_requested_cores"] == pytest.approx(1.0 + 2.0)
    assert mesh["memory_requested_bytes"] == pytest.approx((0.75 + 1.0) * 2**30)
    with gzip.open(tmp_path / "plan" / "general" / "history.csv.gz", "rt") as handle:
        crawl = [r for r in csv.DictReader(handle) if r["workload"] == "mesh/ReplicaSet/crawl-8f9a0/0"]
    assert len(crawl) > DAYS * 200, "replayed, its usage on its node, though it requests nothing"
    assert {(r["cpu_request_cores"], r["memory_request_bytes"]) for r in crawl} == {("0", "0")}
    assert float(crawl[len(crawl) // 2]["cpu_usage_cores"]) == pytest.approx(1.5)


def test_a_runtimeclass_overhead_counts_in_a_pods_request_and_use(tmp_path):
    """A Pod of a RuntimeClass with overhead (a Kata Containers VM: 0.25 cores and 160 MiB) is
    reserved its containers' requests plus the overhead by kube-scheduler, and its sandbox runs
    outside the app containers' cgroups that cAdvisor's series measure. The plan counts the
    overhead in both, as kube-state-metrics publishes it, also for a Pod whose containers request
    nothing; Pods without one are unchanged."""
    families = {family.name: family for family in exporter_families()}
    kept = {"namespace": "kata", "pod": "vault-9a0b1-iiiii"}
    state = {**kept, "node": "node-c", "uid": "uid-vault", "container": "app"}
    families["kube_pod_container_resource_requests"].series += [
        ({**state, "resource": "cpu", "unit": "core"}, lambda t: 1.0),
        ({**state, "resource": "memory", "unit": "byte"}, lambda t: 2**30)]
    families["kube_pod_owner"].series.append(({**kept, "owner_kind": "ReplicaSet", "owner_name": "vault-9a0b1",
                                               "owner_is_controller": "true"}, lambda t: 1))
    families["kube_pod_info"].series.append(({**kept, "node": "node-c"}, lambda t: 1))
    families["container_cpu_usage_seconds_total"].series.append(({**kept, "container": "app"}, lambda t: 0.2))
    families["container_memory_working_set_bytes"].series.append(({**kept, "container": "app"}, lambda t: 2**28))
    # A BestEffort Pod of the same RuntimeClass: its containers request nothing, its sandbox is
    # still reserved (kube-scheduler adds the overhead to a Pod's requests whatever they are).
    idle = {"namespace": "kata", "pod": "batch-7c8d9-jjjjj"}
    families["kube_pod_owner"].series.append(({**idle, "owner_kind": "ReplicaSet", "owner_name": "batch-7c8d9",
                                               "owner_is_controller": "true"}, lambda t: 1))
    families["kube_pod_info"].series.append(({**idle, "node": "node-c"}, lambda t: 1))
    families["container_cpu_usage_seconds_total"].series.append(({**idle, "container": "app"}, lambda t: 0.1))
    families["container_memory_working_set_bytes"].series.append(({**idle, "container": "app"}, lambda t: 2**27))
    overhead = [Family("kube_pod_overhead_cpu_cores", "gauge", [({**pod, "uid": f"uid-{pod['pod']}"}, lambda t: 0.25)
                                                                 for pod in (kept, idle)]),
                Family("kube_pod_overhead_memory_bytes", "gauge",
                       [({**pod, "uid": f"uid-{pod['pod']}"}, lambda t: 160 * 2**20) for pod in (kept, idle)])]
    server = backfilled(tmp_path / "kata", [*families.values(), *overhead], DAYS)
    pool = planned_pool(server, tmp_path / "plan")
    assert pool["namespaces"]["kata"]["cpu_requested_cores"] == pytest.approx(1.25 + 0.25)
    assert pool["namespaces"]["kata"]["memory_requested_bytes"] == pytest.approx(2**30 + 2 * 160 * 2**20)
    assert pool["namespaces"]["shop"]["cpu_requested_cores"] == pytest.approx(5.0), "no overhead, none added"
    with gzip.open(tmp_path / "plan" / "general" / "history.csv.gz", "rt") as handle:
        rows = list(csv.DictReader(handle))
    vault = [r for r in rows if r["workload"] == "kata/ReplicaSet/vault-9a0b1/0"]
    assert len(vault) > DAYS * 200
    middle = vault[len(vault) // 2]
    assert float(middle["cpu_request_cores"]) == pytest.approx(1.25)
    assert float(middle["cpu_usage_cores"]) == pytest.approx(0.45, rel=0.01)
    assert float(middle["memory_usage_bytes"]) == pytest.approx(2**28 + 160 * 2**20, rel=0.001)
    batch = [r for r in rows if r["workload"] == "kata/ReplicaSet/batch-7c8d9/0"]
    middle = batch[len(batch) // 2]
    assert (float(middle["cpu_request_cores"]), float(middle["memory_request_bytes"])) == (0.25, 160 * 2**20)
    assert float(middle["cpu_usage_cores"]) == pytest.approx(0.35, rel=0.01)


def test_daemonset_and_static_pods_are_taken_off_every_nodes_size_not_packed_as_workloads(tmp_path):
    """A DaemonSet runs one Pod on every node, however many nodes right-sizing leaves, and a
    static Pod on its own node: the plan replays the other Pods on nodes of their allocatable
    less what those hold there: their requests, or what they use where that is more, as a log
    shipper requesting nothing uses 0.3 cores and 0.5 GiB of every node (one Pod per DaemonSet
    and node: a rollout's new Pod replaces the old)."""
    families = {family.name: family for family in exporter_families()}
    end = time.time() - 120
    start = end - DAYS * 86400
    agents = [(f"node-agent-{node[-1]}x2k7", node, start, end) for node in NODES]
    # node-a's agent was rolled out half way: an old Pod, then a new one under a new name.
    agents[0] = ("node-agent-ax2k7", "node-a", start, start + DAYS * 43200)
    agents.append(("node-agent-a9p4q", "node-a", start + DAYS * 43200 + STEP, end))
    # A static Pod on each node too (its mirror's owner is the Node), 0.5 cores and 0.25 GiB.
    statics = [(f"haproxy-{node}", node, start, end) for node in NODES]
    for node in NODES:  # BestEffort: no request series at all, only its usage and its owner
        kept = {"namespace": "kube-system", "pod": f"log-shipper-{node[-1]}q8z2m"}
        families["kube_pod_owner"].series.append(
            ({**kept, "owner_kind": "DaemonSet", "owner_name": "log-shipper", "owner_is_controller": "true"},
             lambda t: 1))
        families["kube_pod_info"].series.append(({**kept, "node": node}, lambda t: 1))
        families["container_cpu_usage_seconds_total"].series.append(
            ({**kept, "container": "shipper"}, lambda t: 0.3))
        families["container_memory_working_set_bytes"].series.append(
            ({**kept, "container": "shipper"}, lambda t: 2**29))
    for pod, node, first, last in agents + statics:
        kept = {"namespace": "kube-system", "pod": pod}
        cpu, memory = (0.5, 2**28) if pod.startswith("haproxy") else (1.0, 2**30)
        families["kube_pod_container_resource_requests"].series += [
            ({**kept, "container": "agent", "node": node, "resource": "cpu", "unit": "core"}, lambda t, v=cpu: v,
             first, last),
            ({**kept, "container": "agent", "node": node, "resource": "memory", "unit": "byte"},
             lambda t, v=memory: v, first, last)]
        owner = ("Node", node) if pod.startswith("haproxy") else ("DaemonSet", "node-agent")
        families["kube_pod_owner"].series.append(
            ({**kept, "owner_kind": owner[0], "owner_name": owner[1], "owner_is_controller": "true"},
             lambda t: 1, first, last))
        families["kube_pod_info"].series.append(({**kept, "node": node}, lambda t: 1, first, last))
        families["container_cpu_usage_seconds_total"].series.append(
            ({**kept, "container": "agent"}, lambda t: 0.2, first, last))
        families["container_memory_working_set_bytes"].series.append(
            ({**kept, "container": "agent"}, lambda t: 2**28, first, last))
    directory = tmp_path / "daemons"
    directory.mkdir()
    history = directory / "history.om"
    write_openmetrics(history, families.values(), start, end, STEP)
    pool = planned_pool(PrometheusServer(directory, history), tmp_path / "plan")
    assert pool["pods"] == len(PODS), "the agents are not replayed"
    assert "kube-system" not in pool["namespaces"]
    # The agent's 1 core requested (it uses 0.2), the static Pod's 0.5, the shipper's 0.3 used.
    assert pool["node_cores"] == 8 and pool["node_bound_cores"] == pytest.approx(1.8)
    assert pool["node_bound_memory_bytes"] == 1.75 * 2**30, "one agent per node (the rolled-out one not counted " \
        "twice), its static Pod and the shipper's use"
    retune = shlex.split(pool["retune"])
    assert float(retune[retune.index("--node-cores") + 1]) == pytest.approx(6.2), \
        "replayed on what the agents leave of each node"
    assert int(retune[retune.index("--node-memory") + 1]) == pool["node_memory_bytes"] - 1.75 * 2**30, "memory too"
    assert "DaemonSet and static Pods hold 1.8 cpu and 1.75 GiB of each node" in \
        (tmp_path / "plan" / "plan.md").read_text()


def flat_pod(namespace: str, name: str, owner: str, node: str, cores: float) -> PodHistory:
    """A day of a Pod on ``node`` requesting ``cores`` and 1 GiB, using half of each, every step."""
    day = array("d", [index * STEP for index in range(288)])
    return PodHistory(namespace, name, owner, node, series={
        key: (day, array("d", [value] * len(day))) for key, value in
        (("cpu_request", cores), ("cpu_usage", cores / 2), ("memory_request", 2**30), ("memory_usage", 2**29))})


def test_a_pool_with_no_node_size_or_no_room_beside_its_daemonsets_is_skipped_with_the_reason(tmp_path):
    """A pool whose nodes kube-state-metrics gives no allocatable for, or whose DaemonSets hold all
    of a node's cores or all of its memory, cannot be replayed: it is left out with one line saying
    why, and the others are exported as usual."""
    pods = [flat_pod("shop", "web-1", "Deployment/web", "node-a", 1.0),
            flat_pod("shop", "api-1", "Deployment/api", "node-x", 1.0),
            flat_pod("kube-system", "agent-b", "DaemonSet/agent", "node-b", 4.0),
            flat_pod("shop", "db-0", "StatefulSet/db", "node-b", 1.0),
            flat_pod("kube-system", "agent-c", "DaemonSet/agent", "node-c", 1.0),  # and 1 GiB
            flat_pod("shop", "cache-0", "StatefulSet/cache", "node-c", 1.0)]
    history = ClusterHistory({(p.namespace, p.pod): p for p in pods},
                             node_sizes={"node-a": (8.0, 32 * 2**30), "node-b": (4.0, 16 * 2**30),
                                         "node-c": (8.0, 2**30)},
                             node_pools={"node-a": "big", "node-b": "small", "node-c": "tight", "node-x": "unsized"})
    said: list[str] = []
    exports = export_pools(history, tmp_path, peaks=False, log=said.append)
    assert list(exports) == ["big"]
    assert exports["big"].size == (8.0, 32 * 2**30) and exports["big"].pods == 1
    assert exports["big"].export.is_file() and not pods[0].series, "written, then no longer held"
    assert "pool unsized: no node size in kube_node_status_allocatable: skipped" in said
    assert "pool small: DaemonSet and static Pods hold 4 cpu and 1 GiB of each node, all of its nodes' 4 cores " \
        "or 16 GiB: skipped" in said
    assert "pool tight: DaemonSet and static Pods hold 1 cpu and 1 GiB of each node, all of its nodes' 8 cores " \
        "or 1 GiB: skipped" in said
    assert not any((tmp_path / pool).exists() for pool in ("small", "tight", "unsized"))


def test_a_pool_is_sized_by_its_nodes_reported_whole_not_by_those_missing_a_resource(tmp_path):
    """A pool is replayed on its most common node size. A node kube-state-metrics gave no cpu or
    no memory allocatable for (its series dropped by a denylist, or not yet scraped) has no size:
    however many such nodes there are, they do not make the pool's nodes 0 cores and skip it."""
    web = flat_pod("shop", "web-1", "Deployment/web", "node-a", 1.0)
    history = ClusterHistory({("shop", "web-1"): web},
                             node_sizes={"node-a": (8.0, 32 * 2**30), "node-b": (0.0, 32 * 2**30),
                                         "node-c": (0.0, 32 * 2**30), "node-d": (8.0, 0.0), "node-e": (8.0, 0.0)},
                             node_pools={})
    exports = export_pools(history, tmp_path, peaks=False, log=lambda line: None)
    assert exports["default"].size == (8.0, 32 * 2**30)


def test_a_daemonsets_pod_rolled_out_holds_its_new_request_whichever_order_the_history_lists_it():
    """A rollout replaces a DaemonSet's Pod on each node by one of another name, here requesting
    1 core where the old requested 2: each node holds the newer Pod's request, whether the history
    lists it before the old Pod or after (Prometheus orders series by their labels, not by time).
    A Pod whose samples were all trimmed off the days replayed holds nothing."""
    first_half = array("d", [index * STEP for index in range(144)])
    second_half = array("d", [(144 + index) * STEP for index in range(144)])

    def agent(name: str, node: str, times: array[float], cores: float) -> PodHistory:
        return PodHistory("kube-system", name, "DaemonSet/agent", node, series={
            "cpu_request": (times, array("d", [cores] * len(times))),
            "memory_request": (times, array("d", [cores * 2**30] * len(times)))})

    pods = [agent("agent-a0", "node-a", first_half, 2.0), agent("agent-a1", "node-a", second_half, 1.0),
            agent("agent-b1", "node-b", second_half, 1.0), agent("agent-b0", "node-b", first_half, 2.0),
            agent("agent-trimmed", "node-b", array("d"), 4.0)]
    history = ClusterHistory({(p.namespace, p.pod): p for p in pods},
                             node_sizes={"node-a": (8.0, 32 * 2**30), "node-b": (8.0, 32 * 2**30)}, node_pools={})
    assert node_bound_share(history, "default") == (1.0, 2**30)


def test_nodes_already_oversold_are_planned_at_their_real_size(tmp_path):
    """Planning again on a cluster where oversale already runs (to choose another budget): the
    node webhook reports 7.5 real cores x 1.5 and 32 GiB x 1.25 as allocatable, and the capacity
    that keeps the kubelet's reservation (0.5 cores, 2 GiB), so kube-state-metrics sees 11.25 cores.
    cAdvisor's machine series tell the real size, the node named by whichever label the scrape
    gave it: the plan replays on 7.5-core, 32 GiB nodes, and says so."""
    families = {family.name: family for family in exporter_families()}
    allocatable = families["kube_node_status_allocatable"]
    capacity = Family("kube_node_status_capacity", "gauge")
    machine_cores = Family("machine_cpu_cores", "gauge")
    machine_memory = Family("machine_memory_bytes", "gauge")
    allocatable.series.clear()
    naming = {"node-a": {"node": "node-a"}, "node-b": {"kubernetes_io_hostname": "node-b"},
              "node-c": {"instance": "node-c:10250"}}
    for node in NODES:
        allocatable.series += [({"node": node, "resource": "cpu", "unit": "core"}, lambda t: 11.25),
                               ({"node": node, "resource": "memory", "unit": "byte"}, lambda t: 40 * 2**30)]
        capacity.series += [({"node": node, "resource": "cpu", "unit": "core"}, lambda t: 11.75),
                            ({"node": node, "resource": "memory", "unit": "byte"}, lambda t: 42 * 2**30)]
        cadvisor = {**naming[node], "job": "kubelet", "boot_id": f"boot-{node}"}
        machine_cores.series.append((cadvisor, lambda t: 8))
        machine_memory.series.append((cadvisor, lambda t: 34 * 2**30))
    server = backfilled(tmp_path / "oversold", [*families.values(), capacity, machine_cores, machine_memory], DAYS)
    pool = planned_pool(server, tmp_path / "plan")
    assert (pool["node_cores"], pool["node_memory_bytes"]) == (7.5, 32 * 2**30)
    assert pool["oversold_nodes"] == 3
    said = (tmp_path / "plan" / "plan.md").read_text()
    assert "3 nodes reported more than their machines hold (oversold already): planned at the real size" in said
    # No original-requests record exported: the requests are as running, and the flag is named.
    assert "`--metric-annotations-allowlist=pods=[stke.platform/original-requests]`" in said
    # Machine series named by the kubelet's address alone name no node: sizes as reported, and said.
    for family in (machine_cores, machine_memory):
        for index, (_, value_at) in enumerate(family.series):
            family.series[index] = ({"instance": f"10.0.3.{index + 7}:10250", "job": "kubelet"}, value_at)
    server = backfilled(tmp_path / "unnamed", [*families.values(), capacity, machine_cores, machine_memory], DAYS)
    result = planned(server, tmp_path / "unnamed-plan")
    assert ("machine_cpu_cores: no series names a node by node, kubernetes_io_hostname, instance (instance "
            "10.0.3.7:10250, 10.0.3.8:10250, 10.0.3.9:10250): node sizes taken as kube-state-metrics reports "
            "them") in result.stderr
    assert json.loads((tmp_path / "unnamed-plan" / "plan.json").read_text())["pools"]["general"]["node_cores"] == 11.25


def test_requests_right_sized_already_are_planned_at_those_the_pods_were_created_with(tmp_path):
    """Planning again where oversale runs: kube-state-metrics reports the requests running, already
    right-sized (cpu by 2.5 for web, 2 for api), and, where its allowlist names it, each Pod's
    original-requests record as ``kube_pod_annotations``. The plan replays the requests the Pods
    were created with, each by kube-scheduler's rule: web's second Pod has a native sidecar, api a
    regular init container asking for more than its app. A record it cannot read leaves that Pod's
    requests as running, and the log says so. The ETL Pods' cpu requests were set by a
    VerticalPodAutoscaler (its ``vpaUpdates`` annotation, exported too): left as they are, as the
    webhook and the reconciler leave them live."""
    families = {family.name: family for family in exporter_families()}
    requests = families["kube_pod_container_resource_requests"]
    compressed = {"web-7d9f8-aaaaa": 0.8, "web-7d9f8-bbbbb": 0.8, "api-5c6b7-ccccc": 0.5}
    for index, (labels, _) in enumerate(requests.series):
        if labels["pod"] in compressed and labels["resource"] == "cpu":
            requests.series[index] = (labels, lambda t, v=compressed[labels["pod"]]: v)
    init_requests = Family("kube_pod_init_container_resource_requests", "gauge")
    init_info = Family("kube_pod_init_container_info", "gauge")
    for pod, name, policy, cpu, memory in (("web-7d9f8-bbbbb", "proxy", "Always", 0.1, 2**28),
                                           ("api-5c6b7-ccccc", "migrate", "Never", 1.5, 2**29)):
        state = {"namespace": "shop", "pod": pod, "container": name, "uid": f"uid-{pod}"}
        init_requests.series += [({**state, "resource": "cpu", "unit": "core"}, lambda t, v=cpu: v),
                                 ({**state, "resource": "memory", "unit": "byte"}, lambda t, v=memory: v)]
        init_info.series.append(({**state, "image": f"{name}:1", "restart_policy": policy}, lambda t: 1))
    annotations = Family("kube_pod_annotations", "gauge")
    records = {("shop", "web-7d9f8-aaaaa"): {"app": {"cpu": "2", "memory": "2Gi"}},
               ("shop", "web-7d9f8-bbbbb"): {"app": {"cpu": "2", "memory": "2Gi"}, "proxy": {"cpu": "250m"}},
               ("shop", "api-5c6b7-ccccc"): {"app": {"cpu": "1", "memory": "1Gi"},
                                             "migrate": {"cpu": "3", "memory": "512Mi"}},
               ("batch", "etl-8e9f0-ddddd"): '{"app": {"cpu": "4"'}
    vpa = {("batch", pod): "Pod resources updated by etl: container 0: cpu request, cpu limit"
           for pod in ("etl-8e9f0-ddddd", "etl-8e9f0-eeeee")}
    for namespace, pod in records | vpa:
        record = records.get((namespace, pod))
        exported = {"annotation_stke_platform_original_requests":
                    record if isinstance(record, str) else json.dumps(record)} if record else {}
        if (namespace, pod) in vpa:
            exported["annotation_vpaUpdates"] = vpa[(namespace, pod)]
        annotations.series.append(({"namespace": namespace, "pod": pod, "uid": f"uid-{pod}", **exported},
                                   lambda t: 1))
    server = backfilled(tmp_path / "right-sized", [*families.values(), init_requests, init_info, annotations], DAYS)
    result = planned(server, tmp_path / "plan")
    pool = json.loads((tmp_path / "plan" / "plan.json").read_text())["pools"]["general"]
    # web: 2 and 2 + 0.25 (its sidecar runs beside it); api: its init container's 3, more than its app's 1.
    assert pool["namespaces"]["shop"]["cpu_requested_cores"] == pytest.approx(2 + 2.25 + 3)
    assert pool["namespaces"]["shop"]["memory_requested_bytes"] == pytest.approx(5 * 2**30)
    batch = pool["namespaces"]["batch"]
    assert batch["cpu_requested_cores"] == pytest.approx(8.0), "etl's unread record: as running"
    assert batch["cpu_set_cores"] == batch["cpu_requested_cores"], "set by VPA: left as they are"
    assert batch["memory_set_bytes"] < batch["memory_requested_bytes"], "VPA set cpu only"
    assert pool["original_requests_pods"] == 3
    assert ("3 Pods planned at the requests they were created with, read from their "
            "`stke.platform/original-requests` record.") in (tmp_path / "plan" / "plan.md").read_text()
    assert ("read stke.platform/original-requests: 3 Pods planned at the requests they were created with; "
            "1 record unreadable, its Pod's requests taken as running") in result.stderr
    assert "read vpaUpdates: 2 Pods whose requests a VerticalPodAutoscaler set: kept as they are" in result.stderr


def test_a_deployment_rolled_out_every_day_is_right_sized_across_its_rollouts(tmp_path):
    # Continuous delivery: every day a new ReplicaSet and a new Pod, with new names. Live, the
    # Deployment's history spans its rollouts; so must the replay's, or no Pod ever has the day
    # of history right-sizing needs and the plan shows nothing to free.
    pool = planned_pool(rolled_deployment(tmp_path), tmp_path / "plan")
    assert pool["pods"] == len(PODS) + DAYS
    ci = pool["namespaces"]["ci"]
    assert ci["cpu_requested_cores"] == 4
    assert ci["cpu_set_cores"] < 1, "0.4 cores used of 4 requested: right-sized on the days before"
    assert pool["ratios"]["workloads"]["ci/Deployment/app"] > 4


def test_a_workload_an_hpa_scales_on_cpu_utilization_keeps_its_cpu_request_as_live(tmp_path):
    # Live, lower cpu requests would read as higher utilization and scale the Deployment out, so
    # the reconciler leaves its cpu alone (OVERSALE_RESCALE_HPA=false, the default): so does the plan.
    ci = planned_pool(rolled_deployment(tmp_path / "kept", "cpu"), tmp_path / "kept" / "plan")["namespaces"]["ci"]
    assert ci["cpu_set_cores"] == ci["cpu_requested_cores"] == 4
    assert ci["memory_set_bytes"] < ci["memory_requested_bytes"] / 2, "memory is not what the HPA scales on"
    # With OVERSALE_RESCALE_HPA=true the reconciler right-sizes it and rescales the HPA's target.
    rescaled = planned_pool(rolled_deployment(tmp_path / "rescaled", "cpu"), tmp_path / "rescaled" / "plan",
                            {"OVERSALE_RESCALE_HPA": "true"})
    assert rescaled["namespaces"]["ci"]["cpu_set_cores"] < 1


def test_bare_pods_kube_state_metrics_owns_by_none_are_each_a_workload_of_their_own(tmp_path):
    """A Pod made by hand (a debug shell, a one-off load test) has no owner references, and
    kube-state-metrics still publishes its ``kube_pod_owner``, owned by ``<none>``: each such Pod
    is a workload of its own, named ``Pod/<name>`` as the extender names it, not one workload
    ``<none>/<none>`` per namespace sized by all of them together."""
    families = {family.name: family for family in exporter_families()}
    for name, node, used in (("debug-shell", "node-a", 0.1), ("load-test", "node-b", 1.5)):
        kept = {"namespace": "shop", "pod": name}
        families["kube_pod_container_resource_requests"].series += [
            ({**kept, "container": "main", "node": node, "resource": "cpu", "unit": "core"}, lambda t: 2.0),
            ({**kept, "container": "main", "node": node, "resource": "memory", "unit": "byte"}, lambda t: 2**30)]
        families["kube_pod_owner"].series.append(
            ({**kept, "owner_kind": "<none>", "owner_name": "<none>", "owner_is_controller": "<none>"}, lambda t: 1))
        families["kube_pod_info"].series.append(
            ({**kept, "node": node, "created_by_kind": "<none>", "created_by_name": "<none>"}, lambda t: 1))
        families["container_cpu_usage_seconds_total"].series.append(
            ({**kept, "container": "main"}, lambda t, v=used: v))
        families["container_memory_working_set_bytes"].series.append(
            ({**kept, "container": "main"}, lambda t: 2**28))
    pool = planned_pool(backfilled(tmp_path / "bare", list(families.values()), DAYS), tmp_path / "plan")
    assert pool["pods"] == len(PODS) + 2
    workloads = pool["ratios"]["workloads"]
    assert {"shop/Pod/debug-shell", "shop/Pod/load-test"} <= set(workloads)
    assert not [name for name in workloads if "<none>" in name]
    # Each right-sized by its own use: the shell idles at 0.1 of 2 cores, the load test runs 1.5.
    assert workloads["shop/Pod/debug-shell"] > workloads["shop/Pod/load-test"] > 1
