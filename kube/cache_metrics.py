"""How often the list-then-watch caches (:mod:`kube.reflector`) list or watch their kinds again,
as a metric on the registry of whichever server holds them (the webhook, the extender).

Import it only where ``prometheus_client`` may already be imported: the webhook chooses its
multiprocess mode before that first import (``webhook.__main__``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

NAME = "oversale_cache_restarts"


class CacheRestarts:
    """``oversale_cache_restarts_total{kind, again, cause}``, counted by the reflectors'
    ``on_restart``. A relist (``again="list"``) reads every object of its kind from the API server,
    the costliest read there is on a large cluster's Pods: a steady rate of ``cause="expired"``
    says the API server's watch cache keeps too little history for the cluster's churn, one of
    ``cause="refused"`` that RBAC or a proxy lets the list through but not the watch. A watch
    begun again (``again="watch"``) costs nearly nothing: ``cause="cut"`` at a steady pace is most
    often a load balancer or proxy closing connections it finds idle before the API server ends
    the watch (``OVERSALE_WATCH_TIMEOUT``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counter = Counter(NAME, "Times a watch cache listed its kind again or watched it again from where it "
                               "stood, by what it did again (list, watch) and why (list failed, expired, refused; "
                               "cut, refused for now).", ["kind", "again", "cause"], registry=registry)

    def __call__(self, kind: str, again: str, cause: str) -> None:
        self.counter.labels(kind, again, cause).inc()
