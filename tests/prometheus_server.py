"""A real Prometheus for tests: history written as OpenMetrics, turned into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics`` (timestamps in seconds, each series' samples in
order, one metric family after another), then served by ``prometheus`` on a loopback port; or the
same history imported into a real VictoriaMetrics (:class:`VictoriaMetricsServer`)."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import IO

from kube.probes import AnsweringHandler
from oversale.timestamps import parse_go_duration
from tests.conftest import free_port, stop_process, wait_until_serving

Series = (tuple[dict[str, str], Callable[[float], float]] | tuple[dict[str, str], Callable[[float], float], float]
          | tuple[dict[str, str], Callable[[float], float], float, float])
"""(labels, value at time t[, first sample time[, last sample time]])"""


@dataclass
class Family:
    name: str
    kind: str  # "counter" or "gauge"
    series: list[Series] = field(default_factory=list)
    step: float | None = None
    """Seconds between its samples (its scrape interval); None: ``write_openmetrics``' step."""


def _escaped(value: str) -> str:
    """A label value as OpenMetrics writes it (a JSON annotation holds quotes)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_openmetrics(path: Path, families: Iterable[Family], start: float, end: float, step: float) -> int:
    """Sample every series from ``start`` to ``end``, every ``step`` seconds or its family's own;
    counters integrate their rate function."""
    written = 0
    default_step = step
    with path.open("w") as out:
        for family in families:
            step = family.step or default_step
            out.write(f"# TYPE {family.name} {family.kind}\n")
            suffix = "_total" if family.kind == "counter" else ""
            base = family.name.removesuffix("_total") if family.kind == "counter" else family.name
            for labels, value_at, *bounds in family.series:
                text = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items()))
                total = 0.0
                t = start
                while bounds and t < bounds[0]:
                    t += step
                while t <= (min(end, bounds[1]) if len(bounds) > 1 else end):
                    if family.kind == "counter":
                        total += value_at(t) * step
                        value = total
                    else:
                        value = value_at(t)
                    out.write(f"{base}{suffix}{{{text}}} {value:.6f} {int(t)}\n")
                    written += 1
                    t += step
        out.write("# EOF\n")
    return written


def backfill(openmetrics: Path, data: Path, parts: Path) -> None:
    """Turn ``openmetrics``' samples into TSDB blocks in ``data`` with promtool.

    promtool reads its whole input once for every 2-hour block it writes, so its time grows with
    the square of the history's length (15 s for test_plan's 9 days, minutes for a month). The
    file is split by UTC day first, into ``parts``: a day's bounds are block bounds, so the blocks
    are those one run would write, and the days are run two at a time."""
    parts.mkdir()
    days: dict[int, IO[str]] = {}
    family: dict[int, str] = {}
    header = ""
    with openmetrics.open() as source:
        for line in source:
            if line.startswith("#"):
                header = line if line.startswith("# TYPE") else header
                continue
            day = int(line.rstrip("\n").rpartition(" ")[2]) // 86400
            if day not in days:
                days[day] = (parts / f"{day}.om").open("w")
            if family.get(day) != header:  # each day file names the family its samples follow
                days[day].write(header)
                family[day] = header
            days[day].write(line)
    for out in days.values():
        out.write("# EOF\n")
        out.close()

    def blocks(part: Path) -> None:
        run = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(part),
                              str(data)], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"{part.name}: {run.stderr}"

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(blocks, sorted(parts.iterdir())))
    shutil.rmtree(parts)


@dataclass(frozen=True)
class WebConfig:
    """Prometheus's own ``--web.config.file``: basic auth (one user) and TLS, as a Prometheus
    exposed beyond its namespace is often run."""

    user: str
    password_hash: str
    """bcrypt, as Prometheus wants it."""
    certificate: Path
    key: Path

    def text(self) -> str:
        return (f"tls_server_config:\n  cert_file: {self.certificate}\n  key_file: {self.key}\n"
                f"basic_auth_users:\n  {self.user}: '{self.password_hash}'\n")


class _LoopbackStore:
    """A store's process serving on a loopback port, and the log it writes."""

    process: subprocess.Popen[bytes]
    log: IO[bytes]

    def stop(self) -> None:
        stop_process(self.process)
        self.log.close()


