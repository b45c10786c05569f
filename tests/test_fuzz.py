"""Hostile input is harmless: generated bodies through the real servers (the webhook over TLS,
the extender over HTTP). Every answer is well-formed JSON, never a 5xx, and fast; every patch the
webhook returns applies to the object it was given and leaves quantities the API server accepts.
Hostile values of our own annotations go through every planning function of the core too.

``make test`` runs OVERSALE_FUZZ_EXAMPLES (default 200) cases per endpoint; docs/security.md gives
the figures of a long run (10,000 per endpoint).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity

from tests.conftest import RunningWebhook
from tests.kube_api import FakeKubeAPI
from tests.test_scheduler import Extender, node

EXAMPLES = int(os.environ.get("OVERSALE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
PREFIX = "stke.platform"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30)
quantities = st.one_of(st.sampled_from(["1", "100m", "0", "-1", "1e3", "1Ei", "999999999999999", "0.5", "1.5Gi",
                                        "abc", "", "1k", "3.000000001"]),
                       st.text(max_size=8), st.integers(-10**12, 10**12), st.floats(allow_nan=False))
annotation_values = st.one_of(st.sampled_from(["2", "0.5", "0", "-1", "1e9", "NaN", "inf", "y", "n", "{}", "[]"]),
                              st.text(max_size=20))


@st.composite
def containers(draw: Any, name: str) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    for part in ("requests", "limits"):
        if draw(st.booleans()):
            resources[part] = {r: draw(quantities) for r in draw(st.sets(st.sampled_from(["cpu", "memory", "gpu"])))}
    container: dict[str, Any] = {"name": draw(st.one_of(st.just(name), st.text(max_size=12))), "image": "x",
                                 "resources": draw(st.one_of(st.just(resources), json_values))}
    if draw(st.booleans()):
        container["restartPolicy"] = draw(st.sampled_from(["Always", "Never", "x"]))
    return container


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    keys = [f"{PREFIX}/cpu-requests-ratio", f"{PREFIX}/memory-requests-ratio", f"{PREFIX}/enable-resource-compress",
            f"{PREFIX}/original-requests", f"{PREFIX}/written-requests"]
    annotations = draw(st.dictionaries(st.sampled_from(keys) | st.text(max_size=15), annotation_values, max_size=4))
    spec: dict[str, Any] = {"containers": [draw(containers(f"c{i}")) for i in range(draw(st.integers(0, 4)))]}
    if draw(st.booleans()):
        spec["initContainers"] = [draw(containers(f"i{i}")) for i in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        spec["resources"] = {"requests": {"cpu": draw(quantities)}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": draw(st.text(max_size=20)), "namespace": "ns",
                                                           "annotations": annotations}, "spec": spec}
    return draw(st.one_of(st.just(pod), st.just({**pod, "spec": draw(json_values)})))


@st.composite
def nodes(draw: Any) -> dict[str, Any]:
    annotations = draw(st.dictionaries(
        st.sampled_from([f"{PREFIX}/cpu-oversale-ratio", f"{PREFIX}/memory-oversale-ratio", f"{PREFIX}/mutate",
                         f"{PREFIX}/real-allocatable", f"{PREFIX}/applied-oversale-ratio"]),
        annotation_values | st.just('{"cpu": "4", "memory": "8Gi"}'), max_size=4))
    status = {part: {r: draw(quantities) for r in draw(st.sets(st.sampled_from(["cpu", "memory", "pods"])))}
              for part in ("allocatable", "capacity")}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "labels": {f"{PREFIX}/oversale": "enabled"}, "annotations": annotations},
            "status": draw(st.one_of(st.just(status), json_values))}


def review(resource: str, kind: str, obj: Any, old: Any, operation: str, sub: str | None) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": "fuzz", "kind": {"group": "", "version": "v1", "kind": kind},
                               "resource": {"group": "", "version": "v1", "resource": resource},
                               "operation": operation, "namespace": "ns", "object": obj, "oldObject": old,
                               "userInfo": {"username": "system:node:n1"}}
    if sub:
        request["subResource"] = sub
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def bodies(review_strategy: Any) -> Any:
    """Mostly well-shaped reviews with hostile contents, some plain garbage, some wrong shapes."""
    return st.one_of(review_strategy.map(lambda r: json.dumps(r).encode()),
                     json_values.map(lambda v: json.dumps(v).encode()),
                     st.binary(max_size=200))


pod_reviews = bodies(st.builds(review, st.just("pods"), st.just("Pod"), pods(), st.none(), st.just("CREATE"),
                               st.none()))
node_reviews = bodies(st.builds(review, st.just("nodes"), st.just("Node"), nodes(), nodes() | st.none(),
                                st.sampled_from(["CREATE", "UPDATE"]), st.sampled_from([None, "status"])))


def check_answer(status: int, body: bytes, sent: bytes, elapsed: float) -> None:
    assert status in (200, 400), (status, body[:200])
    assert elapsed < 5, "within the webhook timeout"
    answer = json.loads(body)
    if status == 400:
        assert isinstance(answer.get("error"), str)
        return
    response = answer["response"]
    assert isinstance(response["allowed"], bool) and response["uid"]
    if "patch" in response:
        obj = json.loads(sent)["request"]["object"]
        patched = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
        spec, sent_spec = _dict(patched.get("spec")), _dict(obj.get("spec"))
        for kind in ("containers", "initContainers"):
            for index, container in enumerate(_list(spec.get(kind))):
                sent_containers = _list(sent_spec.get(kind))
                before = _requests(sent_containers[index]) if index < len(sent_containers) else {}
                for resource, value in _requests(container).items():
                    if before.get(resource) != value:  # what the webhook wrote (not what it was sent)
                        assert parse_quantity(value) >= 0, "a request the API server accepts"
        allocatable = _dict(_dict(patched.get("status")).get("allocatable"))
        original = _dict(_dict(obj.get("status")).get("allocatable"))
        for resource, value in allocatable.items():
            if original.get(resource) != value:
                assert parse_quantity(value) >= 0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _requests(container: Any) -> dict[str, Any]:
    return _dict(_dict(_dict(container).get("resources")).get("requests"))


@pytest.fixture(scope="module")
def webhook(tmp_path_factory) -> Iterator[RunningWebhook]:
    server = RunningWebhook(tmp_path_factory.mktemp("fuzz-webhook"))
    yield server
    server.stop()


@pytest.mark.parametrize(("path", "strategy"), [("/mutate/pods", pod_reviews), ("/mutate/nodes", node_reviews),
                                                ("/validate/nodes", node_reviews)])
def test_webhook_endpoints_answer_hostile_reviews_well(webhook, path, strategy):
    connection = webhook.connection()
    rss_before = _rss(webhook)

    @FUZZ
    @given(strategy)
    def run(sent: bytes) -> None:
        started = time.monotonic()
        connection.request("POST", path, sent, {"Content-Type": "application/json"})
        response = connection.getresponse()
        check_answer(response.status, response.read(), sent, time.monotonic() - started)

    run()
    connection.close()
    assert _rss(webhook) < rss_before + 50, "memory stays flat"


def _rss(server: RunningWebhook) -> float:
    import subprocess

    pids = subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True).stdout.split()
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
        for line in lines:
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


extender_args = st.fixed_dictionaries({}, optional={
    "Pod": pods() | json_values, "NodeNames": st.lists(st.sampled_from(["node-0", "nope"]) | st.text(max_size=5))
    | json_values, "Nodes": json_values})
meta_victims = st.fixed_dictionaries({}, optional={
    "Pods": st.lists(st.fixed_dictionaries({}, optional={"UID": st.text(max_size=5) | json_values}) | json_values,
                     max_size=3) | json_values, "NumPDBViolations": st.integers() | json_values})
whole_victims = st.fixed_dictionaries({}, optional={"Pods": st.lists(pods() | json_values, max_size=2) | json_values,
                                                    "NumPDBViolations": st.integers() | json_values})
node_names = st.sampled_from(["node-0", "nope"]) | st.text(max_size=5)
preemption_args = st.fixed_dictionaries({}, optional={
    "Pod": pods() | json_values, "NodeNameToMetaVictims": st.dictionaries(node_names, meta_victims, max_size=3)
    | json_values, "NodeNameToVictims": st.dictionaries(node_names, whole_victims, max_size=2) | json_values})
binding_args = st.fixed_dictionaries({}, optional={
    "PodName": st.text(max_size=10) | json_values, "PodNamespace": st.sampled_from(["default", ""]) | json_values,
    "PodUID": st.text(max_size=10) | json_values, "Node": st.sampled_from(["node-0", "nope"]) | json_values})


@pytest.fixture(scope="module")
def extender(tmp_path_factory) -> Iterator[Extender]:
    api = FakeKubeAPI().start()
    api.put("nodes", node("node-0"))
    server = Extender(api, tmp_path_factory.mktemp("fuzz-extender"))
    yield server
    server.stop()
    api.stop()


@pytest.mark.parametrize(("verb", "strategy"), [("filter", extender_args), ("prioritize", extender_args),
                                                ("preempt", preemption_args), ("bind", binding_args)])
def test_extender_verbs_answer_hostile_payloads_well(extender, verb, strategy):
    import http.client

    host, port = extender.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)

    @FUZZ
    @given(st.one_of(strategy.map(lambda a: json.dumps(a).encode()), st.binary(max_size=100)))
    def run(sent: bytes) -> None:
        connection.request("POST", f"/{verb}", sent, {"Content-Type": "application/json"})
        response = connection.getresponse()
        body = response.read()
        assert response.status in (200, 400), (response.status, body[:200])
        answer = json.loads(body)
        assert isinstance(answer, (dict, list))
        if verb == "bind" and response.status == 200:
            assert answer["Error"], "nothing generated here may be bound"
        if verb == "preempt" and response.status == 200:
            sent_nodes = json.loads(sent) if sent.startswith(b"{") else {}
            # An error of ours names no node (kube-scheduler then evicts nothing for the Pod).
            assert set(answer.get("NodeNameToMetaVictims") or {}) <= {"node-0"} & (
                set(sent_nodes.get("NodeNameToMetaVictims") or {}) | set(sent_nodes.get("NodeNameToVictims") or {}))

    run()
    connection.close()


def _our_keys() -> list[str]:
    from oversale.annotations import AnnotationKeys

    keys = AnnotationKeys()
    return sorted({value for name in dir(AnnotationKeys) if not name.startswith("_")
                   for value in [getattr(keys, name)] if isinstance(value, str) and value.startswith(PREFIX + "/")})


# Ours include JSON records (real allocatable, topology, the hot-time account, reservations).
json_annotations = st.one_of(st.sampled_from([
    '{"cpu": "abc"}', '{"cpu": -1, "memory": "1Gi"}', '{"cpu": {"multiplier": "NaN"}}', '{"detail": [{"id": "x"}]}',
    '{"detail": [{"id": 0, "core": 0, "socket": 0, "node": 0}, {"id": 0, "core": 1, "socket": 0, "node": 0}]}',
    '{"a/Deployment/b": {"cpu": "1e30", "until": "never"}}', '{"cpuset": "3-1"}', '[1, 2]', '"x"', "null"]),
    json_values.map(json.dumps))
hostile_annotations = st.dictionaries(st.sampled_from(_our_keys()), annotation_values | json_annotations, max_size=12)


@FUZZ
@given(workload_annotations=hostile_annotations, hpa_annotations=hostile_annotations,
       pod_annotations=hostile_annotations, node_annotations=hostile_annotations, node_labels=hostile_annotations)
def test_every_pass_plans_around_hostile_annotations_of_ours(workload_annotations, hpa_annotations, pod_annotations,
                                                             node_annotations, node_labels):
    # One object with an annotation of ours that nobody can read must never stop a reconciler
    # pass for every other object (an unreadable HPA record once did): each plan is made or
    # skipped with a reason, and the views the extender and the remediator build are made.
    from oversale.annotations import AnnotationKeys
    from oversale.estimator import UsageStats
    from oversale.limitrange import NO_BOUNDS
    from oversale.node_oversale import plan_node
    from oversale.placement import node_view, pod_demand
    from oversale.remediation import eviction_exclusion, runtime_watermarks_for
    from oversale.resize import plan_resize
    from oversale.settings import Settings
    from oversale.workloads import plan_compression

    keys, settings = AnnotationKeys(), Settings()
    template = {"containers": [{"name": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                             "limits": {"cpu": "2", "memory": "2Gi"}}}]}
    workload = {"kind": "Deployment", "metadata": {"name": "web", "namespace": "shop",
                                                   "annotations": dict(workload_annotations)},
                "spec": {"template": {"spec": template}}}
    hpa = {"metadata": {"name": "web", "annotations": dict(hpa_annotations)},
           "spec": {"metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
               "type": "Utilization", "averageUtilization": 60}}}]}}
    stats = UsageStats(quantile=300.0, peak=400.0, samples=2000, covered_seconds=7 * 86400.0, age_seconds=60.0)
    for rescale in (False, True):
        plan_compression(workload, {"cpu": {"app": stats}, "memory": {"app": stats}}, hpa, keys,
                         settings.compression_estimator(), rescale)
    pod = {"metadata": {"name": "web-5d8f9c7b6-abcde", "namespace": "shop", "annotations": dict(pod_annotations),
                        "creationTimestamp": "2026-11-01T00:00:00Z",
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f9c7b6", "controller": True}]},
           "spec": {"nodeName": "n", **template},
           "status": {"phase": "Running", "startTime": "2026-11-01T00:00:00Z", "qosClass": "Burstable"}}
    plan_resize(pod, workload_annotations, keys, settings.compression, NO_BOUNDS, time.time(), settings.resize_limits)
    pod_demand(pod, keys)
    eviction_exclusion(pod, keys, time.time(), 600.0)
    node = {"metadata": {"name": "n", "labels": dict(node_labels), "annotations": dict(node_annotations)},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi"}, "capacity": {"cpu": "4", "memory": "16Gi"}}}
    node_view(node, keys)
    runtime_watermarks_for(node_labels, node_annotations, keys, settings.remediation_config.watermarks)
    plan_node(node, {"cpu": 2000, "memory": 2**33}, {"cpu": stats, "memory": stats}, keys,
              settings.oversale_estimator(), {"cpu": 0.001, "memory": 0.0001}, {"cpu": 1.0, "memory": 1.0})
