"""/mutate/nodes and /validate/nodes through the real gunicorn TLS server."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest

from oversale.annotations import AnnotationKeys
from oversale.node_oversale import oversold_allocatable
from oversale.settings import Settings
from tests.conftest import RunningWebhook, apply_response
from tests.kube_api import FakeKubeAPI
from tests.test_node_oversale import NAME, gke_node
from webhook.app import create_app
from webhook.node_pods import NoClusterPods
from webhook.owners import NoCluster

pytestmark = pytest.mark.shared  # every test here starts from the real GKE Node in ../shared/fixtures

KEYS = AnnotationKeys()
KUBELET = f"system:node:{NAME}"


def node_review(node: dict, old: dict | None, username: str = KUBELET, subresource: str | None = "status",
                operation: str = "UPDATE") -> dict:
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": node["metadata"]["name"],
        "operation": operation,
        "userInfo": {"username": username, "groups": ["system:nodes", "system:authenticated"]},
        "object": node,
        "oldObject": old,
        "dryRun": False,
    }
    if subresource:
        request["subResource"] = subresource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def with_annotations(node: dict, **annotations: str) -> dict:
    node = copy.deepcopy(node)
    node["metadata"].setdefault("annotations", {}).update(annotations)
    return node


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningWebhook]:
    running = RunningWebhook(tmp_path_factory.mktemp("nodes"))
    yield running
    running.stop()


def test_kubelet_heartbeats_keep_the_oversold_values_exact(server):
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "1.5"})
    # First status sync after opting in: the kubelet's real values, oversold by the webhook.
    stored = apply_response(stored, server.review(node_review(stored, stored), "/mutate/nodes"))
    assert stored["status"]["allocatable"]["cpu"] == "5880m"
    assert stored["status"]["capacity"]["cpu"] == "5960m"
    # Every later sync re-sends the real values (they differ from what is stored): same result.
    for _ in range(3):
        heartbeat = copy.deepcopy(stored)
        heartbeat["status"]["allocatable"]["cpu"] = "3920m"
        heartbeat["status"]["capacity"]["cpu"] = "4"
        after = apply_response(heartbeat, server.review(node_review(heartbeat, stored), "/mutate/nodes"))
        assert after["status"] == stored["status"]
        assert after["metadata"]["annotations"] == stored["metadata"]["annotations"]
    # A write that changes nothing gets no patch.
    response = server.review(node_review(stored, stored, username="system:serviceaccount:kube-system:npd"),
                             "/mutate/nodes")
    assert response == {"uid": response["uid"], "allowed": True}


def test_only_the_nodes_own_kubelet_changes_its_real_values(server):
    """The kubelet re-sends real values on every status sync, and only its own writes may change
    what is recorded as real (OVERSALE_KUBELET_USERNAME, system:node:{node} by default): anyone
    else's status write of other values is oversold from the record as before."""
    # A node of its own: the server's gauges of the other tests' node stay theirs.
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "1.5"})
    stored["metadata"]["name"] = "node-reserved"
    kubelet = "system:node:node-reserved"
    stored = apply_response(stored, server.review(node_review(stored, stored, username=kubelet), "/mutate/nodes"))
    reserved = copy.deepcopy(stored)
    reserved["status"]["allocatable"]["cpu"] = "3800m"  # the kubelet restarted with more reserved for the system
    by_admin = apply_response(reserved, server.review(node_review(reserved, stored, username="admin"),
                                                      "/mutate/nodes"))
    assert by_admin["status"]["allocatable"]["cpu"] == "5880m"  # 3920m recorded x 1.5
    by_kubelet = apply_response(reserved, server.review(node_review(reserved, stored, username=kubelet),
                                                        "/mutate/nodes"))
    assert by_kubelet["status"]["allocatable"]["cpu"] == "5700m"


