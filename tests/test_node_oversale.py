"""Node overselling: the formula on the real GKE Node, and long random write sequences through the
webhook, with the API server's admission and node-strategy semantics (tests/kube_api.py)."""

from __future__ import annotations

import base64
import copy
import json
import math
from decimal import Decimal, InvalidOperation
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from oversale.annotations import AnnotationKeys
from oversale.budget import budget_proposal
from oversale.estimator import OversaleEstimator, UsageStats, oversale_proposal
from oversale.node_oversale import (
    NodePolicy,
    NodeResult,
    OversaleLimits,
    keep_record,
    lowest_safe_ratio,
    node_policy_from_annotations,
    oversell_node,
    plan_node,
    real_allocatable_of,
)
from oversale.quantity import parse_amount
from oversale.settings import Settings
from tests.conftest import SHARED, no_cluster_app
from tests.kube_api import FakeKubeAPI
from webhook.node_admission import StatusWrites, reshape_status_write

KEYS = AnnotationKeys()
GKE_NODE = SHARED / "fixtures" / "nodes" / "gke-node.json"
NAME = "node-default-pool-something"


def gke_node() -> dict:
    node = json.loads(GKE_NODE.read_text())
    assert node["metadata"]["name"] == NAME
    return node


def amounts(values: dict) -> dict:
    return {r: parse_amount(r, values[r]) for r in ("cpu", "memory") if r in values}


def policy(**annotations):
    return node_policy_from_annotations(annotations, KEYS, OversaleLimits())


def stored_as(node: dict, result: NodeResult) -> dict:
    """``node`` as the API server stores it once the webhook reshaped a write of it into ``result``."""
    stored = copy.deepcopy(node)
    stored["metadata"]["annotations"] = result.annotations
    stored["status"]["allocatable"], stored["status"]["capacity"] = result.allocatable, result.capacity
    return stored


def stored_after_create() -> tuple[dict, NodePolicy]:
    """The GKE Node as the API server stores it once the webhook oversold its CREATE at cpu ratio
    2, and that policy."""
    node = gke_node()
    on = policy(**{KEYS.cpu_oversale_ratio: "2"})
    return stored_as(node, oversell_node(node, None, True, on)), on


@pytest.mark.shared
def test_a_node_is_planned_from_its_real_allocatable_and_the_ratio_it_carries():
    # The status of an oversold node shows the oversold amounts: planned from them, each pass
    # would oversell the oversold node again.
    stored, _ = stored_after_create()
    stored["metadata"]["annotations"][KEYS.cpu_oversale_ratio] = "2"
    assert amounts(stored["status"]["allocatable"])["cpu"] == 7840
    assert real_allocatable_of(stored, KEYS) == {"cpu": 3920, "memory": 12700100 * 1024}
    assert real_allocatable_of(gke_node(), KEYS) == amounts(gke_node()["status"]["allocatable"])
    usage = {"cpu": UsageStats(1500.0, 2500.0, 2016, 7 * 86400.0), "memory": None}
    requested = {"cpu": 6000, "memory": 2**33}
    estimator = OversaleEstimator()
    plan = plan_node(stored, requested, usage, KEYS, estimator)
    assert plan.name == NAME and plan.current == {"cpu": Decimal(2), "memory": Decimal(1)}
    assert plan.real_allocatable == {"cpu": 3920, "memory": 12700100 * 1024} and plan.requested == requested
    assert plan.proposals == {
        "cpu": oversale_proposal("cpu", 6000, 3920, usage["cpu"], Decimal(2), estimator),
        "memory": oversale_proposal("memory", 2**33, 12700100 * 1024, None, Decimal(1), estimator)}
    # Under a hot-time budget the budget decides, its target scaled by the account's multiplier.
    budgeted = plan_node(stored, requested, usage, KEYS, estimator, {"cpu": 0.001}, {"cpu": 0.8})
    assert budgeted.proposals["cpu"] == budget_proposal("cpu", 6000, 3920, usage["cpu"], Decimal(2), estimator,
                                                        0.001, 0.8)
    assert budgeted.proposals["cpu"] != plan.proposals["cpu"] and budgeted.multipliers == {"cpu": 0.8}
    assert budgeted.proposals["memory"] == plan.proposals["memory"], "no budget for memory: the estimator's ratio"
    no_account_yet = plan_node(stored, requested, usage, KEYS, estimator, {"cpu": 0.001}).proposals["cpu"]
    assert no_account_yet == budget_proposal("cpu", 6000, 3920, usage["cpu"], Decimal(2), estimator, 0.001, 1.0)
    # A resource no Pod there requests is planned at 0 requested; one the node does not report, not at all.
    assert plan_node(stored, {}, usage, KEYS, estimator).proposals["cpu"] == \
        oversale_proposal("cpu", 0, 3920, usage["cpu"], Decimal(2), estimator)
    assert plan_node(stored, {}, usage, KEYS, estimator, {"cpu": 0.001}).proposals["cpu"] == \
        budget_proposal("cpu", 0, 3920, usage["cpu"], Decimal(2), estimator, 0.001, 1.0)
    no_memory = gke_node()
    del no_memory["status"]["allocatable"]["memory"]
    assert set(plan_node(no_memory, requested, usage, KEYS, estimator).proposals) == {"cpu"}
    no_cpu = gke_node()
    del no_cpu["status"]["allocatable"]["cpu"]
    assert set(plan_node(no_cpu, requested, usage, KEYS, estimator).proposals) == {"memory"}


