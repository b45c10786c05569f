"""The webhook held to the limit of its own serving stack.

    python -m bench.webhook_load [--duration 8] [--repeats 3] [--workloads 10000] [--skip-others]

Starts the webhook as deployed (``python -m webhook``: gunicorn, gthread, TLS, production
settings, owner caches synced from an API double holding N Deployments and their ReplicaSets)
and, with the same server settings, two floors that only read the body and answer a fixed
``allowed: true``: a bare WSGI callable (the real minimum) and the same through Flask. Servers
run on core 0 and the load generator on core 1 (``taskset``, when the machine has two cores).
Loads them over keep-alive HTTPS on loopback, in alternating rounds: saturation throughput
with ``wrk -t1 -c8``, latency at fixed offered loads (500 and 1,000 requests/s) with hey. Bodies: a Pod CREATE review
(Deployment-owned, 3 containers, 1 init container), sent again and again as a rollout does and
also as 10,000 Pods whose app containers are named apart (saturation only), and a Node ``nodes/status``
review (50 images, object and oldObject, oversold node). Then the worker RSS, and (unless --skip-others)
the extender and reconcile-pass benchmarks. Installs Debian's wrk, hey and prometheus when
missing (as root, as on these machines).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.proc import status_kib
from kube.cli import Parser
from kube.tls import LOCAL_HOSTS, generate
from oversale.annotations import AnnotationKeys
from tests.conftest import SHARED, free_port, stop_process, wait_until_serving
from tests.kube_api import FakeKubeAPI

KEYS = AnnotationKeys()
ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pod_review(app_name: str = "app") -> dict[str, Any]:
    def container(name: str, cpu: str, memory: str) -> dict[str, Any]:
        return {"name": name, "image": f"registry.example.com/{name}:1.2.3", "ports": [{"containerPort": 8080}],
                "env": [{"name": "MODE", "value": "production"}],
                "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}}

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "generateName": "w1-5d8f9-", "namespace": "ns1", "labels": {"app": "w1", "pod-template-hash": "5d8f9"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w1-5d8f9", "uid": "u",
                             "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"initContainers": [container("migrate", "500m", "256Mi")],
                 "containers": [container(app_name, "2", "2Gi"), container("proxy", "500m", "256Mi"),
                                container("logs", "200m", "128Mi")]}}
    return _review("Pod", "pods", "CREATE", pod, None, "", "system:serviceaccount:kube-system:replicaset-controller")


def node_review() -> dict[str, Any]:
    node = json.loads((SHARED / "fixtures" / "nodes" / "gke-node.json").read_text())
    images = node["status"]["images"]
    node["status"]["images"] = [*images, *[{**copy.deepcopy(i), "names": [f"{n}-copy" for n in i["names"]]}
                                           for i in images]][:50]
    name = node["metadata"]["name"]
    stored = copy.deepcopy(node)
    stored["metadata"].setdefault("annotations", {}).update({
        KEYS.cpu_oversale_ratio: "1.5",
        KEYS.real_allocatable: json.dumps({"cpu": "3920m", "memory": "12700100Ki"}, separators=(",", ":")),
        KEYS.real_capacity: json.dumps({"cpu": "4", "memory": "15399364Ki"}, separators=(",", ":")),
        KEYS.applied_oversale_ratio: '{"cpu":"1.5"}'})
    stored["status"]["allocatable"]["cpu"] = "5880m"
    stored["status"]["capacity"]["cpu"] = "5960m"
    heartbeat = copy.deepcopy(stored)  # the kubelet re-sends its real values
    heartbeat["status"]["allocatable"]["cpu"] = "3920m"
    heartbeat["status"]["capacity"]["cpu"] = "4"
    return _review("Node", "nodes", "UPDATE", heartbeat, stored, "status", f"system:node:{name}")


def _review(kind: str, resource: str, operation: str, obj: dict[str, Any], old: dict[str, Any] | None,
            subresource: str, user: str) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": kind},
                               "resource": {"group": "", "version": "v1", "resource": resource},
                               "operation": operation, "userInfo": {"username": user}, "object": obj,
                               "oldObject": old, "dryRun": False}
    if subresource:
        request["subResource"] = subresource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


SERVER_CORE, CLIENT_CORE = (["taskset", "-c", "0"], ["taskset", "-c", "1"]) \
    if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else ([], [])


def wrk(url: str, body: Path, duration: int) -> float:
    """Saturation throughput; a ``.jsonl`` body file holds one review per line, sent in turn."""
    script = body.with_suffix(".lua")
    if body.suffix == ".jsonl":
        script.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                          f'local bodies = {{}}\nfor line in io.lines("{body}") do bodies[#bodies + 1] = line end\n'
                          'local i = 0\nrequest = function()\n  i = i % #bodies + 1\n'
                          '  return wrk.format(nil, nil, nil, bodies[i])\nend\n')
    else:
        script.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                          f'local f = io.open("{body}", "rb")\nwrk.body = f:read("*all")\nf:close()\n')
    out = subprocess.run([*CLIENT_CORE, "wrk", "-t1", "-c8", f"-d{duration}s", "-s", str(script), url],
                         capture_output=True, text=True, timeout=duration + 60).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not match:
        raise RuntimeError(f"wrk printed no rate:\n{out}")
    return float(match.group(1))


def hey(url: str, body: Path, rate: int, duration: int) -> tuple[float, float, int]:
    workers = 10
    out = subprocess.run([*CLIENT_CORE, "hey", "-z", f"{duration}s", "-c", str(workers), "-q", str(rate // workers),
                          "-m", "POST", "-T", "application/json", "-D", str(body), url],
                         capture_output=True, text=True, timeout=duration + 60).stdout
    p50 = re.search(r"50% in ([\d.]+) secs", out)
    p99 = re.search(r"99% in ([\d.]+) secs", out)
    errors = sum(int(n) for n in re.findall(r"\[(?:[^2]\d\d)\]\s+(\d+) responses", out))
    if not p50 or not p99:
        raise RuntimeError(f"hey printed no latency distribution:\n{out}")
    return float(p50.group(1)) * 1000, float(p99.group(1)) * 1000, errors


def worker_rss_mb(master: int) -> list[float]:
    children = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    sizes = []
    for pid in children:
        sizes.append(status_kib(int(pid), "VmRSS") / 1024)
    return sizes


def start(module: str, port: int, certs: Path, env: dict[str, str], log_path: Path,
          extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    args = [*SERVER_CORE, sys.executable, "-m", module, "--bind", f"127.0.0.1:{port}", "--certs-dir", str(certs),
            *extra]
    handle = log_path.open("wb")
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


def _parser() -> Parser:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=8, help="seconds per load run (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating floor/webhook saturation runs")
    parser.add_argument("--workloads", type=int, default=10000, help="Deployments in the owner caches")
    parser.add_argument("--skip-others", action="store_true", help="only the webhook figures")
    return parser


def _install_missing(skip_others: bool) -> bool:
    """Install the Debian packages of the load generators (and Prometheus, for the other
    benchmarks) that are missing; False, said on stderr, when apt-get cannot."""
    packages = {"wrk": "wrk", "hey": "hey", "prometheus": "prometheus", "promtool": "prometheus"}
    missing = sorted({package for tool, package in packages.items() if not shutil.which(tool)})
    if skip_others:
        missing = [p for p in missing if p != "prometheus"]
    if not missing:
        return True
    log(f"installing {', '.join(missing)} (Debian packages)")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=environment)
    installed = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                               check=False, env=environment)
    if installed.returncode != 0:
        print(f"error: could not install {', '.join(missing)}; install them and run again", file=sys.stderr)
        return False
    return True


def _api_with_workloads(workloads: int) -> FakeKubeAPI:
    """The API double holding ``workloads`` Deployments, each with a ReplicaSet, for the owner caches."""
    api = FakeKubeAPI().start()
    log(f"API double: {workloads} Deployments and ReplicaSets")
    for w in range(workloads):
        namespace = f"ns{w % 50}"
        api.put("deployments", {"metadata": {"name": f"w{w}", "namespace": namespace,
                                             "annotations": {KEYS.cpu_requests_ratio: "2"}}, "spec": {}})
        api.put("replicasets", {"metadata": {"name": f"w{w}-5d8f9", "namespace": namespace, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"w{w}", "uid": "u", "controller": True}]},
            "spec": {}})
    return api


def _wait_until_all_serve(processes: dict[str, subprocess.Popen[bytes]], ports: dict[str, int], certs: Path) -> None:
    """Each server answers over TLS (the webhook once its owner caches synced: /readyz)."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    for name, port in ports.items():
        path = "/readyz" if name == "webhook" else "/mutate/pods"

        def probe(port: int = port, path: str = path) -> bool:
            data = None if path == "/readyz" else b"{}"
            with urllib.request.urlopen(urllib.request.Request(f"https://localhost:{port}{path}", data=data),
                                        context=context, timeout=5) as response:
                return bool(response.status == 200)

        wait_until_serving(processes[name], probe, name, timeout=180)


