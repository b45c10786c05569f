"""deploy/ rendered by kustomize and validated offline, strictly, against the Kubernetes OpenAPI
schemas; the invariants a cluster operator relies on; and the Dockerfile's properties (no Docker
engine runs here, so it is read, not built)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import celpy
import kubernetes_validate
import prometheus_client
import pytest
import yaml

from kube.server import gunicorn_options
from oversale.settings import Settings
from tests.conftest import ROOT, no_cluster_app

OVERLAYS = ["base", "overlays/self-signed", "overlays/cert-manager", "monitoring", "network-policies"]
# 1.33, the release the API double speaks and in-place resize needs, and the newest whose schemas
# kubernetes-validate ships: a field added after the first or removed by the second fails one.
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
# cert-manager's and Prometheus Operator's; no schema for them ships with kubernetes-validate
CRD_KINDS = {"Certificate", "Issuer", "PrometheusRule", "PodMonitor"}


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with kustomize) is needed to render deploy/"
    result = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy" / overlay)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> list[dict]:
    return render(request.param)


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_strictly(rendered, version):
    skipped = set()
    for obj in rendered:
        if obj["kind"] in CRD_KINDS:
            skipped.add(obj["kind"])
            continue
        kubernetes_validate.validate(obj, version, strict=True)
    assert skipped <= CRD_KINDS


def test_pod_webhook_is_safe_for_the_cluster(rendered):
    (mutating,) = by_kind(rendered, "MutatingWebhookConfiguration")
    webhooks = {w["name"]: w for w in mutating["webhooks"]}
    pods = webhooks["pods.oversale.stke.platform"]
    assert pods["failurePolicy"] == "Ignore" and pods["sideEffects"] == "None"
    assert pods["timeoutSeconds"] <= 5
    assert pods["reinvocationPolicy"] == "IfNeeded" and pods["matchPolicy"] == "Equivalent"
    assert pods["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    (expression,) = pods["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
    assert set(expression["values"]) == {"kube-system", "kube-public", "kube-node-lease", "oversale"}


def test_node_webhooks_only_see_opted_in_nodes(rendered):
    (mutating,) = by_kind(rendered, "MutatingWebhookConfiguration")
    (validating,) = by_kind(rendered, "ValidatingWebhookConfiguration")
    nodes = next(w for w in mutating["webhooks"] if w["name"].startswith("nodes."))
    assert nodes["rules"][0]["resources"] == ["nodes", "nodes/status"]
    assert nodes["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    for webhook in [nodes, *validating["webhooks"]]:
        assert webhook["failurePolicy"] == "Ignore" and webhook["timeoutSeconds"] <= 5
        assert webhook["objectSelector"] == {"matchLabels": {"stke.platform/oversale": "enabled"}}
    assert validating["webhooks"][0]["rules"][0]["operations"] == ["UPDATE"]
    assert validating["webhooks"][0]["rules"][0]["resources"] == ["nodes"]


def test_node_match_condition_lets_through_exactly_what_the_webhook_needs():
    mutating = by_kind(render("base"), "MutatingWebhookConfiguration")[0]
    nodes = next(w for w in mutating["webhooks"] if w["name"].startswith("nodes."))
    (condition,) = nodes["matchConditions"]
    environment = celpy.Environment()
    program = environment.program(environment.compile(condition["expression"]))

    def reaches(operation, obj, old=None):
        return bool(program.evaluate({"request": celpy.json_to_cel({"operation": operation}),
                                      "object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old)}))

    def node(**annotations):
        return {"metadata": {"name": "n", "annotations": annotations} if annotations else {"name": "n"}}

    assert reaches("CREATE", node(**{"stke.platform/cpu-oversale-ratio": "2"}))
    assert reaches("UPDATE", node(**{"stke.platform/memory-oversale-ratio": "1.5"}), node())
    assert not reaches("CREATE", node())
    assert not reaches("UPDATE", node(other="x"), node(other="x"))
    # Turned off by removing the ratio: the stored record still brings the write in, to restore.
    assert reaches("UPDATE", node(), node(**{"stke.platform/real-allocatable": "{}"}))


def test_webhook_paths_are_served_by_the_app(rendered):
    app = no_cluster_app()
    routes = set(app.wsgi_app.routes)  # answered by the lean admission path, ahead of Flask
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for configuration in by_kind(rendered, kind):
            for webhook in configuration["webhooks"]:
                assert webhook["clientConfig"]["service"]["path"] in routes


def test_rbac_lists_exactly_what_the_code_uses_and_no_wildcards(rendered):
    for role in [*by_kind(rendered, "ClusterRole"), *by_kind(rendered, "Role")]:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
    webhook = next(r for r in by_kind(rendered, "ClusterRole") if r["metadata"]["name"] == "oversale-webhook")
    granted = {(group, resource, verb) for rule in webhook["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    workloads = {("apps", r) for r in ("replicasets", "deployments", "statefulsets", "daemonsets")} | \
        {("batch", r) for r in ("jobs", "cronjobs")}
    expected = {(g, r, v) for g, r in workloads for v in ("get", "list", "watch")} | \
        {("", "limitranges", "list"), ("", "limitranges", "watch"), ("", "resourcequotas", "list"),
         ("", "resourcequotas", "watch"), ("", "pods", "list"),
         ("autoscaling.k8s.io", "verticalpodautoscalers", "list"), ("autoscaling.k8s.io", "verticalpodautoscalers",
                                                                    "watch")}
    assert granted == expected


def test_reconciler_rbac_is_exactly_what_it_reads_and_writes(rendered):
    role = next(r for r in by_kind(rendered, "ClusterRole") if r["metadata"]["name"] == "oversale-reconciler")
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    workloads = {("apps", r) for r in ("deployments", "statefulsets", "daemonsets")} | {("batch", "cronjobs")}
    expected = {(g, r, v) for g, r in workloads for v in ("get", "list", "patch")}
    expected |= {("autoscaling", "horizontalpodautoscalers", v) for v in ("list", "patch")}
    expected |= {("", "nodes", v) for v in ("get", "list", "patch")} | {("", "nodes/status", "patch")}
    expected |= {("", "pods", "list"), ("", "events", "create"), ("metrics.k8s.io", "pods", "list"),
                 ("metrics.k8s.io", "nodes", "list")}
    # In-place resize.
    expected |= {("", "pods", "get"), ("", "pods", "patch"), ("", "pods/resize", "patch"), ("", "limitranges", "list"),
                 ("", "resourcequotas", "list"), ("autoscaling.k8s.io", "verticalpodautoscalers", "list")}
    # Remediation: evictions only (never delete), where the evicted Pod's volumes can be reached
    # from and attached, and the namespaces pod affinity terms select by label.
    expected |= {("", "pods/eviction", "create"), ("", "persistentvolumeclaims", "get"),
                 ("", "persistentvolumes", "get"), ("", "namespaces", "list"),
                 ("storage.k8s.io", "csinodes", "list"), ("storage.k8s.io", "volumeattachments", "list")}
    assert not any(verb == "delete" for _, _, verb in granted)
    assert granted == expected
    lease = next(r for r in by_kind(rendered, "Role") if r["metadata"]["name"] == "oversale-reconciler-lease")
    assert {"resourceNames": ["oversale-reconciler"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "update"]} in lease["rules"]
    (deployment,) = [d for d in by_kind(rendered, "Deployment") if d["metadata"]["name"] == "oversale-reconciler"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["reconcilers", "run"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "oversale-reconciler"


def test_scheduler_profile_calls_the_extender_it_deploys(rendered):
    (config_map,) = [c for c in by_kind(rendered, "ConfigMap") if c["metadata"]["name"] == "oversale-scheduler-config"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["oversale"]
    (extender,) = config["extenders"]
    (service,) = [s for s in by_kind(rendered, "Service") if s["metadata"]["name"] == "oversale-extender"]
    port = service["spec"]["ports"][0]["port"]
    assert extender["urlPrefix"] == f"https://oversale-extender.oversale.svc:{port}"
    assert extender["enableHTTPS"] is True, "mutual TLS: only kube-scheduler can drive bind"
    tls = extender["tlsConfig"]
    (kube_scheduler,) = [d for d in by_kind(rendered, "Deployment") if d["metadata"]["name"] == "oversale-scheduler"]
    mounts = {m["mountPath"]: m["name"] for m in kube_scheduler["spec"]["template"]["spec"]["containers"][0]
              ["volumeMounts"]}
    volumes = {v["name"]: v for v in kube_scheduler["spec"]["template"]["spec"]["volumes"]}
    for file, secret in ((tls["certFile"], "oversale-scheduler-client"), (tls["keyFile"], "oversale-scheduler-client"),
                         (tls["caFile"], "oversale-extender-tls")):
        directory, _, name = file.rpartition("/")
        assert volumes[mounts[directory]]["secret"]["secretName"] == secret
        assert name in {item["path"] for item in volumes[mounts[directory]]["secret"]["items"]}
    (extender_deployment,) = [d for d in by_kind(rendered, "Deployment")
                              if d["metadata"]["name"] == "oversale-extender"]
    container = extender_deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--client-ca" in container["args"] and "--certs-dir" in container["args"]
    client_ca = next(v for v in extender_deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca")
    assert client_ca["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}], "never kube-scheduler's key"
    assert container["readinessProbe"]["httpGet"]["port"] == "probes"
    verbs = (extender["filterVerb"], extender["prioritizeVerb"], extender["preemptVerb"], extender["bindVerb"])
    assert verbs == ("filter", "prioritize", "preempt", "bind")
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert extender["httpTimeout"] == "5s"
    env = {variable["name"]: variable["value"] for variable in container.get("env", []) if "value" in variable}
    assert Settings.from_env(env).extender_bind_timeout_seconds < 5, "a bind answered before kube-scheduler gives up"
    from scheduler.app import create_app as create_extender
    from scheduler.state import ClusterState

    app = create_extender(Settings(kubernetes="off"), ClusterState(Settings().keys), binder=None)  # type: ignore[arg-type]
    routes = {rule.rule.strip("/") for rule in app.url_map.iter_rules() if "POST" in rule.methods}
    assert set(verbs) <= routes
    (deployment,) = [d for d in by_kind(rendered, "Deployment") if d["metadata"]["name"] == "oversale-extender"]
    assert deployment["spec"]["replicas"] == 2, "active/standby over a Lease"
    assert deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (budget,) = [b for b in by_kind(rendered, "PodDisruptionBudget") if b["metadata"]["name"] == "oversale-extender"]
    assert budget["spec"]["minAvailable"] == 1
    lease = next(r for r in by_kind(rendered, "Role") if r["metadata"]["name"] == "oversale-extender-lease")
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["oversale-extender"],
            "verbs": ["get", "update"]} in lease["rules"]
    role = next(r for r in by_kind(rendered, "ClusterRole") if r["metadata"]["name"] == "oversale-extender")
    verbs = {(resource, verb) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert {("bindings", "create"), ("pods", "patch"), ("pods", "watch"), ("nodes", "watch"),
            ("poddisruptionbudgets", "watch")} <= verbs
    metrics = [rule for rule in role["rules"] if rule["apiGroups"] == ["metrics.k8s.io"]]
    assert metrics == [{"apiGroups": ["metrics.k8s.io"], "resources": ["nodes", "pods"], "verbs": ["list"]}], \
        "read access to the metrics API's nodes and pods only"


# system:kube-scheduler's Lease rules as the API server bootstraps the role (its RBAC bootstrap
# policy): any Lease may be created, only the default profile's be read and renewed.
KUBE_SCHEDULER_LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["kube-scheduler"],
     "verbs": ["get", "update"]},
]


def lease_rules(objects: list[dict], account: str, namespace: str) -> list[dict]:
    """The Lease rules a ServiceAccount of the ``oversale`` namespace holds in ``namespace``."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"] in ("Role", "ClusterRole")}
    rules: list[dict] = []
    for binding in [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        if {"kind": "ServiceAccount", "name": account, "namespace": "oversale"} not in binding["subjects"]:
            continue
        if binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] != namespace:
            continue
        ref = binding["roleRef"]
        granted = (KUBE_SCHEDULER_LEASE_RULES if ref["name"] == "system:kube-scheduler"
                   else roles.get((ref["kind"], ref["name"]), {}).get("rules", []))
        rules += [r for r in granted if "coordination.k8s.io" in r["apiGroups"] and "leases" in r["resources"]]
    return rules


