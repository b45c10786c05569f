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