@pytest.mark.shared
def test_formula_on_a_real_node_keeps_reserved_resources_and_other_resources():
    node = gke_node()
    result = oversell_node(node, None, True, policy(**{KEYS.cpu_oversale_ratio: "1.5",
                                                      KEYS.memory_oversale_ratio: "1.2"}))
    assert amounts(result.allocatable) == {"cpu": 5880, "memory": math.floor(12700100 * 1024 * Fraction(6, 5))}
    for resource in ("cpu", "memory"):
        reserved = parse_amount(resource, node["status"]["capacity"][resource]) - \
            parse_amount(resource, node["status"]["allocatable"][resource])
        assert amounts(result.capacity)[resource] - amounts(result.allocatable)[resource] == reserved
    for other in ("pods", "ephemeral-storage", "hugepages-2Mi"):
        assert result.allocatable[other] == node["status"]["allocatable"][other]
        assert result.capacity[other] == node["status"]["capacity"][other]
    assert json.loads(result.annotations[KEYS.real_allocatable]) == {"cpu": "3920m", "memory": "12700100Ki"}
    assert json.loads(result.annotations[KEYS.applied_oversale_ratio]) == {"cpu": "1.5", "memory": "1.2"}


@pytest.mark.parametrize("value", ["abc", "0", "0.8", "NaN", "inf", "1e1", "-2", ""])
def test_invalid_ratios_mean_not_oversold(value):
    chosen = policy(**{KEYS.cpu_oversale_ratio: value, KEYS.memory_oversale_ratio: "2"})
    assert dict(chosen.ratios) == {"memory": Decimal(2)}
    assert [p.key for p in chosen.problems] == [KEYS.cpu_oversale_ratio]
    assert str(chosen.problems[0]).endswith("; cpu not oversold")


def test_ratios_above_the_bounds_are_clamped_inclusively():
    chosen = policy(**{KEYS.cpu_oversale_ratio: "3", KEYS.memory_oversale_ratio: "2.5"})
    assert dict(chosen.ratios) == {"cpu": Decimal(3), "memory": Decimal(2)}
    assert len(chosen.warnings) == 1 and "memory-oversale-ratio=2.5" in chosen.warnings[0]
    assert OversaleLimits() == Settings(kubernetes="off").oversale_limits, "the core's defaults are the product's"
    assert dict(policy(**{KEYS.cpu_oversale_ratio: "5.5"}).ratios) == {"cpu": Decimal(5)}


def test_mutate_false_turns_overselling_off():
    assert not policy(**{KEYS.cpu_oversale_ratio: "2", KEYS.mutate: "false"}).ratios
    assert policy(**{KEYS.cpu_oversale_ratio: "2", KEYS.mutate: "true"}).ratios


