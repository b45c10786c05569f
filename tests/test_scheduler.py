"""The scheduler extender: kube-scheduler's wire shapes, and the real ``python -m scheduler``
against the API double (filter, prioritize, bind, restart, concurrent binds)."""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from kube.prometheus import PrometheusAPI
from oversale.annotations import AnnotationKeys
from oversale.cpus import parse_cpuset
from oversale.disruption import DisruptionBudget
from oversale.placement import pod_demand
from oversale.settings import Settings
from oversale.timestamps import format_timestamp
from oversale.usage import LoadConfig, Sample, WorkloadUsage
from scheduler.extender import filter_nodes
from scheduler.kube import HistoryPeakPoller, WorkloadHistoryPoller
from scheduler.protocol import BadRequest, parse_args, parse_binding, parse_preemption
from scheduler.state import RESERVATION_TTL, ClusterState, PodFacts, PodRecord, measured, pod_facts, scheduling_part
from tests.conftest import (
    ROOT,
    SHARED,
    cli_env,
    eventually,
    expiry_samples,
    exposed_value,
    free_port,
    stop_process,
    wait_until_serving,
    worker_deaths,
)
from tests.kube_api import FakeKubeAPI
from tests.prometheus_server import (
    GARBAGE_ANSWERS,
    STORES,
    Family,
    PrometheusServer,
    VictoriaMetricsServer,
    garbage_prometheus,
    serving,
    write_openmetrics,
)

KEYS = AnnotationKeys()
EXTENDER_PAYLOADS = SHARED / "fixtures" / "extender" / "types_test_payloads.json"
PAYLOADS = json.loads(EXTENDER_PAYLOADS.read_text()) if EXTENDER_PAYLOADS.is_file() else {}


def topology_json(sockets=2, cores=4, threads=2) -> str:
    total = sockets * cores
    return json.dumps({"detail": [
        {"id": t * total + s * cores + c, "core": c, "socket": s, "node": s}
        for t in range(threads) for s in range(sockets) for c in range(cores)]})


def node(name: str, ratio: str = "1.5", labels: dict | None = None) -> dict:
    real_cpu = 16
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": {
        KEYS.cpu_topology: topology_json(),
        KEYS.real_allocatable: json.dumps({"cpu": str(real_cpu), "memory": "64Gi"}),
        KEYS.real_capacity: json.dumps({"cpu": str(real_cpu), "memory": "64Gi"}),
        KEYS.applied_oversale_ratio: json.dumps({"cpu": ratio}),
    }}, "status": {"allocatable": {"cpu": str(int(real_cpu * float(ratio))), "memory": "64Gi", "pods": "110"},
                   "capacity": {"cpu": str(int(real_cpu * float(ratio))), "memory": "64Gi", "pods": "110"}}}