class PrometheusServer(_LoopbackStore):
    def __init__(self, workdir: Path, openmetrics: Path, max_samples: int = 50_000_000,
                 web: WebConfig | None = None, ready_headers: dict[str, str] | None = None) -> None:
        for tool in ("prometheus", "promtool"):
            assert shutil.which(tool), f"{tool} is needed (Debian package prometheus; .ci/run installs it)"
        self.data = workdir / "data"
        self.data.mkdir()
        backfill(openmetrics, self.data, workdir / "backfill")
        config = workdir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        self.port = free_port()
        self.url = f"{'https' if web else 'http'}://127.0.0.1:{self.port}"
        self.log = (workdir / "prometheus.log").open("wb")
        options = []
        if web is not None:
            (workdir / "web.yml").write_text(web.text())
            options.append(f"--web.config.file={workdir / 'web.yml'}")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=30d",
             f"--query.max-samples={max_samples}", *options],
            stdout=self.log, stderr=subprocess.STDOUT)
        unverified = None
        if web is not None:  # only to see it is up: the tests verify it against their CA themselves
            unverified = ssl.create_default_context()
            unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE

        def ready() -> bool:
            request = urllib.request.Request(f"{self.url}/-/ready", headers=ready_headers or {})
            with urllib.request.urlopen(request, timeout=2, context=unverified) as response:
                return bool(response.status == 200)

        wait_until_serving(self.process, ready, "prometheus", workdir / "prometheus.log", timeout=60)

    def wait_for_compaction(self, timeout: float = 900.0, quiet: float = 60.0) -> tuple[int, int]:
        """Wait until Prometheus has compacted the blocks promtool wrote (a 2-hour block each):
        its compactor runs a minute after start and merges them into blocks of up to days, as a
        Prometheus that has held the history for that long has them. A query over 86 small blocks
        (a week) took 3 times as long as over the 9 they became (``bench.reconcile_scale``), so
        a benchmark that times queries waits first. Returns the blocks loaded before and after."""
        def blocks() -> int:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
                text = response.read().decode()
            return int(float(re.search(r"^prometheus_tsdb_blocks_loaded (\S+)$", text, re.MULTILINE)[1]))

        started = time.monotonic()
        before = last = blocks()
        settled = time.monotonic()
        # The compactor's first run comes a minute after start; a count unchanged for `quiet`
        # seconds after that is the end of its merging.
        while time.monotonic() - started < timeout:
            time.sleep(5)
            now = blocks()
            if now != last:
                last, settled = now, time.monotonic()
            elif time.monotonic() - started > 75 and time.monotonic() - settled >= quiet:
                break
        return before, last

    def query(self, expression: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.load(response)["data"]["result"]


GARBAGE_ANSWERS = (
    (b"<html>proxy error</html>", False),
    (b'{"status": "success", "data": {"resultType": "matrix"}}', False),
    (b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": "x"}]}}', False),
    (b"SSH-2.0-OpenSSH_9.2\r\n", True),
    (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{"status": "succ', True),
)
"""(body, raw) that a "Prometheus" may send which is not Prometheus's API: 200 with a proxy's
page, a vector without results, a value that is no sample; and, raw, bytes that are no HTTP
response (another protocol's port) or a response cut short (a restart mid-answer)."""


class AnsweringServer(ThreadingHTTPServer):
    headers_seen: list[dict[str, str]]
    """Each request's headers (names in lower case: they are case-insensitive), in order."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _serve(handler: type[AnsweringHandler], seen: list[dict[str, str]]) -> AnsweringServer:
    server = AnsweringServer(("127.0.0.1", 0), handler)
    server.headers_seen = seen
    # shutdown() waits for serve_forever's next poll: 0.5 s apart by default, a wait per test.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server


def garbage_prometheus(body: bytes, content_type: str = "application/json", raw: bool = False) -> AnsweringServer:
    """A "Prometheus" on a loopback port that answers every request 200 with ``body`` (``raw``:
    ``body`` is all it sends, status line and headers included, then it hangs up) and keeps each
    request's headers (``headers_seen``); stop it with ``shutdown()``."""
    seen: list[dict[str, str]] = []

    class Garbage(AnsweringHandler):
        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def _answer(self) -> None:
            seen.append({name.lower(): value for name, value in self.headers.items()})
            if raw:
                self.wfile.write(body)
                self.close_connection = True
                return
            self.send(200, body, content_type)

    return _serve(Garbage, seen)


def refusing_proxy(upstream: str, refused: str) -> AnsweringServer:
    """A proxy on a loopback port in front of the Prometheus at ``upstream`` that passes every
    query on but those whose PromQL matches the regular expression ``refused``: those it answers
    503, as Prometheus does a query that timed out (or a proxy in front of it, its upstream).
    Stop it with ``shutdown()``."""

    def refuse(path: str, form: dict[str, str]) -> dict[str, str] | None:
        return None if re.search(refused, form.get("query", "")) else form

    return _proxy(upstream, refuse)


def step_aligning_proxy(upstream: str) -> AnsweringServer:
    """A query frontend on a loopback port in front of the Prometheus at ``upstream`` that moves
    each range query's start and end down to multiples of its step before passing it on, as
    Thanos's query-frontend does by default (``--query-range.align-range-with-step``) and Mimir's
    where a tenant asks (``align_queries_with_step``), for its cache's sake: a range a day apart
    is then answered at midnights (UTC), not at the times asked. Stop it with ``shutdown()``."""

    def align(path: str, form: dict[str, str]) -> dict[str, str]:
        if path.endswith("/query_range"):
            step = parse_go_duration(form["step"])  # as the client sends it: 86400000ms
            form = {**form, **{edge: f"{float(form[edge]) // step * step:.3f}" for edge in ("start", "end")}}
        return form

    return _proxy(upstream, align)


@dataclass
class Held:
    most_at_once: int = 0
    """The most queries a :func:`holding_proxy` held at once."""
    queries: list[str] = field(default_factory=list)
    """Every PromQL query it passed on, in the order they came."""


def holding_proxy(upstream: str, hold: float = 0.2) -> tuple[AnsweringServer, Held]:
    """A proxy on a loopback port in front of the Prometheus at ``upstream`` that holds each
    query ``hold`` seconds before passing it on, so that queries sent together are seen together,
    and counts the most it held at once (and keeps the queries). Stop it with ``shutdown()``."""
    lock, now, held = threading.Lock(), [0], Held()

    def arrive(path: str, form: dict[str, str]) -> dict[str, str]:
        with lock:
            now[0] += 1
            held.most_at_once = max(held.most_at_once, now[0])
            held.queries.append(form.get("query", ""))
        time.sleep(hold)
        return form

    def leave() -> None:
        with lock:
            now[0] -= 1

    return _proxy(upstream, arrive, leave), held


PARTIAL_STORES = ("thanos", "victoria-metrics", "vmselect ignoring deny_partial_response")
"""The stores :func:`partial_store` stands in for."""


def partial_store(upstream: str, store: str) -> AnsweringServer:
    """The Prometheus at ``upstream`` behind a store that spans several, one of them unreachable,
    as their documentation describes it: a Thanos querier whose store gateway is down, or a
    VictoriaMetrics cluster's vmselect with a vmstorage node down (``store``, one of
    :data:`PARTIAL_STORES`). Asked for the whole answer (Thanos's ``partial_response=false``,
    vmselect's ``deny_partial_response=1``) it answers an error; otherwise the reachable stores'
    answer (here all of it), marked partial: a warning (Thanos), ``"isPartial": true``
    (VictoriaMetrics). The third ignores the parameter, as a vmselect older than it would."""
    thanos = store == "thanos"

    def reshape(form: dict[str, str], status: int, body: bytes) -> tuple[int, bytes]:
        if form.get("partial_response") == "false" if thanos else (
                store == "victoria-metrics" and form.get("deny_partial_response") == "1"):
            error = ("rpc error: code = Unavailable desc = store gateway thanos-store-0:10901 unreachable" if thanos
                     else "cannot fetch query results from vmstorage nodes: vmstorage-1:8401 unavailable")
            return (422 if thanos else 503), json.dumps(
                {"status": "error", "errorType": "execution" if thanos else "unavailable", "error": error}).encode()
        answer = json.loads(body)
        if thanos:
            answer["warnings"] = ["rpc error: code = Unavailable desc = store gateway thanos-store-0:10901 unreachable"]
        else:
            answer["isPartial"] = True
        return status, json.dumps(answer).encode()

    return _proxy(upstream, lambda path, form: form, reshape=reshape)


def _proxy(upstream: str, rewrite: Callable[[str, dict[str, str]], dict[str, str] | None],
           answering: Callable[[], None] = lambda: None,
           reshape: Callable[[dict[str, str], int, bytes], tuple[int, bytes]] | None = None) -> AnsweringServer:
    """A proxy passing each POSTed query on to ``upstream`` as ``rewrite(path, form)`` returns
    it, or answering 503 (a timed-out query) where that is None; ``answering`` is called just
    before each answer is sent (after it, the client may already have sent its next query);
    ``reshape`` (the form, the upstream's status and body) gives the answer sent instead."""

    class Proxy(AnsweringHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            form = rewrite(self.path, {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()})
            if form is None:
                answering()
                self.send(503, json.dumps({"status": "error", "errorType": "timeout",
                                           "error": "query timed out in query execution"}).encode())
                return
            forwarded = urllib.request.Request(upstream + self.path, data=urllib.parse.urlencode(form).encode(),
                                               headers={"Content-Type": self.headers.get(
                                                   "Content-Type", "application/x-www-form-urlencoded")})
            try:
                with urllib.request.urlopen(forwarded, timeout=120) as response:
                    status, answer = response.status, response.read()
                if reshape is not None:
                    status, answer = reshape(form, status, answer)
            finally:
                answering()
            self.send(status, answer)

    return _serve(Proxy, [])


class VictoriaMetricsServer(_LoopbackStore):
    """A real VictoriaMetrics (Debian package victoria-metrics), the Prometheus-compatible store
    many clusters keep their history in instead: the same OpenMetrics history imported through its
    ``/api/v1/import/prometheus`` (the Prometheus text format, timestamps in milliseconds), then
    flushed so every sample is searchable. It answers the Prometheus HTTP API with MetricsQL,
    which reads PromQL with differences of its own (``rate`` without extrapolation, among others)."""

    def __init__(self, workdir: Path, openmetrics: Path, flags: Sequence[str] = ()) -> None:
        """``flags``: more of its command-line flags, such as its query limits."""
        assert shutil.which("victoria-metrics"), "victoria-metrics is needed (Debian package; .ci/run installs it)"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / "victoria-metrics.log").open("wb")
        # -search.latencyOffset=0: by default the last 30 s are left out of answers, as still arriving.
        self.process = subprocess.Popen(
            ["victoria-metrics", f"-storageDataPath={workdir / 'victoria-data'}",
             f"-httpListenAddr=127.0.0.1:{self.port}", "-retentionPeriod=100y", "-search.latencyOffset=0s",
             "-search.disableCache", *flags], stdout=self.log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)

        wait_until_serving(self.process, ready, "victoria-metrics", workdir / "victoria-metrics.log", timeout=60)
        self.import_samples(openmetrics)

    def import_samples(self, openmetrics: Path) -> None:
        """Store ``openmetrics``' samples, whenever their time: late ones too, as a remote-write
        sender's backlog reaches a store once it is connected again."""
        def lines() -> Iterable[bytes]:
            with openmetrics.open() as source:
                for line in source:
                    if line.startswith("#"):
                        continue
                    sample, _, stamp = line.rstrip("\n").rpartition(" ")
                    yield f"{sample} {int(stamp) * 1000}\n".encode()

        body = b"".join(lines())
        request = urllib.request.Request(f"{self.url}/api/v1/import/prometheus", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=600) as response:
            assert response.status == 204, response.read()
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=60) as response:
            assert response.status == 200


STORES = ("prometheus", "victoria-metrics")
"""The stores a fixture parametrized by store serves its history from (:func:`serving`)."""


def serving(store: str, workdir: Path, openmetrics: Path) -> PrometheusServer | VictoriaMetricsServer:
    """``openmetrics``' history served by a real ``store`` (one of :data:`STORES`)."""
    if store == "victoria-metrics":
        return VictoriaMetricsServer(workdir, openmetrics)
    return PrometheusServer(workdir, openmetrics)