def test_an_unclear_mutate_switch_turns_overselling_off_and_says_so():
    unclear = policy(**{KEYS.cpu_oversale_ratio: "2", KEYS.mutate: "maybe"})
    assert not unclear.ratios
    assert [str(p) for p in unclear.problems] == [
        f"annotation {KEYS.mutate}='maybe' ignored: 'maybe' is not one of y, yes, true, n, no, false; "
        "node not oversold"]


def test_a_main_resource_update_keeps_the_record_exactly_as_stored():
    """The node strategy puts the stored status back after admission on such an update, so the
    record must describe that status: a writer's stale copy of it is replaced, a record the
    stored Node lacks is dropped, and the writer's other annotations stay as it sent them."""
    stored = {"metadata": {"annotations": {KEYS.real_allocatable: '{"cpu":"3920m"}',
                                           KEYS.applied_oversale_ratio: '{"cpu":"2"}', "team": "old"}}}
    sent = {"metadata": {"annotations": {KEYS.real_allocatable: '{"cpu":"7840m"}',
                                         KEYS.real_capacity: '{"cpu":"4"}', "team": "web"}}}
    assert keep_record(sent, stored, KEYS) == {KEYS.real_allocatable: '{"cpu":"3920m"}',
                                               KEYS.applied_oversale_ratio: '{"cpu":"2"}', "team": "web"}
    assert sent["metadata"]["annotations"][KEYS.real_allocatable] == '{"cpu":"7840m"}', "the write is not changed"
    assert keep_record({"metadata": {}}, {"metadata": {}}, KEYS) == {}


def test_lowest_safe_ratio_is_rounded_up_to_hold_the_requests():
    assert lowest_safe_ratio(16000, 22000) == Decimal("1.38")
    assert math.floor(16000 * Fraction(Decimal("1.38"))) >= 22000
    assert lowest_safe_ratio(16000, 9000) == 1


@pytest.mark.shared
def test_only_the_nodes_own_kubelet_refreshes_real_values():
    stored, on = stored_after_create()
    assert stored["status"]["allocatable"]["cpu"] == "7840m"

    lying = copy.deepcopy(stored)
    lying["status"]["allocatable"]["cpu"] = "1"
    assert oversell_node(lying, stored, False, on).allocatable["cpu"] == "7840m"   # another writer
    assert oversell_node(lying, stored, True, on).allocatable["cpu"] == "2"        # the kubelet
    unchanged = oversell_node(stored, stored, True, on)                            # kubelet, value as stored
    assert unchanged.allocatable == stored["status"]["allocatable"]



@pytest.mark.shared
def test_a_node_registered_without_status_is_oversold_from_its_kubelets_first_status_write():
    """A provisioning tool may create the Node object bare; the kubelet's first status write then
    brings the real values, which there is nothing stored to compare with."""
    node = gke_node()
    bare = copy.deepcopy(node)
    del bare["status"]
    on = policy(**{KEYS.cpu_oversale_ratio: "2"})
    result = oversell_node(node, bare, True, on)
    assert result.allocatable["cpu"] == "7840m" and "allocatable/cpu" in result.refreshed
    assert json.loads(result.annotations[KEYS.real_allocatable])["cpu"] == "3920m"


@pytest.mark.shared
def test_amounts_sent_again_in_another_spelling_are_left_as_sent():
    """Another writer sends back what it read, maybe respelled ("7840m" as "7.84", Ki as bytes):
    equal amounts are left as sent, so the write gets no patch."""
    stored, on = stored_after_create()
    respelled = copy.deepcopy(stored)
    allocatable = respelled["status"]["allocatable"]
    allocatable["cpu"], allocatable["memory"] = "7.84", str(parse_amount("memory", allocatable["memory"]))
    assert allocatable["memory"] == str(12700100 * 1024)
    result = oversell_node(respelled, stored, False, on)
    assert result.allocatable == allocatable and result.capacity == respelled["status"]["capacity"]


def test_a_node_whose_reservations_take_all_its_cpu_has_zero_allocatable_not_a_negative_one():
    """The kubelet clamps allocatable at 0 when its reservations exceed the capacity: a real
    value, kept and recorded, with no warning."""
    node = {"metadata": {"name": "n1", "annotations": {}},
            "status": {"allocatable": {"cpu": "0", "memory": "1Gi"}, "capacity": {"cpu": "1", "memory": "2Gi"}}}
    result = oversell_node(node, None, True, policy(**{KEYS.cpu_oversale_ratio: "2"}))
    assert result.allocatable == {"cpu": "0", "memory": "1Gi"} and result.capacity["cpu"] == "1"
    assert result.warnings == [] and result.real.allocatable == {"cpu": "0", "memory": "1Gi"}