def test_a_review_that_is_no_node_write_is_allowed_unchanged_and_counted_as_skipped(server):
    # A MutatingWebhookConfiguration whose rules reach more than Nodes, or a DELETE's review
    # (no object): answered at once, neither refused nor reshaped.
    other = node_review(gke_node(), None, operation="CREATE")
    other["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    other["request"]["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    deleted = node_review(gke_node(), gke_node(), operation="DELETE")
    deleted["request"]["object"] = None
    # A review is a Node write only when both its kind and its resource say so: metrics.k8s.io
    # serves NodeMetrics as "nodes" too. Each carries an opted-in node, which a Node write would oversell.
    opted_in = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2"})
    node_metrics = node_review(opted_in, None, operation="CREATE")
    node_metrics["request"]["kind"] = {"group": "metrics.k8s.io", "version": "v1beta1", "kind": "NodeMetrics"}
    node_kind_only = node_review(opted_in, None, operation="CREATE")
    node_kind_only["request"]["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    before = server.metric("oversale_admissions_total", resource="nodes", outcome="skipped")
    for review in (other, deleted, node_metrics, node_kind_only):
        response = server.review(review, "/mutate/nodes")
        assert response == {"uid": review["request"]["uid"], "allowed": True}
    assert server.metric("oversale_admissions_total", resource="nodes", outcome="skipped") == before + 4


def test_gauges_show_real_and_oversold_side_by_side(server):
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2", KEYS.memory_oversale_ratio: "1"})
    apply_response(stored, server.review(node_review(stored, stored), "/mutate/nodes"))
    assert server.metric("oversale_node_allocatable", node=NAME, resource="cpu", value="real") == 3.92
    assert server.metric("oversale_node_allocatable", node=NAME, resource="cpu", value="oversold") == 7.84
    assert server.metric("oversale_node_oversale_ratio", node=NAME, resource="cpu") == 2
    assert server.metric("oversale_node_oversale_ratio", node=NAME, resource="memory") == 1


def test_turning_off_restores_real_values_and_counts_it(server):
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2"})
    stored = apply_response(stored, server.review(node_review(stored, stored), "/mutate/nodes"))
    before = server.metric("oversale_node_restores_total", resource="cpu")
    switched = with_annotations(stored, **{KEYS.mutate: "false"})
    restored = apply_response(switched, server.review(
        node_review(switched, stored, username="system:serviceaccount:kube-system:node-controller"),
        "/mutate/nodes"))
    assert restored["status"]["allocatable"]["cpu"] == "3920m"
    assert restored["status"]["capacity"]["cpu"] == "4"
    assert not set(KEYS.node_record_keys()) & set(restored["metadata"]["annotations"])
    assert server.metric("oversale_node_restores_total", resource="cpu") == before + 1


def test_invalid_node_ratio_is_counted_logged_and_not_applied(server):
    node = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "1e1"})
    before = server.metric("oversale_invalid_annotations_total", annotation=KEYS.cpu_oversale_ratio)
    response = server.review(node_review(node, None, subresource=None, operation="CREATE"), "/mutate/nodes")
    assert "patch" not in response
    assert any("'1e1'" in w for w in response["warnings"])
    assert server.metric("oversale_invalid_annotations_total", annotation=KEYS.cpu_oversale_ratio) == before + 1
    assert f"node {NAME}" in server.log.read_text()


def test_main_resource_update_restores_a_stale_record(server):
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2"})
    stored = apply_response(stored, server.review(node_review(stored, stored), "/mutate/nodes"))
    stale = with_annotations(stored, **{KEYS.real_allocatable: json.dumps({"cpu": "7840m"})})
    fixed = apply_response(stale, server.review(node_review(stale, stored, username="admin", subresource=None),
                                                "/mutate/nodes"))
    assert fixed["metadata"]["annotations"][KEYS.real_allocatable] == \
        stored["metadata"]["annotations"][KEYS.real_allocatable]


def test_main_resource_update_without_annotations_puts_the_record_back(server):
    """A main-resource update whose Node has no annotations map at all (a writer that saved it
    without them): the API server puts the stored, oversold status back, so the record of it
    comes back too, the only annotations the Node then has."""
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2"})
    stored = apply_response(stored, server.review(node_review(stored, stored), "/mutate/nodes"))
    bare = copy.deepcopy(stored)
    del bare["metadata"]["annotations"]
    kept = apply_response(bare, server.review(node_review(bare, stored, username="admin", subresource=None),
                                              "/mutate/nodes"))
    record = {key: value for key, value in stored["metadata"]["annotations"].items() if key in KEYS.node_record_keys()}
    assert record and kept["metadata"]["annotations"] == record


