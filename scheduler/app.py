"""The extender's HTTP surface: POST /filter, /prioritize, /preempt, /bind (kube-scheduler's
extender protocol), GET /healthz, /readyz, /metrics."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kube.cache_metrics import CacheRestarts
from kube.certificate_expiry import CertificateExpiry, PeerCertificate
from kube.client import one_line
from oversale.settings import Settings
from scheduler.extender import Binder, bind, filter_nodes, preempt, prioritize
from scheduler.protocol import BadRequest, parse_args, parse_binding, parse_preemption
from scheduler.state import ClusterState

log = logging.getLogger(__name__)


class ExtenderMetrics:
    def __init__(self, certificates: Mapping[str, Path] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.scheduler_client = PeerCertificate()
        """kube-scheduler's client certificate, as its calls present it (mutual TLS only)."""
        self.registry.register(CertificateExpiry(certificates or {}, {"kube-scheduler-client": self.scheduler_client}))
        self.calls = Counter("oversale_extender_calls", "Extender calls by verb and result.", ["verb", "result"],
                             registry=self.registry)
        self.latency = Histogram("oversale_extender_duration_seconds", "Time to answer one extender call.", ["verb"],
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                                 registry=self.registry)
        self.metrics_polls = Counter("oversale_extender_metrics_polls", "Reads of metrics.k8s.io by result.",
                                     ["result"], registry=self.registry)
        self.history_polls = Counter("oversale_extender_history_polls",
                                     "Reads of the nodes' cpu maximum from Prometheus by result.", ["result"],
                                     registry=self.registry)
        self.workload_history_polls = Counter("oversale_extender_workload_history_polls",
                                              "Reads of the workloads' usage history from Prometheus by result.",
                                              ["result"], registry=self.registry)
        self.stale_nodes = Gauge("oversale_extender_nodes_without_fresh_metrics",
                                 "Nodes placed by requests alone for want of fresh metrics, by reason (missing, old).",
                                 ["reason"], registry=self.registry)
        for reason in ("missing", "old"):
            self.stale_nodes.labels(reason).set(0)
        self.cache_restarts = CacheRestarts(self.registry)
        self.client_auth = Gauge("oversale_extender_client_auth",
                                 "1 when callers must present a certificate of kube-scheduler's CA (mutual TLS), "
                                 "0 when anyone who reaches the port can call bind.", registry=self.registry)

    def record_poll(self, result: str, stale: dict[str, int]) -> None:
        for reason, count in stale.items():
            self.stale_nodes.labels(reason).set(count)
        self.metrics_polls.labels(result).inc()


def create_app(settings: Settings, state: ClusterState, binder: Binder, ready: Callable[[], bool] = lambda: True,
               metrics: ExtenderMetrics | None = None, serving: Callable[[], bool] = lambda: True) -> Flask:
    metrics = metrics or ExtenderMetrics()
    keys = settings.keys
    app = Flask("oversale-scheduler")

    def answer(verb: str, work: Callable[[bytes], Any]) -> Response:
        started = time.perf_counter()
        # gunicorn hands each request its connection: under mutual TLS, kube-scheduler's.
        metrics.scheduler_client.saw(request.environ.get("gunicorn.socket"))
        try:
            payload = work(request.get_data())
            result = "error" if isinstance(payload, dict) and payload.get("Error") else "ok"
            status = 200
        except BadRequest as error:
            payload, result, status = {"Error": str(error)}, "malformed", 400
        except Exception as error:
            log.exception("%s failed", verb)
            payload, result, status = {"Error": f"{verb} failed: {one_line(error)}"}, "error", 200
        metrics.calls.labels(verb, result).inc()
        metrics.latency.labels(verb).observe(time.perf_counter() - started)
        return Response(json.dumps(payload), status=status, mimetype="application/json")

    @app.post("/filter")
    def filter_route() -> Response:
        return answer("filter", lambda body: filter_nodes(parse_args(body), state, keys, settings.load_aware))

    @app.post("/prioritize")
    def prioritize_route() -> Response:
        return answer("prioritize", lambda body: prioritize(parse_args(body), state, keys, settings.load_aware))

    @app.post("/preempt")
    def preempt_route() -> Response:
        # Read-only, like filter: a standby answers too. On an error of ours the answer names no
        # node, so kube-scheduler evicts nothing for this Pod in this cycle.
        return answer("preempt", lambda body: preempt(parse_preemption(body), state, keys, settings.load_aware))

    @app.post("/bind")
    def bind_route() -> Response:
        if not serving():
            # Only the leader hands out CPUs: a standby's view may miss its predecessor's last binds.
            return answer("bind", lambda body: {"Error": "this extender replica is on standby (not the leader)"})
        # One deadline for the bind's API requests: past kube-scheduler's httpTimeout, no one reads
        # the answer (kube-scheduler retries the bind meanwhile).
        one_bind = binder.within(settings.extender_bind_timeout_seconds)
        return answer("bind", lambda body: bind(parse_binding(body), state, one_bind, keys, settings.scheduler_names,
                                                settings.load_aware, serving))

    @app.get("/healthz")
    def healthz() -> Response:
        return Response('{"status": "ok"}', mimetype="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        # A standby is Ready too (it can take over at once); "leader" says which one binds.
        if ready():
            return Response(json.dumps({"status": "ready", "leader": serving()}), mimetype="application/json")
        return Response('{"status": "waiting for caches to sync"}', status=503, mimetype="application/json")

    @app.get("/metrics")
    def metrics_route() -> Response:
        return Response(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    return app
