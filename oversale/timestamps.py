"""The one reader and writer of API timestamps (RFC 3339 in UTC, as the API server writes them:
``2026-11-23T19:00:00Z``, or with microseconds where the field is a MicroTime such as a Lease's)."""

from __future__ import annotations

import datetime
import re
from typing import Any

_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


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
        return datetime.datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def format_timestamp(seconds: float, micro: bool = False) -> str:
    """RFC 3339 in UTC, as the API server writes timestamps.

    >>> format_timestamp(60.5), format_timestamp(60.5, micro=True)
    ('1970-01-01T00:01:00Z', '1970-01-01T00:01:00.500000Z')
    """
    pattern = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime(pattern)


def parse_go_duration(text: Any) -> float | None:
    """Seconds of an API ``Duration`` as Go writes it (a metrics API reading's ``window``), or
    None for a missing or unreadable value.

    >>> parse_go_duration("15s"), parse_go_duration("1m0s"), parse_go_duration("10.5s"), parse_go_duration("500ms")
    (15.0, 60.0, 10.5, 0.5)
    >>> parse_go_duration("1h30m"), parse_go_duration("2µs"), parse_go_duration("4us"), parse_go_duration("5ns")
    (5400.0, 2e-06, 4e-06, 5e-09)
    >>> parse_go_duration("15") is None, parse_go_duration("") is None
    (True, True)
    """
    if not isinstance(text, str) or not text:
        return None
    parts = _GO_DURATION_PART.findall(text)
    if "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)