def test_kube_scheduler_may_hold_the_lease_its_config_names():
    objects = render("base")
    (config_map,) = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"] == "oversale-scheduler-config"]
    election = yaml.safe_load(config_map["data"]["config.yaml"])["leaderElection"]
    assert election["leaderElect"] is True
    (deployment,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "oversale-scheduler"]
    rules = lease_rules(objects, deployment["spec"]["template"]["spec"]["serviceAccountName"],
                        election["resourceNamespace"])
    for verb in ("create", "get", "update"):
        assert any(verb in r["verbs"] and election["resourceName"] in r.get("resourceNames", [election["resourceName"]])
                   for r in rules), f"kube-scheduler cannot {verb} its Lease {election['resourceName']}"
    # Active/standby on that Lease: a lost node does not leave the profile's Pods Pending until the
    # Pod is recreated elsewhere; a drain may evict one replica, not both.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (budget,) = [b for b in by_kind(objects, "PodDisruptionBudget") if b["metadata"]["name"] == "oversale-scheduler"]
    assert budget["spec"]["selector"] == deployment["spec"]["selector"] and budget["spec"]["minAvailable"] == 1


def test_the_extender_service_reaches_the_leader_while_rollouts_and_drains_go_through():
    """Every synced replica is Ready and the leader labels its own Pod: the Service selects the
    label. Were the standby never Ready, no rolling update could replace the leader and no
    PodDisruptionBudget would let a drain evict it."""
    objects = render("base")
    (deployment,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "oversale-extender"]
    (service,) = [s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "oversale-extender"]
    (budget,) = [b for b in by_kind(objects, "PodDisruptionBudget") if b["metadata"]["name"] == "oversale-extender"]
    keys = Settings().keys
    template = deployment["spec"]["template"]
    assert service["spec"]["selector"] == {**template["metadata"]["labels"], keys.extender_leader: "true"}
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name", "the Pod the leader labels"
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0 and rolling["maxSurge"] >= 1, "a new replica is Ready before one goes"
    assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"], "a drain may evict one"


