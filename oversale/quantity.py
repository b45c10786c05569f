"""Kubernetes resource quantities, exactly.

A quantity is ``<sign><digits>[.<digits>]<suffix>`` where the suffix is a binary SI suffix
(``Ki`` .. ``Ei``), a decimal SI suffix (``n u m "" k M G T P E``) or a decimal exponent
(``e3``, ``E-2``). The API server stores CPU as millicores and memory as bytes and rounds a
finer value *up* (``MilliValue()``/``Value()`` round toward +inf), so this module does too:

>>> parse_millicores("0.5"), parse_millicores("100m"), parse_millicores("1e3")
(500, 100, 1000000)
>>> parse_bytes("1Gi"), parse_bytes("1G"), parse_bytes("0.5Gi")
(1073741824, 1000000000, 536870912)
>>> format_millicores(1500), format_millicores(2000), format_bytes(3 * 2**20)
('1500m', '2', '3Mi')
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

from oversale.errors import QuantityError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?\d+))?$",
    re.ASCII,  # \d would take any script's digits ("٢"); the API server's parser takes 0-9 only
)
# The API server refuses quantities whose exponent leaves int64 range; bounding the exponent
# also keeps a hostile "1e999999999" from allocating a huge integer.
_MAX_EXPONENT = 30
_MAX_LENGTH = 64


def parse_quantity(text: str) -> Fraction:
    """Parse a quantity string into an exact rational number of base units (cores, bytes)."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {type(text).__name__}")
    if len(text) > _MAX_LENGTH:
        raise QuantityError(f"quantity {text[:20]!r}... is longer than {_MAX_LENGTH} characters")
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    value = Fraction(match["number"])
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r}: exponent out of range")
        value *= Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        value *= _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    return -value if match["sign"] == "-" else value


# The same few spellings ("100m", "1Gi") come in every review; parsing with exact fractions is
# the costly part of the admission hot path, so results are remembered.
@lru_cache(maxsize=8192)
def parse_millicores(text: str) -> int:
    """A CPU quantity as integer millicores, rounded up as the API server does."""
    return math.ceil(parse_quantity(text) * 1000)


@lru_cache(maxsize=8192)
def parse_bytes(text: str) -> int:
    """A memory quantity as integer bytes, rounded up as the API server does."""
    return math.ceil(parse_quantity(text))


def format_millicores(millicores: int) -> str:
    """Canonical CPU string: whole cores when exact, else millicores."""
    if millicores % 1000 == 0:
        return str(millicores // 1000)
    return f"{millicores}m"


def format_bytes(count: int) -> str:
    """Canonical memory string: the largest binary suffix that is exact, else decimal, else bytes."""
    if count == 0:
        return "0"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if count % _BINARY[suffix] == 0:
            return f"{count // _BINARY[suffix]}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        unit = int(_DECIMAL[suffix])
        if count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


# The two resources this service reshapes, in the units the policies compute in.
CPU = "cpu"
MEMORY = "memory"
RESOURCES = (CPU, MEMORY)


def parse_amount(resource: str, text: str) -> int:
    """Integer millicores for ``cpu``, integer bytes for ``memory``."""
    return parse_millicores(text) if resource == CPU else parse_bytes(text)


def format_amount(resource: str, amount: int) -> str:
    """The inverse of :func:`parse_amount`, in canonical spelling."""
    return format_millicores(amount) if resource == CPU else format_bytes(amount)


def format_measured(resource: str, amount: float) -> str:
    """A measured amount (usage, a demand worked out from it) for a person to read: cpu rounded
    up to the millicore, memory from 1Mi on rounded up to the Mi. Such figures are seldom whole in
    any unit, and :func:`format_amount` spells such memory in bytes (``644245094``).

    >>> format_measured("memory", 0.6 * 2**30), format_measured("memory", 15 * 2**30)
    ('615Mi', '15Gi')
    >>> format_measured("memory", 300_000.0), format_measured("cpu", 120.4)
    ('300k', '121m')
    """
    if resource == MEMORY and amount >= _BINARY["Mi"]:
        return format_bytes(math.ceil(amount / _BINARY["Mi"]) * _BINARY["Mi"])
    return format_amount(resource, math.ceil(amount))
