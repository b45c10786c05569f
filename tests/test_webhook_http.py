"""The webhook as deployed: ``python -m webhook`` (gunicorn, gthread, TLS) on loopback, answering
real AdmissionReview v1 payloads. No cluster here: Pod annotations only."""

from __future__ import annotations

import base64
import copy
import json
import socket
import ssl

import pytest
from kubernetes import client

from oversale.annotations import AnnotationKeys
from oversale.pods import effective_request, qos_class, requests_of
from tests.conftest import FRONTEND_POD, POD_FIXTURES, RunningWebhook, apply_response, load_fixture_pod, pod_review

KEYS = AnnotationKeys()


def with_ratios(pod, cpu="2", memory=None):
    pod = copy.deepcopy(pod)
    annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[KEYS.cpu_requests_ratio] = cpu
    if memory:
        annotations[KEYS.memory_requests_ratio] = memory
    return pod


def units(pod):
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def test_certificates_are_created_and_verify_for_localhost_and_ip(webhook_no_cluster):
    for name in ("ca.crt", "tls.crt", "tls.key"):
        assert (webhook_no_cluster.certs / name).is_file()
    assert (webhook_no_cluster.certs / "tls.key").stat().st_mode & 0o077 == 0
    context = webhook_no_cluster.context()
    for host in ("localhost", "127.0.0.1"):
        with socket.create_connection(("127.0.0.1", webhook_no_cluster.port)) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with socket.create_connection(("127.0.0.1", webhook_no_cluster.port)) as raw, pytest.raises(ssl.SSLError):
        ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")


def test_health_and_readiness_without_a_cluster(webhook_no_cluster):
    assert webhook_no_cluster.get("/healthz")[0] == 200
    assert webhook_no_cluster.get("/readyz")[0] == 200
    log = webhook_no_cluster.log.read_text()
    assert log.count("serving with Pod annotations only") == 1


def test_serving_writes_nothing_under_home(webhook_no_cluster):
    """The deployed image's HOME is read-only: gunicorn's runtime control socket, which it makes
    under $HOME/.gunicorn by default, would stop the server from starting there."""
    assert webhook_no_cluster.get("/healthz")[0] == 200
    assert list(webhook_no_cluster.home.iterdir()) == []


@pytest.mark.shared
@pytest.mark.parametrize("path", POD_FIXTURES, ids=lambda p: p.stem)
def test_every_fixture_pod_gets_a_valid_patch(webhook_no_cluster, path):
    original = with_ratios(load_fixture_pod(path), cpu="2", memory="1.5")
    response = webhook_no_cluster.review(pod_review(original))
    assert response["allowed"] is True
    mutated = apply_response(original, response)
    client.V1Pod.from_dict(mutated)  # still a valid Pod for the real client's models

    assert qos_class(mutated) == qos_class(original)
    for before, after in zip(units(original), units(mutated), strict=True):
        assert (after.get("resources") or {}).get("limits") == (before.get("resources") or {}).get("limits")
        for resource, amount in requests_of(before).items():
            assert requests_of(after)[resource] <= amount
    if qos_class(original) == "Guaranteed":
        assert "patch" not in response
        assert any("Guaranteed" in w for w in response["warnings"])
    elif any(requests_of(c).get("cpu", 0) > 20 for c in units(original)):
        assert "patch" in response
        assert effective_request(mutated, "cpu") < effective_request(original, "cpu")
        recorded = json.loads(mutated["metadata"]["annotations"][KEYS.original_requests])
        assert set(recorded) >= {c["name"] for c in units(original) if requests_of(c)}


@pytest.mark.shared
def test_second_pass_over_the_mutated_pod_changes_nothing(webhook_no_cluster):
    original = with_ratios(load_fixture_pod(FRONTEND_POD), cpu="3.7", memory="2")
    once = apply_response(original, webhook_no_cluster.review(pod_review(original)))
    again = webhook_no_cluster.review(pod_review(once))
    assert "patch" not in again
    assert apply_response(once, again) == once