def test_webhook_deployment_is_highly_available_and_locked_down(rendered):
    (deployment,) = [d for d in by_kind(rendered, "Deployment") if d["metadata"]["name"] == "oversale-webhook"]
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert set(container["resources"]) == {"requests", "limits"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp/metrics"]]
    assert volumes[mounts["/certs"]]["secret"]["secretName"] == "oversale-webhook-tls"
    assert "--metrics-dir" in container["args"] and "/tmp/metrics" in container["args"]
    (budget,) = [b for b in by_kind(rendered, "PodDisruptionBudget") if b["metadata"]["name"] == "oversale-webhook"]
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]


def test_the_scheduling_path_outranks_the_workloads_it_serves(rendered):
    """The webhook, the extender and its kube-scheduler run at a PriorityClass of their own, above
    workloads at the default 0 (preemption, the kubelet's eviction order), at most the highest a
    user-defined class may take, and never the default of other Pods."""
    deployments = {d["metadata"]["name"]: d for d in by_kind(rendered, "Deployment")}
    (priority,) = by_kind(rendered, "PriorityClass")
    assert 0 < priority["value"] <= 1_000_000_000 and priority["globalDefault"] is False
    for name in ("oversale-webhook", "oversale-extender", "oversale-scheduler"):
        assert deployments[name]["spec"]["template"]["spec"]["priorityClassName"] == priority["metadata"]["name"]
    assert "priorityClassName" not in deployments["oversale-reconciler"]["spec"]["template"]["spec"]