def pod(name: str, cpu: str, policy: str | None = None, node_name: str | None = None, single_numa: bool = True,
        memory: str = "1Gi", annotations: dict | None = None) -> dict:
    notes = dict(annotations or {})
    if policy:
        notes[KEYS.cpu_bind_policy] = policy
        if single_numa:
            notes[KEYS.numa_topology_policy] = "single-numa-node"
    spec: dict = {"schedulerName": "oversale", "containers": [
        {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": memory},
                                                   "limits": {"cpu": cpu, "memory": memory}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": notes},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


@pytest.mark.shared
def test_payloads_in_kube_schedulers_own_shapes_parse():
    args = parse_args(json.dumps(PAYLOADS["ExtenderArgs"]).encode())
    assert args["NodeNames"] == ["node1"] and args["Nodes"]["items"][0]["metadata"]["name"] == "nodename"
    lowered = parse_args(json.dumps(PAYLOADS["ExtenderArgs"]).lower().encode())  # Go decodes case-insensitively
    assert lowered["NodeNames"] == ["node1"]
    binding = parse_binding(json.dumps(PAYLOADS["ExtenderBindingArgs"]).encode())
    assert binding == {"PodName": "mypodname", "PodNamespace": "mypodnamespace", "PodUID": "mypoduid",
                       "Node": "mynode"}


class Extender:
    def __init__(self, api: FakeKubeAPI, tmp: Path, env_extra: dict | None = None, probe: str = "/readyz",
                 leading: bool = True) -> None:
        """Started and Ready (its caches synced) and, when ``leading``, holding the Lease too."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        kubeconfig = api.write_kubeconfig(tmp / f"kubeconfig-{self.port}")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSALE_", "KUBECONFIG"))}
        env.update({"KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT), **(env_extra or {})})
        self.log_path = tmp / f"extender-{self.port}.log"
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen([sys.executable, "-m", "scheduler", "--bind", f"127.0.0.1:{self.port}"],
                                        cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        def ready() -> bool:
            with urllib.request.urlopen(f"{self.url}{probe}", timeout=2) as response:
                answer = json.load(response)
                return bool(response.status == 200 and (not leading or probe != "/readyz" or answer["leader"]))

        wait_until_serving(self.process, ready, "extender", tmp / f"extender-{self.port}.log")

    def post(self, verb: str, payload: dict) -> object:
        request = urllib.request.Request(f"{self.url}/{verb}", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            # kube-scheduler reads only a 200's body; any other status fails the call (its
            # error, too, travels in a 200's Error field).
            assert response.status == 200, response.status
            return json.load(response)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:
            return response.read().decode()

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    def stop(self) -> None:
        stop_process(self.process)
        self.log.close()


@pytest.mark.shared
def test_the_part_of_a_node_the_state_keeps_gives_the_same_view_as_the_whole_node():
    from oversale.placement import node_view
    from scheduler.state import scheduling_part

    whole = json.loads((SHARED / "fixtures" / "nodes" / "gke-node.json").read_text())
    ours = node("unused", ratio="2", labels={KEYS.cpu_bind_policy: "FullPCPUs", KEYS.numa_allocate_strategy:
                                             "LeastAllocated", KEYS.numa_topology_policy: "single-numa-node"})
    whole["metadata"]["labels"].update(ours["metadata"]["labels"])
    whole["metadata"]["annotations"].update(ours["metadata"]["annotations"])
    whole["metadata"]["annotations"][KEYS.cpu_scheduling_watermark] = "0.5"
    whole["metadata"]["annotations"][KEYS.reservations] = json.dumps(
        {"shop/ReplicaSet/web": {"cpu": "500m", "memory": "1Gi", "until": "2099-01-01T00:00:00Z"}})
    whole["status"]["allocatable"]["cpu"] = "32"
    kept = scheduling_part(whole)
    assert len(json.dumps(kept)) < len(json.dumps(whole)) / 2
    view = node_view(whole, KEYS)
    # Allocatable as the kubelet reports it (oversold by the webhook), the real one and the ratio
    # from the webhook's record, 16 real CPUs in 2 NUMA zones, and the node's own labels.
    assert (view.name, view.allocatable) == ("node-default-pool-something", {"cpu": 32000, "memory": 12700100 * 1024})
    assert (view.real, view.cpu_ratio, view.ratio) == ({"cpu": 16000, "memory": 64 * 2**30}, 2, 2)
    assert (len(view.topology.cpus), view.topology.zones()) == (16, [0, 1])
    assert (view.bind_policy, view.single_numa, view.strategy) == ("FullPCPUs", True, "LeastAllocated")
    assert (view.watermarks.cpu_average, view.watermarks.cpu_peak) == (Decimal("0.5"), Decimal("0.85"))
    assert [(held.owner, held.requests) for held in view.reservations] == [
        ("shop/ReplicaSet/web", {"cpu": 500, "memory": 2**30})]
    assert node_view(kept, KEYS) == view


@pytest.fixture
def cluster(tmp_path) -> Iterator[tuple[FakeKubeAPI, Extender]]:
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    api.put("nodes", node("node-1", labels={KEYS.numa_allocate_strategy: "LeastAllocated"}))
    api.put("nodes", node("tiny", ratio="1"))
    extender = Extender(api, tmp_path)
    yield api, extender
    extender.stop()
    api.stop()


def bound_cpus(api: FakeKubeAPI, name: str) -> set[int]:
    status = api.get("pods", "default", name)["metadata"]["annotations"][KEYS.resource_status]
    return set(parse_cpuset(json.loads(status)["cpuset"]))


def wait_for(check, timeout=10.0):
    assert eventually(check, timeout), "condition not reached in time"


@contextmanager
def watched(api: FakeKubeAPI, state: ClusterState, watch_timeout: int = 300,
            synced: bool = True) -> Iterator[tuple[Any, Any]]:
    """The extender's watches (``ClusterWatch``, the real client) over ``api`` into ``state``,
    synced and the Node and Pod watches open (``synced=False``: started only); stopped
    afterwards, and ``api`` with them. Yields (API client, watch)."""
    from kubernetes import client

    from scheduler.kube import ClusterWatch

    api_client = client.ApiClient(client.Configuration(host=api.url))
    watch = ClusterWatch(api_client, state, watch_timeout)
    try:
        watch.start()
        if synced:
            wait_for(lambda: watch.synced, timeout=60)
            # Synced means listed; each watch request follows its list. A test that then makes
            # the API server fail a plural's next requests must not have the watch take the failure.
            wait_for(lambda: api.count("GET", "nodes", watch=True) and api.count("GET", "pods", watch=True),
                     timeout=60)
        yield api_client, watch
    finally:
        for reflector in watch.reflectors:
            reflector.stop()
        api.stop()


@pytest.mark.shared
def test_filter_with_node_names_returns_only_nodes_sent_with_exact_reasons(cluster):
    api, extender = cluster
    # tiny is not oversold: 16 real cores; node-0 and node-1: 24 oversold.
    api.put("pods", pod("busy", "20", node_name="tiny"))
    wait_for(lambda: extender.post("filter", {"Pod": pod("p", "8"), "NodeNames": ["tiny"]})["FailedNodes"])
    answer = extender.post("filter", {"Pod": pod("p", "8"), "NodeNames": ["node-0", "tiny", "ghost"]})
    assert answer["NodeNames"] == ["node-0"]
    assert answer["FailedNodes"]["tiny"] == "cpu: 8 requested, 0 free on tiny (oversold allocatable)"
    assert answer["FailedNodes"]["ghost"] == "node not in the extender's cache yet"
    assert set(answer) == set(PAYLOADS["ExtenderFilterResult"])  # the Go field names, no others
    assert answer["Nodes"] is None and answer["Error"] == ""
    # nodeCacheCapable: an empty answer is an explicit empty list, never a missing NodeNames.
    none_fit = extender.post("filter", {"Pod": pod("p", "100"), "NodeNames": ["node-0"]})
    assert none_fit["NodeNames"] == []


def test_filter_with_full_nodes_answers_with_full_nodes(cluster):
    _, extender = cluster
    sent = {"metadata": {}, "items": [node("node-0"), node("outsider")]}
    answer = extender.post("filter", {"Pod": pod("p", "4", "FullPCPUs"), "Nodes": sent})
    # Each Node object goes back whole, as kube-scheduler's NodeList.
    assert answer == {"Nodes": sent, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                      "Error": ""}


def test_bound_pods_get_whole_cores_from_real_cpus_and_are_charged_at_the_ratio(cluster):
    api, extender = cluster
    api.put("pods", pod("a", "4", "FullPCPUs"))
    wait_for(lambda: api.get("pods", "default", "a") is not None)
    assert extender.post("bind", {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "node-0"}) \
        == {"Error": ""}
    stored = api.get("pods", "default", "a")
    assert stored["spec"]["nodeName"] == "node-0"
    status = json.loads(stored["metadata"]["annotations"][KEYS.resource_status])
    cpus = set(parse_cpuset(status["cpuset"]))
    assert len(cpus) == 4 and status["numaNode"] in (0, 1)
    topology = json.loads(topology_json())["detail"]
    cores = {(c["socket"], c["core"]) for c in topology if c["id"] in cpus}
    assert len(cores) == 2, "two whole cores, both threads each"
    # 4 exclusive CPUs cost 4 x 1.5 = 6 of node-0's 24 oversold cores: 18 left for shared Pods.
    assert extender.post("filter", {"Pod": pod("s", "18"), "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"]
    refused = extender.post("filter", {"Pod": pod("s", "18500m"), "NodeNames": ["node-0"]})
    assert refused["FailedNodes"]["node-0"] == "cpu: 18500m requested, 18 free on node-0 (oversold allocatable)"


def test_a_runtime_class_overhead_neither_breaks_the_binding_nor_goes_uncharged(cluster):
    # Kata-style: the sandbox's 250m comes on top of the containers' 4 cores (spec.overhead, set by
    # the RuntimeClass admission plugin). The cpuset is the containers' 4; the 250m is shared.
    api, extender = cluster
    kata = pod("kata", "4", "FullPCPUs")
    kata["spec"]["overhead"] = {"cpu": "250m", "memory": "160Mi"}
    api.put("pods", kata)
    wait_for(lambda: api.get("pods", "default", "kata") is not None)
    assert extender.post("bind", {"PodName": "kata", "PodNamespace": "default", "PodUID": "uid-kata",
                                  "Node": "node-0"}) == {"Error": ""}
    assert len(bound_cpus(api, "kata")) == 4
    # 4 exclusive CPUs at 1.5 and the 250m overhead: 17750m of node-0's 24 oversold cores left.
    wait_for(lambda: extender.post("filter", {"Pod": pod("s", "17750m"), "NodeNames": ["node-0"]})["NodeNames"]
             == ["node-0"])
    refused = extender.post("filter", {"Pod": pod("s", "17751m"), "NodeNames": ["node-0"]})
    assert refused["FailedNodes"]["node-0"] == "cpu: 17751m requested, 17750m free on node-0 (oversold allocatable)"


def test_numa_shortage_is_explained_and_unresolvable_requests_say_so(cluster):
    api, extender = cluster
    answer = extender.post("filter", {"Pod": pod("big", "10", "FullPCPUs"), "NodeNames": ["node-0"]})
    assert answer["FailedNodes"]["node-0"] == \
        "needs 5 full cores in one NUMA node; NUMA node 0 has 4 free, NUMA node 1 has 4 free"
    odd = extender.post("filter", {"Pod": pod("odd", "3", "FullPCPUs"), "NodeNames": ["node-0"]})
    assert "multiple of 2" in odd["FailedAndUnresolvableNodes"]["node-0"]
    # Every CPU of the node a Pod may have; one more it never can, whatever a preemption frees.
    every = extender.post("filter", {"Pod": pod("wide", "16", "SpreadByPCPUs", single_numa=False),
                                     "NodeNames": ["node-0"]})
    assert every["NodeNames"] == ["node-0"]
    more = extender.post("filter", {"Pod": pod("wider", "17", "SpreadByPCPUs", single_numa=False),
                                    "NodeNames": ["node-0"]})
    assert list(more["FailedAndUnresolvableNodes"]) == ["node-0"]
    # With another Pod on the node, every CPU is refused for now: evicting that Pod would help.
    api.put("pods", pod("neighbour", "2", node_name="node-0"))
    wait_for(lambda: "node-0" in extender.post("filter", {"Pod": pod("wide", "16", "SpreadByPCPUs",
                                                                       single_numa=False),
                                                          "NodeNames": ["node-0"]})["FailedNodes"])
    # A shared Pod asking more cores than the node has really fits its oversold 24 once it is alone.
    broad = extender.post("filter", {"Pod": pod("broad", "23"), "NodeNames": ["node-0"]})
    assert list(broad["FailedNodes"]) == ["node-0"] and broad["FailedAndUnresolvableNodes"] == {}


@pytest.mark.shared
def test_preemption_payloads_in_kube_schedulers_own_shapes_parse():
    args = parse_preemption(json.dumps(PAYLOADS["ExtenderPreemptionArgs"]).encode())
    assert args["NodeNameToMetaVictims"] == {"foo": {"Pods": [{"UID": "myuid"}], "NumPDBViolations": 1}}
    # nodeCacheCapable false: whole Pods, of which only the UID matters.
    whole = {"Pod": pod("p", "1"), "NodeNameToVictims": {"n": {"Pods": [pod("v", "1", node_name="n")],
                                                               "NumPDBViolations": 0}}}
    assert parse_preemption(json.dumps(whole).lower().encode())["NodeNameToMetaVictims"] == {
        "n": {"Pods": [{"UID": "uid-v"}], "NumPDBViolations": 0}}
    for bad, said in (({"Pod": pod("p", "1"), "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}}, "Pods[0] has no UID"),
                      ({"Pod": pod("p", "1"), "NodeNameToVictims": ["n"]}, "not an object of node names"),
                      ({"NodeNameToMetaVictims": {}}, "has no Pod")):
        with pytest.raises(BadRequest, match=re.escape(said)):
            parse_preemption(json.dumps(bad).encode())


_VICTIMS = "ExtenderPreemptionArgs.NodeNameToMetaVictims['n']"


@pytest.mark.parametrize(("parse", "payload", "said"), [
    (parse_args, [{"Pod": {}}], "body is not a JSON object"),
    (parse_args, {"NodeNames": ["n"]}, "ExtenderArgs has no Pod"),
    (parse_args, {"Pod": {"metadata": 5}}, "ExtenderArgs.Pod: metadata is not an object"),
    (parse_args, {"Pod": {}, "Nodes": ["n"]}, "ExtenderArgs.Nodes has no items list of Node objects"),
    (parse_args, {"Pod": {}, "Nodes": {"items": {"n": {}}}}, "ExtenderArgs.Nodes has no items list of Node objects"),
    (parse_args, {"Pod": {}, "NodeNames": ["n", 5]}, "ExtenderArgs.NodeNames is not a list of node names"),
    (parse_preemption, {"NodeNameToMetaVictims": {}}, "ExtenderPreemptionArgs has no Pod"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": ["n"]},
     "ExtenderPreemptionArgs.NodeNameToMetaVictims is not an object of node names"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": {"n": 5}}, f"{_VICTIMS} has no Pods list"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": "v"}}}, f"{_VICTIMS} has no Pods list"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": ["v"]}}},
     f"{_VICTIMS}.Pods[0] is not an object"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "a"}, {"UID": ""}]}}},
     f"{_VICTIMS}.Pods[1] has no UID"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 7}]}}},
     f"{_VICTIMS}.Pods[0] has no UID"),
    (parse_preemption, {"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [{"metadata": {"name": "v"}}]}}},
     "ExtenderPreemptionArgs.NodeNameToVictims['n'].Pods[0] has no UID"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": True}}},
     f"{_VICTIMS}.NumPDBViolations is not an integer"),
    (parse_preemption, {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": "1"}}},
     f"{_VICTIMS}.NumPDBViolations is not an integer"),
    (parse_binding, {"PodName": "p", "PodNamespace": "ns"}, "ExtenderBindingArgs has no Node"),
    (parse_binding, {"PodName": "", "PodNamespace": "ns", "Node": "n"}, "ExtenderBindingArgs has no PodName"),
    (parse_binding, {"PodName": "p", "PodNamespace": 5, "Node": "n"}, "ExtenderBindingArgs has no PodNamespace"),
])
def test_a_payload_outside_the_protocol_is_refused_naming_its_field(parse, payload, said):
    """What a hand-made call is told (the 400's Error), word for word: the field, and where in it."""
    with pytest.raises(BadRequest) as refused:
        parse(json.dumps(payload).encode())
    assert str(refused.value) == said


def test_protocol_payloads_read_whatever_the_case_of_their_keys():
    """Go's decoder matches field names case-insensitively, so kube-scheduler's peers may send any
    case. A binding without PodUID (an older caller) reads as one with none; a node named in both
    victim forms keeps the UIDs kube-scheduler named itself."""
    assert parse_binding(b'{"podname": "p", "PODNAMESPACE": "ns", "node": "n"}') == {
        "PodName": "p", "PodNamespace": "ns", "Node": "n", "PodUID": ""}
    assert parse_binding(b'{"podName": "p", "podNamespace": "ns", "node": "n", "podUid": "u1"}')["PodUID"] == "u1"
    assert parse_args(b'{"pod": {}, "nodenames": ["a", "b"], "Unknown": 1}') == {"Pod": {}, "NodeNames": ["a", "b"]}
    # nodeCacheCapable false: whole Nodes, and no names.
    assert parse_args(b'{"Pod": {}, "nodes": {"items": [{"metadata": {"name": "a"}}]}}') == {
        "Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}]}}
    both = {"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [{"metadata": {"uid": "whole"}}]},
                                             "m": {"Pods": [{"metadata": {"uid": "only"}}], "NumPDBViolations": 2}},
            "NodeNameToMetaVictims": {"n": {"Pods": [{"uid": "meta"}]}}}
    assert parse_preemption(json.dumps(both).encode()) == {"Pod": {}, "NodeNameToMetaVictims": {
        "n": {"Pods": [{"UID": "meta"}], "NumPDBViolations": 0},
        "m": {"Pods": [{"UID": "only"}], "NumPDBViolations": 2}}}
    with pytest.raises(BadRequest) as refused:
        parse_binding(b"PodName=p")
    assert str(refused.value) == "body is not JSON: Expecting value: line 1 column 1 (char 0)"


def bound_pod(name: str, cpu: str, node_name: str, cpuset: str | None = None) -> dict:
    notes = {KEYS.resource_status: json.dumps({"cpuset": cpuset, "numaNode": 0})} if cpuset else {}
    return pod(name, cpu, "FullPCPUs" if cpuset else None, node_name=node_name, annotations=notes)


def victims(*names: str, violations: int = 0) -> dict:
    return {"Pods": [{"UID": f"uid-{name}"} for name in names], "NumPDBViolations": violations}


@pytest.mark.shared
def test_preemption_keeps_only_nodes_where_the_victims_make_room_by_the_extenders_rules(cluster):
    api, extender = cluster
    # node-0 and node-1 (24 oversold of 16 real CPUs): one Pod holds 2 whole cores (charged 6
    # oversold, counted 4 by kube-scheduler), two shared ones 6 and 8. kube-scheduler sees 18 of
    # 24 taken; for an 8-CPU FullPCPUs Pod it needs 2 more and picks the 6-core Pod alone.
    for host in ("node-0", "node-1"):
        api.put("pods", prioritised(bound_pod(f"keeper-{host}", "4", host, "0-1,8-9"), 2000))
        api.put("pods", bound_pod(f"a-{host}", "6", host))
        api.put("pods", bound_pod(f"b-{host}", "8", host))
    # tiny (16 real, not oversold): 2 whole cores held in each NUMA node and 8 shared; evicting
    # the shared Pod frees 8 by requests but leaves no NUMA node with 4 free cores.
    api.put("pods", bound_pod("keeper0-tiny", "4", "tiny", "0-1,8-9"))
    api.put("pods", bound_pod("keeper1-tiny", "4", "tiny", "4-5,12-13"))
    api.put("pods", bound_pod("c-tiny", "8", "tiny"))
    vip = pod("vip", "8", "FullPCPUs")
    wait_for(lambda: extender.post("filter", {"Pod": vip, "NodeNames": ["tiny"]})["FailedNodes"])
    wait_for(lambda: len(extender.post("filter", {"Pod": vip, "NodeNames": ["node-0", "node-1"]})["FailedNodes"]) == 2)
    sent = {"node-0": victims("a-node-0", violations=1), "node-1": victims("a-node-1", "b-node-1"),
            "tiny": victims("c-tiny"), "ghost": victims("x")}
    answer = extender.post("preempt", {"Pod": vip, "NodeNameToMetaVictims": sent})
    assert set(answer) == set(PAYLOADS["ExtenderPreemptionResult"])  # the Go field names, no others
    # Only node-1 with both shared Pods gone has the 12 oversold cores 4 exclusive cores cost, and them.
    assert answer == {"NodeNameToMetaVictims": {"node-1": victims("a-node-1", "b-node-1")}}
    log = extender.log_path.read_text()
    assert "preemption for default/vip: 1 of 4 candidate nodes kept" in log
    assert ("node-0: still refused after evicting 1 Pod(s): cpu: 12 charged for its exclusive CPUs, 10 free on "
            "node-0") in log
    assert "tiny: still refused after evicting 1 Pod(s): needs 4 full cores in one NUMA node" in log
    assert "ghost: node not in the extender's cache" in log and "node-1: node not in" not in log
    # The same with whole Pods (nodeCacheCapable false); the answer is always by UID.
    whole = {"Pod": vip, "NodeNameToVictims": {"node-0": {"Pods": [bound_pod("a-node-0", "6", "node-0"),
                                                                   bound_pod("b-node-0", "8", "node-0")],
                                                          "NumPDBViolations": 0}}}
    assert extender.post("preempt", whole) == {"NodeNameToMetaVictims": {"node-0": victims("a-node-0", "b-node-0")}}
    # Above the shared Pods' priority, vip would otherwise never preempt on a full oversold node:
    # the extender adds the fewest Pods of lower priority its charge needs (not keeper-node-0, of
    # higher priority), and keeps kube-scheduler's count of PDBs broken. On tiny, one of the two
    # whole-core Pods must go too, so that one NUMA node has 4 free cores.
    important = prioritised(pod("vip", "8", "FullPCPUs"), 1000)
    answer = extender.post("preempt", {"Pod": important, "NodeNameToMetaVictims": {
        "node-0": victims("a-node-0", violations=1), "tiny": victims("c-tiny")}})["NodeNameToMetaVictims"]
    assert answer["node-0"] == victims("a-node-0", "b-node-0", violations=1)
    assert answer["tiny"]["Pods"][0] == {"UID": "uid-c-tiny"} and len(answer["tiny"]["Pods"]) == 2
    assert answer["tiny"]["Pods"][1]["UID"] in ("uid-keeper0-tiny", "uid-keeper1-tiny")
    assert ("node-0: 1 more Pod(s) of lower priority evicted than kube-scheduler chose, for the room the extender "
            "charges") in extender.log_path.read_text()
    # Since kubernetes#135486 a node where kube-scheduler's own plugins need no victim comes with
    # none; the extender names them (node-1: one of its two shared Pods frees the 12 cores' charge).
    answer = extender.post("preempt", {"Pod": important, "NodeNameToMetaVictims": {"node-1": victims()}})
    assert [victim["UID"] for victim in answer["NodeNameToMetaVictims"]["node-1"]["Pods"]] in (
        ["uid-a-node-1"], ["uid-b-node-1"])


def labelled(manifest: dict, **labels: str) -> dict:
    manifest["metadata"]["labels"] = labels
    return manifest


def test_victims_the_extender_adds_are_weighed_by_the_disruption_budgets_they_break(cluster):
    """kube-scheduler prefers the candidate node whose victims break the fewest PodDisruptionBudgets
    (NumPDBViolations): the victims the extender adds are chosen and counted the same way, from the
    budgets it watches."""
    api, extender = cluster
    # node-0 (24 oversold of 16 real): keeper holds 2 whole cores (charged 6), a 6 cpu, b and c 4
    # each. kube-scheduler evicts a for vip (8 exclusive CPUs: 8 by its count, 12 by the extender's
    # charge), and the extender must add b or c.
    api.put("pods", prioritised(bound_pod("keeper", "4", "node-0", "0-1,8-9"), 2000))
    api.put("pods", bound_pod("a", "6", "node-0"))
    api.put("pods", labelled(bound_pod("b", "4", "node-0"), app="b"))
    api.put("pods", labelled(bound_pod("c", "4", "node-0"), app="c"))
    vip = prioritised(pod("vip", "8", "FullPCPUs"), 1000)

    def preempt(sent_violations: int = 0) -> dict:
        answer = extender.post("preempt", {"Pod": vip, "NodeNameToMetaVictims": {
            "node-0": victims("a", violations=sent_violations)}})
        return answer["NodeNameToMetaVictims"]["node-0"]

    def budget(name: str, *apps: str) -> dict:
        return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": list(apps)}]},
                         "minAvailable": 1},
                "status": {"disruptionsAllowed": 0}}

    wait_for(lambda: len(preempt()["Pods"]) == 2)
    first = preempt()["Pods"][1]["UID"].removeprefix("uid-")
    other = {"b": "c", "c": "b"}[first]
    assert preempt() == victims("a", first)
    # The one it would add may not go: the other goes instead, nothing more broken.
    api.put("poddisruptionbudgets", budget("first", first))
    wait_for(lambda: preempt() == victims("a", other))
    # Neither may: one goes all the same, and kube-scheduler's count grows by one.
    api.put("poddisruptionbudgets", budget("both", "b", "c"))
    wait_for(lambda: preempt(sent_violations=2)["NumPDBViolations"] == 3)
    assert len(preempt()["Pods"]) == 2
    assert ("node-0: 1 more Pod(s) of lower priority evicted than kube-scheduler chose (1 breaking a "
            "PodDisruptionBudget), for the room the extender charges") in extender.log_path.read_text()
    api.delete("poddisruptionbudgets", "default", "both")
    api.delete("poddisruptionbudgets", "default", "first")
    wait_for(lambda: preempt() == victims("a", first))


def prioritised(manifest: dict, priority: int, nominated: str | None = None) -> dict:
    manifest["spec"]["priority"] = priority
    if nominated:
        manifest["status"]["nominatedNodeName"] = nominated
    return manifest


def test_room_freed_by_a_preemption_is_kept_for_the_preemptor(cluster):
    api, extender = cluster
    # node-0: 2 whole cores held in NUMA node 0; "vip" (8 CPUs, one NUMA node) has preempted and is
    # nominated there while its victims leave. kube-scheduler counts 4 + 8 of 24 oversold cores
    # and would let another 8-CPU Pod in; only NUMA node 1 can give vip its 4 cores.
    api.put("pods", bound_pod("keeper", "4", "node-0", "0-1,8-9"))
    api.put("pods", prioritised(pod("vip", "8", "FullPCPUs"), 1000, nominated="node-0"))
    low, boss = prioritised(pod("low", "8", "FullPCPUs"), 0), prioritised(pod("boss", "8", "FullPCPUs"), 2000)
    wait_for(lambda: extender.post("filter", {"Pod": low, "NodeNames": ["node-0"]})["FailedNodes"])
    refused = extender.post("filter", {"Pod": low, "NodeNames": ["node-0"]})["FailedNodes"]["node-0"]
    assert refused == ("cpu: 12 charged for its exclusive CPUs, 6 free on node-0 (oversold allocatable), with room "
                       "kept for 1 Pod(s) nominated there")
    # Not for vip itself, nor for a Pod of higher priority (kube-scheduler's own rule).
    for ahead in (pod("vip", "8", "FullPCPUs"), boss):
        assert extender.post("filter", {"Pod": prioritised(ahead, ahead["spec"].get("priority", 1000)),
                                        "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"]
    # Were kube-scheduler to ask, bind would not hand low the cores either.
    api.put("pods", low)
    wait_for(lambda: api.get("pods", "default", "low") is not None)
    answer = extender.post("bind", {"PodName": "low", "PodNamespace": "default", "PodUID": "uid-low",
                                    "Node": "node-0"})
    assert "no longer fits node-0" in answer["Error"]
    # Once vip is bound, its own cpuset counts; once it is gone, the room is free again.
    vip = prioritised(pod("vip", "8", "FullPCPUs"), 1000)
    api.put("pods", vip)
    api.delete("pods", "default", "vip")
    wait_for(lambda: extender.post("filter", {"Pod": low, "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"])


def test_a_bound_pod_deleted_gives_its_room_and_cores_back(cluster):
    """The watch's DELETED event carries no Pod the state could read a UID from: the watch
    remembers each Pod's UID by its name for it."""
    api, extender = cluster
    api.put("pods", bound_pod("busy", "20", "node-0"))
    api.put("pods", bound_pod("pinned", "8", "node-1", cpuset="0-7"))
    asking = {"Pod": pod("p", "8", "FullPCPUs"), "NodeNames": ["node-0", "node-1"]}
    wait_for(lambda: extender.post("filter", asking)["NodeNames"] == [])
    api.delete("pods", "default", "busy")
    api.delete("pods", "default", "pinned")
    wait_for(lambda: extender.post("filter", asking)["NodeNames"] == ["node-0", "node-1"])


def test_a_binding_names_the_pod_scheduled_by_its_uid():
    """Made again under its name between the extender's read and its write (a StatefulSet's Pod),
    the new Pod is not bound to the node chosen for the old one: the API server checks the UID."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    try:
        again = pod("web-0", "1")
        again["metadata"]["uid"] = "uid-new"
        api.put("pods", again)
        binder = KubeBinder(client.ApiClient(client.Configuration(host=api.url)))
        with pytest.raises(ApiException) as refused:
            binder.bind("default", "web-0", "uid-web-0", "node-0")
        assert refused.value.status == 409 and "Precondition failed: UID in precondition" in str(refused.value.body)
        assert not api.get("pods", "default", "web-0")["spec"].get("nodeName")
        binder.bind("default", "web-0", "uid-new", "node-0")
        assert api.get("pods", "default", "web-0")["spec"]["nodeName"] == "node-0"
    finally:
        api.stop()


def test_a_pod_nominated_for_its_binding_cycle_is_counted_once_while_the_extender_binds_it(cluster):
    api, extender = cluster
    # Since Kubernetes 1.35 (KEP-5278) kube-scheduler sets nominatedNodeName at the start of a
    # binding cycle whose PreBind takes time (volumes to provision), and the API server clears it
    # at the bind. node-0 has 24 oversold cores: base and vol take 16, so one more 8-core Pod fits.
    api.put("pods", bound_pod("base", "8", "node-0"))
    api.put("pods", prioritised(pod("vol", "8"), 0, nominated="node-0"))
    nine, eight = pod("nine", "9"), pod("next", "8")
    wait_for(lambda: extender.post("filter", {"Pod": nine, "NodeNames": ["node-0"]})["FailedNodes"])
    assert extender.post("filter", {"Pod": eight, "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"]
    with api.watches_paused():  # the bind is done; the watch has not shown it yet
        answer = extender.post("bind", {"PodName": "vol", "PodNamespace": "default", "PodUID": "uid-vol",
                                        "Node": "node-0"})
        assert answer == {"Error": ""}
        # vol now holds its room as a bind in flight: its nomination must not hold it again.
        assert extender.post("filter", {"Pod": eight, "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"]
        assert extender.post("filter", {"Pod": nine, "NodeNames": ["node-0"]})["FailedNodes"]


@pytest.mark.shared
def test_prioritize_scores_every_node_sent_by_its_strategy(cluster):
    api, extender = cluster
    api.put("pods", pod("half", "8", "FullPCPUs", node_name="node-0",
                        annotations={KEYS.resource_status: json.dumps({"cpuset": "0-3,8-11", "numaNode": 0})}))
    api.put("pods", pod("other", "8", "FullPCPUs", node_name="node-1",
                        annotations={KEYS.resource_status: json.dumps({"cpuset": "0-3,8-11", "numaNode": 0})}))
    # Both bound Pods seen by the extender's watch, not only the first: the scores depend on both.
    wait_for(lambda: len(extender.post("filter", {"Pod": pod("x", "10", "FullPCPUs", single_numa=False),
                                                  "NodeNames": ["node-0", "node-1"]})["FailedNodes"]) == 2)
    scores = extender.post("prioritize", {"Pod": pod("p", "2", "FullPCPUs"), "NodeNames": ["node-0", "node-1"]})
    assert [s["Host"] for s in scores] == ["node-0", "node-1"]
    assert set(scores[0]) == set(PAYLOADS["HostPriority"])
    assert all(0 <= s["Score"] <= 10 for s in scores)
    # node-0 packs (MostAllocated): the half-used zone; node-1 spreads (LeastAllocated) and scores lower.
    assert scores[0]["Score"] > scores[1]["Score"]
    # A node not in the extender's cache yet is in the answer too, at the lowest score.
    unknown = extender.post("prioritize", {"Pod": pod("p", "2", "FullPCPUs"), "NodeNames": ["node-9", "node-0"]})
    assert unknown == [{"Host": "node-0", "Score": scores[0]["Score"]}, {"Host": "node-9", "Score": 0}]


def test_concurrent_binds_never_share_a_cpu(cluster):
    api, extender = cluster
    names = [f"c{i}" for i in range(10)]
    for name in names:
        api.put("pods", pod(name, "2", "FullPCPUs"))
    wait_for(lambda: all(api.get("pods", "default", n) for n in names))
    answers: dict[str, dict] = {}

    def bind(name: str) -> None:
        answers[name] = extender.post("bind", {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
                                               "Node": "node-0"})

    threads = [threading.Thread(target=bind, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ok = [n for n in names if answers[n] == {"Error": ""}]
    assert len(ok) == 8, answers  # 16 real CPUs, 2 each
    allocated = [bound_cpus(api, n) for n in ok]
    assert len(set().union(*allocated)) == 16, "no CPU handed out twice"
    assert all("no longer fits" in answers[n]["Error"] for n in names if n not in ok)


def test_a_restarted_extender_rebuilds_allocations_from_pod_annotations(cluster, tmp_path):
    api, extender = cluster
    api.put("pods", pod("first", "4", "FullPCPUs"))
    wait_for(lambda: api.get("pods", "default", "first") is not None)
    assert extender.post("bind", {"PodName": "first", "PodNamespace": "default", "PodUID": "uid-first",
                                  "Node": "node-0"})["Error"] == ""
    extender.stop()
    restarted = Extender(api, tmp_path)
    try:
        api.put("pods", pod("second", "4", "FullPCPUs"))
        wait_for(lambda: api.get("pods", "default", "second") is not None)
        assert restarted.post("bind", {"PodName": "second", "PodNamespace": "default", "PodUID": "uid-second",
                                       "Node": "node-0"})["Error"] == ""
        assert not bound_cpus(api, "first") & bound_cpus(api, "second")
    finally:
        restarted.stop()
        extender.process = restarted.process  # already stopped; the fixture's stop is then a no-op
        extender.log = restarted.log


def test_pods_rejected_by_the_kubelet_release_their_cpus(cluster):
    api, extender = cluster
    for index in range(4):  # 16 real CPUs in 4 Pods of 4
        api.put("pods", pod(f"r{index}", "4", "FullPCPUs", single_numa=False))
        wait_for(lambda i=index: api.get("pods", "default", f"r{i}") is not None)
        assert extender.post("bind", {"PodName": f"r{index}", "PodNamespace": "default", "PodUID": f"uid-r{index}",
                                      "Node": "node-0"})["Error"] == ""
    full = extender.post("filter", {"Pod": pod("next", "4", "FullPCPUs"), "NodeNames": ["node-0"]})
    assert full["NodeNames"] == []
    rejected = api.get("pods", "default", "r0")
    rejected["status"] = {"phase": "Failed", "reason": "TopologyAffinityError"}
    api.put("pods", rejected)
    wait_for(lambda: extender.post("filter", {"Pod": pod("next", "4", "FullPCPUs"),
                                              "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"])


def test_a_pod_resized_down_in_place_holds_its_old_request_until_the_kubelet_applies_it(cluster):
    # KEP 1287: kube-scheduler counts a Pod already on a node by the largest of its spec, what the
    # kubelet admitted and what the runtime applies. Counting the lowered spec alone would offer
    # room the node does not have yet, and the Pod bound there is rejected by the kubelet.
    api, extender = cluster
    shrinking = pod("shrinking", "4", node_name="tiny")          # tiny: 16 real cores, not oversold
    shrinking["status"]["containerStatuses"] = [{"name": "c", "allocatedResources": {"cpu": "14"},
                                                 "resources": {"requests": {"cpu": "14"}}}]
    api.put("pods", shrinking)
    asking = {"Pod": pod("p", "8"), "NodeNames": ["tiny"]}
    wait_for(lambda: extender.post("filter", asking)["FailedNodes"])
    assert extender.post("filter", asking)["FailedNodes"]["tiny"] == \
        "cpu: 8 requested, 2 free on tiny (oversold allocatable)"
    shrinking["status"]["containerStatuses"] = [{"name": "c", "allocatedResources": {"cpu": "4"},
                                                 "resources": {"requests": {"cpu": "4"}}}]
    api.put("pods", shrinking)                                   # the kubelet has applied it
    wait_for(lambda: extender.post("filter", asking)["NodeNames"] == ["tiny"])


@pytest.mark.parametrize(("payload", "said"), [
    ({}, "no Pod"),
    ({"Pod": {"metadata": 5}}, "ExtenderArgs.Pod: metadata is not an object"),
    ({"Pod": {"spec": {"containers": "app"}}}, "spec.containers is not a list"),
    ({"Pod": {"spec": {"containers": [None]}}}, "spec.containers[0] is not an object"),
    ({"Pod": {"spec": {"initContainers": [{"resources": {"requests": "1"}}]}}},
     "spec.initContainers[0].resources.requests is not an object"),
    ({"Pod": {"metadata": {"name": "p"}}, "NodeNames": "node-0"}, "NodeNames is not a list of node names"),
    ({"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": ["node-0"]}}, "no items list of Node objects"),
])
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_bad_payloads_get_a_400_naming_the_field(cluster, verb, payload, said):
    # kube-scheduler never sends these; a hand-made call is told which field is wrong instead of
    # "filter failed: 'int' object has no attribute 'get'" from deep inside a policy.
    _, extender = cluster
    request = urllib.request.Request(f"{extender.url}/{verb}", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as failure:
        urllib.request.urlopen(request, timeout=5)
    assert failure.value.code == 400
    assert said in json.load(failure.value)["Error"]


def test_without_a_client_ca_it_serves_warning_that_anyone_may_bind(cluster):
    """docs/scheduler.md: without --client-ca it still serves (development), warns at start and
    shows oversale_extender_client_auth 0."""
    _, extender = cluster
    assert "oversale_extender_client_auth 0.0" in extender.get("/metrics").splitlines()
    assert (f"WARNING scheduler: no --client-ca: any client that reaches 127.0.0.1:{extender.port} can call bind "
            "(development only; deploy/ uses mutual TLS)") in extender.log_path.read_text()


def test_each_call_is_counted_by_verb_and_what_came_of_it(cluster):
    """What the OversaleExtenderErrors alert and the dashboard read: oversale_extender_calls_total
    by verb and result (ok, malformed: a 400, error: an answer whose Error is set), and each call's
    time in oversale_extender_duration_seconds."""
    from prometheus_client.parser import text_string_to_metric_families

    _, extender = cluster

    def exposed() -> dict[tuple[str, str, str], float]:
        return {(sample.name, sample.labels.get("verb", ""), sample.labels.get("result", "")): sample.value
                for family in text_string_to_metric_families(extender.get("/metrics")) for sample in family.samples
                if sample.name in ("oversale_extender_calls_total", "oversale_extender_duration_seconds_count",
                                   "oversale_extender_duration_seconds_sum")}

    before = exposed()
    started = time.monotonic()
    assert extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"]
    assert [host["Host"] for host in extender.post("prioritize", {"Pod": pod("p", "1"), "NodeNames": ["node-0"]})] \
        == ["node-0"]
    assert extender.post("preempt", {"Pod": pod("p", "1"), "NodeNameToMetaVictims": {"node-0": {"Pods": []}}}) \
        == {"NodeNameToMetaVictims": {"node-0": {"Pods": [], "NumPDBViolations": 0}}}
    malformed = urllib.request.Request(f"{extender.url}/filter", data=b"{}",
                                       headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as failure:
        urllib.request.urlopen(malformed, timeout=5)
    assert failure.value.code == 400
    gone = extender.post("bind", {"PodName": "gone", "PodNamespace": "default", "PodUID": "uid-gone", "Node": "node-0"})
    assert gone["Error"] == 'cannot read pod default/gone: HTTP 404 Not Found: pods "gone" not found'
    took = time.monotonic() - started
    after = exposed()
    grown = {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}
    # Each call's time is within the time the test took to make them all.
    times = {key[1]: grown.pop(key) for key in list(grown) if key[0] == "oversale_extender_duration_seconds_sum"}
    assert set(times) == {"filter", "prioritize", "preempt", "bind"}
    assert all(0 < seconds < took for seconds in times.values()), (times, took)
    assert grown == {("oversale_extender_calls_total", "filter", "ok"): 1,
                     ("oversale_extender_calls_total", "filter", "malformed"): 1,
                     ("oversale_extender_calls_total", "prioritize", "ok"): 1,
                     ("oversale_extender_calls_total", "preempt", "ok"): 1,
                     ("oversale_extender_calls_total", "bind", "error"): 1,
                     ("oversale_extender_duration_seconds_count", "filter", ""): 2,
                     ("oversale_extender_duration_seconds_count", "prioritize", ""): 1,
                     ("oversale_extender_duration_seconds_count", "preempt", ""): 1,
                     ("oversale_extender_duration_seconds_count", "bind", ""): 1}


# ---- load-aware placement (metrics.k8s.io through the API double) ---------------------------------

def node_metrics(name: str, cores: float, age: float = 0.0, memory: str = "8Gi") -> dict:
    stamp = format_timestamp(time.time() - age)
    return {"metadata": {"name": name}, "timestamp": stamp, "window": "20s",
            "usage": {"cpu": f"{round(cores * 1000)}m", "memory": memory}}


@pytest.fixture
def loaded(tmp_path) -> Iterator[tuple[FakeKubeAPI, Extender]]:
    api = FakeKubeAPI().start()
    for name in ("node-0", "node-1", "hot"):
        api.put("nodes", node(name))
    api.put("nodemetrics", node_metrics("node-0", 4.8))   # 30% of its 16 real cores
    api.put("nodemetrics", node_metrics("node-1", 6.4))   # 40%
    api.put("nodemetrics", node_metrics("hot", 11.36))    # 71%
    extender = Extender(api, tmp_path, {"OVERSALE_LOAD_AWARE": "true", "OVERSALE_METRICS_POLL_INTERVAL": "1"})
    wait_for(lambda: extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["hot"]})["FailedNodes"])
    yield api, extender
    extender.stop()
    api.stop()


def test_a_node_above_its_watermark_is_filtered_with_the_reason_and_the_coolest_preferred(loaded):
    _, extender = loaded
    answer = extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-0", "node-1", "hot"]})
    assert answer["NodeNames"] == ["node-0", "node-1"]
    assert answer["FailedNodes"] == {
        "hot": "cpu usage 71% of real capacity (5-min average) is above the scheduling watermark 65%"}
    scores = {s["Host"]: s["Score"] for s in extender.post("prioritize", {"Pod": pod("p", "1"),
                                                                          "NodeNames": ["node-0", "node-1"]})}
    assert scores["node-0"] > scores["node-1"]


def test_preemption_never_evicts_for_a_node_above_its_watermark(loaded):
    api, extender = loaded
    for host in ("node-0", "hot"):  # both full by requests (24 oversold cores each)
        api.put("pods", pod(f"full-{host}", "24", node_name=host, single_numa=False))
    wait_for(lambda: len(extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-0", "hot"]})
                         ["FailedNodes"]) == 2)
    sent = {"node-0": {"Pods": [{"UID": "uid-full-node-0"}], "NumPDBViolations": 0},
            "hot": {"Pods": [{"UID": "uid-full-hot"}], "NumPDBViolations": 0}}
    answer = extender.post("preempt", {"Pod": pod("p", "1"), "NodeNameToMetaVictims": sent})
    assert answer == {"NodeNameToMetaVictims": {"node-0": sent["node-0"]}}
    assert ("hot: still refused after evicting 1 Pod(s): cpu usage 71% of real capacity (5-min average) is above the "
            "scheduling watermark 65%") in extender.log_path.read_text()


def test_a_per_node_watermark_annotation_moves_the_threshold(loaded):
    api, extender = loaded
    relaxed = node("hot")
    relaxed["metadata"]["annotations"][KEYS.cpu_scheduling_watermark] = "0.75"
    api.put("nodes", relaxed)
    wait_for(lambda: extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["hot"]})["NodeNames"] == ["hot"])


def test_full_nodes_are_filtered_by_load_under_their_own_watermarks(loaded):
    # nodeCacheCapable false: the node objects come with the call, and their annotations count.
    _, extender = loaded
    answer = extender.post("filter", {"Pod": pod("p", "1"), "Nodes": {"metadata": {}, "items": [
        node("node-0"), node("hot")]}})
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["node-0"]
    assert answer["FailedNodes"] == {
        "hot": "cpu usage 71% of real capacity (5-min average) is above the scheduling watermark 65%"}
    relaxed = node("hot")
    relaxed["metadata"]["annotations"][KEYS.cpu_scheduling_watermark] = "0.75"
    answer = extender.post("filter", {"Pod": pod("p", "1"), "Nodes": {"metadata": {}, "items": [relaxed]}})
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["hot"] and answer["FailedNodes"] == {}


def test_stale_metrics_are_ignored_and_counted(loaded):
    api, extender = loaded
    # metrics-server last saw "late" ten minutes ago, at 95%: too old to trust either way.
    api.put("nodes", node("late"))
    api.put("nodemetrics", node_metrics("late", 15.2, age=600))
    wait_for(lambda: 'oversale_extender_nodes_without_fresh_metrics{reason="old"} 1.0' in extender.get("/metrics"))
    assert extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["late"]})["NodeNames"] == ["late"]
    assert re.search(r"node late: node metrics 60\ds old \(limit 180s\); placed by requests",
                     extender.log_path.read_text())


def test_each_cache_relist_is_counted_by_kind_and_cause(tmp_path):
    """A Pod cache listed again and again reads every Pod of the cluster each time: the operator
    sees how often, for which kind and why, before the API server does."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    extender = Extender(api, tmp_path)
    relisted = 'oversale_cache_restarts_total{again="list",cause="expired",kind="Node"} 1.0'
    try:
        assert "oversale_cache_restarts_total{" not in extender.get("/metrics")
        with api.watches_paused():
            api.put("nodes", node("node-1"))
            api.compact("nodes")  # the Node watch's resourceVersion is gone: 410, then a relist
        # Counted when the watch expires, before the relist that brings node-1 in.
        wait_for(lambda: extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-1"]})["NodeNames"]
                 == ["node-1"])
        assert [line for line in extender.get("/metrics").splitlines()
                if line.startswith("oversale_cache_restarts_total{")] == [relisted]
    finally:
        extender.stop()
        api.stop()


def test_a_node_whose_clock_runs_ahead_is_judged_by_its_readings_not_by_its_clock(tmp_path):
    # NodeMetrics are stamped by the node's own clock. This one runs an hour ahead.
    api = FakeKubeAPI().start()
    api.put("nodes", node("skewed"))
    api.put("nodemetrics", node_metrics("skewed", 3.2, age=-3600))  # 20%
    extender = Extender(api, tmp_path, {"OVERSALE_LOAD_AWARE": "true", "OVERSALE_METRICS_POLL_INTERVAL": "1",
                                        "OVERSALE_METRICS_MAX_AGE": "4s"})
    stale = 'oversale_extender_nodes_without_fresh_metrics{reason="old"} 1.0'
    try:
        wait_for(lambda: 'oversale_extender_nodes_without_fresh_metrics{reason="missing"} 0.0'
                 in extender.get("/metrics"))
        # metrics-server keeps serving that one reading: it ages here, whatever its stamp says.
        wait_for(lambda: stale in extender.get("/metrics"))
        # The node's clock is set right, and it is busy now: the new reading counts at once.
        api.put("nodemetrics", node_metrics("skewed", 15.2))  # 95%
        wait_for(lambda: extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["skewed"]})["FailedNodes"]
                 == {"skewed": "cpu usage 95% of real capacity (1-hour maximum) is above the scheduling "
                               "watermark 85%"})
    finally:
        extender.stop()
        api.stop()


def test_a_burst_of_binds_moves_the_next_pod_elsewhere_before_metrics_catch_up(loaded):
    api, extender = loaded
    # node-0 is the coolest (30%); each 4-core Pod counts 3.4 cores until PodMetrics show it.
    for name in ("b1", "b2"):
        api.put("pods", pod(name, "4", single_numa=False))
        wait_for(lambda n=name: api.get("pods", "default", n) is not None)
        assert extender.post("bind", {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
                                      "Node": "node-0"}) == {"Error": ""}
    answer = extender.post("filter", {"Pod": pod("next", "4"), "NodeNames": ["node-0", "node-1"]})
    assert answer["NodeNames"] == ["node-1"]
    assert "with Pods bound but not yet in the metrics" in answer["FailedNodes"]["node-0"]
    # Once PodMetrics list them, the node's own figures count (still 30% here) and it is back.
    for name in ("b1", "b2"):
        api.put("podmetrics", {"metadata": {"name": name, "namespace": "default"}, "window": "20s",
                               "containers": [{"name": "c", "usage": {"cpu": "10m", "memory": "10Mi"}}]})
    wait_for(lambda: extender.post("filter", {"Pod": pod("next", "4"),
                                              "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"])


def polls(extender: Extender, result: str = "ok") -> float:
    """The extender's polls of the metrics API so far with this result."""
    return exposed_value(extender.get("/metrics"), f'oversale_extender_metrics_polls_total{{result="{result}"}}')


def test_a_pod_made_again_under_its_old_name_is_not_taken_for_its_predecessor(loaded):
    # metrics-server pairs readings with Pods by namespace and name: a StatefulSet's db-0, evicted
    # and made again, is served the old db-0's last reading until metrics-server scrapes again.
    api, extender = loaded
    old_stamp = format_timestamp(time.time() - 30)
    api.put("podmetrics", {"metadata": {"name": "db-0", "namespace": "default"}, "timestamp": old_stamp,
                           "window": "20s", "containers": [{"name": "c", "usage": {"cpu": "10m", "memory": "10Mi"}}]})
    done = polls(extender)
    wait_for(lambda: polls(extender) >= done + 2)  # the old reading is known before the bind
    api.put("pods", pod("db-0", "8", single_numa=False))
    wait_for(lambda: api.get("pods", "default", "db-0") is not None)
    assert extender.post("bind", {"PodName": "db-0", "PodNamespace": "default", "PodUID": "uid-db-0",
                                  "Node": "node-0"}) == {"Error": ""}
    # That reading is not the new db-0's: it counts as any Pod just bound, 8 x 0.85 cores, and
    # node-0 (4.8 of 16 real cores) is above its watermark with it.
    done = polls(extender)
    wait_for(lambda: polls(extender) >= done + 2)
    answer = extender.post("filter", {"Pod": pod("next", "1"), "NodeNames": ["node-0", "node-1"]})
    assert answer["NodeNames"] == ["node-1"]
    assert "with Pods bound but not yet in the metrics" in answer["FailedNodes"]["node-0"]
    # metrics-server scrapes the new db-0: its reading counts in the node's own figures (30%).
    new_stamp = format_timestamp(time.time())
    api.put("podmetrics", {"metadata": {"name": "db-0", "namespace": "default"}, "timestamp": new_stamp,
                           "window": "20s", "containers": [{"name": "c", "usage": {"cpu": "10m", "memory": "10Mi"}}]})
    wait_for(lambda: extender.post("filter", {"Pod": pod("next", "1"),
                                              "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"])


def replica(name: str, replica_set: str, cpu: str | None, node_name: str | None = None) -> dict:
    """A Pod of the Deployment ``web``'s ReplicaSet ``web-<replica_set>``, BestEffort where ``cpu`` is None."""
    made = pod(name, cpu or "1", node_name=node_name, single_numa=False)
    made["metadata"]["labels"] = {"app": "web", "pod-template-hash": replica_set}
    made["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"web-{replica_set}",
                                            "uid": f"uid-rs-{replica_set}", "controller": True}]
    if cpu is None:
        del made["spec"]["containers"][0]["resources"]
    return made


@pytest.mark.parametrize(("cpu", "used", "kept_off"), [(None, "3", True), ("4", "100m", False)])
def test_a_burst_of_replicas_counts_what_the_running_ones_use_not_their_requests(loaded, cpu, used, kept_off):
    # A replica of web's old ReplicaSet runs on node-1 and uses `used` cores. Two replicas of its
    # new ReplicaSet (a rollout) are bound to node-0 (30% of 16 cores, watermark 65%): by requests
    # they would count 0 (BestEffort) or 2 x 3.4 cores; they count what the running one uses.
    api, extender = loaded
    api.put("pods", replica("web-5d8f9-x1", "5d8f9", cpu, node_name="node-1"))
    api.put("podmetrics", {"metadata": {"name": "web-5d8f9-x1", "namespace": "default"}, "window": "20s",
                           "containers": [{"name": "c", "usage": {"cpu": used, "memory": "10Mi"}}]})
    for name in ("web-7c9b4-b1", "web-7c9b4-b2"):
        api.put("pods", replica(name, "7c9b4", cpu))
        wait_for(lambda n=name: api.get("pods", "default", n) is not None)
        assert extender.post("bind", {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
                                      "Node": "node-0"}) == {"Error": ""}
    if kept_off:  # 4.8 + 2 x 3 cores: 68% of node-0's real 16
        expected = {"NodeNames": ["node-1"], "FailedNodes": {
            "node-0": "cpu usage 68% of real capacity (5-min average, with Pods bound but not yet in the metrics) "
                      "is above the scheduling watermark 65%"}}
    else:  # 4.8 + 2 x 0.1 cores: 31%, where 2 x 3.4 cores by requests would have kept it off
        expected = {"NodeNames": ["node-0", "node-1"], "FailedNodes": {}}
    # The running replica's usage counts from the next poll of the metrics API on.
    wait_for(lambda: {key: value for key, value in extender.post("filter", {
        "Pod": replica("web-7c9b4-b3", "7c9b4", cpu), "NodeNames": ["node-0", "node-1"]}).items()
        if key in expected} == expected)


def test_a_replica_of_a_workload_that_uses_little_scores_a_node_cooler_than_a_stranger_asking_the_same(loaded):
    # web's running replica (on node-1) uses 100m of its 8 cores. A new replica is expected to
    # use as much on node-0 (30% of 16 real cores stays 31%); a Pod of no known workload asking
    # for 8 cores counts 8 x 0.85 of them (73%), so node-0 stays cooler for the replica.
    api, extender = loaded
    api.put("pods", replica("web-5d8f9-x1", "5d8f9", "8", node_name="node-1"))
    api.put("podmetrics", {"metadata": {"name": "web-5d8f9-x1", "namespace": "default"}, "window": "20s",
                           "containers": [{"name": "c", "usage": {"cpu": "100m", "memory": "10Mi"}}]})

    def score(asking: dict) -> int:
        [answer] = extender.post("prioritize", {"Pod": asking, "NodeNames": ["node-0"]})
        return answer["Score"]

    stranger = pod("stranger", "8", single_numa=False)
    wait_for(lambda: score(replica("web-5d8f9-x2", "5d8f9", "8")) > score(stranger))
    assert score(stranger) == score(pod("another", "8", single_numa=False))


@pytest.mark.parametrize(("broken", "said"), [
    ("unavailable", "HTTP 503"),  # metrics-server down: the aggregator's 503
    # A proxy in front of the API server answering its login page.
    ("garbled", "the answer to /apis/metrics.k8s.io/v1beta1/nodes is no Kubernetes object (text/html"),
])
def test_an_unreachable_metrics_api_leaves_placement_to_requests(tmp_path, broken, said):
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    api.put("nodemetrics", node_metrics("node-0", 15))
    getattr(api, broken).update({"nodemetrics", "podmetrics"})
    extender = Extender(api, tmp_path, {"OVERSALE_LOAD_AWARE": "true", "OVERSALE_METRICS_POLL_INTERVAL": "1"})
    try:
        # The first poll may come before the node is in the cache: wait for one that counts it.
        wait_for(lambda: 'oversale_extender_nodes_without_fresh_metrics{reason="missing"} 1.0'
                 in extender.get("/metrics"))
        assert 'oversale_extender_metrics_polls_total{result="error"}' in extender.get("/metrics")
        answer = extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-0"]})
        assert answer["NodeNames"] == ["node-0"] and answer["Error"] == ""
        assert all(0 <= s["Score"] <= 10 for s in extender.post("prioritize", {"Pod": pod("p", "1"),
                                                                                 "NodeNames": ["node-0"]}))
        assert f"metrics API not readable ({said}" in extender.log_path.read_text()
    finally:
        extender.stop()
        api.stop()


def test_node_figures_still_count_while_only_podmetrics_cannot_be_read(tmp_path):
    """On a large cluster the PodMetrics list is the read that times out, while NodeMetrics
    answer. The node figures read keep load-aware placement going (before, the whole poll was
    dropped, and every node was placed by requests alone); a Pod bound meanwhile counts its
    estimate on top, as the figures cannot say whether they hold it yet."""
    api = FakeKubeAPI().start()
    for name in ("node-0", "hot"):
        api.put("nodes", node(name))
    api.put("nodemetrics", node_metrics("node-0", 4.8))   # 30% of its 16 real cores
    api.put("nodemetrics", node_metrics("hot", 11.36))    # 71%
    api.unavailable = {"podmetrics"}
    extender = Extender(api, tmp_path, {"OVERSALE_LOAD_AWARE": "true", "OVERSALE_METRICS_POLL_INTERVAL": "1"})
    try:
        wait_for(lambda: 'oversale_extender_metrics_polls_total{result="partial"}' in extender.get("/metrics"))
        hot = "cpu usage 71% of real capacity (5-min average) is above the scheduling watermark 65%"
        wait_for(lambda: extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-0", "hot"]})
                 ["FailedNodes"] == {"hot": hot})
        assert 'oversale_extender_nodes_without_fresh_metrics{reason="missing"} 0.0' in extender.get("/metrics")
        assert "PodMetrics not readable (HTTP 503" in extender.log_path.read_text()
        api.put("pods", pod("b1", "8", single_numa=False))
        wait_for(lambda: api.get("pods", "default", "b1") is not None)
        assert extender.post("bind", {"PodName": "b1", "PodNamespace": "default", "PodUID": "uid-b1",
                                      "Node": "node-0"}) == {"Error": ""}
        # 4.8 + 8 x 0.85 cores: 72% of node-0's real 16.
        answer = extender.post("filter", {"Pod": pod("next", "1"), "NodeNames": ["node-0", "hot"]})
        assert answer["FailedNodes"] == {
            "node-0": "cpu usage 72% of real capacity (5-min average, with Pods bound but not yet in the metrics) "
                      "is above the scheduling watermark 65%", "hot": hot}
        wait_for(lambda: polls(extender, "partial") >= 3)
        # PodMetrics answer again and hold b1: node-0's own figures count alone.
        api.put("podmetrics", {"metadata": {"name": "b1", "namespace": "default"}, "window": "20s",
                               "containers": [{"name": "c", "usage": {"cpu": "10m", "memory": "10Mi"}}]})
        api.unavailable = set()
        wait_for(lambda: extender.post("filter", {"Pod": pod("next", "1"),
                                                  "NodeNames": ["node-0", "hot"]})["FailedNodes"] == {"hot": hot})
        assert polls(extender) >= 1
        # Said when it started and when it ended, not at each of the polls between.
        log = extender.log_path.read_text()
        assert log.count("PodMetrics not readable") == 1 and log.count("metrics API readable again") == 1, log
    finally:
        extender.stop()
        api.stop()


@pytest.fixture(scope="module", params=STORES)
def node_history(request, tmp_path_factory) -> Iterator[PrometheusServer | VictoriaMetricsServer]:
    """A real store (Prometheus, then VictoriaMetrics) holding node-exporter's cpu counters of the
    last 8 hours for two nodes of 16 real cores: "burst" ran 15.2 cores (95%) for half an hour
    three hours ago and 4.8 cores otherwise; "calm" ran 4.8 cores throughout. The same cores are
    also recorded as a rule would."""
    directory = tmp_path_factory.mktemp("node-history")
    end = time.time() - 60
    burst = (end - 3 * 3600, end - 2.5 * 3600)
    family = Family("node_cpu_seconds_total", "counter")
    # The same cores as kube-prometheus's recording rule keeps them, one series per node.
    recorded = Family("instance:node_cpu:rate:sum", "gauge")
    for name, busy in (("burst", lambda t: 15.2 if burst[0] <= t < burst[1] else 4.8), ("calm", lambda t: 4.8)):
        family.series.append(({"instance": f"{name}:9100", "cpu": "0", "mode": "user"}, busy))
        family.series.append(({"instance": f"{name}:9100", "cpu": "0", "mode": "idle"}, lambda t, b=busy: 16 - b(t)))
        recorded.series.append(({"instance": f"{name}:9100"}, busy))
    path = directory / "nodes.om"
    write_openmetrics(path, [family, recorded], end - 8 * 3600, end, 60)
    server = serving(request.param, directory, path)
    yield server
    server.stop()


def history_extender(api: FakeKubeAPI, tmp_path: Path, url: str, window: str, **settings: str) -> Extender:
    for name in ("burst", "calm"):
        api.put("nodes", node(name))
        api.put("nodemetrics", node_metrics(name, 4.8))  # 30% now
    return Extender(api, tmp_path, {"OVERSALE_LOAD_AWARE": "true", "OVERSALE_METRICS_POLL_INTERVAL": "1",
                                    "OVERSALE_LOAD_HISTORY": "prometheus", "OVERSALE_PROMETHEUS_URL": url,
                                    "OVERSALE_PROMETHEUS_STEP": "60s", "OVERSALE_LOAD_HISTORY_INTERVAL": "1",
                                    "OVERSALE_LOAD_HISTORY_WINDOW": window, **settings})


def test_a_burst_hours_ago_in_prometheus_keeps_new_pods_off_the_node(node_history, tmp_path):
    api = FakeKubeAPI().start()
    extender = history_extender(api, tmp_path, node_history.url, "6h")
    try:
        # The extender has run for seconds: its own samples say 30% on both. Prometheus remembers.
        wait_for(lambda: extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["burst"]})["FailedNodes"])
        answer = extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["burst", "calm"]})
        assert answer["NodeNames"] == ["calm"]
        assert answer["FailedNodes"] == {"burst": "cpu usage 95% of real capacity (6-hour maximum, from Prometheus) "
                                                  "is above the scheduling watermark 85%"}
        assert 'oversale_extender_history_polls_total{result="ok"}' in extender.get("/metrics")
        assert f"load and workload history also from Prometheus at {node_history.url}" in \
            extender.log_path.read_text()
        # The workloads' history is read from there too (this Prometheus holds none: read, empty).
        wait_for(lambda: 'oversale_extender_workload_history_polls_total{result="ok"}' in extender.get("/metrics"))
    finally:
        extender.stop()
    # A window of an hour does not reach back to the burst.
    extender = history_extender(api, tmp_path, node_history.url, "1h")
    try:
        wait_for(lambda: 'oversale_extender_history_polls_total{result="ok"}' in extender.get("/metrics"))
        wait_for(lambda: 'oversale_extender_nodes_without_fresh_metrics{reason="missing"} 0.0'
                 in extender.get("/metrics"))
        answer = extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["burst", "calm"]})
        assert answer["NodeNames"] == ["burst", "calm"] and answer["FailedNodes"] == {}
    finally:
        extender.stop()
    # OVERSALE_PROMETHEUS_NODE_CPU_QUERY is the query read: one naming no series leaves the burst unseen.
    extender = history_extender(api, tmp_path, node_history.url, "6h",
                                OVERSALE_PROMETHEUS_NODE_CPU_QUERY="no_such:rule")
    try:
        wait_for(lambda: 'oversale_extender_history_polls_total{result="ok"}' in extender.get("/metrics"))
        answer = extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["burst", "calm"]})
        assert answer["NodeNames"] == ["burst", "calm"] and answer["FailedNodes"] == {}
    finally:
        extender.stop()
        api.stop()


