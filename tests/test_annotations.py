from decimal import Decimal

import pytest

from oversale.annotations import AnnotationKeys, parse_ratio, parse_switch
from oversale.errors import InvalidAnnotation, InvalidRatio


@pytest.mark.parametrize(("text", "ratio"), [("1", 1), ("1.5", Decimal("1.5")), ("2.25", Decimal("2.25")),
                                              ("3.7", Decimal("3.7")), (" 2 ", 2), ("10", 10)])
def test_plain_decimal_ratios_are_read_exactly(text, ratio):
    assert parse_ratio(text) == ratio


@pytest.mark.parametrize("text", ["abc", "0", "-1", "0.5", "NaN", "nan", "inf", "Infinity", "1e3", "1e400", "",
                                  "1.", ".5", "+2", "2x", "1,5", "9" * 40, "\u0662", "\uff12"])  # other scripts' 2
def test_anything_else_is_an_invalid_ratio(text):
    with pytest.raises(InvalidRatio):
        parse_ratio(text)


def test_a_compression_ratio_below_1_raises_requests_but_0_is_no_ratio():
    assert parse_ratio("0.5", minimum=Decimal("0.5")) == Decimal("0.5")
    with pytest.raises(InvalidRatio, match=r"'0' is not above 0 \(a ratio of 1 means no change, 0.5 doubles"):
        parse_ratio("0", minimum=Decimal("0.5"))
    with pytest.raises(InvalidRatio, match=r"'0.5' is below 1 \(a ratio of 1 means no change\)"):
        parse_ratio("0.5")
    with pytest.raises(InvalidRatio, match=r"'1e3' is not a plain decimal number such as 1, 1.5 or 2.25"):
        parse_ratio("1e3")


@pytest.mark.parametrize(("text", "value"), [("y", True), ("YES", True), ("true", True), ("n", False),
                                              ("No", False), ("FALSE", False)])
def test_switch_vocabulary(text, value):
    assert parse_switch(text) is value


def test_switch_rejects_other_words():
    with pytest.raises(InvalidAnnotation):
        parse_switch("maybe")


def test_keys_follow_the_configured_prefix():
    keys = AnnotationKeys("example.com")
    assert keys.cpu_requests_ratio == "example.com/cpu-requests-ratio"
    assert keys.memory_requests_ratio == "example.com/memory-requests-ratio"
    assert keys.enable_resource_compress == "example.com/enable-resource-compress"
    assert keys.original_requests == "example.com/original-requests"
    assert AnnotationKeys().cpu_requests_ratio == "stke.platform/cpu-requests-ratio"
    assert keys.ours({"example.com/cpu-requests-ratio": "2", "other/x": "1"}) == {
        "example.com/cpu-requests-ratio": "2"
    }
