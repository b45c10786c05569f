import json
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversale.errors import QuantityError
from oversale.quantity import (
    format_bytes,
    format_millicores,
    parse_bytes,
    parse_millicores,
    parse_quantity,
)
from tests.conftest import POD_FIXTURES


@pytest.mark.parametrize(
    ("text", "millicores"),
    [("100m", 100), ("0.5", 500), ("5e-1", 500), ("1e0", 1000), ("1e3", 1_000_000), ("2000m", 2000),
     ("0.15", 150), (".5", 500), ("1", 1000), ("1.", 1000), ("100u", 1), ("1n", 1), ("0", 0),
     ("1k", 1_000_000), ("+2", 2000),
     # metrics-server's usage readings: nanocores, and microcores from some kubelets.
     ("137929113n", 138), ("1500000n", 2), ("250000u", 250), ("2500u", 3)],
)
def test_cpu_quantities_in_millicores_round_up_like_the_api_server(text, millicores):
    assert parse_millicores(text) == millicores


@pytest.mark.parametrize(
    ("text", "count"),
    [("1Gi", 2**30), ("1G", 10**9), ("128Mi", 128 * 2**20), ("131072Ki", 128 * 2**20), ("256e6", 256 * 10**6),
     ("0.5G", 5 * 10**8), ("1.5Gi", 3 * 2**29), ("67108864", 2**26), ("1Ei", 2**60), ("1E", 10**18),
     ("1500m", 2), ("0", 0), ("1e3", 1000), ("2Ti", 2 * 2**40), ("1Pi", 2**50), ("3T", 3 * 10**12),
     ("1P", 10**15), ("2M", 2 * 10**6), ("1473916Ki", 1473916 * 1024)],
)
def test_memory_quantities_in_bytes(text, count):
    assert parse_bytes(text) == count


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1Gb", "Mi", "1 Gi", "--1", "1e", "1e400", "inf", "NaN",
                                  "1" * 100, "0x10", "\u0662", "1\u0660\u0660m"])  # Arabic-Indic digits
def test_invalid_quantities_raise_quantity_error(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def said(text: object) -> str:
    """What a QuantityError says of ``text`` (the words an invalid annotation's warning carries)."""
    with pytest.raises(QuantityError) as error:
        parse_quantity(text)  # type: ignore[arg-type]
    return str(error.value)


def test_an_invalid_quantity_is_named_in_the_error():
    assert said("1Gb") == "'1Gb' is not a Kubernetes quantity"


def test_an_exponent_may_reach_30_and_a_value_must_be_text():
    assert parse_quantity("1e30") == 10**30 and parse_quantity("1e-30") == Fraction(1, 10**30)
    assert said("1e31") == "'1e31': exponent out of range"
    assert said(5) == "quantity must be a string, got int"  # JSON gives numbers where text belongs


def test_a_quantity_may_be_64_characters_long_and_no_longer():
    assert parse_quantity("0" * 63 + "1") == 1
    assert said("0" * 64 + "1") == f"quantity {'0' * 20!r}... is longer than 64 characters"


@pytest.mark.shared
def test_every_quantity_spelled_in_the_shared_pod_fixtures_parses():
    seen = 0
    for path in POD_FIXTURES:
        pod = json.loads(path.read_text())
        containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
        for unit in [*containers, {"resources": pod["spec"].get("resources") or {}}]:
            for kind in ("requests", "limits"):
                for name, value in ((unit.get("resources") or {}).get(kind) or {}).items():
                    if name in ("cpu", "memory"):
                        assert parse_quantity(value) >= 0, (path.name, value)
                        seen += 1
    assert seen > 200


def test_formatting_picks_exact_canonical_spellings():
    assert format_millicores(1500) == "1500m"
    assert format_millicores(3000) == "3"
    assert format_bytes(64 * 2**20) == "64Mi"
    assert format_bytes(5 * 10**8) == "500M"
    assert format_bytes(1000001) == "1000001"
    assert format_bytes(0) == "0" and format_millicores(0) == "0", "no unit on nothing"


@given(st.integers(min_value=0, max_value=10**12))
def test_millicores_round_trip(millicores):
    assert parse_millicores(format_millicores(millicores)) == millicores


@given(st.integers(min_value=0, max_value=2**62))
def test_bytes_round_trip(count):
    assert parse_bytes(format_bytes(count)) == count


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=6))
def test_decimal_text_parses_exactly(whole, places):
    text = f"{whole}.{'7' * places}" if places else str(whole)
    assert parse_quantity(text) == Fraction(text)