def test_a_maximum_read_from_prometheus_counts_until_it_is_too_old():
    now = [1000.0]
    config = LoadConfig(history_peak_seconds=6 * 3600, history_max_age_seconds=900)
    state = ClusterState(KEYS, load_config=config, wall=lambda: now[0])
    state.set_node("n", node("n"))
    state.record_node_samples({"n": Sample(now[0], 4800, 8 << 30)})
    state.record_history_peaks({"n": 15200.0}, now[0])
    load = state.heats(["n"])[0].load
    assert (load.cpu_peak, load.peak_window) == (15200.0, "6-hour maximum, from Prometheus")
    now[0] += 900
    state.record_node_samples({"n": Sample(now[0], 4900, 8 << 30)})
    assert state.heats(["n"])[0].load.cpu_peak == 15200.0, "as old as the limit: it still counts"
    now[0] += 1  # no read since: Prometheus has been unreachable for three intervals
    state.record_node_samples({"n": Sample(now[0], 5000, 8 << 30)})
    load = state.heats(["n"])[0].load
    assert (load.cpu_peak, load.peak_window) == (5000.0, "1-hour maximum")



def test_a_node_reading_polled_again_before_metrics_server_scraped_again_counts_once():
    """The extender polls NodeMetrics every 30 s and metrics-server scrapes every 60 s by default,
    so every other poll returns the reading it already has (and one from a lagging replica of
    metrics-server may be older): counted again, it would weigh double in the 5-minute average."""
    now = [1000.0]
    state = ClusterState(KEYS, wall=lambda: now[0])
    state.set_node("n", node("n"))
    for polled_at, reading in ((1000.0, Sample(1000.0, 1000, 8 << 30)), (1030.0, Sample(1000.0, 1000, 8 << 30)),
                               (1060.0, Sample(1060.0, 4000, 8 << 30)), (1090.0, Sample(1030.0, 9000, 8 << 30))):
        now[0] = polled_at
        state.record_node_samples({"n": reading})
    load = state.heats(["n"])[0].load
    assert (load.cpu_average, load.cpu_peak, load.at) == (2500.0, 4000.0, 1060.0), "the two readings, once each"

def test_a_workloads_estimate_is_its_pods_five_minute_average_cpu_and_latest_memory():
    now = [1000.0]
    state = ClusterState(KEYS, wall=lambda: now[0])
    for name in ("web-5d8f9-x1", "web-5d8f9-x2"):
        state.set_pod(f"uid-{name}", pod_facts(replica(name, "5d8f9", "4", node_name="node-1"), KEYS))
    new_replica = pod_demand(replica("web-7c9b4-y1", "7c9b4", "4"), KEYS)
    mi = 2**20
    for cpus, memory in (((100, 300), 100), ((500, 700), 300), ((900, 1100), 200)):  # a poll a minute
        state.record_pods_in_metrics({("default", f"web-5d8f9-x{n}"): (cpu, memory * mi)
                                      for n, cpu in enumerate(cpus, 1)})
        now[0] += 60
    # Per Pod 200m, 600m, 1000m: their average, and the memory of the last poll.
    assert state.estimate_for(new_replica) == {"cpu": 600.0, "memory": 200.0 * mi}
    now[0] += 230  # 5 minutes after the second poll: only the third and this one count
    state.record_pods_in_metrics({("default", "web-5d8f9-x1"): (1300, 100 * mi)})
    assert state.estimate_for(new_replica) == {"cpu": 1150.0, "memory": 100.0 * mi}
    state.record_pods_in_metrics({})  # none of its Pods in the metrics: known by its requests again
    assert state.estimate_for(new_replica) == {"cpu": 3400.0, "memory": 0.7 * 2**30}


def test_a_workload_with_no_pod_in_the_metrics_is_known_by_its_history_until_that_is_too_old():
    now = [1000.0]
    state = ClusterState(KEYS, load_config=LoadConfig(history_max_age_seconds=900), wall=lambda: now[0])
    new_replica = pod_demand(replica("web-7c9b4-y1", "7c9b4", "4"), KEYS)
    by_requests = {"cpu": 3400.0, "memory": 0.7 * 2**30}
    assert state.estimate_for(new_replica) == by_requests
    # web was scaled to zero: none of its Pods is in PodMetrics, Prometheus remembers them.
    state.record_workload_history({"default/Deployment/web": WorkloadUsage(250.0, 2.0**28, 2)}, now[0])
    assert state.estimate_for(new_replica) == {"cpu": 250.0, "memory": 2.0**28}
    # A replica running now says what the workload uses now: it counts instead.
    state.set_pod("uid-web-5d8f9-x1", pod_facts(replica("web-5d8f9-x1", "5d8f9", "4", node_name="node-1"), KEYS))
    state.record_pods_in_metrics({("default", "web-5d8f9-x1"): (900.0, 2.0**29)})
    assert state.estimate_for(new_replica) == {"cpu": 900.0, "memory": 2.0**29}
    state.record_pods_in_metrics({})
    assert state.estimate_for(new_replica) == {"cpu": 250.0, "memory": 2.0**28}
    now[0] += 900
    assert state.estimate_for(new_replica) == {"cpu": 250.0, "memory": 2.0**28}, "as old as the limit: it counts"
    now[0] += 1  # no read since: Prometheus has been unreachable for three intervals
    assert state.estimate_for(new_replica) == by_requests