def test_the_node_gauges_show_each_resource_a_node_reports_in_cores_and_bytes():
    """Through the app: the gauges show real and oversold allocatable per resource, cpu in cores and
    memory in bytes. Some nodes (a virtual-kubelet, say) report no memory: their cpu is oversold
    and shown alone, with no error counted."""
    app = no_cluster_app().test_client()

    def status_write(name: str, allocatable: dict[str, str], ratios: dict[str, str],
                     dry_run: bool = False) -> list[dict]:
        node = {"metadata": {"name": name, "annotations": ratios},
                "status": {"allocatable": allocatable, "capacity": allocatable}}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": name, "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"}, "subResource": "status",
            "operation": "UPDATE", "userInfo": {"username": f"system:node:{name}"}, "object": node,
            "oldObject": node, "dryRun": dry_run}}
        response = app.post("/mutate/nodes", json=review).get_json()["response"]
        return json.loads(base64.b64decode(response["patch"]))

    patch = status_write("virtual-1", {"cpu": "4", "pods": "110"}, {KEYS.cpu_oversale_ratio: "2"})
    assert {"op": "replace", "path": "/status/allocatable/cpu", "value": "8"} in patch
    patch = status_write("plain-1", {"cpu": "4", "memory": "4Gi", "pods": "110"}, {KEYS.memory_oversale_ratio: "1.5"})
    assert {"op": "replace", "path": "/status/allocatable/memory", "value": "6Gi"} in patch
    # A dry run gets the same answer, but nothing is stored: no gauge shows it.
    assert status_write("dry-1", {"cpu": "4", "pods": "110"}, {KEYS.cpu_oversale_ratio: "2"}, dry_run=True) == \
        status_write("virtual-1", {"cpu": "4", "pods": "110"}, {KEYS.cpu_oversale_ratio: "2"})
    exposition = app.get("/metrics").get_data(as_text=True)
    assert 'node="dry-1"' not in exposition
    for shown in ('{node="virtual-1",resource="cpu",value="oversold"} 8.0',
                  '{node="virtual-1",resource="cpu",value="real"} 4.0',
                  '{node="plain-1",resource="cpu",value="oversold"} 4.0',
                  '{node="plain-1",resource="memory",value="real"} 4.294967296e+09',
                  '{node="plain-1",resource="memory",value="oversold"} 6.442450944e+09'):
        assert f"oversale_node_allocatable{shown}" in exposition, shown
    assert 'node="virtual-1",resource="memory"' not in exposition
    assert 'oversale_admissions_total{outcome="mutated",resource="nodes"} 4.0' in exposition


@pytest.mark.shared
def test_the_webhook_answers_a_repeated_status_write_by_its_writer():
    """Through the app, which remembers status-write answers (the kubelet repeats its writes): the
    same write from the node's kubelet and from another writer still gets each writer's answer."""
    app = no_cluster_app().test_client()
    node = gke_node()
    node["metadata"].setdefault("annotations", {})[KEYS.cpu_oversale_ratio] = "2"
    stored = stored_as(node, oversell_node(node, None, True, policy(**{KEYS.cpu_oversale_ratio: "2"})))
    sent = copy.deepcopy(stored)
    sent["status"]["allocatable"]["cpu"] = "1"

    def allocatable_cpu(user: str) -> str:
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"}, "subResource": "status",
            "operation": "UPDATE", "userInfo": {"username": user}, "object": sent, "oldObject": stored}}
        response = app.post("/mutate/nodes", json=review).get_json()["response"]
        patch = json.loads(base64.b64decode(response["patch"]))
        return next(op["value"] for op in patch if op["path"] == "/status/allocatable/cpu")

    for _ in range(2):
        assert allocatable_cpu(f"system:node:{NAME}") == "2"       # the kubelet's 1 core is real: x2
        assert allocatable_cpu("system:admin") == "7840m"           # another writer: stored real x2
    # The same write over a stored Node whose record alone differs: another writer's values are
    # oversold from the record, so the record is part of what is remembered.
    stored["metadata"]["annotations"][KEYS.real_allocatable] = json.dumps({"cpu": "3", "memory": "12700100Ki"})
    assert allocatable_cpu("system:admin") == "6"