@pytest.mark.shared
def test_patch_escapes_the_slash_in_annotation_keys(webhook_no_cluster):
    response = webhook_no_cluster.review(pod_review(with_ratios(load_fixture_pod(FRONTEND_POD))))
    paths = {op["path"] for op in json.loads(base64.b64decode(response["patch"]))}
    assert "/metadata/annotations/stke.platform~1original-requests" in paths
    assert "/metadata/annotations/stke.platform~1compression" in paths


@pytest.mark.shared
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"operation": "UPDATE"}, "operation"),
        ({"subResource": "status"}, "subresource"),
        ({"namespace": "kube-system"}, "namespace"),
    ],
)
def test_non_create_subresources_and_excluded_namespaces_are_left_alone(webhook_no_cluster, change, reason):
    review = pod_review(with_ratios(load_fixture_pod(FRONTEND_POD)))
    review["request"].update(change)
    response = webhook_no_cluster.review(review)
    assert response == {"uid": review["request"]["uid"], "allowed": True}


@pytest.mark.shared
def test_each_pod_review_is_counted_by_what_came_of_it(webhook_no_cluster):
    """``oversale_admissions_total{resource="pods"}``: mutated when requests changed, skipped when
    they were left as they came (no ratio, switched off, not a CREATE), unchanged when compressed
    and already as compression leaves them (a Pod created again from a compressed one's spec)."""
    frontend = load_fixture_pod(FRONTEND_POD)
    compressed = apply_response(with_ratios(frontend), webhook_no_cluster.review(pod_review(with_ratios(frontend))))
    switched_off = with_ratios(frontend)
    switched_off["metadata"]["annotations"][KEYS.enable_resource_compress] = "n"
    reviews = {"mutated": [pod_review(with_ratios(frontend))],
               "skipped": [pod_review(frontend), pod_review(switched_off), pod_review(frontend, "UPDATE")],
               "unchanged": [pod_review(compressed)]}

    for outcome, sent in reviews.items():
        for review in sent:
            response, counted = webhook_no_cluster.counted_review(review, "/mutate/pods", "pods")
            assert ("patch" in response) == (outcome == "mutated") and counted == {outcome: 1}, outcome


@pytest.mark.shared
def test_the_debug_log_says_why_each_pod_was_left_alone_or_what_was_done(caplog):
    """A decision's reasons, and with OVERSALE_LOG_LEVEL=DEBUG one line per Pod that reached the
    compression policy; warnings name the Pod and its owner."""
    from oversale.settings import Settings
    from tests.test_pod_answers import Namespaces
    from webhook.pod_admission import admit_pod

    settings = Settings(kubernetes="off")
    frontend = load_fixture_pod(FRONTEND_POD)
    no_namespace = pod_review(copy.deepcopy(frontend))
    del no_namespace["request"]["namespace"]  # the Pod's own namespace is taken
    no_namespace["request"]["object"]["metadata"]["namespace"] = "kube-system"
    no_object = pod_review(frontend)
    no_object["request"]["object"] = None
    cases = [
        (pod_review(with_ratios(frontend)), ["cpu ratio 2: 100m -> 50m"]),
        (pod_review(frontend), ["no compression ratio set"]),
        (no_namespace, ["namespace kube-system is excluded"]),
        (no_object, ["review has no object"]),
        (pod_review(frontend, kind={"group": "", "version": "v1", "kind": "Node"}), ["not a Pod (Node)"]),
        (pod_review(frontend, subResource="status"), ["subresource status"]),
        (pod_review(frontend, operation="UPDATE"), ["operation UPDATE"]),
    ]
    for review, reasons in cases:
        assert admit_pod(review["request"], settings, Namespaces()).reasons == reasons

    name = f"{frontend['metadata']['generateName']}*"  # named after admission
    caplog.set_level("DEBUG", logger="webhook.pod_admission")
    unowned = Namespaces(problem="could not read the owner (timed out)")
    review = admit_pod(pod_review(with_ratios(frontend, cpu="x"))["request"], settings, unowned).review
    assert review["response"]["warnings"][0] == \
        "could not read the owner (timed out); only the Pod's own annotations were used"
    owned = Namespaces(workload={KEYS.cpu_requests_ratio: "0"}, name="Deployment/default/frontend")
    admit_pod(pod_review(frontend)["request"], settings, owned)
    named = with_ratios(frontend, cpu="x")
    named["metadata"]["name"] = "frontend-static"  # a Pod named in its manifest is logged by that name
    admit_pod(pod_review(named)["request"], settings, Namespaces())
    assert [record.getMessage() for record in caplog.records] == [
        f"pod default/{name}: could not read the owner (timed out)",
        f"pod default/{name} (owner none): annotation {KEYS.cpu_requests_ratio}='x' ignored: 'x' is not a plain "
        "decimal number such as 1, 1.5 or 2.25; cpu not compressed",
        f"pod default/{name}: skipped ['no compression ratio set']",
        f"pod default/{name} (owner Deployment/default/frontend): annotation {KEYS.cpu_requests_ratio}='0' "
        "ignored: '0' is not above 0 (a ratio of 1 means no change, 0.5 doubles the request); cpu not compressed",
        f"pod default/{name}: skipped ['no compression ratio set']",
        f"pod default/frontend-static (owner none): annotation {KEYS.cpu_requests_ratio}='x' ignored: 'x' is not a "
        "plain decimal number such as 1, 1.5 or 2.25; cpu not compressed",
        "pod default/frontend-static: skipped ['no compression ratio set']",
    ]