def test_a_stopping_webhook_keeps_serving_until_the_service_forgets_it(rendered):
    """The kubelet runs preStop before SIGTERM, and only then does gunicorn close its listener;
    the Pod's endpoint leaves the Service meanwhile. preStop and gunicorn's graceful shutdown must
    both fit in the grace period, or the kubelet kills reviews in flight."""
    (deployment,) = [d for d in by_kind(rendered, "Deployment") if d["metadata"]["name"] == "oversale-webhook"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and float(command[1]) >= 5, "a few seconds for the endpoint to be removed"
    graceful = gunicorn_options("0.0.0.0:8443", "", "", 2, 4, 5, "info")["graceful_timeout"]
    assert float(command[1]) + graceful <= pod.get("terminationGracePeriodSeconds", 30)


def test_every_certificate_kube_scheduler_mounts_restarts_it_when_renewed():
    """kube-scheduler reads its extender tlsConfig files only at start: whatever renews a Secret it
    mounts must restart it, in the install Job and in the weekly renewal alike, and with
    cert-manager, which renews them itself, a schedule that notices."""
    objects = render("overlays/self-signed")
    (scheduler,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "oversale-scheduler"]
    mounted = {v["secret"]["secretName"] for v in scheduler["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert mounted == {"oversale-scheduler-client", "oversale-extender-tls"}
    for job in [*by_kind(objects, "Job"), *by_kind(objects, "CronJob")]:
        spec = job["spec"]["jobTemplate"]["spec"] if job["kind"] == "CronJob" else job["spec"]
        ensured = {c["args"][c["args"].index("--secret") + 1].split("/")[1]: c["args"]
                   for c in spec["template"]["spec"]["initContainers"] if c["args"][:2] == ["certs", "ensure"]}
        for secret in mounted:
            args = ensured[secret]
            assert args[args.index("--restart") + 1] == "oversale/oversale-scheduler", (job["kind"], secret)
    # cert-manager renews them on its own: a schedule compares and restarts.
    objects = render("overlays/cert-manager")
    (cron,) = by_kind(objects, "CronJob")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:2] == ["certs", "restart-on-change"]
    assert {args[i + 1] for i, arg in enumerate(args) if arg == "--secret"} == {f"oversale/{s}" for s in mounted}
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--restart"] == ["oversale/oversale-scheduler"]
    (binding,) = [b for b in by_kind(objects, "RoleBinding")
                  if {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "oversale"}
                  in b["subjects"]]
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == binding["roleRef"]["name"]]
    allowed = {(resource, verb, name) for rule in role["rules"] for resource in rule["resources"]
               for verb in rule["verbs"] for name in rule.get("resourceNames", [])}
    assert {("secrets", "get", secret) for secret in mounted} | {("deployments", verb, "oversale-scheduler")
                                                                 for verb in ("get", "patch")} <= allowed


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def restricted_problems(pod: dict) -> list[str]:
    """What the Pod Security Standards' "restricted" profile (the one Pod Security Admission
    enforces in the namespace) would refuse in a Pod spec."""
    problems = []
    pod_context = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(kinds)}")
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        context = container.get("securityContext") or {}
        name = container["name"]
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile {seccomp}")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []) or set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities {capabilities}")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            problems.append(f"{name}: hostPort")
    return problems


def test_the_namespace_enforces_the_restricted_pod_security_standard_and_every_pod_meets_it(rendered):
    namespaces = by_kind(rendered, "Namespace")
    for namespace in namespaces:
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in rendered:
        if obj["kind"] in ("Deployment", "Job", "CronJob"):
            spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
            assert restricted_problems(spec["template"]["spec"]) == [], obj["metadata"]["name"]


def test_the_restricted_check_catches_what_the_api_server_would_refuse():
    pod = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
           "volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}],
           "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                             "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
                           "ports": [{"containerPort": 80, "hostPort": 80}]}]}
    assert restricted_problems(pod) == ["volume logs: ['hostPath']",
                                        "c: capabilities {'drop': ['ALL'], 'add': ['NET_ADMIN']}", "c: hostPort"]


def test_every_workload_in_every_overlay_runs_non_root_with_limits(rendered):
    for obj in rendered:
        if obj["kind"] not in ("Deployment", "Job", "CronJob"):
            continue
        spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["resources"]["limits"]
            assert container["image"] == "oversale:0.1.0" or container["image"].startswith(
                "registry.k8s.io/kube-scheduler:")


def test_certificates_come_from_each_overlay():
    self_signed = render("overlays/self-signed")
    (job,) = by_kind(self_signed, "Job")
    commands = [c["args"] for c in [*job["spec"]["template"]["spec"]["initContainers"],
                                    *job["spec"]["template"]["spec"]["containers"]]]
    assert commands[0][:2] == ["certs", "ensure"] and "oversale/oversale-webhook-tls" in commands[0]
    assert "oversale/oversale-extender-tls" in commands[1]
    assert "oversale/oversale-scheduler-client" in commands[2] and "--client" in commands[2]
    assert commands[3][:2] == ["certs", "inject"]
    assert by_kind(self_signed, "CronJob")
    cert_manager = render("overlays/cert-manager")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (configuration,) = by_kind(cert_manager, kind)
        assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
            "oversale/oversale-webhook"
    (serving,) = [c for c in by_kind(cert_manager, "Certificate") if c["metadata"]["name"] == "oversale-webhook"]
    assert serving["spec"]["secretName"] == "oversale-webhook-tls"
    assert "oversale-webhook.oversale.svc" in serving["spec"]["dnsNames"]


# ---- Dockerfile -------------------------------------------------------------------------------

def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, argument = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), argument.strip()))
    return stages


def test_dockerfile_builds_a_slim_non_root_image_without_compilers():
    stages = dockerfile_stages()
    final = stages[-1]
    assert all(arg.startswith("python:3.11-slim") for _, arg in (s[0] for s in stages))
    # Dependencies are installed in their own layer, before any source is copied.
    install = next(i for i, (ins, arg) in enumerate(stages[0]) if ins == "RUN" and "requirements.txt" in arg)
    copies = [i for i, (ins, arg) in enumerate(stages[0]) if ins == "COPY"]
    assert copies == [install - 1] and "requirements.txt" in stages[0][copies[0]][1]
    everything = " ".join(arg for stage in stages for _, arg in stage)
    for compiler in ("gcc", "build-essential", "g++", "apt-get install"):
        assert compiler not in everything
    user = [arg for ins, arg in final if ins == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert ("EXPOSE", "8443") in final
    assert ("ENTRYPOINT", '["python", "-m"]') in final
    cmd = next(arg for ins, arg in final if ins == "CMD")
    assert cmd.startswith('["webhook", "--bind", "0.0.0.0:8443"')
    copied = {arg.split()[0] for ins, arg in final if ins == "COPY" and not arg.startswith("--from")}
    # simulator/ serves `python -m reconcilers backtest` from the same image.
    assert copied == {"oversale/", "kube/", "webhook/", "certs/", "reconcilers/", "scheduler/", "simulator/"}
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "tests", ".git"} <= set(ignored)


# ---- monitoring: the dashboard and alerts read only what the code exports ------------------------