@pytest.mark.shared
@pytest.mark.parametrize("record", ["3920m", '["3920m"]', '{"cpu": "lots"}', '{"cpu": ["3920m"]}'])
def test_a_record_of_real_values_edited_unreadable_is_warned_of_and_written_anew_from_the_stored_values(record):
    """A record edited by hand (not JSON, not an object, not quantities) cannot say what is real:
    another writer's status write is reshaped from the values stored instead, with a warning, and
    the record is written back readable, so the next write neither warns nor moves."""
    stored, on = stored_after_create()
    stored["metadata"]["annotations"][KEYS.real_allocatable] = record
    result = oversell_node(copy.deepcopy(stored), stored, False, on)
    assert result.warnings == [f"annotation {KEYS.real_allocatable} on the stored Node is unreadable; "
                               "stored values taken as real"]
    assert result.real.allocatable["cpu"] == stored["status"]["allocatable"]["cpu"] == "7840m"
    assert json.loads(result.annotations[KEYS.real_allocatable])["cpu"] == "7840m"
    assert amounts(result.allocatable)["cpu"] == 2 * 7840, "the stored (oversold) value taken as real, x2"
    after = stored_as(stored, result)
    again = oversell_node(copy.deepcopy(after), after, False, on)
    assert again.warnings == [] and again.allocatable == result.allocatable


@pytest.mark.shared
def test_a_record_of_applied_ratios_edited_unreadable_is_written_anew():
    """The applied-ratio record only says which resources a removed ratio must restore: an
    unreadable one is taken as none applied, and the write is still reshaped from the real values."""
    stored, on = stored_after_create()
    stored["metadata"]["annotations"][KEYS.applied_oversale_ratio] = "cpu=2"
    result = oversell_node(copy.deepcopy(stored), stored, False, on)
    assert amounts(result.allocatable)["cpu"] == 2 * 3920 and result.warnings == []
    assert json.loads(result.annotations[KEYS.applied_oversale_ratio]) == {"cpu": "2"}


@pytest.mark.shared
def test_a_status_write_is_remembered_by_its_capacity_too():
    settings = Settings(kubernetes="off")
    node = gke_node()
    node["metadata"].setdefault("annotations", {})[KEYS.cpu_oversale_ratio] = "2"
    writes = StatusWrites(settings)
    first = writes.answer(node, None, True)
    bigger = copy.deepcopy(node)
    bigger["status"]["capacity"]["cpu"] = "8"
    answered = writes.answer(bigger, None, True)
    assert answered == reshape_status_write(settings, bigger, None, True)
    # Allocatable x 2 plus what the kubelet reserves: 3920m x 2 + (8 - 3.92) cores, not + 80m.
    assert amounts(answered[1].capacity)["cpu"] == 11920
    assert amounts(first[1].capacity)["cpu"] == 7920
    heartbeat = copy.deepcopy(node)  # the same values, with the conditions' times the kubelet renews
    for condition in heartbeat["status"]["conditions"]:
        condition["lastHeartbeatTime"] = "2026-12-06T07:00:00Z"
    assert heartbeat["status"] != node["status"]
    assert writes.answer(heartbeat, None, True) is first, "a heartbeat is answered from memory"


# ---- the property test ------------------------------------------------------------------------