def test_a_node_deleted_and_registered_again_within_the_hour_keeps_its_windows():
    """A Node deleted and made again under its name (a kubelet registering anew) within the hour
    finds its samples still there: a deleted node's go only once its newest has left the window."""
    now = [1000.0]
    state = ClusterState(KEYS, wall=lambda: now[0])
    state.set_node("n", node("n"))
    state.record_node_samples({"n": Sample(now[0], 9000, 8 << 30)})
    now[0] += 3000
    state.record_node_samples({"n": Sample(now[0], 1000, 8 << 30)})
    state.set_node("n", None)
    now[0] += 601  # its first sample is more than an hour old, its last is not
    state.record_node_samples({"other": Sample(now[0], 1000, 8 << 30)})
    state.set_node("n", node("n"))
    load = state.heats(["n"])[0].load
    assert load is not None and load.cpu_peak == 9000, "its 1-hour maximum as of its last sample"


def test_a_history_read_counts_at_once_for_the_pods_still_settling():
    """A replica bound a moment ago counts on its node by its workload's estimate: once Prometheus
    says what the workload's Pods used, that figure counts for it from then on, not its request."""
    now = [1000.0]
    state = ClusterState(KEYS, clock=lambda: now[0], wall=lambda: now[0])
    state.set_node("n", node("n"))
    state.reserve(PodRecord("uid-web-7c9b4-y1", "n", pod_demand(replica("web-7c9b4-y1", "7c9b4", "4"), KEYS), (),
                            "default", "web-7c9b4-y1", now[0]))
    assert state.heats(["n"])[0].pending == {"cpu": 3400.0, "memory": 0.7 * 2**30}, "by its request"
    now[0] += 10
    state.record_workload_history({"default/Deployment/web": WorkloadUsage(250.0, 2.0**28, 2)}, now[0])
    assert state.heats(["n"])[0].pending == {"cpu": 250.0, "memory": 2.0**28}


def test_a_long_running_extender_holds_only_the_windows_it_reads():
    """Polled every 30 s for two hours, a node keeps the last hour of its samples (its 1-hour
    maximum) and a workload the last 5 minutes of its polls (its average): what the extender holds
    stays the same however long it runs."""
    now = [1000.0]
    config = LoadConfig()
    state = ClusterState(KEYS, load_config=config, wall=lambda: now[0])
    state.set_node("n", node("n"))
    state.set_pod("uid-web-5d8f9-x1", pod_facts(replica("web-5d8f9-x1", "5d8f9", "4", node_name="n"), KEYS))
    for poll in range(240):
        state.record_node_samples({"n": Sample(now[0], 1000 + poll, 8 << 30)})
        state.record_pods_in_metrics({("default", "web-5d8f9-x1"): (500.0 + poll, 2.0**28)})
        now[0] += 30
    node_times, node_cpus = state._samples["n"]
    assert len(node_times) == len(node_cpus) == config.peak_seconds / 30 + 1
    assert node_times[-1] - node_times[0] == config.peak_seconds
    workload_times, _ = state._workload_cpu["default/Deployment/web"]
    assert len(workload_times) == config.average_seconds / 30 + 1
    load = state.heats(["n"])[0].load
    assert load is not None and load.cpu_peak == 1239.0
    assert load.cpu_average == sum(range(1230, 1240)) / 10, "the polls of the last 5 minutes"


@pytest.fixture(scope="module", params=STORES)
def workload_history(request, tmp_path_factory) -> Iterator[PrometheusServer | VictoriaMetricsServer]:
    """A real store (Prometheus, then VictoriaMetrics) holding what cAdvisor and kube-state-metrics
    published over the last 8 hours: the two Pods of the Deployment web's ReplicaSet web-5d8f9
    used 3 cores and 1 GiB each until two hours ago, when web was scaled to zero (one of them
    scraped by two jobs); the Pod of the CronJob nightly's Job of six hours ago used 3 cores and
    1 GiB for an hour, its container restarted halfway (a new cgroup)."""
    directory = tmp_path_factory.mktemp("workload-history")
    end = time.time() - 60
    web, nightly = (end - 8 * 3600, end - 2 * 3600), (end - 6 * 3600, end - 5 * 3600)
    restart = end - 5.5 * 3600
    cpu = Family("container_cpu_usage_seconds_total", "counter")
    memory = Family("container_memory_working_set_bytes", "gauge")
    owners = Family("kube_pod_owner", "gauge")
    for name, kind, owner, cgroups, jobs in (
            ("web-5d8f9-aaaaa", "ReplicaSet", "web-5d8f9", [("c", web)], ("kubelet", "cadvisor")),
            ("web-5d8f9-bbbbb", "ReplicaSet", "web-5d8f9", [("c", web)], ("kubelet",)),
            ("nightly-29000000-ccccc", "Job", "nightly-29000000",
             [("c-1", (nightly[0], restart)), ("c-2", (restart + 60, nightly[1]))], ("kubelet",))):
        kept = {"namespace": "default", "pod": name}
        for cgroup, span in cgroups:
            for job in jobs:
                container = {**kept, "container": "c", "id": f"/kubepods/{name}/{cgroup}", "image": "x", "job": job}
                cpu.series.append((container, lambda t: 3.0, *span))
                memory.series.append((container, lambda t: 2.0**30, *span))
            # The Pod's own cgroup (container="") holds the same usage again: not counted twice.
            cpu.series.append(({**kept, "container": "", "id": f"/kubepods/{name}"}, lambda t: 3.0, *span))
        span = (cgroups[0][1][0], cgroups[-1][1][1])
        owners.series.append(({**kept, "owner_kind": kind, "owner_name": owner, "owner_is_controller": "true",
                               "uid": f"uid-{name}"}, lambda t: 1, *span))
    replica_sets = Family("kube_replicaset_owner", "gauge")
    replica_sets.series.append(({"namespace": "default", "replicaset": "web-5d8f9", "owner_kind": "Deployment",
                                 "owner_name": "web", "owner_is_controller": "true"}, lambda t: 1, *web))
    jobs = Family("kube_job_owner", "gauge")
    jobs.series.append(({"namespace": "default", "job_name": "nightly-29000000", "owner_kind": "CronJob",
                         "owner_name": "nightly", "owner_is_controller": "true"}, lambda t: 1))
    path = directory / "workloads.om"
    write_openmetrics(path, [cpu, memory, owners, replica_sets, jobs], end - 8 * 3600, end, 60)
    server = serving(request.param, directory, path)
    yield server
    server.stop()


def test_a_workloads_history_is_what_its_pods_used_each_while_they_ran(workload_history, caplog):
    state = ClusterState(KEYS)
    results: list[str] = []
    poller = WorkloadHistoryPoller(PrometheusAPI(workload_history.url), state, 1, 86400, 300, 60, results.append)
    with caplog.at_level("WARNING"):
        assert poller.poll_once() and results == ["ok"]
    assert not caplog.messages, "kube_pod_owner series held, and 5 scrapes in the rate window: nothing to warn of"
    # 3 cores and 1 GiB, not counted twice for a second scrape job nor halved by a restart. A
    # little less cpu: rate() over the first and last minutes of a cgroup's life extrapolates
    # from fewer samples than its window holds (more of them in the half-hour cgroups).
    for made in (replica("web-7c9b4-y1", "7c9b4", "4"), job_pod("nightly-29000060-ddddd", "nightly-29000060")):
        estimate = state.estimate_for(pod_demand(made, KEYS))
        assert 2700 <= estimate["cpu"] <= 3000 and estimate["memory"] == 2.0**30, (made["metadata"]["name"], estimate)
    # A Pod of no workload the history knows is estimated from its requests.
    assert state.estimate_for(pod_demand(job_pod("other-29000060-eeeee", "other-29000060", "4"), KEYS))["cpu"] == 3400


def test_a_node_annotation_the_extender_ignores_is_said_once(caplog):
    """A node's unreadable CPU topology or scheduling watermark is ignored (its cores and NUMA
    nodes unknown, the default watermark kept) and said in the log: once, not at every status
    update the kubelet sends nor every call that sends the node whole; a new bad value is said
    too, a mended one is not, and one broken again after it was mended is said again."""
    state = ClusterState(KEYS)
    broken = node("node-0")
    annotations = broken["metadata"]["annotations"]
    annotations.update({KEYS.cpu_topology: "0-15", KEYS.cpu_scheduling_watermark: "65%"})
    topology_ignored = (f"Node/node-0: annotation {KEYS.cpu_topology}='0-15' ignored: not a CPU topology (Extra "
                        "data: line 1 column 2 (char 1)); the next source of the topology counts")
    with caplog.at_level("WARNING", logger="scheduler.state"):
        for _ in range(3):  # the kubelet's status updates
            state.set_node("node-0", copy.deepcopy(broken))
        assert not state.view_of(copy.deepcopy(broken)).topology.detailed
        assert caplog.messages == [
            topology_ignored,
            f"Node/node-0: annotation {KEYS.cpu_scheduling_watermark}='65%' ignored: not a number above 0 and at "
            "most 1; default kept"]
        caplog.clear()
        annotations[KEYS.cpu_scheduling_watermark] = "0.65"  # mended
        state.set_node("node-0", copy.deepcopy(broken))
        annotations[KEYS.cpu_scheduling_watermark] = "1.5"  # a new bad value
        state.set_node("node-0", copy.deepcopy(broken))
        annotations[KEYS.cpu_topology] = topology_json()  # mended
        state.set_node("node-0", copy.deepcopy(broken))
        assert state.nodes["node-0"].topology.detailed
        annotations[KEYS.cpu_topology] = "0-15"  # broken again
        state.set_node("node-0", copy.deepcopy(broken))
        # A relist of the Nodes (after a 410 Gone) brings the same annotations back: nothing new.
        state.reset_nodes()
        assert state.nodes == {}
        state.set_node("node-0", copy.deepcopy(broken))
    assert caplog.messages == [
        f"Node/node-0: annotation {KEYS.cpu_scheduling_watermark}='1.5' ignored: not a number above 0 and at most "
        "1; default kept",
        topology_ignored]
    # A node deleted and made again under its name is a new node: said again.
    caplog.clear()
    with caplog.at_level("WARNING", logger="scheduler.state"):
        state.set_node("node-0", None)
        state.set_node("node-0", copy.deepcopy(broken))
        # So is one deleted while the watch was away: a relist that does not list it, then another.
        state.reset_nodes()
        state.reset_nodes()
        state.set_node("node-0", copy.deepcopy(broken))
    said = [topology_ignored,
            f"Node/node-0: annotation {KEYS.cpu_scheduling_watermark}='1.5' ignored: not a number above 0 and at "
            "most 1; default kept"]
    assert caplog.messages == said * 2


def cadvisor_only_store(directory: Path) -> PrometheusServer:
    """A Prometheus holding an hour of cAdvisor's series for one Pod (3 cores, 1 GiB, scraped
    every minute until a minute ago) and no kube-state-metrics series."""
    end = time.time() - 60
    cpu = Family("container_cpu_usage_seconds_total", "counter")
    memory = Family("container_memory_working_set_bytes", "gauge")
    container = {"namespace": "default", "pod": "web-5d8f9-aaaaa", "container": "c",
                 "id": "/kubepods/web-5d8f9-aaaaa/c", "image": "x", "job": "kubelet"}
    cpu.series.append((container, lambda t: 3.0, end - 3600, end))
    memory.series.append((container, lambda t: 2.0**30, end - 3600, end))
    write_openmetrics(directory / "cadvisor.om", [cpu, memory], end - 3600, end, 60)
    return serving("prometheus", directory, directory / "cadvisor.om")


def test_a_store_without_kube_state_metrics_says_so_once_and_knows_no_workload(tmp_path, caplog):
    """cAdvisor's series without kube-state-metrics' kube_pod_owner (not installed, or not scraped
    by this Prometheus): no usage can be tied to a workload, so every Pod of a workload with none
    in the metrics is estimated by its requests, and the log says why, once."""
    server = cadvisor_only_store(tmp_path)
    try:
        state = ClusterState(KEYS)
        results: list[str] = []
        poller = WorkloadHistoryPoller(PrometheusAPI(server.url), state, 1, 86400, 300, 60, results.append)
        with caplog.at_level("WARNING", logger="scheduler.kube"):
            assert poller.poll_once() and poller.poll_once() and poller.poll_once() and results == ["ok"] * 3
        told = [m for m in caplog.messages if "no kube_pod_owner series" in m]
        assert told == ["Prometheus holds container usage but no kube_pod_owner series (kube-state-metrics): no "
                        "workload is known by its history"]
        new_replica = replica("web-7c9b4-y1", "7c9b4", "4")
        assert state.estimate_for(pod_demand(new_replica, KEYS))["cpu"] == 3400, "by its requests (4 x 0.85)"
    finally:
        server.stop()


def test_the_workload_history_poller_tells_a_rate_window_of_fewer_than_4_cadvisor_scrapes_once(tmp_path, caplog):
    """The workload history rates cAdvisor's cpu counters over OVERSALE_PROMETHEUS_RATE_WINDOW: its
    poller checks that window against how often they are scraped (here every minute), as the node
    history's does for node-exporter's, and warns once where it holds fewer than 4 samples."""
    server = cadvisor_only_store(tmp_path)
    try:
        poller = WorkloadHistoryPoller(PrometheusAPI(server.url), ClusterState(KEYS), 1, 86400, 120, 60)
        with caplog.at_level("WARNING", logger="kube.prometheus"):
            assert poller.poll_once() and poller.poll_once()
        assert [r.getMessage() for r in caplog.records if r.name == "kube.prometheus"] == [
            "cAdvisor's cpu counters are scraped every 60s, and OVERSALE_PROMETHEUS_RATE_WINDOW (120s) holds 2 of "
            "their samples: one missed scrape leaves a gap in the history; set it to 4 scrape intervals at least (4m)"]
    finally:
        server.stop()


def job_pod(name: str, job: str, cpu: str | None = None) -> dict:
    """A Pod of the Job ``job``, BestEffort where ``cpu`` is None."""
    made = replica(name, "", cpu)
    made["metadata"]["labels"] = {"batch.kubernetes.io/job-name": job}
    made["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "controller": True,
                                            "name": job, "uid": f"uid-{job}"}]
    return made


def test_pods_of_workloads_scaled_from_zero_count_what_prometheus_remembers_them_using(workload_history, tmp_path):
    # node-0 runs 30% of its 16 real cores. A BestEffort replica of web, back from zero, and the
    # Pod of nightly's new Job are bound to it: by their requests they count nothing; by what
    # their workloads' Pods used each (3 cores), 68%; by one of them alone, 49%.
    api = FakeKubeAPI().start()
    for name in ("node-0", "node-1"):
        api.put("nodes", node(name))
    api.put("nodemetrics", node_metrics("node-0", 4.8))
    api.put("nodemetrics", node_metrics("node-1", 6.4))
    extender = Extender(api, tmp_path, {"OVERSALE_LOAD_AWARE": "true", "OVERSALE_METRICS_POLL_INTERVAL": "1",
                                        "OVERSALE_LOAD_HISTORY": "prometheus", "OVERSALE_PROMETHEUS_URL":
                                        workload_history.url, "OVERSALE_PROMETHEUS_STEP": "60s",
                                        "OVERSALE_LOAD_HISTORY_INTERVAL": "1"})
    try:
        wait_for(lambda: 'oversale_extender_workload_history_polls_total{result="ok"}' in extender.get("/metrics"))
        for made in (replica("web-7c9b4-b1", "7c9b4", None), job_pod("nightly-29000060-ddddd", "nightly-29000060")):
            name = made["metadata"]["name"]
            api.put("pods", made)
            wait_for(lambda n=name: api.get("pods", "default", n) is not None)
            assert extender.post("bind", {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
                                          "Node": "node-0"}) == {"Error": ""}
        answer = extender.post("filter", {"Pod": replica("web-7c9b4-b2", "7c9b4", None),
                                          "NodeNames": ["node-0", "node-1"]})
        assert answer["NodeNames"] == ["node-1"]
        # 3 cores each less a little (see the test above): 66-68%.
        assert re.fullmatch(r"cpu usage 6[6-8]% of real capacity \(5-min average, with Pods bound but not yet in the "
                            r"metrics\) is above the scheduling watermark 65%", answer["FailedNodes"]["node-0"])
    finally:
        extender.stop()
        api.stop()


def test_nodes_deleted_from_the_cluster_leave_no_usage_behind():
    """Autoscaled and spot clusters replace nodes all day: a deleted node's window and loads go
    once its last sample has left the window, while a node still in the cluster keeps its own."""
    now = [1000.0]
    config = LoadConfig(history_max_age_seconds=900)
    state = ClusterState(KEYS, load_config=config, wall=lambda: now[0])
    for number in range(50):
        state.set_node(f"spot-{number}", node(f"spot-{number}"))
    state.set_node("kept", node("kept"))
    state.record_node_samples({**{f"spot-{n}": Sample(now[0], 4000, 8 << 30) for n in range(50)},
                               "kept": Sample(now[0], 4000, 8 << 30)})
    state.record_history_peaks({f"spot-{n}": 9000.0 for n in range(50)} | {"kept": 9000.0}, now[0])
    for number in range(50):
        state.set_node(f"spot-{number}", None)
    now[0] += config.peak_seconds + 1
    state.record_node_samples({"other": Sample(now[0], 1000, 8 << 30)})
    state.record_history_peaks({"kept": 9000.0}, now[0])
    assert set(state._samples) == {"kept", "other"} and set(state._loads) <= {"kept", "other"}
    assert set(state._history_peaks) == {"kept"}, "a deleted node's maximum goes once too old to count"
    assert state.heats(["kept"])[0].load is not None, "a node still in the cluster keeps its last load"


def test_node_exporter_series_naming_no_node_of_the_cluster_are_told_once(node_history, caplog):
    """node-exporter scraped through its Pods, no relabelling: ``instance`` holds the Pod's IP and
    port, so the peaks read name no node, and the extender says so once, naming the setting; and
    once more when they name the cluster's nodes again."""
    state = ClusterState(KEYS)
    state.set_node("ip-10-0-3-7", node("ip-10-0-3-7"))
    poller = HistoryPeakPoller(PrometheusAPI(node_history.url), state, 1, "instance", 300, 60)
    with caplog.at_level("INFO", logger="kube.prometheus"):
        assert poller.poll_once() and poller.poll_once()
        told = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(told) == 1, "once, not at every read"
        assert ("node-exporter's series name 2 nodes by their 'instance' label (burst, calm), none of them one of "
                "the cluster's 1 nodes (ip-10-0-3-7): no node's usage is read; set OVERSALE_PROMETHEUS_NODE_LABEL"
                in told[0].getMessage())
        state.set_node("burst", node("burst"))
        assert poller.poll_once()
        assert "node-exporter's series name the cluster's nodes again" in caplog.text
        assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def test_a_rate_window_of_fewer_than_4_scrapes_is_told_once_by_the_extender(node_history, caplog):
    """The extender's history pollers read rates of the cpu counters with
    OVERSALE_PROMETHEUS_RATE_WINDOW, as the reconcilers do: after its first read each checks it
    against how often its counters are scraped (node-exporter here, every minute) and warns once
    where it holds fewer than 4 of their samples."""
    state = ClusterState(KEYS)
    state.set_node("burst", node("burst"))
    poller = HistoryPeakPoller(PrometheusAPI(node_history.url), state, 1, "instance", 120, 60)
    with caplog.at_level("WARNING", logger="kube.prometheus"):
        assert poller.poll_once() and poller.poll_once()
    told = ["node-exporter's cpu counters are scraped every 60s, and OVERSALE_PROMETHEUS_RATE_WINDOW (120s) holds 2 "
            "of their samples: one missed scrape leaves a gap in the history; set it to 4 scrape intervals at least "
            "(4m)"]
    assert [r.getMessage() for r in caplog.records] == told

    # An extender running for days checks again once rate_window_recheck (a day) has passed, so a
    # scrape interval raised under it is told without a restart. Here after 3 seconds.
    caplog.clear()
    again = HistoryPeakPoller(PrometheusAPI(node_history.url), state, 1, "instance", 120, 60,
                              rate_window_recheck=3.0)
    with caplog.at_level("WARNING", logger="kube.prometheus"):
        assert again.poll_once()
        checked = time.time()  # the poller checks after its read, so at most this late
        assert again.poll_once()
        assert [r.getMessage() for r in caplog.records] == told, "once, not at every read"
        time.sleep(max(0.0, checked + 3.1 - time.time()))
        assert again.poll_once()
    assert [r.getMessage() for r in caplog.records] == told * 2


def test_the_extender_reads_a_node_cpu_recording_rule_where_one_is_configured(node_history, caplog):
    """OVERSALE_PROMETHEUS_NODE_CPU_QUERY: the peak watermark's history is the configured query's
    (kube-prometheus's ``instance:node_cpu:rate:sum``, in cores), the same peaks as node-exporter's
    counters give; and no rate-window warning, as the extender rates no counter for it."""
    def peaks(cpu_query: str | None) -> dict[str, float]:
        state = ClusterState(KEYS, load_config=LoadConfig(history_peak_seconds=6 * 3600))
        for name in ("burst", "calm"):
            state.set_node(name, node(name))
        poller = HistoryPeakPoller(PrometheusAPI(node_history.url), state, 1, "instance", 120, 60,
                                   cpu_query=cpu_query)
        assert poller.poll_once() and poller.poll_once()
        return {name: peak for name, (peak, _) in state._history_peaks.items()}

    with caplog.at_level("WARNING", logger="kube.prometheus"):
        ruled = peaks("instance:node_cpu:rate:sum")
        assert not caplog.records, "nothing is rated, so no rate window is checked"
        assert peaks("no_such:rule") == {}, "the configured query is the one read"
    assert ruled == pytest.approx({"burst": 15200, "calm": 4800})
    assert ruled == pytest.approx(peaks(None), rel=0.02)


def test_an_extender_peak_read_timing_out_on_node_exporters_counters_says_what_to_set(sixteen_cpu_node, caplog):
    """The peak watermark's read rates every cpu's counters too (128 on a node of 16 cpus): when
    Prometheus times it out, the warning names OVERSALE_PROMETHEUS_NODE_CPU_QUERY and
    OVERSALE_PROMETHEUS_TIMEOUT, as the reconcilers' does; in time, the same read gives the peak."""
    def poll(timeout: float) -> tuple[bool, ClusterState]:
        state = ClusterState(KEYS, load_config=LoadConfig(history_peak_seconds=6 * 3600))
        state.set_node("node-1", node("node-1"))
        poller = HistoryPeakPoller(PrometheusAPI(sixteen_cpu_node.url, timeout), state, 1, "instance", 240, 60)
        return poller.poll_once(), state

    with caplog.at_level("WARNING", logger="scheduler.kube"):
        read, state = poll(0.001)
    assert not read and state._history_peaks == {}
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("node history not readable from Prometheus (prometheus at ")
    assert ("read a recording rule of each node's cores instead with OVERSALE_PROMETHEUS_NODE_CPU_QUERY "
            "(kube-prometheus-stack records instance:node_cpu:rate:sum), or raise OVERSALE_PROMETHEUS_TIMEOUT)"
            in warning)
    read, state = poll(2.5)
    assert read and state._history_peaks["node-1"][0] == pytest.approx(16 * 5 * 0.1 * 1000)