def test_each_node_review_is_counted_by_what_came_of_it(server):
    """``oversale_admissions_total{resource="nodes"}``: mutated when the write was reshaped or its
    record mended, unchanged when it was already as the webhook leaves it, skipped when it is no
    status write or main-resource update the webhook answers (a status write without the stored
    Node, which it would have to oversell blind)."""
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2"})
    reshaped = node_review(stored, stored)
    stored = apply_response(stored, server.review(node_review(stored, stored), "/mutate/nodes"))
    stale = with_annotations(stored, **{KEYS.real_allocatable: json.dumps({"cpu": "7840m"})})
    reviews = {"mutated": [reshaped, node_review(stale, stored, username="admin", subresource=None)],
               "unchanged": [node_review(stored, stored, username="admin"),
                             node_review(stored, stored, username="admin", subresource=None)],
               "skipped": [node_review(stored, None)]}

    for outcome, sent in reviews.items():
        for review in sent:
            response, counted = server.counted_review(review, "/mutate/nodes", "nodes")
            assert ("patch" in response) == (outcome == "mutated") and counted == {outcome: 1}, outcome


# ---- the validating webhook -------------------------------------------------------------------

def pod_on_node(name: str, cpu: str, memory: str = "1Gi", phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NAME, "containers": [{"name": "c", "image": "x",
                                                       "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": phase}}


@pytest.fixture(scope="module")
def validating(tmp_path_factory) -> Iterator[tuple[FakeKubeAPI, RunningWebhook]]:
    api = FakeKubeAPI().start()
    for index in range(37):
        api.put("pods", pod_on_node(f"p{index}", "150m"))      # 37 x 150m = 5550m
    api.put("pods", pod_on_node("done", "4", phase="Succeeded"))  # finished Pods hold nothing
    tmp = tmp_path_factory.mktemp("validating")
    running = RunningWebhook(tmp, env={"OVERSALE_KUBERNETES": "auto",
                                       "KUBECONFIG": str(api.write_kubeconfig(tmp / "kubeconfig"))}, workers=1)
    yield api, running
    running.stop()
    api.stop()


def oversold_node(ratio: str) -> dict:
    """The GKE Node as stored once oversold at cpu ``ratio``: its status shows the oversold
    amounts (what a check must not start from), its record the real ones."""
    node = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: ratio})
    node["metadata"]["annotations"].update({
        KEYS.real_allocatable: json.dumps({"cpu": "3920m", "memory": "12700100Ki"}),
        KEYS.real_capacity: json.dumps({"cpu": "4", "memory": "15399364Ki"}),
        KEYS.applied_oversale_ratio: json.dumps({"cpu": ratio}),
    })
    allocatable = oversold_allocatable(3920, Decimal(ratio))
    node["status"]["allocatable"]["cpu"] = f"{allocatable}m"
    node["status"]["capacity"]["cpu"] = f"{allocatable + 80}m"  # and the 80m the kubelet reserves
    return node


def test_lowering_below_the_requests_is_refused_with_an_actionable_message(validating):
    _, server = validating
    stored = oversold_node("2")
    lowered = with_annotations(stored, **{KEYS.cpu_oversale_ratio: "1.2"})
    response, counted = server.counted_review(node_review(lowered, stored, username="admin", subresource=None),
                                              "/validate/nodes", "nodes-validate")
    assert response["allowed"] is False and counted == {"denied": 1}
    assert response["status"] == {"code": 403, "message": (
        f"cpu-oversale-ratio 1.2 gives 4704m allocatable; the 37 pods on {NAME} request 5550m; "
        "the lowest safe ratio is 1.42")}