# Real values the kubelet may report, and ratios, chosen so that no oversold value can equal a real
# one (every ratio applied is >= 1.25 and the real values span less than that factor). The kubelet
# sends a value only when it differs from what it read, so a new real value that happened to equal
# the stored oversold one could not be told apart from a heartbeat; see docs/node-oversale.md,
# "Exact under kubelet heartbeats".
REAL_CPU = [("3920m", "4"), ("3900m", "4"), ("3800m", "4"), ("3700m", "3900m")]
REAL_MEMORY = [("12700100Ki", "15399364Ki"), ("12600000Ki", "15399364Ki"), ("12000000Ki", "15000000Ki")]
RATIO_VALUES = ["1", "1.25", "1.5", "2", "2.5", "3", "7", "abc", "0.8", "1e1", None]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("kubelet"), st.sampled_from(range(len(REAL_CPU))), st.sampled_from(range(len(REAL_MEMORY))),
                  st.integers(0, 3)),
        st.tuples(st.just("other"), st.integers(0, 6), st.booleans()),
        st.tuples(st.just("ratio"), st.sampled_from(["cpu", "memory"]), st.sampled_from(RATIO_VALUES)),
        st.tuples(st.just("mutate"), st.sampled_from(["false", "true", "maybe", None])),
        st.tuples(st.just("restart")),
    ),
    min_size=1,
    max_size=30,
)


def expected_ratio(annotations: dict, resource: str) -> Fraction:
    """The README's rules, written again independently of the project's code."""
    switch = annotations.get(KEYS.mutate)
    if switch is not None and switch.strip().lower() not in ("y", "yes", "true"):
        return Fraction(1)
    text = annotations.get(KEYS.oversale_ratio(resource))
    if text is None or not text.replace(".", "", 1).isdigit():
        return Fraction(1)
    try:
        ratio = Fraction(Decimal(text))
    except InvalidOperation:
        return Fraction(1)
    if ratio < 1:
        return Fraction(1)
    return min(ratio, Fraction(5) if resource == "cpu" else Fraction(2))


class Cluster:
    """One Node, its kubelet, other writers and a user, all through the real client."""

    def __init__(self, api: FakeKubeAPI) -> None:
        self.api = api
        self.restart()
        api.mutating["nodes"] = lambda review: self.app.post("/mutate/nodes", json=review).get_json()["response"]
        api.users.update({"kubelet-token": f"system:node:{NAME}", "npd-token": "system:serviceaccount:kube-system:npd",
                          "admin-token": "kubernetes-admin"})
        self.kubelet, self.npd, self.admin = (self._client(t) for t in ("kubelet-token", "npd-token", "admin-token"))
        self.history: list[dict] = []
        node = gke_node()
        self.real = {"allocatable": amounts(node["status"]["allocatable"]),
                     "capacity": amounts(node["status"]["capacity"])}
        self.kubelet_view: dict | None = None
        client.CoreV1Api(self.kubelet).create_node(node, _preload_content=False)
        self._stored_changed()

    def restart(self) -> None:
        """A new webhook process: no memory of anything before."""
        self.app = no_cluster_app().test_client()

    def _client(self, token: str) -> client.ApiClient:
        configuration = client.Configuration(host=self.api.url)
        configuration.api_key = {"BearerToken": f"Bearer {token}"}
        return client.ApiClient(configuration)

    @property
    def stored(self) -> dict:
        return self.api.get("nodes", "", NAME)

    def _stored_changed(self) -> None:
        self.history.append(self.stored)

    def patch_status(self, api_client: client.ApiClient, body: dict) -> None:
        client.CoreV1Api(api_client).patch_node_status(NAME, body, _content_type="application/merge-patch+json",
                                                       _preload_content=False)
        self._stored_changed()

    def patch_node(self, body: dict) -> None:
        client.CoreV1Api(self.admin).patch_node(NAME, body, _content_type="application/merge-patch+json",
                                                _preload_content=False)
        self._stored_changed()

    def kubelet_sync(self, cpu: int, memory: int, staleness: int) -> None:
        """The kubelet's status sync: it patches allocatable/capacity only where its desired value
        differs from the Node it read, which may be a stale copy from its informer cache."""
        (cpu_allocatable, cpu_capacity), (memory_allocatable, memory_capacity) = REAL_CPU[cpu], REAL_MEMORY[memory]
        desired = {"allocatable": {"cpu": cpu_allocatable, "memory": memory_allocatable},
                   "capacity": {"cpu": cpu_capacity, "memory": memory_capacity}}
        view = self.history[max(0, len(self.history) - 1 - staleness)]
        beat = f"2026-11-22T00:00:{len(self.history) % 60:02d}Z"
        patch: dict = {"status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": beat}]}}
        for field, values in desired.items():
            changed = {r: v for r, v in values.items()
                       if parse_amount(r, v) != parse_amount(r, view["status"][field][r])}
            if changed:
                patch["status"][field] = changed
            for resource in values:
                # What the webhook can know: a sent value that differs from the stored one.
                if resource in changed and parse_amount(resource, values[resource]) != \
                        parse_amount(resource, self.stored["status"][field][resource]):
                    self.real[field][resource] = parse_amount(resource, values[resource])
        self.patch_status(self.kubelet, patch)

    def other_writer(self, staleness: int, send_annotations: bool) -> None:
        """node-problem-detector or a controller writing status from a copy it read earlier."""
        copy_read = self.history[max(0, len(self.history) - 1 - staleness)]
        patch: dict = {"status": {"allocatable": copy_read["status"]["allocatable"],
                                  "capacity": copy_read["status"]["capacity"],
                                  "conditions": [{"type": "KernelDeadlock", "status": "False"}]}}
        if send_annotations:
            ours = {k: copy_read["metadata"].get("annotations", {}).get(k) for k in KEYS.node_record_keys()}
            patch["metadata"] = {"annotations": ours}
        self.patch_status(self.npd, patch)

    def check(self) -> None:
        stored = self.stored
        annotations = stored["metadata"].get("annotations") or {}
        oversold = False
        for resource in ("cpu", "memory"):
            ratio = expected_ratio(annotations, resource)
            real_allocatable, real_capacity = self.real["allocatable"][resource], self.real["capacity"][resource]
            allocatable = math.floor(real_allocatable * ratio)
            capacity = real_capacity + allocatable - real_allocatable
            assert parse_amount(resource, stored["status"]["allocatable"][resource]) == allocatable, resource
            assert parse_amount(resource, stored["status"]["capacity"][resource]) == capacity, resource
            oversold = oversold or ratio > 1
        assert stored["status"]["allocatable"]["pods"] == "110"
        assert stored["status"]["capacity"]["ephemeral-storage"] == "202086868Ki"
        if oversold:
            recorded = json.loads(annotations[KEYS.real_allocatable])
            assert amounts(recorded) == self.real["allocatable"]
        else:
            assert not set(KEYS.node_record_keys()) & set(annotations), "record removed when not oversold"


