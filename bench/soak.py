"""Soak: 100,000 Pod reviews through the webhook as deployed (2 workers x 4 threads, TLS,
keep-alive, no cluster; Pods asking for ratio 2, so every review is compressed), worker RSS read
every 10,000 reviews. Memory is stable when the last readings stop growing.

    python -m bench.soak [--reviews 100000] [--connections 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.webhook_load import pod_review, worker_rss_mb
from kube.cli import Parser
from oversale.annotations import AnnotationKeys
from tests.conftest import RunningWebhook


def main() -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reviews", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=4)
    args = parser.parse_args()
    review = pod_review()
    review["request"]["object"]["metadata"]["annotations"] = {AnnotationKeys().cpu_requests_ratio: "2"}
    body = json.dumps(review).encode()
    with tempfile.TemporaryDirectory() as directory:
        server = RunningWebhook(Path(directory))
        try:
            sent = 0
            failures = 0
            lock = threading.Lock()
            readings = [(0, worker_rss_mb(server.process.pid))]
            started = time.monotonic()

            def drive() -> None:
                nonlocal sent, failures
                connection = server.connection()
                while True:
                    with lock:
                        if sent >= args.reviews:
                            break
                        sent += 1
                        number = sent
                    connection.request("POST", "/mutate/pods", body, {"Content-Type": "application/json"})
                    response = connection.getresponse()
                    answer = json.loads(response.read())
                    if response.status != 200 or "patch" not in answer["response"]:
                        with lock:
                            failures += 1
                    if number % 10_000 == 0:
                        readings.append((number, worker_rss_mb(server.process.pid)))
                        print(f"{number} reviews: worker RSS {readings[-1][1]} MB", file=sys.stderr, flush=True)
                connection.close()

            threads = [threading.Thread(target=drive) for _ in range(args.connections)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - started
        finally:
            server.stop()
    print(json.dumps({"reviews": args.reviews, "failures": failures, "seconds": round(elapsed, 1),
                      "rss_mb": [(n, [round(m) for m in mb]) for n, mb in sorted(readings)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