def component_registries() -> list[prometheus_client.CollectorRegistry]:
    """The registries of the three components' metrics (the webhook's, the reconcilers', the extender's)."""
    from reconcilers.metrics import ReconcilerMetrics
    from scheduler.app import ExtenderMetrics
    from webhook.metrics import Metrics

    return [Metrics().registry, ReconcilerMetrics().registry, ExtenderMetrics().registry]


def exported_metric_names() -> set[str]:
    """Every sample name the three components can expose, from their own registries."""
    names = set()
    for registry in component_registries():
        for family in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                        "gauge": ("",)}.get(family.type, ("",))
            names |= {family.name + suffix for suffix in suffixes}
    return names


def monitoring_queries() -> list[str]:
    objects = render("monitoring")
    (rule,) = by_kind(objects, "PrometheusRule")
    queries = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    (dashboard,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "oversale-dashboard"]
    panels = json.loads(dashboard["data"]["oversale.json"])["panels"]
    return queries + [target["expr"] for panel in panels for target in panel["targets"]]


def test_kube_prometheus_stack_selects_the_monitors_and_alerts_and_grafana_the_dashboard():
    """kube-prometheus-stack's Prometheus reads only PodMonitors and PrometheusRules labelled with
    its Helm release (podMonitorSelectorNilUsesHelmValues, ruleSelectorNilUsesHelmValues), its
    Grafana sidecar only ConfigMaps labelled grafana_dashboard: "1"."""
    objects = render("monitoring")
    selected = [o for o in objects if o["kind"] in ("PodMonitor", "PrometheusRule")]
    assert {o["kind"] for o in selected} == {"PodMonitor", "PrometheusRule"}
    assert {(o["metadata"].get("labels") or {}).get("release") for o in selected} == {"kube-prometheus-stack"}
    (dashboard,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "oversale-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_dashboard_and_alerts_use_only_exported_metrics():
    exported = exported_metric_names()
    used = {name for query in monitoring_queries() for name in re.findall(r"\boversale_[a-z_]+", query)}
    assert used, "no query names a metric"
    assert used <= exported, f"not exported by the code: {sorted(used - exported)}"


TARGET_LABELS = {"pod", "namespace", "instance", "job", "container", "endpoint"}
"""What Prometheus adds to every sample of a PodMonitor's targets."""


def exported_label_names() -> dict[str, set[str]]:
    """Each family's label names, from the three components' own metrics (those of a collector
    that holds no sample yet, as the certificate expiry with no file, stay unknown)."""
    labels: dict[str, set[str]] = {}
    for registry in component_registries():
        for collector in list(registry._collector_to_names):
            names = getattr(collector, "_labelnames", None)
            for family in collector.collect():
                known = set(names) if names is not None else {key for s in family.samples for key in s.labels}
                if names is not None or family.samples:
                    labels[family.name] = known | ({"le"} if family.type == "histogram" else set())
    return labels


def family_of(sample_name: str) -> str:
    """The family a sample name belongs to (``oversale_admissions_total``: ``oversale_admissions``)."""
    return re.sub(r"_(total|bucket|sum|count)$", "", sample_name)


def test_dashboard_and_alerts_select_and_group_by_labels_the_metrics_have():
    """A label renamed in the code (``result`` on the reconcilers' last pass, ``pool`` on the
    budget) leaves an alert's selector matching nothing: silent, not failing."""
    labels = exported_label_names()
    checked = 0
    for query in monitoring_queries():
        families = {family_of(name) for name in re.findall(r"\boversale_[a-z_]+", query)}
        known = [labels[family] for family in families if family in labels]
        if len(known) < len(families):
            continue  # a family whose labels are unknown here (no sample yet)
        for selector in re.finditer(r"\b(oversale_[a-z_]+)\{([^}]*)\}", query):
            family = family_of(selector.group(1))
            used = set(re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", selector.group(2)))
            assert used <= labels[family] | TARGET_LABELS, f"{selector.group(0)}: {family} has {sorted(labels[family])}"
            checked += 1
        for clause in re.finditer(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", query):
            grouped = {name.strip() for name in clause.group(1).split(",") if name.strip()}
            assert grouped <= set().union(*known) | TARGET_LABELS, f"{clause.group(0)} in {query}"
            checked += 1
    assert checked > 30, "the queries' selectors and groupings were found"


def test_every_exported_metric_is_documented():
    """An operator reads what a metric means in the docs; a metric they cannot look up is one they
    will not alert on. A family's name, or one of its samples', is enough (a histogram's
    ``_bucket`` is read through its ``_seconds`` name)."""
    docs = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    named = set(re.findall(r"\boversale_[a-z_]+\*?", docs))  # `oversale_requests_freed_*` names a few
    families = {family_of(name) for name in exported_metric_names()}
    undocumented = {family for family in families
                    if not any(name == family or name.startswith(family + "_")
                               or (name.endswith("*") and family.startswith(name[:-1])) for name in named)}
    assert not undocumented, f"exported but named in no doc: {sorted(undocumented)}"


PROMTOOL_TEST = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'oversale_node_real_utilization{node="n1", resource="cpu"}'
        values: '0.9 1.2x20'
      - series: 'oversale_node_real_utilization{node="n2", resource="cpu"}'
        values: '0.5x20'
      - series: 'oversale_reconciler_leader{pod="r1"}'
        values: '1x5 0x20'
      - series: 'oversale_hot_time_ratio{scope="pool", name="general", resource="cpu", window="7d", pod="r1"}'
        values: '0.0005x30 0.004x90'
      - series: 'oversale_hot_time_budget_ratio{pool="general", resource="cpu", pod="r1"}'
        values: '0.001x120'
      # Expires 14 days and 30 minutes after the test's start; renewed at minute 150 (300 days on).
      - series: 'oversale_tls_certificate_expiry_timestamp_seconds{pod="w1", certificate="serving"}'
        values: '1211400x149 25920000x60'
      # The extender's reads of Prometheus: all failing from minute 10 to 40 (node history), and
      # the workload history's failing from minute 10 on.
      - series: 'oversale_extender_history_polls_total{pod="e1", result="ok"}'
        values: '0+1x10 10x30 10+1x40'
      - series: 'oversale_extender_history_polls_total{pod="e1", result="error"}'
        values: '0x10 0+1x30 30x40'
      # The extender e3 reads NodeMetrics throughout, PodMetrics only until minute 10 and again
      # from minute 40.
      - series: 'oversale_extender_metrics_polls_total{pod="e3", result="ok"}'
        values: '0+2x10 20x30 20+2x40'
      - series: 'oversale_extender_metrics_polls_total{pod="e3", result="partial"}'
        values: '0x10 0+2x30 60x40'
      - series: 'oversale_extender_workload_history_polls_total{pod="e2", result="ok"}'
        values: '0+1x10 10x70'
      - series: 'oversale_extender_workload_history_polls_total{pod="e2", result="error"}'
        values: '0x10 0+1x70'
      # r2 leads from minute 30 (after r1's test of no leader); its passes complete every minute
      # until minute 15, then stop completing: 1800 s after, plus 10 minutes, it fires (55m).
      - series: 'oversale_reconciler_leader{pod="r2"}'
        values: '_x29 1x60'
      - series: 'oversale_reconcile_last_pass_timestamp_seconds{pod="r2", result="complete"}'
        values: '0+60x15 900x75'
      - series: 'oversale_reconcile_last_pass_timestamp_seconds{pod="r3", result="complete"}'
        values: '0x90'
      # r2's remediator observes every minute until minute 40: blind 600 s later, firing 5 min on.
      - series: 'oversale_remediation_last_observation_timestamp_seconds{pod="r2"}'
        values: '0+60x40 2400x50'
    alert_rule_test:
      - eval_time: 52m
        alertname: OversaleRemediatorBlind
        exp_alerts: []
      - eval_time: 60m
        alertname: OversaleRemediatorBlind
        exp_alerts:
          - exp_labels: {severity: warning}
            exp_annotations:
              summary: The remediator has not read the nodes' usage for over 10 minutes
              description: >-
                metrics-server (metrics.k8s.io) or the API server fails its reads: no oversold node's real
                utilization is known, none is reported hot or relieved, and OversaleNodeAboveRealCapacity
                cannot fire. The reconciler's log says why ('remediation pass skipped: cannot read usage or
                the cluster (...)').
      - eval_time: 50m
        alertname: OversaleReconcilerPassesIncomplete
        exp_alerts: []
      - eval_time: 60m
        alertname: OversaleReconcilerPassesIncomplete
        exp_alerts:
          - exp_labels: {severity: warning}
            exp_annotations:
              summary: The reconcilers have not completed a pass for over 30 minutes
              description: >-
                A replica leads, but its passes stop short (history unavailable, the API server failing a step,
                the Lease lost mid-pass), fail, or hang: ratios are not kept up to date. The leader's log says
                which: 'pass done ...; incomplete: ...' names what stopped a pass, 'pass failed' shows the
                error, and no 'pass done' line for that long is a hang.
      - eval_time: 20m
        alertname: OversaleExtenderPodMetricsUnreadable
        exp_alerts: []
      - eval_time: 35m
        alertname: OversaleExtenderPodMetricsUnreadable
        exp_alerts:
          - exp_labels: {severity: info, pod: e3}
            exp_annotations:
              summary: "The extender e3 reads NodeMetrics but not PodMetrics"
              description: >-
                Nodes are still placed by their load, but each Pod bound counts its estimate on top of node
                figures that may already hold it until it settles, and new replicas are estimated from the last
                PodMetrics read. Check metrics-server (its Pod list may time out on a large cluster) and the
                extender's log (one line when the reads start failing).
      - eval_time: 45m
        alertname: OversaleExtenderPodMetricsUnreadable
        exp_alerts: []
      - eval_time: 20m
        alertname: OversaleExtenderHistoryUnreadable
        exp_alerts: []
      - eval_time: 35m
        alertname: OversaleExtenderHistoryUnreadable
        exp_alerts:
          - exp_labels: {severity: info, pod: e1}
            exp_annotations:
              summary: "The extender e1 cannot read its history from Prometheus"
              description: &unreadable >-
                Load-aware placement falls back to the extender's own hour of samples and to requests for
                workloads with no Pod in PodMetrics. Check OVERSALE_PROMETHEUS_URL, the network path to it,
                and the extender's log (one line when the reads start failing).
          - exp_labels: {severity: info, pod: e2}
            exp_annotations:
              summary: "The extender e2 cannot read its history from Prometheus"
              description: *unreadable
      - eval_time: 60m
        alertname: OversaleExtenderHistoryUnreadable
        exp_alerts:
          - exp_labels: {severity: info, pod: e2}
            exp_annotations:
              summary: "The extender e2 cannot read its history from Prometheus"
              description: *unreadable
      - eval_time: 60m
        alertname: OversalePoolOverHotTimeBudget
        exp_alerts: []
      - eval_time: 100m
        alertname: OversalePoolOverHotTimeBudget
        exp_alerts:
          - exp_labels: {severity: warning, name: general, resource: cpu}
            exp_annotations:
              summary: "Pool general spent 0.4% of its node-time above real cpu"
              description: >-
                Over 7 days the pool ran hot longer than its hot-time budget allows. The reconcilers back its
                nodes off (HotTimeOverspent Events); if this lasts, lower the budget's calibration or the
                maximum ratio, or turn on remediation.
      - eval_time: 8m
        alertname: OversaleNodeAboveRealCapacity
        exp_alerts: []
      - eval_time: 12m
        alertname: OversaleNodeAboveRealCapacity
        exp_alerts:
          - exp_labels: {severity: warning, node: n1, resource: cpu}
            exp_annotations:
              summary: "Oversold node n1 uses more cpu than it really has"
              description: >-
                n1 has used 120% of its real cpu for 10 minutes. Its Pods are throttled (cpu) or at risk
                of eviction (memory). Lower its oversale ratio, or turn on remediation
                (OVERSALE_REMEDIATION=true).
      - eval_time: 60m
        alertname: OversaleCertificateExpiringSoon
        exp_alerts: []
      - eval_time: 100m
        alertname: OversaleCertificateExpiringSoon
        exp_alerts:
          - exp_labels: {severity: warning, pod: w1, certificate: serving}
            exp_annotations:
              summary: "The serving certificate of w1 expires in 13d 22h 50m 0s"
              description: >-
                It was not renewed: check the oversale-certs-renew CronJob (self-signed overlay) or the
                Certificate in cert-manager. For kube-scheduler-client (the certificate kube-scheduler
                presents to the extender, which it reads only at start), a renewed Secret has not reached
                it: restart the oversale-scheduler Deployment. Once the webhook's expires, the API server
                cannot call it (it fails open): new Pods go uncompressed and every oversold node falls back to its real
                allocatable at its next status write; once the extender's does, Pods of the oversale
                scheduler profile stay Pending.
      - eval_time: 180m
        alertname: OversaleCertificateExpiringSoon
        exp_alerts: []
      - eval_time: 12m
        alertname: OversaleReconcilerNotLeading
        exp_alerts: []
      - eval_time: 17m
        alertname: OversaleReconcilerNotLeading
        exp_alerts:
          - exp_labels: {severity: warning}
            exp_annotations:
              summary: No oversale reconciler replica holds the Lease
              description: "Ratios are not kept; check the reconciler Pods and their Lease (OVERSALE_LEASE_NAME)."
"""


def test_alert_rules_pass_promtool_check_and_fire_when_they_should(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is needed; .ci/run installs it"
    (rule,) = by_kind(render("monitoring"), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "test.yaml").write_text(PROMTOOL_TEST)
    tested = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yaml")], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


# ---- least privilege: every rule justified by the call that needs it -------------------------------

LEASE_CALLS = {("coordination.k8s.io", "leases", verb): ("kube/leader.py", call) for verb, call in
               (("create", "create_namespaced_lease"), ("get", "read_namespaced_lease"),
                ("update", "replace_namespaced_lease"))}
CALLS = {
    "oversale-webhook": {
        ("apps", "replicasets", "list"): ("kube/reflector.py", "list_{kind.plural}_for_all_namespaces"),
        ("apps", "replicasets", "watch"): ("kube/reflector.py", "watch=True"),
        ("apps", "replicasets", "get"): ("kube/reflector.py", "found(self._read, name, namespace"),
        **{(group, resource, verb): ("webhook/owners.py", "WatchedKind(") for group, resource in
           (("apps", "deployments"), ("apps", "statefulsets"), ("apps", "daemonsets"), ("batch", "jobs"),
            ("batch", "cronjobs")) for verb in ("get", "list", "watch")},
        **{("", resource, verb): ("webhook/owners.py", "WatchedKind(")
           for resource in ("limitranges", "resourcequotas") for verb in ("list", "watch")},
        ("", "pods", "list"): ("webhook/node_pods.py", "list_pod_for_all_namespaces"),
        ("autoscaling.k8s.io", "verticalpodautoscalers", "list"): ("webhook/owners.py", "list_cluster_custom_object"),
        ("autoscaling.k8s.io", "verticalpodautoscalers", "watch"): ("kube/reflector.py", "watch=True"),
    },
    "oversale-reconciler": {
        **{(group, resource, verb): ("reconcilers/cluster.py", call) for group, resource in
           (("apps", "deployments"), ("apps", "statefulsets"), ("apps", "daemonsets"), ("batch", "cronjobs"))
           for verb, call in (("get", "read_namespaced_"), ("list", "_for_all_namespaces"),
                              ("patch", "patch_namespaced_"))},
        ("autoscaling", "horizontalpodautoscalers", "list"): ("reconcilers/cluster.py",
                                                              "list_horizontal_pod_autoscaler"),
        ("autoscaling", "horizontalpodautoscalers", "patch"): ("reconcilers/cluster.py", "patch_namespaced_horizontal"),
        ("", "nodes", "get"): ("reconcilers/cluster.py", "read_node("),
        ("", "nodes", "list"): ("reconcilers/cluster.py", "list_node"),
        ("", "nodes", "patch"): ("reconcilers/cluster.py", "patch_node("),
        ("", "nodes/status", "patch"): ("reconcilers/cluster.py", "patch_node_status("),
        ("", "pods", "list"): ("reconcilers/cluster.py", "list_pod_for_all_namespaces"),
        ("", "pods", "get"): ("reconcilers/cluster.py", "read_namespaced_pod("),
        ("", "pods", "patch"): ("reconcilers/cluster.py", "patch_namespaced_pod("),
        ("", "pods/resize", "patch"): ("reconcilers/cluster.py", "patch_namespaced_pod_resize("),
        ("", "pods/eviction", "create"): ("reconcilers/cluster.py", "create_namespaced_pod_eviction("),
        ("", "persistentvolumeclaims", "get"): ("reconcilers/cluster.py", "read_namespaced_persistent_volume_claim("),
        ("", "persistentvolumes", "get"): ("reconcilers/cluster.py", "read_persistent_volume("),
        ("storage.k8s.io", "csinodes", "list"): ("reconcilers/cluster.py", "list_csi_node"),
        ("storage.k8s.io", "volumeattachments", "list"): ("reconcilers/cluster.py", "list_volume_attachment"),
        ("", "namespaces", "list"): ("reconcilers/cluster.py", "list_namespace,"),
        ("", "limitranges", "list"): ("reconcilers/cluster.py", "list_limit_range_for_all_namespaces"),
        ("", "resourcequotas", "list"): ("reconcilers/cluster.py", "list_resource_quota_for_all_namespaces"),
        ("autoscaling.k8s.io", "verticalpodautoscalers", "list"): ("reconcilers/cluster.py",
                                                                   "list_cluster_custom_object, *VPA"),
        ("", "events", "create"): ("reconcilers/cluster.py", "create_namespaced_event("),
        ("metrics.k8s.io", "pods", "list"): ("kube/metrics_api.py", 'self._list("pods")'),
        ("metrics.k8s.io", "nodes", "list"): ("kube/metrics_api.py", 'self._list("nodes")'),
    },
    "oversale-extender": {
        ("", "nodes", "list"): ("scheduler/kube.py", "core.list_node"),
        ("", "nodes", "watch"): ("kube/reflector.py", "watch=True"),
        ("", "pods", "list"): ("scheduler/kube.py", "core.list_pod_for_all_namespaces"),
        ("", "pods", "watch"): ("kube/reflector.py", "watch=True"),
        ("", "pods", "get"): ("scheduler/kube.py", "read_namespaced_pod("),
        ("", "pods", "patch"): ("scheduler/kube.py", "patch_namespaced_pod("),
        ("", "bindings", "create"): ("scheduler/kube.py", "create_namespaced_binding("),
        ("policy", "poddisruptionbudgets", "list"): ("scheduler/kube.py",
                                                     "policy.list_pod_disruption_budget_for_all_namespaces"),
        ("policy", "poddisruptionbudgets", "watch"): ("kube/reflector.py", "watch=True"),
        ("topology.node.k8s.io", "noderesourcetopologies", "list"): ("scheduler/kube.py", "NRT ="),
        ("topology.node.k8s.io", "noderesourcetopologies", "watch"): ("kube/reflector.py", "watch=True"),
        ("metrics.k8s.io", "nodes", "list"): ("kube/metrics_api.py", 'self._list("nodes")'),
        ("metrics.k8s.io", "pods", "list"): ("kube/metrics_api.py", 'self._list("pods")'),
    },
    "oversale-certs": {
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get"): ("certs/cluster.py", "read_"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch"): ("certs/cluster.py", "patch_"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "get"): ("certs/cluster.py", "read_"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch"): ("certs/cluster.py", "patch_"),
        ("", "secrets", "create"): ("certs/cluster.py", "create_namespaced_secret"),
        ("", "secrets", "get"): ("certs/cluster.py", "read_namespaced_secret"),
        ("", "secrets", "update"): ("certs/cluster.py", "replace_namespaced_secret"),
        ("apps", "deployments", "patch"): ("certs/cluster.py", "patch_namespaced_deployment("),
        ("apps", "deployments", "get"): ("certs/cluster.py", "read_namespaced_deployment,"),
    },
    "oversale-reconciler-lease": LEASE_CALLS,
    "oversale-extender-lease": LEASE_CALLS,
    # Not our code's calls: kube-scheduler's leader election, on the Lease its config names.
    "oversale-scheduler-lease": {("coordination.k8s.io", "leases", verb): ("deploy/base/scheduler.yaml",
                                                                           "resourceName: oversale-scheduler")
                                 for verb in ("get", "update")},
}
DANGEROUS_VERBS = {"escalate", "bind", "impersonate", "*"}


def rbac_problems(objects: list[dict]) -> list[str]:
    """Every way the rendered roles exceed what the code calls."""
    problems = []
    for role in [o for o in objects if o["kind"] in ("ClusterRole", "Role")]:
        name = role["metadata"]["name"]
        granted = set()
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                if "*" in (rule.get(field) or []):
                    problems.append(f"{name}: wildcard in {field}")
            if set(rule["verbs"]) & DANGEROUS_VERBS:
                problems.append(f"{name}: verbs {sorted(set(rule['verbs']) & DANGEROUS_VERBS)}")
            if "secrets" in rule["resources"] and set(rule["verbs"]) - {"create"}:
                names = rule.get("resourceNames") or []
                if not names or not all(n.startswith("oversale-") for n in names):
                    problems.append(f"{name}: secrets beyond the project's own named ones")
            granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
        needed = CALLS.get(name)
        if needed is None:
            problems.append(f"{name}: a role nothing in the code is known to need")
            continue
        for extra in sorted(granted - set(needed)):
            problems.append(f"{name}: {extra} is granted but no call needs it")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_is_least_privilege_and_every_rule_names_its_call(overlay):
    assert rbac_problems(render(overlay)) == []
    for calls in CALLS.values():
        for (group, resource, verb), (path, call) in calls.items():
            assert call in (ROOT / path).read_text(), f"{group}/{resource} {verb}: {call!r} not in {path}"


def test_the_rbac_check_catches_a_widened_rule():
    objects = render("overlays/self-signed")
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "oversale-extender")
    role["rules"].append({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]})
    role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    role["rules"].append({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"]})
    problems = rbac_problems(objects)
    assert "oversale-extender: ('', 'pods', 'delete') is granted but no call needs it" in problems
    assert "oversale-extender: secrets beyond the project's own named ones" in problems
    assert "oversale-extender: verbs ['bind']" in problems


def test_network_policies_let_only_kube_scheduler_reach_the_extenders_verbs():
    policies = {p["metadata"]["name"]: p for p in by_kind(render("network-policies"), "NetworkPolicy")}
    extender = policies["oversale-extender"]["spec"]["ingress"]
    verbs = [rule for rule in extender if {"protocol": "TCP", "port": 8444} in rule["ports"]]
    assert verbs == [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "oversale-scheduler"}}}],
                      "ports": [{"protocol": "TCP", "port": 8444}]}]
    assert all("from" in rule for rule in extender), "no port of the extender is open to everyone"
    assert policies["oversale-webhook"]["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8443}]}]
    assert set(policies) == {"oversale-extender", "oversale-webhook", "oversale-reconciler", "oversale-scheduler"}