def _load(kind: str, reviews: list[dict[str, Any]], ports: dict[str, int], work: Path,
          args: argparse.Namespace) -> dict[str, Any]:
    """Saturation rounds of one body (floor and webhook alternating), then, for a body sent
    again and again, latency at 500 and 1,000 requests/s: the figures named ``<kind>_...``."""
    figures: dict[str, Any] = {}
    body = work / (f"{kind}.json" if len(reviews) == 1 else f"{kind}.jsonl")
    body.write_text("\n".join(json.dumps(review) for review in reviews) + "\n")
    path = "/mutate/nodes" if kind == "node" else "/mutate/pods"
    figures[f"{kind}_body_bytes"] = len(json.dumps(reviews[0]))
    # The machine is shared and noisy: floor and webhook runs alternate, and the median of
    # the paired ratios is the figure.
    rounds = []
    for _ in range(args.repeats):
        rates = {name: wrk(f"https://127.0.0.1:{ports[name]}{path}", body, args.duration)
                 for name in ("floor", "webhook", "flask-floor")}
        rounds.append(rates)
        log(f"{kind}: webhook {rates['webhook']:.0f} req/s, bare floor {rates['floor']:.0f}, Flask floor "
            f"{rates['flask-floor']:.0f}; ratio to the bare floor {rates['webhook'] / rates['floor']:.2f}")
    ratios = [r["webhook"] / r["floor"] for r in rounds]
    for name in ("floor", "webhook", "flask-floor"):
        figures[f"{kind}_{name}_rps"] = round(statistics.median(r[name] for r in rounds))
    figures[f"{kind}_ratio_to_floor"] = round(statistics.median(ratios), 2)
    figures[f"{kind}_ratio_to_floor_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
    figures[f"{kind}_ratio_to_flask_floor"] = round(statistics.median(
        r["webhook"] / r["flask-floor"] for r in rounds), 2)
    for rate in ((500, 1000) if len(reviews) == 1 else ()):
        for server in ("webhook", "floor"):
            p50, p99, errors = hey(f"https://127.0.0.1:{ports[server]}{path}", body, rate, args.duration)
            figures[f"{kind}_{server}_p50_ms_at_{rate}"] = round(p50, 2)
            figures[f"{kind}_{server}_p99_ms_at_{rate}"] = round(p99, 2)
            figures[f"{kind}_{server}_errors_at_{rate}"] = errors
            log(f"{kind} at {rate} req/s, {server}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, {errors} non-2xx")
    return figures


def main() -> int:
    args = _parser().parse_args()
    if not _install_missing(args.skip_others):
        return 2
    if CLIENT_CORE:
        os.sched_setaffinity(0, {1})  # this process (and the API double in it) stays off the servers' core
    work = Path(tempfile.mkdtemp(prefix="oversale-load-"))
    certs = work / "certs"
    generate(certs, LOCAL_HOSTS)
    api = _api_with_workloads(args.workloads)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSALE_", "KUBECONFIG"))}
    env.update({"KUBECONFIG": str(api.write_kubeconfig(work / "kubeconfig")), "PYTHONPATH": str(ROOT),
                "OVERSALE_LOG_LEVEL": "WARNING"})
    ports = {"webhook": free_port(), "floor": free_port(), "flask-floor": free_port()}
    processes = {"webhook": start("webhook", ports["webhook"], certs, env, work / "webhook.log"),
                 "floor": start("bench.floor", ports["floor"], certs, env, work / "floor.log"),
                 "flask-floor": start("bench.floor", ports["flask-floor"], certs, env, work / "flask-floor.log",
                                      ("--kind", "flask"))}
    figures: dict[str, Any] = {}
    try:
        _wait_until_all_serve(processes, ports, certs)
        log("webhook caches synced; loading")
        # "pod": one Pod again and again, as a rollout sends its replicas (the webhook remembers
        # the answer); "pod_distinct": 10,000 Pods whose app containers are all named apart, more
        # than the webhook remembers, so every review is computed (same quantities: a cluster
        # has few distinct request values, and those are parsed once).
        bodies = {"pod": [pod_review()], "pod_distinct": [pod_review(app_name=f"app-{i}") for i in range(10000)],
                  "node": [node_review()]}
        for kind, reviews in bodies.items():
            figures |= _load(kind, reviews, ports, work, args)
        rss = worker_rss_mb(processes["webhook"].pid)
        figures["worker_rss_mb"] = [round(r) for r in rss]
        log(f"webhook worker RSS with {args.workloads} workloads cached: {', '.join(f'{r:.0f}' for r in rss)} MB")
    finally:
        for process in processes.values():
            stop_process(process)
        api.stop()
    print(json.dumps(figures, indent=2))
    if not args.skip_others:
        for module in ("bench.extender_speed", "bench.reconcile_scale"):
            log(f"running {module}")
            subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
