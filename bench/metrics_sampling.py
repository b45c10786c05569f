"""The SQLite history's sampling: one reading of metrics-server (every PodMetrics and NodeMetrics,
two list calls through the real ``kubernetes`` client) at scale, and the write of a sample.

    python -m bench.metrics_sampling [--pods 10000] [--nodes 500] [--reads 5] [--rounds 3]

``OVERSALE_SAMPLE_READS`` readings are taken per ``OVERSALE_SAMPLE_INTERVAL``, so a reading's time
times the reads is the sampler's work per interval. The API-server double of ``tests/`` serves
the lists from the same process, so its serialising is counted too: a real metrics-server's
answer costs the reconciler less. The floor is the bare minimum of a reading: the same two GETs
with ``urllib`` and ``json.loads``, nothing parsed into readings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from kubernetes import client

from kube.cli import Parser
from reconcilers.sqlite_history import MetricsSampler, SqliteHistory
from tests.kube_api import FakeKubeAPI


def fill(api: FakeKubeAPI, pods: int, nodes: int) -> None:
    for i in range(pods):
        api.put("podmetrics", {"metadata": {"name": f"pod-{i}", "namespace": f"ns-{i % 20}"}, "window": "15s",
                               "timestamp": "2026-11-28T00:00:00Z",
                               "containers": [{"name": "app", "usage": {"cpu": f"{i % 900}m",
                                                                        "memory": f"{100 + i % 50}Mi"}}]})
    for i in range(nodes):
        api.put("nodemetrics", {"metadata": {"name": f"node-{i}"}, "window": "15s",
                                "timestamp": "2026-11-28T00:00:00Z", "usage": {"cpu": "3", "memory": "12Gi"}})


def floor(url: str) -> float:
    began = time.perf_counter()
    for plural in ("pods", "nodes"):
        with urllib.request.urlopen(f"{url}/apis/metrics.k8s.io/v1beta1/{plural}") as answer:
            json.loads(answer.read())
    return time.perf_counter() - began


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--reads", type=int, default=5, help="readings per sample (OVERSALE_SAMPLE_READS)")
    parser.add_argument("--rounds", type=int, default=3, help="samples taken")
    args = parser.parse_args()
    api = FakeKubeAPI().start()
    try:
        fill(api, args.pods, args.nodes)
        sampler = MetricsSampler(client.ApiClient(client.Configuration(host=api.url)),
                                 SqliteHistory(Path(tempfile.mkdtemp()) / "history.db", 8 * 86400), args.reads)
        readings: list[float] = []
        with_write: list[float] = []
        floors: list[float] = []
        for round_number in range(args.rounds):
            for _ in range(args.reads):
                floors.append(floor(api.url))
                began = time.perf_counter()
                written = sampler.read(now=time.time() + round_number * 300)
                (with_write if written else readings).append(time.perf_counter() - began)
        print(f"{args.pods:,} Pods + {args.nodes:,} nodes, {args.reads} readings a sample, {args.rounds} samples")
        for name, times in (("reading", readings), ("reading + sample write", with_write), ("floor", floors)):
            if times:
                print(f"  {name:<24} median {statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f}, "
                      f"{len(times)} runs)")
    finally:
        api.stop()


if __name__ == "__main__":
    main()
