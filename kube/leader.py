"""Leader election on a coordination.k8s.io/v1 Lease, so several replicas (reconcilers, extender) are safe.

The holder renews the Lease every ``duration / 3``. A replica takes the Lease only when it is free
or its holder has not renewed for ``duration``. The holder counts itself leader only while its
last successful renewal is younger than ``2/3 x duration``, so it stops writing *before* another
replica may take over, and at once when a renewal finds someone else holding the Lease.

"Has not renewed for ``duration``" is timed on the taker's own clock, from the moment it saw the
Lease record last change (as client-go does), never by comparing the holder's ``renewTime`` with
its own clock: that is another machine's clock, and a taker whose clock runs ahead would take the
Lease from a live holder. A one-shot command therefore waits up to a Lease duration for a holder
that is gone (``acquire``), and gives the Lease back when done (``release``).

Those durations are timed on a monotonic ``clock``, the wall clock (``wall``) only writes the
Lease's stamps: an NTP step or a resumed VM moves the wall clock by minutes at once, and timed on
it a holder whose clock stepped back would count itself leader long after its Lease expired, and
a standby whose clock stepped forward would take a live holder's Lease.

An API server that cannot be reached (restarting, refusing connections, not answering) only
fails a round: every replica keeps trying, since one that gave up could never lead again. Each
call is bounded by ``duration / 3``, so a call that hangs cannot keep a leader counting itself
one, nor keep a standby from trying again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube.background import Trouble
from kube.client import GarbledAnswer, found, one_line
from oversale.timestamps import format_timestamp

log = logging.getLogger(__name__)


class LeaseElector:
    """This replica's candidacy for one Lease (the module docstring gives the timing rules): a
    thread renews it (:meth:`start`), callers ask :meth:`is_leader` before each write."""

    def __init__(self, api_client: Any, namespace: str, name: str, identity: str, duration: float,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._api: Any = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration = duration
        self.round_seconds = duration / 3
        """Seconds between rounds, and each API call's deadline: a standby that polls
        :meth:`is_leader` at this cadence notices it leads within one round."""
        self._clock = clock
        self._wall = wall
        self._renewed_at: float | None = None
        self._seen: tuple[Any, Any] | None = None
        self._seen_at = 0.0
        self._round_at: float | None = None  # when the last round started
        self._standing_by_because: str | None = None  # what the last standby line said
        self.not_leading_because = "no election round yet"
        """Why the last round left this replica without the Lease, for a one-shot command's error:
        a 403 (the Role lacks ``leases``) waits out the Lease duration like a live holder does,
        and must not be reported as one."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # A round every few seconds: an API server down for an hour would be a thousand lines.
        self._trouble = Trouble(log, f"lease {namespace}/{name}: election rounds reach a verdict again")

    def is_leader(self) -> bool:
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.duration * 2 / 3

    def try_acquire_or_renew(self) -> bool:
        """One election round; True when this replica holds the Lease afterwards."""
        now = self._round_at = self._clock()
        try:
            lease = self._read()
            if lease is None:
                self._create()
            else:
                spec = lease.get("spec") or {}
                holder = spec.get("holderIdentity")
                record = (holder, spec.get("renewTime"))
                if record != self._seen:
                    self._seen, self._seen_at = record, now
                expired = now - self._seen_at > float(spec.get("leaseDurationSeconds") or self.duration)
                if holder not in (None, "", self.identity) and not expired:
                    self._lost(f"held by {holder}")
                    return False
                transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
                self._replace(lease, transitions, acquired=holder != self.identity)
        except ApiException as error:
            if error.status == 409:
                self._lost("another replica won the race")
                return False
            # RBAC's own words say which permission is missing (a Role without ``leases``).
            return self._failed(f"the API server answered {one_line(error, all_words=True)}")
        except (urllib3.exceptions.HTTPError, OSError, GarbledAnswer) as error:
            return self._failed(one_line(error))
        self._trouble.succeeded()
        if self._renewed_at is None:
            log.info("became the leader (lease %s/%s)", self.namespace, self.name)
        self._renewed_at = now
        self._standing_by_because = None
        self.not_leading_because = ""
        return True

    def elect(self) -> bool:
        """:meth:`try_acquire_or_renew` that never raises, for every caller that goes on electing:
        a round that fails in a way not foreseen (an answer that is not a Lease) is logged and
        the next round tries again, as for an API server that cannot be reached."""
        try:
            return self.try_acquire_or_renew()
        except Exception as error:  # noqa: BLE001  -- logged with its traceback; the next round tries again
            return self._failed(f"election round failed ({type(error).__name__}: {error})", traceback=True)

    def acquire(self, wait: float) -> bool:
        """Rounds until this replica holds the Lease or ``wait`` seconds have passed (a one-shot
        command: a holder that is gone is known gone only after a Lease duration unrenewed)."""
        deadline = time.monotonic() + wait
        while not self.elect():
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(self.round_seconds, max(0.0, deadline - time.monotonic())))
        return True

    def release(self) -> None:
        """Stop electing and give the Lease back (holder cleared), so the next replica or command
        takes it at its next round instead of after a Lease duration."""
        self.stop()
        if self._thread is not None:
            self._thread.join(self.duration)  # a round in flight could otherwise take it again
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            lease = self._read()
            spec = (lease or {}).get("spec") or {}
            if lease is not None and spec.get("holderIdentity") == self.identity:
                lease["spec"] = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1,
                                 "renewTime": format_timestamp(self._wall(), micro=True)}
                self._api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False,
                                                   _request_timeout=self.round_seconds)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            log.warning("lease %s/%s not released (%s): it expires by itself", self.namespace, self.name,
                        one_line(error))

    def start(self) -> None:
        """Elect every third of the Lease duration on a thread of its own. The first round comes
        at once, unless the caller ran one less than a third ago (``reconcilers run`` does, so
        its first pass need not wait for this thread): then it comes a third after that one, so
        a start costs one Lease write, not two."""
        def loop() -> None:
            if self._round_at is not None:
                self._stop.wait(max(0.0, self.round_seconds - (self._clock() - self._round_at)))
            while not self._stop.is_set():
                self.elect()
                self._stop.wait(self.round_seconds)

        self._thread = threading.Thread(target=loop, name="lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _lost(self, why: str) -> None:
        self._trouble.succeeded()
        if self._renewed_at is not None:
            log.warning("lost the lease (%s): writes stop now", why)
        elif why != self._standing_by_because:
            # Said once per holder: a standby is otherwise silent, and one that never leads
            # because some other process holds the Lease must say which process that is.
            log.info("standing by (lease %s/%s: %s)", self.namespace, self.name, why)
        self._standing_by_because = why
        self._renewed_at = None
        self.not_leading_because = why

    def _failed(self, why: str, traceback: bool = False) -> bool:
        """A round that reached no verdict: a leader stays one until its last renewal is too old.
        Said when the rounds start failing, or fail another way, not every round."""
        self._trouble.failed(f"lease {self.namespace}/{self.name}: {why}", traceback=traceback)
        leading = self.is_leader()
        if not leading:
            self.not_leading_because = why
        return leading

    def _read(self) -> dict[str, Any] | None:
        return found(self._api.read_namespaced_lease, self.name, self.namespace, _request_timeout=self.round_seconds)

    def _spec(self, transitions: int, acquired_at: str | None) -> dict[str, Any]:
        stamp = format_timestamp(self._wall(), micro=True)
        return {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.duration)),
                "acquireTime": acquired_at or stamp, "renewTime": stamp, "leaseTransitions": transitions}

    def _create(self) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(0, None)}
        self._api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                          _request_timeout=self.round_seconds)

    def _replace(self, lease: dict[str, Any], transitions: int, acquired: bool) -> None:
        spec = lease.get("spec") or {}
        lease["spec"] = self._spec(transitions, None if acquired else spec.get("acquireTime"))
        # The resourceVersion in the body makes a concurrent taker's write fail with 409.
        self._api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False,
                                           _request_timeout=self.round_seconds)