@pytest.mark.shared
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps)
def test_random_write_sequences_never_compound_the_ratio(sequence):
    api = FakeKubeAPI().start()
    try:
        cluster = Cluster(api)
        cluster.check()
        for step in sequence:
            kind = step[0]
            if kind == "kubelet":
                cluster.kubelet_sync(*step[1:])
            elif kind == "other":
                cluster.other_writer(*step[1:])
            elif kind in ("ratio", "mutate"):
                key = KEYS.oversale_ratio(step[1]) if kind == "ratio" else KEYS.mutate
                before = cluster.stored
                cluster.patch_node({"metadata": {"annotations": {key: step[-1]}}})
                after = cluster.stored
                # A main-resource update cannot change status (the strategy restores it) nor the record.
                assert after["status"] == before["status"]
                assert {k: after["metadata"].get("annotations", {}).get(k) for k in KEYS.node_record_keys()} == \
                    {k: before["metadata"].get("annotations", {}).get(k) for k in KEYS.node_record_keys()}
                # The next status write of any writer applies the new annotations (here, an empty one).
                cluster.patch_status(cluster.admin, {})
            else:
                cluster.restart()
            cluster.check()
    finally:
        api.stop()


def test_a_negative_stored_value_is_never_written_back():
    """Found by the fuzz suite: a kubelet status write that omits cpu keeps the stored value, and a
    negative one (which no real API server stores) must not be copied into the patch."""
    from oversale.node_oversale import node_policy_from_annotations, oversell_node
    from oversale.settings import Settings

    settings = Settings(kubernetes="off")
    sent = {"metadata": {"name": "n1", "annotations": {}}, "status": {"allocatable": {}, "capacity": {}}}
    stored = {"metadata": {"name": "n1", "annotations": {}},
              "status": {"allocatable": {"cpu": "-1", "memory": "8Gi"}, "capacity": {}}}
    result = oversell_node(sent, stored, True, node_policy_from_annotations({}, settings.keys,
                                                                            settings.oversale_limits))
    assert result.allocatable == {"memory": "8Gi"}
    assert result.warnings == ["allocatable/cpu '-1' is negative; left as sent"]