@pytest.mark.shared
def test_invalid_ratio_warns_names_the_value_and_counts(webhook_no_cluster):
    before = webhook_no_cluster.metric("oversale_invalid_annotations_total", annotation=KEYS.cpu_requests_ratio)
    pod = with_ratios(load_fixture_pod(FRONTEND_POD), cpu="1e3", memory="2")
    response = webhook_no_cluster.review(pod_review(pod))
    mutated = apply_response(pod, response)
    container = mutated["spec"]["containers"][0]["resources"]["requests"]
    assert container == {"cpu": "100m", "memory": "50Mi"}, "cpu untouched, memory still compressed"
    assert any(KEYS.cpu_requests_ratio in w and "'1e3'" in w for w in response["warnings"])
    after = webhook_no_cluster.metric("oversale_invalid_annotations_total", annotation=KEYS.cpu_requests_ratio)
    assert after == before + 1


@pytest.mark.shared
def test_a_warning_longer_than_the_api_server_keeps_is_cut_where_the_user_sees_it_cut(webhook_no_cluster):
    # The API server may truncate a warning over 256 characters; we cut it first and say so.
    value = "9" * 300
    response = webhook_no_cluster.review(pod_review(with_ratios(load_fixture_pod(FRONTEND_POD), cpu=value)))
    [warning] = response["warnings"]
    assert len(warning) == 256
    assert warning.startswith(f"annotation {KEYS.cpu_requests_ratio}='999") and warning.endswith("99...")