def test_a_node_oversold_while_the_webhook_was_away_is_checked_from_its_status(validating):
    # With no record (the webhook failed open on every status write since the ratio was set), the
    # stored status still holds the kubelet's real values: a cut is checked against those.
    _, server = validating
    stored = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2"})
    assert stored["status"]["allocatable"]["cpu"] == "3920m"
    lowered = with_annotations(stored, **{KEYS.cpu_oversale_ratio: "1.2"})
    response = server.review(node_review(lowered, stored, username="admin", subresource=None), "/validate/nodes")
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"cpu-oversale-ratio 1.2 gives 4704m allocatable; the 37 pods on {NAME} request 5550m; "
        "the lowest safe ratio is 1.42")


def test_safe_changes_are_allowed(validating):
    _, server = validating
    stored = oversold_node("2")
    for ratio in ("1.42", "2.5"):
        changed = with_annotations(stored, **{KEYS.cpu_oversale_ratio: ratio})
        review = node_review(changed, stored, username="admin", subresource=None)
        response, counted = server.counted_review(review, "/validate/nodes", "nodes-validate")
        assert response == {"uid": review["request"]["uid"], "allowed": True} and counted == {"allowed": 1}


def test_lowering_cpu_and_memory_below_the_requests_names_both(validating):
    _, server = validating
    stored = with_annotations(oversold_node("2"), **{
        KEYS.memory_oversale_ratio: "2", KEYS.applied_oversale_ratio: json.dumps({"cpu": "2", "memory": "2"})})
    lowered = with_annotations(stored, **{KEYS.cpu_oversale_ratio: "1.2", KEYS.memory_oversale_ratio: "1.5"})
    response = server.review(node_review(lowered, stored, username="admin", subresource=None), "/validate/nodes")
    assert response["allowed"] is False
    # 37 Pods x 1Gi = 38797312Ki on 12700100Ki of real memory: 3.06 at least, above the maximum 2.
    assert response["status"]["message"] == (
        f"cpu-oversale-ratio 1.2 gives 4704m allocatable; the 37 pods on {NAME} request 5550m; the lowest safe "
        f"ratio is 1.42; memory-oversale-ratio 1.5 gives 19050150Ki allocatable; the 37 pods on {NAME} request "
        f"37Gi; the lowest safe ratio is 3.06, above the maximum 2: move pods off {NAME} first")


def test_pods_requesting_exactly_the_lowered_allocatable_still_fit(validating):
    assert cut_with(validating, pod_on_node("exact", "330m"), "2", "1.5")["allowed"] is True  # 5880m of 5880m
    assert cut_with(validating, pod_on_node("over", "331m"), "2", "1.5")["allowed"] is False


def test_the_app_asks_the_cluster_only_for_what_it_is_not_given(tmp_path, monkeypatch):
    """create_app connects to the configured cluster for the owners or node Pods it is not handed
    (in-process here, through Flask's test client): handed both, it asks the API server for
    nothing; handed the owners only, the validating webhook lists the node's Pods there."""
    api = FakeKubeAPI().start()
    try:
        for index in range(37):
            api.put("pods", pod_on_node(f"p{index}", "150m"))      # 37 x 150m = 5550m
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        settings = Settings(kubernetes="auto")
        stored = oversold_node("2")
        review = node_review(with_annotations(stored, **{KEYS.cpu_oversale_ratio: "1.2"}), stored,
                             username="admin", subresource=None)

        handed_both = create_app(settings, owners=NoCluster(), node_pods=NoClusterPods()).test_client()
        assert handed_both.post("/validate/nodes", json=review).status_code == 200
        time.sleep(0.5)  # an owner cache started by mistake would have listed its kinds by now
        assert api.requests == []

        handed_owners = create_app(settings, owners=NoCluster()).test_client()
        response = handed_owners.post("/validate/nodes", json=review).get_json()["response"]
        assert response["allowed"] is False and "the 37 pods" in response["status"]["message"]
        time.sleep(0.5)
        assert [r.path for r in api.requests] == ["/api/v1/pods"], "the node's Pods, and no owner kind watched"
    finally:
        api.stop()


