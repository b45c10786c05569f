"""The Flask application: thin routes over ``webhook.pod_admission`` and the core."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from flask import Flask, Response, request

from oversale.quantity import CPU, MEMORY
from oversale.settings import Settings
from webhook.metrics import Metrics
from webhook.owners import NoCluster, OwnerCache, load_api_client
from webhook.pod_admission import Owners, PodDecision, admit_pod
from webhook.reviews import MalformedReview, allow, parse_review

log = logging.getLogger(__name__)


def create_app(settings: Settings, owners: Any = None, metrics: Metrics | None = None) -> Flask:
    """Build the webhook app. Without ``owners``, start watch caches against the configured
    cluster, or run with Pod annotations only when there is none."""
    metrics = metrics or Metrics()
    if owners is None:
        owners = _connect(settings, metrics)
    app = Flask("oversale-webhook")
    app.config["OVERSALE_OWNERS"] = owners

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

    @app.post("/mutate/pods")
    def mutate_pods() -> Response:
        return _admission(settings, metrics, "pods", lambda req: admit_pod(req, settings, owners))

    @app.errorhandler(404)
    @app.errorhandler(405)
    def not_routed(error: Any) -> Response:
        return _json({"error": str(error)}, error.code)

    return app


def _admission(settings: Settings, metrics: Metrics, resource: str, admit: Any) -> Response:
    started = time.perf_counter()
    body = _read_body(settings.max_body_bytes)
    if body is None:
        metrics.admissions.labels(resource, "malformed").inc()
        return _json({"error": f"body larger than {settings.max_body_bytes} bytes"}, 400)
    try:
        admission_request = parse_review(body)
    except MalformedReview as error:
        metrics.admissions.labels(resource, "malformed").inc()
        return _json({"error": str(error)}, 400)
    try:
        decision: PodDecision = admit(admission_request)
        _record(metrics, resource, decision)
        review = decision.review
    except Exception:
        log.exception("admission of %s review %s failed; allowing unchanged", resource, admission_request["uid"])
        metrics.admissions.labels(resource, "error").inc()
        review = allow(admission_request["uid"])
    metrics.latency.labels(resource).observe(time.perf_counter() - started)
    return _json(review)


def _record(metrics: Metrics, resource: str, decision: PodDecision) -> None:
    metrics.admissions.labels(resource, decision.outcome).inc()
    for problem in decision.problems:
        metrics.invalid_annotations.labels(problem.key).inc()
    if decision.result and decision.outcome == "mutated" and not decision.dry_run:
        freed = decision.result.freed
        if freed.get(CPU):
            metrics.freed_millicores.labels(decision.namespace).inc(freed[CPU])
        if freed.get(MEMORY):
            metrics.freed_bytes.labels(decision.namespace).inc(freed[MEMORY])


def _read_body(limit: int) -> bytes | None:
    """The request body, or None when it is larger than ``limit``.

    An oversized body is read and dropped (up to a bound) rather than left unread: a client that
    is still sending when the connection closes sees a reset instead of the 400 that explains it.
    """
    length = request.content_length
    if length is not None and length > limit:
        _discard(min(length, 4 * limit))
        return None
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        _discard(3 * limit)
        return None
    return body


def _discard(count: int) -> None:
    while count > 0:
        chunk = request.stream.read(min(count, 1 << 16))
        if not chunk:
            return
        count -= len(chunk)


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def _connect(settings: Settings, metrics: Metrics) -> Owners:
    api_client = load_api_client(settings.kubernetes)
    if api_client is None:
        if settings.kubernetes != "off":
            log.info("no in-cluster config and no kubeconfig: serving with Pod annotations only")
        return NoCluster()
    cache = OwnerCache(
        api_client,
        settings.keys,
        lookup_timeout=settings.owner_lookup_timeout_seconds,
        watch_timeout_seconds=settings.watch_timeout_seconds,
        on_sync=lambda kind, synced: metrics.cache_synced.labels(kind).set(1 if synced else 0),
        on_lookup=lambda result: metrics.owner_lookups.labels(result).inc(),
    )
    cache.start()
    return cache
