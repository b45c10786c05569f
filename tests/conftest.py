"""Shared test helpers: real AdmissionReview payloads, the fixtures in ../shared, and a real
``python -m webhook`` (gunicorn, TLS) started on a loopback port."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import re
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import settings

from tests.kube_api import FakeKubeAPI

ROOT = Path(__file__).resolve().parent.parent

# Speed is for bench/, not for tests. Hypothesis's default deadline (200 ms an example) fails a
# property test whose example ran long once and then fast ("Unreliable test timings"), which on
# CI's two cores, shared with a backfilling Prometheus and the other worker, is the machine's
# load, not the code's. Every property test inherits this; the fuzz tests set it themselves.
settings.register_profile("oversale", deadline=None)
settings.load_profile("oversale")


def _suite_switch(name: str) -> str:
    """A switch of the suite's own, taken out of the environment: the commands the tests start
    inherit it, and warn about every OVERSALE_* variable that is not one of their settings. It is
    kept as ``PYTEST_<name>``, which `make test`'s pytest-xdist workers inherit: they start after
    the controller imported this module (a pytest the tests start is handed neither, see
    tests/test_cli.py)."""
    value = os.environ.pop(name, None)
    if value is None:
        return os.environ.get(f"PYTEST_{name}", "")
    os.environ[f"PYTEST_{name}"] = value
    return value


SHARED_DIR_SET = _suite_switch("OVERSALE_SHARED_DIR")
REQUIRE_SHARED = _suite_switch("OVERSALE_REQUIRE_SHARED") == "1"


def _shared_dir() -> Path:
    """``$OVERSALE_SHARED_DIR``, else ``shared/`` beside this checkout, or beside the local
    repository it was cloned from (a fresh clone elsewhere, e.g. CI's in /tmp, still finds the
    inputs nobody here wrote)."""
    if SHARED_DIR_SET:
        return Path(SHARED_DIR_SET)
    candidates = [ROOT.parent / "shared"]
    origin = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"],
                            capture_output=True, text=True, check=False).stdout.strip()
    if origin and "://" not in origin and ":" not in origin.split("/")[0]:  # a local path, not a URL
        candidates.append((ROOT / origin).resolve().parent / "shared")
    return next((c for c in candidates if (c / "fixtures" / "pods").is_dir()), candidates[0])


SHARED = _shared_dir()
POD_FIXTURES = sorted((SHARED / "fixtures" / "pods").glob("*.json"))
SHARED_PRESENT = bool(POD_FIXTURES)
SHARED_MISSING = (f"the shared corpus (real traces and fixtures nobody here wrote, kept beside the repository "
                  f"in ../shared/) is not at {SHARED}")
# A Deployment-owned Pod with one container requesting 100m CPU and 100Mi memory.
FRONTEND_POD = SHARED / "fixtures" / "pods" / "016-examples-deployment-frontend.json"


def pytest_configure(config: pytest.Config) -> None:
    """CI sets OVERSALE_REQUIRE_SHARED=1, where a missing corpus is an error, told before any test
    runs (here, as pytest-xdist's controller collects nothing and a worker's error loses its words)."""
    config.addinivalue_line("markers", "shared: reads ../shared/ (skipped, with one line, where it is absent)")
    if REQUIRE_SHARED and not SHARED_PRESENT:
        raise pytest.UsageError(f"OVERSALE_REQUIRE_SHARED=1 but {SHARED_MISSING}")
    sys.addaudithook(_note_unmarked_shared_read)


_SHARED_PATHS = tuple({os.path.abspath(SHARED) + os.sep, os.path.realpath(SHARED) + os.sep})
_unmarked_reads: list[str] | None = None
"""What of ../shared/ the test running now opened or listed; None while no test runs, or one
marked 'shared' does."""


def _note_unmarked_shared_read(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook (called on every audited event, so it returns at once on most). A test that
    reads the corpus without the 'shared' mark fails where the corpus is absent instead of being
    left out, which nobody sees on a machine that has it: it fails here, where the corpus is."""
    reads = _unmarked_reads
    if reads is None or event not in ("open", "os.scandir", "os.listdir") or not isinstance(args[0], (str, Path)):
        return
    path = os.path.abspath(args[0])
    if path.startswith(_SHARED_PATHS):
        reads.append(path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    global _unmarked_reads
    _unmarked_reads = [] if item.get_closest_marker("shared") is None else None
    try:
        return (yield)
    finally:
        _unmarked_reads = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without the corpus, the tests that read it are left out and the rest runs."""
    needing = [item for item in items if item.get_closest_marker("shared")]
    if SHARED_PRESENT or not needing:
        return
    items[:] = [item for item in items if not item.get_closest_marker("shared")]
    config.hook.pytest_deselected(items=needing)
    config.stash[_SKIPPED_SHARED] = len(needing)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its controller writes the summary
        config.workeroutput["skipped_shared"] = len(needing)


_SKIPPED_SHARED = pytest.StashKey[int]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller, as each worker ends: the tests it left out (each worker collects
    them all, and runs its share)."""
    left_out = getattr(node, "workeroutput", {}).get("skipped_shared", 0)
    node.config.stash[_SKIPPED_SHARED] = max(node.config.stash.get(_SKIPPED_SHARED, 0), left_out)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = config.stash.get(_SKIPPED_SHARED, 0)
    if skipped:
        terminalreporter.write_line(f"SKIPPED {skipped} tests marked 'shared': {SHARED_MISSING}", yellow=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """CI runs everything: a 'shared' test skipped for any reason (a file missing from the corpus)
    fails the run there. Made so as the report is made, before anything (the run's count of
    failures, a pytest-xdist worker's message to its controller) reads its outcome."""
    report = yield
    if report.skipped and REQUIRE_SHARED and item.get_closest_marker("shared"):
        report.outcome = "failed"
        report.longrepr = f"OVERSALE_REQUIRE_SHARED=1 and a test that reads ../shared/ was skipped: {report.longrepr}"
    if report.when == "call" and report.passed and _unmarked_reads:
        report.outcome = "failed"
        report.longrepr = (f"this test read {_unmarked_reads[0]} (and {len(_unmarked_reads) - 1} more) but is not "
                           f"marked 'shared': without ../shared/ it would fail instead of being left out")
    return report


def load_fixture_pod(path: Path) -> dict[str, Any]:
    """A fixture Pod as an API server hands it to admission webhooks: requests defaulted from
    limits where missing (the API server does that before webhooks run)."""
    pod = json.loads(path.read_text())
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.setdefault("requests", {}) if limits else resources.get("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)
        if "resources" in container and not resources.get("requests"):
            resources.pop("requests", None)
    return pod


def pod_review(pod: dict[str, Any], operation: str = "CREATE", namespace: str | None = None,
               **request: Any) -> dict[str, Any]:
    """A real AdmissionReview v1 request for a Pod, as the API server sends it."""
    namespace = namespace or pod.get("metadata", {}).get("namespace", "default")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod if operation != "DELETE" else None,
            "oldObject": None if operation == "CREATE" else pod,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            **request,
        },
    }

def no_cluster_app(**overrides: Any) -> Any:
    """The webhook's Flask app in this process with no cluster: Pods go by their own annotations,
    and no node's Pods can be listed. ``overrides``: Settings fields."""
    from oversale.settings import Settings
    from webhook.app import create_app
    from webhook.node_pods import NoClusterPods
    from webhook.owners import NoCluster

    return create_app(Settings(kubernetes="off", **overrides), owners=NoCluster(), node_pods=NoClusterPods())



def apply_response(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The Pod after the API server applies the response's JSON patch (itself when none)."""
    if "patch" not in response:
        return copy.deepcopy(pod)
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(pod, patch)


def wait_until_serving(process: subprocess.Popen, probe: Callable[[], bool], what: str, log: Path | None = None,
                       timeout: float = 30.0) -> None:
    """Poll ``probe`` (connection errors count as not yet) until it is true; fail if the process
    exits or ``timeout`` passes, with its log. A process that did not start is stopped: its
    caller's fixture never reaches its teardown, and a process left running would go on talking
    to whatever API server double next listens on its port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if probe():
                return
        except (OSError, ssl.SSLError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError(f"{what} did not start:\n{log.read_text() if log else ''}")
        time.sleep(0.1)


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """The first truthy result of ``check`` within ``timeout`` (else its last result)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def cli_env(api: FakeKubeAPI, tmp_path: Path, **settings: str) -> dict[str, str]:
    """The environment of a ``python -m reconcilers`` process against ``api``: a kubeconfig for
    it, a bare PATH and HOME, and ``settings`` (OVERSALE_* variables)."""
    return {"KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")), "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path), **settings}


def exposed_value(metrics_text: str, series: str) -> float:
    """The value of one ``series`` (its name and labels as /metrics writes them) in ``metrics_text``;
    0 while it is not there.

    >>> exposed_value('a_total{verb="bind"} 2.0\\nb 1.0\\n', 'a_total{verb="bind"}'), exposed_value("b 1.0", "c")
    (2.0, 0.0)
    """
    found = re.search(rf"^{re.escape(series)} (\S+)$", metrics_text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def scraped(port: int, host: str = "127.0.0.1") -> str:
    """What a ``run`` process serves on its metrics port ("" while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` of a command a test sends Ctrl-C (SIGINT) to: its default action, as in a
    terminal. A background job of a shell script (CI under ``nohup ... &``) hands its children
    SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(api: FakeKubeAPI, tmp_path: Path, name: str, lease_duration: str,
              **settings: str) -> tuple[subprocess.Popen, Path]:
    """``python -m reconcilers run`` as replica ``name`` against ``api``, its SQLite history and
    stderr log named after it. The interval is an hour, so any pass a test sees within seconds is
    one the loop did not wait an interval for."""
    env = cli_env(api, tmp_path, **{"OVERSALE_SQLITE_PATH": str(tmp_path / f"{name}.db"),
                                    # Loopback: a test's server answers nothing beyond this host.
                                    "OVERSALE_RECONCILER_METRICS_ADDRESS": "127.0.0.1",
                                    "OVERSALE_RECONCILER_METRICS_PORT": str(free_port()),
                                    "OVERSALE_LEASE_DURATION": lease_duration, "OVERSALE_RECONCILE_INTERVAL": "1h",
                                    **settings})
    # Its threads' stacks go to the log if it is aborted (terminated_by_a_rollout).
    env["PYTHONFAULTHANDLER"] = "1"
    log = tmp_path / f"{name}.log"
    return subprocess.Popen([sys.executable, "-m", "reconcilers", "run"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"),
                            preexec_fn=sigint_as_in_a_terminal), log


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def worker_deaths(log: str) -> list[str]:
    """What gunicorn's master said of workers that did not leave cleanly (killed by a signal, an
    exit code other than 0), in a server's log."""
    return re.findall(r"Worker \(pid:\d+\) (?:was sent \w+!|exited with code \d+)", log)


def damage_sqlite(path: Path) -> None:
    """Overwrite every page of a SQLite file but its first (the header and the schema), as a
    volume lost mid-write can: the file still opens, and reading or writing its tables fails
    with "database disk image is malformed"."""
    with sqlite3.connect(str(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file itself
    db.close()
    with path.open("r+b") as file:
        page_size = int.from_bytes(file.read(18)[16:18], "big")
        size = file.seek(0, os.SEEK_END)
        file.seek(page_size)
        file.write(b"\xa5" * (size - page_size))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunningWebhook:
    """``python -m webhook`` in a subprocess, and an HTTPS client that verifies its CA."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None, workers: int = 2) -> None:
        self.port = free_port()
        self.certs = tmp / "certs"
        self.log = tmp / "webhook.log"
        # A HOME of its own, as the image's (read-only there): whatever is written under it shows.
        self.home = tmp / "home"
        self.home.mkdir(exist_ok=True)
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith(("OVERSALE_", "KUBECONFIG", "XDG_RUNTIME_DIR"))}
        environ.update({"OVERSALE_KUBERNETES": "off", "PYTHONPATH": str(ROOT), "HOME": str(self.home), **(env or {})})
        self._log_handle = self.log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "webhook", "--bind", f"127.0.0.1:{self.port}",
             "--certs-dir", str(self.certs), "--workers", str(workers),
             "--metrics-dir", str(tmp / "metrics")],
            cwd=ROOT, env=environ, stdout=self._log_handle, stderr=subprocess.STDOUT,
        )
        wait_until_serving(self.process, lambda: self.get("/healthz")[0] == 200, "webhook", self.log)

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.certs / "ca.crt"))

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("localhost", self.port, context=self.context(), timeout=10)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        connection = self.connection()
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def review(self, review: dict[str, Any], path: str = "/mutate/pods") -> dict[str, Any]:
        status, body = self.request("POST", path, json.dumps(review).encode(),
                                    {"Content-Type": "application/json"})
        assert status == 200, body
        answer = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == review["request"]["uid"]
        return dict(answer["response"])

    def samples(self, name: str, **labels: str) -> list[Any]:
        """A metric's samples matching ``labels`` in the /metrics exposition."""
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.get("/metrics")
        assert status == 200
        return [sample for family in text_string_to_metric_families(body.decode()) for sample in family.samples
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())]

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples matching ``labels`` in the /metrics exposition."""
        return sum((sample.value for sample in self.samples(name, **labels)), 0.0)

    def counted_review(self, review: dict[str, Any], path: str,
                       resource: str) -> tuple[dict[str, Any], dict[str, float]]:
        """The response to ``review``, and by how much each ``oversale_admissions_total{resource}``
        outcome grew while it was answered."""
        def counts() -> dict[str, float]:
            return {sample.labels["outcome"]: sample.value
                    for sample in self.samples("oversale_admissions_total", resource=resource)}

        before = counts()
        response = self.review(review, path)
        after = counts()
        return response, {outcome: after[outcome] - before.get(outcome, 0.0) for outcome in after
                          if after[outcome] != before.get(outcome, 0.0)}

    def stop(self) -> None:
        stop_process(self.process)
        self._log_handle.close()


@pytest.fixture(scope="module")
def webhook_no_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    """The webhook as a newcomer runs it: no cluster, self-created certificates."""
    server = RunningWebhook(tmp_path_factory.mktemp("webhook"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sixteen_cpu_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Prometheus holding a day of node-exporter's cpu counters for one node, ``node-1:9100``,
    as node-exporter publishes them: one per cpu and mode, 16 cpus x 8 modes, each cpu 10% busy in
    each of the 5 modes read (so 8 cores in use)."""
    from tests.prometheus_server import Family, PrometheusServer, write_openmetrics  # it imports this module
    end = time.time() - 120
    node_cpu = Family("node_cpu_seconds_total", "counter")
    for cpu in range(16):
        for mode in ("user", "system", "nice", "irq", "softirq", "idle", "iowait", "steal"):
            node_cpu.series.append(({"instance": "node-1:9100", "cpu": str(cpu), "mode": mode},
                                    lambda t, m=mode: 0.5 if m == "idle" else 0.1))
    directory = tmp_path_factory.mktemp("sixteen-cpus")
    history = directory / "history.om"
    write_openmetrics(history, [node_cpu], end - 86400, end, 60)
    server = PrometheusServer(directory, history)
    yield server
    server.stop()


@pytest.fixture
def kube_api() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI().start()
    yield api
    api.stop()


def loaded_client(api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The ``kubernetes`` client the commands load (``kube.client.load_api_client``: a request
    whose answer timed out is not sent again), pointed at ``api`` through a kubeconfig. A plain
    ``ApiClient`` lets urllib3 send a timed-out GET or PUT again, which hides a timeout."""
    from kube.client import load_api_client

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    return load_api_client("auto")


def expiry_samples(exposition: str) -> dict[str, float]:
    """certificate -> expiry of the ``oversale_tls_certificate_expiry_timestamp_seconds`` samples of
    a /metrics answer (large values come in Go's exponent form, 1.8e+09)."""
    return {match[0]: float(match[1]) for match in re.findall(
        r'^oversale_tls_certificate_expiry_timestamp_seconds\{certificate="([a-z-]+)"\} (\S+)$', exposition, re.M)}