def test_warnings_are_kept_whole_up_to_256_characters_and_10_in_number():
    from webhook.reviews import allow

    sent = ["a" * 256, "b" * 257, *(f"warning {n}" for n in range(3, 13))]
    kept = allow("uid", warnings=sent)["response"]["warnings"]
    assert kept == ["a" * 256, "b" * 253 + "...", *(f"warning {n}" for n in range(3, 11))]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "body is not JSON: "),
        (b"[]", "body is not a JSON object"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(),
         "expected apiVersion admission.k8s.io/v1 kind AdmissionReview, got apiVersion 'admission.k8s.io/v1beta1' "
         "kind 'AdmissionReview'"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}).encode(),
         "request has no uid"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}).encode(),
         "review has no request"),
        *[(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u1", "kind": {"kind": "Pod"}, "resource": {"resource": "pods"}, "operation": "CREATE",
            "object": {}, **broken}}).encode(), said) for broken, said in [
                ({"kind": None}, "request has no kind"), ({"resource": "pods"}, "request has no resource"),
                ({"operation": None}, "request has no operation"),
                ({"object": "a Pod"}, "request.object is not an object"),
                ({"oldObject": []}, "request.oldObject is not an object")]],
        (b"{" + b" " * (7 * 2**20) + b"}", "body larger than 6291456 bytes"),
    ],
)
def test_malformed_bodies_get_a_clear_400(webhook_no_cluster, body, message):
    before = webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="malformed")
    status, answer = webhook_no_cluster.request("POST", "/mutate/pods", body, {"Content-Type": "application/json"})
    assert status == 400
    said = json.loads(answer)["error"]
    # The whole message where it is ours; JSON's own words follow the first one's colon.
    assert said.startswith(message) if message.endswith(": ") else said == message
    after = webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="malformed")
    assert after == before + 1


def test_a_chunked_body_over_the_limit_gets_the_same_clear_400(webhook_no_cluster):
    # Without a Content-Length the size is known only once read: the webhook stops at the limit.
    before = webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="malformed")
    connection = webhook_no_cluster.connection()
    connection.putrequest("POST", "/mutate/pods")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    chunk = b" " * 2**20
    for _ in range(7):
        connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    connection.send(b"0\r\n\r\n")
    response = connection.getresponse()
    assert response.status == 400 and "larger than" in json.loads(response.read())["error"]
    connection.close()
    assert webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="malformed") == before + 1


@pytest.mark.shared
def test_internal_error_fails_open_without_patch(webhook_no_cluster):
    # A quantity no API server would accept makes the policy raise: the answer is still allowed.
    pod = with_ratios(load_fixture_pod(FRONTEND_POD))
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    before = webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="error")
    review = pod_review(pod)
    response = webhook_no_cluster.review(review)
    assert response == {"uid": review["request"]["uid"], "allowed": True}
    assert webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="error") == before + 1


@pytest.mark.shared
def test_keep_alive_serves_many_reviews_on_one_connection(webhook_no_cluster):
    connection = webhook_no_cluster.connection()
    pod = with_ratios(load_fixture_pod(FRONTEND_POD))
    sockets = set()
    for _ in range(20):
        connection.request("POST", "/mutate/pods", json.dumps(pod_review(pod)).encode(),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        response.read()
        sockets.add(id(connection.sock))
    assert len(sockets) == 1, "the connection was closed between requests"
    connection.close()


@pytest.mark.shared
def test_metrics_aggregate_over_workers(webhook_no_cluster):
    pod = with_ratios(load_fixture_pod(FRONTEND_POD))
    before = webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="mutated")
    freed_before = webhook_no_cluster.metric("oversale_requests_freed_millicores_total", namespace="default")
    for _ in range(12):  # separate connections, so both workers serve some
        webhook_no_cluster.review(pod_review(pod))
    assert webhook_no_cluster.metric("oversale_admissions_total", resource="pods", outcome="mutated") == before + 12
    freed = webhook_no_cluster.metric("oversale_requests_freed_millicores_total", namespace="default")
    assert freed == freed_before + 12 * 50
    assert webhook_no_cluster.metric("oversale_admission_duration_seconds_count", resource="pods") >= 12


@pytest.mark.shared
def test_a_dry_run_is_answered_like_the_write_itself_but_frees_nothing(webhook_no_cluster):
    """``kubectl apply --dry-run=server`` asks the webhook too: it gets the same answer, but no Pod
    is created, so the freed-requests counter does not move for it."""
    pod = with_ratios(load_fixture_pod(FRONTEND_POD))

    def freed() -> float:
        return webhook_no_cluster.metric("oversale_requests_freed_millicores_total", namespace="default")

    before = freed()
    dry_run = webhook_no_cluster.review(pod_review(pod, dryRun=True))
    assert freed() == before
    assert webhook_no_cluster.review(pod_review(pod))["patch"] == dry_run["patch"]
    assert freed() == before + 50