def test_an_app_with_no_cluster_to_reach_says_it_serves_with_pod_annotations_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    with caplog.at_level("INFO", logger="webhook.app"):
        create_app(Settings(kubernetes="auto"))
        create_app(Settings(kubernetes="off"))  # asked for no cluster: nothing to say
    assert [r.getMessage() for r in caplog.records if r.name == "webhook.app"] == [
        "no in-cluster config and no kubeconfig: serving with Pod annotations only"]


def cut_with(validating: tuple[FakeKubeAPI, RunningWebhook], extra: dict, stored_ratio: str, asked: str) -> dict:
    """The validating webhook's answer to an admin cutting the node's cpu ratio from
    ``stored_ratio`` to ``asked`` while the Pod ``extra`` runs there too."""
    api, server = validating
    api.put("pods", extra)
    try:
        stored = oversold_node(stored_ratio)
        lowered = with_annotations(stored, **{KEYS.cpu_oversale_ratio: asked})
        return server.review(node_review(lowered, stored, username="admin", subresource=None), "/validate/nodes")
    finally:
        api.delete("pods", "default", extra["metadata"]["name"])


def test_a_pod_resized_down_in_place_counts_what_the_kubelet_still_holds(validating):
    # Until the kubelet applies an in-place downsize, the node still holds the old request (and
    # kube-scheduler counts it): a ratio safe for the lowered spec is not safe yet.
    shrinking = pod_on_node("shrinking", "150m")
    shrinking["status"]["containerStatuses"] = [{"name": "c", "allocatedResources": {"cpu": "1"},
                                                 "resources": {"requests": {"cpu": "1"}}}]
    response = cut_with(validating, shrinking, "2", "1.5")  # 5880m; the specs sum to 5700m
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"cpu-oversale-ratio 1.5 gives 5880m allocatable; the 38 pods on {NAME} request 6550m; "
        "the lowest safe ratio is 1.68")


def test_a_node_whose_pods_need_more_than_the_largest_ratio_says_to_move_pods_first(validating):
    # The Pods may come to request more than the largest ratio holds (the node's real allocatable
    # shrank with a kubelet reservation, a Pod grew in place): no ratio the reconciler may write
    # makes a cut safe, and the refusal says what will.
    response = cut_with(validating, pod_on_node("big", "15"), "5", "4")  # 20550m on 3920m real: 5.24x
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"cpu-oversale-ratio 4 gives 15680m allocatable; the 38 pods on {NAME} request 20550m; "
        f"the lowest safe ratio is 5.25, above the maximum 5: move pods off {NAME} first")


def test_a_cut_the_pods_need_exactly_the_largest_ratio_for_names_that_ratio(validating):
    # 37 x 150m + 14050m = 19600m = 5 x 3920m: the largest ratio still holds them, so no move is asked for.
    response = cut_with(validating, pod_on_node("big", "14050m"), "5", "4")
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"cpu-oversale-ratio 4 gives 15680m allocatable; the 38 pods on {NAME} request 19600m; "
        "the lowest safe ratio is 5")


