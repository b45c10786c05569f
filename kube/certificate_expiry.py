"""The expiry of the certificates a server presents or trusts, as a metric read at scrape time.

Import it only where ``prometheus_client`` may already be imported: the webhook chooses its
multiprocess mode before that first import (``webhook.__main__``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

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

    def __init__(self, files: Mapping[str, Path]) -> None:
        self.files = dict(files)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for certificate, path in sorted(self.files.items()):
            expiry = expires_at(path)
            if expiry is not None:
                family.add_metric([certificate], expiry)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(NAME, "When the earliest certificate of each file the server presents or trusts "
                                       "expires (Unix seconds); read at every scrape.", labels=["certificate"])
