"""The expiry of the certificates a server presents or trusts, as a metric read at scrape time.

Import it only where ``prometheus_client`` may already be imported: the webhook chooses its
multiprocess mode before that first import (``webhook.__main__``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from cryptography import x509
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kube.tls import expires_at

NAME = "oversale_tls_certificate_expiry_timestamp_seconds"


class CertificateExpiry(Collector):
    """``oversale_tls_certificate_expiry_timestamp_seconds{certificate}``: when each file's earliest
    certificate expires. Read from the files at every scrape, because the kubelet swaps a renewed
    Secret into the mounted volume and the servers load it per connection without a restart; a
    file that holds no readable certificate has no sample.

    A renewal that never happens (a failing certs CronJob, a stuck cert-manager) is otherwise
    silent until the day the API server can no longer call the webhook: Pods then go uncompressed
    and every oversold node falls back to its real allocatable at its next status write.
    """

    def __init__(self, files: Mapping[str, Path], peers: Mapping[str, PeerCertificate] | None = None) -> None:
        self.files = dict(files)
        self.peers = dict(peers or {})

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for certificate, path in sorted(self.files.items()):
            expiry = expires_at(path)
            if expiry is not None:
                family.add_metric([certificate], expiry)
        for certificate, peer in sorted(self.peers.items()):
            if (expiry := peer.expiry()) is not None:
                family.add_metric([certificate], expiry)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(NAME, "When the earliest certificate of each file the server presents or trusts "
                                       "expires (Unix seconds); read at every scrape.", labels=["certificate"])


class PeerCertificate:
    """When the client certificate the TLS peers last presented expires: the one certificate a
    server verifies but never reads from a file of its own.

    kube-scheduler reads its client certificate for the extender once, at start: a renewed Secret
    reaches it only when it restarts, so the certificate it presents is what tells whether the
    restart happened. Recorded on each request (the connection's DER is compared, and parsed
    only when it changes, since kube-scheduler keeps its connections alive); forgotten after
    ``max_age`` seconds without a request, because what an idle peer would present is unknown.
    """

    def __init__(self, max_age: float = 7 * 86400, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._max_age = max_age
        self._der: bytes | None = None
        self._expiry: float | None = None
        self._seen = 0.0

    def saw(self, connection: object) -> None:
        """Note the certificate of the peer on ``connection`` (an ``ssl.SSLSocket``; anything else,
        a plain socket or none, is ignored)."""
        getpeercert = getattr(connection, "getpeercert", None)
        if getpeercert is None:
            return
        try:
            der = getpeercert(binary_form=True)
        except (ValueError, OSError):  # the connection is closing
            return
        if not der:
            return
        with self._lock:
            self._seen = self._clock()
            if der == self._der:
                return
        expiry = x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()
        with self._lock:
            self._der, self._expiry = der, expiry

    def expiry(self) -> float | None:
        with self._lock:
            if self._expiry is None or self._clock() - self._seen > self._max_age:
                return None
            return self._expiry