def test_a_fresh_webhook_lists_every_metric_family_before_any_review(tmp_path):
    from webhook.metrics import Metrics

    server = RunningWebhook(tmp_path)  # multiprocess metrics, as deployed; nothing answered yet
    try:
        status, body = server.get("/metrics")
        assert status == 200
        text = body.decode()
        for collector in vars(Metrics()).values():
            for family in getattr(collector, "describe", lambda: [])():
                name = family.name + ("_total" if family.type == "counter" else "")
                assert f"# HELP {name} {family.documentation}\n# TYPE {name} {family.type}\n" in text, name
    finally:
        server.stop()


def test_in_process_metrics_forget_a_node_no_longer_reviewed(monkeypatch):
    import time

    from webhook.metrics import Metrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)  # one registry, as under Flask alone
    metrics = Metrics(node_series_ttl=0.4)
    metrics.set_gauge(metrics.node_ratio, ("gone", "cpu"), 2.0)
    metrics.set_gauge(metrics.node_ratio, ("live", "cpu"), 1.5)
    for _ in range(4):
        time.sleep(0.15)
        metrics.set_gauge(metrics.node_ratio, ("live", "cpu"), 1.5)
    text = metrics.exposition()[0].decode()
    assert 'oversale_node_oversale_ratio{node="live",resource="cpu"} 1.5' in text
    assert 'node="gone"' not in text
    metrics.set_gauge(metrics.node_ratio, ("gone", "cpu"), 2.0)
    assert 'oversale_node_oversale_ratio{node="gone",resource="cpu"} 2.0' in metrics.exposition()[0].decode()


def test_in_process_metrics_write_a_changed_value_at_once_and_forget_nodes_no_review_mentions(monkeypatch):
    """Only a repeated value skips its write: a ratio changed a moment after the last review shows
    at once. A webhook that reviews nothing for the time to live (its last nodes deleted) shows
    none of their series at the next scrape. And a worker lets go of what it held for a node
    gone at the next review after the time to live, scraped or not: in an autoscaled cluster,
    nodes come and go all day."""
    import time

    from webhook.metrics import Metrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics(node_series_ttl=0.4)
    metrics.set_gauge(metrics.node_ratio, ("n", "cpu"), 1.5)
    metrics.set_gauge(metrics.node_ratio, ("n", "cpu"), 2.0)
    assert 'oversale_node_oversale_ratio{node="n",resource="cpu"} 2.0' in metrics.exposition()[0].decode()
    time.sleep(0.5)
    assert 'node="n"' not in metrics.exposition()[0].decode()
    metrics.set_gauge(metrics.node_ratio, ("gone", "cpu"), 2.0)
    time.sleep(0.5)
    metrics.set_gauge(metrics.node_ratio, ("live", "cpu"), 1.5)
    assert [labels for _, labels in metrics._last_set] == [labels for _, labels in metrics._children] == \
        [("live", "cpu")]


@pytest.mark.shared
def test_the_lean_admission_path_keeps_the_wire_contract(webhook_no_cluster):
    # Chunked bodies (no Content-Length) are read too; other methods and paths still reach Flask.
    connection = webhook_no_cluster.connection()
    review = pod_review(with_ratios(load_fixture_pod(FRONTEND_POD)))
    body = json.dumps(review).encode()
    connection.putrequest("POST", "/mutate/pods")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    connection.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200 and response.getheader("Content-Type") == "application/json"
    assert answer["response"]["uid"] == review["request"]["uid"] and answer["response"]["patch"]
    connection.close()
    # Every refusal is JSON, whether the admission routes or Flask's routing answer it.
    for method, path, status in (("GET", "/mutate/pods", 405), ("POST", "/healthz", 405),
                                 ("POST", "/mutate/other", 404), ("GET", "/nowhere", 404)):
        answered, body = webhook_no_cluster.request(method, path, b"{}" if method == "POST" else None)
        assert answered == status and json.loads(body)["error"].startswith(str(status)), (method, path, body)


