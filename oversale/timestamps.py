"""The one reader and writer of API timestamps (RFC 3339 in UTC, as the API server writes them:
``2026-11-23T19:00:00Z``, or with microseconds where the field is a MicroTime such as a Lease's)."""

from __future__ import annotations

import datetime
from typing import Any


def parse_timestamp(text: Any) -> float | None:
    """Seconds since the epoch, or None for a missing or unreadable value.

    >>> parse_timestamp("1970-01-01T00:01:00Z"), parse_timestamp("1970-01-01T00:00:00.500000Z")
    (60.0, 0.5)
    >>> parse_timestamp("yesterday") is None
    True
    """
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_timestamp(seconds: float, micro: bool = False) -> str:
    """RFC 3339 in UTC, as the API server writes timestamps.

    >>> format_timestamp(60.5), format_timestamp(60.5, micro=True)
    ('1970-01-01T00:01:00Z', '1970-01-01T00:01:00.500000Z')
    """
    pattern = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime(pattern)
