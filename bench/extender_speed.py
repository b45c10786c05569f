"""Filter + prioritize for one Pod over N nodes, in process, warm caches (median of repeats).

    python -m bench.extender_speed [--nodes 1000 5000] [--repeats 21]

Each node: 2 NUMA nodes x 16 cores x 2 threads (64 CPUs), cpu oversold x1.5, 10 shared Pods and
2 bound Pods of 4 whole cores. Measured for a shared Pod and for a FullPCPUs single-NUMA Pod, by
requests alone and load-aware (an hour of 30-second NodeMetrics samples per node, 2 Pods per
node bound in the last minutes and not yet in PodMetrics); and what one metrics poll of every
node costs the poller (windows, then each row's load in the node table), and one PodMetrics poll
of every bound Pod (the shared Pods of each node are the 10 replicas of one Deployment).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

from kube.cli import Parser
from oversale.annotations import AnnotationKeys
from oversale.usage import Sample
from scheduler.extender import filter_nodes, prioritize
from scheduler.protocol import ExtenderArgs
from scheduler.state import ClusterState, pod_facts

KEYS = AnnotationKeys()


def topology(sockets: int = 2, cores: int = 16, threads: int = 2) -> str:
    total = sockets * cores
    return json.dumps({"detail": [{"id": t * total + s * cores + c, "core": c, "socket": s, "node": s}
                                  for t in range(threads) for s in range(sockets) for c in range(cores)]})


def pod(name: str, cpu: str, node: str | None = None, bound: str | None = None,
        deployment: str | None = None) -> dict[str, Any]:
    annotations = {KEYS.cpu_bind_policy: "FullPCPUs", KEYS.numa_topology_policy: "single-numa-node"} if bound \
        is not None or cpu == "8" else {}
    if bound:
        annotations[KEYS.resource_status] = json.dumps({"cpuset": bound, "numaNode": 0})
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations}
    if deployment:  # a replica of the Deployment's ReplicaSet, as the Deployment controller names them
        metadata["labels"] = {"pod-template-hash": "5d8f9"}
        metadata["ownerReferences"] = [{"kind": "ReplicaSet", "name": f"{deployment}-5d8f9", "controller": True}]
    return {"metadata": metadata,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": {
                "requests": {"cpu": cpu, "memory": "2Gi"}}}]},
            "status": {"phase": "Running"}}


def build(nodes: int, usage: bool = False) -> ClusterState:
    state = ClusterState(KEYS)
    now = time.time()
    cpu_topology = topology()
    for n in range(nodes):
        name = f"node-{n}"
        state.set_node(name, {"metadata": {"name": name, "labels": {}, "annotations": {
            KEYS.cpu_topology: cpu_topology,
            KEYS.real_allocatable: json.dumps({"cpu": "64", "memory": "256Gi"}),
            KEYS.applied_oversale_ratio: json.dumps({"cpu": "1.5"})}},
            "status": {"allocatable": {"cpu": "96", "memory": "256Gi"}}})
        for p in range(10):
            state.set_pod(f"{name}-s{p}", pod_facts(pod(f"{name}-s{p}", "2", name, deployment=f"app-{n}"), KEYS))
        state.set_pod(f"{name}-b0", pod_facts(pod(f"{name}-b0", "8", name, bound="0-3,32-35"), KEYS))
        state.set_pod(f"{name}-b1", pod_facts(pod(f"{name}-b1", "8", name, bound="16-19,48-51"), KEYS))
        if usage:
            for p in range(2):  # bound a minute ago, not yet in PodMetrics: counted by their estimate
                fresh = pod(f"{name}-f{p}", "1", name)
                fresh["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime":
                                                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60))}]
                state.set_pod(f"{name}-f{p}", pod_facts(fresh, KEYS))
    if usage:
        generator = random.Random(7)
        for step in range(120):  # an hour of polls, every node in each
            at = now - 30 * (119 - step)
            state.record_node_samples({f"node-{n}": Sample(at, generator.randrange(5000, 45000),
                                                           generator.randrange(2**34, 2**37)) for n in range(nodes)})
    return state


def measure(state: ClusterState, nodes: int, candidate: dict[str, Any], repeats: int, load_aware: bool) -> float:
    args: ExtenderArgs = {"Pod": candidate, "NodeNames": [f"node-{n}" for n in range(nodes)]}
    filter_nodes(args, state, KEYS, load_aware)  # warm: per-node usage and CPU summaries cached
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        passed = filter_nodes(args, state, KEYS, load_aware)
        prioritize({"Pod": candidate, "NodeNames": passed["NodeNames"] or []}, state, KEYS, load_aware)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000


def measure_poll(state: ClusterState, nodes: int, repeats: int) -> float:
    """One NodeMetrics poll of every node: the windows, then the rows' load in the node table."""
    generator = random.Random(11)
    timings = []
    for step in range(repeats):
        at = time.time() + 30 * (step + 1)
        samples = {f"node-{n}": Sample(at, generator.randrange(5000, 45000), generator.randrange(2**34, 2**37))
                   for n in range(nodes)}
        started = time.perf_counter()
        state.record_node_samples(samples)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000


def measure_pod_poll(state: ClusterState, repeats: int) -> float:
    """One PodMetrics poll with every bound Pod in it: which Pods are in the metrics, and each
    workload's per-Pod usage (its 5-minute window) for the estimate of its Pods not yet there."""
    generator = random.Random(13)
    names = [(record.namespace, record.name) for record in state._pods.values()]
    timings = []
    for _ in range(repeats):
        pods = {key: (float(generator.randrange(10, 2000)), float(generator.randrange(2**26, 2**31))) for key in names}
        seen = time.time()  # every reading first seen now, as the poller passes them
        started = time.perf_counter()
        state.record_pods_in_metrics(pods, sampled_at=dict.fromkeys(names, seen))
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000


def main() -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    results = {}
    for nodes in args.nodes:
        for usage in (False, True):
            state = build(nodes, usage)
            mode = "load-aware" if usage else "requests"
            for label, candidate in (("shared", pod("new-shared", "4")), ("bound", pod("new-bound", "8"))):
                key = f"{nodes}_{label}_{mode}_ms"
                results[key] = round(measure(state, nodes, candidate, args.repeats, usage), 2)
                print(f"{nodes} nodes, {label} Pod, {mode}: filter + prioritize median {results[key]} ms",
                      file=sys.stderr)
            if usage:
                results[f"{nodes}_metrics_poll_ms"] = round(measure_poll(state, nodes, args.repeats), 2)
                print(f"{nodes} nodes: one metrics poll recorded (windows and rows) in median "
                      f"{results[f'{nodes}_metrics_poll_ms']} ms, on the poller's thread", file=sys.stderr)
                results[f"{nodes}_pod_metrics_poll_ms"] = round(measure_pod_poll(state, args.repeats), 2)
                print(f"{nodes} nodes: one PodMetrics poll of {len(state._pods)} bound Pods recorded in median "
                      f"{results[f'{nodes}_pod_metrics_poll_ms']} ms, on the poller's thread", file=sys.stderr)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