def test_the_demo_shows_compression_and_overselling_without_a_cluster(tmp_path):
    """``make demo`` on a machine whose kubeconfig names a cluster: four cases, each what went in,
    what came out and why, and not one request to that cluster."""
    import subprocess
    import sys

    from tests.conftest import ROOT, cli_env
    from tests.kube_api import FakeKubeAPI

    api = FakeKubeAPI().start()
    try:
        out = subprocess.run([sys.executable, "-m", "webhook.demo"], cwd=ROOT, env=cli_env(api, tmp_path),
                             capture_output=True, text=True, timeout=60)
        assert api.requests == [], "the demo reads no cluster, whatever the kubeconfig names"
    finally:
        api.stop()
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", "no log noise around the output"
    *cases, hint = out.stdout.split("\n\n")
    assert [case.splitlines()[1].strip() for case in cases] == ["POST /mutate/pods"] * 3 + ["POST /mutate/nodes"]
    assert all(case.startswith("== ") and case.endswith("allowed:  True") for case in cases)
    compressed, guaranteed, invalid, node = cases
    assert 'before:   app {"cpu": "1", "memory": "1Gi"}, proxy {"cpu": "200m", "memory": "128Mi"}' in compressed
    assert 'after:    app {"cpu": "500m", "memory": "1Gi"}, proxy {"cpu": "100m", "memory": "128Mi"}' in compressed
    assert "audit:    stke.platform/compression: cpu ratio 2: 1200m -> 600m" in compressed
    assert 'after:    db {"cpu": "2", "memory": "4Gi"}' in guaranteed and "patch:" not in guaranteed
    assert "warning:  Guaranteed Pod not compressed" in guaranteed
    assert "'fast' is not a plain decimal number" in invalid and "patch:" not in invalid
    assert 'before:   {"cpu": "15890m", "memory": "61Gi", "pods": "110"}' in node
    assert 'after:    {"cpu": "23835m", "memory": "61Gi", "pods": "110"}' in node
    assert 'replace /status/allocatable/cpu "23835m"' in node
    # The closing hint sends a sample review to the served webhook: that sample must be one.
    assert "`make run`" in hint and "-d @docs/examples/pod-review.json" in hint
    sample = json.loads((ROOT / "docs" / "examples" / "pod-review.json").read_text())
    assert sample["kind"] == "AdmissionReview" and sample["request"]["object"]["kind"] == "Pod"


def test_a_restarted_webhook_counts_from_zero_though_its_metrics_dir_outlived_it(tmp_path):
    """The Deployment's --metrics-dir is an emptyDir, which outlives a container restart: the files
    the last run's workers left there would be added to the new run's counts."""
    first = RunningWebhook(tmp_path)
    try:
        assert first.request("POST", "/mutate/pods", b"{", {"Content-Type": "application/json"})[0] == 400
        assert first.metric("oversale_admissions_total", resource="pods", outcome="malformed") == 1
    finally:
        first.stop()
    assert list((tmp_path / "metrics").glob("*.db")), "the first run's samples are there"
    second = RunningWebhook(tmp_path)
    try:
        assert second.metric("oversale_admissions_total", resource="pods", outcome="malformed") == 0
    finally:
        second.stop()


def test_a_webhook_told_to_find_a_cluster_and_finding_none_serves_without_one(tmp_path):
    """OVERSALE_KUBERNETES=auto with no in-cluster config and no kubeconfig (as on a laptop): it
    says so once and serves with Pod annotations alone."""
    server = RunningWebhook(tmp_path, env={"OVERSALE_KUBERNETES": "auto"})
    try:
        assert server.get("/readyz")[0] == 200
    finally:
        server.stop()
    said = server.log.read_text()
    assert said.count("no cluster (no in-cluster config and no kubeconfig): serving with Pod annotations only") == 1
