"""The Flask application: thin routes over ``webhook.pod_admission`` and the core."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson
from flask import Flask, Response

from kube.client import load_api_client
from oversale.quantity import CPU, MEMORY, RESOURCES, parse_amount
from oversale.settings import Settings
from webhook.metrics import Metrics
from webhook.node_admission import NodeDecision, NodePods, StatusWrites, admit_node, validate_node
from webhook.node_pods import LiveNodePods, NoClusterPods
from webhook.owners import NoCluster, OwnerCache
from webhook.pod_admission import Owners, PodAnswers, PodDecision, admit_pod
from webhook.reviews import AdmissionRequest, AdmissionReview, MalformedReview, allow, parse_review

log = logging.getLogger(__name__)


def create_app(
    settings: Settings, owners: Any = None, node_pods: NodePods | None = None, metrics: Metrics | None = None,
    certificates: Mapping[str, Path] | None = None,
) -> Flask:
    """Build the webhook app. Without ``owners``/``node_pods``, connect to the configured cluster
    (watch caches, live Pod lookups), or run with Pod annotations only when there is none.
    ``certificates``: the files served (name -> path), whose expiry ``/metrics`` shows."""
    metrics = metrics or Metrics(settings.node_series_ttl_seconds, certificates)
    if owners is None or node_pods is None:
        owners, connected_pods = _connect(settings, metrics, owners)
        node_pods = node_pods if node_pods is not None else connected_pods
    app = Flask("oversale-webhook")

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        if owners.synced:
            return _json({"status": "ready"})
        return _json({"status": "waiting for caches to sync"}, 503)

    @app.get("/metrics")
    def metrics_route() -> Response:
        payload, content_type = metrics.exposition()
        return Response(payload, content_type=content_type)

    @app.errorhandler(404)
    @app.errorhandler(405)
    def not_routed(error: Any) -> Response:
        return _json({"error": str(error)}, error.code)

    # The admission routes are answered before Flask builds a request context: every Pod
    # creation and every oversold node's status write waits on them (issue 16's profile: the
    # framework around the policy cost more than the policy).
    pod_answers = PodAnswers(settings)
    node_writes = StatusWrites(settings)
    app.wsgi_app = AdmissionRoutes(app.wsgi_app, settings, metrics, {  # type: ignore[method-assign]
        "/mutate/pods": ("pods", lambda r: _record_pod(metrics, admit_pod(r, settings, owners, pod_answers))),
        "/mutate/nodes": ("nodes", lambda r: _record_node(metrics, admit_node(r, settings, node_writes))),
        "/validate/nodes": ("nodes-validate",
                            lambda r: _record_verdict(metrics, validate_node(r, settings, node_pods))),
    })
    return app


Answer = Callable[[AdmissionRequest], AdmissionReview]


class AdmissionRoutes:
    """WSGI middleware: POST to an admission path is read, answered and written here, in plain
    WSGI; anything else goes on to the Flask app."""

    def __init__(self, app: Callable[..., Any], settings: Settings, metrics: Metrics,
                 routes: dict[str, tuple[str, Answer]]) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.routes = routes

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        route = self.routes.get(environ.get("PATH_INFO", ""))
        if route is None:
            return self.app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST":
            body = orjson.dumps({"error": "405 Method Not Allowed: The method is not allowed for the requested URL."})
            start_response("405 Method Not Allowed", [("Content-Type", "application/json"), ("Allow", "POST"),
                                                      ("Content-Length", str(len(body)))])
            return [body]
        resource, answer = route
        status, body = admission(self.settings, self.metrics, resource, answer, _wsgi_body(environ,
                                                                                          self.settings.max_body_bytes))
        start_response(f"{status} {HTTPStatus(status).phrase}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def admission(settings: Settings, metrics: Metrics, resource: str, answer: Answer,
              body: bytes | None) -> tuple[int, bytes]:
    """Read, answer and time one review: (HTTP status, JSON body). Malformed or oversized bodies
    get a 400; any error of ours allows the object unchanged (fail open), so a bug here never
    blocks a Pod or a node heartbeat."""
    started = time.perf_counter()
    if body is None:
        metrics.child(metrics.admissions, resource, "malformed").inc()
        return 400, orjson.dumps({"error": f"body larger than {settings.max_body_bytes} bytes"})
    try:
        admission_request = parse_review(body)
    except MalformedReview as error:
        metrics.child(metrics.admissions, resource, "malformed").inc()
        return 400, orjson.dumps({"error": str(error)})
    try:
        review = answer(admission_request)
    except Exception:
        log.exception("admission of %s review %s failed; allowing unchanged", resource, admission_request["uid"])
        metrics.child(metrics.admissions, resource, "error").inc()
        review = allow(admission_request["uid"])
    try:
        payload = orjson.dumps(review)
    except TypeError:
        log.exception("review %s could not be serialised; allowing unchanged", admission_request["uid"])
        metrics.child(metrics.admissions, resource, "error").inc()
        payload = orjson.dumps(allow(admission_request["uid"]))
    metrics.child(metrics.latency, resource).observe(time.perf_counter() - started)
    return 200, payload


def _record_pod(metrics: Metrics, decision: PodDecision) -> AdmissionReview:
    metrics.child(metrics.admissions, "pods", decision.outcome).inc()
    for problem in decision.problems:
        metrics.invalid_annotations.labels(problem.key).inc()
    if decision.outcome == "mutated" and not decision.dry_run:
        # A counter only grows: lowered and raised requests are counted apart.
        freed = decision.freed
        for resource, lowered, raised in ((CPU, metrics.freed_millicores, metrics.added_millicores),
                                          (MEMORY, metrics.freed_bytes, metrics.added_bytes)):
            amount = freed.get(resource, 0)
            if amount > 0:
                metrics.child(lowered, decision.namespace).inc(amount)
            elif amount < 0:
                metrics.child(raised, decision.namespace).inc(-amount)
    return decision.review


def _record_verdict(metrics: Metrics, verdict: AdmissionReview) -> AdmissionReview:
    allowed = verdict.get("response", {}).get("allowed", True)
    metrics.child(metrics.admissions, "nodes-validate", "allowed" if allowed else "denied").inc()
    return verdict


def _record_node(metrics: Metrics, decision: NodeDecision) -> AdmissionReview:
    metrics.child(metrics.admissions, "nodes", decision.outcome).inc()
    for problem in decision.problems:
        metrics.invalid_annotations.labels(problem.key).inc()
    result = decision.result
    if result is None or decision.dry_run:
        return decision.review
    for resource in result.restored:
        metrics.node_restores.labels(resource).inc()
    for resource in RESOURCES:
        real = result.real.allocatable.get(resource)
        if real is None or resource not in result.allocatable:
            continue
        scale = 1000 if resource == CPU else 1  # cpu exposed in cores, as kube-state-metrics does
        oversold = parse_amount(resource, result.allocatable[resource])
        metrics.set_gauge(metrics.node_allocatable, (decision.node, resource, "real"),
                          parse_amount(resource, real) / scale)
        metrics.set_gauge(metrics.node_allocatable, (decision.node, resource, "oversold"), oversold / scale)
        metrics.set_gauge(metrics.node_ratio, (decision.node, resource), float(result.applied.get(resource, 1)))
    return decision.review


def _wsgi_body(environ: dict[str, Any], limit: int) -> bytes | None:
    """The request body, or None when it is larger than ``limit``.

    An oversized body is read and dropped (up to a bound) rather than left unread: a client that
    is still sending when the connection closes sees a reset instead of the 400 that explains it.
    """
    stream = environ["wsgi.input"]
    try:
        length = int(environ.get("CONTENT_LENGTH") or -1)
    except ValueError:
        length = -1
    if length > limit:
        _discard(stream, min(length, 4 * limit))
        return None
    body: bytes = stream.read(length) if length >= 0 else stream.read(limit + 1)
    if len(body) > limit:
        _discard(stream, 3 * limit)
        return None
    return body


def _discard(stream: Any, count: int) -> None:
    while count > 0:
        chunk = stream.read(min(count, 1 << 16))
        if not chunk:
            return
        count -= len(chunk)


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype="application/json")


def _connect(settings: Settings, metrics: Metrics, owners: Owners | None) -> tuple[Owners, NodePods]:
    """``owners`` (the owner caches, started here unless handed: each watches a kind cluster-wide)
    and the live Pod lookups of the configured cluster."""
    api_client = load_api_client(settings.kubernetes)
    if api_client is None:
        if settings.kubernetes != "off":
            log.info("no in-cluster config and no kubeconfig: serving with Pod annotations only")
        return owners if owners is not None else NoCluster(), NoClusterPods()
    if owners is None:
        cache = OwnerCache(
            api_client,
            settings.keys,
            lookup_timeout=settings.owner_lookup_timeout_seconds,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            on_sync=lambda kind, synced: metrics.cache_synced.labels(kind).set(1 if synced else 0),
            on_lookup=lambda result: metrics.child(metrics.owner_lookups, result).inc(),
            on_restart=metrics.cache_restarts,
        )
        cache.start()
        owners = cache
    return owners, LiveNodePods(api_client, settings.pod_lookup_timeout_seconds)
