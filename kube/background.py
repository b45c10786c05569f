"""Work repeated on a daemon thread for the life of the process: the reconcilers' sampler and
remediator, the extender's pollers and its leadership check."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


def run_every(interval: float, work: Callable[[], object], name: str, log: logging.Logger) -> threading.Thread:
    """``work`` now, then again ``interval`` seconds after each run ends, on a daemon thread named
    ``name``. What the work does not catch itself is logged and the next run goes ahead: a thread
    that died would leave the process on its last figures, or its leadership unchecked, with
    nothing said."""
    def loop() -> None:
        while True:
            try:
                work()
            except Exception:
                log.exception("%s failed; trying again in %gs", name, interval)
            time.sleep(interval)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


class Trouble:
    """What work repeated every few seconds tells of its failures: one warning when they start
    (or turn into another ``kind``), one line when the work succeeds again, not a warning each
    run; an hour's outage of work run every minute would be 60 lines of the same warning. How
    many runs failed is the work's metrics' to count.

    >>> import sys
    >>> log = logging.getLogger("trouble-example")
    >>> log.addHandler(logging.StreamHandler(sys.stdout)); log.setLevel(logging.INFO); log.propagate = False
    >>> trouble = Trouble(log, "metrics API readable again")
    >>> for _ in range(3):
    ...     trouble.failed("metrics API not readable (HTTP 503)", kind="error")
    metrics API not readable (HTTP 503)
    >>> trouble.succeeded()
    metrics API readable again (after 3 failed runs)
    >>> trouble.succeeded()

    Without a ``kind``, each other message is another kind of failure; each outage counts its own:
    >>> trouble.failed("metrics API not readable (HTTP 503)"); trouble.failed("metrics API not readable (HTTP 500)")
    metrics API not readable (HTTP 503)
    metrics API not readable (HTTP 500)
    >>> trouble.succeeded()
    metrics API readable again (after 2 failed runs)
    >>> trouble.failed("metrics API not readable (timed out)"); trouble.succeeded()
    metrics API not readable (timed out)
    metrics API readable again (after 1 failed run)
    """

    def __init__(self, log: logging.Logger, recovered: str) -> None:
        self._log = log
        self._recovered = recovered
        self._kind: str | None = None
        self._failed = 0

    def failed(self, said: str, kind: str | None = None, traceback: bool = False) -> None:
        """One run failed; ``said`` is logged if the last run did not fail the same ``kind`` of
        way (``said`` itself where no kind is given), with the traceback of the exception being
        handled where ``traceback`` (a failure no one foresaw)."""
        kind = said if kind is None else kind
        if kind != self._kind:
            self._log.warning("%s", said, exc_info=traceback, stacklevel=2)
        self._kind = kind
        self._failed += 1

    def succeeded(self) -> None:
        if self._kind is not None:
            self._log.info("%s (after %d failed run%s)", self._recovered, self._failed, "s" * (self._failed != 1),
                           stacklevel=2)
        self._kind, self._failed = None, 0
