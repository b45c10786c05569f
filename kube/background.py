"""Work repeated on a daemon thread for the life of the process: the reconcilers' sampler and
remediator, the extender's pollers and its leadership check; and the way out of a process that
runs such threads."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import NoReturn


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


class Told:
    """Problems with what an object carries (a node's unreadable annotations), each said once per
    object: the object is read again at every update or pass (a Node at each kubelet status
    update), and a bad annotation left for a day would otherwise be thousands of one warning. A
    problem mended and then back is said again.

    >>> import sys
    >>> log = logging.getLogger("told-example")
    >>> log.addHandler(logging.StreamHandler(sys.stdout)); log.propagate = False
    >>> told = Told(log)
    >>> for _ in range(3):
    ...     told.tell("Node/a", ["annotation x='?' ignored"])
    Node/a: annotation x='?' ignored
    >>> told.tell("Node/a", ["annotation x='?' ignored", "annotation y='!' ignored"])
    Node/a: annotation y='!' ignored
    >>> told.tell("Node/a", []); told.tell("Node/a", ["annotation x='?' ignored"])
    Node/a: annotation x='?' ignored

    A node deleted and made again under its name is another object; what it carries is said again:
    >>> told.tell("Node/b", ["annotation z='' ignored"])
    Node/b: annotation z='' ignored
    >>> told.forget("Node/a"); told.tell("Node/a", ["annotation x='?' ignored"])
    Node/a: annotation x='?' ignored
    >>> told.retain({"Node/a"}); told.tell("Node/a", ["annotation x='?' ignored"])
    >>> told.tell("Node/b", ["annotation z='' ignored"])
    Node/b: annotation z='' ignored
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._told: dict[str, tuple[object, ...]] = {}

    def tell(self, subject: str, problems: Sequence[object]) -> None:
        """Warn of each of ``subject``'s ``problems`` not said at its last reading."""
        told = self._told.get(subject, ())
        for problem in problems:
            if problem not in told:
                self._log.warning("%s: %s", subject, problem, stacklevel=2)
        if problems:
            self._told[subject] = tuple(problems)
        else:
            self._told.pop(subject, None)

    def forget(self, subject: str) -> None:
        """Drop what was said of ``subject`` (a node gone from the cluster)."""
        self._told.pop(subject, None)

    def retain(self, subjects: set[str]) -> None:
        """Drop what was said of everything but ``subjects`` (the nodes still in the cluster)."""
        for subject in set(self._told) - subjects:
            del self._told[subject]


def exit_without_finalizing(code: object) -> NoReturn:
    """Leave the process with ``code`` (a SystemExit's: None is 0, a message 1), once its exit
    functions have run (a Lease given back) and its output is flushed, without finalizing the
    interpreter around its daemon threads (caches' watches, pollers, the Lease's elector).

    Finalizing stops a daemon thread wherever it next wakes, and one woken inside a call of the
    ``kubernetes`` client is inside pydantic's ``validate_call`` (every typed API method is
    wrapped in it), compiled code that cannot be unwound: the process aborts (SIGABRT, exit
    134). A call is in flight whenever an answer is on its way, and an API server answering
    errors fast (overloaded, restarting) keeps each thread in one most of the time. Nothing
    left needs finalizing: each SQLite write is a transaction, and the metrics of a gunicorn
    worker that has gone are the master's to mark dead."""
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