def test_writes_that_lower_no_ratio_are_allowed_without_listing_the_pods(validating):
    """Only a cut needs the node's Pods: raises, status writes, creations and other objects are
    allowed at once, without a request to the API server."""
    api, server = validating
    stored = oversold_node("2")
    raised = with_annotations(stored, **{KEYS.cpu_oversale_ratio: "3"})
    lowered = with_annotations(stored, **{KEYS.cpu_oversale_ratio: "1"})
    other = node_review(lowered, stored, username="admin", subresource=None)
    other["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    other["request"]["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    reviews = [node_review(raised, stored, username="admin", subresource=None),
               node_review(stored, stored, username="admin", subresource=None),
               node_review(lowered, stored, username="admin"),                 # through nodes/status
               node_review(lowered, None, username="admin", subresource=None, operation="CREATE"),
               other]
    listed = api.count("GET", "pods")
    errors = server.metric("oversale_admissions_total", resource="nodes-validate", outcome="error")
    for review in reviews:
        assert server.review(review, "/validate/nodes") == {"uid": review["request"]["uid"], "allowed": True}
    assert api.count("GET", "pods") == listed
    assert server.metric("oversale_admissions_total", resource="nodes-validate", outcome="error") == errors


def test_removing_the_ratio_is_checked_too(validating):
    _, server = validating
    stored = oversold_node("2")
    removed = copy.deepcopy(stored)
    del removed["metadata"]["annotations"][KEYS.cpu_oversale_ratio]
    response = server.review(node_review(removed, stored, username="admin", subresource=None), "/validate/nodes")
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("removing cpu-oversale-ratio gives 3920m allocatable")
    # The reconciler stops overselling by writing 1; a user may switch the node off: each is named
    # as it was asked, not as a removal.
    for change, asked in (({KEYS.cpu_oversale_ratio: "1"}, "cpu-oversale-ratio 1"),
                          ({KEYS.mutate: "n"}, f"{KEYS.mutate.split('/')[-1]} n"),
                          ({KEYS.mutate: "perhaps"}, f"{KEYS.mutate.split('/')[-1]} perhaps")):
        changed = with_annotations(stored, **change)
        response = server.review(node_review(changed, stored, username="admin", subresource=None), "/validate/nodes")
        assert response["allowed"] is False
        assert response["status"]["message"].startswith(f"{asked} gives 3920m allocatable"), asked


def test_unreachable_api_allows_with_a_warning(validating):
    api, server = validating
    stored = oversold_node("2")
    lowered = with_annotations(stored, **{KEYS.cpu_oversale_ratio: "1"})
    api.down = True
    try:
        response = server.review(node_review(lowered, stored, username="admin", subresource=None), "/validate/nodes")
    finally:
        api.down = False
    assert response["allowed"] is True
    assert response["warnings"] == [f"could not check the Pods on {NAME} (HTTP 503 Service Unavailable); ratio "
                                    "change allowed unchecked"]
    assert f"node {NAME}: could not list its Pods" in server.log.read_text()


def test_a_node_no_longer_reviewed_leaves_the_metrics(tmp_path):
    # The webhook never hears of a node's deletion; a node still there is reviewed at least every
    # nodeStatusReportFrequency. Both workers serve reviews, so the series live in both files.
    running = RunningWebhook(tmp_path, env={"OVERSALE_NODE_SERIES_TTL": "2s"})
    try:
        gone = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "2"})
        gone["metadata"]["name"] = "deleted-node"
        running.review(node_review(gone, None, username="system:node:deleted-node", operation="CREATE"),
                       "/mutate/nodes")
        live = with_annotations(gke_node(), **{KEYS.cpu_oversale_ratio: "1.5"})
        running.review(node_review(live, live), "/mutate/nodes")
        assert running.metric("oversale_node_oversale_ratio", node="deleted-node", resource="cpu") == 2
        assert running.metric("oversale_node_oversale_ratio", node=NAME, resource="cpu") == 1.5
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # heartbeats of the live node only
            running.review(node_review(live, live), "/mutate/nodes")
            time.sleep(0.25)
        status, body = running.get("/metrics")
        assert status == 200 and b'node="deleted-node"' not in body
        assert b"# TYPE oversale_node_oversale_ratio gauge" in body
        # The text format allows one TYPE line a family: those with samples in the files are not
        # listed again among the families no worker has written yet.
        types = [line for line in body.splitlines() if line.startswith(b"# TYPE ")]
        assert len(types) == len(set(types)) and b"# TYPE oversale_admissions_total counter" in types
        # The workers' sweeps drop the deleted node's series without the client's warning that
        # multiprocess files keep removed samples (the exposition filters those by age).
        assert "UserWarning" not in running.log.read_text(), running.log.read_text()
        assert running.metric("oversale_node_oversale_ratio", node=NAME, resource="cpu") == 1.5
        assert running.metric("oversale_node_allocatable", node=NAME, resource="cpu", value="real") == 3.92
        # The node comes back (same name, new object): its series return at once.
        running.review(node_review(gone, None, username="system:node:deleted-node", operation="CREATE"),
                       "/mutate/nodes")
        assert running.metric("oversale_node_oversale_ratio", node="deleted-node", resource="cpu") == 2
    finally:
        running.stop()
