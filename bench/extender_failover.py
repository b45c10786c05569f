"""Failover time of the scheduler extender: two replicas against the API-server double, the
leader killed (``--stop kill``, a crash) or stopped (``--stop term``, a rollout's SIGTERM), time
until the standby has labelled its Pod as the leader (the label the Service selects, so what
routes kube-scheduler to it). Default settings (OVERSALE_EXTENDER_LEASE_DURATION 10 s).

    python -m bench.extender_failover [--rounds 3] [--stop kill|term]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from kube.cli import Parser
from oversale.annotations import AnnotationKeys
from tests.conftest import free_port, stop_process, wait_until_serving
from tests.kube_api import FakeKubeAPI

ROOT = Path(__file__).resolve().parent.parent
LEADER = AnnotationKeys().extender_leader


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def labelled(api: FakeKubeAPI, pod: str) -> bool:
    return ((api.get("pods", "oversale", pod) or {}).get("metadata", {}).get("labels") or {}).get(LEADER) == "true"


def start(api: FakeKubeAPI, work: Path, pod: str = "") -> tuple[subprocess.Popen[bytes], str]:
    """An extender process; with ``pod``, as if it ran in that Pod (which it labels when it leads)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSALE_", "KUBECONFIG", "POD_"))}
    env.update({"KUBECONFIG": str(api.write_kubeconfig(work / f"kubeconfig-{port}")), "PYTHONPATH": str(ROOT)})
    if pod:
        api.put("pods", {"metadata": {"name": pod, "namespace": "oversale", "labels": {}}, "spec": {"containers": []},
                         "status": {"phase": "Running"}})
        env.update({"POD_NAME": pod, "POD_NAMESPACE": "oversale"})
    # A session of its own: a crash is modelled by killing the whole group, master and worker, as
    # when a container or its node dies (a worker whose master alone is killed exits gracefully).
    process = subprocess.Popen([sys.executable, "-m", "scheduler", "--bind", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                               stdout=(work / f"extender-{port}.log").open("wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(process, lambda: status(f"{url}/healthz") == 200, "extender")
    return process, url


def one_round(work: Path, stop: str) -> float:
    api = FakeKubeAPI().start()
    try:
        first, _ = start(api, work, "extender-a")
        while not labelled(api, "extender-a"):
            time.sleep(0.05)
        second, second_url = start(api, work, "extender-b")
        time.sleep(5)  # the standby settles (watches synced, its first lease attempts refused)
        assert status(f"{second_url}/readyz") == 200 and not labelled(api, "extender-b"), "ready, not leading"
        killed = time.monotonic()
        if stop == "kill":
            os.killpg(first.pid, signal.SIGKILL)
        else:
            first.terminate()  # the standby may take over before this one has quite exited
        while not labelled(api, "extender-b"):
            time.sleep(0.05)
        taken = time.monotonic() - killed
        first.wait()
        stop_process(second)
        return taken
    finally:
        api.stop()


def main() -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stop", choices=("kill", "term"), default="kill",
                        help="SIGKILL (a crash) or SIGTERM (a rollout) to the leader")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        times = []
        for number in range(args.rounds):
            times.append(one_round(Path(directory), args.stop))
            print(f"round {number + 1}: standby leading {times[-1]:.1f} s after the leader was "
                  f"{'killed' if args.stop == 'kill' else 'sent SIGTERM'}", file=sys.stderr)
    print(json.dumps({"failover_s": [round(t, 1) for t in times], "median_s": round(statistics.median(times), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