def test_a_write_missing_some_values_is_oversold_where_it_has_them():
    """A Node created bare (by a provisioning tool), or reporting a resource's allocatable without
    its capacity, is oversold where it reports values and left alone elsewhere."""
    on = policy(**{KEYS.cpu_oversale_ratio: "2"})
    result = oversell_node({"metadata": {"name": "n1"}}, None, True, on)
    assert (result.allocatable, result.capacity, result.applied, result.refreshed) == ({}, {}, {}, [])
    partial = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}, "capacity": {"memory": "8Gi"}}}
    result = oversell_node(partial, None, True, on)
    assert (result.allocatable, result.capacity) == ({"cpu": "8"}, {"memory": "8Gi"})


def test_a_node_created_by_another_writer_is_oversold_from_the_values_it_sends():
    """On CREATE there is nothing stored: what is sent is all there is, whoever sends it."""
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}, "capacity": {"cpu": "4"}}}
    result = oversell_node(node, None, False, policy(**{KEYS.cpu_oversale_ratio: "2"}))
    assert (result.allocatable, result.capacity) == ({"cpu": "8"}, {"cpu": "8"})
    assert result.refreshed == ["allocatable/cpu", "capacity/cpu"]


def test_only_a_node_oversold_before_is_restored():
    """A status write of a node with no ratio, and no record of one (its stored object has no
    annotations at all), is left as sent and restores nothing; one oversold before is restored."""
    plain = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}, "capacity": {"cpu": "4"}}}
    result = oversell_node(plain, plain, True, policy())
    assert (result.allocatable, result.restored, result.annotations) == ({"cpu": "4"}, [], {})
    stored = stored_as(plain, oversell_node(plain, None, True, policy(**{KEYS.cpu_oversale_ratio: "2"})))
    result = oversell_node(stored, stored, False, policy())
    assert (result.allocatable, result.restored, result.annotations) == ({"cpu": "4"}, ["cpu"], {})


def test_a_node_whose_status_is_not_an_object_gets_no_patch():
    """Found by the fuzz suite: a patch into a malformed status would not apply."""
    from oversale.settings import Settings
    from webhook.node_admission import admit_node

    node = {"metadata": {"name": "n1", "annotations": {}}, "status": []}
    stored = {"metadata": {"name": "n1", "annotations": {}}, "status": {"allocatable": {"cpu": "1"}}}
    request = {"uid": "u", "kind": {"kind": "Node"}, "resource": {"resource": "nodes"}, "operation": "UPDATE",
               "subResource": "status", "object": node, "oldObject": stored,
               "userInfo": {"username": "system:node:n1"}}
    decision = admit_node(request, Settings(kubernetes="off"))  # type: ignore[arg-type]
    assert decision.review["response"] == {"uid": "u", "allowed": True}


def _opted_in(node: dict, **status_maps: dict | None) -> None:
    """Opt ``node`` in at cpu ratio 2 and set (or, for None, drop) the status maps named."""
    node["metadata"]["annotations"] = {KEYS.cpu_oversale_ratio: "2"}
    for name, value in status_maps.items():
        if value is None:
            del node["status"][name]
        else:
            node["status"][name] = value


@pytest.mark.shared
@pytest.mark.parametrize("edit", [
    pytest.param(lambda node: node["metadata"].pop("annotations", None), id="no annotations map: none is added"),
    pytest.param(lambda node: node["metadata"].update(annotations={}), id="an empty annotations map is not removed"),
    pytest.param(lambda node: _opted_in(node, allocatable={}, capacity={}), id="opted in, empty status maps"),
    pytest.param(lambda node: _opted_in(node, allocatable=None, capacity=None), id="opted in, no status maps"),
])
def test_maps_a_status_write_leaves_empty_stay_as_they_were(edit):
    node = gke_node()
    edit(node)
    _, _, patch = reshape_status_write(Settings(kubernetes="off"), node, None, True)
    assert patch == []