@pytest.mark.parametrize(("body", "raw"), GARBAGE_ANSWERS)
def test_a_prometheus_answering_garbage_changes_no_node_and_no_workload(body, raw):
    server = garbage_prometheus(body, raw=raw)
    try:
        state = ClusterState(KEYS)
        state.set_node("n", node("n"))
        state.record_node_samples({"n": Sample(time.time(), 4800, 8 << 30)})
        before = state.heats(["n"])[0].load
        results: list[str] = []
        prometheus = PrometheusAPI(server.url)
        poller = HistoryPeakPoller(prometheus, state, 1, "instance", 300, 60, results.append)
        assert not poller.poll_once() and results == ["error"]
        assert state.heats(["n"])[0].load == before
        new_replica = pod_demand(replica("web-7c9b4-y1", "7c9b4", "4"), KEYS)
        state.record_workload_history({"default/Deployment/web": WorkloadUsage(250.0, 2.0**28, 2)}, time.time())
        workloads = WorkloadHistoryPoller(prometheus, state, 1, 86400, 300, 60, results.append)
        assert not workloads.poll_once() and results == ["error", "error"]
        assert state.estimate_for(new_replica) == {"cpu": 250.0, "memory": 2.0**28}, "the last read still counts"
    finally:
        server.shutdown()


def test_an_unreachable_prometheus_leaves_the_peak_to_the_extenders_own_samples(tmp_path):
    api = FakeKubeAPI().start()
    extender = history_extender(api, tmp_path, f"http://127.0.0.1:{free_port()}", "6h")
    try:
        wait_for(lambda: 'oversale_extender_history_polls_total{result="error"}' in extender.get("/metrics"))
        wait_for(lambda: 'oversale_extender_nodes_without_fresh_metrics{reason="missing"} 0.0'
                 in extender.get("/metrics"))
        answer = extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["burst", "calm"]})
        assert answer["NodeNames"] == ["burst", "calm"] and answer["Error"] == ""
        assert 'oversale_extender_workload_history_polls_total{result="error"}' in extender.get("/metrics")
        log = extender.log_path.read_text()
        assert "node history not readable from Prometheus (prometheus at http://127.0.0.1:" in log
        assert "workload history not readable from Prometheus (prometheus at http://127.0.0.1:" in log
        # What counts meanwhile, said with each warning.
        assert "; the peak watermark reads the extender's own samples once the last read is too old" in log
        assert ("; Pods of workloads with none in the metrics are estimated by their requests once the last read "
                "is too old") in log
    finally:
        extender.stop()
        api.stop()


def own_pod(api: FakeKubeAPI, name: str, labels: dict | None = None) -> dict:
    """The extender's own Pod, as the downward API names it (POD_NAME)."""
    metadata = {"name": name, "namespace": "oversale", "labels": {"app": "extender", **(labels or {})}}
    api.put("pods", {"metadata": metadata, "spec": {"containers": []}, "status": {"phase": "Running"}})
    return {"OVERSALE_EXTENDER_LEASE_DURATION": "3", "POD_NAME": name, "POD_NAMESPACE": "oversale"}


def leads(api: FakeKubeAPI, name: str) -> bool:
    """Whether the extender's Service would select this Pod (the leader label)."""
    return (api.get("pods", "oversale", name)["metadata"].get("labels") or {}).get(KEYS.extender_leader) == "true"


def extender_lease(api_client: Any, identity: str, clock: Any = time.monotonic, kind: Any = None) -> Any:
    """The extender's Lease elector for replica ``identity`` (15 s Lease), ``kind`` a LeaseElector subclass."""
    from kube.leader import LeaseElector

    return (kind or LeaseElector)(api_client, "oversale", "oversale-extender", identity, 15, clock)


def leadership_of(elector: Any, api_client: Any, watch: Any) -> Any:
    """The extender's leadership over ``elector``, labelling its own Pod oversale/extender-a."""
    from scheduler.kube import KubeBinder, Leadership

    binder = KubeBinder(api_client, watch)
    return Leadership(elector, watch, label=lambda leading: binder.label(
        "oversale", "extender-a", {KEYS.extender_leader: "true" if leading else None}))


def test_two_replicas_one_serves_and_the_standby_takes_over_without_handing_a_cpu_twice(tmp_path):
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    leader = Extender(api, tmp_path, own_pod(api, "extender-a"))
    wait_for(lambda: leads(api, "extender-a"))
    # A restarted container finds the label its Pod carried when it led: it takes it off.
    standby = Extender(api, tmp_path, own_pod(api, "extender-b", {KEYS.extender_leader: "true"}), leading=False)
    try:
        # Both Ready (so rollouts and drains go through); the Service selects the leader's label.
        assert json.loads(leader.get("/readyz"))["leader"] is True
        assert json.loads(standby.get("/readyz")) == {"status": "ready", "leader": False}
        wait_for(lambda: not leads(api, "extender-b"))
        assert leads(api, "extender-a")
        for name in ("before", "after"):
            api.put("pods", pod(name, "4", "FullPCPUs"))
        wait_for(lambda: api.get("pods", "default", "after") is not None)
        refused = standby.post("bind", {"PodName": "before", "PodNamespace": "default", "PodUID": "uid-before",
                                        "Node": "node-0"})
        assert "standby" in refused["Error"]
        # An error of the bind verb, where OversaleExtenderErrors and the dashboard count it.
        assert 'oversale_extender_calls_total{result="error",verb="bind"} 1.0' in standby.get("/metrics").splitlines()
        assert leader.post("bind", {"PodName": "before", "PodNamespace": "default", "PodUID": "uid-before",
                                    "Node": "node-0"})["Error"] == ""
        first_holder = api.get("leases", "oversale", "oversale-extender")["spec"]["holderIdentity"]
        # The standby's log names the replica it waits for (an operator's first question).
        assert f"standing by (lease oversale/oversale-extender: held by {first_holder})" in standby.log_path.read_text()
        leader.stop()  # the leader stops right after handing out CPUs
        wait_for(lambda: leads(api, "extender-b"), timeout=20)
        assert not leads(api, "extender-a"), "a graceful stop takes its label off first"
        assert standby.post("bind", {"PodName": "after", "PodNamespace": "default", "PodUID": "uid-after",
                                     "Node": "node-0"})["Error"] == ""
        assert not bound_cpus(api, "before") & bound_cpus(api, "after"), "no CPU handed out twice"
        assert api.get("leases", "oversale", "oversale-extender")["spec"]["holderIdentity"] != first_holder
    finally:
        standby.stop()
        api.stop()


def test_a_graceful_stop_gives_the_lease_back(tmp_path):
    """A rollout stops the leader with SIGTERM: it hands the Lease over instead of leaving the
    standby to wait out a Lease duration while kube-scheduler's calls fail."""
    api = FakeKubeAPI().start()
    try:
        api.put("nodes", node("node-0"))
        leader = Extender(api, tmp_path, {"OVERSALE_EXTENDER_LEASE_DURATION": "30"})
        assert api.get("leases", "oversale", "oversale-extender")["spec"]["holderIdentity"]
        leader.stop()
        assert leader.process.returncode == 0, leader.log_path.read_text()
        assert not api.get("leases", "oversale", "oversale-extender")["spec"].get("holderIdentity")
    finally:
        api.stop()


def test_a_stop_while_the_api_server_is_answering_leaves_cleanly_and_gives_the_lease_back(tmp_path):
    """A rollout's SIGTERM can come while the caches are waiting for the API server's answer to
    their list (a large cluster's, an API server under load). The worker still leaves cleanly,
    having given the Lease back; it aborted (SIGABRT) when its interpreter finalized around
    those threads."""
    api = FakeKubeAPI().start()
    try:
        api.put("nodes", node("node-0"))
        api.trickled_lists |= {"nodes", "pods"}
        extender = Extender(api, tmp_path, probe="/healthz", leading=False)
        wait_for(lambda: ((api.get("leases", "oversale", "oversale-extender") or {}).get("spec") or {})
                 .get("holderIdentity"))
        extender.stop()
        log = extender.log_path.read_text()
        assert "Node cache synced" not in log, "stopped while its list was still on its way"
        assert extender.process.returncode == 0 and worker_deaths(log) == [], log
        assert not api.get("leases", "oversale", "oversale-extender")["spec"].get("holderIdentity")
    finally:
        api.stop()


def test_the_api_server_down_and_back_the_extender_keeps_answering_and_catches_up(cluster):
    api, extender = cluster
    api.down = True
    try:
        for _ in range(5):
            answer = extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-0", "node-1"]})
            assert answer["Error"] == "" and answer["NodeNames"] == ["node-0", "node-1"], "from its caches"
        api.put("nodes", node("node-new"))  # added while the extender cannot see it
    finally:
        api.down = False
    wait_for(lambda: extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-new"]})["NodeNames"]
             == ["node-new"], timeout=40)


def test_the_extender_is_ready_only_once_its_caches_have_listed_and_live_meanwhile(tmp_path):
    """An extender that has not listed the cluster yet knows no node and no Pod, so it must not be
    sent kube-scheduler's calls: /readyz answers 503 until its caches have listed (the Service
    keeps it out), while /healthz answers 200 so the kubelet does not restart it for an API
    server slow to answer. Each failed list is counted as a cache restart."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    api.down = True
    extender = Extender(api, tmp_path, probe="/healthz", leading=False)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{extender.url}/readyz", timeout=5)
        assert refused.value.code == 503
        assert refused.value.headers["Content-Type"] == "application/json"
        assert json.load(refused.value) == {"status": "waiting for caches to sync"}
        assert extender.status("/healthz") == 200
        wait_for(lambda: re.search(r'oversale_cache_restarts_total\{again="list",cause="list failed",kind="Node"\} '
                                   r"[1-9]", extender.get("/metrics")), timeout=30)
        api.down = False
        wait_for(lambda: extender.status("/readyz") == 200, timeout=40)
        assert extender.post("filter", {"Pod": pod("p", "1"), "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"]
    finally:
        extender.stop()
        api.stop()


def test_bind_refuses_what_kube_scheduler_would_never_ask_and_records_no_binding(cluster):
    api, extender = cluster
    other = pod("other", "2")
    other["spec"]["schedulerName"] = "default-scheduler"
    api.put("pods", other)
    unnamed = pod("unnamed", "2")  # no schedulerName: the API server's default-scheduler
    del unnamed["spec"]["schedulerName"]
    api.put("pods", unnamed)
    gpu = pod("gpu", "2")
    gpu["spec"]["schedulerName"] = "gpu-scheduler"
    api.put("pods", gpu)
    api.put("pods", pod("placed", "2", node_name="node-1"))
    api.put("pods", pod("mine", "2"))
    api.put("pods", pod("huge", "64"))
    leaving = pod("leaving", "1")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    api.put("pods", leaving)
    wait_for(lambda: all(api.get("pods", "default", n) for n in ("other", "unnamed", "gpu", "placed", "mine", "huge",
                                                                  "leaving")))

    def bind(name: str, uid: str, node_name: str = "node-0") -> str:
        return str(extender.post("bind", {"PodName": name, "PodNamespace": "default", "PodUID": uid,
                                          "Node": node_name})["Error"])

    for name, scheduler in (("other", "default-scheduler"), ("unnamed", "default-scheduler"), ("gpu", "gpu-scheduler")):
        assert bind(name, f"uid-{name}") == (f"not binding pod default/{name}: schedulerName {scheduler!r} is not "
                                             "served by this extender")
    assert bind("placed", "uid-placed") == "not binding pod default/placed: already bound to node-1"
    assert bind("mine", "uid-forged") == ("not binding pod default/mine: PodUID uid-forged is not the Pod's "
                                          "(uid-mine): it was replaced")
    assert bind("huge", "uid-huge", "tiny").startswith("pod default/huge no longer fits tiny: ")
    assert bind("leaving", "uid-leaving") == "not binding pod default/leaving: being deleted"
    # Deleted, or its node gone, between kube-scheduler's choice and the bind.
    assert bind("gone", "uid-gone").startswith("cannot read pod default/gone: ")
    assert bind("mine", "uid-mine", "node-9") == "node node-9 is not in the extender's cache"
    assert api.count("POST", "bindings") == 0, "nothing was bound"
    assert bind("mine", "uid-mine") == ""
    assert api.count("POST", "bindings") == 1
    assert "already bound" in bind("mine", "uid-mine"), "a bind sent twice binds once"
    assert api.count("POST", "bindings") == 1


def tls_extender(api: FakeKubeAPI, tmp_path: Path, bind: str, *args: str,
                 probe_port: int = 0) -> tuple[subprocess.Popen, Path]:
    """``python -m scheduler --bind bind --certs-dir tmp_path/certs *args`` on ``api``'s cluster
    (whose node-0 it places on), started, not yet known to serve; and its log."""
    api.put("nodes", node("node-0"))
    env = cli_env(api, tmp_path, OVERSALE_EXTENDER_PROBE_PORT=str(probe_port))
    log_path = tmp_path / "extender.log"
    command = [sys.executable, "-m", "scheduler", "--bind", bind, "--certs-dir", str(tmp_path / "certs"), *args]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    return process, log_path


def filter_over_tls(authority: str, ca: Path, client: Path | None = None) -> int:
    """The status of a filter call over HTTPS, trusting ``ca``, with the client certificate in the
    directory ``client`` where given."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client / "tls.crt"), str(client / "tls.key"))
    body = json.dumps({"Pod": pod("p", "1"), "NodeNames": ["node-0"]}).encode()
    request = urllib.request.Request(f"https://{authority}/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=5) as response:
        return int(response.status)


def test_without_a_client_ca_https_answers_any_caller_and_says_so(tmp_path):
    """--certs-dir alone (kube-scheduler's enableHTTPS, no client certificate): TLS for the
    caller's sake, not the extender's, and the log and a metric say that anyone may call bind."""
    from kube.tls import LOCAL_HOSTS, issue, write_bundle

    paths = write_bundle(tmp_path / "certs", issue(LOCAL_HOSTS))
    api = FakeKubeAPI().start()
    port = free_port()
    process, log_path = tls_extender(api, tmp_path, f"127.0.0.1:{port}")
    try:
        wait_until_serving(process, lambda: filter_over_tls(f"localhost:{port}", paths.ca) == 200, "extender", log_path)
        assert "no --client-ca: any client that reaches 127.0.0.1:" in log_path.read_text()
        context = ssl.create_default_context(cafile=str(paths.ca))
        with urllib.request.urlopen(f"https://localhost:{port}/metrics", context=context, timeout=5) as response:
            assert "oversale_extender_client_auth 0.0" in response.read().decode()
    finally:
        stop_process(process)
        api.stop()


def test_bound_to_an_ipv6_address_the_probes_listen_there_too(tmp_path):
    """``--bind [::1]:PORT`` (gunicorn's form of an IPv6 address, as an IPv6-only cluster needs):
    under mutual TLS the plain probe port listens on the same address."""
    from kube.tls import issue, write_bundle

    paths = write_bundle(tmp_path / "certs", issue(["localhost", "::1"]))
    api = FakeKubeAPI().start()
    port, probes = free_port(), free_port()
    process, log_path = tls_extender(api, tmp_path, f"[::1]:{port}", "--client-ca", str(paths.ca), probe_port=probes)

    def probed() -> bool:
        with urllib.request.urlopen(f"http://[::1]:{probes}/healthz", timeout=2) as response:
            return bool(json.load(response)["status"] == "ok")

    try:
        wait_until_serving(process, probed, "extender", log_path)
        with urllib.request.urlopen(f"http://[::1]:{probes}/metrics", timeout=5) as response:
            assert "oversale_extender_client_auth 1.0" in response.read().decode()
    finally:
        stop_process(process)
        api.stop()


def test_with_a_client_ca_only_kube_schedulers_certificate_gets_in(tmp_path):
    from kube.tls import LOCAL_HOSTS, issue, write_bundle

    serving = issue(LOCAL_HOSTS)
    paths = write_bundle(tmp_path / "certs", serving)
    scheduler_ca = issue(["oversale-scheduler-ca"])  # the client CA: not the serving one
    (tmp_path / "client-ca.crt").write_bytes(scheduler_ca.ca_cert)
    kube_scheduler = write_bundle(tmp_path / "kube-scheduler", issue(["kube-scheduler"], ca=scheduler_ca, client=True))
    intruder = write_bundle(tmp_path / "intruder", issue(["intruder"], client=True))  # another CA
    api = FakeKubeAPI().start()
    port, probes = free_port(), free_port()
    process, log_path = tls_extender(api, tmp_path, f"127.0.0.1:{port}", "--client-ca", str(tmp_path / "client-ca.crt"),
                                     probe_port=probes)

    def call(client: Path | None) -> int:
        return filter_over_tls(f"localhost:{port}", paths.ca, client)

    try:
        wait_until_serving(process, lambda: call(kube_scheduler.cert.parent) == 200, "extender", log_path)
        for stranger in (None, intruder.cert.parent):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                call(stranger)
        assert call(kube_scheduler.cert.parent) == 200
        assert "no --client-ca" not in log_path.read_text()
        # Probes and scrapes (no client certificate) have their own plain port, which has no verbs.
        plain = f"http://127.0.0.1:{probes}"
        def ready() -> bool:
            try:
                return bool(urllib.request.urlopen(f"{plain}/readyz", timeout=5).status == 200)
            except urllib.error.HTTPError:
                return False

        wait_for(ready)
        with urllib.request.urlopen(f"{plain}/metrics", timeout=5) as response:
            raw = response.read()
            # Prometheus picks its parser by the Content-Type: the text format's, as on the main port.
            assert response.headers["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
            assert response.headers["Content-Length"] == str(len(raw))
        exposition = raw.decode()
        assert "oversale_extender_client_auth 1.0" in exposition
        # A query string on a probe's path (an httpGet probe may carry one) does not change the path asked.
        with urllib.request.urlopen(f"{plain}/healthz?verbose", timeout=5) as response:
            assert response.headers["Content-Type"] == "application/json" and json.load(response)["status"] == "ok"
        with pytest.raises(urllib.error.HTTPError) as unknown:
            urllib.request.urlopen(f"{plain}/filter", timeout=5)
        assert unknown.value.code == 404 and json.load(unknown.value) == {"error": "not found"}
        assert unknown.value.headers["Content-Type"] == "application/json"
        # When what it serves and whom it trusts expire, for the alert to watch.
        from cryptography import x509

        # kube-scheduler's own certificate, which it reads only at start, as its calls present it:
        # whether it was restarted after a renewal.
        assert expiry_samples(exposition) == {
            name: x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
            for name, pem in (("serving", serving.cert), ("ca", serving.ca_cert), ("client-ca", scheduler_ca.ca_cert),
                              ("kube-scheduler-client", kube_scheduler.cert.read_bytes()))}
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(urllib.request.Request(f"{plain}/bind", data=b"{}"), timeout=5)
        assert missing.value.code in (404, 501)
    finally:
        stop_process(process)
        api.stop()


def test_room_held_by_a_bind_whose_pod_never_shows_up_is_given_back_after_the_ttl():
    """A bind reserves room before kube-scheduler's cache or the watch shows the Pod; if the Pod
    never shows up bound, the reservation expires and the node's row in the table frees it."""
    now = [1000.0]
    state = ClusterState(KEYS, clock=lambda: now[0], wall=lambda: now[0])
    state.set_node("n", node("n"))  # 24 cores oversold
    demand = pod_demand(pod("big", "20"), KEYS)
    args = {"Pod": pod("next", "8"), "NodeNames": ["n"]}
    assert filter_nodes(args, state, KEYS)["NodeNames"] == ["n"]
    state.reserve(PodRecord("uid-big", "n", demand, (), "default", "big", now[0]))
    assert filter_nodes(args, state, KEYS)["FailedNodes"] == {
        "n": "cpu: 8 requested, 4 free on n (oversold allocatable)"}
    now[0] += RESERVATION_TTL + 1
    assert filter_nodes(args, state, KEYS)["NodeNames"] == ["n"]


def test_a_bound_pod_a_relist_shows_not_yet_bound_keeps_its_room_and_nominations_are_listed_afresh():
    """A relist may come from an API server whose cache lags the one that took the Binding: a Pod
    it lists not yet bound exists, so its bind will show, and its room is held however long that
    takes. A nomination the relist does not show again (its Pod deleted or bound while the watch
    was away) holds nothing any more."""
    now = [1000.0]
    state = ClusterState(KEYS, clock=lambda: now[0], wall=lambda: now[0])
    state.set_node("n", node("n"))  # 24 cores oversold
    state.set_pod("uid-waiting", pod_facts(prioritised(pod("waiting", "2"), 100, nominated="n"), KEYS))
    assert list(state.nominations()) == ["n"]
    state.reserve(PodRecord("uid-big", "n", pod_demand(pod("big", "20"), KEYS), (), "default", "big", now[0]))
    state.confirm("uid-big")
    state.reset_pods()  # the watch expired: a relist begins
    assert state.nominations() == {}
    state.set_pod("uid-big", pod_facts(pod("big", "20"), KEYS))  # listed, not yet bound
    now[0] += RESERVATION_TTL + 1
    assert filter_nodes({"Pod": pod("next", "8"), "NodeNames": ["n"]}, state, KEYS)["FailedNodes"] == {
        "n": "cpu: 8 requested, 4 free on n (oversold allocatable)"}


def test_nodes_sent_in_full_are_judged_with_the_pods_the_extender_knows_on_them():
    """With nodeCacheCapable false kube-scheduler sends whole Node objects: their labels and
    allocatable come from what it sends, the Pods on them from the extender's own watch."""
    state = ClusterState(KEYS)
    state.set_node("n", node("n"))  # 24 cores oversold
    state.set_pod("uid-big", pod_facts(pod("big", "20", node_name="n"), KEYS))
    answer = filter_nodes({"Pod": pod("next", "8"), "Nodes": {"metadata": {}, "items": [node("n"), node("m")]}},
                          state, KEYS)
    assert answer["FailedNodes"] == {"n": "cpu: 8 requested, 4 free on n (oversold allocatable)"}
    assert [item["metadata"]["name"] for item in answer["Nodes"]["items"]] == ["m"]
    # A Node sent newer than the cache (its ratio lowered to 1 a moment ago: 16 cores) is judged
    # by what is sent, though the cache's view of it was counted first (it had 4 cores free).
    assert filter_nodes({"Pod": pod("small", "2"), "NodeNames": ["n"]}, state, KEYS)["NodeNames"] == ["n"]
    lowered = {"Pod": pod("small", "2"), "Nodes": {"metadata": {}, "items": [node("n", ratio="1")]}}
    assert filter_nodes(lowered, state, KEYS)["FailedNodes"] == {
        "n": "cpu: 2 requested, 0 free on n (oversold allocatable)"}


def test_a_finished_pod_still_nominated_holds_no_room():
    """A preemptor that failed, or was evicted, before its victims left may keep its
    nominatedNodeName: it will never run there."""
    state = ClusterState(KEYS)
    state.set_node("n", node("n"))
    finished = prioritised(pod("done", "8"), 100, nominated="n")
    finished["status"]["phase"] = "Failed"
    state.set_pod("uid-done", pod_facts(finished, KEYS))
    assert state.nominations() == {}


def scheduled(manifest: dict, at: float) -> dict:
    """The Pod as the API server shows it once bound at ``at`` (its PodScheduled condition)."""
    manifest["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                         "lastTransitionTime": format_timestamp(at)}]
    return manifest


def test_pods_bound_but_not_in_the_metrics_yet_count_on_their_node_while_they_settle():
    """Whoever bound them: this extender (from its bind, before the watch shows it and after) or
    another scheduler (from the PodScheduled time the watch shows); and only while they hold room
    there: a bind that failed counts no more."""
    now = [datetime(2026, 12, 2, tzinfo=UTC).timestamp()]
    start = now[0]
    state = ClusterState(KEYS, clock=lambda: now[0], wall=lambda: now[0])
    state.set_node("n", node("n"))

    def pending_cpu() -> float:
        return state.heats(["n"])[0].pending.get("cpu", 0.0)

    assert pending_cpu() == 0, "nothing bound yet (and read once, so a bind must make it count again)"
    for name in ("a", "b"):
        state.reserve(PodRecord(f"uid-{name}", "n", pod_demand(pod(name, "4"), KEYS), (), "default", name, now[0]))
    assert pending_cpu() == 2 * 3400, "two binds the watch has not shown yet, each at 85% of its request"
    state.release("uid-b")  # its Binding was refused
    assert pending_cpu() == 3400
    # kube-scheduler names a preemption's victims from its own cache, where a bind in flight is not.
    assert [(held.name, held.evictable) for held in state.held_pods("n")] == [("a", False)]
    now[0] += 10
    state.set_pod("uid-a", pod_facts(pod("a", "4", node_name="n"), KEYS))  # the watch shows it bound
    state.set_pod("uid-c", pod_facts(scheduled(pod("c", "2", node_name="n"), now[0] - 5), KEYS))  # by another
    assert pending_cpu() == 3400 + 1700
    # A preemption evicts the Pods bound last first: "a" keeps the time of its bind.
    assert {held.name: (held.bound_at, held.evictable) for held in state.held_pods("n")} == \
        {"a": (start, True), "c": (start + 5, True)}
    now[0] = start + LoadConfig().settle_seconds
    assert pending_cpu() == 1700, "a settled; c, bound 5 s later, not yet"
    now[0] += 5
    assert pending_cpu() == 0


def test_the_extender_serves_while_it_cannot_list_disruption_budgets():
    """PodDisruptionBudgets only weigh a preemption's added victims: an extender that may not list
    them (RBAC from an older release, an API outage) still syncs and serves, and takes them in
    once it can."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    api.put("poddisruptionbudgets", {"metadata": {"name": "web", "namespace": "default"},
                                     "spec": {"selector": {"matchLabels": {"app": "web"}}},
                                     "status": {"disruptionsAllowed": 1}})
    api.unavailable = {"poddisruptionbudgets"}
    state = ClusterState(KEYS)
    with watched(api, state):
        assert state.budgets() == [] and "node-0" in state.nodes
        api.unavailable = set()
        wait_for(lambda: [budget.allowed for budget in state.budgets()] == [1])


def test_a_disruption_budget_deleted_while_the_watch_was_away_is_forgotten_at_the_relist():
    """A PodDisruptionBudget deleted while its watch was away sends no DELETED event: the relist
    that follows forgets it, or a preemption's added victims would be weighed by it for good."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))

    def budget(name: str, allowed: int) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": name}}}, "status": {"disruptionsAllowed": allowed}}

    api.put("poddisruptionbudgets", budget("web", 1))
    api.put("poddisruptionbudgets", budget("db", 0))
    state = ClusterState(KEYS)
    with watched(api, state):
        wait_for(lambda: sorted(b.allowed for b in state.budgets()) == [0, 1])
        with api.watches_paused():
            api.delete("poddisruptionbudgets", "default", "db")
            api.put("poddisruptionbudgets", budget("cache", 5))  # shows when the relist is in
            api.compact("poddisruptionbudgets")  # the watch is too old now: 410, then a relist
            wait_for(lambda: 5 in [b.allowed for b in state.budgets()])
        assert sorted(b.allowed for b in state.budgets()) == [1, 5]


def test_numa_zones_come_from_node_resource_topologies_where_their_crd_is_installed():
    """NFD's topology-updater publishes each node's NUMA zones as a NodeResourceTopology. Without
    its CRD the extender syncs all the same (topology from node annotations), and takes the zones
    in once the CRD is installed, without a restart."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    api.absent = {"noderesourcetopologies"}
    state = ClusterState(KEYS)
    with watched(api, state, watch_timeout=1):
        assert state.nrt == {}
        api.absent = set()
        api.put("noderesourcetopologies", {"metadata": {"name": "node-0"}, "zones": [
            {"name": "node-0", "type": "Node", "resources": [{"name": "cpu", "capacity": "8", "allocatable": "7"},
                                                             {"name": "memory", "allocatable": "16106127360"}]},
            {"name": "node-1", "type": "Node", "resources": [{"name": "cpu", "capacity": "8", "allocatable": "8"},
                                                             {"name": "hugepages-1Gi", "allocatable": "4"}]},
            # A zone stating only its capacity gives that; a zone of another type is no NUMA node.
            {"name": "node-2", "type": "Node", "resources": [{"name": "cpu", "capacity": "4"}]},
            {"name": "node-3", "type": "Socket", "resources": [{"name": "cpu", "allocatable": "16"}]}]})
        wait_for(lambda: state.nrt.get("node-0") == {0: 7, 1: 8, 2: 4})
        api.delete("noderesourcetopologies", "", "node-0")
        wait_for(lambda: state.nrt == {})
        # Its CRD uninstalled: the zones known from it go.
        api.put("noderesourcetopologies", {"metadata": {"name": "node-0"}, "zones": [
            {"name": "node-0", "type": "Node", "resources": [{"name": "cpu", "allocatable": "6"}]}]})
        wait_for(lambda: state.nrt.get("node-0") == {0: 6})
        api.absent = {"noderesourcetopologies"}
        wait_for(lambda: state.nrt == {})


def test_a_bind_the_api_server_took_holds_its_room_however_late_the_watch_shows_it():
    """kube-scheduler stopped expiring the Pods it assumed once their bind succeeded
    (kubernetes#106361): under load its watch showed them bound minutes late, and their room went
    to other Pods meanwhile. The extender holds a bound Pod's room until its watch shows the Pod, or
    until a relist that no longer shows it (deleted while the watch was away) is a TTL old."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    now = [1000.0]
    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))  # 24 cores oversold
    api.put("nodes", node("m"))
    api.put("pods", pod("big", "20"))
    api.put("pods", pod("other", "20"))
    state = ClusterState(KEYS, clock=lambda: now[0], wall=lambda: now[0])
    after = {"Pod": pod("next", "8"), "NodeNames": ["n"]}
    refused = {"n": "cpu: 8 requested, 4 free on n (oversold allocatable)"}
    with watched(api, state) as (api_client, watch):
        binder = KubeBinder(api_client, watch)
        with api.watches_paused():  # the watch lags behind the bind
            assert bind({"PodName": "big", "PodNamespace": "default", "PodUID": "uid-big", "Node": "n"},
                        state, binder, KEYS) == {"Error": ""}
            assert api.get("pods", "default", "big")["spec"]["nodeName"] == "n"
            now[0] += RESERVATION_TTL + 1
            assert filter_nodes(after, state, KEYS)["FailedNodes"] == refused
        wait_for(lambda: watch.cached_pod("default", "big") is None)  # the watch shows it bound
        assert filter_nodes(after, state, KEYS)["FailedNodes"] == refused

        # Bound, then deleted before the watch showed either: the relist that follows the expired
        # watch does not show it, and its room comes back a TTL after that relist.
        elsewhere = {"Pod": pod("next", "8"), "NodeNames": ["m"]}
        with api.watches_paused():
            assert bind({"PodName": "other", "PodNamespace": "default", "PodUID": "uid-other", "Node": "m"},
                        state, binder, KEYS) == {"Error": ""}
            api.delete("pods", "default", "other")
            api.put("pods", pod("marker", "1"))  # shows when the relist is in
            api.compact("pods")
            wait_for(lambda: watch.cached_pod("default", "marker") is not None)
            now[0] += RESERVATION_TTL / 2
            assert filter_nodes(elsewhere, state, KEYS)["FailedNodes"] == {
                "m": "cpu: 8 requested, 4 free on m (oversold allocatable)"}
            now[0] += RESERVATION_TTL / 2 + 1
            assert filter_nodes(elsewhere, state, KEYS)["NodeNames"] == ["m"]
            assert filter_nodes(after, state, KEYS)["FailedNodes"] == refused, "the watched Pod still holds"


def test_a_relist_is_applied_at_once_never_half_way():
    """A relist (the watch expired, or a new leader) rebuilds the Pod index: a filter or a bind
    that reads it half rebuilt sees a node's Pods half counted, and hands out the room and CPUs the
    others hold. Readers sampling a node throughout a relist of 3,000 Pods see it whole, or as
    before."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    for index in range(3000):
        api.put("pods", pod(f"p{index}", "10m", node_name="node-0"))
    state = ClusterState(KEYS)
    interval = sys.getswitchinterval()
    with watched(api, state) as (_, watch):
        assert state.usage("node-0").shared["cpu"] == 30000
        seen: set[int] = set()
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                seen.add(state.usage("node-0").shared.get("cpu", 0))

        sys.setswitchinterval(1e-5)  # threads take turns often, as they do under load
        sampler = threading.Thread(target=sample)
        sampler.start()
        lists = api.count("GET", "pods", watch=False)
        try:
            with api.watches_paused():
                api.put("pods", pod("marker", "1"))
                api.compact("pods")  # the watch is too old now: 410, then a relist
                wait_for(lambda: watch.cached_pod("default", "marker") is not None, timeout=60)
        finally:
            stop.set()
            sampler.join()
            sys.setswitchinterval(interval)
        assert api.count("GET", "pods", watch=False) > lists
        assert seen == {30000}


def test_nodes_turning_stale_together_are_told_in_one_line(caplog):
    """metrics-server restarted: every node is without metrics at once, then with them again. A
    line each was 5,000 lines twice on a large cluster; one line a poll names the first few."""
    from scheduler.kube import UsagePoller

    api = FakeKubeAPI().start()
    names = [f"node-{i:02}" for i in range(12)]
    for name in names:
        api.put("nodes", node(name))
    state = ClusterState(KEYS)
    with watched(api, state) as (api_client, _):
        poller = UsagePoller(api_client, state, 30)
        with caplog.at_level("INFO", logger="scheduler.kube"):
            poller.poll_once()
            poller.poll_once()  # still without metrics: nothing turned, nothing said
            for name in names:
                api.put("nodemetrics", node_metrics(name, 4.0))
            poller.poll_once()
    assert [r.getMessage() for r in caplog.records if r.name == "scheduler.kube"] == [
        "node node-00: no node metrics, node node-01: no node metrics, node node-02: no node metrics, node node-03: "
        "no node metrics, node node-04: no node metrics and 7 more; placed by requests until fresh metrics arrive",
        "node node-00, node node-01, node node-02, node node-03, node node-04 and 7 more: fresh metrics again; "
        "load-aware placement resumes"]


def test_each_poll_counts_the_nodes_placed_by_requests_by_why():
    """What the extender's gauge of nodes without fresh metrics reads, by reason: a node
    metrics-server has no figures for (``missing``: just joined, or not scraped) apart from one
    whose figures are older than the limit (``old``: its kubelet stopped answering)."""
    from scheduler.kube import UsagePoller

    api = FakeKubeAPI().start()
    for name in ("fresh", "stale", "new", "newer"):
        api.put("nodes", node(name))
    api.put("nodemetrics", node_metrics("fresh", 4.0))
    api.put("nodemetrics", node_metrics("stale", 4.0, age=600))
    state = ClusterState(KEYS)
    polls: list[dict[str, int]] = []
    with watched(api, state) as (api_client, _):
        poller = UsagePoller(api_client, state, 30, lambda result, stale: polls.append(stale))
        assert poller.poll_once() and polls == [{"missing": 2, "old": 1}]
        for name in ("stale", "new", "newer"):
            api.put("nodemetrics", node_metrics(name, 4.0))
        assert poller.poll_once() and polls[-1] == {"missing": 0, "old": 0}


def test_a_poll_that_reads_nodemetrics_but_not_podmetrics_is_partial_and_keeps_the_node_figures(caplog):
    """What the poll counter's ``result`` label says: ``partial`` when NodeMetrics were read and
    PodMetrics were not (the node figures count; see the HTTP test for placement), ``ok`` once
    both are read again. The log says each kind of failure once, when it starts, and the end."""
    from scheduler.kube import UsagePoller

    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))
    api.put("nodemetrics", node_metrics("n", 4.0))
    api.unavailable = {"nodemetrics", "podmetrics"}
    state = ClusterState(KEYS)
    results: list[str] = []
    with watched(api, state) as (api_client, _), caplog.at_level("INFO", logger="scheduler.kube"):
        poller = UsagePoller(api_client, state, 30, lambda result, stale: results.append(result))
        assert poller.poll_once() is False and results == ["error"]
        api.unavailable = {"podmetrics"}
        assert poller.poll_once() is False and poller.poll_once() is False
        assert results == ["error", "partial", "partial"]
        assert state.heats(["n"])[0].load is not None
        api.unavailable = set()
        assert poller.poll_once() is True and results == ["error", "partial", "partial", "ok"]
    assert [r.getMessage() for r in caplog.records if r.name == "scheduler.kube"] == [
        "metrics API not readable (HTTP 503 Service Unavailable); nodes fall back to request-based placement as "
        "their metrics age past the limit",
        "node n: no node metrics; placed by requests until fresh metrics arrive",
        "PodMetrics not readable (HTTP 503 Service Unavailable); node figures still count, and Pods bound since "
        "the last PodMetrics read count their estimates until they settle",
        "node n: fresh metrics again; load-aware placement resumes",
        "metrics API readable again (after 3 failed runs)"]


def test_a_node_deleted_while_the_watch_was_away_is_forgotten_at_the_relist():
    """A node deleted while the Node watch was away sends no DELETED event: the relist that follows
    forgets it, or it would count among the nodes without fresh metrics for good (the extender's
    gauge, and its log) in a cluster whose autoscaler removes nodes."""
    from scheduler.kube import UsagePoller

    api = FakeKubeAPI().start()
    for name in ("node-0", "node-1"):
        api.put("nodes", node(name))
        api.put("nodemetrics", node_metrics(name, 4.0))
    state = ClusterState(KEYS, load_config=LoadConfig(max_age_seconds=3.0))
    polls: list[dict[str, int]] = []
    with watched(api, state) as (api_client, _):
        poller = UsagePoller(api_client, state, 30, lambda result, stale: polls.append(stale))
        assert poller.poll_once() and polls[-1] == {"missing": 0, "old": 0}
        with api.watches_paused():
            api.delete("nodes", "", "node-1")
            api.delete("nodemetrics", "", "node-1")
            api.put("nodes", node("node-2"))
            api.put("nodemetrics", node_metrics("node-2", 4.0))
            api.compact("nodes")  # the watch is too old now: 410, then a relist
            wait_for(lambda: "node-2" in state.nodes)
        time.sleep(4.0)  # node-1's last metrics are past the limit now; the others are read afresh
        for name in ("node-0", "node-2"):
            api.put("nodemetrics", node_metrics(name, 4.5))
        assert poller.poll_once() and polls[-1] == {"missing": 0, "old": 0}
        args = {"Pod": pod("next", "1"), "NodeNames": ["node-0", "node-1"]}
        assert filter_nodes(args, state, KEYS)["FailedNodes"] == {"node-1": "node not in the extender's cache yet"}


def test_a_leader_label_refused_is_said_once_though_tried_at_every_check(caplog):
    """The leadership check runs twice a second and tries a refused label again each time: a
    policy refusing it for an hour was 7,200 warnings. One when it starts, one when it ends."""

    api = FakeKubeAPI().start()
    own_pod(api, "extender-a")
    api.validating["pods"] = lambda review: {"allowed": False, "status": {"code": 403, "message": "labels frozen"}}
    state = ClusterState(KEYS)
    with watched(api, state) as (api_client, watch):
        elector = extender_lease(api_client, "extender-a")
        leadership = leadership_of(elector, api_client, watch)
        assert elector.try_acquire_or_renew()
        with caplog.at_level("INFO", logger="scheduler.kube"):
            for _ in range(3):
                leadership.check()
            assert not leads(api, "extender-a")
            del api.validating["pods"]
            leadership.check()
            assert leads(api, "extender-a")
            # Stopping, the label cannot come off: said as what failed, and the label stays.
            api.validating["pods"] = lambda review: {"allowed": False, "status": {"code": 403,
                                                                                 "message": "labels frozen"}}
            leadership.stop()
        assert leads(api, "extender-a")
    told = [m for m in caplog.messages if "leader label" in m]
    assert len(told) == 3 and told[0].startswith("could not set the leader label on this Pod: HTTP 403"), told
    assert told[1] == "the leader label on this Pod is right again (after 3 failed runs)"
    assert told[2].startswith("could not remove the leader label on this Pod: HTTP 403"), told


PINNED = {"PodName": "pinned", "PodNamespace": "default", "PodUID": "uid-pinned", "Node": "n"}
"""kube-scheduler's bind of ``pinned`` to n."""


@contextmanager
def bind_setup(nodes: tuple[str, ...] = ("n",), pods: tuple[str, ...] = ("pinned",),
               timeout: float = 10.0) -> Iterator[tuple[FakeKubeAPI, ClusterState, Any, Any, list[float]]]:
    """Nodes (24 cores oversold, 16 real) and Pods asking for 4 exclusive CPUs each; the
    extender's watches over them, synced; and its binder, whose requests time out after
    ``timeout`` seconds. Yields (api, state, binder, watch, the state's clock as a one-item list
    to move)."""
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    for name in nodes:
        api.put("nodes", node(name))
    for name in pods:
        api.put("pods", pod(name, "4", "FullPCPUs"))
    now = [1000.0]
    state = ClusterState(KEYS, clock=lambda: now[0])
    with watched(api, state) as (api_client, watch):
        yield api, state, KubeBinder(api_client, watch, timeout=timeout), watch, now


@contextmanager
def lost_bind(*others: str) -> Iterator[tuple[FakeKubeAPI, ClusterState, Any, Any, list[float]]]:
    """``bind_setup`` with nodes n and m and Pods ``pinned`` and ``others``; ``pinned``'s bind to n
    failed with a 500 the API server did not store: its answer lost, its room held."""
    from scheduler.extender import bind

    with bind_setup(("n", "m"), ("pinned", *others), timeout=5) as (api, state, binder, watch, now):
        api.storms["bindings"] = [500, 1]
        assert bind(PINNED, state, binder, KEYS)["Error"].startswith("binding default/pinned to n failed")
        yield api, state, binder, watch, now


def test_a_leader_that_loses_its_lease_unlabels_itself_and_binds_nothing_until_it_leads_again(caplog):
    """Not a graceful stop: the leader could not renew (the API server too busy, the process
    paused) and another replica took the Lease. Its next check takes the leader label off its
    Pod, so the Service stops sending kube-scheduler there, and it binds nothing; once it holds
    the Lease again it lists Nodes and Pods afresh and serves."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))
    api.put("pods", pod("pinned", "4", "FullPCPUs"))
    own_pod(api, "extender-a")
    clock = [time.monotonic()]
    state = ClusterState(KEYS)
    with watched(api, state) as (api_client, watch):
        binder = KubeBinder(api_client, watch)
        ours = extender_lease(api_client, "extender-a", lambda: clock[0])
        theirs = extender_lease(api_client, "extender-b", lambda: clock[0])
        leadership = leadership_of(ours, api_client, watch)
        assert ours.try_acquire_or_renew() and not theirs.try_acquire_or_renew()
        leadership.check()
        assert leadership.leading() and leads(api, "extender-a")

        clock[0] += 16  # no renewal for a Lease duration: the other replica takes it over
        assert theirs.try_acquire_or_renew() and not ours.try_acquire_or_renew()
        with caplog.at_level("WARNING", logger="scheduler.kube"):
            leadership.check()
        assert "lost the lease: binding nothing until it is taken again" in caplog.messages
        assert not leadership.leading() and not leads(api, "extender-a")
        assert bind(PINNED, state, binder, KEYS, leading=leadership.leading)["Error"] == \
            "not binding pod default/pinned: this extender replica stopped leading mid-bind"
        assert api.count("POST", "bindings") == 0 and not state.usage("n").bound_cpus

        theirs.release()  # the other replica stops gracefully: the Lease is ours at the next round
        lists = api.count("GET", "pods", watch=False)
        assert ours.try_acquire_or_renew()
        leadership.check()
        assert leadership.leading() and leads(api, "extender-a")
        assert api.count("GET", "pods", watch=False) > lists, "Pods listed afresh before serving"
        assert bind(PINNED, state, binder, KEYS, leading=leadership.leading)["Error"] == ""


def test_a_leader_writes_its_label_once_though_it_checks_twice_a_second():
    """The leadership check runs twice a second: a label written at each check was a Pod PATCH
    twice a second, for good, on every extender, and an event to every Pod watcher each time.
    The label is written when leading starts and removed when it ends, once each."""

    api = FakeKubeAPI().start()
    own_pod(api, "extender-a")
    clock = [time.monotonic()]
    state = ClusterState(KEYS)
    with watched(api, state) as (api_client, watch):
        ours = extender_lease(api_client, "extender-a", lambda: clock[0])
        theirs = extender_lease(api_client, "extender-b", lambda: clock[0])
        leadership = leadership_of(ours, api_client, watch)
        assert ours.try_acquire_or_renew() and not theirs.try_acquire_or_renew()
        for _ in range(10):
            leadership.check()
        assert leads(api, "extender-a") and api.count("PATCH", "pods") == 1

        clock[0] += 16
        assert theirs.try_acquire_or_renew()
        for _ in range(10):
            leadership.check()
        assert not leads(api, "extender-a") and api.count("PATCH", "pods") == 2


def test_a_replica_holding_the_lease_serves_only_once_its_nodes_and_pods_are_listed():
    """A replica takes the Lease while its first Pod list is still loading (on a large cluster it
    takes seconds; here the API server fails it). Serving then would hand out CPUs the Pods not yet
    listed hold: it neither binds nor takes the leader label until Nodes and Pods are listed."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))
    api.put("pods", pod("pinned", "4", "FullPCPUs"))
    own_pod(api, "extender-a")
    api.unavailable = {"pods"}
    state = ClusterState(KEYS)
    with watched(api, state, synced=False) as (api_client, watch):
        wait_for(lambda: api.count("GET", "pods", watch=False) >= 1)
        binder = KubeBinder(api_client, watch)
        elector = extender_lease(api_client, "extender-a")
        leadership = leadership_of(elector, api_client, watch)
        assert elector.try_acquire_or_renew()
        leadership.check()
        assert not watch.synced and not leadership.leading()
        api.unavailable = set()
        assert not leads(api, "extender-a")
        assert bind(PINNED, state, binder, KEYS, leading=leadership.leading)["Error"] == \
            "not binding pod default/pinned: this extender replica stopped leading mid-bind"
        assert api.count("POST", "bindings") == 0

        wait_for(lambda: watch.synced, timeout=60)
        leadership.check()
        assert leadership.leading() and leads(api, "extender-a")
        assert bind(PINNED, state, binder, KEYS, leading=leadership.leading)["Error"] == ""


def test_a_check_that_lands_while_the_lease_is_given_back_takes_nothing_up_again():
    """A graceful stop takes the label off, then gives the Lease back, which waits for a Lease
    round in flight. The leadership check keeps running meanwhile and still finds the Lease held:
    it must not serve or put the label back, or kube-scheduler is sent to a replica on its way out."""
    from kube.leader import LeaseElector
    from scheduler.kube import Leadership

    api = FakeKubeAPI().start()
    own_pod(api, "extender-a")
    state = ClusterState(KEYS)
    with watched(api, state) as (api_client, watch):
        leadership: Leadership

        class CheckedWhileReleasing(LeaseElector):
            def release(self) -> None:
                leadership.check()  # the leadership loop's next round, during release's wait
                super().release()

        elector = extender_lease(api_client, "extender-a", kind=CheckedWhileReleasing)
        leadership = leadership_of(elector, api_client, watch)
        assert elector.try_acquire_or_renew()
        leadership.check()
        assert leads(api, "extender-a")
        leadership.stop()
        assert not leadership.serving and not leads(api, "extender-a")
        assert api.count("PATCH", "pods") == 2
        assert not api.get("leases", "oversale", "oversale-extender")["spec"].get("holderIdentity")


def test_a_replica_that_stops_leading_mid_bind_writes_nothing_more():
    """A leader paused past its Lease (a long GC, a frozen VM) resumes in the middle of a bind while
    the new leader may be handing out the same CPUs: it asks again before each write, and once it
    no longer leads it neither binds nor keeps the CPUs. The cpuset it wrote stays on the Pod,
    which is not bound and so counts for no one; removing it could remove the new leader's."""
    from scheduler.extender import bind
    from scheduler.kube import Leadership

    with bind_setup() as (api, state, binder, watch, _now):

        class PausedElector:
            """Leads until the cpuset is written; the process is then paused past its Lease."""

            def is_leader(self) -> bool:
                return api.count("PATCH", "pods") == 0

        leadership = Leadership(PausedElector(), watch)
        leadership.serving = True  # the last check, before the pause
        answer = bind(PINNED, state, binder, KEYS, leading=leadership.leading)
        assert answer == {"Error": "not binding pod default/pinned: this extender replica stopped leading mid-bind"}
        stored = api.get("pods", "default", "pinned")
        assert not stored["spec"].get("nodeName") and api.count("POST", "bindings") == 0
        assert KEYS.resource_status in stored["metadata"]["annotations"] and api.count("PATCH", "pods") == 1
        assert state.usage("n").bound_cpus == set() and not state.is_bound("uid-pinned")


def test_a_replica_that_no_longer_leads_when_a_bind_arrives_writes_nothing():
    """Asked to bind after its Lease has passed (the request was already in flight), the replica
    writes neither the cpuset nor the Binding: the new leader may be handing out those CPUs."""
    from scheduler.extender import bind

    with bind_setup() as (api, state, binder, _watch, _now):
        answer = bind(PINNED, state, binder, KEYS, leading=lambda: False)
        assert answer == {"Error": "not binding pod default/pinned: this extender replica stopped leading mid-bind"}
        assert api.count("PATCH", "pods") == 0 and api.count("POST", "bindings") == 0
        assert KEYS.resource_status not in api.get("pods", "default", "pinned")["metadata"]["annotations"]
        assert state.usage("n").bound_cpus == set() and not state.is_bound("uid-pinned")


def test_a_bind_whose_answer_is_lost_keeps_its_cpus_and_cpuset():
    """An overloaded API server stores a Binding, and the client times out before the answer: the
    bind may have happened. Its CPUs stay held, and its cpuset stays on the Pod, so that a Pod bound
    after all runs on the CPUs it was given and counts them (releasing them, and removing the cpuset,
    left it bound and unpinned, its CPUs free to hand out). kube-scheduler hears of the error and
    retries; the watch then shows the Pod bound."""
    from scheduler.extender import bind

    with bind_setup(timeout=0.5) as (api, state, binder, watch, _now):
        api.slow_writes["bindings"] = 2.0
        with api.watches_paused():
            answer = bind(PINNED, state, binder, KEYS)
            assert answer["Error"].startswith("binding default/pinned to n failed")
            held = state.usage("n").bound_cpus
            assert len(held) == 4, "held while it is not known whether the bind happened"
        stored = api.get("pods", "default", "pinned")
        assert stored["spec"]["nodeName"] == "n" and KEYS.resource_status in stored["metadata"]["annotations"]
        wait_for(lambda: watch.cached_pod("default", "pinned") is None)  # the watch shows it bound
        assert state.usage("n").bound_cpus == held


def test_a_bind_to_a_node_run_hot_since_the_filter_is_refused_and_a_refused_binding_gives_its_room_back():
    """Load-aware, the bind asks the watermarks again: a node may run hot between kube-scheduler's
    filter and its bind. A Binding the API server refuses (a 4xx) did not happen: its room is free
    at once, not held as a bind whose answer was lost."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    for name in ("n", "m"):
        api.put("nodes", node(name))  # 24 cores oversold, 16 real
    api.put("pods", pod("big", "20"))
    state = ClusterState(KEYS)
    big = {"PodName": "big", "PodNamespace": "default", "PodUID": "uid-big"}
    with watched(api, state) as (api_client, watch):
        binder = KubeBinder(api_client, watch, timeout=5)
        state.record_node_samples({"n": Sample(time.time(), 11000, 8 << 30)})  # 69% of real
        assert bind({**big, "Node": "n"}, state, binder, KEYS, load_aware=True)["Error"] == (
            "pod default/big no longer fits n: cpu usage 69% of real capacity (5-min average) is above the "
            "scheduling watermark 65%")
        assert api.count("POST", "bindings") == 0

        api.storms["bindings"] = [403, 1]
        assert "is forbidden" in bind({**big, "Node": "m"}, state, binder, KEYS, load_aware=True)["Error"]
        assert api.count("POST", "bindings") == 1 and state.lost_bind("uid-big") is None
        assert filter_nodes({"Pod": pod("next", "20"), "NodeNames": ["m"]}, state, KEYS)["NodeNames"] == ["m"]


def test_a_retried_bind_whose_answer_was_lost_binds_on_the_same_cpus(caplog):
    """The API server failed a Binding with a 5xx, and had not stored it: the room stays held, as
    the bind may have happened. kube-scheduler retries to the same node: the extender reads the Pod
    afresh, finds it unbound, and sends the same Binding again on the same CPUs (before, every retry
    was refused as already bound until the room expired, 2 minutes). To another node, the retry is
    refused, since the first Binding might still land."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, watch, now):
        held = state.usage("n").bound_cpus
        first = api.get("pods", "default", "pinned")
        assert len(held) == 4 and not first["spec"].get("nodeName")
        assert "bind of default/pinned to n may or may not have happened" in caplog.text

        elsewhere = bind({**PINNED, "Node": "m"}, state, binder, KEYS)["Error"]
        assert elsewhere == ("not binding pod default/pinned to m: an earlier bind of it to n got no answer and may "
                             "still land; its room there is held until the watch tells "
                             f"(at most {RESERVATION_TTL:.0f} s)")
        assert api.count("POST", "bindings") == 1 and state.usage("m").bound_cpus == set()

        with api.watches_paused(), caplog.at_level(logging.INFO, logger="scheduler.extender"):
            assert bind(PINNED, state, binder, KEYS) == {"Error": ""}
            assert "bound default/pinned to n at the retry of a bind whose answer was lost" in caplog.text
            # Taken by the API server: held past the TTL, however late the watch shows it.
            now[0] += RESERVATION_TTL + 1
            assert state.usage("n").bound_cpus == held
        stored = api.get("pods", "default", "pinned")
        assert stored["spec"]["nodeName"] == "n"
        assert stored["metadata"]["annotations"][KEYS.resource_status] == \
            first["metadata"]["annotations"][KEYS.resource_status], "the same cpuset"
        assert state.usage("n").bound_cpus == held
        assert api.count("PATCH", "pods") == 1, "the cpuset written before the lost Binding is not written again"
        wait_for(lambda: watch.cached_pod("default", "pinned") is None)  # the watch shows it bound
        assert state.usage("n").bound_cpus == held and state.is_bound("uid-pinned")


def test_a_lost_bind_retried_after_its_room_expired_is_placed_afresh():
    """Once the room held for a lost bind has expired, its CPUs may go to another Pod: a retry is
    placed as a first bind would be, never sent again on those CPUs."""
    from scheduler.extender import bind

    with lost_bind("other") as (api, state, binder, _, now):
        first = bound_cpus(api, "pinned")
        now[0] += RESERVATION_TTL + 1
        assert bind({**PINNED, "PodName": "other", "PodUID": "uid-other"}, state, binder, KEYS) == {"Error": ""}
        assert bound_cpus(api, "other") == first, "the expired room's CPUs went to another Pod"
        assert bind(PINNED, state, binder, KEYS) == {"Error": ""}
        assert api.get("pods", "default", "pinned")["spec"]["nodeName"] == "n"
        assert not bound_cpus(api, "pinned") & bound_cpus(api, "other"), "no CPU handed out twice"
        assert len(state.usage("n").bound_cpus) == 8


def test_a_lost_bind_retried_after_the_pod_was_made_again_and_bound_is_refused():
    """The fresh read finds a Pod of the same name bound to the node, but it is not the one the lost
    Binding was for (a StatefulSet's Pod made again): that is no sign the first bind happened."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, _, _now):
        again = pod("pinned", "4", "FullPCPUs", node_name="n")
        again["metadata"]["uid"] = "uid-pinned-2"
        api.put("pods", again)
        answer = bind(PINNED, state, binder, KEYS)["Error"]
        assert "PodUID uid-pinned is not the Pod's (uid-pinned-2): it was replaced" in answer


def test_a_lost_bind_retried_for_a_pod_whose_ask_changed_meanwhile_is_refused():
    """The room held is for the Pod as it asked: sent again after its binding policy changed, the
    same Binding with the old cpuset would bind it against what it now asks."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, watch, _):
        api.put("pods", pod("pinned", "4", "SpreadByPCPUs"))
        wait_for(lambda: ((watch.cached_pod("default", "pinned") or {}).get("metadata", {}).get("annotations", {})
                          .get(KEYS.cpu_bind_policy)) == "SpreadByPCPUs")
        refused = bind(PINNED, state, binder, KEYS)["Error"]
        assert "an earlier bind of it to n got no answer and may still land" in refused
        assert api.count("POST", "bindings") == 1


def test_nothing_is_resent_on_a_lost_binds_room_once_it_has_expired():
    """``ClusterState.resend``, which a retry asks before it sends a lost Binding again: the room's
    clock starts again from the retry, and a room that has expired (between the retry's first look
    and its send) is not sent on."""
    now = [1000.0]
    state = ClusterState(KEYS, clock=lambda: now[0])
    state.set_node("n", node("n"))
    demand = pod_demand(pod("pinned", "4", "FullPCPUs"), KEYS)
    state.reserve(PodRecord("uid-pinned", "n", demand, (0, 1, 8, 9), "default", "pinned", now[0]))
    state.lose_answer("uid-pinned", '{"cpuset":"0-1,8-9","numaNode":0}')
    now[0] += RESERVATION_TTL - 1
    assert state.resend("uid-pinned"), "held still: sent again, its clock started again"
    state.lose_answer("uid-pinned", '{"cpuset":"0-1,8-9","numaNode":0}')
    now[0] += RESERVATION_TTL - 1
    assert state.lost_bind("uid-pinned") is not None and state.usage("n").bound_cpus == {0, 1, 8, 9}
    now[0] += 2
    assert not state.resend("uid-pinned") and state.usage("n").bound_cpus == set()


def test_a_lost_bind_whose_room_expired_does_not_hold_a_retry_elsewhere():
    """Once the room held for a lost bind has expired, the first Binding is taken not to land: a
    retry to another node is placed, not refused as if that room were still held."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, _, now):
        now[0] += RESERVATION_TTL + 1
        assert bind({**PINNED, "Node": "m"}, state, binder, KEYS) == {"Error": ""}
        assert api.get("pods", "default", "pinned")["spec"]["nodeName"] == "m"
        assert len(state.usage("m").bound_cpus) == 4 and state.usage("n").bound_cpus == set()


def test_a_retried_lost_bind_that_cannot_read_the_pod_or_finds_it_replaced_sends_nothing():
    """kube-scheduler's retry of a lost bind reads the Pod afresh before it sends the Binding again.
    Where that read fails (the API server still failing), or the Pod is no longer the one placed
    (deleted and created again under its name, before the watch tells), nothing is sent and
    kube-scheduler is told why; the room stays held, since the first Binding may still land."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, _, _now):
        held = state.usage("n").bound_cpus
        with api.watches_paused():
            api.storms["pods"] = [500, 1]
            answer = bind(PINNED, state, binder, KEYS)["Error"]
            assert answer.startswith("cannot read pod default/pinned: "), answer
            assert api.count("POST", "bindings") == 1 and state.usage("n").bound_cpus == held

            replaced = pod("pinned", "4", "FullPCPUs")
            replaced["metadata"]["uid"] = "uid-again"
            api.put("pods", replaced)
            assert bind(PINNED, state, binder, KEYS) == {"Error": "not binding pod default/pinned: PodUID uid-pinned "
                                                                  "is not the Pod's (uid-again): it was replaced"}
            assert api.count("POST", "bindings") == 1 and state.usage("n").bound_cpus == held


def test_a_retried_lost_bind_that_fails_again_keeps_its_room_for_the_next_try():
    """The Binding sent again fails again (the API server still answering 500): either Binding
    may yet land, so the room and the cpuset stay, and the next retry binds on the same CPUs. A
    replica that stopped leading sends nothing on a retry either."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, _, _now):
        held = state.usage("n").bound_cpus
        cpuset = api.get("pods", "default", "pinned")["metadata"]["annotations"][KEYS.resource_status]
        api.storms["bindings"] = [500, 1]
        answer = bind(PINNED, state, binder, KEYS)["Error"]
        assert answer.startswith("binding default/pinned to n failed again: "), answer
        assert api.count("POST", "bindings") == 2
        assert state.lost_bind("uid-pinned") is not None and state.usage("n").bound_cpus == held

        assert bind(PINNED, state, binder, KEYS) == {"Error": ""}
        stored = api.get("pods", "default", "pinned")
        assert stored["spec"]["nodeName"] == "n" and stored["metadata"]["annotations"][KEYS.resource_status] == cpuset
        assert state.usage("n").bound_cpus == held

    with lost_bind() as (api, state, binder, _, _now):
        assert bind(PINNED, state, binder, KEYS, leading=lambda: False) == {
            "Error": "not binding pod default/pinned: this extender replica stopped leading mid-bind"}
        assert api.count("POST", "bindings") == 1 and not api.get("pods", "default", "pinned")["spec"].get("nodeName")


def test_a_second_bind_of_a_pod_bound_before_the_watch_shows_it_is_refused_and_changes_nothing():
    """kube-scheduler may ask again for a Pod whose bind succeeded (its own request timed out) before
    the extender's watch shows the Pod bound: the Pod is refused as bound, no second cpuset is
    written over the first, and its room stays held once."""
    from scheduler.extender import bind

    with bind_setup() as (api, state, binder, _watch, _now), api.watches_paused():
        assert bind(PINNED, state, binder, KEYS) == {"Error": ""}
        first = bound_cpus(api, "pinned")
        assert bind(PINNED, state, binder, KEYS) == {"Error": "pod default/pinned is already bound"}
        assert api.count("POST", "bindings") == 1 and api.count("PATCH", "pods") == 1
        assert bound_cpus(api, "pinned") == first == state.usage("n").bound_cpus


def test_a_retried_lost_bind_on_a_replica_that_stops_leading_keeps_the_room_for_the_first_binding():
    """The first Binding got no answer and may still land on its CPUs: a retry that finds this
    replica no longer leading sends nothing and keeps that room held (a first bind gives it back,
    as nothing of it was sent). Leading again, the next retry sends the same Binding."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, _, _now):
        held = state.usage("n").bound_cpus
        answer = bind(PINNED, state, binder, KEYS, leading=lambda: False)
        assert answer == {"Error": "not binding pod default/pinned: this extender replica stopped leading mid-bind"}
        assert api.count("POST", "bindings") == 1 and state.usage("n").bound_cpus == held
        assert bind(PINNED, state, binder, KEYS) == {"Error": ""}
        assert api.get("pods", "default", "pinned")["spec"]["nodeName"] == "n" and bound_cpus(api, "pinned") == held


def test_a_lost_binds_room_that_expires_while_the_retry_reads_the_pod_sends_nothing(caplog):
    """The retry's fresh read of the Pod takes longer than the room is still held (an overloaded API
    server): those CPUs may be handed out by then, so the Binding is not sent on them."""
    from scheduler.extender import bind

    with lost_bind() as (api, state, binder, _, now):

        class SlowFreshRead:
            """The binder, its fresh read of a Pod answered after the room has expired."""

            def pod(self, namespace: str, name: str, fresh: bool = False) -> dict:
                if fresh:
                    now[0] += RESERVATION_TTL + 1
                return binder.pod(namespace, name, fresh=fresh)

            def __getattr__(self, attribute: str) -> Any:
                return getattr(binder, attribute)

        answer = bind(PINNED, state, SlowFreshRead(), KEYS)["Error"]
        assert answer == ("not binding pod default/pinned: the room held for its earlier bind has just expired; "
                          "kube-scheduler's next try places it afresh")
        assert api.count("POST", "bindings") == 1 and api.count("PATCH", "pods") == 1
        assert state.usage("n").bound_cpus == set()
        with caplog.at_level(logging.INFO, logger="scheduler.extender"):
            assert bind(PINNED, state, binder, KEYS) == {"Error": ""}
        assert "bound default/pinned to n with cpuset 0-1,8-9" in caplog.text


def test_a_bind_whose_cpuset_cannot_be_written_sends_no_binding_and_gives_its_room_back():
    """The cpuset goes on the Pod before its Binding. Where that write fails, no Binding was sent,
    so nothing may land: the room is given back at once, and the retry is placed afresh."""
    from scheduler.extender import bind

    with bind_setup() as (api, state, binder, _watch, _now):
        api.storms["pods"] = [500, 1]
        answer = bind(PINNED, state, binder, KEYS)["Error"]
        assert answer.startswith("binding default/pinned to n failed: "), answer
        assert api.count("POST", "bindings") == 0 and state.usage("n").bound_cpus == set()
        assert state.lost_bind("uid-pinned") is None
        assert bind(PINNED, state, binder, KEYS) == {"Error": ""}
        assert api.get("pods", "default", "pinned")["spec"]["nodeName"] == "n"


def test_a_bind_without_a_pod_uid_takes_the_pods_own():
    """``PodUID`` may be left out of ExtenderBindingArgs (the protocol reads it as empty): each Pod
    is then held and bound under the UID its own object carries."""
    from scheduler.extender import bind

    with bind_setup(pods=("a", "b")) as (api, state, binder, _watch, _now):
        for name in ("a", "b"):
            assert bind({"PodName": name, "PodNamespace": "default", "PodUID": "", "Node": "n"},
                        state, binder, KEYS) == {"Error": ""}
            assert state.is_bound(f"uid-{name}")
        assert not bound_cpus(api, "a") & bound_cpus(api, "b") and len(state.usage("n").bound_cpus) == 8


def test_a_pod_asking_a_fractional_cpu_with_a_bind_policy_is_bound_shared_without_a_cpuset():
    """Exclusive CPUs are whole ones: a Pod asking 2500m under FullPCPUs (say, compressed on a node
    whose label requires binding) runs in the shared pool and is counted there by its request."""
    from scheduler.extender import bind

    with bind_setup(pods=()) as (api, state, binder, watch, _now):
        api.put("pods", pod("half", "2500m", "FullPCPUs"))
        wait_for(lambda: watch.cached_pod("default", "half") is not None)
        assert bind({**PINNED, "PodName": "half", "PodUID": "uid-half"}, state, binder, KEYS) == {"Error": ""}
        stored = api.get("pods", "default", "half")
        assert stored["spec"]["nodeName"] == "n" and KEYS.resource_status not in stored["metadata"]["annotations"]
        assert state.usage("n").bound_cpus == set() and state.usage("n").shared["cpu"] == 2500


def test_a_node_labelled_single_numa_node_keeps_each_cpuset_bound_there_in_one_numa_node():
    """The node label ``numa-topology-policy: single-numa-node`` asks one NUMA node of every Pod bound
    there, though the Pod does not ask it. With 6 CPUs left in one zone and 8 in the other, 8 CPUs
    come from the other zone there; on a node without the label they fill the fuller zone first,
    unless the Pod asks one NUMA node itself."""
    from scheduler.extender import bind

    with bind_setup(nodes=("m", "o"), pods=()) as (api, state, binder, watch, _now):
        api.put("nodes", node("n", labels={KEYS.numa_topology_policy: "single-numa-node"}))
        for name, cpus in (("a-n", "2"), ("b-n", "8"), ("a-m", "2"), ("b-m", "8"), ("a-o", "2"), ("b-o", "8")):
            api.put("pods", pod(name, cpus, "FullPCPUs", single_numa=name == "b-o"))
        wait_for(lambda: "n" in state.nodes and watch.cached_pod("default", "b-o") is not None)
        for name in ("a-n", "b-n", "a-m", "b-m", "a-o", "b-o"):
            assert bind({**PINNED, "PodName": name, "PodUID": f"uid-{name}", "Node": name[-1]},
                        state, binder, KEYS) == {"Error": ""}
        zone_0 = {0, 1, 2, 3, 8, 9, 10, 11}  # topology_json: socket 0's cores, both threads
        assert len({cpu in zone_0 for cpu in bound_cpus(api, "b-n")}) == 1, "one NUMA node"
        assert len({cpu in zone_0 for cpu in bound_cpus(api, "b-m")}) == 2, "without the label: both"
        assert len({cpu in zone_0 for cpu in bound_cpus(api, "b-o")}) == 1, "the Pod's own annotation: one"
        assert not bound_cpus(api, "a-n") & bound_cpus(api, "b-n")


def test_a_retried_bind_finds_the_bind_whose_answer_was_lost_happened(caplog):
    """The API server stored the Binding but its answer came too late. kube-scheduler's retry, before
    the watch shows the Pod bound, reads the Pod afresh and is answered that the bind happened: no
    second Binding is sent, and the room is held until the watch shows the Pod."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))
    api.put("pods", pod("pinned", "4", "FullPCPUs"))
    now = [1000.0]
    state = ClusterState(KEYS, clock=lambda: now[0])
    with watched(api, state) as (api_client, watch), api.watches_paused():
        api.slow_writes["bindings"] = 2.0
        assert bind(PINNED, state, KubeBinder(api_client, watch, timeout=0.5), KEYS)["Error"]
        api.slow_writes.clear()
        held = state.usage("n").bound_cpus
        with caplog.at_level(logging.INFO, logger="scheduler.extender"):
            assert bind(PINNED, state, KubeBinder(api_client, watch, timeout=5), KEYS) == {"Error": ""}
        assert api.count("POST", "bindings") == 1
        assert "bind of default/pinned to n had happened: its answer was lost" in caplog.text
        now[0] += RESERVATION_TTL + 1
        assert state.usage("n").bound_cpus == held and len(held) == 4


def test_a_bind_answers_within_its_deadline_however_slow_the_api_server():
    """kube-scheduler waits for a bind's answer only its httpTimeout. The Pod's cpuset and its
    Binding share one deadline: each answered late, the bind still answers when its time is up,
    not after the two requests' timeouts added up. The Binding sent holds its room (it may land)."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))
    api.put("pods", pod("pinned", "4", "FullPCPUs"))
    state = ClusterState(KEYS)
    with watched(api, state) as (api_client, watch), api.watches_paused():
        api.slow_writes.update(pods=2.0, bindings=3.0)
        started = time.monotonic()
        answer = bind(PINNED, state, KubeBinder(api_client, watch).within(3.0), KEYS)
        took = time.monotonic() - started
        assert answer["Error"].startswith("binding default/pinned to n failed: ")
        assert 2.9 < took < 4.0, f"{took:.1f} s: answered at the deadline, not after 2 + 3 s"
        assert api.count("POST", "bindings") == 1
        assert len(state.usage("n").bound_cpus) == 4, "the Binding sent may land: its room stays held"


def test_a_bind_whose_time_is_up_sends_no_binding_and_holds_no_room():
    """With nothing left of the bind's time, the Binding is not sent, and the bind says so. Not
    sent, it cannot land: kube-scheduler's retry may take the Pod to another node at once."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))
    api.put("nodes", node("m"))
    api.put("pods", pod("web", "2"))
    state = ClusterState(KEYS)
    web = {"PodName": "web", "PodNamespace": "default", "PodUID": "uid-web"}
    with watched(api, state) as (api_client, watch):
        binder = KubeBinder(api_client, watch)
        assert bind({**web, "Node": "n"}, state, binder.within(0.0), KEYS) == {
            "Error": "binding default/web to n failed: not sent: the bind's 0 s were up"}
        assert api.count("POST", "bindings") == 0
        assert bind({**web, "Node": "m"}, state, binder.within(5.0), KEYS) == {"Error": ""}
        assert api.get("pods", "default", "web")["spec"]["nodeName"] == "m"


def test_an_extender_that_has_not_polled_exports_no_node_without_fresh_metrics():
    """Before the first metrics poll (and with load-aware placement off, when none comes), each
    reason reads 0: the dashboard's panel shows 0 rather than no data, and the alert's sum has
    its series."""
    from scheduler.app import ExtenderMetrics

    exported = {tuple(sample.labels.values()): sample.value for family in ExtenderMetrics().registry.collect()
                for sample in family.samples if sample.name == "oversale_extender_nodes_without_fresh_metrics"}
    assert exported == {("missing",): 0.0, ("old",): 0.0}


def test_the_bind_route_answers_within_the_bind_timeout_setting():
    """``OVERSALE_EXTENDER_BIND_TIMEOUT`` is the time the route gives one bind."""
    from scheduler.app import create_app
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    api.put("nodes", node("n"))
    api.put("pods", pod("web", "2"))
    state = ClusterState(KEYS)
    settings = Settings.from_env({"OVERSALE_EXTENDER_BIND_TIMEOUT": "1"})
    with watched(api, state) as (api_client, watch):
        app = create_app(settings, state, KubeBinder(api_client, watch)).test_client()
        api.slow_writes["bindings"] = 3.0
        started = time.monotonic()
        answer = app.post("/bind", json={"PodName": "web", "PodNamespace": "default", "PodUID": "uid-web",
                                         "Node": "n"}).get_json()
        took = time.monotonic() - started
        assert answer["Error"].startswith("binding default/web to n failed: ")
        assert took < 2.5, f"{took:.1f} s: the Binding's answer came after 3 s"


def test_a_cpuset_left_by_an_earlier_bind_that_failed_is_cleared_at_a_shared_bind():
    """A bind that failed leaves its cpuset on the Pod (it counts for no one while the Pod is not
    bound). If kube-scheduler then binds the Pod to a node that gives it no exclusive CPUs, that
    cpuset is taken off first: bound with it, the Pod would be read as holding those CPUs there."""
    from scheduler.extender import bind
    from scheduler.kube import KubeBinder

    api = FakeKubeAPI().start()
    api.put("nodes", node("plain"))
    left = pod("web", "2", annotations={KEYS.resource_status: json.dumps({"cpuset": "0-3", "numaNode": 0})})
    api.put("pods", left)
    state = ClusterState(KEYS)
    with watched(api, state) as (api_client, watch):
        assert bind({"PodName": "web", "PodNamespace": "default", "PodUID": "uid-web", "Node": "plain"},
                    state, KubeBinder(api_client, watch), KEYS) == {"Error": ""}
        stored = api.get("pods", "default", "web")
        assert stored["spec"]["nodeName"] == "plain"
        assert KEYS.resource_status not in (stored["metadata"].get("annotations") or {})
        wait_for(lambda: watch.cached_pod("default", "web") is None)
        assert state.usage("plain").bound_cpus == set() and state.usage("plain").shared["cpu"] == 2000


def test_a_new_leaders_relist_never_takes_the_cache_back_in_time():
    """A new leader lists Pods again before it serves. On a large cluster that list takes seconds,
    and the watch goes on applying events meanwhile: a Pod bound while the list was in flight must
    stay counted on its node when the (older) list lands, or the CPUs it holds are handed out again."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    api.put("pods", pod("running", "2", node_name="node-0"))
    api.put("pods", pod("pending", "1"))
    state = ClusterState(KEYS)
    with watched(api, state) as (_, watch):
        assert state.usage("node-0").shared["cpu"] == 2000
        api.held_lists["pods"] = answered = threading.Event()
        resync = threading.Thread(target=watch.resync)
        resync.start()
        wait_for(lambda: "pods" in api.lists_held)  # its snapshot has "pending" unbound
        api.put("pods", pod("pending", "1", node_name="node-0"))
        wait_for(lambda: state.usage("node-0").shared["cpu"] == 3000)  # the watch's event
        answered.set()
        resync.join(10)
        assert not resync.is_alive()
        assert state.usage("node-0").shared["cpu"] == 3000
        assert watch.cached_pod("default", "pending") is None
        # Later events still apply on top.
        api.put("pods", pod("late", "1", node_name="node-0"))
        wait_for(lambda: state.usage("node-0").shared["cpu"] == 4000)


def test_watch_events_a_resync_has_listed_already_never_take_the_cache_back_in_time():
    """The other half of a new leader's relist: the watch lags behind (its events held back) while
    the list reads the newer objects. When the lagging events arrive they are older than the cache,
    and applying them would show the Pod, for a moment, as it was: unbound, its node's room free."""
    from kubernetes import client

    from kube.reflector import Reflector

    api = FakeKubeAPI().start()
    api.put("pods", pod("web", "1"))
    seen: list[str | None] = []
    api_client = client.ApiClient(client.Configuration(host=api.url))
    reflector = Reflector("pods", client.CoreV1Api(api_client).list_pod_for_all_namespaces, lambda obj: obj, 300,
                          on_change=lambda namespace, name, node: seen.append(node),
                          digest=lambda obj: obj["spec"].get("nodeName"))
    reflector.start()
    try:
        wait_for(reflector.synced.is_set)
        assert seen == [None]
        with api.watches_paused():
            api.put("pods", pod("web", "1", node_name="node-0"))
            api.put("pods", pod("web", "1", node_name="node-1"))
            reflector.resync()
            assert seen == [None, "node-1"]
        api.put("pods", pod("web", "1", node_name="node-2"))  # the watch is past the held events once it shows this
        wait_for(lambda: seen[-1] == "node-2")
        assert seen == [None, "node-1", "node-2"], "node-0 and node-1 were older than the relist"
    finally:
        reflector.stop()
        api.stop()


@pytest.mark.parametrize(("refused", "said"), [
    ("unavailable", "HTTP 503 Service Unavailable"),
    # A Role without the permission: RBAC's own words say which (and for whom).
    ("rbac", 'HTTP 403 Forbidden: pods is forbidden: User "system:serviceaccount:oversale:oversale" cannot list '
             'resource "pods"'),
])
def test_a_cache_that_cannot_list_says_so_in_one_line_when_it_starts_and_when_it_ends(caplog, refused, said):
    """A list retried with a backoff of up to 30 s while the API server is down or refuses it: 120
    warnings an hour a cache, each the client's whole answer over several lines, before. One short
    line now when it starts, one when the cache is listed again."""
    from kubernetes import client

    from kube.reflector import Reflector

    api = FakeKubeAPI().start()
    api.put("pods", pod("web", "1"))
    if refused == "rbac":
        api.storms["pods"] = [403, 3]
    else:
        api.unavailable = {"pods"}
    api_client = client.ApiClient(client.Configuration(host=api.url))
    reflector = Reflector("pods", client.CoreV1Api(api_client).list_pod_for_all_namespaces, lambda obj: obj, 300)
    with caplog.at_level("INFO", logger="kube.reflector"):
        reflector.start()
        try:
            # The double counts a request before it answers it: the 4th list is sent only once the
            # 3rd was answered, so at least 3 failed however soon the outage ends after it.
            wait_for(lambda: api.count("GET", "pods", watch=False) >= 4)
            api.unavailable = set()
            wait_for(reflector.synced.is_set, timeout=30)
        finally:
            reflector.stop()
            api.stop()
    told = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" or "again" in r.getMessage()]
    assert told[0] == f"pods list failed ({said}); retrying with a backoff of up to 30s"
    assert len(told) == 2 and re.fullmatch(r"pods listed again \(after [3-9] failed runs\)", told[1]), told


def test_the_pod_cache_keeps_only_pods_bind_may_be_asked_for():
    """A bound Pod counts as its record in the state; its whole object is not kept (on a large
    cluster, every Pod's object was most of the extender's memory: bench.extender_memory)."""
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    api.put("pods", pod("running", "2", node_name="node-0"))
    # As the API server sends it: with each writer's managedFields, which nothing reads.
    tracked = pod("pending", "1")
    tracked["metadata"]["managedFields"] = [{"manager": "kube-controller-manager", "operation": "Update",
                                             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
    api.put("pods", tracked)
    state = ClusterState(KEYS)
    with watched(api, state) as (_, watch):
        cached = watch.cached_pod("default", "pending")
        assert cached["metadata"]["name"] == "pending" and "managedFields" not in cached["metadata"]
        assert cached["spec"] == api.get("pods", "default", "pending")["spec"]
        api.put("pods", {**tracked, "metadata": {**tracked["metadata"], "labels": {"changed": "yes"}}})
        wait_for(lambda: watch.cached_pod("default", "pending")["metadata"].get("labels") == {"changed": "yes"})
        assert "managedFields" not in watch.cached_pod("default", "pending")["metadata"]
        assert watch.cached_pod("default", "running") is None
        assert state.usage("node-0").shared["cpu"] == 2000
        # Bound (the watch shows its nodeName): out of the cache, counted on its node.
        api.put("pods", pod("pending", "1", node_name="node-0"))
        wait_for(lambda: state.usage("node-0").shared["cpu"] == 3000)
        assert watch.cached_pod("default", "pending") is None


# -- the state's bookkeeping, driven as its watches and binder drive it ------------------------
def bound_facts(name: str, node_name: str, cpu: str = "1"):
    return pod_facts(pod(name, cpu, node_name=node_name), KEYS)


def held_on(state: ClusterState, node_name: str) -> set[str]:
    return {held.uid for held in state.held_pods(node_name)}


def test_a_bind_that_never_answered_holds_its_room_for_the_reservation_ttl_and_no_longer():
    now = [0.0]
    state = ClusterState(KEYS, clock=lambda: now[0])
    state.reserve(bound_facts("p", "n").record)
    assert state.lost_bind("uid-p") is None and not state.resend("uid-p"), "its answer is not lost: nothing to resend"
    now[0] = RESERVATION_TTL
    assert held_on(state, "n") == {"uid-p"}
    now[0] = RESERVATION_TTL + 0.001
    assert state.usage("n").shared == {}, "what the node's Pods take counts it no more"
    assert held_on(state, "n") == set() and not state.is_bound("uid-p")


def test_a_lost_bind_sent_again_is_in_flight_once_more_timed_from_the_resend():
    now = [0.0]
    state = ClusterState(KEYS, clock=lambda: now[0])
    state.reserve(bound_facts("p", "n").record)
    state.lose_answer("uid-p", '{"cpuset":"0-1"}')
    lost = state.lost_bind("uid-p")
    assert lost is not None and lost.status == '{"cpuset":"0-1"}'
    now[0] = 100.0
    assert state.resend("uid-p")
    assert state.lost_bind("uid-p") is None and not state.resend("uid-p"), "in flight again, not lost"
    now[0] = 100.0 + RESERVATION_TTL
    assert held_on(state, "n") == {"uid-p"}
    now[0] += 1
    assert held_on(state, "n") == set()


def test_a_nodes_topology_object_reshapes_its_view_and_a_deleted_node_stays_deleted():
    state = ClusterState(KEYS)
    plain = node("n")
    del plain["metadata"]["annotations"][KEYS.cpu_topology]  # only a NodeResourceTopology tells its zones
    state.set_node("n", plain)
    assert {cpu.node for cpu in state.nodes["n"].topology.cpus} == {0}
    state.set_topology("n", {0: 8, 1: 8})
    assert {cpu.node for cpu in state.nodes["n"].topology.cpus} == {0, 1}
    # A node sent in full (nodeCacheCapable false) is read with the zones known for its name.
    assert {cpu.node for cpu in state.view_of(plain).topology.cpus} == {0, 1}
    assert state.view_of({"status": plain["status"]}).name == ""
    state.set_topology("n", None)
    assert state.nrt == {} and {cpu.node for cpu in state.nodes["n"].topology.cpus} == {0}
    state.set_topology("n", {0: 8, 1: 8})
    state.reset_topologies()
    assert state.nrt == {} and {cpu.node for cpu in state.nodes["n"].topology.cpus} == {0}
    state.set_node("n", None)
    state.set_topology("n", {0: 8, 1: 8})  # its topology object outlives the Node for a moment
    assert state.node_names() == []
    state.set_node("m", plain)
    state.reset_nodes()
    assert state.node_names() == []


def test_a_pod_moved_deleted_or_rejected_gives_its_room_back():
    state = ClusterState(KEYS)
    state.set_pod("uid-p", bound_facts("p", "a"))
    state.set_pod("uid-p", bound_facts("p", "b"))
    assert (held_on(state, "a"), held_on(state, "b")) == (set(), {"uid-p"})
    for name in ("q", "r", "s"):
        state.reserve(bound_facts(name, "a").record)
    state.set_pod("uid-q", None)  # deleted before the watch ever showed it bound
    rejected = pod("r", "1")
    rejected["status"]["phase"] = "Failed"
    state.set_pod("uid-r", pod_facts(rejected, KEYS))
    state.set_pod("uid-s", pod_facts(pod("s", "1"), KEYS))  # its bind has not shown in the watch yet
    assert held_on(state, "a") == {"uid-s"}


def test_nominated_pods_are_counted_on_the_node_they_wait_for_and_once():
    state = ClusterState(KEYS)

    def nominated(name: str, node_name: str) -> dict:
        waiting = pod(name, "1")
        waiting["status"]["nominatedNodeName"] = node_name
        return waiting

    for name in ("n1", "n2"):
        state.set_pod(f"uid-{name}", pod_facts(nominated(name, "a"), KEYS))
    assert {node_name: [d.uid for d in demands] for node_name, demands in state.nominations().items()} == {
        "a": ["uid-n1", "uid-n2"]}
    state.set_pod("uid-n1", pod_facts(nominated("n1", "b"), KEYS))
    assert {node_name: [d.uid for d in demands] for node_name, demands in state.nominations().items()} == {
        "a": ["uid-n2"], "b": ["uid-n1"]}
    state.reserve(bound_facts("n2", "a").record)  # this extender binds it: its reservation counts it
    assert list(state.nominations()) == ["b"] and state.nominated_on("a") == []
    state.set_pod("uid-n1", None)
    state.set_pod("uid-n2", None)
    assert state.nominations() == {}


def test_a_relist_forgets_the_pods_it_does_not_show_and_expires_their_binds():
    now = [0.0]
    state = ClusterState(KEYS, clock=lambda: now[0])
    state.set_node("a", node("a"))
    state.set_pod("uid-p", bound_facts("p", "a", "2"))
    state.reserve(bound_facts("q", "a").record)  # a bind that has not answered
    state.reserve(bound_facts("r", "a").record)
    state.confirm("uid-r")  # the API server took it; the watch has not shown it
    assert state.usage("a").shared["cpu"] == 4000
    now[0] = 10.0
    state.reset_pods()
    assert held_on(state, "a") == {"uid-q", "uid-r"} and state.usage("a").shared["cpu"] == 2000
    assert not state.is_bound("uid-p"), "deleted while the watch was away"
    now[0] = RESERVATION_TTL + 5  # q's bind began at 0; r went unlisted at 10
    assert held_on(state, "a") == {"uid-r"}
    now[0] = 10.0 + RESERVATION_TTL + 0.001
    assert held_on(state, "a") == set()


def test_a_deleted_disruption_budget_is_forgotten():
    state = ClusterState(KEYS)
    budget = DisruptionBudget("default", {"matchLabels": {"app": "web"}}, 1)
    state.set_budget("default", "web", budget)
    state.set_budget("default", "db", DisruptionBudget("default", {"matchLabels": {"app": "db"}}, 0))
    state.set_budget("default", "db", None)
    assert state.budgets() == [budget]
    state.reset_budgets()
    assert state.budgets() == []


def test_a_pods_reading_counts_as_measured_only_if_first_seen_since_its_bind():
    record = replace(bound_facts("p", "n").record, bound_at=100.0)
    assert measured(record, {}) is False
    assert measured(record, {("default", "p"): None}) is True, "unstamped: taken as this Pod's"
    assert measured(record, {("default", "p"): 100.0}) is True
    assert measured(record, {("default", "p"): 99.0}) is False, "its predecessor's under the same name"
    assert measured(replace(record, bound_at=None), {("default", "p"): 99.0}) is True, "bound long ago"


def test_what_the_state_keeps_of_a_pod_or_node_missing_its_parts():
    assert scheduling_part({"metadata": None, "status": None}) == {"metadata": {}, "status": {}}
    assert pod_facts({"metadata": None, "spec": None, "status": None}, KEYS) == PodFacts("", False, None)
    finished = pod("p", "1", node_name="a")
    finished["status"]["phase"] = "Succeeded"
    assert pod_facts(finished, KEYS) == PodFacts("uid-p", True, None), "a finished Pod holds nothing"
    for nominated in ("", 5):
        odd = pod("p", "1")
        odd["status"]["nominatedNodeName"] = nominated
        assert pod_facts(odd, KEYS) == PodFacts("uid-p", False, None)
    waiting = pod("p", "1")
    waiting["status"]["nominatedNodeName"] = "a"
    facts = pod_facts(waiting, KEYS)
    assert (facts.terminal, facts.record, facts.nominated.node if facts.nominated else None) == (False, None, "a")


def test_a_bound_pods_record_keeps_its_labels_and_its_scheduling_time():
    bound = pod("p", "1", node_name="a")
    bound["metadata"]["labels"] = {"app": "web"}
    bound["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:05:00Z"},
        {"type": "PodScheduled", "status": "False", "lastTransitionTime": "2026-12-01T09:59:00Z"},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"}]
    facts = pod_facts(bound, KEYS)
    assert facts.terminal is False and facts.record is not None
    assert (dict(facts.record.labels), facts.record.bound_at) == (
        {"app": "web"}, datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp())
    bound["metadata"]["labels"] = "app=web"  # not a map: no labels, so no budget covers it
    bound["status"] = None
    record = pod_facts(bound, KEYS).record
    assert record is not None and (dict(record.labels), record.bound_at) == ({}, None)


def test_a_poll_keeps_every_new_reading_and_forgets_nodes_gone_from_the_cluster():
    now = [1000.0]
    state = ClusterState(KEYS, wall=lambda: now[0])
    state.set_node("a", node("a"))
    state.record_node_samples({"a": Sample(1000.0, 1000, 8 << 30), "gone": Sample(1000.0, 1000, 8 << 30),
                               "late": Sample(1000.0, 1000, 8 << 30)})
    now[0] = 1030.0  # a's reading is the one it had; b's is new
    state.record_node_samples({"a": Sample(1000.0, 1000, 8 << 30), "b": Sample(1030.0, 2000, 8 << 30)})
    assert state.heats(["b"])[0].load is not None, "a repeated reading before it does not stop the poll"
    now[0] = 1000.0 + state.load_config.peak_seconds + 1
    state.record_node_samples({"late": Sample(now[0], 3000, 8 << 30)})
    assert state.heats(["gone"])[0].load is None, "not in the cluster, not polled, its last reading out of the window"
    assert state.heats(["a"])[0].load is not None, "a node still in the cluster keeps its windows"
    assert state.heats(["late"])[0].load is not None


def rows_of(table, slots) -> list:
    """What filter and prioritize read of each row: its (view, usage, load facts), and its
    columns (a row without load facts keeps stale load columns nobody reads)."""
    columns = [name for name, value in vars(table).items() if hasattr(value, "dtype")]
    loaded = {"cpu_used", "memory_used", "real_cpu", "real_memory"}
    rows = []
    for slot in slots.tolist():
        row = table.row(slot)
        read = columns if row[2] is not None else [column for column in columns if column not in loaded]
        rows.append((row, {column: getattr(table, column)[slot].item() for column in read}))
    return rows


def test_the_cached_node_table_agrees_with_one_built_afresh_after_every_change():
    """The table filter and prioritize read is kept up to date row by row (a poll or a bind must
    not rebuild 5,000 rows): after each kind of event, its rows are those the state's own facts
    give when built from nothing, as they are for nodes sent in full."""
    now = [1000.0]
    state = ClusterState(KEYS, clock=lambda: now[0], wall=lambda: now[0])
    names = ["a", "b", "c"]

    def settling(name: str, node_name: str, cpu: str = "2") -> PodFacts:
        facts = bound_facts(name, node_name, cpu)
        assert facts.record is not None
        return replace(facts, record=replace(facts.record, bound_at=now[0]))

    def check(step: str) -> None:
        known = [name for name in names if name in state.nodes]
        cached, slots, unknown = state.table(names)
        fresh, fresh_slots = state.table_of([(name, state.nodes[name]) for name in known])
        assert unknown == [name for name in names if name not in known], step
        assert rows_of(cached, slots) == rows_of(fresh, fresh_slots), step

    plain = node("a")
    del plain["metadata"]["annotations"][KEYS.cpu_topology]  # only a NodeResourceTopology tells its zones
    state.set_node("a", plain)
    state.set_node("b", node("b"))
    state.set_node("c", node("c"))
    check("nodes listed")
    state.set_topology("a", {0: 8, 1: 8})
    check("a's NodeResourceTopology arrived")
    state.set_pod("uid-p", settling("p", "b"))
    state.set_pod("uid-q", bound_facts("q", "c", "3"))
    check("Pods bound, p still settling")
    state.reserve(bound_facts("r", "a", "4").record)
    check("a bind in flight")
    state.set_pod("uid-s", bound_facts("s", "new"))
    check("a Pod on a node the Node watch has not shown yet")
    state.record_node_samples({name: Sample(now[0], 4000, 8 << 30) for name in names})
    check("a metrics poll")
    state.record_history_peaks({"a": 15000.0}, now[0])
    check("a history read raised a's maximum")
    state.record_pods_in_metrics({("default", "p"): (500.0, 2.0**28)})
    check("p is in the metrics: no longer pending")
    state.reset_pods()
    state.set_pod("uid-q", bound_facts("q", "c", "3"))
    check("a relist that no longer shows p")
    now[0] += RESERVATION_TTL + 1
    check("r's bind never answered: its reservation expired")
    state.set_node("b", None)
    check("b deleted")


def test_a_node_deleted_and_made_again_within_the_window_keeps_its_readings_and_maximum():
    """A node can be deleted and registered again under its name (some clouds do on a reboot, a
    kubelet with a wiped registration does): its last hour did not go away with the object."""
    now = [1000.0]
    config = LoadConfig(history_max_age_seconds=900)
    state = ClusterState(KEYS, load_config=config, wall=lambda: now[0])
    state.set_node("a", node("a"))
    state.record_node_samples({"a": Sample(now[0], 9000, 8 << 30)})
    state.record_history_peaks({"a": 15000.0}, now[0])
    state.set_node("a", None)
    now[0] = 1030.0
    state.record_node_samples({"other": Sample(now[0], 1000, 8 << 30)})  # a is polled no more
    state.record_history_peaks({"other": 2000.0}, now[0])
    state.set_node("a", node("a"))
    now[0] = 1060.0
    state.record_node_samples({"a": Sample(now[0], 1000, 8 << 30)})
    load = state.heats(["a"])[0].load
    assert load is not None and load.cpu_average == 5000.0, "its reading from before the deletion still counts"
    assert load.cpu_peak == 15000.0, "and so does its maximum from the history, not yet too old"


def test_a_workloads_window_starts_over_when_the_wall_clock_steps_back():
    """Readings are timed by the extender's wall clock, which NTP may step back: a window whose
    newest time is ahead of now would be bisected out of order, so it starts over."""
    now = [1000.0]
    state = ClusterState(KEYS, wall=lambda: now[0])
    state.set_pod("uid-web-5d8f9-x1", pod_facts(replica("web-5d8f9-x1", "5d8f9", "4", node_name="node-1"), KEYS))
    new_replica = pod_demand(replica("web-7c9b4-y1", "7c9b4", "4"), KEYS)
    for at, cpu in ((1000.0, 1000.0), (1060.0, 3000.0)):
        now[0] = at
        state.record_pods_in_metrics({("default", "web-5d8f9-x1"): (cpu, 2.0**28)})
    assert state.estimate_for(new_replica)["cpu"] == 2000.0
    now[0] = 1030.0
    state.record_pods_in_metrics({("default", "web-5d8f9-x1"): (500.0, 2.0**28)})
    assert state.estimate_for(new_replica)["cpu"] == 500.0, "stepped back: only the reading since"
    state.record_pods_in_metrics({("default", "web-5d8f9-x1"): (700.0, 2.0**28)})
    assert state.estimate_for(new_replica)["cpu"] == 700.0, "a second reading at the same instant replaces it"
